"""The Udacity simulator's recording format from the command line: export, the round trip, import refusals in one
line, and recordings trained on and scored offline."""
import csv
import json

import numpy as np
import pytest

from agent.training.windows import WindowDataset
from agent.udacity import recordings as uf
from driving_data import udacity_import as ui
from driving_data import udacity_log as ul
from driving_data.dataset import open_dataset, write_episode
from tests.driving_data.test_dataset import _road
from tests.driving_data.test_udacity_import import _sim_recording


def _write_dataset(root, lengths=(5, 4), jpeg_quality=95, cameras=True, meta=None):
    """Episodes laid out as the udacity env records them (three cameras, steering [T, 1], m/s)."""
    for e, T in enumerate(lengths):
        rng = np.random.default_rng(e)
        label = rng.uniform(-0.9, 0.9, (T, 1)).astype(np.float32)
        arrays = {
            "frames": _road(T, 3 * e),
            "action": np.clip(label + rng.normal(0, 0.1, (T, 1)), -1, 1).astype(np.float32),
            "expert_action": label,
            "reward": rng.normal(size=T).astype(np.float32),
            "speed": rng.uniform(0, 12, T).astype(np.float32),
            "throttle": rng.uniform(0, 1, T).astype(np.float32),
            "privileged": rng.normal(size=(T, 4)).astype(np.float32),
            "time": np.arange(T) * 0.05 + rng.uniform(0, 0.004, T),
        }
        if cameras:
            arrays["frames_left"], arrays["frames_right"] = _road(T, 3 * e + 1), _road(T, 3 * e + 2)
        write_episode(root, e, arrays, {"env": "udacity", "theme": "day", "track_seed": e, **(meta or {})},
                      jpeg_quality=jpeg_quality)
    return open_dataset(root)


def _read_csv(path):
    with open(path, newline="") as f:
        return list(csv.reader(f))


def test_export_import_round_trip(tmp_path):
    ds = _write_dataset(tmp_path / "data")
    csv_path = uf.export_udacity(tmp_path / "data", tmp_path / "log")
    rows = _read_csv(csv_path)
    assert len(rows) == 9 and all(len(r) == 7 for r in rows), "no header, one row per step"
    names = [r[0].rsplit("/", 1)[1] for r in rows]
    assert names == sorted(names) and names[0].startswith("center_")
    assert rows[0][1].rsplit("/", 1)[1].startswith("left_")
    assert all(r[0].startswith(str((tmp_path / "log").resolve())) for r in rows), "absolute paths of the written images"
    assert len(list((tmp_path / "log" / "IMG").iterdir())) == 27
    first = ds.load(0)
    assert np.float32(rows[0][3]) == first["action"][0, 0], "the steering that moved the car, read back exactly"
    assert float(rows[0][6]) == pytest.approx(first["speed"][0] * 2.23694, rel=1e-6), "speed in mph"
    assert ds.jpeg_frames(0, "frames")[0] == (tmp_path / "log" / "IMG" / names[0]).read_bytes(), "JPEG bytes copied"

    out = ui.import_udacity(tmp_path / "log", tmp_path / "back")
    back = open_dataset(out)
    assert [m["length"] for m in back.episodes] == [5, 4], "episodes split where the exporter left a gap"
    assert back.card["counts"]["episodes"] == 2 and back.card["counts"]["steps"] == 9
    assert back.card["frame_shape"] == [160, 320, 3] and back.card["source"] == "udacity-recording"
    assert back.episodes[1]["csv_lines"] == [6, 9] and back.episodes[0]["env"] == "udacity"
    for i in range(2):
        a, b = ds.load(i), back.load(i)
        np.testing.assert_array_equal(b["expert_action"], a["action"])
        np.testing.assert_array_equal(b["action"], a["action"])
        np.testing.assert_array_equal(b["throttle"], a["throttle"])
        np.testing.assert_allclose(b["speed"], a["speed"], rtol=1e-6)
        np.testing.assert_array_equal(b["brake"], np.zeros(len(a["time"]), np.float32))
        np.testing.assert_allclose(b["time"], a["time"] - a["time"][0], atol=1.1e-3)
        for k in ("frames", "frames_left", "frames_right"):
            np.testing.assert_array_equal(b[k], a[k])
            assert back.jpeg_frames(i, k).data.tobytes() == ds.jpeg_frames(i, k).data.tobytes()
        assert b["privileged"].shape == (len(a["time"]), 0) and not b["reward"].any()
    w = WindowDataset(back, window=3)  # trainable as is
    assert len(w) == 9 and w[0]["target"].shape == (1,)
    # what the replay needs and the format cannot say travels beside the CSV and stays in the import's card
    exported = json.loads((tmp_path / "log" / ul.EXPORT_CARD).read_text())
    assert exported["env"] == "udacity" and exported["steering"] == "action" and exported["steering_moved_the_car"]
    assert exported["geometry"]["cam_height_m"] == 1.5 and exported["dart_noise"] == 0.0
    assert back.card["import"]["exported"] == exported


def test_export_expert_labels_and_raw_frames(tmp_path):
    ds = _write_dataset(tmp_path / "data", lengths=(3,), jpeg_quality=None, meta={"noise": 0.1})
    rows = _read_csv(uf.export_udacity(tmp_path / "data", tmp_path / "log", label="expert_action"))
    np.testing.assert_array_equal(np.float32([r[3] for r in rows]), ds.load(0)["expert_action"][:, 0])
    exported = json.loads((tmp_path / "log" / ul.EXPORT_CARD).read_text())
    assert exported["steering"] == "expert_action" and not exported["steering_moved_the_car"]
    assert exported["dart_noise"] == 0.1
    back = open_dataset(ui.import_udacity(tmp_path / "log", tmp_path / "back"))
    err = np.abs(back.load(0)["frames_right"].astype(int) - ds.load(0)["frames_right"]).mean()
    assert err < 2.0, "raw frames are JPEG-encoded once on export"


def test_export_refusals(tmp_path):
    _write_dataset(tmp_path / "center_only", lengths=(2,), cameras=False)
    with pytest.raises(ValueError, match="lacks left/right cameras"):
        uf.export_udacity(tmp_path / "center_only", tmp_path / "log")
    _write_dataset(tmp_path / "data", lengths=(2,))
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="exists and is not empty"):
        uf.export_udacity(tmp_path / "data", tmp_path / "busy")
    with pytest.raises(ValueError, match="label must be one of"):
        uf.export_udacity(tmp_path / "data", tmp_path / "log", label="steer")
    assert not (tmp_path / "log").exists()
    (tmp_path / "empty").mkdir()
    uf.export_udacity(tmp_path / "data", tmp_path / "empty")  # an existing empty folder is fine
    assert (tmp_path / "empty" / "driving_log.csv").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "no staging folder left behind"


def test_cli(tmp_path, capsys):
    _sim_recording(tmp_path / "rec")
    assert uf.main(["import", str(tmp_path / "rec"), "--out", str(tmp_path / "data")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("imported 2 episodes, 6 steps (") and out.count("\n") == 1
    assert uf.main(["export", str(tmp_path / "data"), "--out", str(tmp_path / "log")]) == 0
    assert capsys.readouterr().out.startswith("exported 2 episodes, 6 steps (18 images, ")
    assert uf.main(["export", str(tmp_path / "data"), "--out", str(tmp_path / "log")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: output folder") and err.count("\n") == 1
    with pytest.raises(SystemExit) as e:
        uf.main(["import", str(tmp_path / "rec")])
    assert e.value.code == 2 and capsys.readouterr().err.startswith("error: the following arguments are required")
    with pytest.raises(SystemExit) as e:
        uf.main(["import", "--help"])
    assert e.value.code == 0 and "--episode-gap" in capsys.readouterr().out


def test_rows_with_missing_images_are_skipped_and_counted(tmp_path):
    """A user deleted a few bad frames: a row without its center image goes, one without a side image keeps its
    center frame (the recording then center-only), each said in one warning and counted in the card."""
    _sim_recording(tmp_path / "rec")
    for name in ("center_2016_12_01_13_30_48_487.jpg", "right_2016_12_01_13_30_53_387.jpg"):
        (tmp_path / "rec" / "IMG" / name).unlink()
    warnings = []
    back = open_dataset(ui.import_udacity(tmp_path / "rec", tmp_path / "data", warn=warnings.append))
    assert back.num_steps == 5 and [m["csv_lines"] for m in back.episodes] == [[1, 4], [5, 6]]
    assert len(warnings) == 2 and warnings[0].startswith("warning: 1 of 5 rows") and "line 6" in warnings[0]
    assert warnings[1].startswith("warning: skipped 1 of 6 rows") and "line 3" in warnings[1]
    assert back.card["import"]["skipped_rows"] == 1 and back.card["import"]["skipped_examples"][0]["line"] == 3
    assert back.card["cameras"] == {"frames": "center"}
    assert back.card["import"]["rows_missing_side_images"] == {
        "rows": 1, "left": 0, "right": 1, "examples": [{"line": 6, "images": ["right_2016_12_01_13_30_53_387.jpg"]}]}
    assert uf.main(["import", str(tmp_path / "rec"), "--out", str(tmp_path / "strict"), "--strict-images"]) == 2
    for f in (tmp_path / "rec" / "IMG").iterdir():
        f.unlink()
    with pytest.raises(ValueError, match="all 6 name images missing"):
        ui.import_udacity(tmp_path / "rec", tmp_path / "none", warn=warnings.append)


def test_a_one_session_recording_trains_with_the_default_command(tmp_path):
    """The most common recording (drive, stop recording) has no pause: train.py splits it in time blocks."""
    from agent.training.config import TrainArgs, resolve
    from agent.training.experiment import run

    _sim_recording(tmp_path / "rec", offsets_s=tuple(round(0.1 * k, 1) for k in range(20)))
    run(resolve(TrainArgs(data=str(tmp_path / "rec"), out=str(tmp_path / "run"), epochs=1, batch_size=8, segment=8,
                  window=2, frame_stride=1, feature_dim=8, d_model=16, heads=4, threads=1,
                  progress=False)))
    metrics = __import__("json").loads((tmp_path / "run" / "metrics.json").read_text())
    # the last 20 % validates; the gap before it is the larger of one window (2 steps) and half the 0.5 s label
    # average (0.25 s at 0.1 s a frame: 3 steps, +1), so no training input or averaged label sees a validation frame
    assert metrics["time_blocks"] == [[0, 0, 12], [0, 16, 20]]


def test_several_recordings_train_as_one(tmp_path):
    """--data A B with raw recordings: each is imported into the run folder, then they are read as one dataset."""
    from agent.training.config import TrainArgs, resolve
    from agent.training.experiment import run

    _sim_recording(tmp_path / "a")
    _sim_recording(tmp_path / "b", offsets_s=(0, 0.1, 0.2))
    run(resolve(TrainArgs(data=[str(tmp_path / "a"), str(tmp_path / "b")], out=str(tmp_path / "run"), epochs=1,
                          batch_size=8,
                  segment=8, window=2, frame_stride=1, feature_dim=8, d_model=16, heads=4, threads=1, progress=False,
                  split="episodes")))  # sessions of 2-4 rows: too short to hold out in time
    assert [open_dataset(tmp_path / "run" / "imported_data" / k).num_steps for k in ("0", "1")] == [6, 3]
    metrics = __import__("json").loads((tmp_path / "run" / "metrics.json").read_text())
    assert sorted(metrics["train_episodes"] + metrics["val_episodes"]) == [0, 1, 2], "3 sessions split by episode"


def test_real_recordings_train_with_simulator_data_and_only_the_recordings_validate(tmp_path):
    """--data REC SIM: a person's sessions join an expert's simulator episodes; the split holds out recorded sessions
    only, only their labels are averaged (the expert's are what it meant), and the label-shifting augmentations
    stay off as for recordings alone."""
    import json

    from agent.training.config import TrainArgs, resolve, with_env_defaults
    from agent.training.data import load_data
    from agent.training.experiment import run

    _sim_recording(tmp_path / "rec", offsets_s=(0, 0.1, 0.2, 0.3, 5.0, 5.1, 5.2, 9.0, 9.1, 9.2))
    rec = ui.import_udacity(tmp_path / "rec", tmp_path / "rec_data")
    sim = _write_dataset(tmp_path / "sim", lengths=(6, 5, 7), meta={"action_space": "continuous"}).root
    plan = with_env_defaults(resolve(TrainArgs(data=[str(rec), str(sim)], out=str(tmp_path / "run"), epochs=1,
                                               batch_size=8, segment=8, window=2, frame_stride=1, feature_dim=8,
                                               d_model=16, heads=4, threads=1, progress=False, seed=3)))
    assert (plan.augmentation.side_correction, plan.augmentation.shift_steer) == (0.0, 0.0)
    data = load_data(plan.data)
    assert data.recorded == [True, True, True, False, False, False]
    raw = open_dataset(sim).load(0, keys=["expert_action"])["expert_action"]
    np.testing.assert_array_equal(data.targets[3], raw)  # the expert's labels are not averaged
    assert not np.allclose(data.targets[0], open_dataset(rec).load(0, keys=["expert_action"])["expert_action"])
    run(plan)
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["val_episodes"] and set(metrics["val_episodes"]) <= {0, 1, 2}
    assert {3, 4, 5} <= set(metrics["train_episodes"])
    # a recording joined with another env's data: one clear error
    other = _write_dataset(tmp_path / "other", lengths=(3,),
                           meta={"env": "carracing", "action_space": "continuous"}).root
    with pytest.raises(ValueError, match="differs from .* in its env"):
        load_data(resolve(TrainArgs(data=[str(rec), str(other)])).data)


def test_recordings_with_and_without_side_cameras_train_together(tmp_path):
    """A user's center-camera recording beside recordings with side cameras (--rehearsal, a pool) joins on the
    center camera; asking for the side cameras then is one clear error, not a silent center-only run."""
    from agent.training.config import TrainArgs, resolve, with_env_defaults
    from agent.training.data import load_data

    def center_only(lines):
        return [", ".join([line.split(", ")[0], "", "", *line.split(", ")[3:]]) for line in lines]

    _sim_recording(tmp_path / "three")
    _sim_recording(tmp_path / "one", rows=center_only)
    paths = [str(ui.import_udacity(tmp_path / name, tmp_path / f"{name}_data")) for name in ("one", "three")]
    assert sorted(open_dataset(paths[1]).array_names(0)) != sorted(open_dataset(paths[0]).array_names(0))
    data = load_data(with_env_defaults(resolve(TrainArgs(data=paths, out=str(tmp_path / "run")))).data)
    assert data.num_episodes == 4 and data.side_frames == {}
    sides = with_env_defaults(resolve(TrainArgs(data=paths, out=str(tmp_path / "run"), side_correction=0.2)))
    with pytest.raises(ValueError, match="2 of 4 episodes .* have none: give --side-correction 0"):
        load_data(sides.data)


def test_offline_evaluation_on_a_recording_scores_against_the_trivial_predictors(tmp_path, capsys):
    """evaluate.py --data REC --checkpoint CKPT: a policy that always steers 0.1, scored on a raw recording;
    its numbers are checked against ones computed here, and the plot is a real PNG."""
    import json

    import cv2

    import evaluate
    from driving_data.labels import centred_average
    from tests.helpers import steering_checkpoint

    offsets = tuple(round(0.1 * k, 1) for k in range(12)) + (5.0, 5.1, 5.2)
    _sim_recording(tmp_path / "rec", offsets_s=offsets)
    steering_checkpoint(tmp_path / "const.pt", 0.1)
    out = tmp_path / "eval"
    assert evaluate.main(["--data", str(tmp_path / "rec"), "--checkpoint", str(tmp_path / "const.pt"),
                          "--out", str(out), "--no-progress"]) == 0
    result = json.loads((out / "offline.json").read_text())
    steer = [np.array([-0.05 * k for k in range(12)]), np.array([-0.6, -0.65, -0.7])]
    times = [np.arange(12) * 0.1, np.array([0, 0.1, 0.2])]
    assert [s["frames"] for s in result["sessions"]] == [12, 3]
    for row, y, t in zip(result["sessions"], steer, times):
        assert row["policy_raw"]["mse"] == pytest.approx(np.mean((0.1 - y) ** 2), rel=1e-4)
        assert row["straight_avg"]["mse"] == pytest.approx(np.mean(centred_average(t, y) ** 2), rel=1e-6)
        assert row["mean_raw"]["mae"] == pytest.approx(np.mean(np.abs(0.02 - y)), rel=1e-5)
    all_y = np.concatenate(steer)
    assert result["pooled"]["straight_raw"]["mse"] == pytest.approx(np.mean(all_y ** 2))
    assert cv2.imread(str(out / "steering_1.png")).shape == (360, 1400, 3)
    assert "| always straight |" in (out / "offline.md").read_text()
    assert "steering MSE" in capsys.readouterr().out  # tqdm.write: stdout
    # --data-span 0.5:1 scores the second half of every session, its average still seeing the frames before it
    assert evaluate.main(["--data", str(tmp_path / "rec"), "--checkpoint", str(tmp_path / "const.pt"),
                          "--data-span", "0.5:1", "--out", str(tmp_path / "half"), "--no-progress"]) == 0
    half = json.loads((tmp_path / "half" / "offline.json").read_text())
    assert [s["frames"] for s in half["sessions"]] == [6, 2] and half["span"] == [0.5, 1.0]
    for row, y, t, start in zip(half["sessions"], steer, times, (6, 1)):
        assert row["policy_raw"]["mse"] == pytest.approx(np.mean((0.1 - y[start:]) ** 2), rel=1e-4)
        assert row["straight_avg"]["mse"] == pytest.approx(np.mean(centred_average(t, y)[start:] ** 2), rel=1e-6)
    for argv, needle in ((["--data-span", "0.5"], "--data-span takes A:B"),
                         (["--data-span", "0.9:0.2"], "--data-span A:B needs 0 <= A < B <= 1"),
                         (["--data-span", "0.95:1"], "holds two frames in the span")):
        capsys.readouterr()
        assert evaluate.main(["--data", str(tmp_path / "rec"), "--checkpoint", str(tmp_path / "const.pt"), *argv,
                              "--out", str(tmp_path / "bad"), "--no-progress"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0], err
    assert evaluate.main(["--data-span", "0.5:1", "--checkpoint", str(tmp_path / "const.pt")]) == 2
    assert "give --data REC" in capsys.readouterr().err
    # a checkpoint of the other env: one line, exit 2
    assert evaluate.main(["--data", str(tmp_path / "rec"), "--checkpoint", "checkpoints/carracing_nac.pt",
                          "--out", str(tmp_path / "e2")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "UdacityStyle-v0" in err[0]


def test_a_recording_of_nothing_but_reversing_says_so(tmp_path, capsys):
    def backwards(lines):
        return [", ".join([*line.split(", ")[:3], "0", "0", "1", f"{0.2 + 0.5 * k:g}"]) for k, line in enumerate(lines)]

    _sim_recording(tmp_path / "rec", offsets_s=tuple(round(0.1 * k, 1) for k in range(8)), rows=backwards)
    assert uf.main(["import", str(tmp_path / "rec"), "--out", str(tmp_path / "data")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "nothing but stops and reversing" in err and err.count("\n") == 1
    assert uf.main(["import", str(tmp_path / "rec"), "--out", str(tmp_path / "data"), "--keep-reversing"]) == 0


def test_an_export_card_is_part_of_what_an_import_was_made_from(tmp_path, capsys):
    """Editing the card beside an exported CSV changes what its replay rests on: the recording is imported again; a
    card that is not the exporter's JSON is one line naming it."""
    _write_dataset(tmp_path / "data")
    uf.export_udacity(tmp_path / "data", tmp_path / "log")
    said, target = [], tmp_path / "imported"
    ui.import_recordings([tmp_path / "log"], [target], warn=said.append)
    ui.import_recordings([tmp_path / "log"], [target], warn=said.append)
    assert len(said) == 1  # the same export: reused
    card = tmp_path / "log" / ul.EXPORT_CARD
    card.write_text(card.read_text().replace('"dart_noise": 0.0', '"dart_noise": 0.2'))
    ui.import_recordings([tmp_path / "log"], [target], warn=said.append)
    assert "has changed since the import" in said[-1]
    assert json.loads((target / "dataset.json").read_text())["import"]["exported"]["dart_noise"] == 0.2
    card.write_text("{not json")
    assert uf.main(["import", str(tmp_path / "log"), "--out", str(tmp_path / "again")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{str(card)!r} is not the JSON the exporter writes" in err
