"""Closed-loop evaluation CLI: drive CarRacing-v3 or the udacity simulator with trained policies (or the expert).

    python evaluate.py                                              # the shipped checkpoints/carracing_nac.pt
    python evaluate.py --env udacity --policy expert --episodes 4   # the udacity expert on 4 unseen tracks
    python evaluate.py --checkpoint runs/train/nac/best.pt --episodes 10 --out eval/nac
    python evaluate.py --policy expert --episodes 20                # the privileged expert (baseline)
    python evaluate.py --checkpoint nac.pt lstm.pt --with-expert --out eval/compare   # comparison.md
    python evaluate.py --checkpoint nac.pt --saliency --video-episodes 2              # Grad-CAM overlay

Episodes use track seeds SEED, SEED+1, ... (default 1000: unseen by expert training and by collect.py).
Every flag is a field of agent.driver.EvalArgs; the loop lives in agent/driver.py.
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import fields
from typing import get_type_hints

os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # headless pygame for the rendered env
os.environ.setdefault("SDL_AUDIODRIVER", "dummy")

from agent.driver import EvalArgs, Interrupted, evaluate  # noqa: E402
from envs.registry import ENV_NAMES  # noqa: E402

HELP = {
    "env": f"environment: {', '.join(ENV_NAMES)}",
    "checkpoint": "policy checkpoint(s) (.pt); several -> one sub-folder each + comparison.md; "
                  "default: checkpoints/<env>_nac.pt",
    "policy": "'expert': drive the shipped expert itself (baseline)",
    "action_space": "continuous | discrete (carracing); must match the checkpoint (default: the checkpoint's; "
                    "expert: continuous)",
    "episodes": "episodes (= consecutive track seeds) per policy",
    "seed": "first track seed: episodes run on seeds SEED..SEED+EPISODES-1",
    "max_steps": "env steps per episode (default: the env's limit)",
    "video": "record mp4 videos (OUT/videos/seed_K.mp4)",
    "video_episodes": "record the first N episodes of each policy",
    "saliency": "overlay a CNN saliency map on the videos",
    "saliency_method": "gradcam (paper fig. 6) | visualbackprop",
    "with_expert": "also evaluate the expert on the same seeds (a row of comparison.md)",
    "expert": "expert .zip that shadows the policy (steering MAE) and drives --policy expert; default: shipped",
    "out": "output folder (default eval/<name>)",
    "device": "cpu | cuda",
    "threads": "torch threads (single-frame latency: 1 is fastest on a 2-core CPU)",
    "tensorboard": "write TensorBoard scalars to OUT/tb",
    "progress": "tqdm progress bars",
}


def parse_args(argv: list[str] | None = None) -> EvalArgs:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    hints = get_type_hints(EvalArgs)
    defaults = EvalArgs()
    for f in fields(EvalArgs):
        flag = "--" + f.name.replace("_", "-")
        kind, default = hints[f.name], getattr(defaults, f.name)
        kw = {"help": HELP.get(f.name, "") + (f" (default: {default})" if default not in (None, [], True, False) else "")}
        if kind is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, **kw)
        elif f.name == "checkpoint":
            parser.add_argument(flag, nargs="+", default=[], metavar="CKPT", **kw)
        elif f.name in ("env", "action_space", "policy", "saliency_method"):
            choices = {"env": list(ENV_NAMES), "action_space": ["continuous", "discrete"], "policy": ["expert"],
                       "saliency_method": ["gradcam", "visualbackprop"]}[f.name]
            parser.add_argument(flag, choices=choices, default=default, **kw)
        else:
            parser.add_argument(flag, type=int if kind in (int, int | None) else str, default=default, **kw)
    return EvalArgs(**vars(parser.parse_args(argv)))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        evaluate(args, command=" ".join(["python evaluate.py", *(argv if argv is not None else sys.argv[1:])]))
    except Interrupted as e:
        print(f"\n{e}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:  # before any episode finished (e.g. while loading)
        print("\ninterrupted", file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
