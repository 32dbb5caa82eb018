"""The options of a replay that commands take, each declared once: ``--replay-span`` (evaluate.py --replay,
collect.py --env replay:FOLDER), ``--replay-max-offset`` and ``--replay-reference`` (evaluate.py --replay). A
command's argument dataclass declares the field with the function of the same name,

    replay_span: str | None = replay_span_option()

so its flag, default, choices and help are the same in every command (``tests/test_cli_options.py`` holds every
command to it). ``--replay-reference``'s fixed choices are checked by the parser and, for arguments built in code,
by ``common.cli.check_choices``; ``check_replay_options`` is the one check of the other two, and ``parse_span``
reads a span wherever one is used (the replay's parts, evaluate.py --data-span). Light to import: a command names
these before it imports the replay."""
from __future__ import annotations

from typing import Any

from common.cli import option
from envs.replay.vehicle import DEFAULT_MAX_OFFSET_M

REFERENCES = ("driver", "driver-or-middle")  # where a replay lets the car be (ReplayEnv's reference)


def replay_span_option() -> Any:
    """``--replay-span``: the part of every recorded session that is replayed."""
    return option(None,
        "with a replay (evaluate.py --replay, collect.py --env replay:FOLDER): A:B, the part of every recorded session "
        "that is driven, as fractions (0.8:1 = its last 20 %, what train.py --split blocks holds out; 0:0.8 = the "
        "part it trains on) (default: 0:1)", group="where it drives", metavar="A:B")


def replay_max_offset_option() -> Any:
    """``--replay-max-offset``: how far off the car may be before an intervention."""
    return option(DEFAULT_MAX_OFFSET_M,
        "with --replay: metres from the recorded driver's line beyond which the car is put back (an intervention; "
        "NVIDIA's rule is 1 m)", group="where it drives", metavar="M")


def replay_reference_option() -> Any:
    """``--replay-reference``: the line the offset is measured from."""
    return option("driver",
        "with --replay: where the car may be: driver (within --replay-max-offset of the recorded driver's line) or "
        "driver-or-middle (within it of that line or of the road's or lane's middle, measured on the recorded frames "
        "by envs/replay/road.py: a student keeping the middle behind a driver who kept to one side is not counted "
        "off; docs/udacity.md)", group="where it drives", metavar="driver|driver-or-middle", choices=REFERENCES)


def check_replay_options(span: str | None, max_offset: float = DEFAULT_MAX_OFFSET_M) -> None:
    """--replay-span parses as A:B within [0, 1] and --replay-max-offset is a distance > 0; a ValueError in one line
    names the flag."""
    parse_span(span, "--replay-span")
    if isinstance(max_offset, bool) or not max_offset > 0:  # NaN too
        raise ValueError(f"--replay-max-offset must be a distance > 0 in metres, got {max_offset!r}")


def parse_span(text: str | tuple[float, float] | None, flag: str = "--replay-span") -> tuple[float, float]:
    """'A:B' (fractions 0 <= A < B <= 1 of every session) -> (A, B); None -> the whole session. ``flag`` names the
    option in the error."""
    if text is None:
        return (0.0, 1.0)
    if isinstance(text, tuple):
        a, b = text
    else:
        try:
            a, b = (float(x) for x in str(text).split(":"))
        except ValueError:
            raise ValueError(f"{flag} takes A:B, fractions of every session (e.g. 0.8:1 for the last 20 %), "
                             f"got {text!r}") from None
    if not 0.0 <= a < b <= 1.0:
        raise ValueError(f"{flag} A:B needs 0 <= A < B <= 1, got {text!r}")
    return (float(a), float(b))
