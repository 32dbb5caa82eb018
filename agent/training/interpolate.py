"""A student between two: the weights of a fine-tuned student mixed with those of the student it started from.

A fine-tune that taught a student something new (driving under latency) often costs some of what its start did
well (driving fast at regular timing). Both sit in one basin of the loss, so the straight line between their
weights usually keeps most of each (weight-space ensembling of a fine-tune, Wortsman et al. 2022, "WiSE-FT"):
``(1 - weight) * start + weight * tuned``, tensor by tensor. A start that was not told its latency is first
widened as ``train.py --init`` widens it (the new inputs' weights 0), so it answers exactly as before.

    python -m agent.training.interpolate --start checkpoints/carracing_nac.pt --tuned runs/lat/best.pt \
        --weight 0.6 --out runs/lat/mix.pt
"""
from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from common.cli import option, run_command


@dataclass
class InterpolateArgs:
    start: str = option(None, "the student the fine-tune started from (train.py --init's checkpoint)", group="input",
                        metavar="CKPT", required=True)
    tuned: str = option(None, "the fine-tuned student (its best.pt)", group="input", metavar="CKPT", required=True)
    weight: float = option(0.5, "share of the fine-tuned student's weights: 0 = the start, 1 = the fine-tune",
                           group="model")
    out: str = option(None, "the mixed student's checkpoint file", group="output", metavar="FILE", required=True)


def interpolate(start, tuned, weight: float):
    """A new policy with ``(1 - weight) * start + weight * tuned`` for every floating tensor (the tuned student's
    config and its other tensors); ValueError when the two are not the same network."""
    from policies.policy import DrivingPolicy, told_as_input

    if not (math.isfinite(weight) and 0 <= weight <= 1):
        raise ValueError(f"--weight must be in [0, 1] (0 = the start, 1 = the fine-tune), got {weight!r}")
    if tuned.config.latency_input == "input":
        start = told_as_input(start, tuned.config.queue_steps)  # as train.py --init widened it
    a, b = start.config.to_dict(), tuned.config.to_dict()
    differ = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    if differ:
        raise ValueError(f"--start and --tuned are not the same network ({', '.join(differ)} differ): give the "
                         "checkpoint the fine-tune started from (its --init)")
    first, second = start.state_dict(), tuned.state_dict()
    mixed = {k: (1 - weight) * first[k] + weight * v if v.is_floating_point() else v for k, v in second.items()}
    policy = DrivingPolicy(tuned.config).to(tuned.device)
    policy.load_state_dict(mixed)
    return policy.eval()


def run(args: InterpolateArgs) -> Path:
    return write_mix(args.start, args.tuned, args.weight, args.out)


def write_mix(start: str, tuned: str, weight: float, out: str) -> Path:
    """The mixed student written to ``out`` (the tuned checkpoint's metadata and where the mix came from); the one
    writer of this command, of train.py --blend-init and of the fine-tune benchmark."""
    from policies.checkpoint import load_checkpoint, read_checkpoint, save_checkpoint

    mixed = interpolate(load_checkpoint(start), load_checkpoint(tuned), weight)
    metadata = {**read_checkpoint(tuned).get("metadata", {}),
                "interpolation": {"start": start, "tuned": tuned, "weight": weight}}
    path = save_checkpoint(out, mixed, metadata=metadata)
    print(f"{path}: {1 - weight:g} x {start} + {weight:g} x {tuned}")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(InterpolateArgs, run, argv, prog="python -m agent.training.interpolate", doc=__doc__)


if __name__ == "__main__":
    sys.exit(main())
