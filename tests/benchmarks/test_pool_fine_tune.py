"""The fine-tune benchmark's pieces: a recording's first frames as a recording, and the paired table."""
import pytest

from driving_data.udacity_import import import_udacity
from benchmarks import pool_fine_tune
from driving_data.dataset import open_dataset
from tests.driving_data.test_udacity_import import _sim_recording


def test_the_first_frames_of_a_recording_are_a_recording_of_their_own(tmp_path):
    _sim_recording(tmp_path / "rec", offsets_s=tuple(round(0.1 * k, 1) for k in range(12)), header=True)
    import_udacity(tmp_path / "rec", tmp_path / "data")
    short = pool_fine_tune.first_frames(tmp_path / "data", 5, tmp_path / "short")
    assert open_dataset(import_udacity(short, tmp_path / "short_data")).num_steps == 5


def test_a_dataset_that_is_no_import_is_one_error(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "dataset.json").write_text("{}")
    with pytest.raises(ValueError, match="not the import of a recording"):
        pool_fine_tune.first_frames(tmp_path / "data", 5, tmp_path / "short")


def test_the_table_pairs_fine_tuned_with_scratch_by_seed():
    rows = {v: [{"per_100s": x} for x in xs] for v, xs in
            {"scratch": [10, 20], "fine-tuned": [4, 6], "scratch-1000": [30, 30], "fine-tuned-1000": [5, 15]}.items()}
    text = pool_fine_tune.summary({"rec": rows})
    assert "| rec | 2 | 15.0 ± 5.0 | 5.0 ± 1.0 | 30.0 ± 0.0 | 10.0 ± 5.0 | -10.0 ± 4.0 | -20.0 ± 5.0 |" in text


def test_fine_tunes_alone_make_a_table_without_the_paired_column():
    rows = {v: [{"per_100s": x} for x in xs] for v, xs in {"fine-tuned": [4, 6], "fine-tuned-1000": [5, 15]}.items()}
    text = pool_fine_tune.summary({"rec": rows})
    assert text.splitlines()[0] == "| recording | seeds | fine-tuned | fine-tuned-1000 |"
    assert "| rec | 2 | 5.0 ± 1.0 | 10.0 ± 5.0 |" in text


def test_an_unknown_variant_is_one_line(capsys):
    with pytest.raises(SystemExit) as stop:
        pool_fine_tune.main(["--recordings", "x", "--variants", "tuned"])
    assert stop.value.code == 2
    assert "invalid choice: 'tuned'" in capsys.readouterr().err
