"""An option that several commands take is declared once: each command's argument dataclass declares its field with
the one function that makes it (never an ``option(...)`` of its own), so the flag, default, choices and help are the
same in every command; a bad choice is one line on the command line and in arguments built in code."""
from __future__ import annotations

import ast
import dataclasses
import importlib

import pytest

from tests.test_architecture import project_modules

# the field -> (the module and function that declare it, the argument dataclasses of the commands that take it)
SHARED = {
    "precision": ("policies.options", "precision_option", {"TrainArgs", "EvalArgs", "Lineage"}),
    "discrete_actions": ("policies.options", "discrete_actions_option", {"TrainArgs", "EvalArgs"}),
    "action_temperature": ("policies.options", "action_temperature_option", {"TrainArgs", "EvalArgs"}),
    "replay_span": ("envs.replay.options", "replay_span_option", {"EvalArgs", "CollectConfig"}),
    "replay_max_offset": ("envs.replay.options", "replay_max_offset_option", {"EvalArgs"}),
    "replay_reference": ("envs.replay.options", "replay_reference_option", {"EvalArgs"}),
}
COMMANDS = {"TrainArgs": "agent.training.config", "EvalArgs": "agent.evaluation.args",
            "Lineage": "agent.training.dagger", "CollectConfig": "agent.data.config"}


def _called(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call):
        return getattr(node.func, "id", getattr(node.func, "attr", None))
    return None


def declarations(sources: dict[str, str], shared: dict = SHARED) -> tuple[dict[str, set[str]], list[str]]:
    """(field -> the classes that declare it with its function; what else declares one of them: ``module.Class.field``
    given an ``option(...)`` of its own, an ``option(flag=...)`` of a shared flag, the function defined elsewhere or
    twice)."""
    flags = {"--" + name.replace("_", "-") for name in shared}
    users: dict[str, set[str]] = {name: set() for name in shared}
    wrong, homes = [], {name: [] for name in shared}
    for module, text in sources.items():
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and any(node.name == f for _, f, _ in shared.values()):
                homes[next(n for n, (_, f, _) in shared.items() if f == node.name)].append(module)
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
                            and item.target.id in shared and item.value is not None):
                        continue
                    name = item.target.id
                    if _called(item.value) == shared[name][1]:
                        users[name].add(node.name)
                    elif _called(item.value) in ("option", "field"):
                        wrong.append(f"{module}.{node.name}.{name}: its own option(...), not {shared[name][1]}()")
            if _called(node) == "option" and any(isinstance(k.value, ast.Constant) and k.value.value in flags
                                                 for k in node.keywords if k.arg == "flag"):
                wrong.append(f"{module}:{node.lineno}: an option(...) of a shared flag")
    for name, (home, _, _) in shared.items():
        if homes[name] != [home]:
            wrong.append(f"{name}: declared in {homes[name]}, not once in {home}")
    return users, wrong


def test_each_shared_option_is_declared_once_and_taken_by_the_commands_listed():
    users, wrong = declarations(project_modules())
    assert wrong == []
    assert users == {name: commands for name, (_, _, commands) in SHARED.items()}


def test_the_scan_sees_an_option_declared_again():
    sources = {"policies.options": "def precision_option():\n    return option('auto')\n",
               "a": "class A:\n    precision: str = precision_option()\n",
               "b": "class B:\n    precision: str = option('auto', 'again')\n",
               "c": "class C:\n    fp: str = option('auto', flag='--precision')\n"}
    shared = {"precision": SHARED["precision"]}
    users, wrong = declarations(sources, shared)
    assert users == {"precision": {"A"}}
    assert wrong == ["b.B.precision: its own option(...), not precision_option()",
                     "c:2: an option(...) of a shared flag"]


@pytest.mark.parametrize("name", sorted(SHARED))
def test_every_command_taking_an_option_has_its_flag_default_choices_and_help(name):
    home, function, commands = SHARED[name]
    made = {f.name: f for f in dataclasses.fields(dataclasses.make_dataclass(
        "Made", [(name, object, getattr(importlib.import_module(home), function)())]))}[name]
    for command in sorted(commands):
        [f] = [f for f in dataclasses.fields(getattr(importlib.import_module(COMMANDS[command]), command))
               if f.name == name]
        assert (f.default, f.metadata["cli"]) == (made.default, made.metadata["cli"]), command


@pytest.mark.parametrize("cli, argv, says", [
    ("train", ["--precision", "fp16"], "argument --precision: invalid choice: 'fp16'"),
    ("train", ["--discrete-actions", "greedy"], "argument --discrete-actions: invalid choice: 'greedy'"),
    ("train", ["--device", "gpu"], "argument --device: invalid choice: 'gpu'"),
    ("evaluate", ["--replay-reference", "lane"], "argument --replay-reference: invalid choice: 'lane'"),
    ("evaluate", ["--window-clock", "wall"], "argument --window-clock: invalid choice: 'wall'"),
    ("collect", ["--driver-actions", "greedy"], "argument --driver-actions: invalid choice: 'greedy'"),
    ("agent.training.dagger", ["--precision", "half"], "argument --precision: invalid choice: 'half'"),
])
def test_a_bad_choice_on_the_command_line_is_one_line(cli, argv, says, capsys):
    with pytest.raises(SystemExit) as e:
        importlib.import_module(cli).main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and says in err and err.count("\n") == 1 and err.startswith("error: "), err


def test_a_bad_choice_in_arguments_built_in_code_is_one_line(tmp_path):
    from agent.evaluation.args import EvalArgs, check_args
    from agent.training.config import TrainArgs, resolve
    from agent.training.dagger import Lineage

    with pytest.raises(ValueError, match=r"^--precision must be one of auto, fp32, bf16, got 'half'$"):
        resolve(TrainArgs(data=str(tmp_path), out=str(tmp_path / "run"), precision="half"))
    with pytest.raises(ValueError, match=r"^--window-clock must be one of steps, time, got 'wall'$"):
        check_args(EvalArgs(window_clock="wall"))
    with pytest.raises(ValueError, match=r"^--replay-reference must be one of driver, driver-or-middle, got 'x'$"):
        check_args(EvalArgs(replay=str(tmp_path), replay_reference="x", expert_drives=True))
    with pytest.raises(ValueError, match=r"^--precision must be one of auto, fp32, bf16, got 'half'$"):
        Lineage(precision="half").validate()
    assert not (tmp_path / "run").exists()
