"""The car's pose relative to the recorded path, integrated from the difference between its steering and the
recorded steering: a kinematic bicycle at the recorded speed, in the path's frame.

State: ``offset`` (m, + = right of the recorded path) and ``yaw`` (rad, + = pointing right of the path's
direction). Over a recorded time step ``dt`` at speed ``v``, with curvatures ``k = tan(steer * max_steer) /
wheelbase`` (+ = turning right) of the car and ``k_rec`` of the recorded steering:

    yaw'    = yaw + v * dt * (k - k_rec)
    offset' = offset + v * dt * sin((yaw + yaw') / 2)

(small offsets: the path's own curvature does not change the distance travelled beside it). Where the recorded
steering is the car's, the state stays at zero: the recorded driver never leaves its own path. An optional
first-order lag of the wheel behind the command applies to both steerings alike; ``distance_scale`` corrects the
recorded speed where the recorded frames show the car moving less per step than speed x dt says.
"""
from __future__ import annotations

import math
from typing import Any
from dataclasses import dataclass

import numpy as np

DEFAULT_MAX_OFFSET_M = 1.0  # NVIDIA's virtual intervention: more than 1 m from the recorded path
DEFAULT_MAX_YAW_RAD = math.radians(30.0)  # or pointing this far off its direction (the view synthesis breaks down)


@dataclass
class PathPose:
    """Pose relative to the recorded path, with the lagged wheel angles of the car and of the recording."""

    offset: float = 0.0
    yaw: float = 0.0
    wheel: float = 0.0  # the car's wheel angle, rad
    wheel_rec: float = 0.0  # the recording's wheel angle, rad

    def off_path(self, max_offset: float, max_yaw: float, middle: float | None = None) -> bool:
        """Far enough off for an intervention: beyond ``max_offset`` of the recorded path and, given the road's
        ``middle`` (m right of the path), of that too: keeping the middle behind a driver who kept to one side
        is driving the road as well (ReplayEnv(reference="driver-or-middle"))."""
        far = abs(self.offset) > max_offset and (middle is None or abs(self.offset - middle) > max_offset)
        return far or abs(self.yaw) > max_yaw

    def back_on_path(self) -> "PathPose":
        """After an intervention: on the path, aligned with it, the wheel where the recording's is."""
        return PathPose(wheel=self.wheel_rec, wheel_rec=self.wheel_rec)


class PathVehicle:
    """Integrates a ``PathPose`` (see the module docstring)."""

    def __init__(self, wheelbase_m: float, max_steer_deg: float, steer_tau_s: float = 0.0,
                 distance_scale: float = 1.0) -> None:
        self.wheelbase = float(wheelbase_m)
        self.max_steer = math.radians(max_steer_deg)
        self.tau = float(steer_tau_s)
        self.distance_scale = float(distance_scale)  # metres driven per metre of recorded speed x dt

    @classmethod
    def of(cls, geometry: Any) -> "PathVehicle":
        """The car of a recording's geometry (envs.replay.camera.CameraGeometry)."""
        return cls(geometry.wheelbase_m, geometry.max_steer_deg, geometry.steer_tau_s, geometry.distance_scale)

    def wheel_angle(self, steer: float) -> float:
        return max(-1.0, min(1.0, float(steer))) * self.max_steer

    def curvature(self, wheel: float) -> float:
        return math.tan(wheel) / self.wheelbase

    def step(self, pose: PathPose, steer: float, steer_rec: float, speed: float, dt: float) -> PathPose:
        target, target_rec = self.wheel_angle(steer), self.wheel_angle(steer_rec)
        if self.tau > 0:
            a = 1.0 - math.exp(-dt / self.tau)
            wheel = pose.wheel + (target - pose.wheel) * a
            wheel_rec = pose.wheel_rec + (target_rec - pose.wheel_rec) * a
        else:
            wheel, wheel_rec = target, target_rec
        ds = max(float(speed), 0.0) * dt * self.distance_scale
        yaw = pose.yaw + ds * (self.curvature(wheel) - self.curvature(wheel_rec))
        offset = pose.offset + ds * math.sin(0.5 * (pose.yaw + yaw))
        return PathPose(offset, yaw, wheel, wheel_rec)


def count_interventions(vehicle: PathVehicle, steer: np.ndarray, steer_rec: np.ndarray, speed: np.ndarray,
                        dt: np.ndarray, max_offset: float, max_yaw: float, middle: np.ndarray | None = None) -> int:
    """Interventions of a driver whose steering is known in advance (always-straight): no frames needed.
    ``middle``: per frame, the road's middle (PathPose.off_path); after step j the car is at frame j + 1 (the last
    frame stays), as in the env."""
    pose, n = PathPose(), 0
    last = len(steer) - 1
    for j, (a, r, v, h) in enumerate(zip(steer, steer_rec, speed, dt)):
        pose = vehicle.step(pose, float(a), float(r), float(v), float(h))
        if pose.off_path(max_offset, max_yaw, None if middle is None else float(middle[min(j + 1, last)])):
            pose, n = pose.back_on_path(), n + 1
    return n


class PathController:
    """The replay's privileged driver: the recorded steering plus pure pursuit back onto the recorded path.

    It aims at the path point ``lookahead`` ahead (``max(min_lookahead_m, speed * lookahead_s)``); on the path
    and aligned with it, it steers exactly as recorded. It labels the states a student reaches (the expert that
    shadows it, and DAgger's labels)."""

    def __init__(self, vehicle: PathVehicle, lookahead_s: float = 1.0, min_lookahead_m: float = 4.0) -> None:
        self.vehicle = vehicle
        self.lookahead_s = lookahead_s
        self.min_lookahead = min_lookahead_m

    def steer(self, offset: float, yaw: float, steer_rec: float, speed: float) -> float:
        ld = max(self.min_lookahead, float(speed) * self.lookahead_s)
        # the target, in the car's frame (x ahead, y right): the path point ld ahead, seen from the car
        lateral = -offset * math.cos(yaw) - ld * math.sin(yaw)
        k = self.vehicle.curvature(self.vehicle.wheel_angle(steer_rec)) + 2.0 * lateral / (ld * ld)
        wheel = math.atan(k * self.vehicle.wheelbase)
        return max(-1.0, min(1.0, wheel / self.vehicle.max_steer))
