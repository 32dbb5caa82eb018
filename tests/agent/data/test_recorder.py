"""agent/data/recorder.py on a tiny fake CarRacing (8x8 frames): DART noise on every action layout, the histograms,
the early stop off the road, who labels a state, and record_episode's DAgger mixture, latency and recovery labels.
(The stuck and wrong-way cuts and the noise of CarRacing's own actions: tests/agent/data/test_collection.py.)"""
import numpy as np
import pytest
from gymnasium import spaces

from agent.data.recorder import (OFF_ROAD_SECONDS, DartNoise, EarlyStop, Labeller, action_stats, record_episode,
                                 recovery_start, steer_bins)
from envs.carracing import N_FEATURES
from envs.carracing import SPEC as CARRACING

STEPS = 6


class _Env:
    """State i: frame value i, privileged[0] = i; the car moves and stays on the road; truncated after STEPS steps;
    every executed action is kept."""

    def __init__(self, discrete=False, steps=STEPS, off_road=()):
        self.action_space = spaces.Discrete(5) if discrete else spaces.Box(np.array([-1, 0, 0], np.float32),
                                                                            np.ones(3, np.float32))
        self.steps, self.off_road, self.i, self.executed, self.reset_with = steps, off_road, 0, [], None

    def _info(self):
        priv = np.zeros(N_FEATURES, np.float32)
        priv[0] = self.i
        return {"privileged": priv, "speed": 10.0, "lap_complete": False, "tiles_visited": self.i, "num_tiles": 300,
                "unvisited_tiles": "", "on_track": self.i not in self.off_road}

    def reset(self, seed=None, options=None):
        self.i, self.reset_with = 0, (seed, options)
        return np.zeros((8, 8, 3), np.uint8), self._info()

    def step(self, action):
        self.executed.append(action)
        self.i += 1
        return np.full((8, 8, 3), self.i, np.uint8), 1.0, False, self.i >= self.steps, self._info()


class _Expert:
    """Labels state i with steer i/10 (continuous) or action i % 5 (discrete, probability 0.6 on it)."""

    spec = CARRACING

    def __init__(self, space="continuous"):
        self.action_space = space

    def act(self, priv):
        i = int(priv[0])
        return i % 5 if self.action_space == "discrete" else np.array([i / 10, 0.5, 0.0], np.float32)

    def action_probs(self, priv):
        p = np.full(5, 0.1, np.float32)
        p[int(priv[0]) % 5] = 0.6
        return p


class _Student:
    """A DAgger driver that always steers -0.5; remembers the track seed it was reset to."""

    def reset(self, seed):
        self.seed = seed

    def act(self, frame, t, info, expert_action, on_the_way):
        return np.array([-0.5, 0.2, 0.0], np.float32), 0.001


class _Teacher:
    """A recovery teacher that takes over in the states from 3 on, answering action 4 (brake) or a full right."""

    def needs(self, priv):
        return priv[0] >= 3

    def env_action(self, priv, space):
        return 4 if space == "discrete" else np.array([1.0, 0.0, 0.0], np.float32)


def _no_noise(space="continuous"):
    return DartNoise(space, 0.0, 1, seed=0)


def test_dart_noise_on_steering_only_and_steer_throttle_actions_stays_in_range_and_repeats_by_seed():
    steer = [DartNoise("continuous", 0.5, 3, seed=7)(t, np.array([0.9], np.float32)) for t in range(60)]
    assert all(a.shape == (1,) and a.dtype == np.float32 and -1 <= a[0] <= 1 for a in steer)
    assert any(a[0] == 1.0 for a in steer), "clipped at full lock"
    pair = np.array([DartNoise("continuous", 0.5, 3, seed=7)(t, np.array([0.0, -0.8], np.float32))
                     for t in range(60)])
    assert pair.shape == (60, 2) and np.all(np.abs(pair) <= 1) and np.any(pair[:, 1] < -0.8), "throttle < 0 brakes"
    again = np.array([DartNoise("continuous", 0.5, 3, seed=7)(t, np.array([0.0, -0.8], np.float32))
                      for t in range(60)])
    other = np.array([DartNoise("continuous", 0.5, 3, seed=8)(t, np.array([0.0, -0.8], np.float32))
                      for t in range(60)])
    np.testing.assert_array_equal(pair, again)
    assert not np.array_equal(pair, other), "the track seed draws the noise"


def test_a_recovery_start_is_drawn_from_the_track_seed_with_its_probability():
    assert all(recovery_start(CARRACING, s, 0.0) is None for s in range(20))
    placed = recovery_start(CARRACING, 11, 1.0)
    assert placed and placed == recovery_start(CARRACING, 11, 1.0), "the same track, the same placement"
    share = np.mean([recovery_start(CARRACING, s, 0.3) is not None for s in range(300)])
    assert 0.2 < share < 0.4


def test_action_stats_histogram_the_steering_in_range_and_count_the_pedals():
    edges = steer_bins(0.4)
    assert len(edges) == 17 and edges[0] == -0.4 and edges[-1] == 0.4
    executed = np.array([[-1.0, 0.0, 0.8], [0.0, 1.0, 0.0], [1.0, 0.5, 0.0]], np.float32)
    stats = action_stats("continuous", executed, executed, CARRACING.action_names["continuous"], 0.4)
    counts = stats["executed_steer_counts"]
    assert sum(counts) == 3 and counts[0] == 1 and counts[-1] == 1, "full lock lands in the end bins"
    assert stats["executed_gas_steps"] == 2 and stats["executed_gas_sum"] == pytest.approx(1.5)
    assert stats["label_brake_steps"] == 1 and stats["label_brake_sum"] == pytest.approx(0.8)
    discrete = action_stats("discrete", np.array([1, 1, 4]), np.array([0, 0, 0]), ("a", "b", "c", "d", "e", "f"), 1)
    assert discrete == {"executed_counts": [0, 2, 0, 0, 1, 0], "label_counts": [3, 0, 0, 0, 0, 0]}


def test_early_stop_ends_an_episode_after_five_seconds_off_the_road():
    limit = round(OFF_ROAD_SECONDS / CARRACING.dt)
    off, on = {"speed": 10.0, "on_track": False}, {"speed": 10.0, "on_track": True}
    stop = EarlyStop(CARRACING)
    assert [stop(off) for _ in range(limit - 1)][-1] == (None, 0)
    assert stop(on) == (None, 0), "back on the road: the count starts again"
    assert [stop(off) for _ in range(limit)][-1] == ("off_road", limit)
    disabled = EarlyStop(CARRACING, enabled=False)
    assert all(disabled(off) == (None, 0) for _ in range(limit + 1))


def test_the_recovery_teacher_labels_the_states_it_needs_with_a_one_hot_row():
    labeller = Labeller(_Expert("discrete"), _Teacher())
    priv = np.zeros(N_FEATURES, np.float32)
    label, probs, source = labeller(priv)
    assert (label, source) == (0, 0) and probs[0] == pytest.approx(0.6), "the expert's label and probabilities"
    priv[0] = 3
    label, probs, source = labeller(priv)
    assert (label, source) == (4, 1) and probs.tolist() == [0, 0, 0, 0, 1]


def test_a_dagger_student_drives_and_the_expert_labels_every_state_it_reaches():
    student, env = _Student(), _Env()
    arrays, meta = record_episode(env, _Expert(), 42, _no_noise(), driver=student, beta=0.0)
    assert student.seed == 42 and env.reset_with == (42, None)
    assert np.all(arrays["action"][:, 0] == -0.5), "the student's actions are executed"
    np.testing.assert_allclose(arrays["expert_action"][:, 0], np.arange(STEPS) / 10, atol=1e-6)
    assert arrays["final_expert_action"][0] == pytest.approx(STEPS / 10), "the state after the last step, labelled"
    assert meta["beta"] == 0.0 and meta["expert_driven_fraction"] == 0.0 and meta["perturbed_fraction"] == 1.0
    assert len(arrays["frames"]) == STEPS and arrays["frames"][-1, 0, 0, 0] == STEPS - 1
    assert meta["return"] == STEPS and meta["truncated"] and meta["stopped_early"] is None
    _, meta = record_episode(_Env(), _Expert(), 42, _no_noise(), driver=_Student(), beta=1.0)
    assert meta["expert_driven_fraction"] == 1.0 and meta["perturbed_fraction"] == 0.0


def test_under_latency_each_chosen_action_reaches_the_env_that_many_steps_later():
    env = _Env()
    arrays, meta = record_episode(env, _Expert(), 1, _no_noise(), latency_steps=2)
    executed = np.array(env.executed)
    assert np.all(executed[:2] == 0), "the env's neutral action until the first one lands"
    np.testing.assert_allclose(executed[2:, 0], np.arange(STEPS - 2) / 10, atol=1e-6)
    np.testing.assert_array_equal(arrays["action"], executed)  # the recorded action is the one applied
    assert meta["latency_steps"] == 2 and "labels_land" not in meta


def test_recovery_labels_are_marked_per_step_and_counted():
    arrays, meta = record_episode(_Env(discrete=True), _Expert("discrete"), 5, _no_noise("discrete"),
                                  recovery=_Teacher(), start={"heading": 1.0})
    assert arrays["label_source"].tolist() == [0, 0, 0, 1, 1, 1]
    assert arrays["expert_action"].tolist() == [0, 1, 2, 4, 4, 4]
    assert arrays["expert_probs"][3].tolist() == [0, 0, 0, 0, 1]
    assert meta["recovery_labels"] and meta["recovery_label_steps"] == 3 and meta["start"] == {"heading": 1.0}
    plain, meta = record_episode(_Env(discrete=True), _Expert("discrete"), 5, _no_noise("discrete"))
    assert "label_source" not in plain and "recovery_labels" not in meta
