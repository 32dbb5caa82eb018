"""Windows and hindsight labels (agent.training.windows): a window ending at step t trained for an action that lands
D steps later is labelled with the expert's action at t + D, and a student told D learns what one not told cannot."""
from __future__ import annotations

import json

import numpy as np
import pytest

from driving_data.dataset import open_dataset, write_episode
import train
from agent.training.config import TrainArgs, resolve, with_env_defaults
from agent.training.data import load_data
from agent.training.experiment import run
from agent.training.windows import gather_segments, label_shifts, latency_shifts
from policies.checkpoint import read_checkpoint


@pytest.fixture(scope="module")
def drive(tmp_path_factory):
    """A real recorded CarRacing episode (the expert driving, 60 steps)."""
    import collect

    out = tmp_path_factory.mktemp("drive") / "data"
    assert collect.main(["--episodes", "1", "--max-steps", "60", "--renderer", "fast", "--workers", "1",
                         "--out", str(out), "--no-progress"]) == 0
    return out


def test_hindsight_labels_are_the_experts_action_when_the_action_lands(drive):
    data = load_data(with_env_defaults(resolve(TrainArgs(data=str(drive), progress=False))).data)
    expert = open_dataset(drive).load(0, keys=["expert_action"])["expert_action"]
    n = len(expert)
    for d in (0, 3, 7):
        segments = [(0, 10, 30), (0, n - 5, n)]
        shifts = [np.full(b - s, d) for _, s, b in segments]
        target = gather_segments(data, segments, 4, 3, None, shifts=shifts)[4]
        steps = np.concatenate([np.arange(s, b) for _, s, b in segments])
        np.testing.assert_array_equal(target, expert[np.minimum(steps + d, n - 1)])
    plain = gather_segments(data, [(0, 10, 30)], 4, 3, None)[4]
    np.testing.assert_array_equal(plain, expert[10:30])


def test_latency_shifts_draw_per_segment_and_validate_every_latency_in_turn():
    segments = [(0, 0, 6), (1, 10, 13)]
    assert latency_shifts(segments, (0, 0)) is None
    drawn = latency_shifts(segments, (2, 5), np.random.default_rng(0))
    assert all(len(set(s)) == 1 and 2 <= s[0] <= 5 for s in drawn)
    assert [list(s) for s in latency_shifts(segments, (2, 4))] == [[2, 3, 4, 2, 3, 4], [3, 4, 2]]
    # recorded: each episode at the latency it was driven under (collect.py --latency-steps)
    assert [list(s) for s in latency_shifts(segments, "recorded", recorded=[0, 5])] == [[0] * 6, [5] * 3]


def test_labels_a_latency_expert_gave_are_not_shifted_again_but_the_latency_is_still_told(tmp_path):
    segments = [(0, 0, 4), (1, 2, 5)]
    told = latency_shifts(segments, "recorded", recorded=[3, 3])
    shifted = label_shifts(segments, told, labels_land=[False, True])
    assert [list(s) for s in shifted] == [[3] * 4, [0] * 3] and [list(s) for s in told] == [[3] * 4, [3] * 3]
    assert label_shifts(segments, told, labels_land=[]) is told and label_shifts(segments, None, [True]) is None


def _ramp(root, episodes=6, length=40, size=32):
    """Frames whose brightness says how far into its episode the car is; the steering ramps with it. A hindsight
    label D steps ahead is the ramp D steps on: readable from the frame plus D, so only a student told D fits it."""
    rng = np.random.default_rng(3)
    for e in range(episodes):
        phase = np.arange(length) / length
        frames = (rng.integers(0, 20, (length, size, size, 3)) + 200 * phase[:, None, None, None]).astype(np.uint8)
        steer = (-0.9 + 1.8 * phase).astype(np.float32)
        act = np.stack([steer, np.full(length, 0.5, np.float32), np.zeros(length, np.float32)], 1)
        write_episode(root, e, dict(frames=frames, action=act, expert_action=act, reward=np.zeros(length, np.float32),
                                    speed=np.zeros(length, np.float32), privileged=np.zeros((length, 4), np.float32),
                                    time=np.arange(length) * 0.02), {"env": "carracing", "action_space": "continuous",
                                                                   "track_seed": e})
    return root


def test_a_student_told_its_latency_learns_what_one_not_told_cannot(tmp_path):
    data = _ramp(tmp_path / "ramp")
    scores, configs = {}, {}
    for told in ("none", "input", "clock"):
        out = tmp_path / told
        run(resolve(TrainArgs(data=str(data), out=str(out), policy="gru" if told != "clock" else "nac", window=3,
                      frame_stride=2, epochs=10, batch_size=32, segment=8, lr=5e-3, feature_dim=16, d_model=16,
                      heads=4, topk=3, threads=1, log_every=2, val_fraction=0.34, latency_steps="0:12",
                      latency_input=told, progress=False, augment=False)))
        scores[told] = json.loads((out / "metrics.json").read_text())["best"]["val_steer_mse"]
        configs[told] = read_checkpoint(out / "best.pt")["config"]["latency_input"]
    # not told: the ramp's spread over 0..12 steps ahead, (1.8 / 40)^2 x Var(D) = 0.028, is left unexplained
    assert scores["none"] > 0.02 and scores["input"] < 0.5 * scores["none"], scores
    assert configs == {"none": "none", "input": "input", "clock": "clock"}


@pytest.mark.parametrize("argv, says", [(["--latency-steps", "5:2"], "--latency-steps must be D, A:B"),
                                        (["--latency-steps", "-1"], "--latency-steps must be D, A:B"),
                                        (["--latency-input", "clock", "--core", "gru"], "query a timestamp")])
def test_bad_latency_flags_are_one_line(argv, says, tmp_path, capsys):
    code = train.main(["--data", str(_ramp(tmp_path / "d", episodes=2)), "--out", str(tmp_path / "o"),
                       "--epochs", "1", "--no-progress", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and says in err[0], err


def _queue_data(root, episodes=6, length=60, delay=3, size=32):
    """Frames of noise, random applied steering, driven under a latency of ``delay`` steps, labelled (as a
    latency expert labels) with the mean steering then on its way: the actions applied at t .. t + delay - 1.
    Nothing in the frames or the latency says the label; the actions on their way say all of it."""
    rng = np.random.default_rng(5)
    for e in range(episodes):
        frames = rng.integers(0, 255, (length, size, size, 3)).astype(np.uint8)
        steer = rng.uniform(-1, 1, length).astype(np.float32)
        act = np.stack([steer, np.full(length, 0.5, np.float32), np.zeros(length, np.float32)], 1)
        label = act.copy()
        label[:, 0] = [steer[t: t + delay].mean() if t + delay <= length else steer[t:].mean() for t in range(length)]
        write_episode(root, e, dict(frames=frames, action=act, expert_action=label, reward=np.zeros(length, np.float32),
                                    speed=np.zeros(length, np.float32), privileged=np.zeros((length, 4), np.float32),
                                    time=np.arange(length) * 0.02),
                      {"env": "carracing", "action_space": "continuous", "track_seed": e, "latency_steps": delay,
                       "labels_land": True})
    return root


def test_windows_show_the_actions_applied_over_the_next_d_steps(tmp_path):
    from driving_data.dataset import queued_actions
    from agent.training.windows import window_queues

    data = load_data(with_env_defaults(resolve(TrainArgs(data=str(_queue_data(tmp_path / "q", episodes=1)),
                                                         progress=False))).data)
    applied = data.applied[0]
    segments = [(0, 5, 12), (0, 55, 60)]
    told = latency_shifts(segments, "recorded", recorded=data.latency_steps)
    queues = window_queues(data, segments, told, 4, None)
    assert queues.shape == (12, 4, 3)
    np.testing.assert_array_equal(queues[0, :3], applied[5:8]) and np.testing.assert_array_equal(queues[:, 3], 0)
    np.testing.assert_array_equal(queues[-1, :3], applied[[59, 59, 59]])  # past the end: the last one applied
    assert window_queues(data, segments, None, 4, None) is None and window_queues(data, segments, told, 0, None) is None
    with pytest.raises(ValueError, match="more actions on their way than the 2 shown"):
        queued_actions(applied, np.arange(3), np.full(3, 3), 2)


def test_a_student_shown_its_actions_on_their_way_learns_labels_that_depend_on_them(tmp_path):
    data = _queue_data(tmp_path / "q")
    scores, queues = {}, {}
    for shown in (0, 3):
        out = tmp_path / f"shown{shown}"
        run(resolve(TrainArgs(data=str(data), out=str(out), policy="gru", window=2, frame_stride=1, epochs=12,
                              batch_size=32,
                      segment=8, lr=5e-3, feature_dim=8, threads=1, log_every=2, val_fraction=0.34,
                      latency_steps="recorded", latency_input="input", latency_queue=shown, progress=False,
                      augment=False)))
        scores[shown] = json.loads((out / "metrics.json").read_text())["best"]["val_steer_mse"]
        queues[shown] = read_checkpoint(out / "best.pt")["config"]["queue_steps"]
    # not shown: the label's variance, Var(mean of 3 uniform draws) = 1/9, is left unexplained
    assert scores[0] > 0.07 and scores[3] < 0.3 * scores[0], scores
    assert queues == {0: 0, 3: 3}
    again = tmp_path / "again"  # a fine-tune keeps what it is shown
    run(resolve(TrainArgs(data=str(data), out=str(again), init=str(tmp_path / "shown3" / "best.pt"), epochs=1,
                          threads=1,
                  latency_steps="recorded", progress=False, augment=False)))
    assert read_checkpoint(again / "best.pt")["config"]["queue_steps"] == 3


@pytest.mark.parametrize("argv, says", [
    (["--latency-queue", "-1"], "--latency-queue must be an integer"),
    (["--latency-queue", "2", "--latency-input", "clock"], "needs --latency-input input"),
    (["--latency-queue", "2", "--latency-input", "input", "--latency-steps", "0:4"], "fewer actions than the 4"),
    (["--latency-queue", "2", "--latency-input", "input", "--latency-steps", "recorded"], "than the 2 shown")])
def test_bad_queue_flags_are_one_line(argv, says, tmp_path, capsys):
    code = train.main(["--data", str(_queue_data(tmp_path / "d", episodes=2)), "--out", str(tmp_path / "o"),
                       "--epochs", "1", "--no-progress", "--core", "gru", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and says in err[0], err


def test_mirroring_is_off_by_default_only_for_a_recording_with_a_steady_steering_bias(tmp_path):
    """--flip's default: on, except for a person's recording whose steering holds a steady bias (mirrored
    segments would teach the opposite bias half the time)."""
    from driving_data.udacity_import import import_udacity
    from tests.driving_data.test_udacity_import import _sim_recording

    def symmetric(lines):  # steering +-0.1 in turn: no bias
        out = []
        for k, line in enumerate(lines):
            cells = line.split(", ")
            cells[3] = "0.1" if k % 2 else "-0.1"
            out.append(", ".join(cells))
        return out

    _sim_recording(tmp_path / "biased")  # steering 0 .. -0.25: mean^2 / variance 2.1
    _sim_recording(tmp_path / "even", rows=symmetric)
    for name, flip in (("biased", False), ("even", True)):
        data = import_udacity(tmp_path / name, tmp_path / f"{name}_data")
        assert with_env_defaults(resolve(TrainArgs(data=str(data)))).augmentation.flip is flip, name
        assert with_env_defaults(resolve(TrainArgs(data=str(data), flip=True))).augmentation.flip is True  # as given
    sim = _ramp(tmp_path / "sim", episodes=2)  # simulator data: mirrored whatever its labels
    assert with_env_defaults(resolve(TrainArgs(data=str(sim)))).augmentation.flip is True


def test_the_block_split_line_stays_one_short_line_for_a_pool_of_many_episodes():
    """Hundreds of episodes (a pool and its DAgger rounds) are counted, not listed."""
    from types import SimpleNamespace

    from agent.training.windows import describe_blocks

    pieces = ([(e, 0, 80) for e in range(300)] + [(e, 89, 100) for e in range(300)]
              + [(e, 0, 5) for e in range(300, 500)])
    line = describe_blocks(SimpleNamespace(pieces=pieces),
                           (list(range(300)) + list(range(600, 800)), list(range(300, 600))))
    assert "episode 0: trains on steps 0..79, validates on 89..99" in line and "296 more episodes" in line
    assert "trained whole: 200 episode(s) (300, 301, 302, 303, ...)" in line and len(line) < 600
