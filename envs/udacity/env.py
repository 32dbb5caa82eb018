"""`UdacityStyleEnv`: first-person lane keeping on procedural tracks, in the Udacity simulator's formats.

The real Udacity self-driving-car simulator (Unity) cannot run here; this env speaks its formats:
320x160 RGB frames from a left/center/right camera rig (camera.py), steering normalised to [-1, 1]
= ±25 deg of wheel angle, throttle in [0, 1], speed also in mph. Physics: a kinematic bicycle at
10 Hz (vehicle.py, DT = 0.1 s). Tracks: closed loops from an integer seed per theme (track.py).

Spaces:
* observation: the center camera, uint8 [160, 320, 3] RGB (all zeros with render=False: the
  physics-only mode for training a privileged expert; the physics never depends on the frames, so
  every trajectory is identical with and without rendering).
* action: float32 [steer] in [-1, 1] (+ = right); with throttle_action=True [steer, throttle] where
  throttle > 0 accelerates and < 0 brakes (otherwise a PI controller holds the target speed).
  Values outside [-1, 1] are clipped.

Conventions: metres, seconds, radians unless a key says otherwise; + = RIGHT for steering, cross-track
error, heading error, yaw rate and curvature (as envs/carracing.py). The car frame has x to the
car's right and y forward. The cross-track error is measured at the car's centre.

Reward (per step, for PPO):
* + progress: metres gained along the centreline / (target_speed * DT) (about 1 at target speed,
  negative when driving backwards);
* - CTE_WEIGHT * (cte / road_half_width)^2: stay near the centre (-0.5 per step on the edge line);
* - JERK_WEIGHT * (steer command - previous steer command)^2: smooth steering;
* OFF_ROAD_PENALTY (-10) once, and the episode terminates, when the car's centre is more than
  OFF_ROAD_MARGIN_M (1 m of verge) beyond the road edge.
Truncation after `max_episode_steps` steps, or once `max_laps` laps are completed.

`recenter()` puts the car back on the centreline (an "intervention", as in NVIDIA's autonomy
measure: autonomy = 1 - interventions * 6 s / elapsed time).
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any, cast

import cv2
import gymnasium as gym
import numpy as np

from common.checks import is_int
from envs import privileged

from .camera import CAMERAS, FRAME_H, FRAME_W, Renderer
from .scene import HillsRenderer, check_look
from .track import Track, check_seed, check_theme, check_world, generate_track
from .vehicle import CAR_WIDTH_M, DT, MAX_STEER_DEG, MAX_STEER_RAD, MPH_PER_MPS, WHEELBASE_M, Vehicle

TARGET_SPEED = {"lake": 9.0, "jungle": 7.0, "mountain": 6.0}  # m/s (20, 16, 13 mph): the PI controller's set-point
# The hard world's speed limit (22 mph; target_speed overrides it): the throttle is the driver's, the progress reward
# stops growing above the limit, so a driver is paid for holding it where it can and slowing where it must. One
# limit for every theme: a camera-only student can see a bend coming, not a theme's invisible limit.
HARD_SPEED_LIMIT = 10.0
CONDITIONS = ("clear", "overcast", "dusk", "fog")  # the hard world's lighting / weather (camera.CONDITION_LOOKS)
RENDER_VIEWS = ("hud", "chase")
OFF_ROAD_MARGIN_M = 1.0  # verge beyond the road edge before the car counts as off the road
OFF_ROAD_PENALTY = -10.0
CTE_WEIGHT = 0.5
JERK_WEIGHT = 0.1

# Look-ahead distances along the centreline, from the car's projection on it (m).
LOOKAHEAD_M: tuple[float, ...] = (2.0, 4.0, 7.0, 10.0, 14.0, 20.0, 28.0, 40.0)
SPEED_SCALE = 20.0  # m/s
YAW_RATE_SCALE = 2.0  # rad/s (full lock at 9 m/s turns at 1.7 rad/s)
HALF_WIDTH_SCALE = 5.0  # m (the lake's road half-width)
CURV_SCALE = 12.0  # m: the jungle's tightest bend (radius 12 m) reads ±1

_BASE_FEATURES: tuple[str, ...] = (
    "cte",  # cross-track error / road half-width, + = car right of the centreline (±1 = on an edge line's outer side)
    "sin_heading_error",  # sin(road direction - car heading), + = car points to the right of the road
    "cos_heading_error",  # cos of the same angle (negative = driving backwards)
    "speed_ratio",  # speed / target speed (1 = at the set-point)
    "speed",  # speed / 20 m/s
    "steer",  # actual front-wheel angle / 25 deg, + = right (lags the command: STEER_TAU_S)
    "yaw_rate",  # yaw rate over the last step, + = turning right, / 2 rad/s
    "half_width",  # road half-width / 5 m (lake 1.0, jungle 0.7): turns `cte` back into metres
)
_LOOKAHEAD_FIELDS: tuple[str, ...] = (
    "x",  # centreline point, car-frame right coordinate / look-ahead distance
    "y",  # centreline point, car-frame forward coordinate / look-ahead distance (1 = dead ahead)
    "curv",  # signed centreline curvature there, + = right-hand bend, x 12 m
)
FEATURE_NAMES: tuple[str, ...] = _BASE_FEATURES + tuple(
    f"ahead{int(d)}m_{field}" for d in LOOKAHEAD_M for field in _LOOKAHEAD_FIELDS
)
N_FEATURES = len(FEATURE_NAMES)
_N_BASE = len(_BASE_FEATURES)
# The hard world appends what a driver needs for hills and speed (FEATURE_NAMES stays a prefix, so v0 drivers read
# the same columns): the grade under the car and the road's height ahead relative to the car's.
DZ_AHEAD_M: tuple[float, ...] = (10.0, 20.0, 40.0)
DZ_SCALE = 5.0  # m
HARD_FEATURE_NAMES: tuple[str, ...] = FEATURE_NAMES + (
    "grade",  # rise per metre of the road under the car along its heading (+ = uphill), x 10
    *(f"ahead{int(d)}m_dz" for d in DZ_AHEAD_M),  # road height there minus the car's, / 5 m
    "speed_limit",  # the speed limit in force (HARD_SPEED_LIMIT or target_speed) / 20 m/s
)


# reset options that start the car elsewhere than on the centre line at the target speed (collect.py
# --recovery-starts): the lateral offset as a fraction of the road's half-width (+ = right), the heading turned
# by this many radians (+ = counter-clockwise), the speed as a fraction of the target speed
START_OPTIONS = {"start_offset": (-1.0, 1.0, 0.0), "start_turn": (-math.pi / 2, math.pi / 2, 0.0),
                 "start_speed_ratio": (0.0, 1.5, 1.0)}  # (lowest, highest, default)


def check_start(options: dict[str, Any]) -> dict[str, float]:
    """The start options of a reset (defaults filled in), each a finite number within its range, else ValueError."""
    start = {}
    for name, (lo, hi, default) in START_OPTIONS.items():
        v = options.get(name, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
            raise ValueError(f"reset option {name} must be a number in [{lo:.3g}, {hi:.3g}], got {v!r}")
        start[name] = float(v)
    return start


def recovery_start(rng: np.random.Generator) -> dict[str, float]:
    """Reset options of a recovery start (collect.py --recovery-starts): the car anywhere in its lane's inner
    part, turned by up to 0.3 rad, at up to the target speed (0: standing), so that getting back to the centre
    and up to speed are in the expert's data (it otherwise only sees the centre line at cruising speed)."""
    return {"start_offset": float(rng.uniform(-0.6, 0.6)), "start_turn": float(rng.uniform(-0.3, 0.3)),
            "start_speed_ratio": float(rng.uniform(0.0, 1.0))}


@lru_cache(maxsize=64)
def _track(seed: int, theme: str, world: str = "classic") -> Track:
    """Tracks are pure functions of (seed, theme, world): cache them across resets."""
    return generate_track(seed, theme, world)


def _check_cameras(cameras: Any) -> tuple[str, ...]:
    if isinstance(cameras, str) or not isinstance(cameras, (tuple, list)):
        raise ValueError(f"cameras must be a tuple of names from {CAMERAS} including 'center', got {cameras!r}")
    cams = tuple(cameras)
    if not cams or any(c not in CAMERAS for c in cams) or len(set(cams)) != len(cams) or "center" not in cams:
        raise ValueError(
            f"cameras must be distinct names from {CAMERAS} and include 'center' (the observation), got {cameras!r}"
        )
    return tuple(c for c in CAMERAS if c in cams)


class _TrackArrays:
    """Per-track table for the privileged look-ahead, so a step needs one [8, 8] @ [8, 3] product.

    rows[i, k] holds, for the centreline point i + offset_k (offset_k = the k-th look-ahead distance d_k
    in points), (x / d_k, y / d_k, curvature * CURV_SCALE, 1 / d_k) and the difference of those to the
    next point (for linear interpolation at a fractional index; the last difference entry is 0). The
    1 / d_k scaling folds the feature scale into the table, and the homogeneous 1 / d_k column carries
    the translation to the car frame, so features = rows[i] @ B(car pose, fraction) (see _measure).
    """

    def __init__(self, track: Track) -> None:
        self.track = track
        # One shared fraction for all look-aheads: the index offsets are rounded, an error of
        # < 0.01 m at 40 m since the spacing is within 0.1% of 0.5 m.
        offsets = np.array([int(round(d / track.ds)) for d in LOOKAHEAD_M])
        n = track.n
        xyk1 = np.column_stack([track.points, track.curvature * CURV_SCALE, np.ones(n)])
        nxt = np.roll(xyk1, -1, axis=0) - xyk1  # difference to the next point (last column 0)
        idx = (np.arange(n)[:, None] + offsets[None, :]) % n  # [n, 8]
        inv_d = 1.0 / np.asarray(LOOKAHEAD_M)
        scale = np.column_stack([inv_d, inv_d, np.ones_like(inv_d), inv_d])[None]  # [1, 8, 4]
        self.rows = np.ascontiguousarray(np.concatenate([xyk1[idx] * scale, nxt[idx] * scale], axis=2))  # [n, 8, 8]


class UdacityStyleEnv(gym.Env):
    """Udacity-style lane keeping (see the module doc for spaces, conventions and reward).

    info at reset and every step: privileged (float32[N_FEATURES], FEATURE_NAMES order), speed (m/s),
    speed_mph, steering_angle (actual wheel angle, degrees), steer (the same / 25 deg, in [-1, 1]),
    throttle (0..1 applied), brake (0..1 applied), cte (m, + = right of the centreline), heading_error
    (rad, + = car points right of the road), progress (fraction of the current lap, 0..1), distance (m
    along the centreline since reset, signed), laps (completed laps), lane_departure (a wheel is past an
    edge line's outer side), off_road (the episode ends), road_half_width (m), track_seed, theme; and
    frame_left / frame_right (uint8 [160, 320, 3]) when those cameras are rendered.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": int(round(1 / DT))}

    def __init__(
        self,
        theme: str = "lake",
        *,
        render: bool = True,
        cameras: tuple[str, ...] = ("center",),
        target_speed: float | None = None,
        throttle_action: bool = False,
        domain_randomization: bool = False,
        max_episode_steps: int = 3000,
        max_laps: int | None = None,
        render_mode: str | None = None,
        render_view: str = "hud",
        world: str = "classic",
        look: str = "sim",
        wheelbase_m: float = WHEELBASE_M,
    ) -> None:
        super().__init__()
        self.theme = check_theme(theme)
        self.world = check_world(world)
        self.hard = self.world == "hard"
        self.look = check_look(look)
        self.wheelbase_m = float(wheelbase_m)
        if self.look != "sim" and not self.hard:
            raise ValueError(f"look={look!r} draws the hard world's scenes: it needs world='hard'")
        self.cameras = _check_cameras(cameras)
        if target_speed is not None and not (isinstance(target_speed, (int, float)) and 0 < target_speed <= 25):
            raise ValueError(f"target_speed must be None (theme default) or in (0, 25] m/s, got {target_speed!r}")
        if not is_int(max_episode_steps, 1):
            raise ValueError(f"max_episode_steps must be a positive int, got {max_episode_steps!r}")
        if max_laps is not None and not is_int(max_laps, 1):
            raise ValueError(f"max_laps must be None or a positive int, got {max_laps!r}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be None or one of {self.metadata['render_modes']}, got {render_mode!r}")
        if render_mode is not None and not render:
            raise ValueError(f"render_mode={render_mode!r} needs render=True (physics-only mode draws nothing)")
        if render_view not in RENDER_VIEWS:
            raise ValueError(f"render_view must be one of {RENDER_VIEWS}, got {render_view!r}")
        self.render_frames = bool(render)
        self.target_speed_arg = None if target_speed is None else float(target_speed)
        self.throttle_action = bool(throttle_action)
        self.domain_randomization = bool(domain_randomization)
        self.max_episode_steps = max_episode_steps
        self.max_laps = max_laps
        self.render_mode = render_mode
        self.render_view = render_view
        self.observation_space = gym.spaces.Box(0, 255, shape=(FRAME_H, FRAME_W, 3), dtype=np.uint8)
        n_act = 2 if self.throttle_action else 1
        self.action_space = gym.spaces.Box(-1.0, 1.0, shape=(n_act,), dtype=np.float32)
        self._n_act = n_act
        self.feature_names = HARD_FEATURE_NAMES if self.hard else FEATURE_NAMES
        self._blank = np.zeros((FRAME_H, FRAME_W, 3), np.uint8)
        self._blank.flags.writeable = False  # shared by every physics-only step
        # camera.Renderer, or scene.HillsRenderer in the hard world (whose poses carry the grade)
        self._renderer: Any = None
        self._renderer_key: tuple | None = None
        self.track: Track | None = None
        self.vehicle: Vehicle | None = None
        self.episode_theme = self.theme
        self.condition = "clear"
        self.track_seed = -1
        self.n_recenters = 0

    # --- episode -------------------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Build track `seed` of the theme (options={"theme": ...} overrides it for this episode) and put
        the car on its start line at the target speed. seed=None draws the track from the env's RNG."""
        if seed is not None:
            seed = check_seed(seed)
        super().reset(seed=seed)
        options = dict(options or {})
        unknown = set(options) - {"theme", "condition", *START_OPTIONS}
        if unknown:
            raise ValueError(f"reset options may only contain 'theme', 'condition' and {', '.join(START_OPTIONS)}, "
                             f"got {sorted(unknown)}")
        start = check_start(options)
        theme = check_theme(options.get("theme", self.theme))
        condition = options.get("condition", "clear")
        if condition not in (CONDITIONS if self.hard else ("clear",)):
            raise ValueError(f"condition must be one of {CONDITIONS if self.hard else ('clear',)} in the {self.world} "
                             f"world, got {condition!r}")
        track_seed = seed if seed is not None else int(self.np_random.integers(0, 2**31 - 1))
        self.episode_theme, self.track_seed, self.condition = theme, track_seed, condition
        self.track = _track(track_seed, theme, self.world)
        self._arrays = _TrackArrays(self.track)
        self.target_speed = self.target_speed_arg or (HARD_SPEED_LIMIT if self.hard else TARGET_SPEED[theme])
        self.vehicle = Vehicle(self.target_speed, wheelbase=self.wheelbase_m)
        x, y, heading = self.track.pose_at(0.0)
        lateral = start["start_offset"] * self.track.half_width  # + = right of the centreline
        yaw = heading + start["start_turn"]
        self.vehicle.reset(0.0, 0.0, yaw, speed=start["start_speed_ratio"] * self.target_speed)
        self.vehicle.place_center(x + lateral * math.sin(heading), y - lateral * math.cos(heading), yaw)
        if self.render_frames:
            key = (theme, track_seed, self.domain_randomization, self.world, condition, self.look)
            if key != self._renderer_key:  # the texture is the expensive part of a reset: reuse it
                self._renderer = None  # free the old texture before drawing the new one
                if self.hard:
                    self._renderer = HillsRenderer(self.track, theme, track_seed, condition=condition,
                                                   domain_randomization=self.domain_randomization, look=self.look)
                else:
                    self._renderer = Renderer(self.track, theme, track_seed,
                                              domain_randomization=self.domain_randomization)
                self._renderer_key = key
        self._hint = 0
        self._s = 0.0
        self._distance = 0.0
        self._prev_steer_cmd = 0.0
        self._steps = 0
        self.n_recenters = 0
        self._measure()
        return self._observe()

    def step(self, action):
        steer_cmd, throttle_cmd = self._parse_action(action)
        veh = self.vehicle
        if veh is None:
            raise RuntimeError("call reset() before step()")
        veh.step(steer_cmd, throttle_cmd, self._grade if self.hard else 0.0)
        self._steps += 1
        s_old = self._s
        self._measure()
        ds = self._s - s_old
        length = self.track.length
        if ds > 0.5 * length:  # crossed the start line backwards
            ds -= length
        elif ds < -0.5 * length:  # crossed it forwards
            ds += length
        self._distance += ds
        hw = self.track.half_width
        paid = ds if not self.hard else min(ds, self.target_speed * DT)  # no pay for speeding in the hard world
        reward = paid / (self.target_speed * DT) - CTE_WEIGHT * (self._cte / hw) ** 2
        reward -= JERK_WEIGHT * (steer_cmd - self._prev_steer_cmd) ** 2
        self._prev_steer_cmd = steer_cmd
        terminated = abs(self._cte) > hw + OFF_ROAD_MARGIN_M
        if terminated:
            reward += OFF_ROAD_PENALTY
        obs, info = self._observe()
        truncated = self._steps >= self.max_episode_steps or (
            self.max_laps is not None and info["laps"] >= self.max_laps
        )
        return obs, float(reward), bool(terminated), bool(truncated), info

    def recenter(self, speed: float | None = None):
        """Put the car on the nearest centreline point, heading along the road, wheels straight; lap bookkeeping
        and (unless `speed` is given, m/s) the speed are kept. Returns (obs, info) for the new state. Counted in
        `n_recenters`."""
        veh, track = self.vehicle, self.track
        if veh is None or track is None:
            raise RuntimeError("call reset() before recenter()")
        self._measure()  # the nearest centreline point of where the car is now
        x, y, yaw = track.pose_at(self._s)
        veh.place_center(x, y, yaw)
        veh.state.steer = 0.0
        if speed is not None:
            veh.state.speed = max(float(speed), 0.0)
        self._prev_steer_cmd = 0.0
        self.n_recenters += 1
        self._measure()
        return self._observe()

    # --- internals -----------------------------------------------------------------------------

    def _parse_action(self, action) -> tuple[float, float | None]:
        """(steer in [-1, 1], throttle in [-1, 1] or None). Any array-like of n values is accepted."""
        n = self._n_act
        a = action.tolist() if type(action) is np.ndarray else action
        if type(a) is not list or len(a) != n or type(a[0]) is not float:
            arr = np.asarray(action, dtype=np.float64)
            if arr.size != n:
                what = "[steer, throttle]" if n == 2 else "[steer]"
                raise ValueError(f"action must have shape ({n},) = {what}, got shape {arr.shape}: {action!r}")
            a = arr.reshape(n).tolist()
        steer = a[0]
        if not -1.0 <= steer <= 1.0:  # also catches NaN
            if steer != steer:
                raise ValueError(f"action must be finite, got {action!r}")
            steer = 1.0 if steer > 1.0 else -1.0
        if n == 1:
            return steer, None
        throttle = a[1]
        if throttle != throttle:
            raise ValueError(f"action must be finite, got {action!r}")
        return steer, throttle

    def _measure(self) -> None:
        """Project the car on the track: arc length, cross-track and heading errors, privileged features."""
        veh, track = self.vehicle, self.track
        assert veh is not None and track is not None  # after reset()
        st = veh.state
        half = 0.5 * veh.wheelbase
        c, s = math.cos(st.yaw), math.sin(st.yaw)
        cx, cy = st.x + half * c, st.y + half * s
        s_arc, lateral, idx = track.project(cx, cy, self._hint)
        self._hint, self._s, self._cte = idx, s_arc, lateral
        self._center = (cx, cy, st.yaw)
        he = track.heading_at(s_arc) - st.yaw
        he = (he + math.pi) % (2.0 * math.pi) - math.pi
        self._heading_error = he
        u = s_arc / track.ds
        i0 = int(u)
        f = u - i0
        if i0 >= track.n:  # s_arc a rounding error below the length
            i0 -= track.n
        # Interpolate at fraction f and turn world into car frame (x right, y forward) in one product:
        # columns (x, y, curvature, 1) + f * their differences, times [[s, c, 0], [-c, s, 0], [0, 0, 1], [t]].
        tx, ty = c * cy - s * cx, -c * cx - s * cy
        fs, fc = f * s, f * c
        b = np.array([s, c, 0.0, -c, s, 0.0, 0.0, 0.0, 1.0, tx, ty, 0.0,
                      fs, fc, 0.0, -fc, fs, 0.0, 0.0, 0.0, f, f * tx, f * ty, 0.0]).reshape(8, 3)
        feats = np.empty(len(self.feature_names), np.float32)
        feats[_N_BASE:N_FEATURES] = (self._arrays.rows[i0] @ b).ravel()
        feats[:_N_BASE] = (
            lateral / track.half_width,
            math.sin(he),
            math.cos(he),
            st.speed / self.target_speed,
            st.speed / SPEED_SCALE,
            st.steer / MAX_STEER_RAD,
            st.yaw_rate / YAW_RATE_SCALE,
            track.half_width / HALF_WIDTH_SCALE,
        )
        if self.hard:
            # grade along the car's heading: the road's grade times cos(heading error) (driving backwards, uphill
            # is downhill); heights ahead along the centreline from the car's projection
            self._grade = track.grade_at(s_arc) * math.cos(he)
            z0 = track.elevation_at(s_arc)
            feats[N_FEATURES] = 10.0 * self._grade
            for k, d in enumerate(DZ_AHEAD_M):
                feats[N_FEATURES + 1 + k] = (track.elevation_at(s_arc + d) - z0) / DZ_SCALE
            feats[-1] = self.target_speed / SPEED_SCALE
            self._z = z0
        self._feats = feats

    def _observe(self) -> tuple[np.ndarray, dict[str, Any]]:
        veh, track = self.vehicle, self.track
        assert veh is not None and track is not None  # after reset()
        st = veh.state
        hw = track.half_width
        length = track.length
        dist = self._distance
        laps = int(dist // length) if dist > 0 else 0
        progress = min(max(dist / length - laps, 0.0), 1.0)
        cte = self._cte
        info: dict[str, Any] = {
            "privileged": self._feats,
            "speed": st.speed,
            "speed_mph": st.speed * MPH_PER_MPS,
            "steering_angle": math.degrees(st.steer),
            "steer": st.steer / MAX_STEER_RAD,
            "throttle": st.throttle,
            "brake": st.brake,
            "cte": cte,
            "heading_error": self._heading_error,
            "progress": progress,
            "distance": dist,
            "laps": laps,
            "lane_departure": abs(cte) > hw - 0.5 * CAR_WIDTH_M,
            "off_road": abs(cte) > hw + OFF_ROAD_MARGIN_M,
            "road_half_width": hw,
            "track_seed": self.track_seed,
            "theme": self.episode_theme,
            "condition": self.condition,
        }
        if not self.render_frames:
            self._obs = self._blank
            return self._blank, info
        r = self._renderer
        pose = self._center if not self.hard else (*self._center, self._grade)
        obs = r.render(pose, "center")
        if "left" in self.cameras:
            info["frame_left"] = r.render(pose, "left")
        if "right" in self.cameras:
            info["frame_right"] = r.render(pose, "right")
        self._obs = obs
        self._info = info
        return obs, info

    # --- rendering -----------------------------------------------------------------------------

    def render(self):
        """render_mode="rgb_array": the HUD view (center camera x2 with steering, speed, CTE, lap) or the
        chase view (render_view="chase": behind and above the car, car drawn, same read-outs)."""
        if self.render_mode is None:
            gym.logger.warn("render() called without a render_mode; make the env with render_mode='rgb_array'")
            return None
        if self.vehicle is None:
            raise RuntimeError("call reset() before render()")
        if self.render_view == "chase":
            pose = self._center if not self.hard else (*self._center, self._grade)
            frame = self._renderer.render_chase(pose, self.vehicle.state.steer)
        else:
            frame = cv2.resize(self._obs, (2 * FRAME_W, 2 * FRAME_H), interpolation=cv2.INTER_LINEAR)
        _draw_hud(frame, self._info, self._prev_steer_cmd, self.n_recenters)
        return frame

    def close(self) -> None:
        self._renderer = None
        self._renderer_key = None
        super().close()


def _draw_hud(frame: np.ndarray, info: dict[str, Any], steer_cmd: float, recenters: int) -> None:
    """Read-outs on a [H, W, 3] RGB frame: text box (speed, CTE, lap and progress, throttle) and a
    steering wheel at the bottom (its spoke turns with the actual wheel angle; the tick = the command)."""
    h, w = frame.shape[:2]
    box = frame[6:80, 6:236]
    box[:] = (box * 0.45).astype(np.uint8)
    white, font = (255, 255, 255), cv2.FONT_HERSHEY_SIMPLEX
    cte_col = (255, 90, 80) if info["lane_departure"] else white
    brake = f" brk {info['brake']:.2f}" if info["brake"] else ""
    lines = [
        (f"{info['speed_mph']:5.1f} mph   thr {info['throttle']:.2f}{brake}", white),
        (f"CTE {info['cte']:+5.2f} m  head {math.degrees(info['heading_error']):+5.1f} deg", cte_col),
        (f"lap {info['laps'] + 1}  {100 * info['progress']:5.1f} %  {info['theme']} #{info['track_seed']}", white),
        (f"steer {info['steering_angle']:+5.1f} deg" + (f"  recentred x{recenters}" if recenters else ""), white),
    ]
    for k, (text, col) in enumerate(lines):
        cv2.putText(frame, text, (12, 24 + 17 * k), font, 0.45, col, 1, cv2.LINE_AA)
    # Steering wheel: rim, spoke at the actual wheel angle (x 3.6 for visibility), command tick on the rim.
    rad = 30
    c = (w - rad - 16, h - rad - 16)  # bottom right: clear of the road ahead and of the car in the chase view
    cv2.circle(frame, c, rad, (20, 20, 20), 7, cv2.LINE_AA)
    cv2.circle(frame, c, rad, (200, 200, 200), 2, cv2.LINE_AA)
    a = math.radians(info["steering_angle"] * 3.6)
    for sgn in (-1.0, 1.0):
        end = (int(c[0] + sgn * rad * math.cos(a)), int(c[1] + sgn * rad * math.sin(a)))
        cv2.line(frame, c, end, (230, 230, 230), 3, cv2.LINE_AA)
    cv2.line(frame, c, (int(c[0] - rad * math.sin(a)), int(c[1] + rad * math.cos(a))), (230, 230, 230), 3, cv2.LINE_AA)
    t = math.radians(steer_cmd * MAX_STEER_DEG * 3.6) - math.pi / 2
    tick = (int(c[0] + rad * math.cos(t)), int(c[1] + rad * math.sin(t)))
    cv2.circle(frame, tick, 4, (255, 200, 40), -1, cv2.LINE_AA)
    # Cross-track bar: the car's position between the road edges.
    bx0, bx1, by = w // 2 - 120, w // 2 + 120, h - 8
    cv2.line(frame, (bx0, by), (bx1, by), (200, 200, 200), 1, cv2.LINE_AA)
    for xe in (bx0, (bx0 + bx1) // 2, bx1):
        cv2.line(frame, (xe, by - 4), (xe, by + 4), (200, 200, 200), 1)
    pos = int((bx0 + bx1) / 2 + max(-1.3, min(1.3, info["cte"] / info["road_half_width"])) * (bx1 - bx0) / 2)
    cv2.circle(frame, (pos, by), 5, cte_col, -1, cv2.LINE_AA)


class UdacityPrivilegedObservation(privileged.PrivilegedObservation):
    """Observation = info["privileged"] (float32[N_FEATURES]); the frame is dropped. For the udacity PPO expert."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env, len(cast(UdacityStyleEnv, env.unwrapped).feature_names))
