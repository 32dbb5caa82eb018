"""What every stage shares, below all of them: files written atomically (a reader never sees half a file),
JSON, progress bars only on a terminal, paths found from the repo root, and stop signals (Ctrl-C or SIGTERM
stop every command the same clean way)."""
from __future__ import annotations

import json
import math
import os
import shutil
import signal
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

_deferred = False  # inside stops_at_safe_points
# a stop signal not known to be delivered (inside sigterm_as_interrupt, or a worker's first SIGINT); see raise_if_stopped
_stop_requested = False


def _quiet_after_stop(unraisable: Any) -> None:
    """Once a stop was requested, errors Python cannot raise (a ``__del__`` failing) are not printed: the stop's
    KeyboardInterrupt can land inside Box2D while it builds a body, and the half-built object's ``__del__`` then
    fails harmlessly; the user asked to stop and gets the clean summary, not a traceback."""
    if not _stop_requested:
        sys.__unraisablehook__(unraisable)


sys.unraisablehook = _quiet_after_stop


def stop_handler(signum, frame) -> None:  # noqa: ARG001
    global _stop_requested
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


def atomic_write(path: Path, write) -> None:
    """Write through a temp file in the same folder, then rename: readers never see a half file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)  # mkstemp makes 0600; datasets and checkpoints are meant to be shared
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def check_writable(out: Path, flag: str = "--out") -> None:
    """ValueError (one line) unless ``out``, or the folder it would be made in, can be written into: a run learns
    it at its start, not when it saves what it did. Creates nothing."""
    where = Path(out)
    while not where.exists() and where != where.parent:
        where = where.parent
    if not where.is_dir():
        raise ValueError(f"cannot write into {flag} {str(out)!r}: {str(where)!r} is a file, not a folder")
    try:
        fd, probe = tempfile.mkstemp(dir=where, prefix=".write-check.", suffix=".tmp")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise ValueError(f"cannot write into {flag} {str(out)!r}: {e.strerror or e} ({str(where)!r})") from None


def remove_stale_temp(out: Path) -> list[Path]:
    """Remove the hidden ``.NAME.*.tmp`` files and folders (atomic_write, StagingFolder) that a killed run left
    anywhere under ``out``; only safe while holding ``out``'s lock. Returns what was removed."""
    stale = [p for p in out.rglob(".*.tmp") if p.name.count(".") >= 3]
    for p in stale:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
    return stale


def refuse_nonempty(out_dir: Path) -> None:
    """ValueError unless out_dir is absent or an empty folder: a new dataset never lands on old files."""
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ValueError(f"output folder {str(out_dir)!r} exists and is not empty; choose a new folder")


@dataclass
class StagingFolder:
    """Write into a hidden sibling folder, rename it to ``out_dir`` at the end: a failed or interrupted
    run leaves nothing behind, and ``out_dir`` never holds half a result."""

    out_dir: Path
    tmp: Path | None = None

    def __enter__(self) -> Path:
        refuse_nonempty(self.out_dir)
        self.out_dir.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(dir=self.out_dir.parent, prefix=f".{self.out_dir.name}.", suffix=".tmp"))
        os.chmod(self.tmp, 0o755)  # mkdtemp makes 0700; the result is meant to be shared
        return self.tmp

    def __exit__(self, exc_type, exc, tb) -> None:
        assert self.tmp is not None
        try:
            if exc_type is None:
                refuse_nonempty(self.out_dir)  # someone may have written there meanwhile
                if self.out_dir.exists():
                    self.out_dir.rmdir()
                os.replace(self.tmp, self.out_dir)
        finally:
            if self.tmp.exists():
                shutil.rmtree(self.tmp, ignore_errors=True)


def write_json_atomic(path: str | Path, obj: Any) -> None:
    atomic_write(Path(path), lambda f: f.write(json.dumps(obj, indent=2).encode()))


def show_progress(requested: bool, stream: Any = None) -> bool:
    """Whether to draw tqdm bars: only when asked for and ``stream`` (default: sys.stderr) is a terminal.

    Bars written to a log file (nested ones above all) leave carriage returns and cursor moves in it; callers
    print plain lines there instead (evaluation: one per episode; training: one per epoch)."""
    stream = sys.stderr if stream is None else stream
    try:
        return bool(requested) and stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def atomic_write_text(path: Path, text: str) -> Path:
    """UTF-8 text through ``agent.atomic_write`` (temp file + rename)."""
    path = Path(path)
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))
    return path


def _jsonable(x: Any) -> Any:
    """NaN/inf -> None (strict JSON), numpy scalars -> Python, recursively."""
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, Path):
        return str(x)
    return x


def write_json(path: str | Path, obj: Any) -> Path:
    return atomic_write_text(Path(path), json.dumps(_jsonable(obj), indent=2, allow_nan=False) + "\n")


MIN_REFERENCE_MSE = 1e-6  # steering units squared: an RMS of 0.001 (0.025 degrees) is no error to divide by
NO_STRAIGHT_RATIO = ("no ratio to always-straight: the steering scored against is always straight (0), so "
                     "always-straight's MSE is 0")


def mse_ratio(mse: float, reference_mse: float) -> float | None:
    """``mse / reference_mse``, or None when the reference's MSE is (near) zero and the quotient would be noise."""
    return None if reference_mse < MIN_REFERENCE_MSE else mse / reference_mse


REPO_ROOT = Path(__file__).resolve().parents[1]


def resolve_path(path: str | Path) -> Path:
    """Relative paths are tried from the cwd first, then from the repo root (so the CLIs and tests run from
    anywhere and find the shipped checkpoints)."""
    path = Path(path)
    if path.is_absolute() or path.exists():
        return path
    return REPO_ROOT / path if (REPO_ROOT / path).exists() else path


def cli_exit_code(work: Callable[[], Any], interrupted: type[BaseException], *, stop_signals: bool = True) -> int:
    """Run a CLI's work and map what can end it to the exit code a user expects: 0 done; 130 after Ctrl-C or
    SIGTERM (the stage's ``interrupted`` exception says what was kept); 2 with one line for a bad argument or
    a missing file (never a traceback for a user's mistake)."""
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
    return 0
