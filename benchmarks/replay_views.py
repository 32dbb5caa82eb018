"""How well the replay's view synthesis matches what the simulator really shows off the path.

On tracks of this project's simulators, the center frame drawn on the path is reprojected (envs.replay.camera) to
a pose off it (0.7 m right; 4 degrees right), and compared with the frame the simulator draws at that pose: mean
absolute difference over the ground rows (below the horizon, above the hood), reprojected against unwarped.
On the hard world the poses are split by how much the road's grade changes over the next 30 m (hills: the
flat-ground model places far ground wrong there).

    python -m benchmarks.replay_views
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from common.cli import option, run_command

POSES = ((0.7, 0.0), (0.0, math.radians(4.0)))


def _error(a: np.ndarray, b: np.ndarray, rows: slice) -> float:
    return float(np.mean(np.abs(a[rows].astype(np.float32) - b[rows].astype(np.float32))))


def measure(world: str, seeds: tuple[int, ...], poses_per_track: int = 25) -> list[tuple[float, float, float]]:
    """(grade change over 30 m, unwarped error, reprojected error) per pose."""
    from envs.replay.camera import Reprojector
    from envs.replay.spec import SIM_V0, SIM_V1
    from envs.udacity.camera import Renderer
    from envs.udacity.scene import HillsRenderer
    from envs.udacity.track import generate_track

    rp = Reprojector(SIM_V1 if world == "hard" else SIM_V0)
    rows = slice(rp.horizon + 2, rp.hood)
    out = []
    for seed in seeds:
        theme = ("lake", "jungle")[seed % 2]
        track = generate_track(seed, theme, world=world)
        r = HillsRenderer(track, theme, seed) if world == "hard" else Renderer(track, theme, seed)
        for s in np.linspace(20, track.length - 40, poses_per_track):
            x, y, yaw = track.pose_at(float(s))
            extra = (track.grade_at(float(s)),) if world == "hard" else ()
            change = abs(track.grade_at(float(s) + 30) - track.grade_at(float(s)))
            recorded = r.render((x, y, yaw, *extra))
            for d, psi in POSES:
                truth = r.render((x + d * math.sin(yaw), y - d * math.cos(yaw), yaw - psi, *extra))
                out.append((change, _error(recorded, truth, rows), _error(rp.warp(recorded, d, psi), truth, rows)))
    return out


@dataclass
class ReplayViewsArgs:
    poses_per_track: int = option(25, "poses along each track where the views are compared",
                                  group="evaluation conditions")


def main(argv: list[str] | None = None) -> int:
    return run_command(ReplayViewsArgs, _benchmark, argv, prog="python -m benchmarks.replay_views", doc=__doc__,
                       mistakes=(ValueError, OSError))


def _benchmark(args: ReplayViewsArgs) -> int:
    print("| world | poses | unwarped (median) | reprojected (median) | reprojected / unwarped (median) |")
    print("|---|---|---|---|---|")
    for world, seeds in (("classic", (11, 12, 13)), ("hard", (11, 12, 13, 14))):
        a = np.asarray(measure(world, seeds, args.poses_per_track))
        groups = [("all", np.ones(len(a), bool))] if world == "classic" else [
            ("grade change < 2 % in 30 m", a[:, 0] < 0.02), ("grade change >= 2 % in 30 m", a[:, 0] >= 0.02)]
        for label, m in groups:
            u, w = a[m, 1], a[m, 2]
            print(f"| {world}, {label} | {int(m.sum())} | {np.median(u):.1f} | {np.median(w):.1f} | "
                  f"{np.median(w / u):.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
