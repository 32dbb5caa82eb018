"""The named environments (the --env values): which module defines each one's `SPEC`, and the questions asked of all
of them. Adding an env means writing its module and one line in `_MODULES`.

A replay (envs/replay/) builds its spec from these, and `envs.registry` adds the replay to them; this module
imports neither, so the lookups stay free of circles.
"""
from __future__ import annotations

import importlib
from typing import Any

from driving_data.dataset import REPLAY_PREFIX, dataset_env_name
from envs.spec import EnvSpec

# env name -> module that defines SPEC (imported on first use: each pulls its own dependencies)
_MODULES: dict[str, str] = {"carracing": "envs.carracing", "udacity": "envs.udacity.spec",
                             "udacity-hard": "envs.udacity.hard_spec", "udacity-real": "envs.udacity.real_spec"}
ENV_NAMES: tuple[str, ...] = tuple(_MODULES)


def named_spec(name: str) -> EnvSpec:
    """The spec of the named env `name`; ValueError listing the valid names otherwise."""
    if name not in _MODULES:
        raise ValueError(f"--env must be one of {list(ENV_NAMES)} or {REPLAY_PREFIX}FOLDER (a dataset replayed), got "
                         f"{name!r}")
    return importlib.import_module(_MODULES[name]).SPEC


def dataset_env(card: dict, episodes: list[dict]) -> EnvSpec:
    """The spec of the env a dataset was recorded in (``driving_data.dataset.dataset_env_name``: a replay's dataset
    belongs to the env of the recording it replays, always a named one)."""
    return named_spec(dataset_env_name(card, episodes))


def camera_envs(frame_shape: Any) -> tuple[str, ...]:
    """Gym ids of the first-person envs whose camera frames have ``frame_shape``: their students can steer such frames
    (a real recording's, or a replay's)."""
    specs = (named_spec(name) for name in ENV_NAMES)
    return tuple(s.gym_id for s in specs if s.first_person and tuple(s.frame_shape) == tuple(frame_shape))


def real_frames_env() -> str:
    """The env whose students are made for the real simulator's recorded frames (EnvSpec.real_frames)."""
    return next(name for name in ENV_NAMES if named_spec(name).real_frames)


def spec_for_gym_id(gym_id: str) -> EnvSpec:
    """The spec whose gymnasium id is `gym_id` (a checkpoint's PolicyConfig.env)."""
    for name in ENV_NAMES:
        spec = named_spec(name)
        if spec.gym_id == gym_id:
            return spec
    raise ValueError(f"no environment of this project has the gymnasium id {gym_id!r}")
