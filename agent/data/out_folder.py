"""The --out folder of collect.py: what it already holds and whether this run may append to it (same env,
action space, expert and seed rule). The lock that keeps two runs out of one folder is common.files.folder_lock."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from agent.data.config import CollectError, Tracks
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
            f"--out {str(out)!r} is a folder that is not a collect.py dataset (it holds "
            f"{sorted(entries - known)[:5]}); "
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
            f"--out {str(out)!r} was recorded with a different expert "
            f"({existing.card.get('expert', {}).get('path', '?')}, "
            f"sha256 {have_sha[:12]}), this run uses {expert_path} (sha256 {expert_sha[:12]}); use another --out"
        )
    base = int(first["track_seed"]) - int(first["episode_id"])
    if seed is not None and seed != base:
        if where.shard:
            i, n = where.shard
            raise CollectError(
                f"--out {str(out)!r} uses track seeds {base}+episode id, but shard {i}/{n} of "
                f"this run starts at seed {seed}; give the --seed and --episodes of the first "
                "run, or use another --out")
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
