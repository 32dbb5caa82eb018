"""A privileged expert that drives under a known latency: it sees the latency and the actions already on their way.

Under a latency of D steps the action chosen now reaches the car D steps later, and the D actions chosen before it
reach the car first. The state is then the car's physics plus that queue: a policy that sees only the physics
cannot know where the queued actions will take the car. `LatencyQueue` makes the training env such a
delayed world (each episode's D drawn from a range, the env's neutral action until the first chosen one lands) and
appends to the privileged observation D (scaled by the range's top) and the queue, nearest first, zero-padded to
the range's top. PPO fine-tunes the regular expert in it (`widen_policy` copies its weights, the new inputs' weights
start at 0, so at the start it drives exactly as the regular expert); what it learns is the pace and the early
steering a late car needs, which hindsight labels from an expert that answers at once cannot teach.
"""
from __future__ import annotations

from collections import deque
from typing import Any

import gymnasium as gym
import numpy as np


def max_latency_of(card: dict) -> int:
    """The top of the latency range an expert's card says it was trained for (0: a regular expert)."""
    return int((card.get("latency_steps") or [0, 0])[1])


def extra_features(max_latency: int, action_dim: int) -> int:
    """How many features a latency expert adds to the privileged observation."""
    return 1 + max_latency * action_dim if max_latency else 0


def latency_observation(privileged: np.ndarray, latency: int, queue: Any, max_latency: int,
                        action_dim: int) -> np.ndarray:
    """The privileged features, then latency / max_latency, then the queued PPO actions (the next to land first),
    zeros past the queue's end; just the privileged features when max_latency is 0."""
    privileged = np.asarray(privileged, dtype=np.float32)
    if not max_latency:
        return privileged
    queued = np.zeros((max_latency, action_dim), np.float32)
    for k, action in enumerate(queue):
        queued[k] = action
    return np.concatenate([privileged, np.float32([latency / max_latency]), queued.ravel()])


class ActionDelay:
    """A latency of ``steps``: each action given reaches the env ``steps`` calls later, ``neutral`` until the first
    one lands (steps 0: straight through). ``pending`` holds the actions on their way, next to land first: what a
    latency expert or a queue student is shown. The one delay line of the latency expert's training env, of
    evaluate.py's timing conditions and of collect.py --latency-steps."""

    def __init__(self, steps: int, neutral: Any) -> None:
        self.pending: deque = deque([neutral] * int(steps))

    def __call__(self, action: Any) -> Any:
        if not self.pending:
            return action
        self.pending.append(action)
        return self.pending.popleft()


class LatencyQueue(gym.Wrapper):
    """Actions reach the wrapped env D steps after they are chosen; D is drawn per episode from lo..hi and shown,
    with the queue, in the observation (see the module docstring), widened for latencies up to ``shown`` (default
    hi; 0: the observation stays the env's, for an expert that is not told). Continuous PPO action spaces only."""

    def __init__(self, env: gym.Env, latency: tuple[int, int], seed: int = 0, shown: int | None = None) -> None:
        super().__init__(env)
        if not isinstance(env.action_space, gym.spaces.Box):
            raise ValueError("a latency expert needs a continuous action space (its queue is part of what it sees)")
        lo, hi = latency
        if not 0 <= lo <= hi:
            raise ValueError(f"latency range must be 0 <= lo <= hi, got {lo}:{hi}")
        self.lo, self.hi = int(lo), int(hi)
        self.shown = self.hi if shown is None else int(shown)
        if self.shown and self.shown < self.hi:
            raise ValueError(f"a latency expert trained for up to {self.shown} steps cannot be shown {self.hi}")
        self.action_dim = int(np.prod(env.action_space.shape))
        n = extra_features(self.shown, self.action_dim)
        base = env.observation_space
        low = np.concatenate([base.low, np.zeros(n, np.float32)])
        high = np.concatenate([base.high, np.ones(n, np.float32)])
        if n:
            low[len(base.low) + 1:] = np.tile(env.action_space.low, self.shown)
            high[len(base.high) + 1:] = np.tile(env.action_space.high, self.shown)
        self.observation_space = gym.spaces.Box(low.astype(np.float32), high.astype(np.float32), dtype=np.float32)
        self._rng = np.random.default_rng(seed)
        self.latency = self.lo
        self._delay = ActionDelay(0, None)

    def reset(self, **kwargs: Any):
        obs, info = self.env.reset(**kwargs)
        self.latency = int(self._rng.integers(self.lo, self.hi + 1))
        neutral = np.zeros(self.action_dim, np.float32)  # PPO's neutral action: no steering, no pedal
        self._delay = ActionDelay(self.latency, neutral)
        info["latency_steps"] = self.latency
        return self._observe(obs), info

    def step(self, action: Any):
        action = np.clip(np.asarray(action, np.float32).reshape(self.action_dim), self.env.action_space.low,
                         self.env.action_space.high)
        obs, reward, terminated, truncated, info = self.env.step(self._delay(action))
        info["latency_steps"] = self.latency
        return self._observe(obs), reward, terminated, truncated, info

    def _observe(self, obs: np.ndarray) -> np.ndarray:
        return latency_observation(obs, self.latency, self._delay.pending, self.shown, self.action_dim)


def widen_policy(source: Any, target: Any) -> None:
    """Copy a trained SB3 policy's weights into one whose observation has more features: the first layers' weights
    for the new features start at 0 (the widened policy answers as the source on any observation); every other
    tensor must match in shape."""
    import torch

    src, dst = source.policy.state_dict(), target.policy.state_dict()
    with torch.no_grad():
        for name, value in dst.items():
            old = src[name]
            if old.shape == value.shape:
                value.copy_(old)
            elif value.dim() == 2 and old.shape[0] == value.shape[0] and old.shape[1] < value.shape[1]:
                value.zero_()
                value[:, : old.shape[1]] = old
            else:
                raise ValueError(f"cannot widen {name}: {tuple(old.shape)} -> {tuple(value.shape)}")
    target.policy.load_state_dict(dst)
