"""agent/evaluation/parallel.py in this process: what a worker is set up from, the worker's own env, expert and
controllers, its episodes (the same seed, the same row), each episode's outputs, and what the fork server preloads.
(The worker processes themselves: tests/agent/evaluation/test_evaluate.py and tests/agent/test_workers.py.)"""
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from agent.controllers import ExpertController
from agent.evaluation.config import Conditions, Drivers, EvalPlan, Outputs, Runtime, Where
from agent.evaluation.drivers import Driver
from agent.evaluation.parallel import EpisodeTask, WorkerSetup, _worker_episode, _worker_setup, episode_outputs, preload
from agent.evaluation.timing import TimingConditions
from envs.carracing import SPEC as CARRACING
from tests.helpers import constant_policy_checkpoint

STEPS = 3  # a student's step costs ~0.1 s on a busy 2-core machine


def _plan(out, video_episodes=1, saliency="grad"):
    drivers = Drivers(checkpoints=(), names=(), expert=None, expert_drives=False, with_expert=True,
                      action_space=None, discrete_actions=None, action_temperature=None, spared=(),
                      spares_given=False, pi_speed=False)
    where = Where(env="carracing", seeds=(5, 6), max_steps=STEPS, renderer="fast", make_kwargs={}, replay=None,
                  data=(), data_span=(0.0, 1.0))
    conditions = Conditions(TimingConditions(latency_steps=1), "steps", 0.0)
    outputs = Outputs(out=Path(out), imported=(), video_episodes=video_episodes, saliency=saliency,
                      tensorboard=False, progress=False)
    return EvalPlan(drivers, where, conditions, outputs, Runtime("cpu", 1, 2, "fp32"))


class _Expert:
    """The privileged expert a worker loads, here without SB3: full gas, straight on."""

    spec = CARRACING
    action_space = "continuous"

    def act(self, priv):
        return np.array([0.0, 1.0, 0.0], np.float32)


def test_each_episode_records_a_video_only_among_the_first_and_saliency_only_for_students(tmp_path):
    plan = _plan(tmp_path)
    first = episode_outputs(plan, False, tmp_path / "a", 0, 5)
    assert first == {"video_path": tmp_path / "a" / "videos" / "seed_5.mp4", "saliency": "grad",
                     "timing": plan.conditions.timing}
    assert episode_outputs(plan, False, tmp_path / "a", 1, 6)["video_path"] is None
    assert episode_outputs(plan, True, tmp_path / "a", 0, 5)["saliency"] is None, "the expert has no saliency"


def test_a_worker_builds_its_env_expert_and_controllers_and_drives_any_seed_alike(tmp_path, monkeypatch):
    from agent.experts.expert import Expert

    monkeypatch.setattr(Expert, "load", classmethod(lambda cls, path, space, env: _Expert()))
    student = constant_policy_checkpoint(tmp_path / "s.pt", action=(-0.3, 0.5, 0.0))
    drivers = [Driver("expert", ExpertController(_Expert()), {}),
               Driver("student", SimpleNamespace(is_expert=False), {"source": str(student)})]
    setup = WorkerSetup.of(_plan(tmp_path), "continuous", drivers)
    assert setup.drivers == [("expert", None), ("student", str(student))]
    assert (setup.env, setup.max_steps, setup.renderer, setup.window_clock) == ("carracing", STEPS, "fast", "steps")
    state = _worker_setup(setup)
    assert state.controllers[0].is_expert and state.controllers[1].name == "student"
    outputs = {"timing": TimingConditions(latency_steps=1)}
    steps = []
    row, latencies = _worker_episode(state, EpisodeTask(1, 5, outputs), lambda: steps.append(1))
    assert row["seed"] == 5 and row["length"] == STEPS and len(steps) == STEPS and len(latencies) == STEPS
    assert row["neutral_steps"] == 1, "the task's timing applies"
    assert row["steer_mae"] == pytest.approx(0.3 * (STEPS - 1) / STEPS, abs=1e-5), "-0.3 once it lands; expert 0"
    expert, _ = _worker_episode(state, EpisodeTask(0, 5, outputs), lambda: None)
    _worker_episode(state, EpisodeTask(0, 6, outputs), lambda: None)
    again, _ = _worker_episode(state, EpisodeTask(0, 5, outputs), lambda: None)
    same = ("return", "completion", "steer_mae", "mean_speed", "off_track_steps")
    assert {k: again[k] for k in same} == {k: expert[k] for k in same}, "an episode depends only on its seed"


def test_the_fork_server_preloads_the_workers_modules_and_the_envs():
    modules = preload("carracing")
    assert modules[0] == "agent.evaluation.parallel" and "envs.carracing" in modules
    assert "stable_baselines3" in modules
