"""CarRacing wrapper: privileged features on real tracks, seeding, physics-only == rendered, info keys; the placed
starts (reset options), and the recovery teacher (RecoveryDriver) that turns a car pointing backwards round and drives
on, where the shipped discrete PPO expert does not."""

import math

import numpy as np
import pytest

from envs.carracing import (DISCRETE_ACTION_NAMES, FEATURE_NAMES, N_FEATURES, SPEC, CarRacingPrivilegedObservation,
                           RecoveryDriver, make_carracing)
from policies.actions import DISCRETE_ACTIONS

INFO_KEYS = {"privileged", "speed", "tiles_visited", "num_tiles", "on_track", "lap_complete"}
OFF = FEATURE_NAMES.index("lateral_offset")
SIN_HEAD = FEATURE_NAMES.index("sin_heading_error")


def _drive(env, actions):
    """Step a fixed action sequence; returns the list of (reward, info)."""
    out = []
    for a in actions:
        _, r, term, trunc, info = env.step(a)
        out.append((r, info))
        if term or trunc:
            break
    return out


def _gas_then_steer(steer: float, n_straight: int = 30, n_turn: int = 25):
    straight = [np.array([0.0, 0.5, 0.0], np.float32)] * n_straight
    turn = [np.array([steer, 0.1, 0.0], np.float32)] * n_turn
    return straight + turn


def test_feature_names_are_unique_and_match_vector():
    assert len(set(FEATURE_NAMES)) == len(FEATURE_NAMES) == N_FEATURES
    env = make_carracing(render=False)
    _, info = env.reset(seed=1)
    assert info["privileged"].shape == (N_FEATURES,) and info["privileged"].dtype == np.float32
    assert np.all(np.isfinite(info["privileged"]))


@pytest.mark.parametrize("space", ["continuous", "discrete"])
def test_info_keys_and_obs_in_both_action_spaces(space):
    env = make_carracing(space, render=False)
    obs, info = env.reset(seed=2)
    assert INFO_KEYS <= info.keys()
    assert obs.shape == (96, 96, 3) and obs.dtype == np.uint8 and not obs.any()  # physics-only: zero frame
    action = np.array([0.0, 1.0, 0.0], np.float32) if space == "continuous" else 3
    for _ in range(60):
        obs, r, term, trunc, info = env.step(action)
    assert INFO_KEYS <= info.keys()
    assert info["speed"] > 5.0, "gas must move the car"
    assert info["on_track"] and not info["lap_complete"]
    assert 0 < info["tiles_visited"] <= info["num_tiles"]
    assert isinstance(info["tiles_visited"], int) and isinstance(info["num_tiles"], int)


def test_offset_and_heading_near_zero_at_start():
    env = make_carracing(render=False)
    for seed in (0, 5, 11):
        _, info = env.reset(seed=seed)
        p = info["privileged"]
        assert abs(p[OFF]) < 0.05, f"seed {seed}: car starts on the centerline, offset {p[OFF]}"
        assert abs(p[SIN_HEAD]) < 0.05


@pytest.mark.parametrize("steer,sign", [(1.0, 1.0), (-1.0, -1.0)])
def test_offset_and_heading_follow_the_steer_side(steer, sign):
    """Positive = right: steering right makes the car point and drift right of the centerline."""
    env = make_carracing(render=False)
    env.reset(seed=3)
    steps = _drive(env, _gas_then_steer(steer))
    p = steps[-1][1]["privileged"]
    assert sign * p[OFF] > 0.2, p[OFF]
    assert sign * p[SIN_HEAD] > 0.2, p[SIN_HEAD]
    assert sign * p[FEATURE_NAMES.index("yaw_rate")] > 0
    assert sign * p[FEATURE_NAMES.index("steer_angle")] > 0.5


def test_discrete_right_and_left_match_the_contract_order():
    env = make_carracing("discrete", render=False)
    offsets = {}
    for action in (1, 2):  # 1 RIGHT, 2 LEFT
        env.reset(seed=3)
        steps = _drive(env, [3] * 40 + [action] * 25)
        offsets[action] = steps[-1][1]["privileged"][OFF]
    assert offsets[1] > 0 > offsets[2]


def test_lookahead_sees_the_road_ahead():
    env = make_carracing(render=False)
    _, info = env.reset(seed=4)
    p = dict(zip(FEATURE_NAMES, info["privileged"]))
    ys = [p[f"ahead{k}_y"] for k in (1, 2, 3, 5)]
    assert all(np.diff(ys) > 0), "look-ahead points lie further forward with distance"
    assert abs(p["ahead1_x"]) < 0.1 and p["ahead1_cos_dir"] > 0.9


def test_seed_reproduces_the_track():
    env = make_carracing(render=False)
    env.reset(seed=42)
    a = np.asarray(env.unwrapped.track)
    env.reset(seed=7)
    b = np.asarray(env.unwrapped.track)
    env.reset(seed=42)
    c = np.asarray(env.unwrapped.track)
    assert np.array_equal(a, c)
    assert a.shape != b.shape or not np.allclose(a, b)


def test_physics_only_matches_rendered_returns():
    rng = np.random.default_rng(0)
    actions = [np.array([rng.uniform(-1, 1), rng.uniform(0, 1), 0.0], np.float32) for _ in range(40)]
    results = []
    for render in (True, False):
        env = make_carracing(render=render)
        obs, _ = env.reset(seed=9)
        steps = _drive(env, actions)
        obs, *_ = env.step(actions[0])
        assert obs.any() == render, "rendered mode shows the track, physics-only a zero frame"
        results.append(
            ([r for r, _ in steps], np.stack([i["privileged"] for _, i in steps]),
             [i["tiles_visited"] for _, i in steps])
        )
        env.close()
    (r1, p1, t1), (r2, p2, t2) = results
    assert r1 == r2 and t1 == t2
    np.testing.assert_array_equal(p1, p2)


def test_privileged_observation_wrapper():
    env = CarRacingPrivilegedObservation(make_carracing(render=False))
    obs, info = env.reset(seed=5)
    np.testing.assert_array_equal(obs, info["privileged"])
    assert env.observation_space.contains(obs)
    obs, _, _, _, info = env.step(np.array([0.0, 0.3, 0.0], np.float32))
    np.testing.assert_array_equal(obs, info["privileged"])


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="action_space"):
        make_carracing("diagonal")
    with pytest.raises(ValueError, match="max_episode_steps"):
        make_carracing(max_episode_steps=0)
    with pytest.raises(ValueError, match="render_mode"):
        make_carracing(render=False, render_mode="rgb_array")


def test_time_limit_truncates():
    env = make_carracing("discrete", render=False, max_episode_steps=5)
    env.reset(seed=1)
    flags = [env.step(0)[3] for _ in range(5)]
    assert flags == [False] * 4 + [True]


def test_wrong_way_once_the_car_has_turned_around():
    """The spec's wrong_way (read by evaluate.py's wrong-way steps) is off on the start line and on once the car,
    circling at full lock, points against the track; on the way round it passes through 90 degrees."""

    env = make_carracing(render=False)
    _, info = env.reset(seed=3)
    assert not SPEC.wrong_way(info)
    cosines, flags = [], []
    for r, info in _drive(env, _gas_then_steer(1.0, n_straight=20, n_turn=300)):
        cosines.append(info["privileged"][FEATURE_NAMES.index("cos_heading_error")])
        flags.append(SPEC.wrong_way(info))
    assert any(flags) and not all(flags)
    assert flags == [c < 0 for c in cosines]


def test_unvisited_tiles_list_exactly_the_tiles_not_yet_visited():
    """info["unvisited_tiles"] (an episode's column in evaluate.py: which tiles a missed lap skipped) names, as
    index ranges, every tile the car has not touched and no other."""
    env = make_carracing(render=False)
    _, info = env.reset(seed=4)
    for _, info in _drive(env, _gas_then_steer(0.3, n_straight=60, n_turn=80)):
        pass
    tiles = set()
    for part in info["unvisited_tiles"].split():
        a, _, b = part.partition("-")
        tiles |= set(range(int(a), int(b or a) + 1))
    road = env.unwrapped.road
    assert tiles == {i for i, t in enumerate(road) if not t.road_visited}
    assert len(tiles) == info["num_tiles"] - info["tiles_visited"] > 0 and 0 not in tiles


def test_the_policy_names_the_discrete_actions_as_the_env_does():
    """policies does not import envs, so each keeps the id -> name list; a discrete head's labels must match."""
    assert DISCRETE_ACTIONS == DISCRETE_ACTION_NAMES


# ------------------------------------------------------------------------------- placed starts and the recovery teacher
COS = FEATURE_NAMES.index("cos_heading_error")
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


def _drive_with(env, info, act, steps: int) -> list[dict]:
    """Step ``act(privileged)`` from ``info`` for up to ``steps`` steps; returns the infos."""
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
        infos = _drive_with(env, info, lambda p: teacher.env_action(p, space), TURN_STEPS[space] + 150)
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
        infos = _drive_with(env, info, expert.act, 200)
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
