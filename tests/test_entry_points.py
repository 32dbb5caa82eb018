"""Every ``python -m`` tool built on common.cli, as a user starts it: --help shows grouped sections (a tool with
commands lists them one per line, and each command has its own --help), an unknown flag is one line on stderr and
exit status 2 (no usage dump, no traceback), and every command calls one thing by one name."""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from common.cli import GROUP_ORDER, build_parser

REPO = Path(__file__).resolve().parents[1]
MODULES = [
    "agent.data.merge", "agent.data.minari_export", "agent.evaluation.table", "agent.experts.ppo",
    "agent.training.dagger", "agent.udacity.bridge", "agent.udacity.recordings", "envs.replay.calibrate",
    "benchmarks.carracing_render", "benchmarks.cuda_cores", "benchmarks.data_loading", "benchmarks.feedback_gains",
    "benchmarks.nac_runtime", "benchmarks.precision", "benchmarks.replay_agreement", "benchmarks.replay_speed",
    "benchmarks.replay_views", "benchmarks.throughput", "benchmarks.udacity_sim", "benchmarks.label_drift",
    "agent.training.interpolate",
]
CLIS = ["collect", "train", "evaluate", *MODULES]


def _run(module: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *argv], cwd=REPO, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("module", MODULES)
def test_help_is_grouped_and_a_wrong_flag_is_one_line(module):
    shown = _run(module, "--help")
    assert shown.returncode == 0, shown.stderr
    assert any(f"\n{group}:\n" in shown.stdout for group in GROUP_ORDER), shown.stdout
    wrong = _run(module, "--definitely-not-a-flag")
    lines = wrong.stderr.splitlines()
    assert wrong.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), wrong.stderr
    commands = getattr(importlib.import_module(module), "COMMANDS", {})
    if commands:  # one line per command under "commands:", never run together
        assert "\ncommands:\n" in shown.stdout and ".;" not in shown.stdout, shown.stdout
        for name in commands:
            assert f"\n  {name} " in shown.stdout, name
            sub = _run(module, name, "--help")
            assert sub.returncode == 0 and f"usage: python -m {module} {name}" in sub.stdout, sub.stderr


def _parsers(module: str) -> dict[str, argparse.ArgumentParser]:
    """Every parser a CLI builds: one per command of a tool with commands, else its own."""
    m = importlib.import_module(module)
    if hasattr(m, "COMMANDS"):
        return {f"{module} {name}": build_parser(cls, name) for name, (cls, _) in m.COMMANDS.items()}
    if callable(getattr(m, "build_parser", None)):
        return {module: m.build_parser()}
    args = [c for c in vars(m).values() if isinstance(c, type) and dataclasses.is_dataclass(c)
            and c.__module__ == module and any("cli" in f.metadata for f in dataclasses.fields(c))]
    return {f"{module}:{c.__name__}": build_parser(c, module) for c in args}


def _shown(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.Action]]:
    return [((a.option_strings or [a.dest])[0], a) for a in parser._actions
            if a.help != argparse.SUPPRESS and not isinstance(a, argparse._HelpAction)]


# spellings that name something another command calls otherwise: episode steps are --max-steps, a recording driven
# in closed loop is --replay, an output folder is --out
OTHER_NAMES = {"--max-episode-steps": "--max-steps", "--episode-steps": "--max-steps", "--recording": "--replay",
               "--work": "--out", "--out-dir": "--out", "--output": "--out", "--outdir": "--out"}


def test_every_command_calls_one_thing_by_one_name():
    flags = {name: _shown(p) for module in CLIS for name, p in _parsers(module).items()}
    assert len(flags) >= len(CLIS) and all(flags.values())
    for name, shown in flags.items():
        for flag, action in shown:
            assert flag not in OTHER_NAMES, f"{name}: {flag} is {OTHER_NAMES.get(flag)} elsewhere"
            text = (action.help or "").lower()
            if "steps per episode" in text or "steps of a validation" in text:
                assert flag == "--max-steps", f"{name}: {flag} caps an episode's steps: --max-steps"
            if flag == "--seed":  # a track seed or a training one: the help says which
                assert "track seed" in text or "weights" in text, f"{name}: --seed says not which seed: {text!r}"
            if not action.option_strings:
                assert "out" not in action.dest and "OUT" not in str(action.metavar or ""), \
                    f"{name}: the output folder {action.dest} is positional; output folders are --out"
    assert {flag for shown in flags.values() for flag, _ in shown} >= {"--max-steps", "--replay", "--out", "--seed"}
