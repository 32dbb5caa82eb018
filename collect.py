"""Record a PPO expert driving CarRacing or the udacity simulator as a behaviour-cloning dataset.

    python collect.py                                   # 25 continuous episodes -> data/carracing_continuous
    python collect.py --env udacity --episodes 20       # 3 cameras, lake and jungle tracks -> data/udacity
    python collect.py --action-space discrete --episodes 30 --noise 0.05
    python collect.py --out data/carracing_continuous --episodes 10     # appends 10 more episodes
    python collect.py --episodes 2 --max-steps 200 --out /tmp/tiny --export-minari carracing/tiny-v0
    python collect.py --driver runs/train/nac/best.pt --beta 0.5 --episodes 15   # a DAgger round: the student drives
    python collect.py --driver ckpt.pt --recovery-labels --out data/carracing_discrete   # wrong-way states: the way back
    python collect.py --renderer fast --workers 2       # CarRacing frames drawn with OpenCV, 2 episodes at a time
    python collect.py --episodes 100 --shard 2/4        # episodes 25..49 of that run -> data/carracing_continuous-shard-2-of-4

The run lives in agent/data/collection.py (seeds, resume rules, workers), one episode in agent/data/recorder.py
(DART noise, DAgger), the format in agent/data/dataset.py; the Minari exporter in agent/data/minari_export.py
(also `python -m agent.data.minari_export DATA_DIR ID`).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn, Sequence

from agent.data.config import DEFAULT_EPISODES, DEFAULT_SEED, CollectConfig, CollectError, parse_shard
from agent.workers import MAX_WORKERS
from common.files import check_writable
from envs.registry import ENV_NAMES, get_spec
from policies.actions import DISCRETE_ACTION_RULES


@dataclass
class Args(CollectConfig):
    """collect.py's arguments: the collection config plus the optional Minari export."""

    export_minari: str | None = None
    minari_path: Path | None = None


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2, no usage dump
        self.exit(2, f"error: {message} (see python collect.py --help)\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python collect.py",
        description="Drive a rendered env with its privileged PPO expert and record camera frames, executed "
        "actions, the expert's labels (and discrete probabilities), reward, speed, privileged state, telemetry and "
        "time, one compressed file per episode plus a dataset card (dataset.json).",
        epilog="Episode k uses track seed SEED+k. The default seed 3000000 is disjoint from the expert's training "
        "[100000, 2000000), validation (90000..) and evaluation (1000..) tracks. Re-running with the same --out "
        "appends episodes (same env, action space and expert required). Ctrl-C stops cleanly.",
    )
    d = Args()
    p.add_argument("--env", default=d.env, help=f"environment: {' | '.join(ENV_NAMES)} (default: {d.env})")
    p.add_argument("--action-space", default=None, help="continuous | discrete (discrete: carracing only) (default: continuous)")
    p.add_argument("--episodes", type=int, default=DEFAULT_EPISODES, help=f"episodes to ADD in this run (default: {DEFAULT_EPISODES})")
    p.add_argument("--max-steps", type=int, default=None, help="steps per episode before truncation (default: the env's, "
                   "carracing 1000)")
    p.add_argument("--seed", type=int, default=None, help=f"first track seed (default: the existing dataset's, else {DEFAULT_SEED})")
    p.add_argument("--noise", type=float, default=None,
                   help="DART noise on the executed action (default: the existing dataset's, else "
                        + "; ".join(f"{e}: " + ", ".join(f"{v} {k}" for k, v in get_spec(e).default_noise.items())
                                    for e in ENV_NAMES)
                        + "): continuous = std of Gaussian noise on steer and throttle; discrete = probability of a "
                        "random other action")
    p.add_argument("--noise-hold", type=int, default=None, help="frames each noise sample is held (default: the existing dataset's, else "
                        + "; ".join(f"{e}: " + ", ".join(f"{v} {k}" for k, v in get_spec(e).default_noise_hold.items())
                                    for e in ENV_NAMES) + ")")
    p.add_argument("--expert", type=Path, default=None, help="SB3 PPO .zip (default: the env's shipped expert in checkpoints/)")
    p.add_argument("--out", type=Path, default=None, help="dataset folder (default: data/carracing_<action-space> or data/udacity); "
                   "an existing one is appended to")
    p.add_argument("--export-minari", metavar="ID", default=None, help="afterwards, export the whole dataset as Minari dataset ID (e.g. carracing/expert-v0)")
    p.add_argument("--minari-path", type=Path, default=None, help="MINARI_DATASETS_PATH for --export-minari (default: OUT/minari)")
    p.add_argument("--no-early-stop", dest="early_stop", action="store_false",
                   help="record full episodes even after the car is stuck (stopped 1 s) or off road for 5 s "
                        "(default: such episodes end there)")
    p.add_argument("--driver", type=Path, default=None, metavar="CKPT",
                   help="DAgger: this trained policy (train.py checkpoint) drives and the expert labels every frame it "
                        "sees; append the episodes to the dataset and retrain on all of it (default: the expert drives)")
    p.add_argument("--beta", type=float, default=0.0,
                   help="DAgger mixture: probability per step that the expert's action is executed instead of the "
                        "--driver's (default: 0)")
    p.add_argument("--driver-actions", choices=DISCRETE_ACTION_RULES, default=None,
                   help="how a discrete --driver picks its action: argmax (the likeliest) | sample (from its softmax, "
                        "seeded by the track seed) | dither (each action as often as its probability over consecutive "
                        "steps, deterministic), as evaluate.py --discrete-actions (default: the rule the checkpoint was trained to "
                        "drive with, train.py --discrete-actions; argmax if it names none)")
    p.add_argument("--driver-temperature", type=float, default=None, metavar="T",
                   help="sample / dither drivers: draw from the softmax raised to 1/T (T > 1 flatter, T < 1 "
                        "greedier), as evaluate.py --action-temperature (default: the checkpoint's own, train.py "
                        "--action-temperature, when it drives by its own rule; 1 when --driver-actions names another)")
    p.add_argument("--cut-wrong-way", action="store_true",
                   help="end an episode once the car has pointed against the course for 1 s and drop that stretch: "
                        "after a DAgger student's spin the expert, which never learnt those states, steers or "
                        "brakes where the camera shows what looks like a road driven forwards (default: off)")
    p.add_argument("--recovery-labels", action="store_true",
                   help="in the states the expert never learnt (carracing: pointing against the course, or the car's "
                        "centre more than 2 half-widths off the centerline) the env's recovery teacher labels instead, "
                        "turning the car round / back to the road; each step records who labelled it (label_source: "
                        "0 expert, 1 recovery) and the card the counts. For DAgger rounds whose students spin "
                        "(default: the expert labels every state)")
    p.add_argument("--recovery-starts", type=float, default=0.0, metavar="P",
                   help="probability that an episode starts with the car placed off its usual start, drawn from "
                        "the track seed: carracing: standing anywhere on the lap, turned by any heading, shifted up to "
                        "the road's edge; udacity: off-centre in its lane, turned up to 0.3 rad, at 0 to the target "
                        "speed (default: 0)")
    p.add_argument("--renderer", default=None,
                   help="who draws the camera frames: " + "; ".join(f"{e}: {' | '.join(get_spec(e).renderers)}"
                                                                  for e in ENV_NAMES)
                        + " (default: the first, the reference). carracing fast = OpenCV, about 12x gymnasium's pygame, "
                        "frames within a fraction of a grey level; recorded per episode")
    p.add_argument("--workers", type=int, default=None,
                   help="episodes recorded at the same time, one process each; the dataset is the one a single "
                        f"process records (default: one per CPU core, at most {MAX_WORKERS} and at most --episodes; "
                        "1 = everything in this process)")
    p.add_argument("--shard", type=_shard, default=None, metavar="I/N",
                   help="collect only the I-th of N contiguous, disjoint parts of this run's seeds (--seed, --episodes "
                        "are the whole run's) into OUT-shard-I-of-N, e.g. one part per machine; the N parts together are "
                        "exactly the run, merged with python -m agent.data.merge. A re-run completes the shard "
                        "(default: the whole run)")
    p.add_argument("--theme", default=None, metavar="NAMES",
                   help="envs with scenes (udacity-hard): comma-separated themes the episodes draw from by seed "
                        "(default: the training themes, lake,jungle; mountain is held out for evaluation)")
    p.add_argument("--condition", default=None, metavar="NAMES",
                   help="envs with scenes: comma-separated lighting/weather conditions (default: the training ones, "
                        "clear,overcast,dusk; fog is held out)")
    p.add_argument("--allow-held-out", action="store_true",
                   help="record held-out themes or conditions too (default: refused, so that evaluation on them "
                        "measures generalisation to scenes never trained on)")
    p.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no progress bar (default: a bar on stderr when it is a terminal; none in a log file)")
    return p


def _shard(text: str) -> tuple[int, int]:
    try:
        return parse_shard(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def parse_args(argv: Sequence[str] | None = None) -> Args:
    args = Args(**vars(build_parser().parse_args(argv)))
    # a bar redrawn into a log file leaves carriage-return debris there: bars only on a terminal
    args.progress = args.progress and _is_terminal(sys.stderr)
    return args


def _is_terminal(stream: object) -> bool:
    try:
        return bool(stream.isatty())  # type: ignore[attr-defined]
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


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
    except KeyboardInterrupt:  # before collection started or during the export: nothing half-written stays
        print("interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
