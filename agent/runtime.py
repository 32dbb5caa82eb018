"""What the CLIs of every stage share: progress bars only on a terminal, ratios against a reference that may be
zero, and one mapping from what ends a command to its exit code. Files and stop signals live below, in common/."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Callable

from common.files import disk_full
from common.stops import sigterm_as_interrupt


def show_progress(requested: bool, stream: Any = None) -> bool:
    """Whether to draw tqdm bars: only when asked for and ``stream`` (default: sys.stderr) is a terminal.

    Bars written to a log file (nested ones above all) leave carriage returns and cursor moves in it; callers
    print plain lines there instead (evaluation: one per episode; training: one per epoch)."""
    stream = sys.stderr if stream is None else stream
    try:
        return bool(requested) and stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def tensorboard_command(logdir: str | Path) -> str:
    """The command that opens TensorBoard on ``logdir``: the ``tensorboard`` installed beside this Python (a
    virtualenv's bin/, which is on PATH only while the virtualenv is activated), relative to the working folder when
    it lies inside it."""
    exe = Path(sys.executable).parent / "tensorboard"
    if not exe.is_file():
        return f"{sys.executable} -m tensorboard.main --logdir {logdir}"
    rel = os.path.relpath(exe)
    return f"{exe if rel.startswith('..') else rel} --logdir {logdir}"


MIN_REFERENCE_MSE = 1e-6  # steering units squared: an RMS of 0.001 (0.025 degrees) is no error to divide by
NO_STRAIGHT_RATIO = ("no ratio to always-straight: the steering scored against is always straight (0), so "
                     "always-straight's MSE is 0")


def mse_ratio(mse: float, reference_mse: float) -> float | None:
    """``mse / reference_mse``, or None when the reference's MSE is (near) zero and the quotient would be noise."""
    return None if reference_mse < MIN_REFERENCE_MSE else mse / reference_mse


def disk_full_line(e: OSError) -> str:
    """The one line a command ends with when the disk is full: where, what to do, and what the stage added to the
    error (``add_note``: what was kept, how to go on)."""
    where = f" while writing {e.filename!r}" if e.filename else ""
    notes = " ".join(getattr(e, "__notes__", ()))
    return (f"error: no space left on the disk{where}; free some space and run the command again"
            + (f" ({notes})" if notes else ""))


def cli_exit_code(work: Callable[[], Any], interrupted: type[BaseException], *, stop_signals: bool = True) -> int:
    """Run a CLI's work and map what can end it to the exit code a user expects: 0 done; 130 after Ctrl-C or
    SIGTERM (the stage's ``interrupted`` exception says what was kept); 2 with one line for a bad argument,
    a missing file or a full disk (never a traceback for a user's mistake or the machine's)."""
    try:
        if stop_signals:
            with sigterm_as_interrupt():  # `kill PID` stops like Ctrl-C
                work()
        else:
            work()
    except interrupted as e:
        print(f"\n{e}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:  # before the stage could say what it kept (e.g. while loading)
        print("\ninterrupted", file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        if not disk_full(e):
            raise
        print(disk_full_line(e), file=sys.stderr)
        return 2
    return 0
