"""Runs into an --out folder: imports tied to the recording they came from, one run per folder at a time, a folder
that cannot be written refused at the start, and a re-run's results replacing the last run's."""
import json
import shutil
from pathlib import Path

import pytest

import collect
from driving_data.dataset import open_dataset
import evaluate
import train
from tests.helpers import steering_checkpoint
from common.files import folder_lock
from tests.driving_data.test_udacity_import import _sim_recording

TINY = ["--epochs", "1", "--batch-size", "8", "--segment", "8", "--window", "2", "--frame-stride", "1",
        "--feature-dim", "8", "--d-model", "16", "--heads", "4", "--threads", "1", "--no-progress"]


def _steering_checkpoint(path):
    """A udacity steering student that always answers 0.1."""
    return steering_checkpoint(path, 0.1)


def _err_line(capsys):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:"), err
    return err[0]


def test_a_second_recording_into_the_same_offline_folder_is_scored_not_the_first(tmp_path, capsys):
    _sim_recording(tmp_path / "a", offsets_s=(0, 0.1, 0.2))
    _sim_recording(tmp_path / "b", offsets_s=tuple(round(0.1 * k, 1) for k in range(8)))
    ckpt = str(_steering_checkpoint(tmp_path / "c.pt"))
    out = tmp_path / "eval"
    for rec, frames in (("a", 3), ("b", 8), ("a", 3)):
        assert evaluate.main(["--data", str(tmp_path / rec), "--checkpoint", ckpt, "--out", str(out),
                              "--no-progress"]) == 0
        assert json.loads((out / "offline.json").read_text())["pooled"]["frames"] == frames
    assert "is another recording than the import" in capsys.readouterr().out


def test_a_changed_recording_is_imported_again_and_an_unchanged_one_reused(tmp_path, capsys):
    rec, out = tmp_path / "rec", tmp_path / "run"
    _sim_recording(rec, offsets_s=tuple(round(0.1 * k, 1) for k in range(12)))
    assert train.main(["--data", str(rec), "--out", str(out), *TINY]) == 0
    card = (out / "imported_data" / "dataset.json").stat().st_mtime_ns
    assert train.main(["--data", str(rec), "--out", str(out), "--overwrite", *TINY]) == 0
    assert (out / "imported_data" / "dataset.json").stat().st_mtime_ns == card, "unchanged: reused"
    lines = (rec / "driving_log.csv").read_text().splitlines()
    (rec / "driving_log.csv").write_text("\n".join(lines[:10]) + "\n")  # the user mends the recording
    capsys.readouterr()
    assert train.main(["--data", str(rec), "--out", str(out), "--overwrite", *TINY]) == 0
    assert "has changed since the import" in capsys.readouterr().out
    assert open_dataset(out / "imported_data").num_steps == 10


def test_a_killed_import_s_staging_folder_is_removed_by_the_next_run(tmp_path):
    rec, out = tmp_path / "rec", tmp_path / "run"
    _sim_recording(rec, offsets_s=tuple(round(0.1 * k, 1) for k in range(12)))
    stale = out / ".imported_data.k9x2_a.tmp"
    (stale / "episodes").mkdir(parents=True)
    (stale / "episodes" / "episode_00000.npz").write_bytes(b"half")
    (out / ".metrics.json.abc123.tmp").write_text("{")
    assert train.main(["--data", str(rec), "--out", str(out), *TINY]) == 0
    assert not stale.exists() and not (out / ".metrics.json.abc123.tmp").exists()


@pytest.mark.parametrize("cli", ["train", "evaluate"])
def test_a_second_run_into_a_folder_in_use_is_refused_in_one_line(cli, tmp_path, capsys):
    out = tmp_path / "out"
    _sim_recording(tmp_path / "rec", offsets_s=tuple(round(0.1 * k, 1) for k in range(12)))
    argv = {"train": ["--data", str(tmp_path / "rec"), "--out", str(out), *TINY],
            "evaluate": ["--data", str(tmp_path / "rec"), "--checkpoint", str(_steering_checkpoint(tmp_path / "c.pt")),
                         "--out", str(out), "--no-progress"]}[cli]
    with folder_lock(out, "train.py"):
        assert {"train": train, "evaluate": evaluate}[cli].main(argv) == 2
    line = _err_line(capsys)
    assert f"another train.py is writing into {str(out)!r}" in line
    assert {p.name for p in out.iterdir()} == {".lock"}, "nothing was written"


@pytest.mark.parametrize("cli", ["collect", "train", "evaluate"])
def test_an_out_folder_that_cannot_be_written_is_refused_at_the_start(cli, tmp_path, capsys):
    (tmp_path / "file").write_text("not a folder")
    out = str(tmp_path / "file" / "out")
    argv = {"collect": ["--episodes", "1", "--max-steps", "5", "--out", out],
            "train": ["--data", str(tmp_path / "nowhere"), "--out", out, *TINY],
            "evaluate": ["--expert-drives", "--episodes", "1", "--max-steps", "5", "--out", out, "--no-progress"]}[cli]
    assert {"collect": collect, "train": train, "evaluate": evaluate}[cli].main(argv) == 2
    assert _err_line(capsys).startswith(f"error: cannot write into --out {out!r}")


def test_a_run_that_fails_leaves_no_folder_it_made(tmp_path, capsys):
    assert train.main(["--data", str(tmp_path / "nowhere"), "--out", str(tmp_path / "run"), *TINY]) == 2
    assert "nowhere" in _err_line(capsys) and not (tmp_path / "run").exists()


def test_a_re_run_of_evaluate_replaces_the_last_run_s_videos_and_tensorboard_files(tmp_path):
    out = tmp_path / "eval"
    common = ["--expert-drives", "--max-steps", "5", "--out", str(out), "--no-progress", "--renderer", "fast",
              "--workers", "1"]
    assert evaluate.main([*common, "--episodes", "2", "--video-episodes", "2"]) == 0
    assert len(list((out / "videos").glob("*.mp4"))) == 2 and len(list((out / "tb").rglob("events.*"))) == 1
    assert evaluate.main([*common, "--episodes", "1", "--video-episodes", "1"]) == 0
    assert [p.name for p in (out / "videos").glob("*.mp4")] == ["seed_1000.mp4"]
    assert len(list((out / "tb").rglob("events.*"))) == 1
    assert len(json.loads((out / "metrics.json").read_text())["episodes"]) == 1


def _straight_recording(root):
    """A recording whose steering is always 0: always-straight's MSE is 0."""
    def zero_steering(lines):
        return [", ".join([*line.split(", ")[:3], "0", *line.split(", ")[4:]]) for line in lines]

    _sim_recording(root, offsets_s=tuple(round(0.1 * k, 1) for k in range(12)), rows=zero_steering)


def test_no_ratio_to_a_reference_whose_mse_is_zero_is_printed(tmp_path, capsys):
    _straight_recording(tmp_path / "rec")
    assert train.main(["--data", str(tmp_path / "rec"), "--out", str(tmp_path / "run"), *TINY]) == 0
    out = capsys.readouterr().out
    assert "val_steer_vs_straight" not in out and "always-straight's MSE is 0" in out
    ckpt = str(_steering_checkpoint(tmp_path / "c.pt"))
    assert evaluate.main(["--data", str(tmp_path / "rec"), "--checkpoint", ckpt, "--out", str(tmp_path / "eval"),
                          "--no-progress"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "steering MSE" in x)
    assert "x always-straight's" not in line and "always-straight's MSE is 0" in line
    result = json.loads((tmp_path / "eval" / "offline.json").read_text())
    assert result["pooled"]["policy_vs_straight_mse_avg"] is None
    table = (tmp_path / "eval" / "offline.md").read_text()
    assert "| always straight | 0.0000 | 0.0000 | 0.0000 | 0.0000 | - |" in table


def test_results_that_cannot_be_written_at_the_end_are_kept_elsewhere(tmp_path, capsys):
    out = tmp_path / "eval"
    (out / "metrics.json").mkdir(parents=True)  # the folder is writable at the start; the last write fails
    assert evaluate.main(["--expert-drives", "--episodes", "2", "--max-steps", "5", "--out", str(out), "--no-progress",
                          "--renderer", "fast", "--workers", "1", "--no-video"]) == 2
    line = _err_line(capsys)
    assert line.startswith(f"error: cannot write the results into {str(out)!r}") and "2 driven episode(s)" in line
    kept = line.rsplit("saved in ", 1)[1].strip("'")
    assert len(json.loads((Path(kept) / "metrics.json").read_text())["episodes"]) == 2
    shutil.rmtree(kept)
