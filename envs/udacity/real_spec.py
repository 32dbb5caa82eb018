"""`--env udacity-real` (UdacityStyle-v2): the hard world's roads seen through the real simulator's camera and
drawn in its look, a new variant per track seed (real_look.py): what a student trains on to steer the real
simulator's frames without a recording.

Everything but the frames and the wheelbase is the hard world's (hard_spec.py): tracks, themes and conditions
(mountain and fog held out), the privileged features, the shipped PPO expert. The car has the real simulator's
wheelbase (2.87 m, v1: 2.5 m), so a steering label means the curvature it means in a recording. The student's crop is
the real recordings' one (rows 60..135 of the 160-row frame: sky and hood off at the real camera's pitch).
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import gymnasium as gym

from envs.udacity import REAL_LOOK_ENV_ID, UdacityPrivilegedObservation, hard_spec
from envs.udacity.real_look import REAL_WHEELBASE_M


def make(action_space: str = "continuous", **kwargs: Any) -> gym.Env:
    """The hard world's env (hard_spec.make, same arguments) with the real look and the real car's wheelbase."""
    return hard_spec.make(action_space, look="real", wheelbase_m=REAL_WHEELBASE_M, **kwargs)


def make_expert_env(action_space: str = "continuous", *, render: bool = False, max_episode_steps: int = 1000,
                    themes: Any = None, conditions: Any = None) -> gym.Env:
    """The privileged observation over this car (the hard world's expert drives it)."""
    return UdacityPrivilegedObservation(make(action_space, render=render, max_episode_steps=max_episode_steps,
                                             themes=themes, conditions=conditions))


def make_train_env(action_space: str = "continuous") -> gym.Env:
    """The expert's training env: this car, physics-only."""
    return make_expert_env(action_space)


SPEC = replace(
    hard_spec.SPEC,
    name="udacity-real",
    gym_id=REAL_LOOK_ENV_ID,
    description="the hard world seen as the real Udacity simulator shows its roads: its camera (1.2 m, 9.4 degrees "
                "down, 60 degrees vertical), yellow or white edge lines, two-lane jungle roads driven in the right "
                "lane, sand/dirt/grass verges, a new variant per track seed; for students that steer real frames",
    make=make,
    make_expert_env=make_expert_env,
    make_train_env=make_train_env,
    default_crop=(60, 135),
    shipped_student=Path("checkpoints/udacity_sim2real_nac.pt"),
    real_frames=True,
)
