"""Record a PPO expert driving CarRacing or the udacity simulator as a behaviour-cloning dataset: camera frames,
executed actions, the expert's labels (and discrete probabilities), reward, speed, privileged state, telemetry and
time, one compressed file per episode plus a dataset card (dataset.json).

    python collect.py                                   # 25 continuous episodes -> data/carracing_continuous
    python collect.py --env udacity --episodes 20       # 3 cameras, lake and jungle tracks -> data/udacity
    python collect.py --action-space discrete --episodes 30 --noise 0.05
    python collect.py --out data/carracing_continuous --episodes 10     # appends 10 more episodes
    python collect.py --episodes 2 --max-steps 200 --out data/tiny --export-minari carracing/tiny-v0
    python collect.py --driver runs/train/nac/best.pt --beta 0.5 --episodes 15   # a DAgger round: the student drives
    python collect.py --driver ckpt.pt --recovery-labels --out data/carracing_discrete   # wrong-way states: the way back
    python collect.py --renderer fast --workers 2       # CarRacing frames drawn with OpenCV, 2 episodes at a time
    python collect.py --episodes 100 --shard 2/4        # episodes 25..49 of that run -> data/carracing_continuous-shard-2-of-4

The run lives in agent/data/collection.py (seeds, resume rules, workers), one episode in agent/data/recorder.py
(DART noise, DAgger), the format in agent/data/dataset.py; the Minari exporter in agent/data/minari_export.py
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

from agent.data.config import CollectConfig, CollectError
from agent.runtime import disk_full_line, show_progress
from common.cli import CliParser, option
from common.cli import build_parser as parser_of
from common.files import check_writable, disk_full

PROG = "python collect.py"


@dataclass
class Args(CollectConfig):
    """collect.py's arguments: the collection config plus the optional Minari export."""

    export_minari: str | None = option(None, "afterwards, export the whole dataset as Minari dataset ID (e.g. "
                                       "carracing/expert-v0)", group="output", metavar="ID")
    minari_path: Path | None = option(None, "MINARI_DATASETS_PATH for --export-minari (default: OUT/minari)",
                                      group="output")


def build_parser() -> CliParser:
    return parser_of(Args, PROG, __doc__)


def parse_args(argv: Sequence[str] | None = None) -> Args:
    args = Args(**vars(build_parser().parse_args(argv)))
    args.progress = show_progress(args.progress)  # a bar redrawn into a log file leaves debris there
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # no window: the env renders off-screen
    try:
        args = parse_args(argv)
        args.validate()
        check_writable(args.out_dir)  # at the start, not when the first episode is saved
        from agent.data.collection import collect

        result = collect(args, command="python collect.py " + shlex.join(argv), log=lambda m: print(m, file=sys.stderr))
        print(result.summary())
        if result.interrupted:
            return 130
        if args.export_minari:
            from agent.data.minari_export import export_minari

            path = export_minari(args.out_dir, args.export_minari, datasets_path=args.minari_path)
            print(f"exported Minari dataset {args.export_minari!r} to {path} "
                  f"(load with MINARI_DATASETS_PATH={path.parents[len(Path(args.export_minari).parts) - 1]})")
    except (CollectError, ValueError, FileNotFoundError, ImportError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a full disk: the episodes saved so far stay (a re-run appends to them)
        if not disk_full(e):
            raise
        print(disk_full_line(e), file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # before collection started or during the export: nothing half-written stays
        print("interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
