"""Does a user's own recording make the pooled student better, and which way of fine-tuning keeps its way back?

For each recording (never in the pool) and training seed, the students named by ``--variants``, each judged in the
replay of the recording's last 20 % (every session's, ``--replay-reference driver-or-middle``) and offline on it:

* ``unchanged``: the pooled student itself (``--init``), untrained;
* ``scratch``: the default command on the recording (``train.py --data REC --split blocks``: trains on the first
  80 % of every session);
* ``fine-tuned``: the same, started from the pooled student (``--init POOL --epochs E --lr LR``);
* ``recovery``: the fine-tune with ``--recovery-views P`` (a share of the segments seen from off the recorded path,
  labelled with the way back);
* ``near-init=L`` (e.g. ``near-init=0.1``): the fine-tune with ``--stay-near-init L`` (L2-SP: the squared distance
  from the start's weights, times L, added to the loss);
* ``frozen``: the fine-tune with ``--freeze-encoder`` (the core and the head learn, the encoder stays the start's);
* ``rehearsal``: the fine-tune with the recordings of ``--rehearsal`` (other drivers', e.g. slices of the pool's) in
  its ``--data`` beside the user's: every epoch rehearses them, each frame one turn;
* ``dagger`` (``dagger=W``): the README's one command, ``python -m agent.training.dagger --replay REC --init POOL
  --recipe fine-tune`` (the blend, then one DAgger round in the replay of the trained part, blended half and half
  with its start; ``=W``: ``--round-blend W``, 1 no blend); its round 0 is the ``fine-tuned`` variant's run of
  the same seed blended half and half (the same training), reused where that run is finished;
* ``rehearsal-dagger``: the one command with ``--rehearsal`` (every round trains the ``--rehearsal`` recordings
  beside the user's); its round 0 is the ``rehearsal`` variant's run blended half and half, reused likewise;
* ``V@W`` (e.g. ``fine-tuned@0.5``): variant V's student mixed weight by weight with the pooled student,
  ``(1 - W) * start + W * tuned`` (``agent.training.interpolate``; no training of its own);
* ``V-1000``: variant V trained on the recording's first 1,000 frames only.

Finished trainings and evaluations are reused, so an interrupted run goes on where it stopped.

    python -m benchmarks.pool_fine_tune --recordings data/heldout/NAME ... --init checkpoints/udacity_real_nac.pt \\
        --variants unchanged fine-tuned fine-tuned@0.5 --seeds 1 2 3 --out runs/fine_tune
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from common.cli import option, run_command

PROG = "python -m benchmarks.pool_fine_tune"
TRAINED = ("scratch", "fine-tuned", "recovery", "near-init", "frozen", "rehearsal", "dagger", "rehearsal-dagger")
VARIANTS = ("unchanged", *TRAINED)
_NAME = re.compile(r"^(?P<base>[a-z-]+?)(?:=(?P<weight>[0-9.]+))?(?:@(?P<mix>[0-9.]+))?(?P<short>-1000)?$")


@dataclass
class PoolFineTuneArgs:
    recordings: list[str] = option(help="dataset folders of recordings never in the pool", group="input",
                                   required=True)
    init: str = option("checkpoints/udacity_real_nac.pt", "the pooled student the fine-tunes start from",
                       group="input")
    seeds: list[int] = option([1], "training seeds", group="optimisation")
    epochs: int = option(5, "epochs of a fine-tune", group="optimisation")
    lr: float = option(5e-4, "peak learning rate of a fine-tune", group="optimisation")
    recovery_views: float = option(0.5, "the recovery variant's --recovery-views", group="optimisation")
    rehearsal: list[str] = option([], "the rehearsal variant's other recordings (dataset folders), trained beside "
                                  "the user's", group="input", metavar="DIR")
    first_frames: int = option(1000, "frames of the -1000 variants (the recording's first)", group="input")
    variants: list[str] = option(["scratch", "fine-tuned", "scratch-1000", "fine-tuned-1000"],
                                 "the students judged: " + ", ".join(VARIANTS) + " (near-init=L: its weight L); V@W "
                                 "mixes V with the start (share W of V); V-1000 trains V on the first frames",
                                 group="input", metavar="VARIANT")
    out: Path = option(Path("runs/fine_tune"), "runs, evaluations and table.md", group="output")
    threads: int = option(2, "torch threads", group="runtime")


@dataclass(frozen=True)
class Variant:
    base: str  # one of VARIANTS
    mix: float | None  # share of the trained student in a mix with the start; None: no mix
    short: bool  # trained on the first frames only
    weight: float | None = None  # near-init's --stay-near-init

    @property
    def trained(self) -> str:
        """The name of its training run (shared by its mixes)."""
        return self.base + (f"={self.weight:g}" if self.weight is not None else "") + ("-1000" if self.short else "")


def parse_variant(name: str) -> Variant:
    """``fine-tuned@0.5-1000`` -> Variant("fine-tuned", 0.5, True); ValueError naming what is wrong."""
    m = _NAME.match(name)
    base = m["base"] if m else name
    if m is None or base not in VARIANTS:
        raise ValueError(f"--variants: unknown variant {name!r}: one of {', '.join(VARIANTS)} (near-init=L, L its "
                         "weight), optionally V@W (a mix with the start) and V-1000 (the first frames)")
    mix = float(m["mix"]) if m["mix"] else None
    if base == "unchanged" and (mix is not None or m["short"]):
        raise ValueError(f"--variants: {name!r}: the unchanged student is neither mixed nor trained")
    if mix is not None and not 0 < mix < 1:
        raise ValueError(f"--variants: {name!r}: the share W of V@W must be in (0, 1)")
    weight = float(m["weight"]) if m["weight"] else None
    if base.endswith("dagger") and weight is not None and not 0 < weight <= 1:
        raise ValueError(f"--variants: {name!r}: dagger=W takes its --round-blend W in (0, 1]")
    if not base.endswith("dagger") and (base == "near-init") != (weight is not None and weight > 0):
        raise ValueError(f"--variants: {name!r}: near-init=L takes its --stay-near-init L > 0 (dagger=W a round "
                         "blend W), no other variant a number")
    return Variant(base, mix, bool(m["short"]), weight)


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


def _mixed(start: str, tuned: Path, weight: float, out: Path) -> Path:
    from agent.training.interpolate import write_mix

    if not out.is_file():
        write_mix(start, str(tuned), weight, str(out))
    return out


def _dagger(a: PoolFineTuneArgs, v: Variant, rec: Path, seed: int, run: Path, fine_tuned: Path,
            rehearsal: list[str]) -> Path:
    """The one command's student (agent.training.dagger --recipe fine-tune) on ``rec`` (the recording, or its first
    frames), its round 0 taken from ``fine_tuned``
    (the fine-tuned variant's run: the same training) where that is finished and the lineage's is not."""
    import shutil

    from agent.training.dagger import Lineage, run_lineage
    from agent.training.experiment import finished

    r0 = run / "r0"
    if finished(fine_tuned) and not finished(r0):
        r0.mkdir(parents=True, exist_ok=True)
        for name in ("args.json", "metrics.json", "last.pt"):
            shutil.copy2(fine_tuned / name, r0 / name)
        shutil.copy2(fine_tuned / "best.pt", r0 / "best_tuned.pt")
        _mixed(a.init, r0 / "best_tuned.pt", 0.5, r0 / "best.pt")
    lin = Lineage(recording=str(rec), init=a.init, recipe="fine-tune", seed=seed, round_blend=v.weight,
                  rehearsal=rehearsal, data=str(run / "episodes"), out=str(run), threads=a.threads, workers=1,
                  progress=False)
    return Path(run_lineage(lin)["final"])


def train_flags(a: PoolFineTuneArgs, v: Variant) -> list[str]:
    """train.py's flags of a trained variant, beyond the data, the split, the seed and the threads."""
    tune = ["--init", a.init, "--epochs", str(a.epochs), "--lr", str(a.lr)]
    return {"scratch": [], "fine-tuned": tune, "recovery": [*tune, "--recovery-views", str(a.recovery_views)],
            "near-init": [*tune, "--stay-near-init", str(v.weight)], "frozen": [*tune, "--freeze-encoder"],
            "rehearsal": tune}[v.base]


def main(argv: list[str] | None = None) -> int:
    return run_command(PoolFineTuneArgs, _benchmark, argv, prog=PROG, doc=__doc__, mistakes=(ValueError, OSError))


def _benchmark(a: PoolFineTuneArgs) -> None:
    from benchmarks import heldout_drivers

    variants = {name: parse_variant(name) for name in a.variants}
    if not Path(a.init).is_file():
        raise ValueError(f"--init {a.init!r} does not exist")
    if any(v.base.startswith("rehearsal") for v in variants.values()) and not a.rehearsal:
        raise ValueError("the rehearsal variant trains on --rehearsal DIR ... beside the recording: name them")
    results: dict[str, dict[str, list[dict]]] = {}
    for rec in map(Path, a.recordings):
        short = None
        if any(v.short for v in variants.values()):
            short = first_frames(rec, a.first_frames, a.out / "data" / f"{rec.name}_first{a.first_frames}")
        for seed in a.seeds:
            common = ["--split", "blocks", "--seed", str(seed), "--threads", str(a.threads), "--no-progress"]
            students: dict[str, Path] = {}
            for name, v in variants.items():
                if v.base == "unchanged":  # the same student at every seed: judged once
                    if seed == a.seeds[0]:
                        students[name] = Path(a.init)
                    continue
                run = a.out / rec.name / f"{v.trained}_s{seed}"
                if v.base in ("dagger", "rehearsal-dagger"):
                    first = "fine-tuned" if v.base == "dagger" else "rehearsal"
                    tuned = a.out / rec.name / f"{first}{'-1000' if v.short else ''}_s{seed}"
                    best = _dagger(a, v, short if v.short else rec, seed, run, tuned,
                                   a.rehearsal if v.base == "rehearsal-dagger" else [])
                else:
                    extra = a.rehearsal if v.base == "rehearsal" else []
                    best = _train(["--data", str(short if v.short else rec), *extra, *common, *train_flags(a, v)],
                                  run)
                students[name] = best if v.mix is None else _mixed(a.init, best, v.mix, run / f"mix{v.mix:g}.pt")
            table = a.out / rec.name / f"eval_s{seed}"
            heldout_drivers.main(["--recordings", str(rec), "--checkpoint", *map(str, students.values()),
                                  "--name", *students, "--span", "0.8:1", "--threads", "1", "--out", str(table)])
            rows = json.loads((table / "table.json").read_text())["rows"][rec.name]
            for name in students:
                results.setdefault(rec.name, {}).setdefault(name, []).append(rows[name])
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "table.json").write_text(json.dumps(results, indent=1))
    text = summary(results)
    (a.out / "table.md").write_text(text + "\n")
    print(text)


def _mean_se(values: list[float], fmt: str = "{:.1f}") -> str:
    v = np.asarray(values, float)
    return fmt.format(v.mean()) + (" ± " + fmt.format(v.std(ddof=1) / np.sqrt(len(v))) if len(v) > 1 else "")


def summary(results: dict[str, dict[str, list[dict]]]) -> str:
    """Interventions per 100 s on each recording's last 20 % (mean ± SE over seeds) and offline error as a multiple
    of always-straight's, per variant; the paired differences fine-tuned minus scratch (by seed), and every variant
    minus the unchanged student, where both were run."""
    variants = list(next(iter(results.values()), {}))
    pairs = [s for s in ("", "-1000") if f"fine-tuned{s}" in variants and f"scratch{s}" in variants]
    against = [v for v in variants if v != "unchanged"] if "unchanged" in variants else []
    head = ["recording", "seeds", *variants, *(f"fine-tuned{s} - scratch{s}" for s in pairs),
            *(f"{v} - unchanged" for v in against), "offline x straight: " + " / ".join(variants)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for rec, by in results.items():
        per = {v: [r["per_100s"] for r in by[v]] for v in variants}
        seeds = max(len(p) for p in per.values())
        per = {v: p * seeds if len(p) == 1 else p for v, p in per.items()}  # the unchanged student: one per seed
        diff = [_mean_se(list(np.subtract(per[f"fine-tuned{s}"], per[f"scratch{s}"]))) for s in pairs]
        diff += [_mean_se(list(np.subtract(per[v], per["unchanged"]))) for v in against]
        offline = " / ".join(f"{np.mean([r['offline_vs_straight'] for r in by[v]]):.2f}" for v in variants)
        lines.append("| " + " | ".join([rec, str(seeds), *(_mean_se(per[v]) for v in variants), *diff, offline])
                     + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
