"""agent/training/data.py: the head a run trains for the dataset's actions, the targets of its columns, and time
blocks cut from the episodes without copying their frames."""
from types import SimpleNamespace

import numpy as np
import pytest

from agent.training.config import TrainArgs, resolve
from agent.training.data import Head, episode_targets, load_data, resolve_head, take_pieces
from tests.agent.training.test_experiment import tiny_args, write_synthetic

CONTINUOUS = SimpleNamespace(action_space="continuous", action_names=["steer", "gas", "brake"])
DISCRETE = SimpleNamespace(action_space="discrete", action_names=[])


def plan(**kw):
    return resolve(TrainArgs(data="data", out="out", **kw))


def test_the_head_follows_head_and_the_dataset_s_actions():
    assert resolve_head(plan(), CONTINUOUS) == Head("continuous", ["steer", "gas", "brake"], slice(0, 3))
    assert resolve_head(plan(head="steer"), CONTINUOUS) == Head("continuous", ["steer"], slice(0, 1))
    assert resolve_head(plan(), DISCRETE) == Head("discrete", None, None)
    assert resolve_head(plan(head="discrete"), DISCRETE) == Head("discrete", None, None)


@pytest.mark.parametrize("flags, data, message", [
    (dict(head="discrete"), CONTINUOUS, "--head discrete needs a discrete dataset"),
    (dict(head="continuous"), DISCRETE, "--head continuous needs continuous actions"),
    (dict(oversample_turns=2), DISCRETE, "--oversample-turns reads the steering labels: a discrete head"),
    (dict(oversample_turns=2), SimpleNamespace(action_space="continuous", action_names=["gas", "steer"]),
     "has no 'steer' action"),
    (dict(recovery_views=0.3, head="steer"), SimpleNamespace(action_space="continuous", action_names=["gas"]),
     "--recovery-views relabels the steering"),
])
def test_a_head_the_data_cannot_feed_is_refused(flags, data, message):
    with pytest.raises(ValueError, match=message):
        resolve_head(plan(**flags), data)


def test_episode_targets_are_the_head_s_columns():
    data = SimpleNamespace(targets=[np.arange(6, dtype=np.float64).reshape(2, 3)])
    steer = episode_targets(data, 0, slice(0, 1))
    assert steer.dtype == np.float32 and steer.tolist() == [[0.0], [3.0]]
    assert episode_targets(data, 0, None) is data.targets[0]  # discrete labels as they are


def test_time_blocks_view_the_episodes_rows(tmp_path):
    source = write_synthetic(tmp_path / "d", episodes=2, length=20)
    data = load_data(resolve(tiny_args(source, tmp_path / "out")).data)
    pieces = take_pieces(data, [(1, 5, 12), (0, 0, 10)])
    assert pieces.num_episodes == 2 and pieces.pieces == [(1, 5, 12), (0, 0, 10)]
    assert [len(f) for f in pieces.frames] == [7, 10]
    assert np.shares_memory(pieces.frames[0], data.frames[1]), "the frames are not copied"
    np.testing.assert_array_equal(pieces.frames[0], data.frames[1][5:12])
    np.testing.assert_array_equal(pieces.targets[1], data.targets[0][:10])
    np.testing.assert_array_equal(pieces.times[0], data.times[1][5:12])
