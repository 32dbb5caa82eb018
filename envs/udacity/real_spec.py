"""`--env udacity-real` (UdacityStyle-v2): the hard world's roads seen through the real simulator's camera and
drawn in its look, a new variant per track seed (real_look.py): what a student trains on to steer the real
simulator's frames without a recording.

Everything but the frames is the hard world's (hard_spec.py): tracks, themes and conditions (mountain and fog held
out), the car, the privileged features, the shipped PPO expert. The student's crop is the real recordings' one
(rows 60..135 of the 160-row frame: sky and hood off at the real camera's pitch).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

import gymnasium as gym

from envs.udacity import hard_spec

gym_id = "UdacityStyle-v2"


def make(action_space: str = "continuous", **kwargs: Any) -> gym.Env:
    """The hard world's env (hard_spec.make, same arguments) with the real look."""
    return hard_spec.make(action_space, look="real", **kwargs)


SPEC = replace(
    hard_spec.SPEC,
    name="udacity-real",
    gym_id=gym_id,
    description="the hard world seen as the real Udacity simulator shows its roads: its camera (1.2 m, 9.4 degrees "
                "down, 60 degrees vertical), yellow or white edge lines, two-lane jungle roads driven in the right "
                "lane, sand/dirt/grass verges, a new variant per track seed; for students that steer real frames",
    make=make,
    default_crop=(60, 135),
)
