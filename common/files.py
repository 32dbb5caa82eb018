"""Files written atomically (a reader never sees half a file or half a folder), JSON, paths found from the
repository root, a file's SHA-256, and a run's --out folder (its lock, claimed before any work): what every
package writes and reads with, below all of them."""
from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

def atomic_write(path: Path, write) -> None:
    """Write through a temp file in the same folder, then rename: readers never see a half file."""
    atomic_write_all([(path, write)])


def atomic_write_all(files: Sequence[tuple[Path, Callable[[Any], Any]]]) -> None:
    """Write every ``(path, write)`` through a temp file in its folder, then rename them all: a failure while
    writing (a full disk) leaves every one of them as it was, so files that belong together (a run's best.pt and
    last.pt) never disagree. An OSError names the file it was writing."""
    done: list[tuple[str, Path]] = []
    try:
        for path, write in files:
            path = Path(path)
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
            except OSError as e:
                raise _naming(e, path)
            done.append((tmp, path))
            try:
                os.fchmod(fd, 0o644)  # mkstemp makes 0600; datasets and checkpoints are meant to be shared
                with os.fdopen(fd, "wb") as f:
                    write(f)
                    f.flush()
                    os.fsync(f.fileno())
            except OSError as e:
                raise _naming(e, path)
        for tmp, path in done:
            os.replace(tmp, path)
    except BaseException:
        for tmp, _ in done:
            if os.path.exists(tmp):
                os.unlink(tmp)
        raise


def _naming(e: OSError, path: Path) -> OSError:
    """``e`` with ``path`` as its file name when it has none (a write or fsync failing names no file)."""
    if e.filename is None:
        e.filename = str(path)
    return e


def disk_full(e: BaseException) -> bool:
    """Whether ``e`` is a disk (or the user's quota) running out of space."""
    return isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)


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


@contextlib.contextmanager
def folder_lock(out: Path, who: str = "collect.py") -> Iterator[None]:
    """An flock on OUT/.lock: a second run (collect.py, train.py or evaluate.py) into the same folder fails fast;
    the OS drops the lock when the process dies, so a killed run never leaves a stale lock."""
    out.mkdir(parents=True, exist_ok=True)
    fd = os.open(out / ".lock", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").split()  # what the holder wrote: name and pid
            name, pid = holder[0] if holder else "run", holder[1] if len(holder) > 1 else "?"
            raise ValueError(f"another {name} is writing into {str(out)!r} (pid {pid}); wait for it or use "
                             "another --out") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{who} {os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def run_folder(out: Path, who: str, *, lock: bool = True) -> Iterator[None]:
    """The --out of a train.py or evaluate.py run, before any work: writable (one-line ValueError otherwise),
    locked against a second run, and rid of the temp files and staging folders a killed run left (safe under the
    lock: no one else writes there). A folder made here that the run left empty is removed again.
    ``lock`` False (torchrun ranks other than 0, which write nothing) skips all of it."""
    if not lock:
        yield
        return
    top = None  # the outermost folder this makes
    for folder in (out, *out.parents):
        if folder.exists():
            break
        top = folder
    check_writable(out)
    try:
        with folder_lock(out, who):
            remove_stale_temp(out)
            yield
    finally:
        if top is not None and {p.name for p in out.iterdir()} <= {".lock"}:
            (out / ".lock").unlink(missing_ok=True)
            for folder in (out, *out.parents):
                try:
                    folder.rmdir()  # only while empty
                except OSError:
                    break
                if folder == top:
                    break


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


def atomic_write_text(path: Path, text: str) -> Path:
    """UTF-8 text through ``atomic_write`` (temp file + rename)."""
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
    """``obj`` as indented, strict JSON (NaN and inf as null, numpy scalars as numbers), written atomically."""
    return atomic_write_text(Path(path), json.dumps(_jsonable(obj), indent=2, allow_nan=False) + "\n")


REPO_ROOT = Path(__file__).resolve().parents[1]  # common/ sits in the repository root


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file's bytes, in hex: what cards name the file of an expert or a student by."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def resolve_path(path: str | Path) -> Path:
    """Relative paths are tried from the cwd first, then from the repo root (so the CLIs and tests run from
    anywhere and find the shipped checkpoints)."""
    path = Path(path)
    if path.is_absolute() or path.exists():
        return path
    return REPO_ROOT / path if (REPO_ROOT / path).exists() else path


def check_room(out: Path, need_bytes: int, what: str) -> None:
    """ValueError in one line when the disk under ``out`` has less free space than ``what`` will write."""
    where = Path(out).absolute()
    while not where.exists() and where != where.parent:
        where = where.parent
    free = shutil.disk_usage(where).free
    if need_bytes > free:
        raise ValueError(f"not enough disk space for {what}: it writes about {need_bytes / 1e6:,.0f} MB into "
                         f"{str(out)!r}, and {str(where)!r} has {free / 1e6:,.0f} MB free")
