"""The replay's view synthesis (envs/replay/camera.py): a frame reprojected to a known pose off the path matches the
frame rendered there, and the hood rows are kept, never sampled."""

from __future__ import annotations

import math

import numpy as np
import pytest

from envs.replay.camera import Reprojector
from envs.replay.spec import SIM_V0
from envs.udacity.camera import Renderer
from envs.udacity.track import generate_track


def _moved(pose, offset, yaw):
    """The car pose `offset` m to the right and turned `yaw` rad to the right of `pose` (x, y, yaw CCW)."""
    x, y, h = pose
    return x + offset * math.sin(h), y - offset * math.cos(h), h - yaw


def _error(a, b, rows):
    return float(np.mean(np.abs(a[rows].astype(np.float64) - b[rows].astype(np.float64))))


@pytest.fixture(scope="module")
def scene():
    track = generate_track(7, "lake")
    return track, Renderer(track, "lake", 7), Reprojector(SIM_V0)


@pytest.mark.parametrize("offset,yaw", [(0.6, 0.0), (-0.8, 0.0), (0.0, 0.08), (0.5, -0.06)])
def test_reprojection_recovers_a_known_pose_from_rendered_frames(scene, offset, yaw):
    """Frames drawn at a known pose off the path: the reprojection of the on-path frame matches them far better than
    the unwarped frame, and a search over poses finds the true one (the mirrored pose is worse than none)."""
    track, renderer, rp = scene
    pose = track.pose_at(150.0)
    recorded, truth = renderer.render(pose), renderer.render(_moved(pose, offset, yaw))
    ground = slice(rp.horizon + 2, 160)
    warped = _error(rp.warp(recorded, offset, yaw), truth, ground)
    assert warped < 0.35 * _error(recorded, truth, ground)
    assert _error(rp.warp(recorded, -offset, -yaw), truth, ground) > _error(recorded, truth, ground)
    offsets, yaws = np.round(np.arange(-1.0, 1.01, 0.1), 2), np.round(np.arange(-0.1, 0.101, 0.02), 2)
    errors = {(o, y): _error(rp.warp(recorded, o, y), truth, ground) for o in offsets for y in yaws}
    best = min(errors, key=errors.get)
    assert abs(best[0] - offset) <= 0.1 + 1e-9 and abs(best[1] - yaw) <= 0.02 + 1e-9


def test_hood_rows_are_kept_and_never_sampled():
    rp = Reprojector(SIM_V0.__class__(**{**SIM_V0.to_dict(), "hood_row": 140}))
    frame = np.zeros((160, 320, 3), np.uint8)
    frame[140:] = 200  # the hood
    out = rp.warp(frame, 0.9, 0.1)
    assert (out[140:] == 200).all() and (out[:140] == 0).all()
