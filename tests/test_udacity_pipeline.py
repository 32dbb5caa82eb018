"""The udacity env through the whole product: collect (3 cameras, JPEG) -> train (PilotNet recipe) -> evaluate
(interventions, autonomy), with the shipped udacity expert, real files and real closed-loop episodes."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import imageio.v3 as iio
import numpy as np
import pytest

import collect as collect_cli
from driving_data.dataset import open_dataset
from agent.evaluation.args import EvalArgs
from agent.evaluation.config import resolve as resolve_eval
from agent.evaluation.evaluate import evaluate
from agent.experts.expert import Expert
from agent.training.config import TrainArgs, resolve
from agent.training.experiment import run
from agent.udacity.recordings import export_udacity
from driving_data.udacity_import import import_udacity
from envs.registry import get_spec
from tests.helpers import steering_checkpoint

SPEC = get_spec("udacity")
STEPS = 40


@pytest.fixture(scope="module")
def udacity_ds(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ud") / "data"
    code = collect_cli.main(["--env", "udacity", "--episodes", "2", "--max-steps", str(STEPS), "--out", str(out),
                             "--no-progress"])
    assert code == 0
    return out


def test_collect_records_three_cameras_as_jpeg_with_telemetry(udacity_ds):
    ds = open_dataset(udacity_ds)
    card = ds.card
    assert card["env"] == "udacity" and card["gym_id"] == "UdacityStyle-v0"
    assert card["frame_shape"] == [160, 320, 3] and card["cameras"] == ["frames", "frames_left", "frames_right"]
    assert card["action_names"] == ["steer"] and card["counts"]["steps"] == 2 * STEPS
    themes = [m["theme"] for m in ds.episodes]
    assert themes == ["lake", "jungle"], "consecutive seeds alternate the two themes"
    ep = ds.load(0)
    assert ep["frames"].shape == ep["frames_left"].shape == ep["frames_right"].shape == (STEPS, 160, 320, 3)
    assert ep["action"].shape == ep["expert_action"].shape == (STEPS, 1)
    for key in ("throttle", "cte", "heading_error", "steering_angle"):
        assert ep[key].shape == (STEPS,)
    assert ds.jpeg_frames(0, "frames_left") is not None, "camera frames are stored as JPEG"
    # the side cameras see the road from 1 m to each side: they differ from the center view
    assert np.abs(ep["frames_left"].astype(int) - ep["frames"]).mean() > 2
    # the label is the expert's on the recorded state
    expert = Expert.load(None, None, "udacity")
    np.testing.assert_allclose(ep["expert_action"][5], expert.act(ep["privileged"][5]), atol=1e-6)


def test_train_on_udacity_data_uses_the_pilotnet_recipe(udacity_ds, tmp_path):
    out = tmp_path / "train"
    run(resolve(TrainArgs(data=str(udacity_ds), out=str(out), policy="nac", epochs=1, window=3, batch_size=16,
                          segment=8,
                  feature_dim=16, d_model=16, heads=4, threads=1, log_every=1, val_fraction=0.5)))
    cfg = json.loads((out / "metrics.json").read_text())["policy_config"]
    assert cfg["encoder"] == "pilotnet" and cfg["image_size"] == [66, 200] and cfg["crop"] == [60, 135]
    assert cfg["color"] == "yuv" and cfg["env"] == "UdacityStyle-v0" and cfg["action_names"] == ["steer"]
    assert cfg["frame_stride"] == 1 and abs(cfg["frame_period"] - SPEC.dt) < 1e-9
    # the trained policy drives the real env in closed loop, with interventions counted
    res = evaluate(resolve_eval(EvalArgs(env="udacity", checkpoint=[str(out / "best.pt")], episodes=1, max_steps=60,
                                    video_episodes=1, out=str(tmp_path / "eval"), progress=False, tensorboard=False)))
    m = next(iter(res.values()))
    row = m["episodes"][0]
    for key in ("autonomy", "interventions", "mean_abs_cte", "max_abs_cte", "steer_mse", "steer_jerk", "laps"):
        assert key in row
    assert row["length"] == 60 and 0 <= row["interventions"] <= 60
    assert row["autonomy"] == pytest.approx(max(0.0, 100 * (1 - row["interventions"] * 6.0 / (60 * SPEC.dt))))
    assert iio.immeta(tmp_path / "eval" / "videos" / "seed_1000.mp4")["fps"] == 10.0  # 10 Hz env: real time


def test_expert_keeps_its_lane_where_a_constant_policy_needs_interventions(tmp_path):
    res = evaluate(resolve_eval(EvalArgs(env="udacity", expert_drives=True, episodes=2, max_steps=300, video=False,
                                    out=str(tmp_path / "e"), progress=False, tensorboard=False)))
    m = res["expert"]
    assert m["total_interventions"] == 0 and m["autonomy"] == 100.0 and m["mean_mean_abs_cte"] < 0.5


def test_udacity_format_round_trip_of_a_collected_dataset(udacity_ds, tmp_path):
    log = export_udacity(udacity_ds, tmp_path / "sim")
    rows = log.read_text().strip().splitlines()
    assert len(rows) == 2 * STEPS and rows[0].split(",")[0].endswith(".jpg")
    back = open_dataset(import_udacity(tmp_path / "sim", tmp_path / "back"))
    assert len(back) == 2
    a, b = open_dataset(udacity_ds).load(1), back.load(1)
    np.testing.assert_allclose(b["action"][:, 0], a["action"][:, 0], atol=1e-6)  # the steering that moved the car
    np.testing.assert_array_equal(b["frames"], a["frames"])  # the JPEG bytes travel unchanged

    # train.py takes the simulator's recording folder itself (imported once into the run folder)
    out = tmp_path / "train_from_recording"
    run(resolve(TrainArgs(data=str(tmp_path / "sim"), out=str(out), policy="gru", epochs=1, window=2, batch_size=16,
                  segment=8, feature_dim=8, d_model=8, threads=1, val_fraction=0.5)))
    m = json.loads((out / "metrics.json").read_text())
    assert m["args"]["data"] == str(out / "imported_data") and m["policy_config"]["env"] == "UdacityStyle-v0"
    assert (out / "imported_data" / "dataset.json").is_file() and (out / "best.pt").is_file()


def _replay(rec: Path, ckpt: Path, out: Path, capsys) -> tuple[dict, list[list[str]], str]:
    res = evaluate(resolve_eval(EvalArgs(replay=str(rec), checkpoint=[str(ckpt)], video=False, out=str(out),
                                         progress=False, tensorboard=False, workers=1)))
    with open(out / "paths" / "part_1.csv", newline="") as f:
        return next(iter(res.values())), list(csv.reader(f))[1:], capsys.readouterr().out


def test_an_exported_dataset_replays_as_the_dataset_does(udacity_ds, tmp_path, capsys):
    """Exported to the simulator's format (DART-noised, as collect.py records by default) and imported by the replay,
    a dataset keeps its camera and car and the steering that moved the car: the two replays drive the same path."""
    export_udacity(udacity_ds, tmp_path / "sim")
    card = json.loads((tmp_path / "sim" / "exported_dataset.json").read_text())
    assert card["env"] == "udacity" and card["steering"] == "action" and card["dart_noise"] == 0.1
    student = steering_checkpoint(tmp_path / "drifts.pt", steer=0.25)  # leaves the 1 m band again and again
    direct, direct_path, said = _replay(udacity_ds, student, tmp_path / "direct", capsys)
    exported, exported_path, said_too = _replay(tmp_path / "sim", student, tmp_path / "exported", capsys)
    assert direct["total_interventions"] >= 2, "a student that drifts: interventions to compare"
    assert abs(exported["total_interventions"] - direct["total_interventions"]) <= 1
    assert exported["replay"]["geometry"] == direct["replay"]["geometry"]
    offsets = np.array([[float(r[3]) for r in direct_path], [float(r[3]) for r in exported_path]])
    assert np.abs(offsets[0] - offsets[1]).max() < 0.02, "the same path, metre for metre"
    # distances: the console, the returns and the distance column say one figure
    for m, text in ((direct, said), (exported, said_too)):
        rows = m["episodes"]
        assert all(r["return"] == pytest.approx(r["distance"], rel=1e-6) for r in rows)
        assert f"{sum(r['distance'] for r in rows):.0f} m driven" in text
        assert "collected with DART noise 0.1" in text and m["replay"]["dart_noise"] == 0.1
        assert "paths/part_0.png" in text


def test_an_export_of_the_expert_s_labels_is_not_replayed(udacity_ds, tmp_path):
    export_udacity(udacity_ds, tmp_path / "labels", label="expert_action")
    with pytest.raises(ValueError, match="steering column is the expert's label .* --label action"):
        evaluate(resolve_eval(EvalArgs(replay=str(tmp_path / "labels"), expert_drives=True, video=False,
                                  out=str(tmp_path / "e"), progress=False, tensorboard=False, workers=1)))


def test_bad_udacity_requests_are_clear_errors(tmp_path, capsys):
    assert collect_cli.main(["--env", "udacity", "--action-space", "discrete", "--out", str(tmp_path / "x")]) == 2
    assert "--action-space must be one of ['continuous'] for udacity" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--env"):
        get_spec("udacity-mars")
