"""Files written atomically (a reader never sees half a file or half a folder), JSON, and paths found from the
repository root: what every package writes and reads with, below all of them."""
from __future__ import annotations

import errno
import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

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
