"""agent/experts/ppo.py: the training tracks drawn from the training range, the teacher's labelled states with their
discounted returns, the warm start fitting them, and the arguments refused in one line before any env is made.
(A tiny real training run, resolve and the CLI's errors: tests/agent/experts/test_expert.py.)"""
from dataclasses import replace

import gymnasium as gym
import numpy as np
import pytest

from agent.experts.ppo import (PPOTrainArgs, RandomTrack, behaviour_clone, check_args, collect_teacher_data, main,
                               make_train_env, parse_latency_range)
from envs.carracing import SPEC as CARRACING


class _Track(gym.Env):
    """Observation [step, track seed]; reward 1 a step; ends after ``length`` steps; keeps the actions executed."""

    def __init__(self, space="continuous", length=3):
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(5) if space == "discrete" else gym.spaces.Box(-1, 1, (2,), np.float32)
        self.length, self.seeds, self.executed = length, [], []

    def reset(self, *, seed=None, options=None):
        self.t = 0
        self.seeds.append(seed)
        return np.array([0, seed], np.float32), {}

    def step(self, action):
        self.executed.append(action)
        self.t += 1
        return np.array([self.t, self.seeds[-1]], np.float32), 1.0, self.t >= self.length, False, {}


class _Teacher:
    """Labels step t with steer t/10 (continuous) or action t % 5 (discrete)."""

    def ppo_action(self, obs, space):
        t = int(obs[0])
        return t % 5 if space == "discrete" else np.array([t / 10, 0.5], np.float32)


def test_random_track_draws_training_seeds_unless_given_one():
    env = RandomTrack(_Track(), seed=1, low=100, high=110)
    for _ in range(20):
        env.reset()
    env.reset(seed=7)
    assert all(100 <= s < 110 for s in env.env.seeds[:20]) and len(set(env.env.seeds[:20])) > 3
    assert env.env.seeds[-1] == 7, "an explicit seed is used as given"
    again = RandomTrack(_Track(), seed=1, low=100, high=110)
    for _ in range(20):
        again.reset()
    assert again.env.seeds == env.env.seeds[:20], "the training seed decides the draws"


def test_the_train_env_is_on_training_tracks_and_shows_a_latency_experts_queue():
    env = make_train_env(CARRACING, "continuous", seed=0)
    obs, _ = env.reset()
    wide = make_train_env(CARRACING, "continuous", seed=0, latency=(2, 2))
    wide_obs, _ = wide.reset()
    assert wide_obs.shape[0] > obs.shape[0], "the latency and the actions on their way join the observation"
    np.testing.assert_array_equal(wide_obs[:obs.shape[0]], obs)  # the same training track from the same seed


@pytest.mark.parametrize("text, lo_hi", [(None, None), ("5", (5, 5)), ("0:10", (0, 10)), ("3:3", (3, 3))])
def test_a_latency_range_is_d_or_a_to_b(text, lo_hi):
    assert parse_latency_range(text) == lo_hi


@pytest.mark.parametrize("text", ["0", "0:0", "3:1", "-1:2", "0:101", "x", "1:y"])
def test_a_bad_latency_range_is_refused_in_one_line(text):
    with pytest.raises(ValueError, match=r"--latency-steps must be D or A:B steps with 0 <= A <= B <= 100 and B > 0, "
                                         rf"got {text!r}"):
        parse_latency_range(text)


@pytest.mark.parametrize("space", ["continuous", "discrete"])
def test_teacher_data_labels_every_visited_state_with_the_teachers_action_and_discounted_return(space):
    spec = replace(CARRACING, make_train_env=lambda action_space: _Track(action_space, length=3))
    data = collect_teacher_data(spec, space, episodes=2, seed=4, gamma=0.5, driver=_Teacher())
    assert data["obs"].shape == (6, 2) and data["obs"].dtype == np.float32
    assert np.all((CARRACING.seeds.train_low <= data["obs"][:, 1]) & (data["obs"][:, 1] < CARRACING.seeds.train_high))
    np.testing.assert_allclose(data["return"], [1.75, 1.5, 1.0] * 2)
    expected = [_Teacher().ppo_action(o, space) for o in data["obs"]]
    np.testing.assert_array_equal(data["action"], np.asarray(expected))
    assert data["action"].dtype == (np.int64 if space == "discrete" else np.float32)


@pytest.mark.parametrize("space", ["continuous", "discrete"])
def test_the_warm_start_fits_the_teachers_actions(space):
    import torch
    from stable_baselines3 import PPO

    model = PPO("MlpPolicy", _Track(space), n_steps=8, batch_size=8, seed=0, device="cpu",
                policy_kwargs=dict(net_arch=dict(pi=[16], vf=[16])))
    rng = np.random.default_rng(0)
    n = 1024  # 4 minibatches of 256 an epoch
    obs = rng.normal(size=(n, 2)).astype(np.float32)
    if space == "discrete":
        action = (obs[:, 0] > 0).astype(np.int64) * 3  # noop left of 0, gas right of it
    else:
        action = np.stack([0.5 * obs[:, 0], -0.3 * np.ones(n)], 1).astype(np.float32)
    data = {"obs": obs, "action": action, "return": np.ones(n, np.float32)}
    said = []
    behaviour_clone(model, data, epochs=30, seed=0, log=said.append)
    assert said[0].startswith("BC epoch   0: action loss") and said[-1].startswith("BC epoch  29")
    assert not model.policy.training, "left in evaluation mode"
    if space == "discrete":
        predicted, _ = model.predict(obs, deterministic=True)
        assert np.mean(predicted == action) > 0.9
    else:
        with torch.no_grad():
            mean = model.policy.get_distribution(torch.as_tensor(obs)).distribution.mean.numpy()
        assert np.abs(mean - action).mean() < 0.05


@pytest.mark.parametrize("kw, error, message", [
    (dict(n_envs=0), ValueError, "--n-envs must be positive, got 0"),
    (dict(eval_episodes=21), ValueError, "--eval-episodes must be <= 20, got 21"),
    (dict(card_episodes=21), ValueError, "--card-episodes must be <= 20, got 21"),
    (dict(bc_episodes=-1), ValueError, "--bc-episodes must be >= 0 and --bc-epochs > 0"),
    (dict(bc_epochs=0), ValueError, "--bc-episodes must be >= 0 and --bc-epochs > 0"),
    (dict(init="e.zip", bc_episodes=3), ValueError, "--init and --bc-episodes are exclusive"),
    (dict(init="no/such/expert.zip"), FileNotFoundError, "--init expert file not found: 'no/such/expert.zip'"),
])
def test_training_arguments_are_refused_before_any_env_is_made(tmp_path, kw, error, message):
    with pytest.raises(error, match=message):
        check_args(PPOTrainArgs(out=tmp_path / "e.zip", **kw))
    with pytest.raises(ValueError, match=r"--out must end in .zip \(an SB3 model file\), got '.*e.pt'"):
        check_args(PPOTrainArgs(out=tmp_path / "e.pt"))


@pytest.mark.parametrize("argv, message", [(["--episodes", "0"], "--episodes must be positive, got 0"),
                                           (["--latency-steps", "-1"], "--latency-steps must be >= 0, got -1")])
def test_evaluate_refuses_bad_counts_in_one_line(argv, message, capsys):
    assert main(["evaluate", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0] == f"error: {message}"
