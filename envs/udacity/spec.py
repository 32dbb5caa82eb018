"""The udacity env's description for the rest of the project (see envs.registry).

Tracks alternate between the two themes by seed parity (even seeds `lake`, odd seeds `jungle`), so any
run of consecutive seeds -- collection from 3,000,000, evaluation from 1000, the expert's validation
and training draws -- covers both themes equally: seeds 1000..1019 are 10 lake and 10 jungle tracks.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from envs.spec import EnvSpec
from envs.udacity.env import recovery_start
from envs.udacity.track import CLASSIC_THEMES
from envs.udacity import (
    DT,
    FEATURE_NAMES,
    FRAME_H,
    FRAME_W,
    StanleyDriver,
    UdacityPrivilegedObservation,
    UdacityStyleEnv,
)

CAMERAS_ALL = ("left", "center", "right")


def theme_of_seed(seed: int) -> str:
    """Even track seeds are lake tracks, odd ones jungle tracks."""
    return CLASSIC_THEMES[int(seed) % len(CLASSIC_THEMES)]


class ThemeBySeed(gym.Wrapper):
    """Chooses the theme of every episode from its track seed (see the module docstring)."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        if seed is not None and not (options or {}).get("theme"):
            options = {**(options or {}), "theme": theme_of_seed(seed)}
        return self.env.reset(seed=seed, options=options)


def make(action_space: str = "continuous", *, render: bool = True, max_episode_steps: int = 1000,
         render_mode: str | None = None, side_cameras: bool = False, renderer: str = "native",
         **kwargs: Any) -> gym.Env:
    """The udacity env as collect.py / evaluate.py use it; `side_cameras` puts the left and right camera
    frames into info["frame_left"] / info["frame_right"]. It has one renderer, its own ("native")."""
    SPEC.check_action_space(action_space)
    SPEC.check_renderer(renderer)
    env = UdacityStyleEnv(render=render, cameras=CAMERAS_ALL if side_cameras else ("center",),
                          max_episode_steps=max_episode_steps, render_mode=render_mode, **kwargs)
    return ThemeBySeed(env)


def make_expert_env(action_space: str = "continuous", *, render: bool = False,
                    max_episode_steps: int = 1000) -> gym.Env:
    """Privileged observation, steering action: what the PPO expert acts in."""
    return UdacityPrivilegedObservation(make(action_space, render=render, max_episode_steps=max_episode_steps))


def make_train_env(action_space: str = "continuous") -> gym.Env:
    """The expert's training env: the env's own reward (progress, cross-track and jerk penalties), physics-only."""
    return make_expert_env(action_space, render=False)


def expert_to_env_action(action: Any, action_space: str) -> np.ndarray:
    """PPO's steering in [-1, 1] is the env's action (clipped)."""
    return np.clip(np.asarray(action, dtype=np.float32).reshape(1), -1.0, 1.0)


class SteeringTeacher(StanleyDriver):
    """The Stanley driver as the expert's BC warm-start teacher (labels in PPO's action space)."""

    def ppo_action(self, obs: np.ndarray, action_space: str) -> np.ndarray:
        return np.asarray(self.act(obs), dtype=np.float32).reshape(1)


SPEC = EnvSpec(
    name="udacity",
    gym_id="UdacityStyle-v0",
    description="the project's Udacity-style first-person lane-keeping simulator: 160x320 left/center/right "
                "cameras, 10 Hz, steering in [-1, 1] (±25°), speed held by a PI controller",
    action_spaces=("continuous",),
    dt=DT,
    frame_shape=(FRAME_H, FRAME_W, 3),
    feature_names=tuple(FEATURE_NAMES),
    make=make,
    make_expert_env=make_expert_env,
    make_train_env=make_train_env,
    expert_to_env_action=expert_to_env_action,
    teacher=SteeringTeacher,
    action_names={"continuous": ("steer",)},
    steer_limit={"continuous": 1.0},
    default_expert={"continuous": Path("checkpoints/expert_udacity.zip")},
    default_noise={"continuous": 0.1},
    default_noise_hold={"continuous": 3},
    default_max_steps=1000,
    default_encoder="pilotnet",
    default_frame_stride=1,
    progress=lambda info: int(info["laps"]) + float(info["progress"]),
    lap_complete=lambda info: int(info["laps"]) >= 1,
    on_road=lambda info: not info["lane_departure"],
    episode_meta=lambda info: {"lap_complete": int(info["laps"]) >= 1, "laps": int(info["laps"]),
                               "distance": round(float(info["distance"]), 2), "theme": str(info["theme"])},
    first_person=True,
    default_crop=(60, 135),  # PilotNet recipe: rows 60..135 of the 160-row frame (sky and bonnet off)
    default_image_size=(66, 200),
    default_color="yuv",
    recorded_info={"frames_left": "frame_left", "frames_right": "frame_right", "throttle": "throttle",
                   "cte": "cte", "heading_error": "heading_error", "steering_angle": "steering_angle"},
    jpeg_quality=95,
    recover=lambda env, speed=None: env.unwrapped.recenter(speed),
    recovery_start=recovery_start,
    lateral_error=lambda info: abs(float(info["cte"])),
    wrong_way=lambda info: abs(float(info["heading_error"])) > np.pi / 2,
    renderers=("native",),  # envs/udacity/camera.py draws its cameras; there is no other
)
