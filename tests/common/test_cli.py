"""common.cli: a dataclass becomes a grouped parser; mistakes are one line and exit 2."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from common.cli import build_parser, option, parse, parse_command


def _even(text: str) -> int:
    value = int(text)
    if value % 2:
        raise ValueError(f"must be even, got {value}")
    return value


@dataclass
class Args:
    """A tool.

    Its epilog, kept as written."""

    data: list[str] = option(default_factory=list, help="folders", group="data", metavar="DIR")
    steps: int = option(10, "steps to run", group="runtime")
    rate: float | None = option(None, "a rate", group="optimisation")
    out: Path | None = option(None, "where", group="output")
    video: bool = option(True, "record videos", group="output")
    mode: str = option("a", "a mode", group="model", choices=("a", "b"))
    expert_drives: bool = option(False, "the expert drives", group="what drives", flag="--expert")
    pairs: int = option(2, "an even count", group="runtime", parse=_even)


def test_fields_become_typed_flags_with_defaults():
    a = parse(Args, [], prog="tool")
    assert a == Args()
    a = parse(Args, ["--data", "x", "y", "--steps", "3", "--rate", "0.5", "--out", "o", "--no-video", "--mode", "b",
                     "--expert", "--pairs", "4"], prog="tool")
    assert (a.data, a.steps, a.rate, a.out, a.video, a.mode, a.expert_drives, a.pairs) == (
        ["x", "y"], 3, 0.5, Path("o"), False, "b", True, 4)


def test_help_is_grouped_in_the_fixed_order_and_shows_defaults_once():
    text = build_parser(Args, "tool", Args.__doc__).format_help()
    order = [text.index(f"\n{g}:") for g in ("data", "what drives", "model", "optimisation", "output", "runtime")]
    assert order == sorted(order)
    assert "steps to run (default: 10)" in text and "record videos (default: on)" in text
    assert "Its epilog, kept as written." in text


@pytest.mark.parametrize("argv, says", [(["--steps", "x"], "invalid int value"), (["--mode", "c"], "invalid choice"),
                                        (["--pairs", "3"], "must be even, got 3"), (["--nope"], "unrecognized")])
def test_mistakes_are_one_line_and_exit_2(argv, says, capsys):
    with pytest.raises(SystemExit) as e:
        parse(Args, argv, prog="tool")
    err = capsys.readouterr().err
    assert e.value.code == 2 and says in err and err.count("\n") == 1 and "(see tool --help)" in err


@dataclass
class Needs:
    out: str | None = option(None, "where", group="output", required=True)
    pair: list[str] = option([], "pairs", group="output")


def test_required_flags_and_repeatable_lists(capsys):
    with pytest.raises(SystemExit) as e:
        parse(Needs, [], prog="tool")
    assert e.value.code == 2 and "required: --out" in capsys.readouterr().err
    assert parse(Needs, ["--out", "o", "--pair", "a:b", "--pair", "c:d", "e:f"], prog="tool").pair == ["a:b", "c:d",
                                                                                                      "e:f"]
    assert parse(Needs, ["--out", "o"], prog="tool").pair == []


def test_a_command_word_picks_its_dataclass(capsys):
    commands = {"run": (Args, "run it"), "need": (Needs, "needs --out")}
    assert parse_command(commands, ["run", "--steps", "4"], prog="tool").steps == 4
    assert parse_command(commands, ["need", "--out", "x"], prog="tool").out == "x"
    with pytest.raises(SystemExit) as e:
        parse_command(commands, ["walk"], prog="tool")
    assert e.value.code == 2 and "invalid choice: 'walk'" in capsys.readouterr().err


def test_the_command_list_shows_each_command_on_its_own_lines(capsys):
    commands = {"run": (Args, "Run it: the first line of its text,\ncontinued here."), "need": (Needs, "Needs --out.")}
    with pytest.raises(SystemExit) as e:
        parse_command(commands, ["--help"], prog="tool", doc=Args.__doc__)
    shown = capsys.readouterr().out
    assert e.value.code == 0
    assert "commands:\n  run   Run it: the first line of its text,\n        continued here.\n  need  Needs --out." in shown
    assert ".;" not in shown and "tool COMMAND --help" in shown


@dataclass
class Renamed:
    max_steps: int | None = option(None, "steps per episode", group="runtime", former=("--max-episode-steps",))
    fast: bool = option(False, "go fast", group="runtime", former=("--quick",))


def test_a_former_spelling_still_parses_and_is_never_shown():
    assert parse(Renamed, ["--max-episode-steps", "7", "--quick"], prog="tool") == Renamed(7, True)
    assert parse(Renamed, ["--max-steps", "8"], prog="tool") == Renamed(8, False)
    assert parse(Renamed, [], prog="tool") == Renamed()
    text = build_parser(Renamed, "tool").format_help()
    assert "--max-steps" in text and "--max-episode-steps" not in text and "--quick" not in text
