"""The expert's view of an env: the observation becomes `info["privileged"]` and the camera frame is dropped."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class PrivilegedObservation(gym.Wrapper):
    """Observation = info["privileged"] (float32[n_features]); what SB3 PPO trains on. Wrap a physics-only env
    (render=False) and nothing is rendered at all."""

    def __init__(self, env: gym.Env, n_features: int) -> None:
        super().__init__(env)
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(n_features,), dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        _, info = self.env.reset(seed=seed, options=options)
        return info["privileged"], info

    def step(self, action):
        _, reward, terminated, truncated, info = self.env.step(action)
        return info["privileged"], reward, terminated, truncated, info
