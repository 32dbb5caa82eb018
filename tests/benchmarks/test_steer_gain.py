"""Steering-gain copies of a checkpoint: the same weights, the steering scaled in closed loop and offline."""

import numpy as np
import pytest
import torch

from benchmarks import steer_gain
from policies.checkpoint import load_checkpoint
from tests.helpers import steering_checkpoint


def test_a_copy_per_gain_steers_that_many_times_the_original(tmp_path, capsys):
    base = steering_checkpoint(tmp_path / "base.pt", 0.3)
    assert steer_gain.main(["--checkpoint", str(base), "--gain", "1.5", "4", "--out", str(tmp_path / "g")]) == 0
    original = load_checkpoint(base)
    for gain, want in ((1.5, 0.45), (4.0, 1.0)):  # 4 x 0.3 is clipped to full lock
        copy = load_checkpoint(tmp_path / "g" / f"base_g{gain:g}.pt")
        assert copy.config.steer_gain == gain
        assert all(torch.equal(a, b) for a, b in zip(copy.state_dict().values(), original.state_dict().values()))
        frames = np.zeros((3, 160, 320, 3), np.uint8)  # the camera of the recordings
        out = copy.predict_episode(frames)
        assert copy.to_env_action(out[-1])[0] == pytest.approx(want, abs=1e-5)
    assert "benchmarks.heldout_drivers" in capsys.readouterr().out


def test_a_gain_no_policy_can_take_is_one_line(tmp_path, capsys):
    base = steering_checkpoint(tmp_path / "base.pt", 0.3)
    assert steer_gain.main(["--checkpoint", str(base), "--gain", "0", "--out", str(tmp_path / "g")]) == 2
    assert "--gain 0" in capsys.readouterr().err and not list((tmp_path / "g").glob("*.pt"))
