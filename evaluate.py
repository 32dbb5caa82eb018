"""Closed-loop evaluation CLI: drive CarRacing-v3 or the udacity simulator with trained policies (or the expert).

    python evaluate.py                                              # the shipped checkpoints/carracing_nac.pt
    python evaluate.py --env udacity --expert-drives --episodes 4   # the udacity expert on 4 unseen tracks
    python evaluate.py --checkpoint runs/train/nac/best.pt --episodes 10 --out eval/nac
    python evaluate.py --expert-drives --episodes 20                # the privileged expert (baseline)
    python evaluate.py --checkpoint nac.pt lstm.pt --with-expert --out eval/compare   # comparison.md
    python evaluate.py --checkpoint nac.pt --saliency --video-episodes 2              # Grad-CAM overlay
    python evaluate.py --episodes 20 --workers 2 --renderer fast                      # 2 processes, OpenCV frames
    python evaluate.py --data ~/recordings/lake --checkpoint runs/train/real/best.pt  # offline, on a real recording
    python evaluate.py --replay ~/recordings/lake --checkpoint runs/train/real/best.pt --replay-span 0.8:1  # closed loop on a recording
    python evaluate.py --data data/carracing_discrete --checkpoint checkpoints/carracing_nac_discrete.pt  # offline, vs the expert
    python evaluate.py --drop-prob 0.2 --renderer fast                                # 20 % of the frames lost
    python evaluate.py --env udacity --jitter 1:3 --latency-steps 1                   # irregular steps, 0.1 s late

What drives: --checkpoint (trained policies, .pt from train.py) or --expert-drives (the PPO expert, .zip;
--expert picks which one). --policy expert, the old spelling of --expert-drives, still works and says so.
Episodes use track seeds SEED, SEED+1, ... (default 1000: unseen by expert training and by collect.py).
Timing conditions (--drop-prob, --jitter, --latency-steps; agent/evaluation/timing.py) apply to every driver,
the expert of --expert-drives / --with-expert included; the policy gets the true timestamp of every frame it sees,
draws are seeded by the track seed, and metrics.json records them in its "timing" block.
Every flag is a field of agent.evaluation.evaluate.EvalArgs (--expert-drives is the field policy); one episode's loop
lives in agent/evaluation/episode.py.
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any, NoReturn, get_type_hints

os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # headless pygame for the rendered env
os.environ.setdefault("SDL_AUDIODRIVER", "dummy")

from agent.controllers import shipped_checkpoint
from agent.data.out_folder import clear_results, run_folder
from agent.evaluation.evaluate import EvalArgs, Interrupted, evaluate, run_names, safe_name
from agent.runtime import cli_exit_code
from agent.workers import MAX_WORKERS
from envs.registry import ENV_NAMES  # noqa: E402
from policies.actions import DISCRETE_ACTION_RULES  # noqa: E402
from policies.policy import WINDOW_CLOCKS  # noqa: E402

PROG = "python evaluate.py"
FLAGS = {"policy": "--expert-drives"}  # EvalArgs field -> its flag, where the two differ
HELP = {
    "env": f"environment: {' | '.join(ENV_NAMES)}",
    "checkpoint": "policy checkpoint(s) (.pt from train.py) that drive; several -> one sub-folder each + "
                  "comparison.md (default: checkpoints/<env>_nac.pt, the shipped student)",
    "name": "display names of the --checkpoint policies, in order, in comparison.md and as folder names "
            "(default: the file stems)",
    "policy": "the PPO expert drives instead of a policy checkpoint: the baseline (formerly --policy expert)",
    "action_space": "continuous | discrete (carracing); must match the checkpoint (default: the checkpoint's; "
                    "expert: continuous)",
    "episodes": "episodes (= consecutive track seeds) per policy (default: 5; --replay: every session)",
    "seed": "first track seed: episodes run on seeds SEED..SEED+EPISODES-1 (default: 1000, unseen by training; "
            "--replay: 0, its first session)",
    "max_steps": "env steps per episode (default: the env's limit, carracing 1000)",
    "video": "record mp4 videos (OUT/videos/seed_K.mp4)",
    "video_episodes": "record the first N episodes of each policy",
    "saliency": "overlay a CNN saliency map on the videos",
    "saliency_method": "gradcam (paper fig. 6) | visualbackprop",
    "with_expert": "also evaluate the expert on the same seeds (a row of comparison.md)",
    "expert": "expert .zip that shadows the policy (steering MAE) and drives with --expert-drives "
              "(default: the env's shipped one in checkpoints/)",
    "out": "output folder (default: eval/<name>, or eval/compare for several)",
    "device": "auto (cuda if available) | cpu | cuda | cuda:N",
    "threads": "torch threads (single-frame latency: 1 is fastest on a 2-core CPU)",
    "tensorboard": "write TensorBoard scalars to OUT/tb",
    "progress": "progress bars on stderr when it is a terminal (else one line per episode)",
    "renderer": "who draws the camera frames: carracing pygame (gymnasium's, the reference the shipped students "
                "were trained on) | fast (OpenCV, about 12x faster); udacity: native (default: the env's first)",
    "data": "score the checkpoints offline on recorded driving instead of driving: a real simulator recording "
            "(driving_log.csv + IMG/) or a dataset; steering MSE/MAE against the recorded values and their 0.5 s "
            "average, beside always-straight and the training mean, per session, with a PNG of predicted vs recorded "
            "steering (writes OUT/offline.md, offline.json, steering_<k>.png; default OUT: eval/offline). A discrete "
            "student is scored on the recorded (expert's) action ids: agreement of its likeliest action beside always "
            "the commonest, and the mean probability of each action at its sampling temperature",
    "drop_prob": "timing: probability P in [0, 1) that the policy gets no new frame at a step; its stream is not "
                 "stepped and its last action is held (the first frame of an episode always arrives)",
    "jitter": "timing: K1:K2, the policy gets a frame every k env steps, k drawn from K1..K2 at each frame; the env "
              "keeps its own dt and the action is held in between (default: every step)",
    "latency_steps": "timing: each action reaches the env this many env steps after the policy decided it; the "
                     "first ones apply the neutral action (zeros: no steering, no gas)",
    "window_clock": "how a policy picks its window from the frames it got: steps (the last frames received, every "
                    "frame_stride-th) | time (the newest frames at or before the trained offsets in seconds, so under "
                    "dropped or irregular frames the window spans the time it was trained on; identical under regular "
                    "timing)",
    "discrete_actions": "discrete students: argmax (the likeliest action) | sample (drawn from the policy's softmax, "
                        "seeded by the track seed; the discrete expert pulses gas and steering, which argmax turns into "
                        "gas wherever the next pulse is not visible) | dither (error diffusion: over consecutive steps "
                        "each action is taken as often as its probability says, deterministically) (default: the rule "
                        "the checkpoint was trained to drive with, train.py --discrete-actions; argmax if it names none)",
    "action_temperature": "discrete students that sample or dither: the softmax temperature T (probabilities "
                          "raised to 1/T): above 1 the less likely actions (brake, the other steering pulse) come "
                          "more often and the student drives more cautiously (default: the checkpoint's, 1 unless "
                          "it names one or --discrete-actions overrides its rule)",
    "temperature_spares": "discrete students that sample or dither: comma-separated actions (e.g. brake) that keep "
                          "their probability at temperature 1 while the others share the rest at --action-temperature; "
                          "with brake spared a student at 1.5 drives as fast as at 1 and spins as often (measured in "
                          "docs/results.md: the readier brake is what prevents the spins)",
    "theme": "envs with scenes (udacity-hard): comma-separated themes the episodes draw from by seed, each reported "
             "apart in metrics.json (by_theme) (default: all, lake,jungle,mountain; mountain is never trained on)",
    "condition": "envs with scenes: comma-separated lighting/weather conditions, reported apart (by_condition) "
                 "(default: all, clear,overcast,dusk,fog; fog is never trained on)",
    "pi_speed": "udacity-hard: the env's PI controller holds the speed limit and the policy steers only (for "
                "students trained with train.py --head steer)",
    "replay": "drive the checkpoints in closed loop through a recording: REC is a real simulator recording "
              "(driving_log.csv + IMG/) or a dataset of the udacity envs. Each recorded center frame is reprojected to "
              "the car's pose off the recorded path, a bicycle model at the recorded speed integrates the policy's "
              "steering, and more than 1 m (or 30 degrees) off the recorded driver's line is an intervention. Seeds "
              "are the recording's sessions (--seed, --episodes pick some); --expert-drives replays the recorded "
              "steering; metrics.json gives autonomy and interventions per 100 s beside always-straight's, "
              "paths/part_K.png the driven path (default OUT: eval/replay)",
    "replay_max_offset": "with --replay: metres from the recorded driver's line beyond which the car is put back "
                         "(an intervention; NVIDIA's rule is 1 m)",
    "replay_span": "with --replay: A:B, the part of every session that is replayed, as fractions (0.8:1 = its last "
                   "20 %%, what train.py holds out of a recording) (default: 0:1)",
    "workers": "episodes driven at the same time, one process each; metrics and videos are those of a single "
               f"process (default: one per CPU core / --threads, at most {MAX_WORKERS} and at most the episodes; "
               "1 = everything in this process)",
}
METAVARS = {"replay": "REC", "replay_span": "A:B", "replay_max_offset": "M", "action_temperature": "T", "temperature_spares": "ACTIONS", "drop_prob": "P", "jitter": "K1:K2", "latency_steps": "D"}
CHOICES = {"window_clock": list(WINDOW_CLOCKS), "discrete_actions": list(DISCRETE_ACTION_RULES),
           "env": list(ENV_NAMES), "action_space": ["continuous", "discrete"],
           "saliency_method": ["gradcam", "visualbackprop"]}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2, no usage dump
        self.exit(2, f"error: {message} (see {PROG} --help)\n")


class _PolicyExpert(argparse.Action):
    """--policy expert, the old spelling of --expert-drives: still works, and says so on stderr (one line)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        if values != "expert":
            parser.error(f"--policy only took 'expert' (now --expert-drives); trained policies are given with "
                         f"--checkpoint CKPT, got {values!r}")
        print("note: --policy expert is deprecated, use --expert-drives", file=sys.stderr)
        setattr(namespace, self.dest, "expert")


def with_default(text: str, default: Any) -> str:
    """Help text that names the default once, in words (switches: on/off); text that already says it stays."""
    if "default" in text.lower() or default is None or default == []:
        return text
    shown = ("on" if default else "off") if isinstance(default, bool) else default
    return f"{text} (default: {shown})"


def build_parser() -> argparse.ArgumentParser:
    doc = __doc__.split("\n\n", 1)
    parser = _Parser(prog=PROG, description=doc[0], epilog=doc[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    hints = get_type_hints(EvalArgs)
    defaults = EvalArgs()
    for f in fields(EvalArgs):
        flag = FLAGS.get(f.name, "--" + f.name.replace("_", "-"))
        kind, default = hints[f.name], getattr(defaults, f.name)
        text = with_default(HELP.get(f.name, ""), default)
        if kind is bool:
            action = parser.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=default)
            action.help = text  # set afterwards: Python 3.11's BooleanOptionalAction appends its own "(default: ...)"
        elif f.name in ("checkpoint", "name", "data"):
            parser.add_argument(flag, nargs="+", default=[], metavar={"checkpoint": "CKPT", "name": "NAME"}.get(f.name, "DATA"),
                                help=text)
        elif f.name == "policy":
            parser.add_argument(flag, dest=f.name, action="store_const", const="expert", default=None, help=text)
            parser.add_argument("--policy", dest=f.name, action=_PolicyExpert, metavar="expert",
                                default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        elif f.name in CHOICES:
            parser.add_argument(flag, choices=CHOICES[f.name], default=default, help=text)
        else:
            number = {int: int, int | None: int, float: float, float | None: float}.get(kind, str)
            parser.add_argument(flag, type=number, default=default, metavar=METAVARS.get(f.name), help=text)
    return parser


def parse_args(argv: list[str] | None = None) -> EvalArgs:
    return EvalArgs(**vars(build_parser().parse_args(argv)))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = " ".join(["python evaluate.py", *(argv if argv is not None else sys.argv[1:])])
    return cli_exit_code(lambda: _evaluate_in_folder(args, command), Interrupted)  # kill keeps finished episodes


def _evaluate_in_folder(args: EvalArgs, command: str) -> None:
    """The evaluation, with its --out checked writable and locked first; a re-run's results replace the last's."""
    args.validate()  # a bad flag is the likelier mistake: say that before anything about the folder
    args.out = str(_default_out(args)) if args.out is None else args.out
    with run_folder(Path(args.out), "evaluate.py"):
        clear_results(Path(args.out))
        evaluate(args, command=command)


def _default_out(args: EvalArgs) -> Path:
    """eval/offline for --data; else eval/<name> of the one policy that drives, eval/compare for several."""
    if args.data:
        return Path("eval") / "offline"
    if args.replay:
        return Path("eval") / "replay"
    names = [] if args.policy == "expert" else (
        [safe_name(n) for n in args.name] if args.name else run_names(list(args.checkpoint) or [str(shipped_checkpoint(args.env))]))
    names += ["expert"] if args.policy == "expert" or args.with_expert else []
    return Path("eval") / (names[0] if len(names) == 1 else "compare")


if __name__ == "__main__":
    sys.exit(main())
