"""The policy a run starts from: the resumed one (--resume), the --init checkpoint's as this run fine-tunes it (its
weights and target normalisation kept, checked to drive this dataset's env), or a new one built from the flags."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from agent.training.config import Model, core_options
from agent.training.data import Data
from envs.registry import camera_envs, trained_frame_shape
from policies.actions import check_temperature
from policies.checkpoint import policy_from_checkpoint, read_checkpoint
from policies.config import PolicyConfig
from policies.encoders import encoder_features
from policies.policy import DrivingPolicy, told_as_input


def initial_policy(path: str, data: Data, head: str, names: list[str] | None, time_input: str | None,
                   discrete_actions: str | None = None, temperature: float | None = None,
                   latency_input: str | None = None, queue_steps: int | None = None) -> DrivingPolicy:
    """--init: the checkpoint's policy, checked to drive this dataset's env and predict its actions (its frame size
    and crop already shaped the data: agent.training.init_shape.checkpoint_shape), fed ``time_input`` and driving with
    ``discrete_actions`` at ``temperature`` from now on (None: the checkpoint's; a new rule starts at 1), shown
    ``queue_steps`` of its actions on their way (None: the checkpoint's). Its target normalisation is kept: the
    weights were trained against it."""
    policy = policy_from_checkpoint(read_checkpoint(path), f"--init {path!r}")
    c = policy.config
    queue_steps = c.queue_steps if queue_steps is None else queue_steps
    if latency_input == "input":
        policy = told_as_input(policy, queue_steps)  # its weights kept, any new inputs' at 0
        c = policy.config
    c.time_input = time_input or c.time_input
    c.latency_input = latency_input or c.latency_input  # clock on a nac core adds no weights (checkpoint_shape)
    c.validate()
    c.action_temperature = c.temperature_for(discrete_actions)
    c.discrete_actions = discrete_actions or c.discrete_actions
    if temperature is not None:
        try:
            c.action_temperature = check_temperature(temperature, c.discrete_actions)
        except ValueError as e:
            raise ValueError(f"--action-temperature: {e} (--init {path!r} drives {c.discrete_actions}; add "
                             "--discrete-actions sample)") from None
    # a student of another first-person env whose frames have this data's shape (a simulator student fine-tuned on
    # a real recording) becomes this env's student
    same_camera = c.env in camera_envs(data.env.frame_shape) if data.env.first_person else False
    expected = {"env": c.env if same_camera else data.env.gym_id, "head": head}
    if head == "continuous":
        expected["action_names"] = list(names or [])
    got = {"env": c.env, "head": c.head, "action_names": list(c.action_names)}
    wrong = [f"{k} {got[k]!r} (the data needs {v!r})" for k, v in expected.items() if got[k] != v]
    if wrong:
        raise ValueError(f"--init {path!r} cannot be fine-tuned on this dataset: its " + "; ".join(wrong))
    if data.frame_shape:  # its crop and size are made for the frames it was trained on
        from policies.frames import check_frame_shape

        check_frame_shape(trained_frame_shape(c), data.frame_shape, f"--init {path!r}", "this dataset's frames")
    c.env = data.env.gym_id  # its frame_shape stays: the data's frames are that size (checked above)
    return policy


def fine_tuned(m: Model, data: Data, head: str, names: list[str] | None) -> DrivingPolicy:
    """--init's policy as this run fine-tunes it (initial_policy with the run's settings; its drive-time steering
    gain and throttle unless given); a checkpoint the data cannot fine-tune is refused (agent.training.experiment
    asks before writing into the run folder)."""
    policy = initial_policy(m.init, data, head, names, m.time_input, m.discrete_actions, m.action_temperature,
                            m.latency_input, m.latency_queue)
    told = drive_options(m)
    if told:
        for key, value in told.items():
            setattr(policy.config, key, value)
        try:
            policy.config.validate()
        except ValueError as e:
            raise ValueError(f"--init {m.init!r}: {e}") from None
    return policy


def drive_options(m: Model) -> dict[str, Any]:
    """The drive-time options (--steer-gain, --steer-gain-from, --fixed-throttle) given away from their defaults,
    as PolicyConfig fields."""
    told = {"steer_gain": m.steer_gain, "steer_gain_from": m.steer_gain_from, "fixed_throttle": m.fixed_throttle}
    defaults = {"steer_gain": 1.0, "steer_gain_from": 0.0, "fixed_throttle": None}
    return {k: v for k, v in told.items() if v != defaults[k]}


def build_policy(m: Model, core_spec: str, data: Data, head: str, names: list[str] | None,
                 train_targets: np.ndarray, resumed: dict[str, Any] | None, where: Path) -> DrivingPolicy:
    """The policy to train: the resumed one, the --init checkpoint's, or a new one whose continuous targets are
    normalised with the training split's statistics."""
    if resumed:
        return policy_from_checkpoint(resumed, f"checkpoint {str(where)!r}")
    if m.init is not None:
        return fine_tuned(m, data, head, names)
    if m.action_temperature not in (None, 1.0) and not m.discrete_actions:
        raise ValueError("--action-temperature: a new student drives argmax, which takes the likeliest action at any "
                         "temperature (add --discrete-actions sample)")
    core, options = core_options(m, core_spec)
    extra: dict[str, Any] = {"frame_tokens": m.frame_tokens, "head_hidden": m.head_hidden, **drive_options(m)}
    if head == "continuous":
        extra |= {"target_mean": train_targets.mean(0).astype(float).tolist(),
                  "target_std": np.maximum(train_targets.std(0), 1e-2).astype(float).tolist()}
    config = PolicyConfig.for_actions(
        head, names, encoder=m.encoder, feature_dim=encoder_features(m.encoder, data.image_size, m.feature_dim),
        core=core, core_options=options,
        window=m.window, frame_stride=m.frame_stride, frame_period=data.frame_period,
        time_input=m.time_input or "seconds",
        image_size=data.image_size, crop=data.crop, frame_shape=list(data.frame_shape) if data.frame_shape else None,
        color=m.color if m.color != "auto" else data.env.default_color,
        action_space=data.action_space, env=data.env.gym_id, discrete_actions=m.discrete_actions or "argmax",
        action_temperature=m.action_temperature or 1.0, latency_input=m.latency_input or "none",
        queue_steps=m.latency_queue or 0, **extra)
    return DrivingPolicy(config)


def init_anchor(init: str, policy: DrivingPolicy) -> list[tuple[torch.nn.Parameter, torch.Tensor]]:
    """--stay-near-init: each trainable weight of ``policy`` paired with its value in the --init checkpoint, on the
    weight's device; a weight the checkpoint lacks (an input added since: told_as_input) is not pulled."""
    start = read_checkpoint(init)["state_dict"]
    return [(p, start[name].to(p.device, p.dtype)) for name, p in policy.named_parameters()
            if p.requires_grad and name in start and start[name].shape == p.shape]
