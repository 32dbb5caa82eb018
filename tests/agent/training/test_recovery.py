"""train.py --recovery-views: training segments reprojected off the recorded path (in the prepared, cropped and
resized frame space) and labelled with the path controller's steering back onto it."""
from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import collect as collect_cli
from driving_data.dataset import RECORDING_SOURCE, open_dataset
import train as train_cli
from agent.training.augment import augment_first_person
from agent.training.config import TrainArgs, resolve, with_env_defaults
from agent.training.data import load_data
from agent.training.recovery import RecoveryViews, dataset_geometry
from envs.registry import get_spec
from envs.replay.camera import Reprojector
from envs.replay.spec import REAL_UDACITY, SIM_V0, SIM_V1
from policies.frames import prepare_frames
from tests.agent.training.test_experiment import write_synthetic

STEPS = 60


@pytest.fixture(scope="module")
def udacity_ds(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("rv") / "data"
    assert collect_cli.main(["--env", "udacity", "--episodes", "1", "--max-steps", str(STEPS), "--out", str(out),
                             "--no-progress", "--workers", "1"]) == 0
    return out


@pytest.mark.parametrize("geometry, crop, size", [
    (SIM_V0, [60, 135], [66, 200]),  # the udacity recipe: the crop starts below the horizon
    (SIM_V1, [40, 146], [66, 200]),  # udacity-hard's crop keeps 14 rows of sky
    (REAL_UDACITY, [50, 155], [66, 200]),  # sky rows and hood rows both in the crop
    (SIM_V0, None, [80, 160]),  # no crop: the whole frame, resized
])
def test_warp_of_a_prepared_frame_is_the_prepared_full_frame_warp(udacity_ds, geometry, crop, size):
    frame = open_dataset(udacity_ds).load(0)["frames"][STEPS // 2]
    views = RecoveryViews(geometry, crop, size, 1.0, 1.0, 10.0)
    full = Reprojector(geometry)
    prepared = prepare_frames(frame, crop, size)
    for offset, yaw in [(0.8, 0.1), (-1.0, -0.17), (0.5, -0.12)]:
        want = prepare_frames(full.warp(frame, offset, yaw), crop, size).astype(int)
        got = views.warp(prepared, offset, yaw)
        err = np.abs(got - want)
        moved = np.abs(prepared - want).mean()  # what the pose changes
        assert err.mean() < 1.5 and err.mean() < 0.2 * moved, (offset, yaw, err.mean(), moved)
        assert np.percentile(err, 99) < 20  # interpolation error only (edges), nowhere a shifted region
    np.testing.assert_array_equal(views.warp(prepared, 0.0, 0.0), prepared)


def test_the_center_frame_warped_to_a_side_cameras_pose_looks_like_that_camera(udacity_ds):
    """The sign of the offset: the left camera (1 m left) is the center frame warped to -1 m, on prepared frames."""
    ep = open_dataset(udacity_ds).load(0)
    views = RecoveryViews(SIM_V0, [60, 135], [66, 200], 1.0, 1.0, 10.0)
    prep = lambda f: prepare_frames(f, [60, 135], [66, 200]).astype(int)  # noqa: E731
    for t in (10, 30, 50):
        center = prepare_frames(ep["frames"][t], [60, 135], [66, 200])
        for side, offset in (("left", -SIM_V0.side_offset_m), ("right", SIM_V0.side_offset_m)):
            recorded = prep(ep[f"frames_{side}"][t])
            assert np.abs(views.warp(center, offset, 0.0) - recorded).mean() < 0.4 * np.abs(center - recorded).mean()
            assert np.abs(views.warp(center, -offset, 0.0) - recorded).mean() > np.abs(center - recorded).mean()


def test_labels_steer_back_onto_the_path():
    views = RecoveryViews(REAL_UDACITY, [60, 135], [66, 200], 1.0, 1.0, 10.0)
    steer = np.array([-0.4, -0.05, 0.0, 0.1, 0.3], np.float32)
    speed = np.array([0.0, 5.0, 10.0, 13.0, 20.0], np.float32)
    np.testing.assert_allclose(views.label(0.0, 0.0, steer, speed), steer, rtol=0, atol=1e-7)
    assert (views.label(0.5, 0.0, steer, speed) < steer).all(), "right of the path: steer more left"
    assert (views.label(-0.5, 0.0, steer, speed) > steer).all(), "left of the path: steer more right"
    assert (views.label(0.0, math.radians(5), steer, speed) < steer).all(), "pointing right: steer more left"
    assert (np.abs(views.label(1.0, math.radians(10), steer, speed)) <= 1).all()
    firm = RecoveryViews(REAL_UDACITY, [60, 135], [66, 200], 1.0, 1.0, 10.0, return_s=0.4)
    gentle, hard = views.label(0.5, 0.0, steer, speed), firm.label(0.5, 0.0, steer, speed)
    assert (hard <= gentle).all() and (hard[2:] < gentle[2:]).all(), "rejoining the path sooner steers back harder"


def test_side_cameras_are_labelled_from_their_own_pose_and_other_columns_stay():
    views = RecoveryViews(SIM_V0, [60, 135], [66, 200], 1.0, 0.0, 0.0)  # every segment, pose (0, 0)
    frames = np.random.default_rng(0).integers(0, 255, (12, 66, 200, 3), dtype=np.uint8)
    target = np.stack([np.full(8, 0.1), np.full(8, 0.6)], 1).astype(np.float32)
    speeds = [np.full(20, 9.0, np.float32)]
    segments, slices = [(0, 4, 8), (0, 10, 14)], [(0, 6), (6, 12)]
    done = views.apply_(frames, target, segments, slices, speeds, ["left", "right"])
    assert done == [True, True]
    np.testing.assert_allclose(target[:4, 0], views.label(-SIM_V0.side_offset_m, 0.0, np.full(4, 0.1), speeds[0][:4]))
    np.testing.assert_allclose(target[4:, 0], views.label(SIM_V0.side_offset_m, 0.0, np.full(4, 0.1), speeds[0][:4]))
    assert (target[:4, 0] > 0.1).all() and (target[4:, 0] < 0.1).all()
    np.testing.assert_array_equal(target[:, 1], np.float32(0.6))  # a throttle label is not the controller's business


def test_a_mirror_after_the_reprojection_negates_the_new_label(udacity_ds):
    plan = with_env_defaults(resolve(TrainArgs(data=str(udacity_ds), recovery_views=1.0, side_correction=0.0,
                                               shift_steer=0.0, shadows=False, color_jitter=0.0, window=3,
                                               frame_stride=1, threads=1, progress=False)))
    data = load_data(plan.data)
    views = RecoveryViews(data.geometry, data.crop, data.image_size, 1.0, 1.0, 10.0)
    segment = (0, 20, 28)
    recorded = data.targets[0][20:28, 0]
    speed = data.speeds[0][20:28]
    flips = set()
    for seed in range(6):
        torch.manual_seed(seed)
        r = torch.rand(1, 8)  # augment_first_person's draws, then the recovery pose's
        _, u, v = torch.rand(1, 3)[0].tolist()
        pose = ((2 * u - 1) * 1.0, (2 * v - 1) * math.radians(10.0))
        flip = bool(r[0, 1] < 0.5)
        torch.manual_seed(seed)
        _, _, _, target = augment_first_person(data, [segment], plan.augmentation, plan.windows, slice(0, 1), "yuv",
                                               torch.device("cpu"), views)
        want = views.label(*pose, recorded, speed) * (-1 if flip else 1)
        np.testing.assert_allclose(target[:, 0], want, atol=1e-6)
        flips.add(flip)
    assert flips == {True, False}


@pytest.mark.parametrize("augment", [True, False])
def test_train_with_recovery_views_end_to_end(udacity_ds, tmp_path, monkeypatch, augment):
    calls = []
    apply = RecoveryViews.apply_

    def counted(self, *args, **kw):
        done = apply(self, *args, **kw)
        calls.append(done)
        return done

    monkeypatch.setattr(RecoveryViews, "apply_", counted)
    out = tmp_path / "run"
    code = train_cli.main(["--data", str(udacity_ds), "--out", str(out), "--recovery-views", "0.5", "--epochs", "1",
                           "--core", "mlp", "--window", "3", "--batch-size", "16", "--segment", "8", "--feature-dim",
                           "16", "--hidden", "16", "--threads", "1", "--split", "blocks", "--no-progress",
                           "--augment" if augment else "--no-augment"])
    assert code == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["args"]["recovery_views"] == 0.5
    assert calls and any(any(c) for c in calls), "some segments were reprojected"
    assert (out / "last.pt").exists()


def test_bad_recovery_requests_are_one_line_errors(udacity_ds, tmp_path, capsys):
    for flags in (["--recovery-views", "1.5"], ["--recovery-views", "-0.1"], ["--recovery-views", "0.5",
                                                                               "--recovery-yaw", "45"],
                  ["--recovery-views", "0.5", "--recovery-return", "0"]):
        assert train_cli.main(["--data", str(udacity_ds), "--out", str(tmp_path / "x"), *flags]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: --recovery-") and "\n" not in err
    carracing = write_synthetic(tmp_path / "cr", episodes=2)
    assert train_cli.main(["--data", str(carracing), "--out", str(tmp_path / "y"), "--recovery-views", "0.5",
                           "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert "first-person" in err and "\n" not in err
    assert not (tmp_path / "y").exists()


def test_data_that_mixes_camera_geometries_is_refused():
    env = get_spec("udacity")
    mixed = SimpleNamespace(episodes=[{"source": RECORDING_SOURCE}, {}], array_shape=lambda i, k: (10, 160, 320, 3))
    with pytest.raises(ValueError, match="mixes"):
        dataset_geometry(mixed, env, [60, 135])
    recording = SimpleNamespace(episodes=[{"source": RECORDING_SOURCE}], array_shape=lambda i, k: (10, 160, 320, 3))
    assert dataset_geometry(recording, env, [60, 135]) is REAL_UDACITY
    small = SimpleNamespace(episodes=[{}], array_shape=lambda i, k: (10, 80, 160, 3))
    with pytest.raises(ValueError, match="80x160"):
        dataset_geometry(small, env, None)
