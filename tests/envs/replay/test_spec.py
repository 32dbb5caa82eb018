"""A dataset as a replay's EnvSpec (envs/replay/spec.py): the spans, and what cannot be replayed (frames of another
camera, a car that never moves forward) is refused in one line."""
from __future__ import annotations

import json

import numpy as np
import pytest

import evaluate as evaluate_cli


def test_a_recording_of_other_frames_is_refused(udacity_drive, tmp_path):
    from driving_data.dataset import open_dataset
    from envs.replay.spec import replay_spec

    ds = open_dataset(udacity_drive)
    assert ds.card["frame_shape"] == [160, 320, 3]
    with pytest.raises(ValueError, match="frames are 96x96"):
        replay_spec(str(_carracing_like(tmp_path)))


def _carracing_like(tmp_path):
    from driving_data.dataset import CARD_NAME, FORMAT, write_episode

    root = tmp_path / "cr"
    T = 12
    write_episode(root, 0, {"frames": np.zeros((T, 96, 96, 3), np.uint8), "action": np.zeros((T, 1), np.float32),
                            "expert_action": np.zeros((T, 1), np.float32), "speed": np.ones(T, np.float32),
                            "reward": np.zeros(T, np.float32), "time": np.arange(T) * 0.1,
                            "privileged": np.zeros((T, 0), np.float32)},
                  {"env": "udacity", "action_space": "continuous"})
    (root / CARD_NAME).write_text(json.dumps({"format": FORMAT, "env": "udacity", "action_space": "continuous"}))
    return root


def _speeds_dataset(root, speeds):
    """A replayable dataset (160x320 frames, the udacity env) with one episode per array of speeds (m/s)."""
    from driving_data.dataset import CARD_NAME, FORMAT, write_episode

    for e, speed in enumerate(speeds):
        T = len(speed)
        write_episode(root, e, {"frames": np.zeros((T, 160, 320, 3), np.uint8), "action": np.zeros((T, 1), np.float32),
                                "expert_action": np.zeros((T, 1), np.float32), "speed": np.asarray(speed, np.float32),
                                "reward": np.zeros(T, np.float32), "time": np.arange(T) * 0.1,
                                "privileged": np.zeros((T, 0), np.float32)},
                      {"env": "udacity", "action_space": "continuous"})
    (root / CARD_NAME).write_text(json.dumps({"format": FORMAT, "env": "udacity", "action_space": "continuous",
                                              "frame_shape": [160, 320, 3], "dt": 0.1}))
    return root


def test_a_car_that_does_not_move_forward_is_never_scored(tmp_path, capsys):
    """A session whose car stands is not replayed (it would score every driver 100 % over a road never driven); a
    speed below zero is refused in one line; a part of brief stops between driving is replayed as before."""
    from envs.replay.spec import replay_spec

    stops = np.r_[np.full(10, 8.0), np.zeros(5), np.full(15, 8.0)]
    mixed = _speeds_dataset(tmp_path / "mixed", [np.full(30, 8.0), np.zeros(30), stops])
    assert [(p.episode, p.length) for p in replay_spec(str(mixed)).make().parts] == [(0, 30), (2, 30)]
    standing = _speeds_dataset(tmp_path / "standing", [np.zeros(30), np.full(30, 0.2)])
    assert evaluate_cli.main(["--replay", str(standing), "--expert-drives", "--out", str(tmp_path / "e"),
                              "--workers", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith("frames in the span 0:1 in which the car moves"), err
    backwards = _speeds_dataset(tmp_path / "backwards", [np.full(30, -6.0)])
    assert evaluate_cli.main(["--replay", str(backwards), "--expert-drives", "--out", str(tmp_path / "e"),
                              "--workers", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "episode 0 step 0: speed -6 m/s is below zero" in err[0], err
    assert not (tmp_path / "e").exists()
