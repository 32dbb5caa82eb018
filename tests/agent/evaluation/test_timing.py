"""Timing conditions in closed loop: dropped frames, jitter and latency, on real env steps.

A recording controller (it returns a different action at every call and keeps the timestamps it got) drives
through ``run_episode`` on a wrapped env that logs every action it receives, so the tests see exactly what
was held, delayed and timestamped. ``evaluate`` runs check the policy's stream and core, metrics.json, the
worker processes and the bit-identical regular timing; ``evaluate.main`` checks the bad inputs."""
from __future__ import annotations

import json
from collections import deque
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

import evaluate as cli
from agent.controllers import shipped_checkpoint
from agent.evaluation.episode import run_episode
from agent.evaluation.args import EvalArgs, check_args
from agent.evaluation.config import resolve
from agent.evaluation.evaluate import evaluate
from agent.evaluation.timing import STREAM, TimingConditions, parse_jitter
from envs.registry import neutral_action
from agent.experts.expert import Expert
from envs.registry import get_spec
from policies.config import PolicyConfig
from policies.checkpoint import save_checkpoint
from policies.policy import DrivingPolicy, PolicyStream

REPO = Path(__file__).resolve().parents[3]
STEPS = 40
TIMING_KEYS = ("frames_seen", "held_steps", "dropped_frames", "neutral_steps")
RUN_TIMES = ("wall_seconds", "latency", "command", "created", "workers", "timing")


# ----------------------------------------------------------------------------- helpers
class ActionLog(gym.Wrapper):
    """Keeps a copy of every action the env receives."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.actions: list[np.ndarray] = []

    def step(self, action):
        self.actions.append(np.array(action, dtype=np.float32, copy=True))
        return self.env.step(action)


class Recorder:
    """A controller that returns a new, distinct action at every call and records the step times it got."""

    is_expert = False
    has_panel = False
    name = "recorder"

    def __init__(self, n_actions: int) -> None:
        self.n_actions = n_actions
        self.times: list[float] = []
        self.decisions: list[np.ndarray] = []
        self.queues: list[list[list[float]]] = []  # the actions on their way at each decision

    def reset(self, seed: int | None = None) -> None:
        self.times.clear()
        self.decisions.clear()
        self.queues.clear()

    def act(self, frame, t, info, expert_action, on_the_way=()):
        k = len(self.times) + 1
        action = np.array([0.001 * k, 0.1, 0.0][: self.n_actions], dtype=np.float32)  # small steer: stays on the road
        self.queues.append([np.asarray(a).tolist() for a in on_the_way])
        self.times.append(t)
        self.decisions.append(action.copy())
        return action, 0.0

    def window(self):
        return None


@pytest.fixture(scope="module", params=["carracing", "udacity"])
def world(request):
    """(env name, action-logging env, expert, number of action components) for each env."""
    name = request.param
    spec = get_spec(name)
    expert = Expert.load(None, "continuous", name)
    renderer = "fast" if "fast" in spec.renderers else spec.renderers[0]
    env = ActionLog(spec.make("continuous", render=True, max_episode_steps=STEPS, renderer=renderer))
    yield name, env, expert, env.action_space.shape[0]
    env.close()


def _drive(world, timing: TimingConditions, seed: int = 1234):
    name, env, expert, n = world
    env.actions.clear()
    controller = Recorder(n)
    row, _ = run_episode(controller, env, expert, seed, "continuous", timing=timing)
    return row, controller, list(env.actions)


def _acting_steps(timing: TimingConditions, seed: int, steps: int) -> list[int]:
    """The steps at which the policy gets a frame, from the timing alone (no env)."""
    clock = timing.episode(seed, 0)
    return [s for s in range(steps) if clock.sees_frame(s)]


def _untimed(x):
    if isinstance(x, dict):
        return {k: _untimed(v) for k, v in x.items() if not any(t in k for t in RUN_TIMES)}
    if isinstance(x, list):
        return [_untimed(v) for v in x]
    return x


def _tiny_carracing(path: Path) -> Path:
    torch.manual_seed(0)
    config = PolicyConfig.for_actions("continuous", core_options=dict(d_model=16, heads=4, topk=4), window=4,
                                      frame_stride=2, feature_dim=16)
    return save_checkpoint(path, DrivingPolicy(config))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return _tiny_carracing(tmp_path_factory.mktemp("timing") / "nac.pt")


def _args(out: Path, **kw) -> EvalArgs:
    base = dict(episodes=1, max_steps=30, seed=1234, out=str(out), progress=False, workers=1, video=False,
                tensorboard=False, renderer="fast")
    return EvalArgs(**{**base, **kw})


# ----------------------------------------------------------------------------- the clock alone
def test_jitter_text_and_the_neutral_action():
    assert parse_jitter(None) is None and parse_jitter("1:3") == (1, 3) and parse_jitter("2:2") == (2, 2)
    for bad in ("0:2", "3:2", "a:b", "2", "1:2:3", "", "1.5:2"):
        with pytest.raises(ValueError, match="--jitter"):
            parse_jitter(bad)
    assert neutral_action(get_spec("carracing").make("discrete", render=False).action_space) == 0  # noop
    box = neutral_action(gym.spaces.Box(np.float32([-1, 0, 0]), np.float32([1, 1, 1]), dtype=np.float32))
    assert box.dtype == np.float32 and box.tolist() == [0.0, 0.0, 0.0]


def test_clock_schedules_are_seeded_and_within_the_options():
    jitter = TimingConditions(jitter=(1, 3))
    a, b, c = (_acting_steps(jitter, s, 3000) for s in (7, 7, 8))
    assert a == b and a != c  # the track seed fixes the draws
    gaps = np.diff(a)
    assert a[0] == 0 and set(gaps) == {1, 2, 3}
    assert np.random.default_rng([STREAM, 7]).integers(1, 4) == a[1]  # the documented generator
    dropped = 1 - len(_acting_steps(TimingConditions(drop_prob=0.2), 7, 5000)) / 5000
    assert 0.18 < dropped < 0.22
    clock = TimingConditions().episode(7, 0)
    assert clock.rng is None and all(clock.sees_frame(s) for s in range(100))  # regular: nothing drawn
    marker = object()
    assert clock.action(marker) is marker  # and the action passes straight through


# ----------------------------------------------------------------------------- real env steps
def test_a_dropped_frame_holds_the_last_action(world):
    row, policy, applied = _drive(world, TimingConditions(drop_prob=0.4))
    acting = _acting_steps(TimingConditions(drop_prob=0.4), 1234, STEPS)
    assert row["length"] == STEPS == len(applied) and row["frames_seen"] == len(acting) == len(policy.decisions)
    assert row["held_steps"] == STEPS - len(acting) > 5 and row["dropped_frames"] == row["held_steps"]
    assert row["neutral_steps"] == 0
    for step, action in enumerate(applied):
        if step in acting:
            np.testing.assert_array_equal(action, policy.decisions[acting.index(step)])
        else:
            np.testing.assert_array_equal(action, applied[step - 1])  # exactly the previous action


def test_jitter_acts_every_k_steps_with_true_timestamps(world):
    name, env, expert, n = world
    timing = TimingConditions(jitter=(1, 3))
    row, policy, applied = _drive(world, timing)
    acting = _acting_steps(timing, 1234, STEPS)
    dt = get_spec(name).dt
    assert policy.times == [s * dt for s in acting]  # the true timestamps, exactly
    assert set(np.diff(acting)) <= {1, 2, 3} and row["frames_seen"] == len(acting) < STEPS
    for step in range(STEPS):  # the new action where the policy acted, the previous one in between
        expected = policy.decisions[acting.index(step)] if step in acting else applied[step - 1]
        np.testing.assert_array_equal(applied[step], expected)


@pytest.mark.parametrize("delay", [1, 3])
def test_latency_shifts_the_applied_actions_by_d_steps(world, delay):
    name, env, expert, n = world
    drop = TimingConditions(drop_prob=0.3)
    _, _, on_time = _drive(world, drop)
    row, policy, late = _drive(world, TimingConditions(drop_prob=0.3, latency_steps=delay))
    acting = _acting_steps(drop, 1234, STEPS)
    decided = [policy.decisions[max(i for i, s in enumerate(acting) if s <= step)] for step in range(STEPS)]
    neutral = neutral_action(env.action_space)
    assert [a.tolist() for a in late] == [neutral.tolist()] * delay + [d.tolist() for d in decided[:-delay]]
    assert row["neutral_steps"] == delay
    assert [a.tolist() for a in on_time] == [d.tolist() for d in decided]  # the same run without latency: unshifted
    for k, step in enumerate(acting[: -delay]):  # shown the actions on their way: those applied over the next D steps
        assert policy.queues[k] == [a.tolist() for a in late[step: step + delay]]


def test_timed_runs_repeat_exactly(world):
    timing = TimingConditions(drop_prob=0.25, jitter=(1, 2), latency_steps=2)
    first, p1, a1 = _drive(world, timing)
    again, p2, a2 = _drive(world, timing)
    other, p3, _ = _drive(world, timing, seed=1235)
    assert _untimed(first) == _untimed(again) and p1.times == p2.times
    assert all(np.array_equal(x, y) for x, y in zip(a1, a2, strict=True))
    assert p3.times != p1.times  # another track seed, another draw


def test_the_expert_drives_under_the_same_conditions(world):
    from agent.controllers import ExpertController

    name, env, expert, n = world
    regular, _ = run_episode(ExpertController(expert), env, expert, 1234, "continuous")
    held, _ = run_episode(ExpertController(expert), env, expert, 1234, "continuous",
                          timing=TimingConditions(jitter=(2, 3)))
    assert regular["steer_mae"] == 0.0  # it shadows itself
    assert held["frames_seen"] < held["length"] and held["steer_mae"] > 0  # held actions vs its fresh ones


# ----------------------------------------------------------------------------- evaluate(): policy, files, workers
def _record_stream_and_core(monkeypatch) -> tuple[list[float], list[list[float]]]:
    """Patch the policy's stream and core input to record the t each frame got and the seconds the core got."""
    stamps: list[float] = []
    windows: list[list[float]] = []
    step, raw = PolicyStream.step, DrivingPolicy.raw_from_embeddings

    def recording_step(self, frame, t=None, latency=None, on_the_way=None):
        stamps.append(t)
        return step(self, frame, t, latency, on_the_way)

    def recording_raw(self, emb, time=None, latency=None, on_the_way=None):
        windows.append(time[0].tolist())
        return raw(self, emb, time, latency, on_the_way)

    monkeypatch.setattr(PolicyStream, "step", recording_step)
    monkeypatch.setattr(DrivingPolicy, "raw_from_embeddings", recording_raw)
    return stamps, windows


def _expected_windows(stamps: list[float], span: int, stride: int) -> list[list[float]]:
    """What the core must get for these frame times: the stream's window, in seconds before the newest frame."""
    times: deque[float] = deque(maxlen=span)
    out = []
    for t in stamps:
        times.extend([t] * (span if not times else 1))
        picks = np.array([times[i] for i in range(0, span, stride)], dtype=np.float64)
        out.append((picks - picks[-1]).astype(np.float32).tolist())
    return out


def _expected_time_windows(stamps: list[float], window: int, stride: int, period: float) -> list[list[float]]:
    """The time clock's windows, by brute force: for each trained offset, the latest frame received so far at or
    before it (the first frame when none is), in seconds before the newest frame."""
    out = []
    for k, t in enumerate(stamps):
        seen = np.array(stamps[:k + 1])
        want = t - stride * period * np.arange(window - 1, -1, -1)
        picks = np.array([max([s for s in seen if s <= w + 1e-9], default=seen[0]) for w in want])
        out.append((picks - picks[-1]).astype(np.float32).tolist())
    return out


@pytest.mark.parametrize("env,clock", [("carracing", "steps"), ("carracing", "time"), ("udacity", "time")])
def test_timestamps_reach_the_policy_stream_and_core_unchanged(env, clock, tiny, tmp_path, monkeypatch):
    if env == "udacity" and not (REPO / shipped_checkpoint("udacity")).is_file():
        pytest.skip("the shipped udacity student is not in checkpoints/")
    ckpt = str(tiny) if env == "carracing" else str(REPO / shipped_checkpoint("udacity"))
    stamps, windows = _record_stream_and_core(monkeypatch)
    timing = dict(drop_prob=0.3, jitter="1:3")
    steps = 30 if env == "carracing" else 12
    m = evaluate(resolve(_args(tmp_path, env=env, checkpoint=[ckpt], max_steps=steps, window_clock=clock,
                               renderer=None if env == "udacity" else "fast", **timing)))
    summary = next(iter(m.values()))
    acting = _acting_steps(TimingConditions(0.3, (1, 3)), 1234, steps)
    dt = get_spec(env).dt
    assert stamps == [s * dt for s in acting] and summary["episodes"][0]["frames_seen"] == len(acting)
    config = summary["policy_config"]
    span = (config["window"] - 1) * config["frame_stride"] + 1
    if clock == "steps":  # the last frames received, however far apart
        assert windows == _expected_windows(stamps, span, config["frame_stride"])
    else:  # the received frames nearest the trained offsets
        expected = _expected_time_windows(stamps, config["window"], config["frame_stride"], config["frame_period"])
        np.testing.assert_allclose(windows, expected, atol=1e-6)
    assert windows != _expected_windows([s * dt for s in range(len(stamps))], span, config["frame_stride"]), \
        "the irregular gaps reached the core"
    assert summary["latency_steps"] == len(acting)  # an inference latency per frame seen, none per held step


def test_metrics_json_records_the_timing(tiny, tmp_path):
    m = evaluate(resolve(_args(tmp_path / "t", checkpoint=[str(tiny)], episodes=2, drop_prob=0.2, jitter="1:3",
                               latency_steps=5, tensorboard=True)))["nac"]
    t = json.loads((tmp_path / "t" / "metrics.json").read_text())["timing"]
    assert t["regular"] is False and t["drop_prob"] == 0.2 and t["jitter"] == "1:3"
    assert t["latency_steps"] == 5 and t["latency_s"] == pytest.approx(0.1)
    assert t["steps"] == 60 and t["frames_seen"] + t["held_steps"] == 60 and t["neutral_steps"] == 10
    assert t["frames_seen"] == sum(e["frames_seen"] for e in m["episodes"]) < 60 and "default_rng" in t["rng"]
    assert m["window_clock"] == "time"  # the default: windows span the trained time under irregular frames
    header = (tmp_path / "t" / "episodes.csv").read_text().splitlines()[0].split(",")
    assert header[-4:] == list(TIMING_KEYS)
    regular = evaluate(resolve(_args(tmp_path / "r", checkpoint=[str(tiny)])))["nac"]
    assert regular["timing"]["regular"] is True and regular["timing"]["frames_seen"] == 30
    assert not set(TIMING_KEYS) & set(regular["episodes"][0])  # regular rows keep their columns


def test_regular_timing_is_bit_identical_to_every_frame_on_time(tiny, tmp_path):
    """Jitter 1:1 draws from the timing generator yet gives the policy every frame at once: its rows, and the
    video, must be the regular run's, bit for bit (so the generator touches nothing else)."""
    kw = dict(checkpoint=[str(tiny)], episodes=2, max_steps=25, video=True, video_episodes=1)
    regular = evaluate(resolve(_args(tmp_path / "r", **kw)))["nac"]
    drawn = evaluate(resolve(_args(tmp_path / "j", jitter="1:1", **kw)))["nac"]
    strip = [{k: v for k, v in e.items() if k not in TIMING_KEYS} for e in drawn["episodes"]]
    assert _untimed(regular["episodes"]) == _untimed(strip)
    assert all(e["frames_seen"] == 25 and e["held_steps"] == 0 for e in drawn["episodes"])
    video = "videos/seed_1234.mp4"
    assert (tmp_path / "r" / video).read_bytes() == (tmp_path / "j" / video).read_bytes()


def test_two_workers_give_the_rows_of_one(tiny, tmp_path):
    kw = dict(checkpoint=[str(tiny)], episodes=2, max_steps=25, drop_prob=0.3, jitter="1:2", latency_steps=2)
    one = evaluate(resolve(_args(tmp_path / "1", **kw)))["nac"]
    two = evaluate(resolve(_args(tmp_path / "2", **{**kw, "workers": 2})))["nac"]
    assert _untimed(one["episodes"]) == _untimed(two["episodes"])
    assert one["timing"] == two["timing"]


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("argv, needle", [
    (["--drop-prob", "1"], "--drop-prob"),
    (["--drop-prob", "-0.1"], "--drop-prob"),
    (["--drop-prob", "nan"], "--drop-prob"),
    (["--drop-prob", "often"], "--drop-prob"),
    (["--latency-steps", "-1"], "--latency-steps"),
    (["--latency-steps", "30", "--max-steps", "30"], "--latency-steps"),
    (["--jitter", "0:2"], "--jitter"),
    (["--jitter", "3:2"], "--jitter"),
    (["--jitter", "1-3"], "--jitter"),
    (["--jitter", "a:b"], "--jitter"),
    (["--jitter", "1:31", "--max-steps", "30"], "--max-steps 30"),
    (["--jitter", "1:1001"], "--max-steps 1000"),
])
def test_bad_timing_input_is_one_line_and_exit_2(argv, needle, tmp_path, capsys):
    try:
        code = cli.main(["--expert-drives", *argv, "--out", str(tmp_path / "o"), "--no-progress"])
    except SystemExit as e:  # argparse's own check (not a number)
        code = e.code
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and needle in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o").exists()


def test_timing_options_are_refused_offline():
    with pytest.raises(ValueError, match="closed loop"):
        check_args(EvalArgs(data=["recording"], jitter="1:2", progress=False, workers=1))
    # all off: regular timing
    assert resolve(EvalArgs(drop_prob=0, progress=False, workers=1)).conditions.timing.regular


# ----------------------------------------------------------------------------- a student told its latency
def test_a_latency_aware_student_is_told_the_latency_or_the_belief_given(tiny, tmp_path, monkeypatch):
    from policies.checkpoint import load_checkpoint, save_checkpoint
    from tests.helpers import record_told_latency

    policy = load_checkpoint(tiny)
    policy.config.latency_input = "clock"  # the nac core's query time: no new weights
    clock = save_checkpoint(tmp_path / "clock.pt", policy)
    told = record_told_latency(monkeypatch)
    m = evaluate(resolve(_args(tmp_path / "true", checkpoint=[str(clock)], latency_steps=3)))
    assert set(told) == {3 * get_spec("carracing").dt}
    assert next(iter(m.values()))["told_latency_s"] == pytest.approx(0.06)
    told.clear()
    evaluate(resolve(_args(tmp_path / "wrong", checkpoint=[str(clock)], latency_steps=3, told_latency_steps=0)))
    assert set(told) == {0.0}
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match="--told-latency-steps must be an integer"):
            check_args(EvalArgs(told_latency_steps=bad))
