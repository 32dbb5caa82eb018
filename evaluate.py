"""Closed-loop evaluation CLI: drive CarRacing-v3 or the udacity simulator with trained policies (or the expert).

    python evaluate.py                                              # the shipped checkpoints/carracing_nac.pt
    python evaluate.py --env udacity --expert-drives --episodes 4   # the udacity expert on 4 unseen tracks
    python evaluate.py --checkpoint runs/train/nac/best.pt --episodes 10 --out eval/nac
    python evaluate.py --expert-drives --episodes 20                # the privileged expert (baseline)
    python evaluate.py --checkpoint nac.pt lstm.pt --with-expert --out eval/compare   # comparison.md
    python evaluate.py --checkpoint nac.pt --saliency --video-episodes 2              # Grad-CAM overlay
    python evaluate.py --episodes 20 --workers 2 --renderer fast                      # 2 processes, OpenCV frames
    python evaluate.py --data ~/recordings/lake --checkpoint runs/train/real/best.pt  # offline, on a real recording
    python evaluate.py --replay ~/recordings/lake --checkpoint runs/train/real/best.pt --replay-span 0.8:1
                                                                    # closed loop on a recording
    python evaluate.py --data data/carracing_discrete --checkpoint checkpoints/carracing_nac_discrete.pt
                                                                    # offline, vs the expert
    python evaluate.py --drop-prob 0.2 --renderer fast                                # 20 % of the frames lost
    python evaluate.py --env udacity --jitter 1:3 --latency-steps 1                   # irregular steps, 0.1 s late

What drives: --checkpoint (trained policies, .pt from train.py) or --expert-drives (the PPO expert, .zip;
--expert picks which one).
Episodes use track seeds SEED, SEED+1, ... (default 1000: unseen by expert training and by collect.py).
Timing conditions (--drop-prob, --jitter, --latency-steps; agent/evaluation/timing.py) apply to every driver,
the expert of --expert-drives / --with-expert included; the policy gets the true timestamp of every frame it sees,
draws are seeded by the track seed, and metrics.json records them in its "timing" block.
Every flag is a field of agent.evaluation.args.EvalArgs; one episode's loop lives in agent/evaluation/episode.py.
"""
from __future__ import annotations

import os
import sys
from contextlib import ExitStack
from typing import Callable

os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # headless pygame for the rendered env
os.environ.setdefault("SDL_AUDIODRIVER", "dummy")

from agent.evaluation.args import EvalArgs
from agent.evaluation.config import EvalPlan, resolve
from agent.evaluation.evaluate import evaluate
from common.cli import run_command

PROG = "python evaluate.py"


def main(argv: list[str] | None = None) -> int:
    command = " ".join([PROG, *(argv if argv is not None else sys.argv[1:])])
    return run_command(EvalArgs, lambda args: _evaluate_in_folder(lambda claim: resolve(args, claim=claim), command),
                       argv, prog=PROG, doc=__doc__)  # kill keeps finished episodes


def _evaluate_in_folder(plan_of: Callable[[ExitStack], EvalPlan], command: str) -> None:
    """The evaluation, with its --out claimed (writable, locked, the last results cleared) while the plan is made
    (a --replay recording is imported into it) and for as long as the run writes into it."""
    with ExitStack() as claim:
        evaluate(plan_of(claim), command=command)


if __name__ == "__main__":
    sys.exit(main())
