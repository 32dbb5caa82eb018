"""`--env udacity-hard` (UdacityStyle-v1): the Udacity-style simulator's hard world, for the rest of the project.

What makes it hard (see track.py, scene.py, env.py): hills and crests (the camera pitches, the road vanishes
over a crest), tighter bends and hairpins, things beside the road that hide it, the car's hood, a third theme
"mountain" (narrow, steep, walls), lighting and weather conditions, and speed control: the driver's action
is [steer, throttle] (throttle < 0 brakes), with speed limits per theme and gravity on the slopes.

Scenes: each episode's theme and condition are drawn from the lists given to `make` by track seed, so any
run of consecutive seeds covers every combination evenly: theme = themes[seed % T], condition =
conditions[(seed // T) % C]. Generalisation split: collection draws the train themes (lake, jungle) and
train conditions (clear, overcast, dusk) unless asked; mountain and fog are held out for evaluation.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from envs.udacity import StanleyDriver, UdacityPrivilegedObservation, UdacityStyleEnv
from envs.udacity import spec as classic
from envs.udacity.env import CONDITIONS, HARD_FEATURE_NAMES, N_FEATURES
from envs.udacity.track import THEMES
from envs.udacity.vehicle import DRAG, MAX_ACCEL, MAX_BRAKE, MAX_STEER_RAD, ROLLING, G

ACTION_SPACES = ("continuous",)  # [steer, throttle]; make(pi_speed=True) leaves the speed to a PI controller
TRAIN_THEMES = ("lake", "jungle")
TRAIN_CONDITIONS = ("clear", "overcast", "dusk")


class SceneBySeed(gym.Wrapper):
    """Chooses every episode's theme and condition from its track seed (see the module docstring)."""

    def __init__(self, env: gym.Env, themes: tuple[str, ...], conditions: tuple[str, ...]) -> None:
        super().__init__(env)
        self.themes, self.conditions = tuple(themes), tuple(conditions)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        options = dict(options or {})
        if seed is not None:
            options.setdefault("theme", self.themes[int(seed) % len(self.themes)])
            options.setdefault("condition", self.conditions[(int(seed) // len(self.themes)) % len(self.conditions)])
        return self.env.reset(seed=seed, options=options)


def make(action_space: str = "continuous", *, render: bool = True, max_episode_steps: int = 1000,
         render_mode: str | None = None, side_cameras: bool = False, renderer: str = "native",
         themes: Any = None, conditions: Any = None, pi_speed: bool = False, **kwargs: Any) -> gym.Env:
    """The hard world as collect.py / evaluate.py use it. `themes` / `conditions` ("a,b" or a sequence; None: all)
    are the lists episodes draw from by seed. The action is [steer, throttle]; with `pi_speed` it is [steer] and a
    PI controller holds the theme's speed limit (for steering-only students)."""
    SPEC.check_action_space(action_space)
    SPEC.check_renderer(renderer)
    themes = SPEC.check_scene("theme", THEMES if themes is None else themes)
    conditions = SPEC.check_scene("condition", CONDITIONS if conditions is None else conditions)
    env = UdacityStyleEnv(world="hard", render=render, cameras=classic.CAMERAS_ALL if side_cameras else ("center",),
                          throttle_action=not pi_speed, max_episode_steps=max_episode_steps,
                          render_mode=render_mode, **kwargs)
    return SceneBySeed(env, themes, conditions)


def make_expert_env(action_space: str = "continuous", *, render: bool = False, max_episode_steps: int = 1000,
                    themes: Any = None, conditions: Any = None) -> gym.Env:
    """Privileged observation (HARD_FEATURE_NAMES), the env's action: what the PPO expert acts in."""
    return UdacityPrivilegedObservation(make(action_space, render=render, max_episode_steps=max_episode_steps,
                                             themes=themes, conditions=conditions))


def make_train_env(action_space: str = "continuous") -> gym.Env:
    """The expert's training env: every theme and condition (the expert is privileged: it may see the held-out
    ones, as a driving instructor knows every road), physics-only."""
    return make_expert_env(action_space, render=False)


def expert_to_env_action(action: Any, action_space: str) -> np.ndarray:
    """PPO's [steer, throttle] in [-1, 1] is the env's action (clipped)."""
    return np.clip(np.asarray(action, dtype=np.float32).reshape(2), -1.0, 1.0)


_I = {name: k for k, name in enumerate(HARD_FEATURE_NAMES)}
_CURV = [(d, _I[f"ahead{d}m_curv"]) for d in (2, 4, 7, 10, 14, 20, 28, 40)]


@dataclass
class SpeedPlanTeacher(StanleyDriver):
    """Stanley steering plus a speed plan: the highest speed from which every bend within 40 m can be taken at
    `lateral_accel` by braking at `decel`, capped by the theme's limit; the throttle is a P law on that speed with
    feed-forward of drag, rolling resistance and the slope. The PPO expert's warm start."""

    lateral_accel: float = 3.5  # m/s^2
    decel: float = 3.0  # m/s^2
    speed_gain: float = 1.5  # m/s^2 of demanded acceleration per m/s of speed error

    def target_speed(self, p: np.ndarray) -> float:
        limit = float(p[_I["speed_limit"]]) * 20.0
        v = limit
        for d, col in _CURV:
            kappa = abs(float(p[col])) / 12.0
            if kappa > 1e-4:
                v = min(v, math.sqrt(self.lateral_accel / kappa + 2.0 * self.decel * max(d - 2.0, 0.0)))
        return v

    def act(self, privileged: np.ndarray) -> np.ndarray:
        p = np.asarray(privileged, dtype=np.float64)
        steer = min(max(self.steer_angle(p[:N_FEATURES]) / MAX_STEER_RAD, -1.0), 1.0)
        v = float(p[_I["speed"]]) * 20.0
        grade = float(p[_I["grade"]]) / 10.0
        err = self.target_speed(p) - v
        ff = (DRAG * v * v + ROLLING + G * grade) / MAX_ACCEL
        u = self.speed_gain * err / MAX_ACCEL + ff
        if u < 0:  # braking: the brake is stronger than the engine
            u = max(u * MAX_ACCEL / MAX_BRAKE, -1.0)
        return np.array([steer, min(u, 1.0)], np.float32)

    __call__ = act

    def ppo_action(self, obs: np.ndarray, action_space: str) -> np.ndarray:
        return self.act(obs)


def _episode_meta(info: dict) -> dict:
    return {**classic.SPEC.episode_meta(info), "condition": str(info["condition"])}


# v0's description with what the hard world changes; everything else (progress, laps, lane departures, recovery,
# lateral error, wrong way, encoder, image size, colour space, JPEG quality) is v0's
SPEC = replace(
    classic.SPEC,
    name="udacity-hard",
    gym_id="UdacityStyle-v1",
    description="the Udacity-style simulator's hard world: hills and crests, hairpins, roadside objects, the hood, "
                "themes lake/jungle/mountain, conditions clear/overcast/dusk/fog, steering and throttle/brake",
    action_spaces=ACTION_SPACES,
    feature_names=tuple(HARD_FEATURE_NAMES),
    make=make,
    make_expert_env=make_expert_env,
    make_train_env=make_train_env,
    expert_to_env_action=expert_to_env_action,
    teacher=SpeedPlanTeacher,
    action_names={"continuous": ("steer", "throttle")},
    default_expert={"continuous": Path("checkpoints/expert_udacity_hard.zip")},
    episode_meta=_episode_meta,
    default_crop=(40, 146),  # sky and hood off; the horizon moves with the pitch on hills, so more rows above
    default_color_jitter=0.5,  # the held-out theme and condition have colours the training scenes lack
    recorded_info={**classic.SPEC.recorded_info, "speed": "speed", "brake": "brake"},
    stall=(0.5, 3.0, 5.0),
    themes=THEMES,
    train_themes=TRAIN_THEMES,
    conditions=CONDITIONS,
    train_conditions=TRAIN_CONDITIONS,
    pi_speed=True,
)
