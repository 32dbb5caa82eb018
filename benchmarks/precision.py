"""Where users wait, fp32 against the default precision (``--precision auto``: bf16 where it is measured faster,
policies/precision.py; ``--against bf16`` forces bf16 instead, to measure whether auto's choice is right on this
CPU), on the CPU, in one run, each stage the precision reaches measured under both
with the two interleaved so a change in the machine's load falls on both:

* train.py on a real Udacity recording (``--data``, the ``--span`` of its sessions) and on CarRacing
  demonstrations: two runs of the real train loop (``Trainer``: batches gathered and augmented, forward, backward,
  optimizer, validation, checkpoints), one per precision, taking turns epoch by epoch (the order alternating);
  training samples/s as train.py reports it (median over the epochs, and over the whole run), and each run's best
  validation loss;
* evaluate.py --data on the recording (scoring recorded frames in batches): frames/s, the runs alternating;
* one policy step (one frame, what every drive waits for at each step), the shipped CarRacing student and the
  real-frame Udacity student on real frames, step by step alternating: median ms.

The stages the precision does not reach are measured once, so the table is complete: collect.py (the PPO expert
drives; it has no --precision), and evaluate.py's drives, CarRacing and the replay of the recording (one frame
per step runs fp32 under every precision). The CarRacing demonstrations are that collection's (or ``--carracing``).

    python -m benchmarks.precision --data data/pool/alexeyyy --threads 2 --epochs 4 --episodes 4 --max-steps 500 \
        --frames 200
"""
from __future__ import annotations

import os

os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
os.environ.setdefault("SDL_AUDIODRIVER", "dummy")

import contextlib  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import asdict, dataclass, field, replace  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable  # noqa: E402

from common.cli import option, run_command  # noqa: E402

PROG = "python -m benchmarks.precision"
REPO = Path(__file__).resolve().parents[1]
CARRACING_STUDENT = REPO / "checkpoints" / "carracing_nac.pt"
RECORDING_STUDENT = REPO / "checkpoints" / "udacity_real_nac.pt"  # evaluate.py's student for real frames
PRECISIONS = ("fp32", "default")
SPEEDUP_TARGET = 1.8  # training samples/s, default over fp32
LOSS_TARGET = 0.15  # best validation loss, default within this fraction of fp32's


@dataclass
class PrecisionArgs:
    data: Path | None = option(None, "a real Udacity simulator recording: its folder (driving_log.csv + IMG/) "
                                    "or its import (a dataset folder, e.g. data/heldout/NAME); only read",
                                    group="input", required=True)
    carracing: Path | None = option(None, "a CarRacing dataset to train on (default: the one this benchmark "
                                    "collects for its collection row)", group="input")
    epochs: int = option(6, "epochs of each training run (one per precision and dataset)", group="runtime")
    repeats: int = option(3, "runs per precision of evaluate.py --data, alternating", group="runtime")
    frames: int = option(200, "policy steps timed per student, each under both precisions", group="runtime")
    episodes: int = option(2, "episodes of the CarRacing collection (fast renderer, 1 worker)", group="runtime")
    max_steps: int = option(300, "steps per episode of the collection and of the CarRacing evaluation",
                            group="runtime")
    span: str = option("0:1", "A:B, the part of every session of the recording trained on, scored and replayed",
                       group="input")
    threads: int = option(1, "torch threads of training and of evaluate.py --data (a drive's step uses 1)",
                          group="runtime")
    out: Path = option(Path("runs/bench/precision"), "folder of precision.md and precision.json", group="output")
    progress: bool = option(True, "a progress bar on stderr when it is a terminal", group="runtime")
    against: str = option("auto", "what the 'default' column runs: auto (train.py's default, as it resolves on this "
                          "machine) or bf16 (forced: whether auto's choice of fp32 is right on a CPU without AMX)",
                          group="runtime", choices=("auto", "bf16"))


@dataclass
class Row:
    """One line of the table. ``default`` None: a stage the precision does not reach, measured once."""

    what: str
    unit: str
    fp32: float
    default: float | None = None
    target: str = ""
    met: bool | None = None
    note: str = ""
    measured: dict[str, Any] = field(default_factory=dict)  # the figures behind the medians

    @property
    def change(self) -> float | None:
        """The default against fp32: a speed-up for rates and times (> 1 is faster), a relative change for a loss."""
        if self.default is None:
            return None
        if self.unit.endswith("/s"):
            return self.default / self.fp32
        if self.unit == "ms":
            return self.fp32 / self.default
        return self.default / self.fp32 - 1


def median_pair(measure: Callable[[str], float], rounds: int) -> dict[str, list[float]]:
    """``measure(precision)`` ``rounds`` times each, the two taking turns and the first of a round alternating."""
    got: dict[str, list[float]] = {p: [] for p in PRECISIONS}
    for k in range(rounds):
        for p in PRECISIONS if k % 2 == 0 else PRECISIONS[::-1]:
            got[p].append(measure(p))
    return got


def asked(p: str, a: PrecisionArgs) -> str:
    """The --precision a column's runs are given: fp32, or --against (auto, or bf16 forced)."""
    return "fp32" if p == "fp32" else a.against


def resolved(p: str, a: PrecisionArgs) -> str:
    from policies.precision import resolve

    return resolve(asked(p, a), "cpu")


def training_rows(label: str, data: Path, root: Path, a: PrecisionArgs, span: str = "0:1") -> list[Row]:
    """Two train.py runs on ``data`` (nac-focus, window 8, batch 64, its defaults), fp32 and the default, as
    train.py runs them (``Trainer``: an untrained validation, then per epoch its training steps, validation and
    checkpoints), taking turns epoch by epoch, each with its own random stream so each run is the one train.py
    would make alone. ``span``: the part of every episode both train and validate on."""
    import torch

    from agent.training.config import TrainArgs, resolve
    from agent.training.data import load_data, resolve_head, take_pieces
    from agent.training.distributed import SINGLE
    from agent.training.experiment import resolve_data
    from agent.training.loop import Trainer, rng_state, set_rng_state
    from agent.training.windows import make_splits
    from envs.replay.options import parse_span

    first, last = parse_span(span, "--span")
    torch.set_num_threads(a.threads)
    trainers, rngs = {}, {}
    base = TrainArgs(data=str(data), epochs=a.epochs, threads=a.threads, progress=False, data_loading="memory")
    loaded = splits = head = None
    for p in PRECISIONS:
        args = replace(base, out=str(root / f"{label}_{p}"), precision=asked(p, a))
        plan, dataset = resolve_data(resolve(args), SINGLE)
        if loaded is None:  # the same frames for both runs, as train.py shares them among its cores
            loaded = load_data(plan.data, SINGLE, Path(args.out), dataset)
            loaded = take_pieces(loaded, [(e, round(first * len(f)), round(last * len(f)))
                                          for e, f in enumerate(loaded.frames)])
            head = resolve_head(plan, loaded)
            loaded, splits = make_splits(plan.split, plan.windows, loaded)
        with contextlib.redirect_stdout(io.StringIO()):  # the runs' own epoch lines: the table says it
            trainers[p] = Trainer(plan, plan.specs[0], loaded, splits[0], Path(args.out), f"{label} {p}", SINGLE,
                                  torch.device("cpu"), head, None)
            trainers[p].state.initial_val = trainers[p].validate()
        rngs[p] = rng_state()
    rates: dict[str, list[float]] = {p: [] for p in PRECISIONS}
    walls: dict[str, list[float]] = {p: [] for p in PRECISIONS}
    cpu: dict[str, float] = {p: 0.0 for p in PRECISIONS}  # the process's CPU seconds in the training steps
    for epoch in range(a.epochs):
        for p in PRECISIONS if epoch % 2 == 0 else PRECISIONS[::-1]:
            t, s = trainers[p].state, replace(trainers[p].state)
            set_rng_state(rngs[p])
            start, cpu_start = time.perf_counter(), time.process_time()
            with contextlib.redirect_stdout(io.StringIO()):
                trainers[p].train_epoch()
                cpu[p] += time.process_time() - cpu_start
                trainers[p].end_epoch()
            walls[p].append(time.perf_counter() - start)
            rngs[p] = rng_state()
            rates[p].append((t.train_samples - s.train_samples) / (t.train_time - s.train_time))
    metrics = {}
    for p, trainer in trainers.items():
        with contextlib.redirect_stdout(io.StringIO()):
            metrics[p] = trainer.final_metrics()
        trainer.writer.close()
    f, d = (statistics.median(rates[p]) for p in PRECISIONS)
    runs = {p: metrics[p]["samples_per_sec"] for p in PRECISIONS}
    epoch_s = {p: statistics.median(walls[p]) for p in PRECISIONS}
    note = (f"whole runs {runs['fp32']:,.0f} / {runs['default']:,.0f} samples/s "
            f"({runs['default'] / runs['fp32']:.2f}x), by CPU time {cpu['fp32'] / cpu['default']:.2f}x; an epoch with "
            f"its validation and checkpoint {epoch_s['fp32']:.1f} / {epoch_s['default']:.1f} s "
            f"({epoch_s['fp32'] / epoch_s['default']:.2f}x)")
    speed = Row(f"train.py {label}: training samples/s (median of {a.epochs} epochs)", "samples/s", f, d,
                f">= {SPEEDUP_TARGET:g}x", d / f >= SPEEDUP_TARGET, note,
                {"samples_per_s": rates, "epoch_s": walls, "whole_run_samples_per_s": runs, "training_cpu_s": cpu})
    best = {p: metrics[p]["best"]["val_loss"] for p in PRECISIONS}
    loss = Row(f"train.py {label}: best validation loss after {a.epochs} epochs", metrics["fp32"]["args"]["loss"],
               best["fp32"], best["default"], f"within {100 * LOSS_TARGET:g} %",
               abs(best["default"] / best["fp32"] - 1) <= LOSS_TARGET,
               f"best epochs {metrics['fp32']['best_epoch']} / {metrics['default']['best_epoch']}; untrained "
               f"{metrics['fp32']['initial']['val_loss']:.4f}",
               {"val_loss": {p: [h["val_loss"] for h in metrics[p]["history"]] for p in PRECISIONS}})
    return [speed, loss]


def offline_row(dataset: Path, root: Path, a: PrecisionArgs) -> Row:
    """evaluate.py --data with the real-frame student: frames scored per second of the whole call."""
    from agent.evaluation.args import EvalArgs
    from agent.evaluation.config import resolve
    from agent.evaluation.evaluate import evaluate

    def once(p: str) -> float:
        out = root / f"offline_{p}"
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            res = evaluate(resolve(EvalArgs(data=[str(dataset)], data_span=a.span, checkpoint=[str(RECORDING_STUDENT)],
                                            threads=a.threads,
                                            precision=asked(p, a), progress=False, out=str(out))))
        return next(iter(res.values()))["pooled"]["frames"] / (time.perf_counter() - start)

    got = median_pair(once, a.repeats)
    f, d = (statistics.median(got[p]) for p in PRECISIONS)
    return Row(f"evaluate.py --data: scoring the recording ({RECORDING_STUDENT.stem}, median of {a.repeats})",
               "frames/s", f, d, "no worse", d >= f, measured=got)


def step_row(checkpoint: Path, frames, what: str, a: PrecisionArgs) -> Row:
    """Median ms of one stream step (one frame, 1 thread), fp32 and the default alternating step by step on the
    same frames: a drive's wait at every step."""
    import torch

    from policies.checkpoint import load_checkpoint

    torch.set_num_threads(1)
    streams = {p: load_checkpoint(checkpoint).use_precision(resolved(p, a)).stream() for p in PRECISIONS}
    times: dict[str, list[float]] = {p: [] for p in PRECISIONS}
    for k, frame in enumerate(frames):
        for p in PRECISIONS if k % 2 == 0 else PRECISIONS[::-1]:
            start = time.perf_counter()
            streams[p].step(frame)
            times[p].append(1000 * (time.perf_counter() - start))
    f, d = (statistics.median(times[p]) for p in PRECISIONS)
    return Row(f"policy step, {what} ({len(frames)} frames, 1 thread)", "ms", f, d, "no worse", d <= f * 1.05,
               "one frame runs fp32 under every precision (policies/precision.py); 'no worse' allows 5 % of timer "
               "noise", {"ms": times})


def frames_of(dataset: Path, n: int):
    """``n`` camera frames of ``dataset``'s first episodes (repeated when it has fewer)."""
    import numpy as np

    from driving_data.dataset import open_dataset

    data, got = open_dataset(dataset), []
    for i in range(len(data)):
        got.append(data.load(i, keys=["frames"])["frames"][:n - sum(map(len, got))])
        if sum(map(len, got)) >= n:
            break
    frames = np.concatenate(got)
    return np.resize(frames, (n, *frames.shape[1:])) if len(frames) < n else frames


def collection_row(out: Path, a: PrecisionArgs) -> Row:
    from agent.data.collection import collect
    from agent.data.config import CollectConfig

    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        res = collect(CollectConfig(episodes=a.episodes, max_steps=a.max_steps, out=out, renderer="fast",
                                    workers=1, progress=False), log=lambda m: None)
    return Row(f"collect.py: the CarRacing expert, fast renderer, 1 worker ({res.steps_added} steps, files written)",
               "steps/s", res.steps_added / (time.perf_counter() - start),
               note="the precision does not reach it: the PPO expert drives (collect.py has no --precision)")


def drive_row(what: str, root: Path, **kwargs: Any) -> Row:
    from agent.evaluation.args import EvalArgs
    from agent.evaluation.config import resolve
    from agent.evaluation.evaluate import evaluate

    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        res = evaluate(resolve(EvalArgs(video=False, tensorboard=False, progress=False, workers=1, out=str(root),
                                        **kwargs)))
    steps = sum(e["length"] for m in res.values() for e in m["episodes"])
    return Row(f"{what} ({steps} steps)", "steps/s", steps / (time.perf_counter() - start),
               note="the precision does not reach it: a drive steps one frame at a time, fp32 under every precision")


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    return f"{value:,.2f}" if unit == "ms" else f"{value:,.4f}" if not unit.endswith("/s") else f"{value:,.0f}"


def table(rows: list[Row], column: str = "default") -> str:
    lines = [f"| where users wait | unit | fp32 | {column} | {column} vs fp32 | target | met | note |",
             "|---|---|---:|---:|---:|---|---|---|"]
    for r in rows:
        change = ("measured once" if r.change is None
                  else f"{100 * r.change:+.1f} %" if not r.unit.endswith("/s") and r.unit != "ms"
                  else f"{r.change:.2f}x")
        met = "" if r.met is None else "yes" if r.met else "**no**"
        lines.append(f"| {r.what} | {r.unit} | {fmt(r.fp32, r.unit)} | {fmt(r.default, r.unit)} | {change} | "
                     f"{r.target} | {met} | {r.note} |")
    return "\n".join(lines)


def machine(a: PrecisionArgs) -> dict[str, Any]:
    import platform

    import torch

    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").is_file() else \
        platform.processor()
    from policies.precision import choose

    auto = choose("auto", "cpu")
    return {"cpu": model, "cores": os.cpu_count(), "default_precision": auto.precision, "auto_reason": auto.reason,
            "measured_against_fp32": resolved("default", a),
            "torch": torch.__version__, "load_average_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None}


def check(a: PrecisionArgs) -> None:
    from driving_data.udacity_import import is_raw_recording

    for path in (CARRACING_STUDENT, RECORDING_STUDENT):
        if not path.is_file():
            raise FileNotFoundError(f"the shipped student {path} is missing")
    if a.data is None or not (is_raw_recording(a.data) or (a.data / "dataset.json").is_file()):
        raise ValueError(f"--data {a.data}: not a simulator recording (driving_log.csv + IMG/) nor a "
                         "dataset folder")
    if a.carracing is not None:
        from driving_data.dataset import open_dataset

        open_dataset(a.carracing)  # a wrong folder: its own one-line error
    if min(a.epochs, a.repeats, a.frames, a.episodes, a.max_steps, a.threads) < 1:
        raise ValueError("--epochs, --repeats, --frames, --episodes, --max-steps and --threads must be "
                         ">= 1")
    from envs.replay.options import parse_span

    parse_span(a.span, "--span")


def measure(a: PrecisionArgs, command: str) -> None:
    from tqdm import tqdm

    from agent.runtime import show_progress
    from driving_data.udacity_import import import_recordings

    check(a)
    started, rows = time.time(), []
    stages = tqdm(total=8, desc="precision", unit="stage", file=sys.stderr, disable=not show_progress(a.progress))
    with tempfile.TemporaryDirectory(prefix="precision-") as tmp:
        root = Path(tmp)

        def stage(name: str, make: Callable[[], Row | list[Row]]) -> None:
            stages.set_postfix_str(name)
            got = make()
            rows.extend(got if isinstance(got, list) else [got])
            stages.update(1)

        with contextlib.redirect_stdout(io.StringIO()):  # a recording that does not import is refused first
            recording = Path(import_recordings([a.data], [root / "recording"], warn=lambda m: None)[0])
        stage("collect.py", lambda: collection_row(root / "carracing", a))
        carracing = a.carracing or root / "carracing"
        label = f"on {a.data.name}" + ("" if a.span == "0:1" else f" ({a.span})")
        stage("train.py, recording", lambda: training_rows(label, recording, root, a, a.span))
        stage("train.py, CarRacing", lambda: training_rows("on CarRacing", carracing, root, a))
        stage("evaluate.py --data", lambda: offline_row(recording, root, a))
        stage("policy step, CarRacing", lambda: step_row(CARRACING_STUDENT, frames_of(carracing, a.frames),
                                                         f"{CARRACING_STUDENT.stem}, CarRacing frames", a))
        stage("policy step, recording", lambda: step_row(RECORDING_STUDENT, frames_of(recording, a.frames),
                                                         f"{RECORDING_STUDENT.stem}, the recording's frames", a))
        stage("evaluate.py, CarRacing", lambda: drive_row(
            "evaluate.py: CarRacing, shipped student, fast renderer, 1 worker", root / "drive",
            checkpoint=[str(CARRACING_STUDENT)], episodes=1, max_steps=a.max_steps, renderer="fast"))
        stage("evaluate.py --replay", lambda: drive_row(
            f"evaluate.py --replay: {RECORDING_STUDENT.stem} on the recording", root / "replay",
            replay=str(recording), replay_span=a.span, checkpoint=[str(RECORDING_STUDENT)]))
    stages.close()
    about = {**machine(a), "elapsed_s": round(time.time() - started, 1)}
    against = ("the default" if a.against == "auto" else "bf16, forced") + \
        f" (--precision auto = {about['default_precision']} here: {about['auto_reason']})"
    text = (f"fp32 against {against}, {about['cpu']}, "
            f"{about['cores']} cores, load average {about['load_average_1min']:.1f} at the end, "
            f"{about['elapsed_s']:.0f} s in all; `{command}`\n\n"
            + table(rows, "default" if a.against == "auto" else "bf16"))
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "precision.md").write_text(text + "\n")
    (a.out / "precision.json").write_text(json.dumps(
        {"machine": about, "args": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(a).items()},
         "rows": [{**asdict(r), "change": r.change} for r in rows]}, indent=1))
    print(text)


def main(argv: list[str] | None = None) -> int:
    command = " ".join([PROG, *(sys.argv[1:] if argv is None else argv)])
    return run_command(PrecisionArgs, lambda a: measure(a, command), argv, prog=PROG, doc=__doc__,
                       mistakes=(ValueError, OSError))


if __name__ == "__main__":
    raise SystemExit(main())
