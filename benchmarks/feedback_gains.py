"""How strongly a student steers back when its view is moved off the recorded path: its feedback gains.

For frames of a recording's held-out part, the whole window the student sees is reprojected (envs.replay) to a
lateral offset (or a yaw) off the recorded path, and the student's steering is compared with its steering on the
recorded frames. The slope over offsets -1..1 m is its gain in steering per metre of offset (negative: steers back
to the left when it is right of the path), over yaws -8..8 degrees its gain per radian of heading error. The path
controller that labels recovery views has, at 10 m/s (a 10 m lookahead), -0.13 per metre and -1.3 per radian.

    python -m benchmarks.feedback_gains --data REC_OR_DATASET --checkpoint A.pt B.pt [--span 0.8:1] [--frames 300]
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from common.cli import option, run_command

PROG = "python -m benchmarks.feedback_gains"


def gains(policy, dataset, geometry, span: tuple[float, float], frames: int) -> tuple[float, float]:
    """(steer per metre of offset, steer per radian of yaw), averaged over the dataset's episodes' spans."""
    from envs.replay.camera import Reprojector

    rp = Reprojector(geometry)
    col = list(policy.config.action_names).index("steer")
    offsets, yaws = np.array([-1.0, -0.5, 0.5, 1.0]), np.radians([-8.0, -4.0, 4.0, 8.0])
    per_m, per_rad = [], []
    for i in range(len(dataset)):
        n = int(dataset.episodes[i]["length"])
        a, b = int(span[0] * n), int(span[1] * n)
        if b - a < 20:
            continue
        idx = np.arange(a, min(b, a + frames))
        recorded = dataset.jpeg_frames(i, "frames").decode(idx)
        times = dataset.load(i, keys="time")["time"][idx]

        def steer(views):
            return policy.predict_episode(views, times)[:, col]

        base = steer(recorded)
        d_off = [np.mean(steer(np.stack([rp.warp(f, o, 0.0) for f in recorded])) - base) for o in offsets]
        d_yaw = [np.mean(steer(np.stack([rp.warp(f, 0.0, y) for f in recorded])) - base) for y in yaws]
        per_m.append(np.polyfit(offsets, d_off, 1)[0])
        per_rad.append(np.polyfit(yaws, d_yaw, 1)[0])
    return float(np.mean(per_m)), float(np.mean(per_rad))


def _span(text: str) -> tuple[float, float]:
    """'A:B' -> (A, B), read as evaluate.py reads --replay-span."""
    from envs.replay.options import parse_span

    try:
        return parse_span(text)
    except ValueError:
        raise ValueError(f"takes A:B, fractions 0 <= A < B <= 1 of every session, got {text!r}") from None


@dataclass
class FeedbackGainsArgs:
    data: str | None = option(None, "a recording (driving_log.csv + IMG/) or a udacity dataset", group="input",
                              required=True)
    checkpoint: list[str] = option([], "the students probed", group="model", required=True)
    span: tuple[float, float] = option((0.8, 1.0), "part A:B of every session probed (default: 0.8:1, the "
                                       "held-out part)", group="evaluation conditions", metavar="A:B",
                                       parse=_span)
    frames: int = option(300, "frames probed per session at most", group="evaluation conditions")
    out: str = option("eval/feedback", "output folder: a raw recording is imported into it", group="output",
                      former=("--work",))


def main(argv: list[str] | None = None) -> int:
    return run_command(FeedbackGainsArgs, _benchmark, argv, prog=PROG, doc=__doc__, mistakes=(ValueError, OSError))


def _benchmark(a: FeedbackGainsArgs) -> int:
    from pathlib import Path

    import torch

    from driving_data.dataset import open_dataset
    from driving_data.udacity_import import import_recordings
    from envs.replay.spec import geometry_of
    from policies.checkpoint import load_checkpoint

    torch.set_num_threads(1)
    [folder] = import_recordings([a.data], [Path(a.out) / "imported_data"])
    ds = open_dataset(folder)
    geometry = geometry_of(ds)
    print("| checkpoint | steer per m of offset (+ = right of the path) | steer per rad of "
          "heading (+ = pointing right) |")
    print("|---|---|---|")
    for path in a.checkpoint:
        g_m, g_rad = gains(load_checkpoint(path).eval(), ds, geometry, a.span, a.frames)
        print(f"| {path} | {g_m:+.3f} | {g_rad:+.3f} ({g_rad * math.radians(1):+.4f} per degree) |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
