"""CarRacing-v3 for imitation: the student sees the 96x96 frame, the expert reads privileged state.

`make_carracing()` builds gymnasium's CarRacing-v3 (continuous or the 5 discrete actions) and adds, in
`info` at reset and at every step, the privileged car/track state the PPO expert is trained on, plus a
few bookkeeping keys (speed, tiles visited, on-track, lap complete). The observation stays the frame.

`render=False` is a physics-only mode for expert training: the per-frame pygame render (≈90% of the
step time) is skipped and the observation is a zero frame. The render never feeds back into the
physics, so returns are bit-identical to the rendered env (tests/test_carracing.py checks this).

`CarRacingPrivilegedObservation(env)` swaps the observation for `info["privileged"]` — what SB3 PPO trains on.

Conventions used by every privileged feature: the *car frame* has x pointing to the car's right and
y pointing forward; angles and curvatures are positive to the RIGHT (clockwise seen from above), the
same sense as a positive continuous steer command (and discrete action 1 "RIGHT").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.box2d.car_dynamics import Car
from gymnasium.envs.box2d.car_racing import (
    FPS,
    STATE_H,
    STATE_W,
    TRACK_DETAIL_STEP,
    TRACK_WIDTH,
    CarRacing,
)
from gymnasium.wrappers import TimeLimit

from envs import privileged
from envs.carracing_render import RENDERERS, FastRenderer
from envs.spec import EnvSpec

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
    """CarRacing-v3 that can skip the per-step frame render (physics-only mode) or draw it fast (renderer="fast")."""

    def __init__(self, *, physics_only: bool = False, renderer: str = "pygame", **kwargs: Any) -> None:
        if renderer not in RENDERERS:
            raise ValueError(f"renderer must be one of {RENDERERS}, got {renderer!r}")
        super().__init__(**kwargs)
        self.physics_only = physics_only
        self.renderer = renderer
        self._fast = FastRenderer() if renderer == "fast" else None
        self._blank = np.zeros((STATE_H, STATE_W, 3), dtype=np.uint8)

    def _render(self, mode: str):
        # step() renders "state_pixels" for the observation; nothing it draws touches Box2D.
        if self.physics_only and mode == "state_pixels":
            return self._blank
        if self._fast is not None and mode == "state_pixels":
            return self._fast.render(self)
        return super()._render(mode)


class TrackGeometry:
    """Centerline arrays of the current track, and the privileged features of a car on it."""

    def __init__(self, track: list[tuple[float, float, float, float]]) -> None:
        arr = np.asarray(track, dtype=np.float64)
        self.beta = arr[:, 1]  # track heading, body-angle convention (travel dir = (-sin b, cos b))
        self.xy = arr[:, 2:4]
        self.n = len(arr)
        # Curvature, + = right-hand bend: heading (counter-clockwise +) decreases along a right bend.
        dbeta = np.asarray(_wrap(np.roll(self.beta, -1) - np.roll(self.beta, 1)))
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
    termination), "track_index" (nearest centerline point; used by reward shaping), "unvisited_tiles"
    (index ranges of the tiles not visited yet).
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.geometry: TrackGeometry | None = None
        self._unvisited: tuple[int, str] = (-1, "")

    def unvisited_tiles(self) -> str:
        """The tiles not visited yet as index ranges ("156-159 173"): a lap missed by a cut corner shows
        a few tiles inside it, one cut short by time the last ones. Recomputed only when a tile is visited."""
        base: Any = self.env.unwrapped  # gymnasium's CarRacing, typed as a plain Env
        if self._unvisited[0] != base.tile_visited_count:
            idx = [i for i, tile in enumerate(base.road) if not tile.road_visited]
            runs: list[list[int]] = []
            for i in idx:
                if runs and runs[-1][1] == i - 1:
                    runs[-1][1] = i
                else:
                    runs.append([i, i])
            self._unvisited = (base.tile_visited_count, " ".join(f"{a}-{b}" if b > a else str(a) for a, b in runs))
        return self._unvisited[1]

    def _info(self, info: dict[str, Any]) -> dict[str, Any]:
        base: Any = self.env.unwrapped  # gymnasium's CarRacing, typed as a plain Env
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
            unvisited_tiles=self.unvisited_tiles(),
        )
        return out

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """options may hold "start_fraction" (0..1: the centerline point that far round the lap),
        "start_turn" (rad, + = right) and "start_offset" (half-widths, + = right): the car then starts standing
        there, turned and shifted by them (recovery starts; every track starts on a like straight, so the
        fraction gives tests and starts different corners). All 0 (the default): gymnasium's start."""
        opts = dict(options or {})
        place = [float(opts.pop(k, 0.0)) for k in ("start_fraction", "start_turn", "start_offset")]
        obs, info = self.env.reset(seed=seed, options=opts or None)
        base: Any = self.env.unwrapped  # gymnasium's CarRacing, typed as a plain Env
        self.geometry = TrackGeometry(base.track)
        self._unvisited = (-1, "")
        if any(place):
            obs = self._place_car(*place)
        return obs, self._info(info)

    def _place_car(self, fraction: float, turn: float, offset: float) -> np.ndarray:
        """Rebuild the (standing) car at a centerline point, turned and shifted; returns the new frame."""
        base: Any = self.env.unwrapped  # gymnasium's CarRacing, typed as a plain Env
        angle, x, y = base.track[int(fraction * len(base.track)) % len(base.track)][1:4]
        base.car.destroy()
        # the track's right-hand normal is (cos b, sin b) (TrackGeometry); a right turn lowers the body angle
        base.car = Car(base.world, angle - turn, x + offset * TRACK_WIDTH * math.cos(angle),
                       y + offset * TRACK_WIDTH * math.sin(angle))
        return base.step(None)[0]  # as gymnasium's reset: one physics step without an action, so contacts exist

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward, terminated, truncated, self._info(info)


class CarRacingPrivilegedObservation(privileged.PrivilegedObservation):
    """Observation = info["privileged"] (float32[N_FEATURES]); the frame is dropped. For the CarRacing PPO expert."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env, N_FEATURES)


def make_carracing(
    action_space: str = "continuous",
    *,
    render: bool = True,
    max_episode_steps: int = 1000,
    render_mode: str | None = None,
    renderer: str = "pygame",
) -> gym.Env:
    """CarRacing-v3 with privileged info. obs = 96x96x3 uint8 frame (zeros when render=False).

    action_space: "continuous" ([steer, gas, brake], steer +1 = right) or "discrete"
    (0 noop, 1 RIGHT, 2 LEFT, 3 gas, 4 brake). render=False is the physics-only mode.
    render_mode is passed to gymnasium (e.g. "rgb_array" for videos; needs render=True).
    renderer: who draws the observation frame: "pygame" (gymnasium's, the reference) or "fast"
    (envs.carracing_render: the same frame within a few grey levels, >10x faster); videos
    (render_mode="rgb_array") stay gymnasium's.
    """
    if renderer not in RENDERERS:
        raise ValueError(f"renderer must be one of {RENDERERS}, got {renderer!r}")
    if action_space not in ACTION_SPACES:
        raise ValueError(f"action_space must be one of {ACTION_SPACES}, got {action_space!r}")
    if not isinstance(max_episode_steps, int) or max_episode_steps <= 0:
        raise ValueError(f"max_episode_steps must be a positive int, got {max_episode_steps!r}")
    if render_mode is not None and not render:
        raise ValueError(f"render_mode={render_mode!r} needs render=True (physics-only mode draws nothing)")
    env: gym.Env = _CarRacing(
        physics_only=not render, renderer=renderer, continuous=action_space == "continuous", render_mode=render_mode
    )
    env = TimeLimit(env, max_episode_steps=max_episode_steps)
    return CarRacingInfo(env)


# --------------------------------------------------------------------------------------------- the expert's actions
STEER_SCALE = _STEER_LIMIT  # the expert's PPO steer in [-1, 1] -> env steer in [-0.4, 0.4] (the wheel joint limit)


def ppo_to_env_action(action: np.ndarray) -> np.ndarray:
    """Map the continuous PPO action [steer, throttle] to the env action [steer, gas, brake]."""
    a = np.clip(np.asarray(action, dtype=np.float32), -1.0, 1.0)
    throttle = float(a[1])
    return np.array([STEER_SCALE * a[0], max(throttle, 0.0), max(-throttle, 0.0)], dtype=np.float32)


class SteerThrottleAction(gym.ActionWrapper):
    """Exposes a Box(-1, 1, (2,)) [steer, throttle] action space on top of continuous CarRacing."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.action_space = gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)

    def action(self, action: np.ndarray) -> np.ndarray:
        return ppo_to_env_action(action)


# -------------------------------------------------------------------------------------------- the expert's training env
@dataclass
class Shaping:
    """Training-only reward shaping for the PPO expert (evaluation always uses the true env reward).

    Why: a single skipped tile means the lap never finishes and the return is capped near 880, so every tile
    the car passes without touching costs `skip_penalty`; wheels on the grass cost a little; the lap-finished
    termination earns a bonus; a long time fully on the grass ends the episode."""

    skip_penalty: float = 5.0  # per tile left behind untouched
    skip_margin: int = 4  # a tile counts as skipped once the car is this many track points past it
    offroad_penalty: float = 0.05  # per frame, times the fraction of wheels on grass
    lap_bonus: float = 50.0  # on the lap-finished termination
    grass_patience: int = 50  # end the episode after this many frames with all wheels on grass ...
    grass_penalty: float = 100.0  # ... with this penalty (like leaving the playfield; else the policy
    # learns to park on the grass after a crash: driving on past untouched tiles costs skip penalties)


class ShapedReward(gym.Wrapper):
    """Adds the Shaping terms to the env reward (expects CarRacingInfo's info keys)."""

    def __init__(self, env: gym.Env, shaping: Shaping) -> None:
        super().__init__(env)
        self.shaping = shaping

    def reset(self, **kwargs: Any):
        obs, info = self.env.reset(**kwargs)
        self._n = info["num_tiles"]
        self._progress = info["track_index"]  # unwrapped nearest-point index
        self._checked = 0  # tiles [0, _checked) have been judged visited/skipped
        self._grass = 0
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        s, n = self.shaping, self._n
        delta = (info["track_index"] - self._progress) % n
        if delta > n // 2:
            delta -= n
        self._progress += delta
        shaped = float(reward)
        road = self.env.unwrapped.road
        while self._checked < min(self._progress - s.skip_margin, n):
            if not road[self._checked].road_visited:
                shaped -= s.skip_penalty
            self._checked += 1
        on_road = float(info["privileged"][FEATURE_NAMES.index("wheels_on_road")])
        shaped -= s.offroad_penalty * (1.0 - on_road)
        if info["lap_complete"] and terminated:
            shaped += s.lap_bonus
        self._grass = self._grass + 1 if on_road == 0.0 else 0
        if self._grass >= s.grass_patience and not terminated:
            terminated = True
            shaped -= s.grass_penalty
        return obs, shaped, terminated, truncated, info

def make_expert_env(action_space: str, *, render: bool = False, max_episode_steps: int = 1000) -> gym.Env:
    """The env the expert acts in: privileged obs, PPO action space ([steer, throttle] or Discrete(5))."""
    env: gym.Env = CarRacingPrivilegedObservation(make_carracing(action_space, render=render,
                                                                 max_episode_steps=max_episode_steps))
    if action_space == "continuous":
        env = SteerThrottleAction(env)
    return env


def make_train_env(action_space: str, shaping: Shaping | None = None) -> gym.Env:
    """The expert's PPO training env: physics-only, shaped reward (track seeds come from the caller)."""
    return ShapedReward(make_expert_env(action_space, render=False), shaping or Shaping())


def expert_to_env_action(action: Any, action_space: str) -> np.ndarray | int:
    """PPO's action -> the env's: [steer, throttle] -> [steer, gas, brake], or the discrete index."""
    return int(action) if action_space == "discrete" else ppo_to_env_action(action)


def env_to_expert_action(action: Any) -> np.ndarray:
    """The continuous env action [steer, gas, brake] as PPO's [steer, throttle] (clipped to PPO's box): what a
    latency expert sees of the actions on their way, whoever chose them."""
    a = np.asarray(action, dtype=np.float32)
    return np.clip(np.array([a[0] / STEER_SCALE, a[1] - a[2]], dtype=np.float32), -1.0, 1.0)


# --------------------------------------------------------------------------------------------- scripted teacher
_F = {name: i for i, name in enumerate(FEATURE_NAMES)}
_AHEAD_DIST = np.asarray(LOOKAHEAD_STEPS, dtype=np.float64) * TRACK_DETAIL_STEP
_AHEAD_X = [_F[f"ahead{k}_x"] for k in LOOKAHEAD_STEPS]
_AHEAD_Y = [_F[f"ahead{k}_y"] for k in LOOKAHEAD_STEPS]
_AHEAD_CURV = [_F[f"ahead{k}_curv"] for k in LOOKAHEAD_STEPS]


def facing_backwards(privileged: np.ndarray) -> bool:
    """The car points against the course (heading error beyond 90 degrees): evaluation's wrong-way steps and the
    recovery teacher's cue to turn round read this one test."""
    return bool(float(privileged[_F["cos_heading_error"]]) < 0.0)


@dataclass(frozen=True)
class ScriptedDriver:
    """Pure pursuit + curvature speed profile on the privileged features (the BC warm-start teacher).

    Steering aims at the centerline point `lookahead * speed` units ahead (6..40) with yaw-rate damping;
    the target speed is the lowest over the look-ahead points of sqrt(v_corner^2 + 2 a_brake d), with
    v_corner = sqrt(a_lat / |curvature|); gas is cut while the driven rear wheels spin (traction control).
    Discrete: steer when the steering command exceeds `steer_threshold`, else brake / gas / noop.
    """

    lookahead: float = 0.4  # s: look-ahead distance per unit speed
    kp: float = 2.0  # steer per rad of pursuit angle
    kd: float = 0.15  # steer per rad/s of yaw rate
    a_lat: float = 200.0  # units/s^2 allowed in corners
    a_brake: float = 60.0  # units/s^2 braking envelope
    slip_max: float = 0.1  # rear_slip feature above which gas is cut
    steer_threshold: float = 0.15  # discrete only

    def continuous(self, p: np.ndarray) -> np.ndarray:
        """Env action [steer, gas, brake]."""
        v = float(p[_F["v_forward"]]) * 50.0
        xs, ys = p[_AHEAD_X] * 30.0, p[_AHEAD_Y] * 30.0
        dist = float(np.clip(self.lookahead * v, 6.0, 40.0))
        alpha = math.atan2(float(np.interp(dist, _AHEAD_DIST, xs)), float(np.interp(dist, _AHEAD_DIST, ys)))
        steer = float(np.clip(self.kp * alpha - self.kd * float(p[_F["yaw_rate"]]) * 3.0, -1.0, 1.0))
        curv = np.maximum(np.abs(p[_AHEAD_CURV].astype(np.float64)) / 10.0, 1e-3)
        v_target = float(np.min(np.sqrt(self.a_lat / curv + 2 * self.a_brake * np.maximum(_AHEAD_DIST - 4.0, 0.0))))
        gas = brake = 0.0
        if v < v_target:
            gas = 1.0 if p[_F["rear_slip"]] < self.slip_max else 0.0
        elif v > v_target + 5.0:
            brake = 0.8 * min(1.0, 0.1 * (v - v_target))
        return np.array([STEER_SCALE * steer, gas, brake], dtype=np.float32)

    def discrete(self, p: np.ndarray) -> int:
        steer, gas, brake = self.continuous(p)
        if abs(steer) > STEER_SCALE * self.steer_threshold:
            return 1 if steer > 0 else 2
        return 4 if brake > 0 else 3 if gas > 0 else 0

    def ppo_action(self, p: np.ndarray, action_space: str) -> np.ndarray | int:
        """The label in PPO's action space ([steer, throttle] or the discrete index)."""
        if action_space == "discrete":
            return self.discrete(p)
        steer, gas, brake = self.continuous(p)
        return np.array([steer / STEER_SCALE, gas - brake], dtype=np.float32)


@dataclass(frozen=True)
class RecoveryDriver(ScriptedDriver):
    """The ScriptedDriver with a way back: it turns a car that points against the course round and brings one
    far off the road back (collect.py --recovery-labels labels those states with it; the PPO experts never
    learnt them: the discrete one, standing backwards or on the grass, steers at full lock and never gasses).

    Pointing backwards (cos_heading_error < 0) it steers at full lock toward the pure-pursuit point (which then
    lies behind the car, on the side the centerline is: the turn that brings the car back over the road) at
    `turn_speed`. Discrete: the steering actions cut the gas, so a car slower than `min_speed` gets gas
    first (a standing car cannot turn). Otherwise it is the ScriptedDriver."""

    turn_speed: float = 20.0  # units/s while turning round: slow enough not to slide, fast enough to turn
    min_speed: float = 10.0  # units/s: a slower car needs gas before steering can turn it (discrete)
    far_offset: float = 2.0  # half-widths from the centerline (1 = the road's edge) beyond which needs() holds

    def needs(self, p: np.ndarray) -> bool:
        """A state the expert does not know: pointing against the course, or the car's centre more than
        `far_offset` half-widths from the centerline (a road width beyond the edge at the default)."""
        return facing_backwards(p) or bool(abs(p[_F["lateral_offset"]]) > self.far_offset)

    def continuous(self, p: np.ndarray) -> np.ndarray:
        action = super().continuous(p)
        if not facing_backwards(p):
            return action
        v = float(p[_F["v_forward"]]) * _SPEED_SCALE
        gas = 1.0 if v < self.turn_speed and p[_F["rear_slip"]] < self.slip_max else 0.0
        brake = 0.8 if v > self.turn_speed + 10.0 else 0.0
        return np.array([STEER_SCALE * math.copysign(1.0, action[0]), gas, brake], dtype=np.float32)

    def discrete(self, p: np.ndarray) -> int:
        action = super().discrete(p)
        if action in (1, 2) and float(p[_F["v_forward"]]) * _SPEED_SCALE < self.min_speed:
            return 3
        return action

    def env_action(self, p: np.ndarray, action_space: str) -> np.ndarray | int:
        """The label in the env's action space (what the recorder stores as expert_action)."""
        return self.discrete(p) if action_space == "discrete" else self.continuous(p)


def recovery_start(rng: np.random.Generator) -> dict[str, float]:
    """Reset options of a recovery start (collect.py --recovery-starts): the car standing anywhere on the lap,
    turned by any heading (half of them beyond 90 degrees) and shifted up to the road's edge."""
    return {"start_fraction": float(rng.random()), "start_turn": float(rng.uniform(-math.pi, math.pi)),
            "start_offset": float(rng.uniform(-1.0, 1.0))}


# --------------------------------------------------------------------------------------------- the env's spec
def _make(action_space: str = "continuous", *, render: bool = True, max_episode_steps: int = 1000,
          render_mode: str | None = None, side_cameras: bool = False, renderer: str = "pygame") -> gym.Env:
    if side_cameras:
        raise ValueError("CarRacing has one camera; side_cameras=True is for the udacity env")
    return make_carracing(action_space, render=render, max_episode_steps=max_episode_steps, render_mode=render_mode,
                          renderer=renderer)


def _make_spec() -> EnvSpec:
    return EnvSpec(
        name="carracing",
        gym_id="CarRacing-v3",
        description="gymnasium's CarRacing-v3: 96x96 top-down frames, 50 Hz, continuous [steer, gas, brake] or 5 "
                    "discrete actions",
        action_spaces=ACTION_SPACES,
        dt=DT,
        frame_shape=(STATE_H, STATE_W, 3),
        feature_names=FEATURE_NAMES,
        make=_make,
        make_expert_env=make_expert_env,
        make_train_env=make_train_env,
        expert_to_env_action=expert_to_env_action,
        env_to_expert_action=env_to_expert_action,
        teacher=ScriptedDriver,
        recovery_teacher=RecoveryDriver,
        recovery_start=recovery_start,
        action_names={"continuous": ("steer", "gas", "brake"), "discrete": DISCRETE_ACTION_NAMES},
        steer_limit={"continuous": _STEER_LIMIT, "discrete": 1.0},  # 0.4 rad = the wheel joint limit
        default_expert={"continuous": Path("checkpoints/expert_carracing_continuous.zip"),
                        "discrete": Path("checkpoints/expert_carracing_discrete.zip")},
        # DART defaults: as much perturbation as keeps most of the shipped experts' laps finished
        # (agent.data.config says why)
        default_noise={"continuous": 0.07, "discrete": 0.05},
        default_noise_hold={"continuous": 5, "discrete": 3},
        default_max_steps=1000,
        default_encoder="carracing",
        default_frame_stride=3,
        progress=lambda info: info["tiles_visited"] / max(info["num_tiles"], 1),
        lap_complete=lambda info: bool(info["lap_complete"]),
        on_road=lambda info: bool(info["on_track"]),
        wrong_way=lambda info: facing_backwards(info["privileged"]),
        gym_kwargs=lambda action_space: {"continuous": action_space == "continuous"},
        renderers=RENDERERS,  # ("pygame", "fast"): gymnasium's is the default and the reference
        speed_unit="units/s",  # Box2D's world units: CarRacing gives no metres
        episode_meta=lambda info: {"lap_complete": bool(info["lap_complete"]),
                                   "tiles_visited": int(info["tiles_visited"]), "num_tiles": int(info["num_tiles"]),
                                   "unvisited_tiles": info["unvisited_tiles"]},
    )


SPEC = _make_spec()
