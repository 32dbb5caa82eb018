"""Benchmark scripts that print tables (`python -m benchmarks.<name>`); see docs/benchmarks.md."""
import sys
import time
from typing import Any, Callable, NoReturn


def run_main(main: Callable[[], int]) -> NoReturn:
    """Exit with main()'s code; Ctrl-C ends a long benchmark quietly with 130, as the CLIs do."""
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)


def one_line_errors(body: Callable[[], None]) -> int:
    """Run a benchmark's ``body``: 0, or 2 with a user's mistake (ValueError, OSError: a wrong folder or file) told
    in one line on stderr instead of a traceback."""
    try:
        body()
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


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

