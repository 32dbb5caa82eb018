"""The replay's car (envs/replay/vehicle.py): the kinematic bicycle follows the path with the recorded steering and
drifts with another; the path controller steers back towards the path."""

from __future__ import annotations

import math

import numpy as np
import pytest

from envs.replay.vehicle import PathController, PathPose, PathVehicle, count_interventions


def test_vehicle_stays_on_the_path_with_the_recorded_steering_and_drifts_with_another():
    v = PathVehicle(2.5, 25.0, steer_tau_s=0.08)
    pose = PathPose()
    for _ in range(50):
        pose = v.step(pose, 0.3, 0.3, 10.0, 0.1)
    assert pose.offset == 0.0 and pose.yaw == 0.0
    # no lag: yaw grows by v dt tan(0.2 * 25 deg) / L
    pose = PathVehicle(2.5, 25.0).step(PathPose(), 0.2, 0.0, 10.0, 0.1)
    assert pose.yaw == pytest.approx(1.0 * math.tan(math.radians(5.0)) / 2.5)
    assert pose.offset == pytest.approx(1.0 * math.sin(pose.yaw / 2))
    assert count_interventions(v, np.zeros(100), np.full(100, 0.3), np.full(100, 10.0), np.full(100, 0.1), 1.0, 0.5) > 0


def test_path_controller_steers_as_recorded_on_the_path_and_back_towards_it_off_it():
    c = PathController(PathVehicle(2.5, 25.0))
    assert c.steer(0.0, 0.0, 0.37, 10.0) == pytest.approx(0.37)
    assert c.steer(0.8, 0.0, 0.0, 10.0) < 0 < c.steer(-0.8, 0.0, 0.0, 10.0)  # right of the path: steer left
    assert c.steer(0.0, 0.1, 0.0, 10.0) < 0  # pointing right: steer left
