"""What the CLIs of every stage share: progress bars only on a terminal, the TensorBoard command, and ratios against a
reference that may be zero. How a command parses and ends (exit codes) lives below, in common/cli.py."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any


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
