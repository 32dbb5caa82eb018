"""A trained privileged PPO expert, loaded and acting: deterministic env actions from the env's privileged
feature vector (``info["privileged"]``), plus a batched evaluation with the true env reward. Recording,
evaluation and the expert's own training use it; building one is agent/experts/ppo.py."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import gymnasium as gym
import numpy as np

from agent.experts.latency import LatencyQueue, extra_features, latency_observation, max_latency_of
from common.files import resolve_path
from envs.registry import EnvSpec, get_spec


def space_of(model: Any) -> str:
    if isinstance(model.action_space, gym.spaces.Discrete):
        return "discrete"
    return "continuous"


class Expert:
    """A trained PPO expert: deterministic env actions from the privileged feature vector."""

    def __init__(self, model: Any, spec: EnvSpec, action_space: str, card: dict[str, Any],
                 path: Path | None = None) -> None:
        self.model = model
        self.spec = spec
        self.action_space = action_space
        self.card = card
        self.path = path
        # a latency expert (agent.experts.latency): trained under latencies up to this many steps, which it is shown
        self.max_latency = max_latency_of(card)

    @classmethod
    def load(cls, path: str | Path | None = None, action_space: str | None = None, env: str = "carracing") -> "Expert":
        """Load an SB3 PPO .zip (and its JSON card). path=None -> the env's shipped expert for `action_space`
        (default: the env's first action space)."""
        from stable_baselines3 import PPO

        spec = get_spec(env)
        action_space = spec.check_action_space(action_space or spec.action_spaces[0])
        if spec.builtin_expert is not None:  # a replay's path controller: nothing to load
            if path is not None:
                raise ValueError(f"--expert: {env}'s expert is built in (it steers back to the recorded path); "
                                 f"drop --expert {str(path)!r}")
            return spec.builtin_expert()
        p = resolve_path(Path(path) if path is not None else spec.default_expert[action_space])
        if not p.is_file():
            raise FileNotFoundError(
                f"expert file not found: {str(p)!r} (expected an SB3 PPO .zip; train one with "
                f"`python -m agent.experts.ppo train --env {env} --action-space {action_space} --out {p}`)"
            )
        try:
            model = PPO.load(p, device="cpu")
        except Exception as exc:  # corrupt zip, not an SB3 file, ...
            raise ValueError(f"expert file {str(p)!r} is not a loadable SB3 PPO model: {exc}") from exc
        got = space_of(model)
        if got != action_space:
            raise ValueError(f"expert file {str(p)!r} is a {got!r} expert, but "
                             f"action_space={action_space!r} was requested")
        card_path = p.with_suffix(".json")
        card = json.loads(card_path.read_text()) if card_path.is_file() else {}
        n = len(spec.feature_names)
        max_latency = max_latency_of(card)
        if max_latency:
            n += extra_features(max_latency, int(np.prod(model.action_space.shape)))
        if model.observation_space.shape != (n,):
            raise ValueError(
                f"expert file {str(p)!r} expects observations of shape {model.observation_space.shape}, "
                f"but the {env} env provides {n} privileged features (is it an expert for another env, or a "
                f"latency expert without its card?)"
            )
        return cls(model, spec, action_space, card, p)

    def _obs(self, privileged: np.ndarray) -> np.ndarray:
        obs = np.asarray(privileged, dtype=np.float32)
        n = len(self.spec.feature_names)
        if obs.shape != (n,):
            raise ValueError(f"privileged must have shape ({n},), got {obs.shape}")
        return obs

    def act(self, privileged: np.ndarray, latency: int = 0, on_the_way: Sequence[Any] = ()) -> np.ndarray | int:
        """Deterministic env action (float32 array, or an int for a discrete expert). A latency expert is also
        shown ``latency`` (steps until this action lands) and the env actions ``on_the_way`` (next to land first);
        a regular one ignores both."""
        obs = self._obs(privileged)
        if self.max_latency:
            if not 0 <= latency <= self.max_latency or len(on_the_way) != latency:
                raise ValueError(f"a latency expert for up to {self.max_latency} steps was shown latency {latency} "
                                 f"with {len(on_the_way)} actions on the way")
            queue = [self.spec.env_to_expert_action(a) for a in on_the_way]
            obs = latency_observation(obs, latency, queue, self.max_latency, len(self.model.action_space.low))
        action, _ = self.model.predict(obs, deterministic=True)
        return self.spec.expert_to_env_action(action, self.action_space)

    def action_probs(self, privileged: np.ndarray) -> np.ndarray:
        """Discrete experts only: the policy's probabilities of the discrete actions, float32[n]."""
        import torch

        if self.action_space != "discrete":
            raise ValueError("action_probs is only defined for a discrete expert, this one is 'continuous'")
        obs, _ = self.model.policy.obs_to_tensor(self._obs(privileged))
        with torch.no_grad():
            probs = self.model.policy.get_distribution(obs).distribution.probs
        return probs[0].cpu().numpy().astype(np.float32)


@dataclass
class EvalResult:
    seeds: list[int]
    returns: list[float]
    lengths: list[int]
    laps: list[bool]
    off_road_steps: list[int]  # steps with spec.on_road(info) false (CarRacing: no wheel on the road;
    # udacity: a wheel over the road's edge line, a lane departure)

    @property
    def mean(self) -> float:
        return float(np.mean(self.returns))

    @property
    def std(self) -> float:
        return float(np.std(self.returns))

    def summary(self) -> str:
        return (
            f"return {self.mean:.1f} ± {self.std:.1f} over {len(self.returns)} episodes "
            f"(seeds {self.seeds[0]}..{self.seeds[-1]}), laps finished {sum(self.laps)}/{len(self.laps)}, "
            f"episodes with off-road steps {sum(n > 0 for n in self.off_road_steps)}, "
            f"mean length {np.mean(self.lengths):.0f} frames"
        )


def evaluate_model(model: Any, spec: EnvSpec, action_space: str, seeds: Sequence[int], *, render: bool = False,
                   max_episode_steps: int | None = None, latencies: Sequence[int] | None = None,
                   max_latency: int = 0) -> EvalResult:
    """Run one deterministic episode per track seed with the TRUE env reward; envs step in lockstep
    so the policy runs batched. ``latencies``: per track, the steps its actions take to land (a latency
    expert, agent.experts.latency, trained for latencies up to ``max_latency``, sees them; a regular one does not)."""
    steps = max_episode_steps or spec.default_max_steps
    envs = [spec.make_expert_env(action_space, render=render, max_episode_steps=steps) for _ in seeds]
    if latencies is not None:
        envs = [LatencyQueue(env, (d, d), shown=max_latency) for env, d in zip(envs, latencies)]
    obs = np.stack([env.reset(seed=int(s))[0] for env, s in zip(envs, seeds)])
    returns = np.zeros(len(seeds))
    lengths = np.zeros(len(seeds), dtype=int)
    off_road = np.zeros(len(seeds), dtype=int)
    laps = [False] * len(seeds)
    alive = np.ones(len(seeds), dtype=bool)
    while alive.any():
        idx = np.flatnonzero(alive)
        actions, _ = model.predict(obs[idx], deterministic=True)
        for j, a in zip(idx, actions):
            o, r, term, trunc, info = envs[j].step(a)
            obs[j] = o
            returns[j] += r
            lengths[j] += 1
            off_road[j] += not spec.on_road(info)
            if term or trunc:
                alive[j] = False
                laps[j] = spec.lap_complete(info)
    for env in envs:
        env.close()
    return EvalResult(list(map(int, seeds)), returns.tolist(), lengths.tolist(), laps, off_road.tolist())
