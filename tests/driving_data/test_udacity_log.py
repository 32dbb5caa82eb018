"""What a recording's import checks before it is trained on or scored: every image decodes and is the simulator's
size, rows are in time order, each frame once, and what each row claims is possible (speed, pedals); what it cannot
use is skipped and counted (or refused with --strict-images), what cannot be true is refused, named by CSV line and
file. And how train.py takes the recordings it is given (once each, a CSV as its folder, no import left by a
refusal)."""
import json

import numpy as np
import pytest

import train
from agent.udacity import recordings as uf
from driving_data import udacity_import as ui
from driving_data.dataset import open_dataset
from tests.agent.data.test_out_folder import TINY
from tests.driving_data.test_udacity_import import _sim_recording

OFFSETS = tuple(round(0.1 * k, 1) for k in range(20))


def test_rows_out_of_time_order_are_sorted_with_one_warning(tmp_path):
    def shuffle(lines):  # three rows moved out of place, as a hand-merged log has them
        return [lines[k] for k in (0, 1, 2, 9, 3, 4, 5, 6, 7, 8, 15, 10, 11, 12, 13, 14, 18, 16, 17, 19)]

    _sim_recording(tmp_path / "rec", offsets_s=OFFSETS, rows=shuffle)
    warnings = []
    back = open_dataset(ui.import_udacity(tmp_path / "rec", tmp_path / "data", warn=warnings.append))
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
    back = open_dataset(ui.import_udacity(tmp_path / "rec", tmp_path / "data", warn=warnings.append))
    assert back.num_steps == 19 and back.card["import"]["skipped_rows"] == 1
    assert back.card["import"]["skipped_examples"][0]["line"] == 13
    assert warnings[0].startswith("warning: skipped 1 of 20 rows")
    assert f"line 13, '{victim.name}', is cut off" in warnings[0]
    with pytest.raises(ValueError, match=f"driving_log.csv line 13: image '{victim.name}' is cut off"):
        ui.import_udacity(tmp_path / "rec", tmp_path / "strict", strict_images=True)
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
    back = open_dataset(ui.import_udacity(tmp_path / "rec", tmp_path / "data", warn=warnings.append))
    assert back.num_steps == 19 and "line 5" in warnings[0] and victim.name in warnings[0]


def test_a_dangling_image_link_is_skipped_like_a_missing_image(tmp_path):
    _sim_recording(tmp_path / "rec", offsets_s=OFFSETS)
    victim = sorted((tmp_path / "rec" / "IMG").glob("right_*"))[7]
    victim.unlink()
    victim.symlink_to(tmp_path / "gone.jpg")
    warnings = []
    back = open_dataset(ui.import_udacity(tmp_path / "rec", tmp_path / "data", warn=warnings.append))
    assert back.num_steps == 19 and f"line 8, '{victim.name}', cannot be read" in warnings[0]


def test_a_recording_without_its_side_images_trains_and_replays_on_its_center_frames(tmp_path, capsys):
    """A public recording as downloaded: every center image, some left ones, no right one. Every row keeps its
    center frame: imported center-only, the rows lacking side images counted in the card and said in one warning;
    it trains, and the replay drives it. --strict-images refuses it, naming the first missing image."""
    from agent.evaluation.args import EvalArgs
    from agent.evaluation.config import resolve
    from agent.evaluation.evaluate import evaluate

    def steady(lines):  # a speed the simulator reaches and gentle steering, so the replay has a road to follow
        return [", ".join(line.split(", ")[:3] + [f"{0.2 * np.sin(k / 5):.3f}", "0.9", "0", "20.5"])
                for k, line in enumerate(lines)]

    rec, n = tmp_path / "rec", 40
    _sim_recording(rec, offsets_s=tuple(round(0.1 * k, 1) for k in range(n)), rows=steady)
    lefts = sorted((rec / "IMG").glob("left_*"))
    gone = [*sorted((rec / "IMG").glob("right_*")), *lefts[::3]]
    for f in gone:
        f.unlink()
    with pytest.raises(FileNotFoundError, match="line 1: left image 'left_"):
        ui.import_udacity(rec, tmp_path / "strict", strict_images=True)
    assert train.main(["--data", str(rec), "--out", str(tmp_path / "run"), *TINY]) == 0
    said = [line for line in capsys.readouterr().out.splitlines() if "side images" in line]
    assert len(said) == 1 and said[0].startswith(f"warning: {n} of {n} rows of ") and "center-only" in said[0], said
    card = json.loads((tmp_path / "run" / "imported_data" / "dataset.json").read_text())
    assert card["cameras"] == {"frames": "center"} and card["counts"]["steps"] == n
    assert card["import"]["skipped_rows"] == 0
    missing = card["import"]["rows_missing_side_images"]
    assert (missing["rows"], missing["left"], missing["right"]) == (n, len(lefts[::3]), n)
    assert missing["examples"][0] == {"line": 1, "images": [lefts[0].name, lefts[0].name.replace("left_", "right_")]}
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["train_samples"] > 0 and metrics["train_windows"] > 0
    results = evaluate(resolve(EvalArgs(replay=str(rec), out=str(tmp_path / "replay"), workers=1, video_episodes=0,
                                        progress=False, tensorboard=False)))
    (student,) = results.values()
    assert student["num_episodes"] == 1 and student["elapsed_s"] > 0


def test_a_non_jpeg_image_names_the_command_that_converts_it(tmp_path):
    import cv2

    frames = _sim_recording(tmp_path / "rec")
    sorted((tmp_path / "rec" / "IMG").glob("right_*"))[2].write_bytes(cv2.imencode(".png", frames[2])[1].tobytes())
    with pytest.raises(ValueError, match="python -m agent.udacity.recordings import --jpeg-quality Q"):
        ui.import_udacity(tmp_path / "rec", tmp_path / "data")


def _scrambled(jpeg: bytes, seed: int = 0) -> bytes:
    """The JPEG with its image data replaced by random bytes, every marker (start, tables, scan header, end) intact."""
    i = jpeg.index(b"\xff\xda")
    start, end = i + 2 + ((jpeg[i + 2] << 8) | jpeg[i + 3]), len(jpeg) - 2
    noise = np.random.default_rng(seed).integers(0, 256, end - start, dtype=np.uint8).tobytes()
    return jpeg[:start] + noise + jpeg[end:]


def test_a_scrambled_jpeg_behind_intact_markers_is_skipped_and_named(tmp_path, capfd):
    """libjpeg decodes scrambled image data into a full-size frame, warning on stderr without a file name: the
    import reads that warning, skips the row and names the file in its one warning."""
    _sim_recording(tmp_path / "rec", offsets_s=OFFSETS)
    victim = sorted((tmp_path / "rec" / "IMG").glob("center_*"))[6]
    victim.write_bytes(_scrambled(victim.read_bytes()))
    warnings = []
    back = open_dataset(ui.import_udacity(tmp_path / "rec", tmp_path / "data", warn=warnings.append))
    assert back.num_steps == 19 and back.card["import"]["skipped_rows"] == 1
    assert len(warnings) == 1
    assert f"line 7, '{victim.name}', is a corrupt JPEG (libjpeg: Corrupt JPEG data" in warnings[0]
    assert "Corrupt JPEG data" not in capfd.readouterr().err, "libjpeg's own nameless line is not left on the terminal"


@pytest.mark.parametrize("quality", [None, 90])
def test_an_image_of_nul_or_random_bytes_is_skipped_and_counted_not_refused(quality, tmp_path):
    """Bytes that are no image in any format are a broken frame, as docs/udacity.md says: skipped and counted,
    whatever --jpeg-quality; only an image in another format asks for converting."""
    _sim_recording(tmp_path / "rec", offsets_s=OFFSETS)
    centers = sorted((tmp_path / "rec" / "IMG").glob("center_*"))
    centers[3].write_bytes(bytes(5000))
    centers[11].write_bytes(np.random.default_rng(1).integers(0, 256, 5000, dtype=np.uint8).tobytes())
    warnings = []
    back = open_dataset(ui.import_udacity(tmp_path / "rec", tmp_path / "data", jpeg_quality=quality,
                                          warn=warnings.append))
    assert back.num_steps == 18 and back.card["import"]["skipped_rows"] == 2
    assert len(warnings) == 1 and warnings[0].startswith("warning: skipped 2 of 20 rows")
    assert f"line 4, '{centers[3].name}', cannot be decoded" in warnings[0]



def test_an_import_the_disk_cannot_hold_is_refused_in_one_line(tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    _sim_recording(tmp_path / "rec", offsets_s=OFFSETS)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9, 1000))
    with pytest.raises(ValueError, match=r"not enough disk space for the import of .* MB free$"):
        ui.import_udacity(tmp_path / "rec", tmp_path / "out")
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------ what a recording claims against what is possible
def _set(column, value, rows=None):
    """A CSV edit: ``column`` (3 steering .. 6 speed) set to ``value`` in ``rows`` (default: every row)."""
    def edit(lines):
        out = []
        for k, line in enumerate(lines):
            fields = line.split(", ")
            if rows is None or k in rows:
                fields[column] = value
            out.append(", ".join(fields))
        return out
    return edit


IMPOSSIBLE = {
    "speed below 0 throughout": (_set(6, "-30.2"), "line 1: speed -30.2 mph is below 0"),
    "one row at 1e9 mph": (_set(6, "1e9", rows={7}),
                           r"line 8: speed 1e\+09 mph is beyond what the simulator can reach"),
    "a speed just past the margin": (_set(6, "40.5", rows={3}), r"line 4: speed 40.5 mph .* above 40 mph are refused"),
    "throttle -0.5": (_set(4, "-0.5", rows={2}), r"line 3: throttle -0.5 is outside \[0, 1\]"),
    "brake 7": (_set(5, "7", rows={11}), r"line 12: brake 7 is outside \[0, 1\]"),
    "speed 0 throughout": (_set(6, "0"), "the car never moves .* in all 20 rows"),
}


@pytest.mark.parametrize("case", sorted(IMPOSSIBLE))
def test_impossible_values_are_refused_in_one_line_naming_the_row_and_the_rule(case, tmp_path, capsys):
    edit, message = IMPOSSIBLE[case]
    _sim_recording(tmp_path / "rec", offsets_s=OFFSETS, rows=edit)
    with pytest.raises(ValueError, match=message):
        ui.import_udacity(tmp_path / "rec", tmp_path / "data")
    assert not (tmp_path / "data").exists()
    assert uf.main(["import", str(tmp_path / "rec"), "--out", str(tmp_path / "data")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err


def test_what_real_recordings_hold_still_imports(tmp_path):
    """The simulator's top speed a little exceeded, brief stops, pedals at their ends, a header row: as before."""
    def real(lines):
        speeds = ["30.63", "30.2", "0", "0", "0.0001", "12"] + ["20"] * (len(lines) - 7)
        return lines[:1] + [", ".join([*line.split(", ")[:4], "1" if k % 2 else "0", "0" if k % 2 else "1", s])
                            for k, (line, s) in enumerate(zip(lines[1:], speeds))]

    _sim_recording(tmp_path / "rec", offsets_s=OFFSETS, rows=real, header=True)
    warnings = []
    back = open_dataset(ui.import_udacity(tmp_path / "rec", tmp_path / "data", warn=warnings.append))
    assert back.num_steps == 20 and warnings == []
    np.testing.assert_allclose(back.load(0, keys=["speed"])["speed"][:3], np.array([30.63, 30.2, 0]) / 2.23694,
                               rtol=1e-6)


def test_every_row_twice_is_taken_once_with_one_warning(tmp_path):
    _sim_recording(tmp_path / "rec", offsets_s=OFFSETS, rows=lambda ls: [line for line in ls for _ in (0, 1)])
    warnings = []
    back = open_dataset(ui.import_udacity(tmp_path / "rec", tmp_path / "data", warn=warnings.append))
    assert back.num_steps == 20 and back.card["import"]["repeated_rows_dropped"] == 20
    assert (np.diff(back.load(0, keys=["time"])["time"]) > 0).all(), "no step of 0 s"
    assert warnings == [f"warning: dropped 20 rows of {tmp_path / 'rec' / 'driving_log.csv'} "
                        "that repeat an earlier row "
                        "(the same center image and values; first: line 2, as line 1): a frame counts once"]


def test_rows_that_disagree_about_one_frame_or_share_a_time_are_refused(tmp_path):
    _sim_recording(tmp_path / "rec", offsets_s=OFFSETS, rows=lambda ls: ls + [ls[4].replace(", 0.9, ", ", 0.5, ")])
    with pytest.raises(ValueError, match="lines 5 and 21 name the same center image .* with other steering, throttle"):
        ui.import_udacity(tmp_path / "rec", tmp_path / "data")
    # two images dated to the same millisecond (a hand-renamed copy)
    _sim_recording(tmp_path / "twin", offsets_s=OFFSETS)
    img = tmp_path / "twin" / "IMG"
    name = sorted(img.glob("center_*"))[6].name
    for cam in ("center", "left", "right"):
        jpg = img / name.replace("center", cam)
        (img / jpg.name.replace(".jpg", ".JPEG")).write_bytes(jpg.read_bytes())
    log = tmp_path / "twin" / "driving_log.csv"
    lines = log.read_text().splitlines()
    log.write_text("\n".join(lines + [lines[6].replace(".jpg", ".JPEG")]) + "\n")
    with pytest.raises(ValueError, match=r"lines 7 and 21 are both dated 2016-12-01 13:30:48\.887"):
        ui.import_udacity(tmp_path / "twin", tmp_path / "data")
    assert not (tmp_path / "data").exists()


def _big_frames_recording(root, n=20):
    """A recording laid out as the simulator's whose every frame is 480x640 (another camera)."""
    import cv2

    _sim_recording(root, offsets_s=tuple(round(0.1 * k, 1) for k in range(n)))
    rng = np.random.default_rng(0)
    for f in (root / "IMG").iterdir():
        cv2.imwrite(str(f), rng.integers(0, 255, (480, 640, 3), dtype=np.uint8))


def test_frames_of_another_size_are_refused_by_the_import_training_and_offline_scores(tmp_path, capsys):
    import evaluate
    from driving_data.dataset import CARD_NAME, FORMAT, write_episode
    from tests.helpers import steering_checkpoint

    _big_frames_recording(tmp_path / "rec")
    with pytest.raises(ValueError, match=r"line 1: image 'center_.*' is 480x640 \(height x width\); the simulator "
                                         "records 160x320x3 frames"):
        ui.import_udacity(tmp_path / "rec", tmp_path / "data")
    assert train.main(["--data", str(tmp_path / "rec"), "--out", str(tmp_path / "run"), *TINY]) == 2
    assert "is 480x640" in capsys.readouterr().err and not (tmp_path / "run").exists()
    # a dataset holding such frames (made by hand, or imported before the import checked sizes)
    T = 20
    frames = np.random.default_rng(1).integers(0, 255, (T, 480, 640, 3), dtype=np.uint8)
    write_episode(tmp_path / "big", 0, {"frames": frames, "action": np.zeros((T, 1), np.float32),
                                        "expert_action": np.zeros((T, 1), np.float32),
                                        "speed": np.full(T, 9, np.float32),
                                        "reward": np.zeros(T, np.float32), "time": np.arange(T) * 0.1,
                                        "privileged": np.zeros((T, 0), np.float32)},
                  {"env": "udacity", "source": "udacity-recording", "action_space": "continuous"})
    (tmp_path / "big" / CARD_NAME).write_text(json.dumps({"format": FORMAT, "env": "udacity",
                                                          "action_space": "continuous",
                                                         "frame_shape": [480, 640, 3]}))
    assert train.main(["--data", str(tmp_path / "big"), "--out", str(tmp_path / "run"), *TINY]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "frames are 480x640x3, but the udacity env's crop (rows 60..135)" in err[0], err
    ckpt = steering_checkpoint(tmp_path / "s.pt")  # a 160x320 student
    assert evaluate.main(["--data", str(tmp_path / "big"), "--checkpoint", str(ckpt), "--out", str(tmp_path / "e"),
                          "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "was trained on 160x320x3 frames; the frames to score are 480x640x3" in err[0], err
    assert not (tmp_path / "e").exists()


@pytest.mark.parametrize("quality", [None, 95])
def test_an_empty_image_is_skipped_like_a_cut_off_one_whatever_the_jpeg_quality(quality, tmp_path, capsys):
    _sim_recording(tmp_path / "rec", offsets_s=OFFSETS)
    victim = sorted((tmp_path / "rec" / "IMG").glob("center_*"))[9]
    victim.write_bytes(b"")
    warnings = []
    back = open_dataset(ui.import_udacity(tmp_path / "rec", tmp_path / "data", jpeg_quality=quality,
                                          warn=warnings.append))
    assert back.num_steps == 19 and f"line 10, '{victim.name}', is empty (0 bytes)" in warnings[0]
    argv = ["import", str(tmp_path / "rec"), "--out", str(tmp_path / "strict"), "--strict-images"]
    assert uf.main(argv + (["--jpeg-quality", str(quality)] if quality else [])) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is empty (0 bytes)" in err[0], err


def test_a_utf16_csv_says_its_encoding_is_not_supported(tmp_path, capsys):
    _sim_recording(tmp_path / "rec", offsets_s=OFFSETS)
    log = tmp_path / "rec" / "driving_log.csv"
    log.write_bytes(log.read_text().encode("utf-16"))
    assert uf.main(["import", str(tmp_path / "rec"), "--out", str(tmp_path / "data")]) == 2
    assert capsys.readouterr().err == (f"error: {str(log)!r} is encoded in UTF-16, which the "
                                       "importer does not support; "
                                       "save it as UTF-8, as the simulator writes it\n")


def test_names_without_time_say_the_period_they_are_given(tmp_path):
    _sim_recording(tmp_path / "rec", offsets_s=OFFSETS)
    for f in (tmp_path / "rec" / "IMG").iterdir():
        f.rename(f.with_name(f.name.replace("2016_12_01_", "frame")))
    log = tmp_path / "rec" / "driving_log.csv"
    log.write_text(log.read_text().replace("2016_12_01_", "frame"))
    warnings = []
    ui.import_udacity(tmp_path / "rec", tmp_path / "data", warn=warnings.append)
    assert warnings == [f"warning: none of the 20 image names of {log} carry a time (first: line 1, "
                        "'center_frame13_30_48_287.jpg'): its rows are taken 0.1 s apart, as one episode "
                        "(python -m agent.udacity.recordings import --frame-period S sets the seconds per row)"]


def test_one_name_without_time_drops_its_row_and_the_others_keep_their_times(tmp_path):
    """One image renamed by hand in a recording logged 0.2 s apart: re-timing every row at 0.1 s would halve the
    recording's time (and double its speed-times-time distance in the replay); the others keep their times."""
    _sim_recording(tmp_path / "rec", offsets_s=tuple(round(0.2 * k, 1) for k in range(20)))
    victim = sorted((tmp_path / "rec" / "IMG").glob("center_*"))[4]
    victim.rename(victim.with_name("center_renamed.jpg"))
    log = tmp_path / "rec" / "driving_log.csv"
    log.write_text(log.read_text().replace(victim.name, "center_renamed.jpg"))
    warnings = []
    back = open_dataset(ui.import_udacity(tmp_path / "rec", tmp_path / "data", warn=warnings.append))
    assert back.num_steps == 19 and back.card["import"]["undated_rows_dropped"] == 1
    np.testing.assert_allclose(back.load(0, keys=["time"])["time"], [0.2 * k for k in range(20) if k != 4], atol=1e-6)
    assert back.card["import"]["time_from"].startswith("timestamps")
    assert warnings == [f"warning: 1 of the 20 image names of {log} carry no time (first: line 5, "
                        "'center_renamed.jpg'): their rows are dropped, the other 19 keep the times in their names"]


# ------------------------------------------------------------------ how train.py takes the recordings it is given
def test_the_same_recording_twice_or_its_csv_is_taken_once(tmp_path, capsys):
    _sim_recording(tmp_path / "rec", offsets_s=OFFSETS)
    rec, csv_path = str(tmp_path / "rec"), str(tmp_path / "rec" / "driving_log.csv")
    assert train.main(["--data", rec, csv_path, "--out", str(tmp_path / "run"), "--split", "blocks", *TINY]) == 0
    out = capsys.readouterr().out
    assert f"{csv_path} names the same data as {rec}, given before it: taken once" in out
    assert sorted(p.name for p in (tmp_path / "run" / "imported_data").iterdir()) == ["0"]
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["time_blocks"] == [[0, 0, 12], [0, 16, 20]], "one session, held out once"
    # the CSV alone is its recording's folder, and a run made from it resumes given the folder
    assert train.main(["--data", csv_path, "--out", str(tmp_path / "csv"), *TINY]) == 0
    assert open_dataset(tmp_path / "csv" / "imported_data").num_steps == 20
    assert train.main(["--resume", "--out", str(tmp_path / "csv"), "--data", rec]) == 0


def test_a_run_refused_after_the_import_removes_what_it_imported(tmp_path, capsys):
    _sim_recording(tmp_path / "rec", offsets_s=OFFSETS)
    ok = ["--data", str(tmp_path / "rec"), "--out", str(tmp_path / "run"), *TINY]
    refused = list(ok)
    refused[refused.index("--window") + 1] = "30"
    assert train.main(refused) == 2
    assert "more than the longest episode" in capsys.readouterr().err
    assert not (tmp_path / "run").exists(), "no import, no folder left behind"
    # an import an earlier run made is that run's data: a later refusal that reused it keeps it
    assert train.main(ok) == 0
    assert train.main(refused + ["--overwrite"]) == 2
    assert (tmp_path / "run" / "imported_data" / "dataset.json").is_file()


def test_a_full_disk_during_the_import_is_one_line_and_leaves_nothing(tmp_path, monkeypatch, capsys):
    from tests.helpers import full_disk

    _sim_recording(tmp_path / "rec", offsets_s=OFFSETS)
    full_disk(monkeypatch, ".dataset.json.")
    assert uf.main(["import", str(tmp_path / "rec"), "--out", str(tmp_path / "data")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: no space left on the disk while writing ") and \
        err[0].endswith("dataset.json'; free some space and run the command again"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rec"], "no dataset, no staging folder"
