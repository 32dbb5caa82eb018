"""Record a PPO expert driving CarRacing or the udacity simulator as a behaviour-cloning dataset: camera frames,
executed actions, the expert's labels (and discrete probabilities), reward, speed, privileged state, telemetry and
time, one compressed file per episode plus a dataset card (dataset.json).

    python collect.py                                   # 25 continuous episodes -> data/carracing_continuous
    python collect.py --env udacity --episodes 20       # 3 cameras, lake and jungle tracks -> data/udacity
    python collect.py --action-space discrete --episodes 30 --noise 0.05
    python collect.py --out data/carracing_continuous --episodes 10     # appends 10 more episodes
    python collect.py --episodes 2 --max-steps 200 --out data/tiny --export-minari carracing/tiny-v0
    python collect.py --driver runs/train/nac/best.pt --beta 0.5 --episodes 15   # a DAgger round: the student drives
    python collect.py --driver ckpt.pt --recovery-labels --out data/carracing_discrete  # wrong-way states: the way back
    python collect.py --renderer fast --workers 2       # CarRacing frames drawn with OpenCV, 2 episodes at a time
    python collect.py --episodes 100 --shard 2/4        # episodes 25..49 of that run
                                                        # -> data/carracing_continuous-shard-2-of-4

The run lives in agent/data/collection.py (seeds, resume rules, workers), one episode in agent/data/recorder.py
(DART noise, DAgger), the format in driving_data/dataset.py; the Minari exporter in agent/data/minari_export.py
(also `python -m agent.data.minari_export DATA ID`).

Episode k uses track seed SEED+k. The default seed 3000000 is disjoint from the expert's training [100000, 2000000),
validation (90000..) and evaluation (1000..) tracks. Re-running with the same --out appends episodes (same env,
action space and expert required). Ctrl-C stops cleanly.
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from agent.data.config import CollectConfig
from common.cli import option, run_command
from common.files import check_writable

PROG = "python collect.py"


@dataclass
class CollectArgs(CollectConfig):
    """collect.py's arguments: the collection config plus the optional Minari export."""

    export_minari: str | None = option(None, "afterwards, export the whole dataset as Minari dataset ID (e.g. "
                                       "carracing/expert-v0)", group="output", metavar="ID")
    minari_path: Path | None = option(None, "MINARI_DATASETS_PATH for --export-minari (default: OUT/minari)",
                                      group="output")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # no window: the env renders off-screen
    command = f"{PROG} " + shlex.join(argv)
    # a full disk keeps the episodes saved so far (a re-run appends to them); Ctrl-C before the collection or during
    # the export leaves nothing half-written; the collection installs its own stop-signal handling
    return run_command(CollectArgs, lambda args: _collect(args, command), argv, prog=PROG, doc=__doc__,
                       mistakes=(ValueError, FileNotFoundError, ImportError), stop_signals=False)


def _collect(args: CollectArgs, command: str) -> int:
    """The collection (130 when it was stopped: its summary says what was kept), then the Minari export."""
    args.validate()
    check_writable(args.out_dir)  # at the start, not when the first episode is saved
    from agent.data.collection import collect

    result = collect(args, command=command, log=lambda m: print(m, file=sys.stderr))
    print(result.summary())
    if result.interrupted:
        return 130
    if args.export_minari:
        from agent.data.minari_export import export_minari

        path = export_minari(args.out_dir, args.export_minari, datasets_path=args.minari_path)
        print(f"exported Minari dataset {args.export_minari!r} to {path} "
              f"(load with MINARI_DATASETS_PATH={path.parents[len(Path(args.export_minari).parts) - 1]})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
