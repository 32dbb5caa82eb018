"""CarRacing-v3's observation renderers side by side: speed of `env.step`, and how close the frames are.

Speed: steps per second of `env.step` in `make_carracing(...)` with gymnasium's pygame renderer, with
`renderer="fast"` (envs/carracing_render.py), and physics-only (`render=False`, no frame: the floor).
The car is driven by the scripted teacher so it stays on the road; only `env.step` is timed (the
driver's own time excluded; an episode that ends is reset, untimed). Run k of every mode uses track
seed `--seed + k`, the modes take turns within a repeat (so a busy machine slows them alike), and
each figure is the median over `--repeats` runs of `--steps` steps. One thread: OpenCV is held to one
and the BLAS thread variables are set to 1 before numpy loads.

Fidelity: two envs with the same track seed, one per renderer, driven by the same actions (the
teacher's, plus a little seeded noise so the car also meets kerbs and grass), every frame compared:
mean absolute difference in grey levels per channel, per frame, over whole episodes. Rewards and info
must be identical (the fast renderer never touches the physics); the benchmark fails if they are not.

    python -m benchmarks.carracing_render                          # 5 x 1000 steps; fidelity on 3 episodes
    python -m benchmarks.carracing_render --steps 300 --repeats 3 --fidelity-episodes 1
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
os.environ.setdefault("SDL_AUDIODRIVER", "dummy")

# E402: the settings above count only when made before numpy, cv2 and pygame load
import statistics  # noqa: E402
import sys  # noqa: E402
from dataclasses import dataclass  # noqa: E402

import cv2  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import timed_steps  # noqa: E402
from common.cli import option, run_command  # noqa: E402

PROG = "python -m benchmarks.carracing_render"

MODES = {
    "pygame (gymnasium)": {"renderer": "pygame"},
    "fast": {"renderer": "fast"},
    "physics-only": {"render": False},
}


def step_rate(mode: str, steps: int, seed: int) -> float:
    """Steps per second of env.step over `steps` steps, driven by the scripted teacher from track `seed`."""
    from envs.carracing import ScriptedDriver, make_carracing

    env = make_carracing(max_episode_steps=10**9, **MODES[mode])
    driver = ScriptedDriver()
    _, info = env.reset(seed=seed)
    rate = timed_steps(env, driver.continuous, info, steps, seed)
    env.close()
    return rate


def _fidelity(seed: int, steps: int, noise: float) -> tuple[np.ndarray, int]:
    """Per-frame mean |pygame - fast| (grey levels per channel) over one episode, and the frame count whose
    reward or info differed between the two envs (must be 0)."""
    from envs.carracing import ScriptedDriver, make_carracing

    ref, fast = make_carracing(renderer="pygame"), make_carracing(renderer="fast")
    rng = np.random.default_rng(seed)
    driver = ScriptedDriver()
    obs_r, info_r = ref.reset(seed=seed)
    obs_f, info_f = fast.reset(seed=seed)
    diffs = [np.abs(obs_r.astype(np.int16) - obs_f).mean()]
    mismatches = 0
    for _ in range(steps):
        action = driver.continuous(info_r["privileged"])
        action = np.clip(action + noise * rng.standard_normal(3) * (0.4, 1.0, 0.5), (-1, 0, 0), (1, 1, 1))
        action = action.astype(np.float32)
        obs_r, rew_r, term_r, trunc_r, info_r = ref.step(action)
        obs_f, rew_f, term_f, trunc_f, info_f = fast.step(action)
        diffs.append(np.abs(obs_r.astype(np.int16) - obs_f).mean())
        same = (rew_r == rew_f and term_r == term_f and trunc_r == trunc_f
                and np.array_equal(info_r["privileged"], info_f["privileged"])
                and all(info_r[k] == info_f[k] for k in info_r if k != "privileged"))
        mismatches += not same
        if term_r or trunc_r:
            break
    ref.close()
    fast.close()
    return np.asarray(diffs), mismatches


@dataclass
class CarRacingRenderArgs:
    steps: int = option(1000, "timed env steps per run", group="runtime")
    repeats: int = option(5, "runs per figure; the median is reported", group="runtime")
    seed: int = option(0, "first track seed; run k uses seed + k", group="evaluation conditions")
    fidelity_episodes: int = option(3, "episodes compared frame by frame, track seeds seed+1000.. (0 skips)",
                                    group="evaluation conditions")
    fidelity_steps: int = option(1000, "steps per compared episode", group="evaluation conditions")
    noise: float = option(0.15, "std of the seeded noise added to the teacher's actions when comparing",
                          group="evaluation conditions")


def main(argv: list[str] | None = None) -> int:
    return run_command(CarRacingRenderArgs, _benchmark, argv, prog=PROG, doc=__doc__, mistakes=(ValueError, OSError))


def _benchmark(args: CarRacingRenderArgs) -> int:
    if args.steps <= 0 or args.repeats <= 0 or args.seed < 0:
        raise ValueError("--steps and --repeats must be positive and --seed non-negative")
    if args.fidelity_episodes < 0 or args.fidelity_steps <= 0 or args.noise < 0:
        raise ValueError("--fidelity-episodes and --noise must be non-negative and --fidelity-steps positive")
    cv2.setNumThreads(1)

    print(f"one thread, median of {args.repeats} runs x {args.steps} steps "
          "(env.step only; the teacher and resets excluded)\n")
    rates: dict[str, list[float]] = {m: [] for m in MODES}
    for k in range(args.repeats):
        for mode in MODES:
            rates[mode].append(step_rate(mode, args.steps, args.seed + k))
    med = {m: statistics.median(r) for m, r in rates.items()}
    physics_us = 1e6 / med["physics-only"]
    print("| renderer | steps/s | us/step | min..max steps/s | render us/step (minus physics) |")
    print("|---|---:|---:|---|---:|")
    for mode, r in rates.items():
        render = "-" if mode == "physics-only" else f"{1e6 / med[mode] - physics_us:,.0f}"
        print(f"| {mode} | {med[mode]:,.0f} | {1e6 / med[mode]:,.0f} | {min(r):,.0f}..{max(r):,.0f} | {render} |")
    speedup = med["fast"] / med["pygame (gymnasium)"]
    per_run = [f / p for f, p in zip(rates["fast"], rates["pygame (gymnasium)"])]
    print(f"\nfast / pygame: {speedup:.1f}x steps/s (per-run ratios {min(per_run):.1f}..{max(per_run):.1f}x)",
          flush=True)

    if args.fidelity_episodes:
        print(f"\nfidelity: |pygame - fast| per frame, grey levels per channel, {args.fidelity_episodes} episode(s) "
              f"of up to {args.fidelity_steps} steps, teacher + noise {args.noise}\n")
        print("| track seed | frames | mean | p99 frame | worst frame (step) | reward/info mismatches |")
        print("|---:|---:|---:|---:|---|---:|")
        all_diffs, bad = [], 0
        for e in range(args.fidelity_episodes):
            seed = args.seed + 1000 + e
            diffs, mismatches = _fidelity(seed, args.fidelity_steps, args.noise)
            all_diffs.append(diffs)
            bad += mismatches
            print(f"| {seed} | {len(diffs)} | {diffs.mean():.3f} | {np.percentile(diffs, 99):.3f} | "
                  f"{diffs.max():.3f} ({int(diffs.argmax())}) | {mismatches} |", flush=True)
        every = np.concatenate(all_diffs)
        print(f"\nall {len(every)} frames: mean {every.mean():.3f}, worst {every.max():.3f} grey levels per channel")
        if bad:
            print(f"error: {bad} step(s) had different rewards or info between the renderers", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
