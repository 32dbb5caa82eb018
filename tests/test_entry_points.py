"""Every command (the three root scripts, every ``python -m`` module with a main, every benchmark), as a user starts
it: each goes in and out through common.cli.run_command (no parser or exit handling of its own), --help shows
grouped sections (a tool with commands lists them one per line, and each command has its own --help), an unknown
flag is one line on stderr and exit status 2 (no usage dump, no traceback), and every command calls one thing by
one name."""
from __future__ import annotations

import argparse
import ast
import importlib
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from common.cli import GROUP_ORDER, build_parser

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("agent", "envs", "policies", "common", "benchmarks")
ROOT_SCRIPTS = ("collect", "train", "evaluate")


def _sources() -> list[Path]:
    """Every Python file of the project (not the tests)."""
    return [p for d in PACKAGES for p in sorted((REPO / d).rglob("*.py"))] + [REPO / f"{s}.py" for s in ROOT_SCRIPTS]


def _module(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts)


def _is_entry_point(tree: ast.Module) -> bool:
    return any(isinstance(n, ast.If) and "__main__" in ast.unparse(n.test) for n in tree.body)


ENTRY_POINTS = {_module(p): ast.parse(p.read_text()) for p in _sources() if _is_entry_point(ast.parse(p.read_text()))}
MODULES = sorted(m for m in ENTRY_POINTS if m not in ROOT_SCRIPTS)
CLIS = [*ROOT_SCRIPTS, *MODULES]


def _main_of(tree: ast.Module) -> ast.FunctionDef:
    [main] = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"]
    return main


def _run_command_call(tree: ast.Module) -> ast.Call:
    """The call of common.cli.run_command in the module's main (AssertionError without one)."""
    calls = [c for c in ast.walk(_main_of(tree)) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)
             and c.func.id == "run_command"]
    assert len(calls) == 1, "main() must end through common.cli.run_command, once"
    return calls[0]


def test_every_entry_point_goes_in_and_out_through_run_command():
    assert len(ENTRY_POINTS) >= 28 and set(ROOT_SCRIPTS) <= set(ENTRY_POINTS)
    for module, tree in ENTRY_POINTS.items():
        imports = [n for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "common.cli"]
        assert any(a.name == "run_command" for n in imports for a in n.names), f"{module}: no common.cli.run_command"
        _run_command_call(tree)
        handlers = [h for t in ast.walk(_main_of(tree)) if isinstance(t, ast.Try) for h in t.handlers]
        assert not handlers, f"{module}: main() handles exceptions itself; run_command does (mistakes=, interrupted=)"


def test_no_parser_and_no_stop_handling_outside_common():
    """argparse only in common/cli.py; Ctrl-C turned into an exit code only there (a stage that keeps something on
    Ctrl-C catches KeyboardInterrupt inside its work, never in a main)."""
    for path in _sources():
        text = path.read_text()
        where = path.relative_to(REPO)
        if where != Path("common/cli.py"):
            assert "argparse" not in text, f"{where}: parsers are built by common.cli"
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef) and node.name == "main" and where.parts[0] != "common":
                caught = [ast.unparse(h.type) for t in ast.walk(node) if isinstance(t, ast.Try) for h in t.handlers
                          if h.type is not None]
                assert not any("KeyboardInterrupt" in c or "SystemExit" in c for c in caught), f"{where}: {caught}"


def _run(module: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *argv], cwd=REPO, capture_output=True, text=True,
                          timeout=120)


def _main(module: str, capsys, *argv: str) -> tuple[int, str, str]:
    """``python -m module *argv`` in this process (its __main__ line is pinned below): exit code, stdout, stderr."""
    capsys.readouterr()
    try:
        code = importlib.import_module(module).main(list(argv))
    except SystemExit as e:  # --help and a wrong flag end in argparse's exit
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def test_every_entry_point_exits_with_what_its_main_returns():
    """``python -m module`` is main() and its exit code, so main(argv) in-process is what a user runs; one real
    interpreter shows it end to end."""
    for module, tree in ENTRY_POINTS.items():
        [block] = [n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)]
        assert [ast.unparse(n) for n in block.body] in (["raise SystemExit(main())"], ["sys.exit(main())"]), module
    wrong = _run("agent.training.interpolate", "--definitely-not-a-flag")
    lines = wrong.stderr.splitlines()
    assert wrong.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), wrong.stderr


@pytest.mark.parametrize("module", MODULES)
def test_help_is_grouped_and_a_wrong_flag_is_one_line(module, capsys):
    code, shown, err = _main(module, capsys, "--help")
    assert code == 0, err
    assert any(f"\n{group}:\n" in shown for group in GROUP_ORDER), shown
    code, _, err = _main(module, capsys, "--definitely-not-a-flag")
    lines = err.splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error:"), err
    commands = getattr(importlib.import_module(module), "COMMANDS", {})
    if commands:  # one line per command under "commands:", never run together
        assert "\ncommands:\n" in shown and ".;" not in shown, shown
        for name in commands:
            assert f"\n  {name} " in shown, name
            code, sub, err = _main(module, capsys, name, "--help")
            assert code == 0 and f"usage: python -m {module} {name}" in sub, err


def _parsers(module: str) -> dict[str, argparse.ArgumentParser]:
    """Every parser a CLI builds: one per command of a tool with commands, else its own (the arguments its main
    hands to run_command)."""
    m = importlib.import_module(module)
    args = getattr(m, ast.unparse(_run_command_call(ENTRY_POINTS[module]).args[0]))
    if isinstance(args, Mapping):
        return {f"{module} {name}": build_parser(cls, name) for name, (cls, _) in args.items()}
    return {module: build_parser(args, module)}


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


def test_the_checkpoints_a_help_names_exist_and_the_recording_default_is_the_one_evaluate_takes():
    """A help text that names a shipped checkpoint names one that exists; evaluate.py's --checkpoint help names the
    student it really takes for a person's recording (policies.checkpoint.RECORDING_STUDENT), not another one."""
    import re

    from policies.checkpoint import RECORDING_STUDENT

    named: dict[str, str] = {}
    for module in CLIS:
        for name, parser in _parsers(module).items():
            for flag, action in _shown(parser):
                for path in re.findall(r"checkpoints/[\w.-]+\.(?:pt|zip)", action.help or ""):
                    named.setdefault(path, f"{name} {flag}")
    assert named and not {p: where for p, where in named.items() if not (REPO / p).is_file()}
    helps = dict(_shown(_parsers("evaluate")["evaluate"]))
    assert f"real simulator recording: {RECORDING_STUDENT}," in helps["--checkpoint"].help
