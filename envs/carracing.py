"""CarRacing-v3 for imitation: the student sees the 96x96 frame, the expert reads privileged state.

`make_carracing()` builds gymnasium's CarRacing-v3 (continuous or the 5 discrete actions) and adds, in
`info` at reset and at every step, the privileged car/track state the PPO expert is trained on, plus a
few bookkeeping keys (speed, tiles visited, on-track, lap complete). The observation stays the frame.

`render=False` is a physics-only mode for expert training: the per-frame pygame render (≈90% of the
step time) is skipped and the observation is a zero frame. The render never feeds back into the
physics, so returns are bit-identical to the rendered env (tests/test_carracing.py checks this).

`PrivilegedObservation(env)` swaps the observation for `info["privileged"]` — what SB3 PPO trains on.

Conventions used by every privileged feature: the *car frame* has x pointing to the car's right and
y pointing forward; angles and curvatures are positive to the RIGHT (clockwise seen from above), the
same sense as a positive continuous steer command (and discrete action 1 "RIGHT").
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.box2d.car_racing import (
    FPS,
    STATE_H,
    STATE_W,
    TRACK_DETAIL_STEP,
    TRACK_WIDTH,
    CarRacing,
)
from gymnasium.wrappers import TimeLimit

ACTION_SPACES = ("continuous", "discrete")
DISCRETE_ACTION_NAMES = ("noop", "right", "left", "gas", "brake")
DT = 1.0 / FPS  # seconds per env step (0.02)

# Look-ahead distances along the centerline, in track-point steps of TRACK_DETAIL_STEP (3.5 units):
# ≈3.5, 7, 10.5, 17.5, 24.5, 35, 49, 70 units ahead of the point nearest to the car.
LOOKAHEAD_STEPS: tuple[int, ...] = (1, 2, 3, 5, 7, 10, 14, 20)

# Feature scales: keep every feature roughly in [-1, 1] so the MLP needs no running normaliser
# (the expert is then a single self-contained SB3 .zip).
_SPEED_SCALE = 50.0  # units/s; the car tops out near 100
_YAW_SCALE = 3.0  # rad/s
_STEER_LIMIT = 0.4  # rad, the front-wheel joint limit
_DIST_SCALE = 30.0  # units, for look-ahead point coordinates
_CURV_SCALE = 10.0  # 1/units -> the sharpest corner (0.31 rad per 3.5 units) maps to ~0.9

_BASE_FEATURES: tuple[str, ...] = (
    "lateral_offset",  # signed distance of the car centre from the centerline, + = right, / half-width (±1 = road edge)
    "sin_heading_error",  # sin of (car heading − track heading), + = car points right of the track direction
    "cos_heading_error",  # cos of the same angle (1 = aligned; negative = driving backwards)
    "v_forward",  # hull velocity along the car's forward axis, / 50 units/s
    "v_lateral",  # hull velocity along the car's right axis (sideways slide), / 50 units/s
    "yaw_rate",  # hull angular velocity, + = turning right, / 3 rad/s
    "steer_angle",  # front-wheel joint angle, + = right, / 0.4 rad (the joint limit; it lags the command)
    "rear_slip",  # mean rear (driven) wheel slip: (wheel rim speed − forward speed) / 50; > 0 = wheelspin
    "gas_level",  # current rear-wheel gas 0..1 (gas ramps up by at most 0.1 per frame)
    "wheels_on_road",  # fraction of the 4 wheels touching a road tile (0 = all on grass)
)
_LOOKAHEAD_FIELDS: tuple[str, ...] = (
    "x",  # centerline point, car-frame right coordinate, / 30 units
    "y",  # centerline point, car-frame forward coordinate, / 30 units
    "sin_dir",  # sin of track direction there relative to car heading, + = track heads to the car's right
    "cos_dir",  # cos of the same angle
    "curv",  # signed centerline curvature there, + = right-hand bend, x 10 units
)
FEATURE_NAMES: tuple[str, ...] = _BASE_FEATURES + tuple(
    f"ahead{k}_{field}" for k in LOOKAHEAD_STEPS for field in _LOOKAHEAD_FIELDS
)
N_FEATURES = len(FEATURE_NAMES)


def _wrap(angle: np.ndarray | float) -> np.ndarray | float:
    """Wrap an angle to [-pi, pi)."""
    return (np.asarray(angle) + np.pi) % (2 * np.pi) - np.pi


class _CarRacing(CarRacing):
    """CarRacing-v3 that can skip the per-step frame render (physics-only mode)."""

    def __init__(self, *, physics_only: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.physics_only = physics_only
        self._blank = np.zeros((STATE_H, STATE_W, 3), dtype=np.uint8)

    def _render(self, mode: str):  # type: ignore[override]
        # step() renders "state_pixels" for the observation; nothing it draws touches Box2D.
        if self.physics_only and mode == "state_pixels":
            return self._blank
        return super()._render(mode)


class TrackGeometry:
    """Centerline arrays of the current track, and the privileged features of a car on it."""

    def __init__(self, track: list[tuple[float, float, float, float]]) -> None:
        arr = np.asarray(track, dtype=np.float64)
        self.beta = arr[:, 1]  # track heading, body-angle convention (travel dir = (-sin b, cos b))
        self.xy = arr[:, 2:4]
        self.n = len(arr)
        # Curvature, + = right-hand bend: heading (counter-clockwise +) decreases along a right bend.
        dbeta = _wrap(np.roll(self.beta, -1) - np.roll(self.beta, 1))
        self.curv = -dbeta / (2 * TRACK_DETAIL_STEP)
        self.lookahead = np.asarray(LOOKAHEAD_STEPS)

    def nearest(self, pos: np.ndarray) -> int:
        """Index of the centerline point closest to `pos`."""
        d = self.xy - pos
        return int(np.argmin(np.einsum("ij,ij->i", d, d)))

    def features(self, car: Any) -> tuple[np.ndarray, int]:
        """Privileged feature vector (FEATURE_NAMES order) and the nearest track index."""
        hull = car.hull
        pos = np.array(hull.position, dtype=np.float64)
        a = float(hull.angle)
        right = np.array([math.cos(a), math.sin(a)])  # car x axis in world
        fwd = np.array([-math.sin(a), math.cos(a)])  # car y axis in world
        i = self.nearest(pos)
        b = self.beta[i]
        lateral = float((pos - self.xy[i]) @ np.array([math.cos(b), math.sin(b)]))
        head_err = float(_wrap(b - a))
        vel = np.array(hull.linearVelocity, dtype=np.float64)
        v_f, v_r = float(vel @ fwd), float(vel @ right)
        steer = -float(car.wheels[0].joint.angle)
        slips = []
        for w in car.wheels[2:4]:
            wf = w.GetWorldVector((0, 1))
            vf = wf[0] * w.linearVelocity[0] + wf[1] * w.linearVelocity[1]
            slips.append(w.omega * w.wheel_rad - vf)
        on_road = sum(1 for w in car.wheels if w.tiles) / 4.0
        base = [
            lateral / TRACK_WIDTH,
            math.sin(head_err),
            math.cos(head_err),
            v_f / _SPEED_SCALE,
            v_r / _SPEED_SCALE,
            -float(hull.angularVelocity) / _YAW_SCALE,
            steer / _STEER_LIMIT,
            float(np.mean(slips)) / _SPEED_SCALE,
            float(car.wheels[2].gas),
            on_road,
        ]
        idx = (i + self.lookahead) % self.n
        d = self.xy[idx] - pos
        x = d @ right / _DIST_SCALE
        y = d @ fwd / _DIST_SCALE
        rel = _wrap(a - self.beta[idx])  # + = track direction points to the car's right
        ahead = np.stack([x, y, np.sin(rel), np.cos(rel), self.curv[idx] * _CURV_SCALE], axis=1)
        feats = np.concatenate([np.asarray(base), ahead.ravel()]).astype(np.float32)
        return feats, i


class CarRacingInfo(gym.Wrapper):
    """Adds privileged state and bookkeeping to `info` at reset and at every step.

    info keys: "privileged" float32[N_FEATURES], "speed" (units/s), "tiles_visited", "num_tiles",
    "on_track" (a wheel touches a road tile), "lap_complete" (every tile visited / lap-finished
    termination), "track_index" (nearest centerline point; used by reward shaping).
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.geometry: TrackGeometry | None = None

    def _info(self, info: dict[str, Any]) -> dict[str, Any]:
        base = self.env.unwrapped
        assert self.geometry is not None
        feats, idx = self.geometry.features(base.car)
        n = len(base.track)
        out = dict(info)
        out.update(
            privileged=feats,
            speed=float(np.hypot(*base.car.hull.linearVelocity)),
            tiles_visited=int(base.tile_visited_count),
            num_tiles=n,
            on_track=any(w.tiles for w in base.car.wheels),
            lap_complete=bool(info.get("lap_finished", False)) or base.tile_visited_count >= n,
            track_index=idx,
        )
        return out

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        self.geometry = TrackGeometry(self.env.unwrapped.track)
        return obs, self._info(info)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward, terminated, truncated, self._info(info)


class PrivilegedObservation(gym.Wrapper):
    """Observation = info["privileged"] (float32[N_FEATURES]); the frame is dropped. For the PPO expert."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(N_FEATURES,), dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        _, info = self.env.reset(seed=seed, options=options)
        return info["privileged"], info

    def step(self, action):
        _, reward, terminated, truncated, info = self.env.step(action)
        return info["privileged"], reward, terminated, truncated, info


def make_carracing(
    action_space: str = "continuous",
    *,
    render: bool = True,
    max_episode_steps: int = 1000,
    render_mode: str | None = None,
) -> gym.Env:
    """CarRacing-v3 with privileged info. obs = 96x96x3 uint8 frame (zeros when render=False).

    action_space: "continuous" ([steer, gas, brake], steer +1 = right) or "discrete"
    (0 noop, 1 RIGHT, 2 LEFT, 3 gas, 4 brake). render=False is the physics-only mode.
    render_mode is passed to gymnasium (e.g. "rgb_array" for videos; needs render=True).
    """
    if action_space not in ACTION_SPACES:
        raise ValueError(f"action_space must be one of {ACTION_SPACES}, got {action_space!r}")
    if not isinstance(max_episode_steps, int) or max_episode_steps <= 0:
        raise ValueError(f"max_episode_steps must be a positive int, got {max_episode_steps!r}")
    if render_mode is not None and not render:
        raise ValueError(f"render_mode={render_mode!r} needs render=True (physics-only mode draws nothing)")
    env: gym.Env = _CarRacing(
        physics_only=not render, continuous=action_space == "continuous", render_mode=render_mode
    )
    env = TimeLimit(env, max_episode_steps=max_episode_steps)
    return CarRacingInfo(env)
