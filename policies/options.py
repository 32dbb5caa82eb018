"""The options of how a policy runs that several commands take, each declared once: ``--precision`` (train.py,
evaluate.py, ``python -m agent.training.dagger``), ``--discrete-actions`` and ``--action-temperature`` (train.py,
evaluate.py). A command's argument dataclass declares the field with the function of the same name,

    precision: str = precision_option()

so its flag, default, choices and help are the same in every command (``tests/test_cli_options.py`` holds every
command to it). Their fixed choices are checked by the parser and, for arguments built in code, by
``common.cli.check_choices``; ``check_action_options`` is the one check of what choices cannot say."""
from __future__ import annotations

from typing import Any

from common.cli import option
from policies.actions import DISCRETE_ACTION_RULES, check_temperature
from policies.precision import PRECISIONS


def precision_option() -> Any:
    """``--precision``: the arithmetic of the frame encoder (policies/precision.py)."""
    return option("auto",
        "the frame encoder's arithmetic where it encodes batches of frames (training, evaluate.py --data): auto (bf16 "
        "where it is faster: a CPU with AMX, a CUDA GPU with native bf16; else fp32) | bf16 | fp32; the sequence "
        "core, the loss, the optimizer and a drive's one frame per step run fp32 under every precision "
        "(policies/precision.py); train.py --resume takes this command's", group="runtime", choices=PRECISIONS)


def discrete_actions_option() -> Any:
    """``--discrete-actions``: how a discrete student picks its action (policies/actions.py)."""
    return option(None,
        "discrete students: how they pick their action from their softmax: argmax (the likeliest) | sample (drawn "
        "from it, seeded by the track seed) | dither (error diffusion: over consecutive steps each action is taken "
        "as often as its probability says, deterministically); train.py writes the rule into the checkpoint (with "
        "--init: the checkpoint's unless given), evaluate.py drives by it instead of the checkpoint's (default: "
        "train.py argmax, evaluate.py the checkpoint's rule)", group="what drives", choices=DISCRETE_ACTION_RULES)


def action_temperature_option() -> Any:
    """``--action-temperature``: the softmax temperature of a student that samples or dithers."""
    return option(None,
        "discrete students that sample or dither: the softmax temperature T (probabilities raised to 1/T; above 1 "
        "the less likely actions come more often); train.py writes it into the checkpoint, evaluate.py drives with "
        "it (default: the checkpoint's; 1 for a new student, or where --discrete-actions changes the rule)",
        group="what drives", metavar="T")


def check_action_options(discrete_actions: str | None, action_temperature: float | None) -> None:
    """--action-temperature against the rule it reshapes: --discrete-actions, else sample (the checkpoint's own rule
    is checked when the policy is made). A ValueError in one line names the flag."""
    if action_temperature is None:
        return
    try:
        check_temperature(action_temperature, discrete_actions or "sample")
    except ValueError as e:
        raise ValueError(f"--action-temperature: {e}") from None
