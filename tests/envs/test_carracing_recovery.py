"""The recovery teacher (envs.carracing.RecoveryDriver) turns a car that points backwards round and drives on,
where the shipped discrete PPO expert does not; the placed starts it is tested from (reset options)."""
import math

import numpy as np
import pytest

from envs.carracing import FEATURE_NAMES, SPEC, RecoveryDriver, make_carracing

COS = FEATURE_NAMES.index("cos_heading_error")
OFF = FEATURE_NAMES.index("lateral_offset")
# (track seed, start fraction of the lap): the start straight and three other places on three tracks
PLACES = [(1, 0.0), (1, 0.3), (2, 0.5), (3, 0.8)]
# steps to point the right way with a wheel on the road, measured (2 s more than the slowest case):
# standing continuous 88-99, discrete 149-176; rolling (60 steps of gas backwards) continuous 35-102, discrete 24-69
TURN_STEPS = {"continuous": 200, "discrete": 280}
GAS = {"continuous": np.array([0.0, 0.5, 0.0], np.float32), "discrete": 3}


def _backwards(space: str, seed: int, fraction: float, roll: int):
    """An env whose car stands at `fraction` of the lap facing backwards, after `roll` steps of gas (driving the
    course the wrong way); returns (env, info)."""
    env = make_carracing(space, render=False)
    _, info = env.reset(seed=seed, options={"start_fraction": fraction, "start_turn": math.pi})
    for _ in range(roll):
        _, _, _, _, info = env.step(GAS[space])
    assert SPEC.wrong_way(info)
    return env, info


def _drive(env, info, act, steps: int) -> list[dict]:
    infos = []
    for _ in range(steps):
        _, _, term, trunc, info = env.step(act(info["privileged"]))
        infos.append(info)
        if term or trunc:
            break
    return infos


def _turned_round(info: dict) -> bool:
    return info["privileged"][COS] > 0 and info["on_track"]


@pytest.mark.parametrize("space", ["continuous", "discrete"])
@pytest.mark.parametrize("roll", [0, 60])
def test_recovery_driver_turns_a_backwards_car_round_and_drives_on(space, roll):
    teacher = RecoveryDriver()
    for seed, fraction in PLACES:
        env, info = _backwards(space, seed, fraction, roll)
        infos = _drive(env, info, lambda p: teacher.env_action(p, space), TURN_STEPS[space] + 150)
        first = next((t for t, i in enumerate(infos) if _turned_round(i)), None)
        assert first is not None and first < TURN_STEPS[space], (seed, fraction, first)
        after = infos[first:]
        assert not any(SPEC.wrong_way(i) for i in after), f"seed {seed}: pointed backwards again"
        assert after[-1]["tiles_visited"] >= after[0]["tiles_visited"] + 15, "it drives on along the course"
        assert np.mean([i["on_track"] for i in after]) > 0.8  # the turn may overshoot the road once


def test_discrete_expert_does_not_turn_a_standing_backwards_car_round():
    """Why the recovery labels exist: standing backwards, the shipped discrete expert steers at full lock (or
    brakes) and never gasses, so the car never moves (rolling backwards it turns round on 2 of these 4 places)."""
    from agent.experts.expert import Expert

    expert = Expert.load(None, "discrete")
    for seed, fraction in PLACES:
        env, info = _backwards("discrete", seed, fraction, 0)
        infos = _drive(env, info, expert.act, 200)
        assert not any(_turned_round(i) for i in infos), (seed, fraction)
        assert infos[-1]["speed"] < 1.0


def test_needs_is_wrong_way_or_far_off_the_road():
    teacher = RecoveryDriver()
    env = make_carracing(render=False)
    for turn, offset, needed in [(0.0, 0.0, False), (math.pi, 0.0, True), (2.0, 0.5, True), (0.5, 1.5, False),
                                 (0.0, 2.5, True), (0.0, -2.5, True)]:
        _, info = env.reset(seed=4, options={"start_turn": turn, "start_offset": offset})
        p = info["privileged"]
        assert teacher.needs(p) == needed == (SPEC.wrong_way(info) or abs(p[OFF]) > teacher.far_offset)


def test_placed_start_turns_and_shifts_the_car():
    env = make_carracing(render=False)
    _, plain = env.reset(seed=5)
    _, info = env.reset(seed=5, options={})
    np.testing.assert_array_equal(plain["privileged"], info["privileged"])
    _, info = env.reset(seed=5, options={"start_turn": 0.5, "start_offset": -0.8})
    p = info["privileged"]
    assert p[FEATURE_NAMES.index("sin_heading_error")] == pytest.approx(math.sin(0.5), abs=0.04)  # + = right
    assert p[OFF] == pytest.approx(-0.8, abs=0.02) and info["on_track"]
    _, info = env.reset(seed=5, options={"start_fraction": 0.5})
    assert abs(info["track_index"] - info["num_tiles"] // 2) <= 1 and abs(info["privileged"][OFF]) < 0.05
