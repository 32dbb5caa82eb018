"""What a recording's import checks before it is trained on or scored: every image decodes, and rows are in time
order; what it cannot use is skipped and counted (or refused with --strict-images), named by CSV line and file."""
import numpy as np
import pytest

import train
from agent.data.dataset import open_dataset
from agent.udacity import recordings as uf
from tests.agent.data.test_out_folder import TINY
from tests.agent.udacity.test_recordings import _sim_recording

OFFSETS = tuple(round(0.1 * k, 1) for k in range(20))


def test_rows_out_of_time_order_are_sorted_with_one_warning(tmp_path):
    def shuffle(lines):  # three rows moved out of place, as a hand-merged log has them
        return [lines[k] for k in (0, 1, 2, 9, 3, 4, 5, 6, 7, 8, 15, 10, 11, 12, 13, 14, 18, 16, 17, 19)]

    _sim_recording(tmp_path / "rec", offsets_s=OFFSETS, rows=shuffle)
    warnings = []
    back = open_dataset(uf.import_udacity(tmp_path / "rec", tmp_path / "data", warn=warnings.append))
    assert len(back) == 1 and back.num_steps == 20, "one session, as recorded"
    np.testing.assert_allclose(back.load(0, keys=["time"])["time"], np.arange(20) * 0.1, atol=1e-6)
    np.testing.assert_allclose(back.load(0, keys=["expert_action"])["expert_action"][:, 0], -0.05 * np.arange(20),
                               atol=1e-6)
    assert warnings == [f"warning: 3 rows of driving_log.csv are dated before the row above them (first: line 5, "
                        f"'{_center_name(tmp_path / 'rec', 3)}'); importing the rows in the "
                        "order of the times in their file names"]


def _center_name(rec, k):
    return sorted((rec / "IMG").glob("center_*"))[k].name


def test_a_truncated_jpeg_is_skipped_and_counted_by_line_and_file(tmp_path, capsys):
    _sim_recording(tmp_path / "rec", offsets_s=OFFSETS)
    victim = sorted((tmp_path / "rec" / "IMG").glob("left_*"))[12]
    victim.write_bytes(victim.read_bytes()[: len(victim.read_bytes()) // 2])  # the header survives
    warnings = []
    back = open_dataset(uf.import_udacity(tmp_path / "rec", tmp_path / "data", warn=warnings.append))
    assert back.num_steps == 19 and back.card["import"]["skipped_rows"] == 1
    assert back.card["import"]["skipped_examples"][0]["line"] == 13
    assert warnings[0].startswith("warning: skipped 1 of 20 rows") and f"line 13, '{victim.name}', is cut off" in warnings[0]
    with pytest.raises(ValueError, match=f"driving_log.csv line 13: image '{victim.name}' is cut off"):
        uf.import_udacity(tmp_path / "rec", tmp_path / "strict", strict_images=True)
    assert not (tmp_path / "strict").exists()
    # train.py --strict-images: one line, exit 2, and no import left behind
    assert train.main(["--data", str(tmp_path / "rec"), "--out", str(tmp_path / "run"), "--strict-images", *TINY]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "line 13" in err[0] and victim.name in err[0]
    assert not (tmp_path / "run" / "imported_data").exists()


def test_an_image_that_does_not_decode_is_skipped_and_counted(tmp_path):
    _sim_recording(tmp_path / "rec", offsets_s=OFFSETS)
    victim = sorted((tmp_path / "rec" / "IMG").glob("center_*"))[4]
    victim.write_bytes(b"\xff\xd8" + bytes(range(256)) * 4 + b"\xff\xd9")  # a JPEG's first and last bytes only
    warnings = []
    back = open_dataset(uf.import_udacity(tmp_path / "rec", tmp_path / "data", warn=warnings.append))
    assert back.num_steps == 19 and "line 5" in warnings[0] and victim.name in warnings[0]


def test_a_dangling_image_link_is_skipped_like_a_missing_image(tmp_path):
    _sim_recording(tmp_path / "rec", offsets_s=OFFSETS)
    victim = sorted((tmp_path / "rec" / "IMG").glob("right_*"))[7]
    victim.unlink()
    victim.symlink_to(tmp_path / "gone.jpg")
    warnings = []
    back = open_dataset(uf.import_udacity(tmp_path / "rec", tmp_path / "data", warn=warnings.append))
    assert back.num_steps == 19 and f"line 8, '{victim.name}', cannot be read" in warnings[0]


def test_a_non_jpeg_image_names_the_command_that_converts_it(tmp_path):
    _sim_recording(tmp_path / "rec")
    sorted((tmp_path / "rec" / "IMG").glob("right_*"))[2].write_bytes(b"\x89PNG not really")
    with pytest.raises(ValueError, match="python -m agent.udacity.recordings import --jpeg-quality Q"):
        uf.import_udacity(tmp_path / "rec", tmp_path / "data")



def test_an_import_the_disk_cannot_hold_is_refused_in_one_line(tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    _sim_recording(tmp_path / "rec", offsets_s=OFFSETS)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9, 1000))
    with pytest.raises(ValueError, match=r"not enough disk space for the import of .* MB free$"):
        uf.import_udacity(tmp_path / "rec", tmp_path / "out")
    assert not (tmp_path / "out").exists()
