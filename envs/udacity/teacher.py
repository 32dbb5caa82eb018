"""`StanleyDriver`: the privileged reference driver of the Udacity-style env (and the PPO expert's warm start).

It reads only `info["privileged"]` (env.FEATURE_NAMES), so anything trained to imitate it sees the
same inputs. The steering law is Stanley's (Thrun et al., 2006, the DARPA Grand Challenge car) on the
front axle, with a curvature feed-forward:

    delta = atan(L * kappa_ahead) - psi - atan(k * e_front / (v + v_soft)) - d_yaw * (yaw_rate - v * kappa)

* psi: heading error (+ = car points right of the road); e_front: cross-track error of the FRONT axle
  (+ = right), from the car centre's error and psi: e + (L / 2) sin(psi);
* kappa_ahead: centreline curvature a little ahead (+ = right-hand bend), interpolated at
  `preview_s` seconds of travel: the steering actuator lags (vehicle.STEER_TAU_S) and a command acts
  for a whole 0.1 s step, so the feed-forward must lead;
* the yaw-rate term damps oscillation (Stanley's original had one too).
The result (wheel angle, rad) is divided by 25 deg and clipped to [-1, 1], the env's steering action.
With `throttle=True` it also returns a throttle that holds the target speed (a P law on speed_ratio),
for envs made with throttle_action=True.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .env import CURV_SCALE, FEATURE_NAMES, HALF_WIDTH_SCALE, LOOKAHEAD_M, SPEED_SCALE, YAW_RATE_SCALE
from .vehicle import MAX_STEER_RAD, WHEELBASE_M

_I = {name: k for k, name in enumerate(FEATURE_NAMES)}
_CURV_COLS = np.array([_I[f"ahead{int(d)}m_curv"] for d in LOOKAHEAD_M])
_LOOKAHEAD = np.asarray(LOOKAHEAD_M)


@dataclass
class StanleyDriver:
    """Privileged Stanley controller: `act(privileged)` -> action array (see the module doc)."""

    gain: float = 1.5  # k, 1/s: cross-track correction rate
    soft_speed: float = 1.0  # m/s, keeps the correction finite at low speed
    preview_s: float = 0.25  # s of travel ahead at which the curvature feed-forward is read
    yaw_damping: float = 0.08  # s, on the yaw-rate error
    throttle: bool = False  # also return a throttle (for throttle_action=True envs)
    throttle_gain: float = 3.0  # throttle per unit of (1 - speed / target)

    def __post_init__(self) -> None:
        for name in ("gain", "soft_speed", "preview_s", "yaw_damping", "throttle_gain"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")

    def steer_angle(self, privileged: np.ndarray) -> float:
        """Commanded front-wheel angle (rad, + = right) for one privileged vector."""
        p = np.asarray(privileged, dtype=np.float64)
        if p.shape != (len(FEATURE_NAMES),):
            raise ValueError(f"privileged must have shape ({len(FEATURE_NAMES)},), got {p.shape}")
        half_width = p[_I["half_width"]] * HALF_WIDTH_SCALE
        e = p[_I["cte"]] * half_width
        psi = math.atan2(p[_I["sin_heading_error"]], p[_I["cos_heading_error"]])
        v = p[_I["speed"]] * SPEED_SCALE
        yaw_rate = p[_I["yaw_rate"]] * YAW_RATE_SCALE
        preview = min(max(v * self.preview_s, _LOOKAHEAD[0]), _LOOKAHEAD[-1])
        kappa = float(np.interp(preview, _LOOKAHEAD, p[_CURV_COLS])) / CURV_SCALE
        e_front = e + 0.5 * WHEELBASE_M * math.sin(psi)
        delta = math.atan(WHEELBASE_M * kappa) - psi - math.atan(self.gain * e_front / (v + self.soft_speed))
        delta -= self.yaw_damping * (yaw_rate - v * kappa)
        return delta

    def act(self, privileged: np.ndarray) -> np.ndarray:
        """Action for the env: float32 [steer] (or [steer, throttle] with throttle=True), in [-1, 1]."""
        steer = min(max(self.steer_angle(privileged) / MAX_STEER_RAD, -1.0), 1.0)
        if not self.throttle:
            return np.array([steer], np.float32)
        ratio = float(privileged[_I["speed_ratio"]])
        thr = min(max(self.throttle_gain * (1.0 - ratio) + 0.15, -1.0), 1.0)
        return np.array([steer, thr], np.float32)

    __call__ = act
