"""Stop signals: Ctrl-C and SIGTERM stop every command the same clean way (the caller's KeyboardInterrupt handling
runs), deferred to safe points where an exception would do harm, and never lost inside a ``__del__``."""

from __future__ import annotations

import signal
import sys
from contextlib import contextmanager
from typing import Any, Iterator


class Interrupted(Exception):
    """A stop (Ctrl-C, SIGTERM) that a stage acted on: its text says what the stage kept (the finished episodes,
    last.pt); the command ends with that line and exit code 130 (common.cli.run_command)."""


_deferred = False  # inside stops_at_safe_points
# a stop signal not known to be delivered (inside sigterm_as_interrupt, or a worker's first SIGINT);
# see raise_if_stopped
_stop_requested = False


def _quiet_after_stop(unraisable: Any) -> None:  # noqa: ARG001
    """The hook for errors Python cannot raise (a ``__del__`` failing) from the first stop on: not printed. The
    stop's KeyboardInterrupt can land inside Box2D while it builds a body, and the half-built object's ``__del__``
    then fails harmlessly, possibly long after the stop was handled (when the env closes or the interpreter exits);
    the user asked to stop and gets the clean summary, not a traceback."""


def stop_handler(signum, frame) -> None:  # noqa: ARG001
    global _stop_requested
    sys.unraisablehook = _quiet_after_stop  # from the first stop on (importing this module changes no hook)
    if _deferred and not _stop_requested:  # inside stops_at_safe_points: the loop raises it between steps
        _stop_requested = True
        return
    _stop_requested = True
    raise KeyboardInterrupt


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """`kill PID` (or torchrun stopping a rank) stops like Ctrl-C: the caller's KeyboardInterrupt handling runs
    (the collector drops the unfinished episode and prints its summary; a training rank saves last.pt).

    Both signals also set a flag that ``raise_if_stopped`` turns into a KeyboardInterrupt: Python drops an
    exception raised while a ``__del__`` runs (Box2D's body definitions are collected during env steps), so a
    stop landing there would otherwise be lost and the command would run on."""
    global _stop_requested
    try:
        old = {sig: signal.signal(sig, stop_handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    _stop_requested = False
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        _stop_requested = False


@contextmanager
def stops_at_safe_points() -> Iterator[None]:
    """Inside, a first stop signal only sets the flag, and ``raise_if_stopped`` (the loop's steps, and the
    block's end) raises it: an exception raised at an arbitrary point can land inside TensorBoard's writer queue,
    whose background thread then misses the close and ``SummaryWriter.close()`` waits up to its 120 s flush
    interval (2 hangs in 123 SIGTERMs to a tiny train.py run). A second signal stops at once, wherever it lands."""
    global _deferred
    outer, _deferred = _deferred, True
    try:
        yield
    finally:
        _deferred = outer
    raise_if_stopped()


def raise_if_stopped() -> None:
    """Raise the KeyboardInterrupt of a stop signal that was deferred (stops_at_safe_points) or that Python
    swallowed (see sigterm_as_interrupt); loops that run for long call it once per step."""
    global _stop_requested
    if _stop_requested:
        _stop_requested = False
        raise KeyboardInterrupt


def stop_handled() -> None:
    """Called by a stage that caught the stop's KeyboardInterrupt and acts on it (evaluate keeps the finished
    episodes): the stop is delivered, so a safe point after it (writing those episodes) must not raise it again."""
    global _stop_requested
    _stop_requested = False
