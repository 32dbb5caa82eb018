"""policies/options.py: the options of how a policy runs, declared once for every command that takes them, and the
one check of what their choices cannot say."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from common.cli import build_parser, check_choices, parse
from policies.actions import DISCRETE_ACTION_RULES
from policies.options import (action_temperature_option, check_action_options, discrete_actions_option,
                              precision_option)
from policies.precision import PRECISIONS


@dataclass
class Runs:
    precision: str = precision_option()
    discrete_actions: str | None = discrete_actions_option()
    action_temperature: float | None = action_temperature_option()


def test_a_command_declaring_them_parses_their_values_and_choices():
    assert parse(Runs, [], prog="tool") == Runs("auto", None, None)
    assert parse(Runs, ["--precision", "bf16", "--discrete-actions", "sample", "--action-temperature", "1.5"],
                 prog="tool") == Runs("bf16", "sample", 1.5)
    text = build_parser(Runs, "tool").format_help()
    assert "(default: auto)" in text and all(p in text for p in PRECISIONS + DISCRETE_ACTION_RULES)


def test_each_call_is_a_field_of_its_own():
    """Every command gets a fresh field (dataclasses name and type the field they are given)."""
    assert precision_option() is not precision_option()


def test_their_choices_in_arguments_built_in_code():
    with pytest.raises(ValueError, match=r"^--precision must be one of auto, fp32, bf16, got 'half'$"):
        check_choices(Runs(precision="half"))
    with pytest.raises(ValueError, match=r"^--discrete-actions must be one of argmax, sample, dither, got 'greedy'$"):
        check_choices(Runs(discrete_actions="greedy"))


@pytest.mark.parametrize("rule, temperature, says", [
    (None, 0.0, "--action-temperature: the action temperature must be a number > 0, got 0.0"),
    (None, float("nan"), "--action-temperature: the action temperature must be a number > 0"),
    ("argmax", 1.5, "--action-temperature: an action temperature (1.5) changes only the sample and dither rules"),
])
def test_a_temperature_the_rule_cannot_take_is_refused_naming_the_flag(rule, temperature, says):
    with pytest.raises(ValueError) as e:
        check_action_options(rule, temperature)
    assert str(e.value).startswith(says) and "\n" not in str(e.value)


def test_a_temperature_the_rule_takes_passes():
    for rule, temperature in ((None, None), ("argmax", None), ("argmax", 1.0), ("sample", 1.5), (None, 0.5)):
        check_action_options(rule, temperature)
