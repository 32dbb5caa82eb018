"""agent/controllers.py: who drives behind one interface (the expert on privileged state, a student through its
stream, filling the env's action where its head predicts less), and the checks of a checkpoint before it drives."""
import numpy as np
import pytest

from agent.controllers import ExpertController, PolicyController, load_policy
from policies.checkpoint import load_checkpoint
from tests.helpers import constant_policy_checkpoint, steering_checkpoint


def test_the_expert_acts_on_privileged_state_and_ignores_the_frame():
    seen = []
    expert = ExpertController(type("E", (), {"act": lambda self, p: seen.append(p) or "go"})())
    action, seconds = expert.act(None, 0.0, {"privileged": [1.0, 2.0]}, None)
    assert action == "go" and seen == [[1.0, 2.0]] and seconds >= 0 and expert.is_expert


def test_a_steering_student_drives_an_env_that_also_takes_throttle(tmp_path):
    policy = load_checkpoint(steering_checkpoint(tmp_path / "s.pt", steer=0.1))
    driver = PolicyController(policy.eval(), "s", env_names=["steer", "throttle"])
    driver.reset(seed=1)
    frame = np.zeros((160, 320, 3), np.uint8)
    for step in range(3):
        action, _ = driver.act(frame, step * 0.05, {}, np.array([0.9, 0.4], np.float32))
        assert action.tolist() == pytest.approx([0.1, 0.4], abs=1e-5), "its steering, the expert's throttle"
    assert len(driver.window_frames()) == policy.config.window and not driver.is_expert


def test_a_discrete_student_answers_an_action_id_and_refuses_an_unknown_rule(tmp_path):
    policy = load_checkpoint(constant_policy_checkpoint(tmp_path / "d.pt", action_space="discrete"))
    driver = PolicyController(policy.eval(), "d", actions="sample", temperature=1.0)
    driver.reset(seed=3)
    action, _ = driver.act(np.zeros((96, 96, 3), np.uint8), 0.0, {}, None)
    assert isinstance(action, int) and 0 <= action < 5
    with pytest.raises(ValueError, match="actions must be one of"):
        PolicyController(policy, "d", actions="greedy")


def test_load_policy_refuses_a_checkpoint_for_another_env_or_action_space(tmp_path):
    car = constant_policy_checkpoint(tmp_path / "car.pt")
    assert load_policy(car, "carracing", "continuous", "cpu").config.env == "CarRacing-v3"
    with pytest.raises(ValueError, match=r"env 'CarRacing-v3', but --env udacity .* \(use --env carracing\)"):
        load_policy(car, "udacity", None, "cpu")
    with pytest.raises(ValueError, match="is for the 'continuous' action space, but --action-space discrete"):
        load_policy(car, "carracing", "discrete", "cpu")
    with pytest.raises(FileNotFoundError):
        load_policy(tmp_path / "missing.pt", "carracing", None, "cpu")
