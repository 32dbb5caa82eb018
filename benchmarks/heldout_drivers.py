"""How students steer drivers they never saw: every checkpoint on every held-out recording, offline and in the replay.

For each recording (a held-out pool written by ``python -m agent.udacity.pool import --role held-out``, or dataset
folders) and each checkpoint: ``evaluate.py --data`` (steering MSE against the 0.5 s-averaged recorded steering,
as a multiple of always-straight's, and the correlation) and ``evaluate.py --replay --replay-reference
driver-or-middle`` (interventions per 100 s, always-straight's beside it), on the same part of every session
(``--span``; default the whole recording). A checkpoint path may hold ``{name}``, the recording's name: a
student of each recording's own (``runs/own/{name}/best.pt``). Finished evaluations are reused, so an interrupted
run goes on where it stopped.

    python -m benchmarks.heldout_drivers --recordings data/heldout --checkpoint checkpoints/udacity_real_nac.pt \\
        checkpoints/udacity_sim2real_nac.pt --name pool sim2real --out eval/heldout
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from common.cli import option, run_command

PROG = "python -m benchmarks.heldout_drivers"


@dataclass
class HeldoutDriversArgs:
    recordings: list[str] = option(help="a held-out pool folder, or dataset folders (one per recording)",
                                   group="input", required=True)
    checkpoint: list[str] = option(help="checkpoints to score; {name} stands for the recording's name",
                                   group="input", required=True)
    name: list[str] = option(default_factory=list, help="a column name per checkpoint (default: file stems)",
                             group="input")
    span: str = option("0:1", "A:B, the part of every session scored, offline and in the replay", group="input")
    replay: bool = option(True, "drive the replay too (the slow part)", group="input")
    out: Path = option(Path("eval/heldout"), "folder of the evaluations and of table.md / table.json",
                       group="output")
    threads: int = option(1, "torch threads per evaluation", group="runtime")
    workers: int = option(2, "replay sessions driven at the same time", group="runtime")


def recordings_of(paths: list[str]) -> dict[str, Path]:
    from driving_data.dataset import expand_pools

    found = {Path(p).name: Path(p) for p in expand_pools(paths)}
    missing = [str(p) for p in found.values() if not (p / "dataset.json").is_file()]
    if missing:
        raise ValueError(f"not dataset folders (import them first): {', '.join(missing)}")
    return found


def _evaluate(argv: list[str], done: Path) -> None:
    """One evaluate.py run, skipped when its result file is already there and not an interrupted run's (a run
    stopped by Ctrl-C or SIGTERM writes what it had, marked interrupted, and is run again)."""
    import evaluate

    if done.is_file() and not json.loads(done.read_text()).get("interrupted"):
        return
    code = evaluate.main(argv)
    if code != 0:
        raise ValueError(f"evaluate.py {' '.join(argv)} ended with exit code {code}")


def score(a: HeldoutDriversArgs, rec: str, data: Path, name: str, ckpt: str) -> dict[str, float | None]:
    """Offline ratio and correlation, and replay interventions per 100 s, of one checkpoint on one recording."""
    ckpt = ckpt.replace("{name}", rec)
    if not Path(ckpt).is_file():
        raise ValueError(f"checkpoint {ckpt!r} does not exist")
    where = a.out / rec / name
    common = ["--checkpoint", ckpt, "--threads", str(a.threads), "--no-progress"]
    _evaluate(["--data", str(data), "--data-span", a.span, *common, "--out", str(where / "offline")],
              where / "offline" / "offline.json")
    pooled = json.loads((where / "offline" / "offline.json").read_text())["pooled"]
    row = {"offline_vs_straight": pooled["policy_vs_straight_mse_avg"], "frames": pooled["frames"],
           "corr": _pooled_corr(where / "offline" / "offline.json")}
    if a.replay:
        _evaluate(["--replay", str(data), "--replay-span", a.span, "--replay-reference", "driver-or-middle",
                   "--no-video", "--workers", str(a.workers), *common, "--out", str(where / "replay")],
                  where / "replay" / "metrics.json")
        m = json.loads((where / "replay" / "metrics.json").read_text())
        row.update(per_100s=m["interventions_per_100s"], straight_per_100s=m["straight_interventions_per_100s"],
                   replay_s=m["elapsed_s"])
    return row


def _pooled_corr(path: Path) -> float | None:
    """The frame-weighted mean of the sessions' correlations with the 0.5 s-averaged steering."""
    sessions = json.loads(path.read_text())["sessions"]
    pairs = [(s["corr_avg"], s["frames"]) for s in sessions if s.get("corr_avg") is not None]
    return float(np.average([c for c, _ in pairs], weights=[n for _, n in pairs])) if pairs else None


def table(rows: dict[str, dict[str, dict]], names: list[str], replay: bool) -> str:
    head = ["recording", "frames"] + [f"{n}: offline x straight (corr)" for n in names]
    if replay:
        head += [f"{n}: per 100 s" for n in names] + ["always-straight per 100 s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for rec, by in rows.items():
        first = by[names[0]]
        cells = [rec, f"{first['frames']:,}"] + [
            f"{by[n]['offline_vs_straight']:.2f}x ({by[n]['corr']:.2f})" if by[n]["corr"] is not None
            else f"{by[n]['offline_vs_straight']:.2f}x" for n in names]
        if replay:
            cells += [f"{by[n]['per_100s']:.1f}" for n in names] + [f"{first['straight_per_100s']:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    means = ["mean", ""] + [f"{np.mean([by[n]['offline_vs_straight'] for by in rows.values()]):.2f}x" for n in names]
    if replay:
        means += [f"{np.mean([by[n]['per_100s'] for by in rows.values()]):.1f}" for n in names]
        means += [f"{np.mean([by[names[0]]['straight_per_100s'] for by in rows.values()]):.1f}"]
    lines.append("| " + " | ".join(means) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return run_command(HeldoutDriversArgs, _benchmark, argv, prog=PROG, doc=__doc__, mistakes=(ValueError, OSError))


def _benchmark(a: HeldoutDriversArgs) -> None:
    names = a.name or [Path(c).stem for c in a.checkpoint]
    if len(names) != len(a.checkpoint):
        raise ValueError(f"--name gives {len(names)} names for {len(a.checkpoint)} checkpoints")
    recs = recordings_of(a.recordings)
    rows: dict[str, dict[str, dict]] = {}
    for rec, data in recs.items():
        rows[rec] = {n: score(a, rec, data, n, c) for n, c in zip(names, a.checkpoint)}
        print(f"{rec}: " + "; ".join(f"{n} {r['offline_vs_straight']:.2f}x"
                                      + (f", {r['per_100s']:.1f} per 100 s" if a.replay else "")
                                      for n, r in rows[rec].items()), file=sys.stderr)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "table.json").write_text(json.dumps({"span": a.span, "checkpoints": dict(zip(names, a.checkpoint)),
                                                  "rows": rows}, indent=1))
    text = table(rows, names, a.replay)
    (a.out / "table.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    raise SystemExit(main())
