"""Command lines built from dataclasses: every CLI and ``python -m`` entry point describes its arguments once, as
the fields of a dataclass (help text, group and flag in the field's metadata), and this module turns that into an
argparse parser whose mistakes are one line and exit 2.

    @dataclass
    class Args:
        out: str = option("runs/x", "output folder", group="output")
        steps: int = option(100, "steps to run", group="runtime")

    def main(argv=None) -> int:
        return run_command(Args, work, argv, prog="python -m pkg.tool", doc=__doc__)

``run_command`` is every entry point's one way in and out: it parses (one dataclass, or ``prog COMMAND ...`` with
a dataclass per command), runs the work, and ends it with the exit code a user expects: 0 done; 2 with one line
for a user's mistake or a full disk; 130 with one line after Ctrl-C or SIGTERM.

Types come from the annotations: bool is a switch (--x / --no-x), int / float / str / Path (or ``X | None``) take
one value, ``list[...]`` takes one or more; ``parse=`` names a converter for anything else (``integer``, ``positive``
and ``port`` are here). A field's ``choices`` are checked by the parser for a command line and by ``check_choices`` for
a dataclass built in code; either refusal is one line."""
from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable, NoReturn, Sequence, TypeVar

from common.files import disk_full
from common.stops import Interrupted, sigterm_as_interrupt

T = TypeVar("T")

# argument groups of --help, in this order; a group not listed here comes after them, in order of appearance
GROUP_ORDER = ("input", "data", "what drives", "where it drives", "model", "optimisation", "augmentation",
               "evaluation conditions", "output", "runtime")
_NO_DEFAULT = object()


def option(default: Any = _NO_DEFAULT, help: str = "", *, group: str = "options", flag: str | None = None,
           metavar: str | None = None, choices: Sequence[str] | None = None, parse: Callable[[str], Any] | None = None,
           positional: bool = False, default_factory: Callable[[], Any] | None = None,
           show_default: bool = True, help_from: Callable[[], str] | None = None, required: bool = False,
           former: Sequence[str] = ()) -> Any:
    """A dataclass field that is also a command-line argument.

    help: the one text shown by --help (its default is appended unless the text already speaks of it or
    ``show_default`` is off); group: the --help section; flag: the option's name where it is not the field's
    (``--x-y`` for x_y); positional: an argument without a flag; parse: a converter from the text (its ValueError
    becomes a one-line error); help_from: the help text made when the parser is built, for text that needs
    imports the dataclass's module should not pay for; required: a flag that must be given (its field keeps a
    default, None, for code that builds the dataclass itself); former: earlier spellings of the flag, still
    accepted (commands written down with them keep working) and never shown in --help. A list flag may be repeated
    (--x a --x b = --x a b)."""
    meta = {"cli": {"help": help_from or help, "group": group, "flag": flag, "metavar": metavar, "choices": choices,
                    "parse": parse, "positional": positional, "show_default": show_default, "required": required,
                    "former": tuple(former)}}
    if isinstance(default, list):  # a fresh list per instance, as dataclasses require
        default_factory = default.copy
    if default_factory is not None:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    if default is _NO_DEFAULT:
        return dataclasses.field(metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def check_choices(args: Any, skip: Sequence[str] = ()) -> None:
    """The fixed choices of a dataclass built in code, checked as the parser checks a command line's: every field
    declared with ``choices``, but those named in ``skip`` (a field that takes more in code than on the command
    line), holds one of them or None; a ValueError names the flag, the choices and the value, in one line."""
    for f in dataclasses.fields(args):
        choices = f.metadata.get("cli", {}).get("choices")
        if choices is None or f.name in skip:
            continue
        value = getattr(args, f.name)
        for v in value if isinstance(value, list) else [value]:
            if v is not None and v not in choices:
                raise ValueError(f"{flag_of(f)} must be one of {', '.join(map(str, choices))}, got {v!r}")


def integer(low: int | None = None, high: int | None = None) -> Callable[[str], int]:
    """A converter for ``option(parse=...)``: the text as an integer in [low, high] (an end not given is open)."""
    rule = (f" in [{low}, {high}]" if low is not None and high is not None
            else f" >= {low}" if low is not None else f" <= {high}" if high is not None else "")

    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"must be an integer{rule}, got {text!r}") from None
        if (low is not None and value < low) or (high is not None and value > high):
            raise ValueError(f"must be an integer{rule}, got {value}")
        return value
    return convert


def positive(text: str) -> float:
    """A converter for ``option(parse=...)``: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"must be a finite number > 0, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"must be a finite number > 0, got {text}")
    return value


port = integer(0, 65535)  # a TCP port; 0: the system picks a free one


class CliParser(argparse.ArgumentParser):
    """argparse whose mistakes are one line on stderr and exit status 2, with a pointer to --help."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def flag_of(f: dataclasses.Field) -> str:
    """The command-line flag of a field: its metadata's, else --name-with-dashes."""
    return f.metadata.get("cli", {}).get("flag") or "--" + f.name.replace("_", "-")


def build_parser(cls: type, prog: str, doc: str | None = None) -> CliParser:
    """A parser with one argument per field of the dataclass ``cls``, grouped as the fields' metadata says.

    ``doc``: the description (its first paragraph) and the epilog (the rest, shown as written)."""
    head, _, tail = (doc or "").strip().partition("\n\n")
    cli_fields = [f for f in dataclasses.fields(cls) if "cli" in f.metadata]
    short = len(cli_fields) > 12 and not any(f.metadata["cli"]["positional"] for f in cli_fields)
    parser = CliParser(prog=prog, description=head or None, epilog=tail or None,
                       usage="%(prog)s [options]" if short else None,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    hints = typing.get_type_hints(cls)
    order = list(GROUP_ORDER) + [g for g in dict.fromkeys(f.metadata["cli"]["group"] for f in cli_fields)
                                 if g not in GROUP_ORDER]
    groups = {name: parser.add_argument_group(name) for name in order
              if any(f.metadata["cli"]["group"] == name for f in cli_fields)}
    for f in cli_fields:
        _add(groups[f.metadata["cli"]["group"]], f, hints[f.name])
    return parser


def parse(cls: type[T], argv: Sequence[str] | None, prog: str, doc: str | None = None) -> T:
    """The dataclass ``cls`` filled from ``argv`` (default: sys.argv[1:]); a mistake exits 2 in one line.

    A field that takes one value or several (``str | list[str]``) given one value holds that value, not a list."""
    parser = build_parser(cls, prog, doc)
    argv = sys.argv[1:] if argv is None else list(argv)
    values = vars(parser.parse_args(argv))
    hints = typing.get_type_hints(cls)
    for name, value in values.items():
        if isinstance(value, list) and len(value) == 1 and _one_or_several(hints[name]):
            values[name] = value[0]
    parsed = cls(**values)  # a list flag not given is absent: the field's own default
    object.__setattr__(parsed, _GIVEN, frozenset(_given(parser, argv)))
    return parsed


_GIVEN = "_cli_given"  # the attribute where ``parse`` notes the fields the command line gave


def given_fields(parsed: Any) -> frozenset[str] | None:
    """The fields of a dataclass made by ``parse`` that its command line gave (a flag given at its default
    value too); None for one built otherwise (in code), where only a value away from the default tells."""
    return getattr(parsed, _GIVEN, None)


def _given(parser: argparse.ArgumentParser, argv: Sequence[str]) -> set[str]:
    """The destinations ``argv`` sets: the same parse with every default suppressed."""
    saved = [(a, a.default) for a in parser._actions]
    try:
        for a, _ in saved:
            a.default = argparse.SUPPRESS
        return set(vars(parser.parse_args(argv)))
    finally:
        for a, default in saved:
            a.default = default


Commands = Mapping[str, tuple[type, str]]


def run_command(args: type | Commands, work: Callable[[Any], Any], argv: Sequence[str] | None = None, *,
                prog: str, doc: str | None = None,
                mistakes: tuple[type[BaseException], ...] = (ValueError, FileNotFoundError),
                interrupted: str = "interrupted", stop_signals: bool = True) -> int:
    """Parse ``argv`` into ``args`` (a dataclass, or ``{command: (dataclass, text)}`` for ``prog COMMAND ...``),
    run ``work`` on it, and return the exit code: ``work``'s when it returns an int (anything else: 0); 2 with
    ``error: ...`` in one line for one of ``mistakes`` (the user's: a bad value, a missing file) and for a full disk
    (what the stage kept is in the error's notes); 130 after Ctrl-C or SIGTERM, with the stage's ``Interrupted``
    text (what it kept) or ``interrupted``. Any other error is a bug and keeps its traceback. A bad flag exits 2
    while parsing.

    stop_signals: SIGTERM stops like Ctrl-C around the whole command; off for a stage that installs its own."""
    try:
        if stop_signals:
            with sigterm_as_interrupt():  # `kill PID` stops like Ctrl-C
                return _run(args, work, argv, prog, doc)
        return _run(args, work, argv, prog, doc)
    except Interrupted as e:
        print(f"\n{e}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:  # before the stage could say what it kept (e.g. while loading)
        print(f"\n{interrupted}", file=sys.stderr)
        return 130
    except OSError as e:
        if disk_full(e):
            print(disk_full_line(e), file=sys.stderr)
            return 2
        if not isinstance(e, mistakes):
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2
    except mistakes as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _run(args: type | Commands, work: Callable[[Any], Any], argv: Sequence[str] | None, prog: str,
         doc: str | None) -> int:
    parsed = parse_command(args, argv, prog, doc) if isinstance(args, Mapping) else parse(args, argv, prog, doc)
    code = work(parsed)
    return code if isinstance(code, int) and not isinstance(code, bool) else 0


def disk_full_line(e: OSError) -> str:
    """The one line a command ends with when the disk is full: where, what to do, and what the stage added to the
    error (``add_note``: what was kept, how to go on)."""
    where = f" while writing {e.filename!r}" if e.filename else ""
    notes = " ".join(getattr(e, "__notes__", ()))
    return (f"error: no space left on the disk{where}; free some space and run the command again"
            + (f" ({notes})" if notes else ""))


def parse_command(commands: Commands, argv: Sequence[str] | None, prog: str,
                  doc: str | None = None) -> Any:
    """``prog COMMAND ...``: ``commands`` maps each command word to (its arguments' dataclass, a text saying what
    it does); the first word picks the dataclass, the rest of ``argv`` fills it (``prog COMMAND --help``). ``prog
    --help`` lists the commands, each with its text, under the description."""
    argv = list(sys.argv[1:] if argv is None else argv)
    pick = dataclasses.make_dataclass("Command", [("command", str, option(
        help=f"one of {', '.join(commands)}; `{prog} COMMAND --help` shows its options", group="input",
        positional=True, choices=tuple(commands), metavar="COMMAND"))])
    parser = build_parser(pick, prog, doc)
    width = max(len(name) for name in commands) + 4
    listed = "\n".join(f"  {name:<{width - 2}}" + text.strip().replace("\n", "\n" + " " * width)
                       for name, (_, text) in commands.items())
    parser.description = f"{parser.description or ''}\n\ncommands:\n{listed}".strip("\n")
    name = parser.parse_args(argv[:1]).command
    return parse(commands[name][0], argv[1:], prog=f"{prog} {name}", doc=commands[name][1])


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _with_default(text: str, default: Any) -> str:
    """The help text naming its default once, in words (switches: on / off)."""
    if "default" in text.lower() or default is None or default == [] or default == "":
        return text
    shown = ("on" if default else "off") if isinstance(default, bool) else default
    return f"{text} (default: {shown})"


def _one_or_several(kind: Any) -> bool:
    """Whether an annotation takes one value or a list of them (``str | list[str]``)."""
    if typing.get_origin(kind) not in (typing.Union, types.UnionType):
        return False
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    return any(typing.get_origin(a) is list for a in args) and any(typing.get_origin(a) is not list for a in args)


def _base(kind: Any) -> tuple[Any, bool]:
    """(the type one value converts to, whether the field takes a list) from an annotation."""
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        listed = [a for a in args if typing.get_origin(a) is list]
        if listed:  # e.g. str | list[str]: one or more values
            return (typing.get_args(listed[0]) or (str,))[0], True
        return (args[0] if len(args) == 1 else str), False
    if origin is list:
        return (typing.get_args(kind) or (str,))[0], True
    return kind, False


def _converter(base: Any, parse_text: Callable[[str], Any] | None) -> Callable[[str], Any] | None:
    convert = parse_text or {int: int, float: float, Path: Path}.get(base)
    if convert is None or convert in (int, float, Path):
        return convert

    def checked(text: str) -> Any:  # the converter's own message, not argparse's "invalid value"
        try:
            return convert(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return checked


def _add(group: Any, f: dataclasses.Field, kind: Any) -> None:
    meta = f.metadata["cli"]
    default = _default(f)
    text = meta["help"]() if callable(meta["help"]) else meta["help"]
    text = _with_default(text, default) if meta["show_default"] else text
    text = text.replace("%", "%%")
    base, several = _base(kind)
    if base is bool and not several:
        action = group.add_argument(flag_of(f), dest=f.name, action=argparse.BooleanOptionalAction, default=default)
        action.help = text  # set afterwards: BooleanOptionalAction would append a second "(default: ...)"
        for former in meta["former"]:
            group.add_argument(former, dest=f.name, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                               help=argparse.SUPPRESS)
        return
    kw: dict[str, Any] = {"default": default, "help": text, "metavar": meta["metavar"], "choices": meta["choices"],
                          "type": _converter(base, meta["parse"])}
    if several:
        kw["nargs"] = "*" if meta["positional"] and default == [] else "+"
        if not meta["positional"]:  # repeatable; absent when not given, so the dataclass's default applies
            kw.update(action="extend", default=argparse.SUPPRESS)
    if meta["required"]:
        kw["required"] = True
    if meta["positional"]:
        if default is not None and not several:
            kw["nargs"] = "?"
        group.add_argument(f.name, **{k: v for k, v in kw.items() if v is not None or k == "default"})
        return
    group.add_argument(flag_of(f), dest=f.name, **{k: v for k, v in kw.items() if v is not None or k == "default"})
    for former in meta["former"]:  # accepted, never shown; absent when not given, so it overrides nothing
        group.add_argument(former, dest=f.name, **{**{k: v for k, v in kw.items() if v is not None},
                                                   "default": argparse.SUPPRESS, "help": argparse.SUPPRESS,
                                                   "required": False})

