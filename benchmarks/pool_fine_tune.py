"""Does a user's own recording train a better student from the pooled one than from scratch?

For each recording (never in the pool) and training seed, four students, each judged in the replay of the
recording's last 20 % (every session's, ``--replay-reference driver-or-middle``) and offline on it:

* ``scratch``: the default command on the recording (``train.py --data REC --split blocks``: trains on the first
  80 % of every session);
* ``fine-tuned``: the same, started from the pooled student (``--init POOL --epochs E --lr LR``);
* ``scratch-1000`` and ``fine-tuned-1000``: the same two on the recording's first 1,000 frames only.

Finished trainings and evaluations are reused, so an interrupted run goes on where it stopped. ``--variants
fine-tuned fine-tuned-1000`` measures a new pooled student's fine-tunes without training the scratch students
again (they do not depend on it); the table then has no paired column.

    python -m benchmarks.pool_fine_tune --recordings data/heldout/NAME ... --init checkpoints/udacity_real_nac.pt \\
        --seeds 1 2 3 --out runs/fine_tune
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from common.cli import option, run_command

PROG = "python -m benchmarks.pool_fine_tune"
VARIANTS = ("scratch", "fine-tuned", "scratch-1000", "fine-tuned-1000")


@dataclass
class PoolFineTuneArgs:
    recordings: list[str] = option(help="dataset folders of recordings never in the pool", group="input",
                                   required=True)
    init: str = option("checkpoints/udacity_real_nac.pt", "the pooled student the fine-tunes start from",
                       group="input")
    seeds: list[int] = option([1], "training seeds", group="optimisation")
    epochs: int = option(5, "epochs of a fine-tune", group="optimisation")
    lr: float = option(5e-4, "peak learning rate of a fine-tune", group="optimisation")
    first_frames: int = option(1000, "frames of the short variants (the recording's first)", group="input")
    variants: list[str] = option(list(VARIANTS), "the students trained and judged, of " + ", ".join(VARIANTS),
                                 group="input", choices=VARIANTS, metavar="VARIANT")
    out: Path = option(Path("runs/fine_tune"), "runs, evaluations and table.md", group="output")
    threads: int = option(2, "torch threads", group="runtime")


def first_frames(data: Path, n: int, out: Path) -> Path:
    """The recording's first ``n`` rows as a recording of its own (what a user with that much driving has): the
    CSV's first rows beside a link to its images. ``data``: the recording's import."""
    card = json.loads((data / "dataset.json").read_text())
    csv_path = Path((card.get("import") or {}).get("csv", ""))
    if not csv_path.is_file():
        raise ValueError(f"{str(data)!r} is not the import of a recording on this machine (its CSV is not found)")
    lines = csv_path.read_text().splitlines()
    header = 1 if lines and lines[0].lower().startswith("center") else 0
    out.mkdir(parents=True, exist_ok=True)
    (out / "driving_log.csv").write_text("\n".join(lines[: header + n]) + "\n")
    if not (out / "IMG").exists():
        (out / "IMG").symlink_to((csv_path.parent / "IMG").resolve())
    return out


def _train(argv: list[str], run: Path) -> Path:
    import train
    from agent.training.experiment import finished, resume_args

    if not finished(run):
        code = train.main([*argv, *resume_args(run)])
        if code != 0:
            raise ValueError(f"train.py {' '.join(argv)} ended with exit code {code}")
    return run / "best.pt"


def main(argv: list[str] | None = None) -> int:
    return run_command(PoolFineTuneArgs, _benchmark, argv, prog=PROG, doc=__doc__, mistakes=(ValueError, OSError))


def _benchmark(a: PoolFineTuneArgs) -> None:
    from benchmarks import heldout_drivers

    if not Path(a.init).is_file():
        raise ValueError(f"--init {a.init!r} does not exist")
    results: dict[str, dict[str, list[dict]]] = {}
    for rec in map(Path, a.recordings):
        short = first_frames(rec, a.first_frames, a.out / "data" / f"{rec.name}_first{a.first_frames}")
        for seed in a.seeds:
            common = ["--split", "blocks", "--seed", str(seed), "--threads", str(a.threads), "--no-progress"]
            tune = ["--init", a.init, "--epochs", str(a.epochs), "--lr", str(a.lr)]
            runs = {}
            for variant in a.variants:
                data = short if variant.endswith("1000") else rec
                extra = tune if variant.startswith("fine") else []
                runs[variant] = _train(["--data", str(data), *common, *extra],
                                       a.out / rec.name / f"{variant}_s{seed}")
            table = a.out / rec.name / f"eval_s{seed}"
            heldout_drivers.main(["--recordings", str(rec), "--checkpoint", *map(str, runs.values()),
                                  "--name", *a.variants, "--span", "0.8:1", "--threads", "1", "--out", str(table)])
            rows = json.loads((table / "table.json").read_text())["rows"][rec.name]
            for variant in a.variants:
                results.setdefault(rec.name, {}).setdefault(variant, []).append(rows[variant])
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "table.json").write_text(json.dumps(results, indent=1))
    text = summary(results)
    (a.out / "table.md").write_text(text + "\n")
    print(text)


def _mean_se(values: list[float]) -> str:
    v = np.asarray(values, float)
    return f"{v.mean():.1f}" + (f" ± {v.std(ddof=1) / np.sqrt(len(v)):.1f}" if len(v) > 1 else "")


def summary(results: dict[str, dict[str, list[dict]]]) -> str:
    """Interventions per 100 s on each recording's last 20 % (mean ± SE over seeds), and the paired difference
    fine-tuned minus scratch where both were run."""
    variants = [v for v in VARIANTS if v in next(iter(results.values()), {})]
    pairs = [s for s in ("", "-1000") if f"fine-tuned{s}" in variants and f"scratch{s}" in variants]
    head = ["recording", "seeds", *variants, *(f"fine-tuned{s} - scratch{s}" for s in pairs)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for rec, by in results.items():
        per = {v: [r["per_100s"] for r in by[v]] for v in variants}
        diff = [_mean_se(list(np.subtract(per[f"fine-tuned{s}"], per[f"scratch{s}"]))) for s in pairs]
        lines.append("| " + " | ".join([rec, str(len(per[variants[0]])), *(_mean_se(per[v]) for v in variants),
                                        *diff]) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
