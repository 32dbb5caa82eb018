"""User mistakes that were accepted silently or explained wrongly: each is one line, exit 2, naming what was given."""
import pytest

import evaluate
import train
from tests.helpers import constant_policy_checkpoint
from tests.agent.data.test_out_folder import TINY
from tests.driving_data.test_udacity_import import _sim_recording


def _err_line(capsys):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:"), err
    return err[0]


@pytest.mark.parametrize("flag, value, rule", [("--lr", "-1", "> 0, got -1.0"), ("--lr", "nan", "> 0, got nan"),
                                               ("--grad-clip", "0", "> 0, got 0.0"),
                                               ("--weight-decay", "-0.5", ">= 0, got -0.5"),
                                               ("--warmup", "1", "in [0, 1), got 1.0")])
def test_optimizer_flag_errors_show_the_value_given(flag, value, rule, tmp_path, capsys):
    assert train.main(["--data", str(tmp_path), "--out", str(tmp_path / "run"), flag, value]) == 2
    assert _err_line(capsys) == f"error: {flag} must be {rule}"


def test_a_run_folder_given_as_checkpoint_points_at_the_file_in_it(tmp_path, capsys):
    constant_policy_checkpoint(tmp_path / "run" / "best.pt")
    assert evaluate.main(["--checkpoint", str(tmp_path / "run"), "--out", str(tmp_path / "e"), "--no-progress"]) == 2
    line = _err_line(capsys)
    assert "is a folder, not a checkpoint file" in line and repr(str(tmp_path / "run" / "best.pt")) in line
    assert not (tmp_path / "e").exists()


def test_a_window_longer_than_every_episode_is_refused(tmp_path, capsys):
    _sim_recording(tmp_path / "rec", offsets_s=tuple(round(0.1 * k, 1) for k in range(8)) + (5.0, 5.1, 5.2))
    argv = ["--data", str(tmp_path / "rec"), "--out", str(tmp_path / "run"), *TINY]
    argv[argv.index("--window") + 1] = "12"
    assert train.main(argv) == 2
    assert "--window 12 at --frame-stride 1 spans 12 steps, more than the longest episode (8 steps)" in _err_line(capsys)
    assert not (tmp_path / "run" / "metrics.json").exists()
