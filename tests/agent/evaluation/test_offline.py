"""agent/evaluation/offline.py: the offline scores (steering against the recorded value and its average beside the
trivial predictors, a discrete student's agreement and likelihood), pooled frame-weighted, the table, and what
evaluate_recorded refuses before scoring. (Whole runs on recordings: tests/agent/udacity/test_recordings.py and
tests/agent/evaluation/test_evaluate.py.)"""
from types import SimpleNamespace

import numpy as np
import pytest

from agent.evaluation.offline import (evaluate_recorded, offline_markdown, pooled, pooled_discrete,
                                      recorded_frame_shape, score_discrete_episode, score_episode, scores, vs_straight)
from agent.runtime import NO_STRAIGHT_RATIO
from driving_data.dataset import open_dataset
from tests.agent.training.test_experiment import write_synthetic


def test_scores_are_the_mean_squared_and_absolute_errors():
    assert scores(np.array([0.0, 1.0]), np.array([1.0, 1.0])) == {"mse": 0.5, "mae": 0.5}


def test_a_session_is_scored_beside_always_straight_and_the_training_mean():
    times = np.arange(6) * 0.1
    steer = np.array([0.2, 0.2, 0.2, -0.2, -0.2, -0.2])
    row = score_episode(steer, times, steer.copy(), mean=0.1, width_s=0.0)  # width 0: the average is the value
    assert row["frames"] == 6 and row["policy_raw"] == {"mse": 0.0, "mae": 0.0} and row["corr_raw"] == 1.0
    assert row["straight_raw"]["mse"] == pytest.approx(0.04) and row["mean_raw"]["mae"] == pytest.approx(0.2)
    flat = score_episode(steer, times, np.zeros(6), mean=0.0, width_s=0.0)
    assert flat["corr_raw"] is None and flat["pred_std"] == 0.0, "no correlation with a constant"
    # the last three frames scored; their 0.3 s average still sees the frame before them
    part = score_episode(steer, times, np.zeros(6), mean=0.0, width_s=0.3, keep=slice(3, 6))
    assert part["frames"] == 3
    assert part["straight_avg"]["mae"] == pytest.approx(np.mean([0.2 / 3 * 1, 0.2, 0.2]))


def test_pooled_scores_weigh_every_frame_once():
    one = {"frames": 1, **{f"{p}_{t}": {"mse": 1.0, "mae": 1.0} for p in ("policy", "straight", "mean")
                           for t in ("raw", "avg")}}
    three = {"frames": 3, **{f"{p}_{t}": {"mse": 0.0, "mae": 0.0} for p in ("policy", "mean") for t in ("raw", "avg")},
             "straight_raw": {"mse": 1.0, "mae": 1.0}, "straight_avg": {"mse": 1.0, "mae": 1.0}}
    p = pooled([one, three])
    assert (p["frames"], p["sessions"]) == (4, 2)
    assert p["policy_raw"]["mse"] == pytest.approx(0.25) and p["straight_avg"]["mse"] == pytest.approx(1.0)
    assert p["policy_vs_straight_mse_avg"] == pytest.approx(0.25)


def test_a_discrete_student_is_scored_on_the_recorded_actions():
    logits = np.array([[2.0, 0, 0], [0, 2.0, 0], [0, 0, 2.0], [2.0, 0, 0]])
    labels = np.array([0, 1, 0, 0])
    row = score_discrete_episode(labels, logits)
    logp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    assert row["frames"] == 4 and row["accuracy"] == 0.75
    assert row["label_nll"] == pytest.approx(-logp[np.arange(4), labels].mean())
    assert row["label_shares"] == [0.75, 0.25, 0.0] and sum(row["mean_probs"]) == pytest.approx(1.0)
    hot = score_discrete_episode(labels, logits, temperature=2.0)
    assert hot["label_nll"] == pytest.approx(score_discrete_episode(labels, logits / 2)["label_nll"]), "p^(1/T)"
    with pytest.raises(ValueError, match="3 recorded actions for 4 frames"):
        score_discrete_episode(labels[:3], logits)
    with pytest.raises(ValueError, match=r"ids of the student's 3 actions \(0..2\); got 0..5"):
        score_discrete_episode(np.array([0, 1, 5, 0]), logits)


def test_pooled_discrete_scores_name_the_commonest_recorded_action():
    rows = [score_discrete_episode(np.array([2, 2, 2]), np.zeros((3, 3))),
            score_discrete_episode(np.array([0]), np.array([[5.0, 0, 0]]))]
    p = pooled_discrete(rows, ["noop", "left", "gas"])
    assert p["frames"] == 4 and p["commonest_label"] == "gas" and p["commonest_label_accuracy"] == 0.75
    assert p["accuracy"] == pytest.approx((rows[0]["accuracy"] * 3 + 1) / 4)
    table = offline_markdown({"student": {"pooled": p, "temperature": 1.5, "temperature_spares": ["left"]}})
    assert "| student (temperature 1.5, left spared) |" in table and "| always gas (" in table
    assert "4 frames in 2 episode(s)" in table


def test_the_steering_table_compares_with_the_trivial_predictors_and_says_when_there_is_no_ratio():
    times = np.arange(4) * 0.1
    row = score_episode(np.array([0.1, -0.1, 0.1, -0.1]), times, np.zeros(4), 0.0, width_s=0.0)
    table = offline_markdown({"zero": {"pooled": pooled([row])}})
    lines = table.splitlines()
    assert [line.split(" | ")[0] for line in lines[2:5]] == ["| zero", "| always straight", "| training mean"]
    assert lines[2].endswith("| 1.00 |") and "4 frames in 1 session(s)." in table
    assert vs_straight(pooled([row])) == "(1.00 x always-straight's 0.0100)"
    straight = pooled([score_episode(np.zeros(4), times, np.zeros(4), 0.0, width_s=0.0)])
    assert vs_straight(straight) == f"({NO_STRAIGHT_RATIO})"
    table = offline_markdown({"zero": {"pooled": straight}})
    assert table.splitlines()[2].endswith("| - |") and NO_STRAIGHT_RATIO in table


def test_frames_of_several_sizes_cannot_be_scored_by_one_policy():
    shapes = {0: (5, 32, 32, 3), 1: (4, 32, 32, 3)}
    data = type("D", (), {"root": "rec", "array_shape": lambda self, i, key: shapes[i], "__len__": lambda self: 2})()
    assert recorded_frame_shape(data) == (32, 32, 3)
    shapes[1] = (4, 64, 64, 3)
    with pytest.raises(ValueError, match=r"rec holds camera frames of several sizes \[\(32, 32, 3\), \(64, 64, 3\)\]"):
        recorded_frame_shape(data)


@pytest.fixture(scope="module")
def carracing_data(tmp_path_factory):
    return open_dataset(write_synthetic(tmp_path_factory.mktemp("demos"), episodes=1, length=4))


@pytest.mark.parametrize("config, message", [
    (dict(env="UdacityStyle-v0"), "drives 'UdacityStyle-v0'; the data was recorded in 'CarRacing-v3'"),
    (dict(action_space="discrete", head="discrete"), "has a discrete action space; the data's actions are continuous"),
    (dict(action_names=("gas", "brake")), "predicts no continuous steering"),
])
def test_a_policy_that_cannot_be_scored_on_the_data_is_refused_before_anything_is_written(carracing_data, tmp_path,
                                                                                          config, message):
    policy = SimpleNamespace(config=SimpleNamespace(**{**dict(env="CarRacing-v3", action_space="continuous",
                                                              head="continuous", action_names=("steer", "gas")),
                                                       **config}))
    with pytest.raises(ValueError, match=message):
        evaluate_recorded(policy, carracing_data, tmp_path, "p")
    assert not list(tmp_path.iterdir())
