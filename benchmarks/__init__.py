"""Benchmark scripts that print tables (`python -m benchmarks.<name>`); see docs/benchmarks.md."""
import sys
from typing import Callable, NoReturn


def run_main(main: Callable[[], int]) -> NoReturn:
    """Exit with main()'s code; Ctrl-C ends a long benchmark quietly with 130, as the CLIs do."""
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
