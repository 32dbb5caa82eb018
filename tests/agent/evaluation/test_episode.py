"""agent/evaluation/episode.py on a fake CarRacing (8x8 frames): the controller drives while the expert shadows it,
the timing conditions decide which frames it sees, a lane-keeping env's interventions and stalls, the HUD's text."""
from dataclasses import replace

import numpy as np
import pytest
from gymnasium import spaces

from agent.evaluation.episode import _scene, pedals_text, run_episode
from agent.evaluation.timing import TimingConditions
from envs.carracing import FEATURE_NAMES, N_FEATURES
from envs.carracing import SPEC as CARRACING

STEPS = 6


class _Env:
    """Tile i is reached at step i; off the road at the steps in ``off_road``, standing at those in ``standing``;
    truncated after ``steps`` steps; every action it is given is kept."""

    action_space = spaces.Box(np.array([-1, 0, 0], np.float32), np.ones(3, np.float32))

    def __init__(self, steps=STEPS, off_road=(), standing=()):
        self.steps, self.off_road, self.standing = steps, off_road, standing
        self.i, self.actions, self.seed = 0, [], None

    def info(self, on_road=None):
        priv = np.zeros(N_FEATURES, np.float32)
        priv[FEATURE_NAMES.index("cos_heading_error")] = 1.0
        return {"privileged": priv, "speed": 0.0 if self.i in self.standing else 10.0, "lap_complete": False,
                "tiles_visited": self.i, "num_tiles": 10, "unvisited_tiles": "",
                "on_track": self.i not in self.off_road if on_road is None else on_road}

    def reset(self, seed=None):
        self.i, self.seed = 0, seed
        return np.zeros((8, 8, 3), np.uint8), self.info()

    def step(self, action):
        self.actions.append(action)
        self.i += 1
        return np.full((8, 8, 3), self.i, np.uint8), 1.0, False, self.i >= self.steps, self.info()


class _Expert:
    spec = CARRACING

    def __init__(self):
        self.calls = 0

    def act(self, priv):
        self.calls += 1
        return np.array([0.25, 1.0, 0.0], np.float32)


class _Student:
    """Steers -0.25 in 2 ms; keeps the times and expert actions it was shown."""

    is_expert, name, filled = False, "student", ()

    def __init__(self):
        self.times, self.shown, self.reset_to = [], [], None

    def reset(self, seed):
        self.reset_to = seed

    def act(self, frame, t, info, shadow, queue):
        self.times.append(t)
        self.shown.append(shadow)
        return np.array([-0.25, 0.5, 0.0], np.float32), 0.002


def test_the_student_drives_while_the_expert_shadows_every_state():
    env, expert, student, steps = _Env(), _Expert(), _Student(), []
    row, latencies = run_episode(student, env, expert, 7, "continuous", on_step=lambda: steps.append(1))
    assert env.seed == 7 and student.reset_to == 7 and row["seed"] == 7
    assert (row["length"], row["return"], row["truncated"], row["terminated"]) == (STEPS, 6.0, True, False)
    assert all(a[0] == -0.25 for a in env.actions), "the student's action is executed, not the expert's"
    assert expert.calls == STEPS and all(s[0] == 0.25 for s in student.shown)
    assert row["steer_mae"] == pytest.approx(0.5), "compared with the expert on the same states"
    assert student.times == pytest.approx([k * CARRACING.dt for k in range(STEPS)]), "steps x the env's dt"
    assert latencies == pytest.approx([2.0] * STEPS) and len(steps) == STEPS
    assert row["completion"] == pytest.approx(0.6) and "frames_seen" not in row, "regular timing adds no columns"


def test_the_expert_driving_is_compared_with_itself():
    from agent.controllers import ExpertController

    expert = _Expert()
    row, latencies = run_episode(ExpertController(expert), _Env(), expert, 1, "continuous")
    assert row["steer_mae"] == 0.0 and expert.calls == STEPS, "one expert answer per state: driving and label"
    assert len(latencies) == STEPS


def test_the_timing_decides_which_frames_the_student_sees_and_when_its_actions_land():
    env, student = _Env(steps=20), _Student()
    row, latencies = run_episode(student, env, _Expert(), 3, "continuous",
                                 timing=TimingConditions(drop_prob=0.5, latency_steps=2))
    assert row["frames_seen"] == len(student.times) == len(latencies) < 20, "a dropped frame: no inference"
    assert row["frames_seen"] + row["held_steps"] == 20 and row["neutral_steps"] == 2
    assert all(a[0] == 0.0 for a in env.actions[:2]) and env.actions[2][0] == -0.25, "neutral until it lands"


def test_a_car_off_its_lane_is_put_back_and_counted():
    recovered = []

    def recover(env, speed=None):
        recovered.append(speed)
        return np.zeros((8, 8, 3), np.uint8), env.info(on_road=True)

    spec = replace(CARRACING, recover=recover, stall=(1.0, 0.05, 7.0))
    expert = _Expert()
    expert.spec = spec
    row, _ = run_episode(_Student(), _Env(off_road=(2,), standing=(4, 5)), expert, 1, "continuous")
    # step 2 off the road; steps 4-5 standing for 2 x 0.02 s < 0.05 s: no stall; the episode ends at 6
    assert recovered == [None] and row["interventions"] == 1 and row["stalls"] == 0 and row["length"] == STEPS
    recovered.clear()
    row, _ = run_episode(_Student(), _Env(steps=8, standing=(2, 3, 4)), expert, 1, "continuous")
    assert recovered == [7.0], "a stalled car goes back to spec.stall's speed"
    assert row["interventions"] == 1 and row["stalls"] == 1


def test_the_hud_names_the_pedals_and_the_scene():
    names = CARRACING.action_names["continuous"]
    text = pedals_text(names, "continuous", [0.1, 0.8, 0.0], [0.2, 0.5, 0.25], filled=("brake",))
    assert text == "gas +0.80  brake +0.00 (the expert's)   expert: gas +0.50  brake +0.25"
    assert pedals_text(names, "continuous", [0.1, 0.8, 0.0], None) == "gas +0.80  brake +0.00"
    assert pedals_text(("steer",), "continuous", [0.3], [0.1]) == "", "steering alone: nothing besides"
    discrete = CARRACING.action_names["discrete"]
    assert pedals_text(discrete, "discrete", 3, 4) == "action gas   expert: brake"
    assert _scene(CARRACING, {}) == ""
    assert _scene(CARRACING, {"theme": "jungle", "condition": "dusk"}) == "  jungle", "no lights to name"
    assert _scene(replace(CARRACING, conditions=("clear", "dusk")), {"theme": "jungle", "condition": "dusk"}) == \
        "  jungle, dusk"
