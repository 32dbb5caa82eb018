"""The --out folder of collect.py: what it already holds, whether this run may append to it (same env,
action space, expert and seed rule), and a lock so that two runs never write into one folder."""
from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from agent.data.config import CollectError, Tracks
from common.files import check_writable, remove_stale_temp
from driving_data.dataset import CARD_NAME, EPISODE_DIR, open_dataset


@dataclass
class Existing:
    """What an --out folder already holds."""

    metas: list[dict] = field(default_factory=list)
    card: dict = field(default_factory=dict)

    @property
    def next_id(self) -> int:
        return max((m["episode_id"] for m in self.metas), default=-1) + 1

    def ids_to_collect(self, n: int) -> list[int]:
        """The next `n` episode ids: first the holes below the highest id (episodes an interrupted parallel run
        had not finished, or a damaged file someone deleted), then new ids after it. So a resumed run ends up
        with exactly the episodes of an uninterrupted one."""
        have = {m["episode_id"] for m in self.metas}
        holes = [i for i in range(self.next_id) if i not in have]
        return (holes + list(range(self.next_id, self.next_id + n)))[:n]


def inspect_out(out: Path) -> Existing:
    """Read an existing dataset folder (or nothing); refuse folders that are not datasets."""
    if not out.exists():
        return Existing()
    entries = {p.name for p in out.iterdir() if not p.name.startswith(".")}
    known = {EPISODE_DIR, CARD_NAME, "minari"}
    files = sorted((out / EPISODE_DIR).glob("episode_*.npz"))
    if entries - known:
        raise CollectError(
            f"--out {str(out)!r} is a folder that is not a collect.py dataset (it holds {sorted(entries - known)[:5]}); "
            "choose an empty or new folder"
        )
    if not files:
        return Existing()
    try:
        ds = open_dataset(out)
    except ValueError as e:
        raise CollectError(str(e)) from None
    return Existing(metas=ds.episodes, card=ds.card)


def check_compatible(existing: Existing, where: Tracks, out: Path, expert_sha: str, expert_path: str,
                     seed: int | None = None) -> dict:
    """The settings this run inherits from the dataset in ``out``; CollectError if it may not append to it.
    `seed`: the first track seed this run asks for (--seed, or where --shard's range starts), None to inherit it."""
    first = existing.metas[0]
    old_cfg = existing.card.get("config", {})
    for key, want in (("env", where.env), ("action_space", where.action_space)):
        have = first.get(key)
        if have != want:
            raise CollectError(
                f"--out {str(out)!r} holds a dataset with {key}={have!r}, this run asks for {key}={want!r}; "
                "use another --out (datasets never mix)"
            )
    have_sha = first.get("expert_sha256")
    if have_sha and have_sha != expert_sha:
        raise CollectError(
            f"--out {str(out)!r} was recorded with a different expert ({existing.card.get('expert', {}).get('path', '?')}, "
            f"sha256 {have_sha[:12]}), this run uses {expert_path} (sha256 {expert_sha[:12]}); use another --out"
        )
    base = int(first["track_seed"]) - int(first["episode_id"])
    if seed is not None and seed != base:
        if where.shard:
            i, n = where.shard
            raise CollectError(
                f"--out {str(out)!r} uses track seeds {base}+episode id, but shard {i}/{n} of "
                f"this run starts at seed {seed}; give the --seed and --episodes of the first run, or use another --out")
        raise CollectError(
            f"--out {str(out)!r} uses track seeds {base}+episode id; --seed {seed} would break that rule. "
            "Leave --seed out to continue, or use another --out"
        )
    return {
        "seed": base,
        "noise": old_cfg.get("noise", first.get("noise", where.spec.default_noise[where.action_space])),
        "noise_hold": old_cfg.get("noise_hold", first.get("noise_hold",
                                                          where.spec.default_noise_hold[where.action_space])),
    }


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
            raise CollectError(f"another {name} is writing into {str(out)!r} (pid {pid}); wait for it or use "
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


RESULT_FOLDERS = ("videos", "tb", "paths")  # evaluate.py's outputs that a re-run would otherwise add to, not replace
RESULT_FILES = "steering_*.png"
RESULT_MARKS = ("metrics.json", "episodes.csv", "comparison.json", "offline.json")  # a folder evaluate.py wrote


def clear_results(out: Path) -> None:
    """Before evaluate.py writes into ``out``: remove the last run's videos, TensorBoard events and steering plots
    (in ``out`` and its per-policy sub-folders), which this run might not all overwrite; its other files are
    rewritten, and imported recordings are kept for reuse. Only folders that hold evaluate.py's results are touched."""
    for folder in [out, *(p for p in out.iterdir() if p.is_dir() and p.name != "imported_data")]:
        if not any((folder / mark).is_file() for mark in RESULT_MARKS):
            continue
        for name in RESULT_FOLDERS:
            if (folder / name).is_dir() and not (folder / name).is_symlink():
                shutil.rmtree(folder / name)
        for f in folder.glob(RESULT_FILES):
            f.unlink()
