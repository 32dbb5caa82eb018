"""Several datasets (collection shards over disjoint track seeds) written as one, with one card:

    python -m agent.data.merge data/shard0 data/shard1 --out data/all

The datasets (e.g. the shards of collect.py --shard I/N, or runs over disjoint --seed ranges) must share env,
action space and expert, and never repeat a track seed. Episode ids become track seed - lowest seed, so
collect.py --out MERGED (DAgger, more episodes) appends to it. ``train.py --data A B`` reads several folders as
one without this copy (``open_datasets``)."""
from __future__ import annotations

import json
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from common.cli import option, run_command
from common.files import StagingFolder, atomic_write, write_json
from driving_data.dataset import CARD_NAME, DemoDataset, episode_path, join_datasets, open_dataset, read_episode_meta

PROG = "python -m agent.data.merge"


def _copy_episode(src: Path, dst: Path, meta: dict) -> None:
    """Copy an episode file, atomically; with a new ``meta`` every array member is copied as it is stored
    (deflated, or raw JPEG bytes) and only ``meta`` is written anew."""
    def write(f: Any) -> None:
        if meta == read_episode_meta(src):
            with open(src, "rb") as r:
                shutil.copyfileobj(r, f, 1 << 20)
            return
        with zipfile.ZipFile(src) as zin, zipfile.ZipFile(f, "w", allowZip64=True) as zout:
            for info in zin.infolist():
                member = zipfile.ZipInfo(info.filename, date_time=info.date_time)
                member.compress_type = info.compress_type
                with zout.open(member, "w", force_zip64=True) as w:
                    if info.filename == "meta.npy":
                        np.lib.format.write_array(w, np.array(json.dumps(meta)), allow_pickle=False)
                    else:
                        with zin.open(info) as r:
                            shutil.copyfileobj(r, w, 1 << 20)

    atomic_write(dst, write)


def merge_datasets(roots: Sequence[str | Path], out: str | Path, *, command: str | None = None) -> DemoDataset:
    """Write the episodes of several datasets (collection shards: disjoint track-seed ranges) as one new
    dataset with one card, into ``out`` (new or empty; it appears complete or not at all).

    Episode ids become ``track_seed - lowest seed``, so the collector's rule "episode k is track seed + k"
    holds for the merged folder and ``collect.py --out MERGED`` (a DAgger round, more episodes) appends
    after the highest seed. The card is the collector's, rebuilt from every episode's metadata (counts,
    returns, action histograms are those of one collection over all the seeds); its ``runs`` keep every
    source's runs (with their ``dataset``) and end with this merge. Folders that are not collect.py output
    (no track seeds) are renumbered 0.. in the order given, under a card that sums their counts."""

    roots = list(roots)
    if len(roots) < 2:
        raise ValueError(f"merge needs at least two dataset folders, got {len(roots)}")
    out = Path(out)
    if any(out.resolve() == Path(r).resolve() for r in roots):
        raise ValueError(f"--out {str(out)!r} is one of the datasets to merge; choose a new folder")
    parts, rows = join_datasets(roots)
    seeds = [m.get("track_seed") for _, m, _ in rows]
    base = min(seeds) if all(isinstance(s, int) for s in seeds) else None
    metas = [{**m, "episode_id": (m["track_seed"] - base) if base is not None else k}
             for k, (_, m, _) in enumerate(rows)]
    with StagingFolder(out) as tmp:
        for (_, _, src), meta in zip(rows, metas):
            _copy_episode(src, episode_path(tmp, meta["episode_id"]), meta)
        write_json(tmp / CARD_NAME, _merged_card(parts, rows, metas, base, command))
    return open_dataset(out)


def _merged_card(parts: list[DemoDataset], rows: list[tuple[DemoDataset, dict, Path]], metas: list[dict],
                 base: int | None, command: str | None) -> dict[str, Any]:
    import time

    first = rows[0][0].card
    steps = int(sum(m["length"] for m in metas))
    runs = [{**r, "dataset": str(ds.root)} for ds in parts for r in ds.card.get("runs", [])]
    sources = []
    for ds in parts:
        seeds = [m["track_seed"] for m in ds.episodes] if base is not None else []
        sources.append({"dataset": str(ds.root), "episodes": len(ds), "steps": ds.num_steps,
                        "track_seeds": [min(seeds), max(seeds)] if seeds else None})
    runs.append({"command": command or "merge", "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "merged_from": sources,
                 "episodes_added": len(metas), "steps_added": steps, "interrupted": False})
    config = first.get("config")
    if config and base is not None:
        from agent.data.card import build_card
        from envs.registry import get_spec

        try:
            return build_card({**config, "seed": base}, first.get("expert") or {}, runs, metas, get_spec(config["env"]))
        except (KeyError, TypeError, ValueError):  # episodes without the collector's metadata: the plain card below
            pass
    dt = first.get("dt")
    counts = {"episodes": len(metas), "steps": steps, **({"hours_of_driving": steps * dt / 3600} if dt else {})}
    return {**first, "counts": counts, "runs": runs,
            "episodes": [{k: m.get(k) for k in ("episode_id", "track_seed", "length")} for m in metas]}


@dataclass
class MergeArgs:
    sources: list[str] = option(help="dataset folders (collect.py --out)", group="input", metavar="DATA",
                                positional=True)
    out: str | None = option(None, "the merged dataset folder (new or empty)", group="output", metavar="OUT",
                             required=True)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m agent.data.merge A B ... --out C``: one dataset from collection shards."""
    import shlex
    import sys

    command = f"{PROG} " + shlex.join(list(argv if argv is not None else sys.argv[1:]))
    # a mistake, a full disk or Ctrl-C: the staging folder is removed, nothing half-written stays
    return run_command(MergeArgs, lambda args: _merge(args, command), argv, prog=PROG, doc=__doc__,
                       mistakes=(ValueError, OSError))


def _merge(args: MergeArgs, command: str) -> None:
    merged = merge_datasets(args.sources, args.out, command=command)
    seeds = [m.get("track_seed") for m in merged.episodes]
    span = f", track seeds {min(seeds)}..{max(seeds)}" if all(isinstance(x, int) for x in seeds) else ""
    print(f"merged {len(args.sources)} datasets into {merged.root}: {len(merged)} episodes, "
          f"{merged.num_steps} steps{span}")


if __name__ == "__main__":
    raise SystemExit(main())
