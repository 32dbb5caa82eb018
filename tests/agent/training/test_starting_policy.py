"""The policy a run starts from (agent/training/starting_policy.py), built directly on a tiny synthetic dataset: a new
one normalised with the training split, --init's with its own normalisation and the run's drive options, and the
refusals in one line."""
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from agent.training.config import resolve, with_env_defaults
from agent.training.data import load_data, resolve_head
from agent.training.starting_policy import build_policy, drive_options, fine_tuned
from policies.checkpoint import save_checkpoint
from tests.agent.training.test_experiment import tiny_args, write_synthetic


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return write_synthetic(tmp_path_factory.mktemp("start"), episodes=2, length=16)


def _plan(data_dir: Path, out: Path, **kw):
    plan = with_env_defaults(resolve(tiny_args(data_dir, out, policy="mlp", image_size="32x32", **kw)))
    data = load_data(plan.data)
    return plan, data, resolve_head(plan, data)


def test_drive_options_are_only_those_given_away_from_their_defaults(data_dir, tmp_path):
    plan, _, _ = _plan(data_dir, tmp_path / "run")
    assert drive_options(plan.model) == {}
    told = replace(plan.model, steer_gain=3.0, steer_gain_from=0.01, fixed_throttle=0.05)
    assert drive_options(told) == {"steer_gain": 3.0, "steer_gain_from": 0.01, "fixed_throttle": 0.05}


def test_a_new_policy_normalises_its_targets_with_the_training_split(data_dir, tmp_path):
    plan, data, head = _plan(data_dir, tmp_path / "run")
    targets = np.array([[0.5, 0.0, 0.2], [-0.5, 1.0, 0.2]], dtype=np.float32)[:, : len(head.names)]
    policy = build_policy(plan.model, plan.specs[0], data, head.kind, head.names, targets, None, tmp_path)
    c = policy.config
    assert c.core == "mlp" and c.env == data.env.gym_id
    assert np.allclose(c.target_mean, targets.mean(0))
    assert np.allclose(c.target_std, [0.5, 0.5, 1e-2][: len(head.names)])  # a constant target: the floor, not 0


def test_a_new_argmax_policy_refuses_a_sampling_temperature(data_dir, tmp_path):
    plan, data, head = _plan(data_dir, tmp_path / "run")
    model = replace(plan.model, action_temperature=0.5)
    with pytest.raises(ValueError, match="--action-temperature: a new student drives argmax"):
        build_policy(model, plan.specs[0], data, head.kind, head.names, np.zeros((2, 3), np.float32), None, tmp_path)


def test_init_keeps_the_checkpoints_weights_and_takes_the_runs_drive_options(data_dir, tmp_path):
    plan, data, head = _plan(data_dir, tmp_path / "run")
    targets = np.random.default_rng(0).normal(size=(8, len(head.names))).astype(np.float32)
    start = build_policy(plan.model, plan.specs[0], data, head.kind, head.names, targets, None, tmp_path)
    path = tmp_path / "start.pt"
    save_checkpoint(path, start)
    model = replace(plan.model, init=str(path), steer_gain=2.0)
    policy = fine_tuned(model, data, head.kind, head.names)
    assert policy.config.steer_gain == 2.0 and policy.config.target_mean == start.config.target_mean
    for a, b in zip(policy.state_dict().values(), start.state_dict().values()):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match=r"^--init .*steer"):
        fine_tuned(replace(model, steer_gain=-1.0), data, head.kind, head.names)
