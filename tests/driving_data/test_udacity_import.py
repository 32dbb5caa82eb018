"""A recording as the Udacity simulator writes it, imported as a dataset: the simulator's layout and its variants
(a header row, no timestamps, one camera), clear errors naming the CSV line, stretches of reversing cut, and an
import reused only while it was made from the same recording by the same rule."""
import json
from datetime import datetime, timedelta

import cv2
import numpy as np
import pytest

from driving_data import udacity_import as ui
from driving_data.dataset import open_dataset
from driving_data.frames import encode_jpeg
from tests.driving_data.test_dataset import _road


# ------------------------------------------------------------------ recordings as the simulator writes them
START = datetime(2016, 12, 1, 13, 30, 48, 287000)


def _sim_recording(root, offsets_s=(0, 0.1, 0.2, 0.3, 5.0, 5.1), header=False, rows=None, windows=True):
    """IMG/ + driving_log.csv the way the simulator writes them on Windows: absolute paths with
    backslashes and a space after each comma."""
    img = root / "IMG"
    img.mkdir(parents=True)
    frames = _road(len(offsets_s), 7)
    lines = ["center,left,right,steering,throttle,brake,speed"] if header else []
    for k, off in enumerate(offsets_s):
        t = START + timedelta(seconds=off)
        stamp = f"{t:%Y_%m_%d_%H_%M_%S}_{t.microsecond // 1000:03d}"
        paths = []
        for cam in ("center", "left", "right"):
            name = f"{cam}_{stamp}.jpg"
            (img / name).write_bytes(encode_jpeg(frames[k], 75))
            paths.append(f"C:\\Users\\me\\Desktop\\track1\\IMG\\{name}" if windows else f"/home/me/track1/IMG/{name}")
        lines.append(", ".join([*paths, f"{-0.05 * k + 0.0:g}", "0.9", "0", f"{20 + k}.5"]))
    if rows is not None:
        lines = rows(lines)
    (root / "driving_log.csv").write_text("\n".join(lines) + "\n")
    return frames


def test_import_real_simulator_layout(tmp_path):
    _sim_recording(tmp_path / "rec")
    back = open_dataset(ui.import_udacity(tmp_path / "rec", tmp_path / "data"))
    assert [m["length"] for m in back.episodes] == [4, 2], "the 4.7 s pause starts a new episode"
    assert back.episodes[0]["start_time"] == "2016-12-01T13:30:48.287" and back.episodes[1]["csv_lines"] == [5, 6]
    ep = back.load(1)
    np.testing.assert_allclose(ep["time"], [0, 0.1], atol=1e-9)
    np.testing.assert_allclose(ep["expert_action"][:, 0], [-0.2, -0.25])
    np.testing.assert_allclose(ep["speed"], np.array([24.5, 25.5]) / 2.23694, rtol=1e-6)
    np.testing.assert_allclose(ep["throttle"], 0.9)
    name = "center_2016_12_01_13_30_53_387.jpg"
    kept = (tmp_path / "rec" / "IMG" / name).read_bytes()
    assert back.jpeg_frames(1, "frames")[1] == kept, "files kept byte for byte"
    assert back.card["import"]["time_from"].startswith("timestamps")


def test_import_accepts_header_csv_path_and_reencodes(tmp_path):
    frames = _sim_recording(tmp_path / "rec", header=True, windows=False)
    back = open_dataset(ui.import_udacity(tmp_path / "rec" / "driving_log.csv", tmp_path / "data", jpeg_quality=90))
    assert back.num_steps == 6 and back.episodes[0]["csv_lines"] == [2, 5]
    assert back.episodes[0]["frame_codec"]["frames"] == "jpeg90"
    assert np.abs(back.load(0, keys=["frames"])["frames"].astype(int) - frames[:4]).mean() < 3


def test_import_without_timestamps_uses_the_frame_period(tmp_path):
    _sim_recording(tmp_path / "rec")
    for f in (tmp_path / "rec" / "IMG").iterdir():  # a tool that renamed the images
        f.rename(f.with_name(f.name.replace("2016_12_01_", "x")))
    log = tmp_path / "rec" / "driving_log.csv"
    log.write_text(log.read_text().replace("2016_12_01_", "x"))
    back = open_dataset(ui.import_udacity(tmp_path / "rec", tmp_path / "data", frame_period=0.05))
    assert len(back) == 1 and back.num_steps == 6
    np.testing.assert_allclose(back.load(0, keys=["time"])["time"], np.arange(6) * 0.05)


BAD_ROWS = {
    "columns": (lambda ls: ls[:2] + [", ".join(ls[2].split(", ")[:4])] + ls[3:],
                r"driving_log.csv line 3: expected 7 columns "
                r"\(center,left,right,steering,throttle,brake,speed\), got 4"),
    "steering": (lambda ls: ls[:1] + [ls[1].replace("-0.05,", "left,")] + ls[2:],
                 r"line 2: steering 'left' is not a number"),
    "throttle": (lambda ls: ls[:3] + [ls[3].replace(" 0.9,", " ,")] + ls[4:],
                 r"line 4: throttle '' is not a number"),
    "brake": (lambda ls: ls[:4] + [ls[4].replace(" 0,", " nan,")] + ls[5:],
              r"line 5: brake 'nan' is not a finite number"),
    "speed": (lambda ls: ls[:5] + [ls[5].replace("25.5", "25.5mph")] + ls[6:],
              r"line 6: speed '25.5mph' is not a number"),
    "range": (lambda ls: [ls[0].replace(", 0, 0.9", ", 1.5, 0.9")] + ls[1:],
              r"line 1: steering 1.5 is outside \[-1, 1\]"),
    "image": (lambda ls: ls[:3] + [ls[3].replace("left_", "lfet_")] + ls[4:],
              r"line 4: left image 'lfet_2016_12_01_13_30_48_587.jpg'"),
}


@pytest.mark.parametrize("case", sorted(BAD_ROWS))
def test_malformed_logs_name_the_line(tmp_path, case):
    edit, message = BAD_ROWS[case]
    _sim_recording(tmp_path / "rec", rows=edit)
    error = FileNotFoundError if case == "image" else ValueError
    with pytest.raises(error, match=message):  # a missing image is an error only when asked (see below)
        ui.import_udacity(tmp_path / "rec", tmp_path / "data", strict_images=case == "image")
    assert not (tmp_path / "data").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_missing_logs_and_empty_csv(tmp_path):
    (tmp_path / "rec" / "IMG").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="has no driving_log.csv"):
        ui.import_udacity(tmp_path / "rec", tmp_path / "data")
    (tmp_path / "rec" / "driving_log.csv").write_text("\n\n")
    with pytest.raises(ValueError, match="holds no usable rows"):
        ui.import_udacity(tmp_path / "rec", tmp_path / "data")
    (tmp_path / "rec" / "IMG").rmdir()
    with pytest.raises(FileNotFoundError, match="has no IMG/ folder"):
        ui.import_udacity(tmp_path / "rec", tmp_path / "data")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ui.import_udacity(tmp_path / "nope", tmp_path / "data")


def test_import_refuses_non_jpeg_without_quality(tmp_path):
    frames = _sim_recording(tmp_path / "rec")
    victim = sorted((tmp_path / "rec" / "IMG").glob("right_*"))[2]
    victim.write_bytes(cv2.imencode(".png", frames[2])[1].tobytes())
    with pytest.raises(ValueError, match=f"line 3: image '{victim.name}' is not a JPEG"):
        ui.import_udacity(tmp_path / "rec", tmp_path / "data")


def test_center_only_recordings_and_the_bridge_s_own_recordings_import(tmp_path):
    """Users who record one camera, and the bridge's --record folders (center column only, empty sides)."""
    from agent.udacity.bridge import Recorder

    rec = Recorder(tmp_path / "bridge")
    frames = _road(5, 1)
    for k in range(5):
        rec.add(encode_jpeg(frames[k], 90), steering=0.1 * k, throttle=0.3, speed_mph=8.02615e-05 if k == 0 else 12.0)
    rec.close()
    back = open_dataset(ui.import_udacity(tmp_path / "bridge", tmp_path / "data"))
    assert back.num_steps == 5 and back.card["cameras"] == {"frames": "center"}
    assert sorted(back.array_names(0)) == sorted(["frames", "action", "expert_action", "reward", "speed", "throttle",
                                                  "brake", "privileged", "time"])
    np.testing.assert_allclose(back.load(0, keys=["expert_action"])["expert_action"][:, 0], [0, 0.1, 0.2, 0.3, 0.4],
                               atol=1e-6)
    # a recording whose side columns are logged for some rows and not for others: center only, for every row
    _sim_recording(tmp_path / "mixed",
                   rows=lambda ls: [", ".join([ls[0].split(", ")[0], "", "", *ls[0].split(", ")[3:]])] + ls[1:])
    assert open_dataset(ui.import_udacity(tmp_path / "mixed", tmp_path / "m")).card["cameras"] == {"frames": "center"}


def test_a_folder_holding_a_recording_one_level_down_says_where_it_is(tmp_path):
    _sim_recording(tmp_path / "downloads" / "track2")
    with pytest.raises(FileNotFoundError, match="it holds track2/: point at that folder"):
        open_dataset(tmp_path / "downloads")


# ------------------------------------------------------------------ stopping and reversing is cut
def _turnaround(lines):
    """200 rows 0.1 s apart: 20 mph, braking to a stop at row 84, reversing under the brake (rows 85-100), standing
    (101-104), 20 mph again; the speed in the log has no sign, as the simulator writes it."""
    out = []
    for k, line in enumerate(lines):
        speed, brake = ((15, 10, 5, 2)[k - 80], 1) if 80 <= k < 84 else (0.5, 1) if k == 84 else \
            (0.5 + 0.3 * (k - 84), 1) if 85 <= k <= 100 else (0.2, 0) if 101 <= k <= 104 else (20, 0)
        fields = line.split(", ")
        out.append(", ".join([*fields[:3], "0", "0" if brake else "0.9", str(brake), f"{speed:g}"]))
    return out


def test_reversing_is_cut_and_the_session_split_there(tmp_path):
    _sim_recording(tmp_path / "rec", offsets_s=tuple(round(0.1 * k, 1) for k in range(200)), rows=_turnaround)
    warnings = []
    back = open_dataset(ui.import_udacity(tmp_path / "rec", tmp_path / "data", warn=warnings.append))
    # events: the stop at row 84 to the standing at row 104; 5 s either side: rows 34..154 go
    assert [m["csv_lines"] for m in back.episodes] == [[1, 34], [156, 200]] and back.num_steps == 79
    assert back.card["import"]["reversing"]["cut"] == [{"csv_lines": [35, 155], "frames": 121, "seconds": 12.0}]
    assert len(warnings) == 1 and warnings[0].startswith("cut 1 stretch(es)") and "--keep-reversing" in warnings[0]
    np.testing.assert_allclose(back.load(1)["time"][0], 0.0)  # each piece is an episode of its own
    kept = open_dataset(ui.import_udacity(tmp_path / "rec", tmp_path / "kept", keep_reversing=True))
    assert kept.num_steps == 200 and len(kept) == 1 and kept.card["import"]["reversing"] == {"rule": "kept", "cut": []}


def test_slow_driving_and_braking_downhill_are_not_reversing():
    t = np.arange(60) * 0.1
    hairpin = np.r_[np.full(20, 12.0), np.linspace(12, 0.3, 10), np.full(5, 0.3), np.linspace(1, 12, 25)]
    assert ui.reversing_spans(hairpin, np.r_[np.zeros(20), np.ones(15), np.zeros(25)], t) == [], \
        "a stop without reversing (a hairpin at walking pace) stays"
    downhill = np.r_[np.full(30, 4.0), [4.2, 4.4], np.full(28, 4.4)]
    assert ui.reversing_spans(downhill, np.ones(60), t) == [], "the brake held while the speed creeps up two rows"
    fast = np.r_[np.full(30, 8.0), np.linspace(8, 12, 10), np.full(20, 12.0)]
    assert ui.reversing_spans(fast, np.ones(60), t) == [], "rising under the brake from well above walking pace"
    t = np.arange(200) * 0.1  # backing off a wall: standing at rows 60-66, reversing 65-74, then on; 5 s either side
    backing = np.r_[np.full(60, 10.0), np.full(5, 0.2), np.linspace(0.5, 4, 10), np.full(125, 10.0)]
    assert ui.reversing_spans(backing, np.r_[np.zeros(65), np.ones(10), np.zeros(125)], t) == [(10, 125)]


def test_an_import_cut_by_another_rule_is_imported_again(tmp_path, capsys):
    rec, target = tmp_path / "rec", tmp_path / "data"
    _sim_recording(rec)
    said = []
    ui.import_recordings([rec], [target], warn=said.append)
    card = json.loads((target / "dataset.json").read_text())
    del card["import"]["reversing"]  # an import made before stretches of reversing were cut
    (target / "dataset.json").write_text(json.dumps(card))
    ui.import_recordings([rec], [target], warn=said.append)
    assert "is cut by another rule (stops and reversing) than the import" in said[-1]
    assert json.loads((target / "dataset.json").read_text())["import"]["reversing"]["rule"] == ui.REVERSING_RULE
