"""Benchmark scripts that print tables (`python -m benchmarks.<name>`); see docs/benchmarks.md."""

import time
from typing import Any, Callable


def timed_steps(env: Any, act: Callable[[dict], Any], info: dict, steps: int, seed: int) -> float:
    """Steps per second of `env.step` alone over `steps` steps.

    `act` maps the last info (its privileged features) to an action; its time, and the resets of
    episodes that end (to the same track `seed`), are left out so only the env's own step is measured.
    """
    clock = time.perf_counter
    timed = 0.0
    for _ in range(steps):
        action = act(info["privileged"])
        t = clock()
        _, _, term, trunc, info = env.step(action)
        timed += clock() - t
        if term or trunc:
            _, info = env.reset(seed=seed)
    return steps / timed
