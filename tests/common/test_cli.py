"""common.cli: a dataclass becomes a grouped parser; mistakes are one line and exit 2; run_command is how every
command starts and ends (exit codes 0 / 2 / 130, one line each)."""
from __future__ import annotations

import errno
import os
import signal
from dataclasses import dataclass
from pathlib import Path

import pytest

from common.cli import build_parser, check_choices, integer, option, parse, parse_command, port, positive, run_command
from common.stops import Interrupted


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


def test_choices_of_arguments_built_in_code_are_checked_as_the_parser_checks_them():
    check_choices(Args())
    with pytest.raises(ValueError, match=r"^--mode must be one of a, b, got 'c'$"):
        check_choices(Args(mode="c"))
    check_choices(Args(mode="c"), skip=("mode",))  # a field that takes more in code is checked by its command


@dataclass
class Served:
    port: int = option(4567, "port", group="runtime", parse=port)
    speed: float = option(25.0, "speed", group="runtime", parse=positive)
    threads: int = option(1, "threads", group="runtime", parse=integer(1))


def test_the_number_converters():
    assert parse(Served, ["--port", "0", "--speed", "0.5", "--threads", "3"], prog="tool") == Served(0, 0.5, 3)
    assert integer()("-4") == -4 and integer(high=3)("3") == 3


@pytest.mark.parametrize("argv, says", [
    (["--port", "70000"], "--port: must be an integer in [0, 65535], got 70000"),
    (["--port", "http"], "--port: must be an integer in [0, 65535], got 'http'"),
    (["--speed", "0"], "--speed: must be a finite number > 0, got 0"),
    (["--speed", "nan"], "--speed: must be a finite number > 0, got nan"),
    (["--speed", "fast"], "--speed: must be a finite number > 0, got 'fast'"),
    (["--threads", "0"], "--threads: must be an integer >= 1, got 0"),
])
def test_a_converter_s_refusal_is_one_line_naming_the_flag(argv, says, capsys):
    with pytest.raises(SystemExit) as e:
        parse(Served, argv, prog="tool")
    err = capsys.readouterr().err
    assert e.value.code == 2 and says in err and err.count("\n") == 1, err


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
    assert ("commands:\n  run   Run it: the first line of its text,\n        continued here.\n"
            "  need  Needs --out.") in shown
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


@dataclass
class OneOrMore:
    data: str | list[str] = option("d", "one folder or several", group="data")


def test_one_value_of_a_one_or_more_field_is_that_value():
    assert parse(OneOrMore, ["--data", "a"], prog="tool").data == "a"
    assert parse(OneOrMore, ["--data", "a", "b"], prog="tool").data == ["a", "b"]
    assert parse(OneOrMore, [], prog="tool").data == "d"


# ----------------------------------------------------------------------------- run_command: how a command ends
def _raise(e: BaseException):
    def work(_args):
        raise e
    return work


def _disk_full(note: str | None = None) -> OSError:
    e = OSError(errno.ENOSPC, "No space left on device", "/runs/x/last.pt")
    if note:
        e.add_note(note)
    return e


def test_run_command_parses_runs_and_returns_the_work_s_code():
    seen = []
    assert run_command(Args, lambda a: seen.append(a.steps), ["--steps", "4"], prog="tool") == 0
    assert seen == [4]
    assert run_command(Args, lambda a: 130, [], prog="tool") == 130
    assert run_command(Args, lambda a: {"a": "summary"}, [], prog="tool") == 0  # what the work returns is not a code
    commands = {"run": (Args, "run it"), "need": (Needs, "needs --out")}
    assert run_command(commands, lambda a: 3 if isinstance(a, Needs) else 0, ["need", "--out", "o"], prog="tool") == 3


def test_a_user_mistake_is_one_line_and_exit_2(capsys):
    assert run_command(Args, _raise(ValueError("--steps must be positive")), [], prog="tool") == 2
    assert capsys.readouterr().err == "error: --steps must be positive\n"
    assert run_command(Args, _raise(FileNotFoundError("no such checkpoint: x.pt")), [], prog="tool") == 2
    assert capsys.readouterr().err == "error: no such checkpoint: x.pt\n"
    assert run_command(Args, _raise(ImportError("pip install minari")), [], prog="tool",
                       mistakes=(ValueError, ImportError)) == 2
    assert capsys.readouterr().err == "error: pip install minari\n"
    with pytest.raises(SystemExit) as e:  # a bad flag ends while parsing, as argparse does
        run_command(Args, lambda a: None, ["--steps", "x"], prog="tool")
    assert e.value.code == 2


def test_other_errors_keep_their_traceback():
    with pytest.raises(PermissionError):
        run_command(Args, _raise(PermissionError(errno.EACCES, "denied")), [], prog="tool")
    with pytest.raises(RuntimeError):
        run_command(Args, _raise(RuntimeError("a bug")), [], prog="tool")
    with pytest.raises(IsADirectoryError):  # an OSError is the user's only where the command says so
        run_command(Args, _raise(IsADirectoryError(errno.EISDIR, "a folder")), [], prog="tool")


def test_a_full_disk_is_one_line_with_what_the_stage_kept(capsys):
    assert run_command(Args, _raise(_disk_full("epoch 2 is not saved")), [], prog="tool") == 2
    assert capsys.readouterr().err == ("error: no space left on the disk while writing '/runs/x/last.pt'; free some "
                                       "space and run the command again (epoch 2 is not saved)\n")
    quota = OSError(errno.EDQUOT, "Disk quota exceeded")
    assert run_command(Args, _raise(quota), [], prog="tool", mistakes=(ValueError, OSError)) == 2
    assert capsys.readouterr().err.startswith("error: no space left on the disk; free some space")


def test_a_stop_is_exit_130_with_what_was_kept(capsys):
    assert run_command(Args, _raise(Interrupted("interrupted: wrote 2 finished episode(s)")), [], prog="tool") == 130
    assert capsys.readouterr().err == "\ninterrupted: wrote 2 finished episode(s)\n"
    assert run_command(Args, _raise(KeyboardInterrupt()), [], prog="tool") == 130
    assert capsys.readouterr().err == "\ninterrupted\n"
    assert run_command(Args, _raise(KeyboardInterrupt()), [], prog="tool", stop_signals=False,
                       interrupted="interrupted (the imports so far are kept)") == 130
    assert capsys.readouterr().err == "\ninterrupted (the imports so far are kept)\n"


def test_sigterm_stops_like_ctrl_c(capsys):
    def killed(_args):
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("SIGTERM did not stop the command")

    before = signal.getsignal(signal.SIGTERM)
    assert run_command(Args, killed, [], prog="tool") == 130
    assert capsys.readouterr().err == "\ninterrupted\n"
    assert signal.getsignal(signal.SIGTERM) is before  # the command's handler is gone afterwards
