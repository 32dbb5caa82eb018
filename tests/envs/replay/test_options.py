"""envs/replay/options.py: the --replay-* options declared once for every command that takes them, the span's
parser and the one check of the span and the offset."""
from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from common.cli import check_choices, parse
from envs.replay.options import (REFERENCES, check_replay_options, parse_span, replay_max_offset_option,
                                 replay_reference_option, replay_span_option)
from envs.replay.vehicle import DEFAULT_MAX_OFFSET_M


@dataclass
class Replays:
    replay_span: str | None = replay_span_option()
    replay_max_offset: float = replay_max_offset_option()
    replay_reference: str = replay_reference_option()


def test_a_command_declaring_them_parses_their_values():
    assert parse(Replays, [], prog="tool") == Replays(None, DEFAULT_MAX_OFFSET_M, "driver")
    assert parse(Replays, ["--replay-span", "0.8:1", "--replay-max-offset", "1.5", "--replay-reference",
                           "driver-or-middle"], prog="tool") == Replays("0.8:1", 1.5, "driver-or-middle")


def test_the_reference_is_one_of_the_replay_s(capsys):
    with pytest.raises(SystemExit) as e:
        parse(Replays, ["--replay-reference", "lane"], prog="tool")
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--replay-reference: invalid choice: 'lane'" in err and err.count("\n") == 1
    with pytest.raises(ValueError, match=r"^--replay-reference must be one of driver, driver-or-middle, got 'lane'$"):
        check_choices(Replays(replay_reference="lane"))
    from envs.replay.road import check_reference  # the env's own check of its argument: the same names

    assert [check_reference(r) for r in REFERENCES] == list(REFERENCES)


def test_spans():
    assert parse_span(None) == (0.0, 1.0) and parse_span("0.8:1") == (0.8, 1.0) and parse_span((0, 0.5)) == (0.0, 0.5)
    with pytest.raises(ValueError, match="0 <= A < B <= 1"):
        parse_span("0.5:1.5")
    with pytest.raises(ValueError, match=r"^--data-span takes A:B, fractions of every session"):
        parse_span("last", "--data-span")


@pytest.mark.parametrize("span, offset, says", [
    ("0.9:0.2", 1.0, "--replay-span A:B needs 0 <= A < B <= 1, got '0.9:0.2'"),
    ("last", 1.0, "--replay-span takes A:B"),
    (None, 0.0, "--replay-max-offset must be a distance > 0 in metres, got 0.0"),
    (None, math.nan, "--replay-max-offset must be a distance > 0 in metres, got nan"),
    (None, True, "--replay-max-offset must be a distance > 0 in metres, got True"),
])
def test_the_span_and_the_offset_are_checked_once_naming_the_flag(span, offset, says):
    with pytest.raises(ValueError) as e:
        check_replay_options(span, offset)
    assert str(e.value).startswith(says)


def test_a_good_span_and_offset_pass():
    check_replay_options(None)
    check_replay_options("0:0.8", 0.5)
