"""Training on more frames than memory holds: resident memory and samples/s of a real `train.py`, frames in
memory (`--data-loading memory`) against frames read per batch from the prepared cache (`--data-loading lazy`).

Every figure comes from a `train.py` process started here: its resident memory (VmRSS, and the kernel's own
peak VmHWM) is read from /proc every 0.2 s, its samples/s from its metrics.json (a finished run) or its
TensorBoard `charts/samples_per_sec` (a run stopped with Ctrl-C after `--seconds`). Training runs the default
policy (nac-focus, window 8, batch 64) on one thread.

    python -m benchmarks.data_loading make --frames 500000 --out data/frames500k     # synthetic CarRacing-like data
    python -m benchmarks.data_loading run --data data/frames500k --mode lazy --seconds 600 -- --val-fraction 0.05
    python -m benchmarks.data_loading compare --frames 20000 --repeats 3              # samples/s, memory vs lazy

The synthetic dataset: 96x96 frames of a grey road winding over striped grass with a black HUD strip, labels
that follow the road, 1000-step episodes. They deflate far better than real CarRacing frames (0.18 MB per 1000
steps against about 1.9), which only makes the one-time cache preparation faster. `compare` makes its
dataset in a temporary folder and deletes it; `make` leaves its folder to you (500,000 frames: 90 MB of
episodes; `run --mode lazy` adds their 13.8 GB prepared cache in DATA/.cache).
"""
from __future__ import annotations

import json
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from common.cli import option, run_command

ROOT = Path(__file__).resolve().parents[1]
SIZE = 96
EPISODE = 1000


def make_dataset(out: Path, frames: int, seed: int = 0, episode: int = EPISODE) -> Path:
    """``frames`` steps of synthetic driving in ``episode``-step episodes (the last one shorter), one card."""
    from driving_data.dataset import write_episode
    from common.files import write_json

    if out.exists() and any(out.iterdir()):
        raise ValueError(f"{out} exists and is not empty")
    rng = np.random.default_rng(seed)
    rows = np.arange(SIZE)[None, :, None]
    cols = np.arange(SIZE)[None, None, :]
    grass = np.where((np.arange(SIZE) // 12) % 2 == 0, 0, 1)[None, :, None]  # horizontal stripes
    for e, start in enumerate(range(0, frames, episode)):
        T = min(episode, frames - start)
        phase, speed = rng.uniform(0, 2 * np.pi), rng.uniform(0.01, 0.03)
        t = np.arange(T)[:, None, None]
        centre = SIZE / 2 + 22 * np.sin(speed * t + phase + rows / 25.0)  # [T, H, 1]
        road = np.abs(cols - centre) < 11
        img = np.empty((T, SIZE, SIZE, 3), np.uint8)
        img[..., 0] = np.where(road, 105, np.where(grass, 102, 100))
        img[..., 1] = np.where(road, 105, np.where(grass, 230, 204))
        img[..., 2] = np.where(road, 105, np.where(grass, 102, 100))
        img[:, -12:] = 0  # the HUD strip
        steer = np.clip((centre[:, 70, 0] - SIZE / 2) / 22, -1, 1)
        action = np.stack([steer, 0.5 - 0.3 * np.abs(steer), 0.2 * (np.abs(steer) > 0.8)], 1).astype(np.float32)
        arrays = {"frames": img, "action": action, "expert_action": action.copy(),
                  "reward": np.zeros(T, np.float32), "speed": np.full(T, 40.0, np.float32),
                  "privileged": np.zeros((T, 4), np.float32), "time": np.arange(T) * 0.02}
        write_episode(out, e, arrays, {"env": "carracing", "action_space": "continuous", "track_seed": 5_000_000 + e,
                                       "return": 0.0, "terminated": False, "truncated": True})
    write_json(out / "dataset.json", {"env": "carracing", "action_space": "continuous",
                                             "action_names": ["steer", "gas", "brake"], "synthetic": True,
                                             "counts": {"episodes": e + 1, "steps": frames}})
    return out


def _status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of a live process, in bytes ({} once it is gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        key = line.split(":")[0]
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(line.split()[1]) * 1024
    return out


def train(data: Path, mode: str, out: Path, epochs: int = 1, seconds: float | None = None,
          extra: list[str] | None = None) -> dict:
    """One train.py run; returns its peak memory, samples/s and (finished runs) validation loss."""
    cmd = [sys.executable, str(ROOT / "train.py"), "--data", str(data), "--data-loading", mode, "--epochs", str(epochs),
           "--threads", "1", "--no-progress", "--out", str(out), "--overwrite", *(extra or [])]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # nohup/& ignore Ctrl-C
    peak_rss = peak_hwm = 0
    stopped = False
    while proc.poll() is None:
        s = _status(proc.pid)
        peak_rss, peak_hwm = max(peak_rss, s.get("VmRSS", 0)), max(peak_hwm, s.get("VmHWM", 0))
        if seconds is not None and not stopped and time.perf_counter() - t0 > seconds:
            proc.send_signal(signal.SIGINT)  # train.py saves last.pt and its TensorBoard events, then exits
            stopped = True
        time.sleep(0.2)
    log = proc.stdout.read()
    if proc.returncode not in (0, 130):
        raise RuntimeError(f"train.py failed ({proc.returncode}):\n{log[-3000:]}")
    result = {"mode": mode, "peak_rss_mb": peak_rss / 2**20, "peak_hwm_mb": peak_hwm / 2**20,
              "wall_s": time.perf_counter() - t0, "finished": proc.returncode == 0}
    metrics = out / "metrics.json"
    if proc.returncode == 0 and metrics.exists():
        m = json.loads(metrics.read_text())
        result.update(samples_per_sec=m["samples_per_sec"], val_loss=m["best"]["val_loss"],
                      train_windows=m["train_windows"], data_loading=m.get("data_loading"))
    else:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        acc = EventAccumulator(str(out), size_guidance={"scalars": 0})
        acc.Reload()
        rates = ([e.value for e in acc.Scalars("charts/samples_per_sec")]
                 if "charts/samples_per_sec" in acc.Tags()["scalars"] else [])
        result.update(samples_per_sec=statistics.median(rates) if rates else None, logged_intervals=len(rates))
    return result


def data_path_ms(data: Path, mode: str, batches: int = 300) -> float:
    """Milliseconds per batch of building the batch's frames, index and targets alone (gather_segments over
    the first ``batches`` of epoch 0's plan): what lazy loading adds to a step, without the training around it."""
    from agent.training.config import TrainArgs, resolve, with_env_defaults
    from agent.training.data import load_data
    from agent.training.windows import batch_plan, gather_segments

    options = with_env_defaults(resolve(TrainArgs(data=str(data), data_loading=mode, progress=False)))
    loaded = load_data(options.data)
    plan = batch_plan({e: len(loaded.frames[e]) for e in range(loaded.num_episodes)}, options.windows, 0)[:batches]
    t0 = time.perf_counter()
    for segments in plan:
        gather_segments(loaded, segments, options.windows.window, options.windows.frame_stride, slice(0, 3))
    return (time.perf_counter() - t0) / len(plan) * 1000


PROG = "python -m benchmarks.data_loading"


@dataclass
class MakeArgs:
    frames: int = option(500_000, "frames of the synthetic dataset", group="data")
    out: Path | None = option(None, "the dataset folder to write (new or empty)", group="output", required=True)


@dataclass
class RunArgs:
    data: Path | None = option(None, "the dataset folder", group="input", required=True)
    mode: str = option("lazy", "train.py --data-loading", group="data", choices=("memory", "lazy", "auto"))
    seconds: float | None = option(None, "stop it with Ctrl-C after this long (default: let it finish)",
                                   group="runtime")
    epochs: int = option(1, "train.py --epochs", group="optimisation")
    train_args: list[str] = field(default_factory=list)


@dataclass
class CompareArgs:
    frames: int = option(20_000, "frames of the temporary synthetic dataset", group="data")
    repeats: int = option(3, "train.py runs per mode", group="runtime")
    epochs: int = option(1, "train.py --epochs", group="optimisation")
    gather_only: bool = option(False, "only the batch-building times (no train.py runs)", group="runtime")


COMMANDS = {"make": (MakeArgs, "write a synthetic dataset"),
            "run": (RunArgs, "one train.py run: peak memory and samples/s (more train.py flags after --, "
                             "e.g. -- --val-fraction 0.05)"),
            "compare": (CompareArgs, "memory vs lazy on one dataset that fits in memory, modes taking turns")}


def _make(args: MakeArgs) -> int:
    t0 = time.perf_counter()
    make_dataset(args.out, args.frames)
    size = sum(f.stat().st_size for f in args.out.rglob("*") if f.is_file())
    print(f"wrote {args.frames} frames to {args.out} ({size / 1e9:.2f} GB) in {time.perf_counter() - t0:.0f} s")
    return 0


def _run(args: RunArgs) -> int:
    with tempfile.TemporaryDirectory(prefix="bench_run_") as tmp:
        print(json.dumps(train(args.data, args.mode, Path(tmp) / "run", args.epochs, args.seconds, args.train_args)))
    return 0


def _compare(args: CompareArgs) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="bench_loading_"))
    try:
        data = make_dataset(tmp / "data", args.frames)
        if args.gather_only:
            for mode in ("memory", "lazy", "memory", "lazy"):
                print(f"{mode}: {data_path_ms(data, mode):.2f} ms per batch", flush=True)
            return 0
        rows = []
        for k in range(args.repeats):
            for mode in ("memory", "lazy"):  # taking turns: a busy machine slows both alike
                row = train(data, mode, tmp / f"run_{mode}_{k}", args.epochs)
                print(json.dumps(row), flush=True)
                rows.append(row)
        med = {mode: {key: statistics.median(r[key] for r in rows if r["mode"] == mode)
                      for key in ("samples_per_sec", "peak_rss_mb", "peak_hwm_mb")} for mode in ("memory", "lazy")}
        same = len({round(r["val_loss"], 12) for r in rows}) == 1
        print(f"\n{args.frames} frames, {args.repeats} repeats, medians:")
        for mode in ("memory", "lazy"):
            print(f"  {mode:6s}  {med[mode]['samples_per_sec']:7.0f} samples/s   peak RSS "
                  f"{med[mode]['peak_hwm_mb']:6.0f} MB")
        print(f"  lazy / memory samples/s: {med['lazy']['samples_per_sec'] / med['memory']['samples_per_sec']:.3f}; "
              f"identical validation loss in every run: {same}")
        gathers = {mode: statistics.median(data_path_ms(data, mode) for _ in range(args.repeats))
                   for mode in ("memory", "lazy")}
        step_ms = 1000 * 64 / med["memory"]["samples_per_sec"]
        print(f"  building a batch alone (64 windows): memory {gathers['memory']:.2f} ms, lazy "
              f"{gathers['lazy']:.2f} ms "
              f"(a training step here: {step_ms:.0f} ms)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """The train.py flags after ``--`` are set aside first: they are train.py's, not this tool's."""
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)

    def dispatch(args: MakeArgs | RunArgs | CompareArgs) -> int:
        if isinstance(args, RunArgs):
            return _run(replace(args, train_args=argv[cut + 1:]))
        return _make(args) if isinstance(args, MakeArgs) else _compare(args)

    return run_command(COMMANDS, dispatch, argv[:cut], prog=PROG, doc=__doc__, mistakes=(ValueError, OSError))


if __name__ == "__main__":
    raise SystemExit(main())
