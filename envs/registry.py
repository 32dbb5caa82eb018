"""Every environment by its --env name, the one place `agent/`, the CLIs and the benchmarks ask: a named env
(`envs.catalog`) or "replay:FOLDER", a dataset replayed in closed loop (`envs.replay.spec`).

The types live in `envs.spec` and the named envs in `envs.catalog`; both are re-exported here, so callers import
from one module. The replay builds on the catalogue, and only this module sees both.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from driving_data.dataset import REPLAY_PREFIX
from envs.catalog import ENV_NAMES, camera_envs, dataset_env, named_spec, real_frames_env, spec_for_gym_id
from envs.spec import EnvSpec, SeedRanges

__all__ = ["ENV_NAMES", "REPLAY_PREFIX", "EnvSpec", "SeedRanges", "camera_envs", "dataset_env", "get_spec",
           "neutral_action", "real_frames_env", "spec_for_gym_id", "trained_frame_shape"]


def get_spec(name: str) -> EnvSpec:
    """The spec of env `name` (a --env value, or "replay:FOLDER"); ValueError listing the valid names otherwise."""
    if name.startswith(REPLAY_PREFIX):  # built from the folder's dataset, imported on first use like the named envs
        from envs.replay.spec import replay_spec
        return replay_spec(name[len(REPLAY_PREFIX):])
    return named_spec(name)


def neutral_action(space: Any) -> Any:
    """What the env receives before the first delayed action arrives: a Discrete space's first action
    (CarRacing: noop), a Box's zeros (clipped into its bounds): no steering, no gas, no brake."""
    if hasattr(space, "n"):
        return int(getattr(space, "start", 0))
    return np.clip(np.zeros(space.shape, dtype=space.dtype), space.low, space.high)


def trained_frame_shape(config: Any) -> tuple[int, ...]:
    """The camera frames [H, W, C] a policy was trained on, from its config (a ``PolicyConfig``: its ``frame_shape``
    and the gym id of its ``env``): the config's, else (a checkpoint that does not say) its env's camera."""
    return tuple(config.frame_shape) if config.frame_shape else tuple(spec_for_gym_id(config.env).frame_shape)
