"""What a new user meets in the three CLIs, checked in-process and fast (no training, no env episodes):
one-line argument errors, --help that shows every default once, the --core / --expert-drives vocabulary,
checkpoint errors in the user's words, and no progress bars outside a terminal."""
from __future__ import annotations

import argparse
import io
import zipfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import collect
import evaluate
import train
from agent.evaluation.args import EvalArgs, check_args
from agent.evaluation.config import resolve
from agent.runtime import show_progress
from agent.training.config import TrainArgs
from common.cli import build_parser, parse
from policies.checkpoint import read_checkpoint

REPO = Path(__file__).resolve().parents[1]
CLIS = {"train": train, "evaluate": evaluate, "collect": collect}
ARGS = {"train": TrainArgs, "evaluate": EvalArgs, "collect": collect.CollectArgs}


def _parser(cli: str) -> argparse.ArgumentParser:
    """The parser the CLI's main builds."""
    return build_parser(ARGS[cli], CLIS[cli].PROG, CLIS[cli].__doc__)


def _parsed(cli: str, argv: list[str]):
    """The arguments the CLI's main works on."""
    return parse(ARGS[cli], argv, CLIS[cli].PROG, CLIS[cli].__doc__)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


# ----------------------------------------------------------------------------- bad arguments: one line, exit 2
@pytest.mark.parametrize("cli, argv, flag", [
    ("train", ["--epochs", "abc"], "--epochs"),
    ("train", ["--lr", "fast"], "--lr"),
    ("train", ["--split-seed", "1.5"], "--split-seed"),
    ("train", ["--no-such-flag"], "--no-such-flag"),
    ("evaluate", ["--env", "mars"], "--env"),
    ("evaluate", ["--episodes", "x"], "--episodes"),
    ("evaluate", ["--action-space", "hybrid"], "--action-space"),
    ("evaluate", ["--saliency-method", "magic"], "--saliency-method"),
    ("evaluate", ["--policy", "expert"], "--policy"),
    ("collect", ["--episodes", "x"], "--episodes"),
    ("collect", ["--noise", "loud"], "--noise"),
    ("collect", ["--beta", "half"], "--beta"),
])
def test_argument_errors_are_one_line_with_a_hint(cli, argv, flag, capsys):
    with pytest.raises(SystemExit) as exit_:
        CLIS[cli].main(argv)
    assert exit_.value.code == 2
    captured = capsys.readouterr()
    line = _one_line(captured.err)
    assert line.startswith("error: ") and flag in line, line
    assert line.endswith(f"(see python {cli}.py --help)"), line
    assert "usage:" not in captured.err + captured.out


# ----------------------------------------------------------------------------- --help
@pytest.mark.parametrize("cli", list(CLIS))
def test_help_shows_every_default_once(cli, capsys):
    parser = _parser(cli)
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
            continue
        text = (action.help or "") % {"default": action.default, "prog": parser.prog}
        name = action.option_strings[0]
        assert text.strip(), f"{name} has no help"
        mentions = text.lower().count("default")
        if action.default is None or action.default == []:
            assert mentions <= 1, f"{name}: {text!r}"
        else:
            assert mentions == 1, f"{name} (default {action.default!r}) must name its default once: {text!r}"
    with pytest.raises(SystemExit) as exit_:
        CLIS[cli].main(["--help"])
    assert exit_.value.code == 0
    shown = capsys.readouterr().out
    for python_word in ("(default: None)", "default: True", "default: False", "(default: [])", "%(default)"):
        assert python_word not in shown, python_word


def test_train_help_names_out_and_core_defaults_in_words():
    helps = {a.option_strings[0]: a.help for a in _parser("train")._actions}
    assert helps["--out"] == "run folder (default: runs/train/<core>, several cores joined by _)"
    assert "(default: nac-focus)" in helps["--core"]
    assert helps["--augment"].endswith("(default: on)") and helps["--resume"].endswith("(default: off)")
    assert helps["--progress"].endswith("(default: on)")


# ----------------------------------------------------------------------------- one vocabulary
def test_train_core(capsys):
    assert _parsed("train", ["--core", "gru,mlp"]).policy == "gru,mlp"
    assert capsys.readouterr().err == ""
    assert _parsed("train", []).policy == "nac-focus"


def test_train_no_progress_flag():
    assert _parsed("train", []).progress is True
    assert _parsed("train", ["--no-progress"]).progress is False


def test_evaluate_expert_drives(capsys):
    assert _parsed("evaluate", ["--expert-drives"]).expert_drives is True
    assert _parsed("evaluate", []).expert_drives is False
    assert capsys.readouterr().err == ""
    with pytest.raises(ValueError, match="--expert-drives, not both"):
        check_args(EvalArgs(expert_drives=True, checkpoint=["x.pt"]))


def test_evaluate_device_defaults_to_auto(monkeypatch):
    assert _parsed("evaluate", []).device == "auto"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve(EvalArgs()).runtime.device == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve(EvalArgs()).runtime.device == "cuda"
    with pytest.raises(ValueError, match="auto, cpu, cuda"):
        check_args(EvalArgs(device="tpu"))


# ----------------------------------------------------------------------------- checkpoint errors
def _sb3_like_zip(path: Path) -> Path:
    with zipfile.ZipFile(path, "w") as z:  # the members stable-baselines3's save() writes
        for name in ("data", "pytorch_variables.pth", "policy.pth", "policy.optimizer.pth",
                     "_stable_baselines3_version", "system_info.txt"):
            z.writestr(name, b"{}")
    return path


@pytest.fixture
def bad_checkpoints(tmp_path) -> dict[str, Path]:
    text = tmp_path / "notes.pt"
    text.write_text("this is not a checkpoint\n" * 10)
    binary = tmp_path / "random.pt"
    binary.write_bytes(np.random.default_rng(0).integers(0, 256, 4000, dtype=np.uint8).tobytes())
    objects = tmp_path / "objects.pt"
    torch.save(argparse.Namespace(x=1), objects)  # loads only by unpickling arbitrary objects
    return {"text": text, "expert": _sb3_like_zip(tmp_path / "expert.zip"), "binary": binary, "objects": objects}


NEEDLES = {"text": "is a text file", "expert": "is a PPO expert", "binary": "corrupted", "objects": "is not loaded"}


@pytest.mark.parametrize("kind", list(NEEDLES))
def test_bad_checkpoints_are_explained_in_one_line(kind, bad_checkpoints):
    path = bad_checkpoints[kind]
    with pytest.raises(ValueError) as error:
        read_checkpoint(path)
    message = _one_line(str(error.value))
    assert NEEDLES[kind] in message and str(path) in message, message
    assert "train.py" in message or "--expert-drives" in message, message
    for internal in ("weights_only", "inline_container", "PytorchStreamReader", "pickle", "(101)"):
        assert internal not in message, message


def test_an_expert_zip_as_checkpoint_points_to_expert_drives(bad_checkpoints, tmp_path, capsys):
    shipped = REPO / "checkpoints" / "expert_carracing_continuous.zip"
    for path in [bad_checkpoints["expert"]] + ([shipped] if shipped.is_file() else []):
        code = evaluate.main(["--checkpoint", str(path), "--out", str(tmp_path / "o"), "--no-progress", "--no-video"])
        assert code == 2
        line = _one_line(capsys.readouterr().err)
        assert line.startswith("error: ") and "PPO expert" in line and "--expert-drives --expert" in line, line
        assert "inline_container" not in line and "weights_only" not in line
    assert not (tmp_path / "o").exists()


def test_a_text_file_next_to_a_checkpoint_suggests_it(tmp_path):
    from tests.helpers import constant_policy_checkpoint

    constant_policy_checkpoint(tmp_path / "student.pt")
    (tmp_path / "student.json").write_text('{"card": true}\n')
    with pytest.raises(ValueError, match="did you mean .*student.pt"):
        read_checkpoint(tmp_path / "student.json")


# ----------------------------------------------------------------------------- progress bars
def test_progress_bars_only_on_a_terminal(monkeypatch):
    assert show_progress(True, _Terminal()) is True
    assert show_progress(False, _Terminal()) is False
    assert show_progress(True, io.StringIO()) is False  # a log file or a pipe
    closed = io.StringIO()
    closed.close()  # isatty() raises on a closed stream
    assert show_progress(True, closed) is False and show_progress(True, object()) is False
    monkeypatch.setattr("sys.stderr", io.StringIO())
    assert show_progress(True) is False  # the default stream is sys.stderr at call time
    monkeypatch.setattr("sys.stderr", _Terminal())
    assert show_progress(True) is True


def test_a_disabled_bar_writes_nothing_to_a_log():
    from tqdm import tqdm

    log = io.StringIO()
    with tqdm(total=3, file=log, leave=False, disable=not show_progress(True, log)) as bar:
        for _ in range(3):
            bar.update(1)
    assert log.getvalue() == ""


def test_collect_has_no_bar_when_stderr_is_not_a_terminal(monkeypatch, tmp_path):
    from agent.data.collection import Recording

    def bar_shown(argv: list[str]) -> bool:
        plan = SimpleNamespace(ids=[0, 1])  # two episodes to collect
        bar = Recording(plan, [], {}, None, tmp_path, _parsed("collect", argv).progress, None).bar
        shown = not bar.disable
        bar.close()
        return shown

    monkeypatch.setattr("sys.stderr", io.StringIO())
    assert not bar_shown([])
    monkeypatch.setattr("sys.stderr", _Terminal())
    assert bar_shown([]) and not bar_shown(["--no-progress"])


def test_train_data_of_one_folder_is_that_folder():
    assert _parsed("train", ["--data", "a"]).data == "a"
    assert _parsed("train", ["--data", "a", "b"]).data == ["a", "b"]



def test_the_tensorboard_hint_names_the_tensorboard_beside_this_python(tmp_path, monkeypatch):
    """Outside an activated virtualenv a bare `tensorboard` is not found: the hint names the one that is installed."""
    from agent.runtime import tensorboard_command

    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    monkeypatch.setattr("sys.executable", str(bin_dir / "python"))
    monkeypatch.chdir(tmp_path)
    assert tensorboard_command("eval/x") == f"{bin_dir / 'python'} -m tensorboard.main --logdir eval/x"
    (bin_dir / "tensorboard").write_text("#!/bin/sh\n")
    assert tensorboard_command("eval/x") == ".venv/bin/tensorboard --logdir eval/x"
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # outside the folder that holds the virtualenv: its full path
    assert tensorboard_command("eval/x") == f"{bin_dir / 'tensorboard'} --logdir eval/x"
