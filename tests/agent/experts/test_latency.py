"""The latency expert: actions land D steps late, it sees D and the queue, it starts as the regular expert."""

import json

import gymnasium as gym
import numpy as np
import pytest

from agent.experts.expert import Expert, evaluate_model
from agent.experts.latency import LatencyQueue, extra_features, widen_policy
from agent.experts.ppo import PPOTrainArgs, main, resolve, train
from envs.carracing import N_FEATURES, SPEC, make_expert_env


class _Recorder(gym.Env):
    """A stand-in env that records the actions it is given and shows a step counter."""

    action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)

    def __init__(self):
        self.applied, self.t = [], 0

    def reset(self, **_):
        self.applied, self.t = [], 0
        return np.float32([0]), {}

    def step(self, action):
        self.applied.append(np.array(action))
        self.t += 1
        return np.float32([self.t]), 0.0, False, False, {}


def test_actions_land_latency_steps_later_and_the_queue_is_seen():
    inner = _Recorder()
    env = LatencyQueue(inner, (3, 3), shown=4)
    obs, info = env.reset()
    assert info["latency_steps"] == 3 and obs.shape == (1 + extra_features(4, 2),) == env.observation_space.shape
    assert obs[1] == pytest.approx(3 / 4) and not obs[2:].any()  # three neutral actions on their way
    chosen = [np.float32([0.1 * k, -0.1 * k]) for k in range(1, 7)]
    for k, action in enumerate(chosen):
        obs, *_ = env.step(action)
        queue = obs[2:].reshape(4, 2)
        # the next to land first; the last slot (beyond D) stays 0
        np.testing.assert_allclose(queue[:3], ([np.zeros(2)] * 3 + chosen)[k + 1: k + 4], atol=1e-7)
        assert not queue[3].any()
    np.testing.assert_allclose(inner.applied, [np.zeros(2)] * 3 + chosen[:3], atol=1e-7)


def test_latency_is_drawn_per_episode_and_unshown_keeps_the_observation():
    env = LatencyQueue(_Recorder(), (0, 5), seed=3)
    drawn = {env.reset()[1]["latency_steps"] for _ in range(40)}
    assert drawn == set(range(6))
    hidden = LatencyQueue(_Recorder(), (2, 2), shown=0)
    assert hidden.reset()[0].shape == (1,)
    with pytest.raises(ValueError, match="cannot be shown"):
        LatencyQueue(_Recorder(), (0, 6), shown=4)
    with pytest.raises(ValueError, match="0 <= lo <= hi"):
        LatencyQueue(_Recorder(), (3, 1))


def test_a_widened_expert_answers_as_the_regular_one():
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import DummyVecEnv

    source = Expert.load(action_space="continuous").model
    venv = DummyVecEnv([lambda: LatencyQueue(make_expert_env("continuous", render=False), (0, 4))])
    target = PPO("MlpPolicy", venv, policy_kwargs=dict(net_arch=dict(pi=[128, 128], vf=[128, 128])), device="cpu")
    widen_policy(source, target)
    rng = np.random.default_rng(0)
    priv = rng.normal(size=(16, N_FEATURES)).astype(np.float32)
    extra = rng.uniform(-1, 1, size=(16, extra_features(4, 2))).astype(np.float32)
    a_src, _ = source.predict(priv, deterministic=True)
    a_dst, _ = target.predict(np.concatenate([priv, extra], 1), deterministic=True)
    np.testing.assert_allclose(a_dst, a_src, atol=1e-6)


def _exit_code(argv):
    """The command's exit code: a bad flag exits while parsing, a bad value is returned."""
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


def test_regular_expert_under_latency_drives_worse_and_the_cli_refuses_bad_values(tmp_path, capsys):
    regular = Expert.load(action_space="continuous")
    seeds = [90000, 90001]
    on_time = evaluate_model(regular.model, SPEC, "continuous", seeds, max_episode_steps=300)
    late = evaluate_model(regular.model, SPEC, "continuous", seeds, max_episode_steps=300, latencies=[10, 10])
    assert late.mean < on_time.mean - 50
    for argv, message in ((["evaluate", "--latency-steps", "-1"], "--latency-steps must be >= 0"),
                          (["train", "--out", str(tmp_path / "x.zip"), "--latency-steps", "4:2"], "A:B"),
                          (["train", "--out", str(tmp_path / "x.zip"), "--latency-steps", "0:4",
                            "--action-space", "discrete"], "continuous")):
        assert _exit_code(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err and err.count("\n") == 1


def test_tiny_latency_training_run_loads_with_its_card_and_subprocesses_change_nothing(tmp_path, capsys):
    cards = {}
    for subprocesses in (False, True):
        out = tmp_path / f"late_{subprocesses}.zip"
        args = PPOTrainArgs(action_space="continuous", timesteps=256, out=out, n_envs=2, n_steps=64, batch_size=64,
                         eval_every=256, eval_episodes=2, card_episodes=1, max_steps=60,
                         logdir=tmp_path / "runs", init=SPEC.default_expert["continuous"], latency_steps="0:3",
                         subprocesses=subprocesses)
        train(resolve(args), command="test", log=lambda *_: None)
        cards[subprocesses] = json.loads(out.with_suffix(".json").read_text())
    assert [h["timesteps"] for h in cards[True]["selection"]["history"]] == [0, 256]  # after one PPO update
    assert cards[True]["selection"] == cards[False]["selection"]
    assert cards[True]["evaluation"] == cards[False]["evaluation"]
    expert = Expert.load(out, "continuous")
    card = cards[True]
    assert card["latency_steps"] == [0, 3] and expert.max_latency == 3
    assert expert.model.observation_space.shape == (N_FEATURES + extra_features(3, 2),)
    assert main(["evaluate", "--expert", str(out), "--latency-steps", "4", "--episodes", "1"]) == 2
    assert "trained for up to 3 steps" in capsys.readouterr().err
