"""Who drives an env, behind one interface (``reset(seed)``, ``act(frame, t, info, expert_action, on_the_way)``: the
privileged expert, or a trained policy through its streaming interface. Recording (DAgger students) and
evaluation both use these, so they sit below both."""
from __future__ import annotations

import time
from collections import deque
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from common.files import resolve_path
from envs.registry import ENV_NAMES, get_spec, spec_for_gym_id, trained_frame_shape
from policies.actions import DISCRETE_ACTION_RULES, DiscreteChooser, check_discrete_options, check_temperature


def load_driver(path: str | Path, env: str, action_space: str, actions: str | None = None,
                temperature: float | None = None, told_latency: float = 0.0) -> Any:
    """A DAgger student as a driver (agent.controllers.PolicyController on the CPU); ``actions`` / ``temperature``
    None: the checkpoint's own rule and temperature; ``told_latency``: seconds its actions take to land."""

    policy = load_policy(path, env, action_space, "cpu")
    check_discrete_options(policy.config.head, policy.config.discrete_actions, actions, temperature, False,
                           f"--driver {str(path)!r}", ("--driver-actions", "--driver-temperature", ""))
    return PolicyController(policy.eval(), name=Path(path).stem, actions=actions, temperature=temperature,
                            told_latency=told_latency)


def shipped_checkpoint(env: str) -> Path:
    """The NAC student this project ships for ``env`` (evaluate.py's default policy)."""
    return get_spec(env).shipped_student or Path(f"checkpoints/{env}_nac.pt")


class ExpertController:
    """The privileged expert as a driver (baseline): acts on info["privileged"], ignores the frame."""

    is_expert = True
    has_panel = False

    def __init__(self, expert: Any, name: str = "expert") -> None:
        self.expert, self.name = expert, name

    def reset(self, seed: int | None = None) -> None:
        pass

    def act(self, frame: np.ndarray, t: float, info: dict[str, Any], expert_action: Any,
            on_the_way: Sequence[Any] = ()) -> tuple[Any, float]:
        t0 = time.perf_counter()
        action = self.expert.act(info["privileged"])
        return action, time.perf_counter() - t0


class PolicyController:
    """A DrivingPolicy driven through its stream (one frame per step), with a frame buffer for the video."""

    is_expert = False

    def __init__(self, policy: Any, name: str, device: str = "cpu", clock: str = "steps",
                 env_names: Sequence[str] | None = None, actions: str | None = None,
                 temperature: float | None = None, spared: Sequence[int] = (), told_latency: float = 0.0) -> None:
        """``told_latency``: seconds from a frame to when its action lands, told to a latency-aware policy."""
        if actions is not None and actions not in DISCRETE_ACTION_RULES:
            raise ValueError(f"actions must be one of {DISCRETE_ACTION_RULES}, got {actions!r}")
        check_discrete_options(policy.config.head, policy.config.discrete_actions, actions, temperature, bool(spared),
                               name)
        if temperature is None:  # None: the checkpoint's (policies.config.PolicyConfig.temperature_for)
            temperature = policy.config.temperature_for(actions)
        actions = policy.config.discrete_actions if actions is None else actions  # None: the checkpoint's rule
        self.temperature = check_temperature(temperature, actions)
        self.spared = tuple(spared)
        self.policy, self.name, self.device, self.actions = policy, name, device, actions
        self.told_latency = float(told_latency)
        self.choose: DiscreteChooser | None = None
        self.config = policy.config
        self.stream = policy.stream(clock)
        self.span = self.stream.cache_len
        self.frames: deque[np.ndarray] = deque(maxlen=self.span)  # the camera frames of the stream's cache
        names = list(self.config.action_names)
        if env_names is None:  # the env action, in order (an env made with pi_speed takes [steer] alone)
            env_names = spec_for_gym_id(self.config.env).action_names.get("continuous", ())
        env_names = list(env_names)
        self.filled = [] if self.config.head == "discrete" else [
            n for n in env_names if n not in names and not (n == "throttle" and self.config.fixed_throttle is not None)]
        # (env column, head column) of the components both have: a head may predict more than the env takes
        # (a udacity-hard student's throttle in a replay, which drives at the recorded speed)
        take = [(env_names.index(n), i) for i, n in enumerate(names) if n in env_names] \
            if self.config.head != "discrete" else []
        self._cols, self._head_cols = [e for e, _ in take], [i for _, i in take]
        self._env_names = env_names
        # NAC cores expose attention internals; others draw no panel, nor one whose sequence is a frame's tokens.
        self.has_panel = callable(getattr(policy.core, "internals", None)) and \
            type(policy.core).__name__.lower().startswith("nac") and not self.config.frame_tokens
        # the env's throttle, where the policy drives with a fixed one (PolicyConfig.fixed_throttle)
        self._throttle = env_names.index("throttle") if "throttle" in env_names and self.config.head != "discrete" \
            and self.config.fixed_throttle is not None else None
        self._sync = device.startswith("cuda")

    def reset(self, seed: int | None = None) -> None:
        """A new episode; ``actions="sample"`` draws from a generator seeded by the track ``seed`` (an episode
        repeats exactly, in any worker), ``"dither"`` starts its error diffusion afresh."""
        self.stream.reset()
        self.frames.clear()
        if self.actions != "argmax":
            self.choose = DiscreteChooser(self.actions, seed, self.temperature, self.spared)

    def act(self, frame: np.ndarray, t: float, info: dict[str, Any], expert_action: Any,
            on_the_way: Sequence[Any] = ()) -> tuple[Any, float]:
        """``on_the_way``: the env actions chosen but not yet applied, next to land first (shown to a policy with
        ``queue_steps``)."""
        if not self.frames:
            self.frames.extend([frame] * self.span)
        else:
            self.frames.append(frame)
        t0 = time.perf_counter()
        out = self.stream.step(frame, t, self.told_latency, self.head_actions(on_the_way))
        if self._sync:
            torch.cuda.synchronize()
        latency = time.perf_counter() - t0
        action = self.policy.to_env_action(out, self.choose)
        if self.config.head == "discrete":
            return int(action), latency
        full = np.array(expert_action, dtype=np.float32).reshape(-1)[: len(self._env_names)].copy()  # the head lacks
        full[self._cols] = np.asarray(action, dtype=np.float32).reshape(-1)[self._head_cols]
        if self._throttle is not None:
            full[self._throttle] = self.config.fixed_throttle
        return full, latency

    def head_actions(self, env_actions: Sequence[Any]) -> np.ndarray | None:
        """Env actions ``[n, env]`` -> the head's columns ``[n, A]`` (None: the policy is shown none)."""
        if not self.config.queue_steps or not len(env_actions):
            return None
        env = np.asarray([np.asarray(a, np.float32).reshape(-1) for a in env_actions])
        out = np.zeros((len(env), self.config.action_dim), np.float32)
        out[:, self._head_cols] = env[:, self._cols]
        return out

    def window(self) -> tuple[torch.Tensor, torch.Tensor, list[float]] | None:
        """The stream's current window: embeddings [1, W, F], seconds [1, W] (last 0), and those seconds."""
        if not getattr(self.stream, "embeddings", None):
            return None
        window, rel = self.stream.window()
        return window, rel, rel[0].tolist()

    def window_frames(self) -> list[np.ndarray]:
        """The camera frames of the current window, oldest first."""
        return [self.frames[i] for i in self.stream.picks()]


def load_policy(path: str | Path, env: str, action_space: str | None, device: str, also: Sequence[str] = (),
                frame_shape: Sequence[int] | None = None, recorded: bool = False) -> Any:
    """Load a checkpoint and check it was made for ``env`` (or an env whose gym id is in ``also``, or one whose
    students ``env`` can feed: EnvSpec.feeds), for ``action_space`` when given, and for the frames it will see
    (``frame_shape``, default ``env``'s camera): trained on that size (policies.frames.check_frame_shape).
    ``recorded``: ``env`` is that of recorded data (evaluate.py --data), not a --env the user gave."""
    from policies.frames import check_frame_shape
    from policies.checkpoint import RECORDING_STUDENT, load_checkpoint, not_a_checkpoint_file

    spec = get_spec(env)
    p = resolve_path(path)
    if not p.is_file():
        hint = (" (the shipped student; train one with train.py, or pass --checkpoint CKPT or --expert-drives)"
                if Path(path) == shipped_checkpoint(env) else "")
        raise FileNotFoundError(not_a_checkpoint_file(p, "--checkpoint") + hint)
    policy = load_checkpoint(p, map_location=device)
    cfg = policy.config
    if cfg.env != spec.gym_id and cfg.env not in spec.feeds and cfg.env not in also:
        if spec.feeds:  # a replay: its env is the recording's, no --env to change
            from envs.replay.spec import REAL_UDACITY

            students = [e for e in ENV_NAMES if get_spec(e).gym_id in spec.feeds]
            # a person's recording: the student made for its frames, as evaluate.py takes by default
            example = RECORDING_STUDENT if spec.geometry == REAL_UDACITY else shipped_checkpoint(students[0])
            raise ValueError(f"checkpoint {str(path)!r} steers {cfg.env} frames; a replay shows {spec.frame_shape[0]}x"
                             f"{spec.frame_shape[1]} first-person camera frames and drives students of "
                             f"{', '.join(students)} (e.g. {example}, or one train.py made from the recording)")
        if recorded:
            raise ValueError(f"checkpoint {str(path)!r} was trained on env {cfg.env!r}; the data was recorded in {env} "
                             f"({spec.gym_id!r}): score a student of that env (e.g. {shipped_checkpoint(env)})")
        others = [e for e in ENV_NAMES if get_spec(e).gym_id == cfg.env]
        hint = f" (use --env {others[0]})" if others else ""
        raise ValueError(f"checkpoint {str(path)!r} was trained on env {cfg.env!r}, but --env {env} is "
                         f"{spec.gym_id!r}{hint}")
    if action_space is not None and cfg.action_space != action_space:
        raise ValueError(f"checkpoint {str(path)!r} is for the {cfg.action_space!r} action space, but "
                         f"--action-space {action_space} was given")
    if cfg.action_space not in spec.action_spaces:
        raise ValueError(f"checkpoint {str(path)!r} has action_space {cfg.action_space!r}; expected one of "
                         f"{spec.action_spaces}")
    check_frame_shape(trained_frame_shape(cfg), spec.frame_shape if frame_shape is None else frame_shape,
                      f"checkpoint {str(path)!r}", "the frames to score" if frame_shape is not None
                      else f"the camera frames of {spec.name}")
    return policy
