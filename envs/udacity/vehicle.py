"""Kinematic bicycle model with a lagged steering actuator and a PI speed controller.

Why kinematic: at lane-keeping speeds (5-15 m/s) tyre slip is small, and a kinematic model is cheap
(pure-Python floats, no arrays) and exactly reproducible, so the physics-only mode can run tens of
thousands of steps per second for PPO.

State, in the world frame of `track.py` (metres, x east, y north, yaw counter-clockwise from +x):
(x, y) is the REAR-AXLE centre, where the kinematic bicycle is exact (its path under a constant wheel
angle delta is a circle of radius wheelbase / tan(delta)); `center` is the car's centre, half a
wheelbase ahead, which the cameras and the cross-track error use. `steer` is the actual front-wheel
angle in radians, + = RIGHT (a positive angle turns the car clockwise seen from above).

Steering actuator: a first-order lag with time constant STEER_TAU_S (0.08 s), applied exactly per
sub-step (delta += (command - delta) * (1 - exp(-h / tau))): a wheel cannot jump from lock to lock in
one 0.1 s step, and the policy has to anticipate, as with a real car.

Speed: dv/dt = throttle * MAX_ACCEL - brake * MAX_BRAKE - DRAG * v^2 - ROLLING (v >= 0, no reverse).
By default a PI controller (with feed-forward of the resistance and anti-windup) sets throttle/brake to
hold `target_speed`; with `throttle_action` the agent's throttle in [-1, 1] is used instead (< 0 brakes).

One control step is DT = 0.1 s (10 Hz), integrated in SUBSTEPS = 4 sub-steps of exact circular arcs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

DT = 0.1  # seconds per env step (10 Hz control)
SUBSTEPS = 4  # integration sub-steps per DT (exact arcs inside each, so 4 are plenty)
WHEELBASE_M = 2.5
CAR_LENGTH_M = 4.5
CAR_WIDTH_M = 1.8
MAX_STEER_DEG = 25.0  # wheel angle for a normalised steering command of ±1 (Udacity's convention)
MAX_STEER_RAD = math.radians(MAX_STEER_DEG)
STEER_TAU_S = 0.08  # first-order steering lag time constant
MAX_ACCEL = 4.0  # m/s^2 at full throttle
MAX_BRAKE = 8.0  # m/s^2 at full brake
DRAG = 0.005  # 1/m, aerodynamic term: top speed at full throttle ~27 m/s
ROLLING = 0.15  # m/s^2, rolling resistance while moving
MPH_PER_MPS = 2.2369362920544
G = 9.81  # m/s^2
_KP = 1.0  # PI speed gains, in m/s^2 per m/s of error (and per m of integrated error)
_KI = 0.4
_I_LIMIT = 5.0  # anti-windup bound on the integrated speed error (m)


@dataclass
class VehicleState:
    """Everything the model integrates (see the module doc for frames and signs)."""

    x: float = 0.0
    y: float = 0.0
    yaw: float = 0.0
    speed: float = 0.0  # m/s along the car's axis, >= 0
    steer: float = 0.0  # actual wheel angle, rad, + = right
    speed_integral: float = 0.0  # PI controller memory (m)
    throttle: float = 0.0  # last applied throttle 0..1
    brake: float = 0.0  # last applied brake 0..1
    yaw_rate: float = 0.0  # mean over the last step, rad/s, + = turning right (clockwise)


class Vehicle:
    """Kinematic bicycle; `step(steer_cmd, throttle_cmd)` advances one DT."""

    def __init__(self, target_speed: float, *, wheelbase: float = WHEELBASE_M) -> None:
        if not target_speed > 0:
            raise ValueError(f"target_speed must be > 0 m/s, got {target_speed!r}")
        if not wheelbase > 0:
            raise ValueError(f"wheelbase must be > 0 m, got {wheelbase!r}")
        self.target_speed = float(target_speed)
        self.wheelbase = float(wheelbase)
        self.state = VehicleState()
        self._h = DT / SUBSTEPS
        self._lag = 1.0 - math.exp(-self._h / STEER_TAU_S)

    def reset(self, x: float, y: float, yaw: float, speed: float = 0.0) -> None:
        """Place the rear axle at (x, y) heading `yaw`, wheels straight, controller memory cleared."""
        self.state = VehicleState(float(x), float(y), float(yaw), max(float(speed), 0.0))

    @property
    def center(self) -> tuple[float, float]:
        """The car's centre (half a wheelbase ahead of the rear axle)."""
        st = self.state
        half = 0.5 * self.wheelbase
        return st.x + half * math.cos(st.yaw), st.y + half * math.sin(st.yaw)

    def place_center(self, cx: float, cy: float, yaw: float) -> None:
        """Move the car so its centre is at (cx, cy) heading `yaw`; speed and controller memory are kept."""
        half = 0.5 * self.wheelbase
        st = self.state
        st.x, st.y, st.yaw = cx - half * math.cos(yaw), cy - half * math.sin(yaw), float(yaw)

    def step(self, steer_cmd: float, throttle_cmd: float | None = None, grade: float = 0.0) -> None:
        """Advance DT. steer_cmd in [-1, 1] (+ = right, x MAX_STEER); throttle_cmd None = PI controller,
        else in [-1, 1] (> 0 throttle, < 0 brake). Inputs are clipped to their ranges. `grade` (rise per metre
        along the heading) adds gravity's pull, -g * grade / sqrt(1 + grade^2), to the acceleration.

        Plain float arithmetic throughout: this runs once per env step and dominates physics-only speed."""
        st = self.state
        target = (1.0 if steer_cmd > 1.0 else -1.0 if steer_cmd < -1.0 else steer_cmd) * MAX_STEER_RAD
        h, lag, L, v_t = self._h, self._lag, self.wheelbase, self.target_speed
        x, y, yaw, v, delta = st.x, st.y, st.yaw, st.speed, st.steer
        integral = st.speed_integral
        yaw0 = yaw
        throttle = brake = 0.0
        pi_control = throttle_cmd is None
        if throttle_cmd is not None:
            u = 1.0 if throttle_cmd > 1.0 else -1.0 if throttle_cmd < -1.0 else throttle_cmd
            throttle, brake = (u, 0.0) if u > 0.0 else (0.0, -u)
        feed_forward = DRAG * v_t * v_t + ROLLING
        slope = -G * grade / math.sqrt(1.0 + grade * grade) if grade else 0.0
        feed_forward -= slope
        for _ in range(SUBSTEPS):
            delta += (target - delta) * lag
            if pi_control:
                err = v_t - v
                accel = _KP * err + _KI * integral + feed_forward
                if accel >= 0.0:
                    throttle, brake = accel / MAX_ACCEL, 0.0
                    saturated = throttle >= 1.0 and err > 0.0
                    if throttle > 1.0:
                        throttle = 1.0
                else:
                    throttle, brake = 0.0, -accel / MAX_BRAKE
                    saturated = brake >= 1.0 and err < 0.0
                    if brake > 1.0:
                        brake = 1.0
                if not saturated:  # anti-windup: no integration while the actuator is saturated
                    integral += err * h
                    integral = _I_LIMIT if integral > _I_LIMIT else -_I_LIMIT if integral < -_I_LIMIT else integral
            a = throttle * MAX_ACCEL - DRAG * v * v
            if slope:
                a += slope
            if v > 0.0:
                a -= brake * MAX_BRAKE + ROLLING
            v_new = v + a * h
            if v_new < 0.0:
                v_new = 0.0
            vm = 0.5 * (v + v_new)  # distance travelled this sub-step is vm * h (trapezoid)
            omega = -vm * math.tan(delta) / L  # counter-clockwise yaw rate
            dyaw = omega * h
            if dyaw > 1e-9 or dyaw < -1e-9:  # exact arc at constant curvature
                r = vm / omega
                x += r * (math.sin(yaw + dyaw) - math.sin(yaw))
                y -= r * (math.cos(yaw + dyaw) - math.cos(yaw))
            else:
                x += vm * h * math.cos(yaw)
                y += vm * h * math.sin(yaw)
            yaw += dyaw
            v = v_new
        st.x, st.y, st.speed, st.steer = x, y, v, delta
        st.yaw = (yaw + math.pi) % (2.0 * math.pi) - math.pi
        st.yaw_rate = -(yaw - yaw0) / DT
        st.speed_integral = integral
        st.throttle, st.brake = throttle, brake
