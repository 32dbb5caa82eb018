"""Speed of the replay simulator (envs/replay), the policy excluded: frames per second on one core.

Two figures, each the median over `--repeats` runs of `--steps` steps of a recorded drive:
* reprojection + vehicle model: `Reprojector.warp` and `PathVehicle.step` on decoded frames (what the replay adds);
* the whole `ReplayEnv.step`, which also decodes the recorded JPEG (what a driven replay costs per frame).
The car weaves around the path (steering = recorded + a sine), so the warp never takes its zero-pose shortcut.
Target: >= 1,000 frames/s for the first.

    python -m benchmarks.replay_speed --data runs/replay_agreement/udacity/drives
    python -m benchmarks.replay_speed            # records a 300-step drive of the udacity expert first
"""
from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from common.cli import option, run_command

TARGET = 1000.0


def bench(folder: str, steps: int, repeats: int) -> tuple[float, float]:
    from envs.registry import get_spec
    from envs.replay.vehicle import PathPose

    spec = get_spec("replay:" + str(Path(folder).resolve()))
    env = spec.make(max_episode_steps=steps)
    env.reset(seed=0)
    n = min(steps, env.parts[0].length)
    frames = [env.recorded_frame(k) for k in range(n)]
    steer, speed, dt = env._steer[:n], env._speed[:n], env._dt[:n]
    weave = 0.15 * np.sin(np.arange(n) / 7.0)
    warp_rates, env_rates = [], []
    for _ in range(repeats):
        pose, t0 = PathPose(), time.perf_counter()
        for k in range(n):
            pose = env.vehicle.step(pose, steer[k] + weave[k], steer[k], speed[k], dt[k])
            if pose.off_path(env.max_offset, env.max_yaw):
                pose = pose.back_on_path()
            env.reprojector.warp(frames[k], pose.offset, pose.yaw)
        warp_rates.append(n / (time.perf_counter() - t0))
        env.reset(seed=0)
        t0 = time.perf_counter()
        for k in range(n):
            _, _, _, trunc, info = env.step(np.array([steer[k] + weave[k]], np.float32))
            if info["lane_departure"]:
                env.recenter()
        env_rates.append(n / (time.perf_counter() - t0))
    return statistics.median(warp_rates), statistics.median(env_rates)


@dataclass
class ReplaySpeedArgs:
    data: str | None = option(None, "a recording or udacity dataset (default: record a drive of --steps steps)",
                              group="input")
    steps: int = option(300, "steps per run", group="runtime")
    repeats: int = option(5, "runs per figure; the median is reported", group="runtime")


def main(argv: list[str] | None = None) -> int:
    return run_command(ReplaySpeedArgs, _benchmark, argv, prog="python -m benchmarks.replay_speed", doc=__doc__,
                       mistakes=(ValueError, OSError))


def _benchmark(a: ReplaySpeedArgs) -> int:
    cv2.setNumThreads(1)
    import torch

    torch.set_num_threads(1)
    folder = a.data
    if folder is None:
        import collect

        folder = str(Path(tempfile.mkdtemp()) / "drive")
        collect.main(["--env", "udacity", "--episodes", "1", "--max-steps", str(a.steps), "--noise", "0",
                      "--workers", "1", "--out", folder, "--no-progress"])
        from driving_data.dataset import open_dataset
        open_dataset(folder)
    warp, whole = bench(folder, a.steps, a.repeats)
    print("| what | frames/s (median of %d x %d steps, one core) | target |" % (a.repeats, a.steps))
    print("|---|---|---|")
    print(f"| reprojection + vehicle model | {warp:,.0f} | >= {TARGET:,.0f}: "
          f"{'met' if warp >= TARGET else 'NOT met'} |")
    print(f"| ReplayEnv.step (with JPEG decode) | {whole:,.0f} | |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
