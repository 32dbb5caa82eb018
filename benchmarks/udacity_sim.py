"""Throughput of the Udacity-style simulator (envs/udacity): env steps per second, one thread.

For each world (classic = UdacityStyle-v0, hard = UdacityStyle-v1) and theme, three modes: the center camera rendered
every step (the default env), all three cameras (left/center/right), and physics-only (render=False, what PPO on
privileged features uses). The car is driven by the StanleyDriver so it stays on the road; only `env.step` is timed (the
driver's own time and resets are excluded). Each figure is the median over `--repeats` runs of
`--steps` steps; OpenCV is held to one thread (`cv2.setNumThreads(1)`). Also reported: the time of a
reset that builds a new track and its texture (per theme, median over the seeds used).

    python -m benchmarks.udacity_sim                     # hard world, all themes, 3000 steps x 5 repeats
    python -m benchmarks.udacity_sim --world classic --steps 1000 --repeats 3 --themes jungle

The hard world's targets: >= 1,000 steps/s with the center camera, >= 400 with three, a reset
with a new track <= 0.2 s; the last column says whether each row meets its target.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import cv2

from benchmarks import timed_steps
from common.cli import option, run_command

PROG = "python -m benchmarks.udacity_sim"

MODES = {
    "center camera": {"cameras": ("center",)},
    "three cameras": {"cameras": ("left", "center", "right")},
    "physics-only": {"render": False},
}


TARGETS = {"center camera": 1000.0, "three cameras": 400.0}  # steps/s, hard world
RESET_TARGET_S = 0.2


def step_rate(theme: str, mode: str, steps: int, seed: int, world: str = "hard") -> tuple[float, float]:
    """(steps per second of env.step, seconds of the first reset) for one run."""
    from envs.udacity import StanleyDriver, UdacityStyleEnv
    from envs.udacity.env import _track
    from envs.udacity.hard_spec import SpeedPlanTeacher

    hard = world == "hard"
    env = UdacityStyleEnv(theme, max_episode_steps=10**9, world=world, throttle_action=hard, **MODES[mode])
    driver = SpeedPlanTeacher() if hard else StanleyDriver()
    _track.cache_clear()  # time a reset that really generates the track
    t0 = time.perf_counter()
    _, info = env.reset(seed=seed)
    reset_s = time.perf_counter() - t0
    rate = timed_steps(env, driver, info, steps, seed)
    env.close()
    return rate, reset_s


@dataclass
class UdacitySimArgs:
    steps: int = option(3000, "timed env steps per run", group="runtime")
    repeats: int = option(5, "runs per figure; the median is reported", group="runtime")
    world: str = option("hard", "hard = UdacityStyle-v1 (default), classic = UdacityStyle-v0",
                        group="evaluation conditions", choices=("hard", "classic"))
    themes: str | None = option(None, "comma-separated themes (default: lake,jungle,mountain; classic: lake,jungle)",
                                group="evaluation conditions")
    seed: int = option(0, "first track seed; run k uses seed + k", group="evaluation conditions")


def main(argv: list[str] | None = None) -> int:
    return run_command(UdacitySimArgs, _benchmark, argv, prog=PROG, doc=__doc__, mistakes=(ValueError, OSError))


def _benchmark(args: UdacitySimArgs) -> int:
    from envs.udacity.track import CLASSIC_THEMES, THEMES

    if args.themes is None:
        args.themes = ",".join(THEMES if args.world == "hard" else CLASSIC_THEMES)
    themes = [t.strip() for t in args.themes.split(",") if t.strip()]
    bad = [t for t in themes if t not in THEMES]
    if bad or not themes:
        raise ValueError(f"--themes must be a comma-separated subset of {THEMES}, got {args.themes!r}")
    if args.steps <= 0 or args.repeats <= 0 or args.seed < 0:
        raise ValueError("--steps and --repeats must be positive and --seed non-negative")
    cv2.setNumThreads(1)

    print(f"{args.world} world, one thread, median of {args.repeats} runs x {args.steps} steps "
          "(env.step only; the driver and resets excluded)\n")
    print("| theme | mode | steps/s | us/step | min..max steps/s | reset with new texture (s) | target met |")
    print("|---|---|---:|---:|---|---:|---|")
    for theme in themes:
        for mode in MODES:
            rates, resets = [], []
            for k in range(args.repeats):
                rate, reset_s = step_rate(theme, mode, args.steps, args.seed + k, args.world)
                rates.append(rate)
                resets.append(reset_s)
            med = statistics.median(rates)
            reset = f"{statistics.median(resets):.2f}"
            if mode == "physics-only":
                reset = f"{statistics.median(resets):.3f} (track only)"
            spread = f"{min(rates):,.0f}..{max(rates):,.0f}"
            met = "-"
            if args.world == "hard" and mode in TARGETS:
                ok = med >= TARGETS[mode] and statistics.median(resets) <= RESET_TARGET_S
                met = ("yes" if ok else "NO") + f" (>= {TARGETS[mode]:,.0f}/s, reset <= {RESET_TARGET_S} s)"
            print(f"| {theme} | {mode} | {med:,.0f} | {1e6 / med:.0f} | {spread} | {reset} | {met} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
