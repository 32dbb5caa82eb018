"""User mistakes that were accepted silently or explained wrongly: each is one line, exit 2, naming what was given."""
import pytest

import evaluate
import train
from tests.helpers import constant_policy_checkpoint
from tests.agent.data.test_out_folder import TINY
from tests.agent.training.test_experiment import write_synthetic
from tests.driving_data.test_udacity_import import _sim_recording


def _err_line(capsys):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:"), err
    return err[0]


@pytest.mark.parametrize("flag, value, rule", [("--lr", "-1", "> 0, got -1.0"), ("--lr", "nan", "> 0, got nan"),
                                               ("--grad-clip", "-1", ">= 0, got -1.0"),
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
    need = "--window 12 at --frame-stride 1 spans 12 steps, more than the longest episode (8 steps)"
    assert need in _err_line(capsys)
    assert not (tmp_path / "run" / "metrics.json").exists()


SMALL = ["--core", "mlp", "--epochs", "2", "--window", "2", "--batch-size", "8", "--segment", "8", "--feature-dim", "8",
         "--threads", "1", "--no-progress"]


def test_resume_without_last_pt_is_refused_where_epochs_were_saved_and_starts_over_where_none_was(tmp_path, capsys):
    out = tmp_path / "run"
    assert train.main(["--data", str(write_synthetic(tmp_path / "data", episodes=4)), "--out", str(out), *SMALL]) == 0
    (out / "last.pt").unlink()
    best = (out / "best.pt").stat().st_mtime_ns
    capsys.readouterr()
    assert train.main(["--resume", "--out", str(out)]) == 2  # not a silent retraining over best.pt
    line = _err_line(capsys)
    assert f"{str(out / 'last.pt')!r} is missing" in line and "pass --overwrite instead of --resume" in line
    assert (out / "best.pt").stat().st_mtime_ns == best
    for f in out.iterdir():  # a run killed before its first epoch was saved: nothing to lose, trained from epoch 1
        if f.name != "args.json":
            f.unlink()
    assert train.main(["--resume", "--out", str(out)]) == 0
    assert "stopped before its first epoch was saved (no last.pt): training it from epoch 1" in capsys.readouterr().out
    assert (out / "last.pt").exists()


def test_a_refused_init_leaves_no_run_folder_behind(tmp_path, capsys):
    """A CarRacing student given to fine-tune on a Udacity recording: refused before the run folder holds an
    args.json or the recording's import, so the corrected command is not refused as "already holds a run"."""
    _sim_recording(tmp_path / "rec", offsets_s=tuple(round(0.1 * k, 1) for k in range(12)))
    argv = ["--data", str(tmp_path / "rec"), "--out", str(tmp_path / "run"), "--init",
            str(constant_policy_checkpoint(tmp_path / "car.pt")), "--epochs", "1", "--threads", "1", "--no-progress"]
    for _ in range(2):
        assert train.main(argv) == 2
        assert "cannot be fine-tuned on this dataset: its env 'CarRacing-v3'" in _err_line(capsys)
        assert not (tmp_path / "run").exists()


def test_a_diverging_run_stops_in_one_line_and_keeps_its_last_good_epoch(tmp_path, capsys, monkeypatch):
    import agent.training.loop as loop

    data = write_synthetic(tmp_path / "data", episodes=4)
    assert train.main(["--data", str(data), "--out", str(tmp_path / "huge"), *SMALL, "--lr", "1e6"]) == 2
    line = _err_line(capsys)  # not TensorBoard's "The histogram is empty" at the end of the epoch
    assert "mlp: the training loss became" in line and "at epoch 1, step" in line and "lower --lr (it is 1e+06)" in line
    # the loss turns NaN in epoch 2: epoch 1 stays saved, untouched by the diverged weights
    real_end, real_loss, diverged = loop.Trainer.end_epoch, loop.loss_fn, []
    monkeypatch.setattr(loop.Trainer, "end_epoch", lambda self: (real_end(self), diverged.append(True)))
    monkeypatch.setattr(loop, "loss_fn", lambda *a, **k: real_loss(*a, **k) * (float("nan") if diverged else 1.0))
    out = tmp_path / "nan"
    assert train.main(["--data", str(data), "--out", str(out), *SMALL]) == 2
    line = _err_line(capsys)
    assert "the training loss became nan" in line and "at epoch 2, step 1" in line
    assert "(last.pt keeps epoch 1, best.pt epoch 1)" in line
    state = loop.read_checkpoint(out / "last.pt")["train_state"]
    assert state["epoch"] == 1 and not state["done"] and not (out / "metrics.json").exists()
