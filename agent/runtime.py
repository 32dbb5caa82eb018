"""What the CLIs of every stage share: progress bars only on a terminal, the TensorBoard command, ratios against a
reference that may be zero, and a C allocator that keeps the memory a training step frees. How a command parses and ends
(exit codes) lives below, in common/cli.py."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
HEAP_BLOCKS_UP_TO = 32 << 20  # the largest block glibc lets its heap serve (above, it always maps fresh pages)
KEEP_FREED_UP_TO = 1 << 30  # freed heap memory kept for reuse, at most


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


def keep_freed_memory() -> bool:
    """Let glibc's malloc keep what a training step frees for the next step, instead of handing it back to the
    system and taking fresh pages again: a step allocates and frees the same batch-sized tensors every time, and
    the page faults of fresh pages cost 10-30 % of a CPU training step (docs/benchmarks.md: the precision
    benchmark's training rows). Blocks up to 32 MiB come from the heap and up to 1 GiB freed stays there; the
    peak memory is the same. Process-wide; False (nothing changed) where the C library is not glibc."""
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # glibc alone has it; mallopt's parameters differ elsewhere
    except (OSError, AttributeError):
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, HEAP_BLOCKS_UP_TO)) and bool(libc.mallopt(M_TRIM_THRESHOLD,
                                                                                         KEEP_FREED_UP_TO))
