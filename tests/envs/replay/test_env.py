"""The replay env (envs/replay/env.py) on a recorded drive of the udacity env: a gym env with the recorded time, and
its interventions: where the car leaves the driver's line (or the road's middle), and on which side."""
from __future__ import annotations

import numpy as np
import pytest

from envs.registry import get_spec
from tests.helpers import DRIVE_STEPS


def test_the_replay_env_is_a_gym_env_with_the_recorded_time(udacity_drive):
    spec = get_spec("replay:" + str(udacity_drive.resolve()))
    env = spec.make(max_episode_steps=30)
    frame, info = env.reset(seed=0)
    assert frame.shape == (160, 320, 3) and info["time"] == 0.0 and spec.parts(None) == 1
    frame, _, terminated, truncated, info = env.step(np.array([1.0], np.float32))
    assert info["time"] == pytest.approx(0.1, abs=0.02) and info["cte"] != 0.0 and not terminated and not truncated
    with pytest.raises(ValueError, match="outside the recording's parts"):
        env.reset(seed=1)


def test_a_replay_cut_by_max_steps_reports_the_part_it_drove_not_a_lap(udacity_drive):
    """--max-steps cuts the part short: completion is the fraction of the part driven, and no lap is counted."""
    spec = get_spec("replay:" + str(udacity_drive.resolve()))
    env = spec.make(max_episode_steps=30)
    env.reset(seed=0)
    truncated, steps = False, 0
    while not truncated:
        *_, truncated, info = env.step(np.zeros(1, np.float32))
        steps += 1
    length = env.parts[0].length
    assert steps == 30 < length
    assert spec.progress(info) == pytest.approx(30 / length) and not spec.lap_complete(info)
    assert not spec.episode_meta(info)["lap_complete"]


def test_a_wider_intervention_limit_counts_fewer_interventions(udacity_drive):
    spec = get_spec("replay:" + str(udacity_drive.resolve()))
    counts = []
    for limit in (0.5, 1.0, 3.0):
        env = spec.make(max_offset=limit)
        env.reset(seed=0)
        for _ in range(DRIVE_STEPS):
            *_, truncated, info = env.step(np.zeros(1, np.float32))
            if info["lane_departure"]:
                env.recenter()
            if truncated:
                break
        counts.append((len(env._interventions), info["straight_interventions"]))
    assert [c[0] for c in counts] == [c[1] for c in counts], "a straight driver's replay matches the reference count"
    assert counts[0][0] > counts[1][0] >= counts[2][0]


def _final_info(env, steer):
    """Steer ``steer`` through the whole part, put back at every intervention as evaluation does; the last info."""
    env.reset(seed=0)
    for _ in range(DRIVE_STEPS):
        *_, truncated, info = env.step(np.full(1, steer, np.float32))
        if truncated:
            break
        if info["lane_departure"]:
            env.recenter()
    return info


def _drive_steady(env, steer):
    info = _final_info(env, steer)
    return list(env._interventions), info["interventions_left"], info["straight_interventions"]


def test_the_driver_reference_is_the_rule_of_old_and_the_middle_widens_where_the_car_may_be(udacity_drive, monkeypatch):
    """reference="driver" (the default) counts exactly what the replay always counted; "driver-or-middle" also
    lets the car be near the middle road.py measured (here replaced by known ones): a middle of 0 is the driver's
    line, a middle left of the driver lets a car that drifts left go further, a middle further than the car ever
    gets changes nothing, and always-straight's count follows the same rule."""
    import envs.replay.env as replay_env

    spec = get_spec("replay:" + str(udacity_drive.resolve()))
    default = _drive_steady(spec.make(), -0.15)
    assert _drive_steady(spec.make(reference="driver"), -0.15) == default and len(default[0]) >= 2
    monkeypatch.setattr(replay_env, "part_middle", lambda ds, episode, rows, geometry: np.zeros(rows.stop - rows.start))
    assert _drive_steady(spec.make(reference="driver-or-middle"), -0.15) == default
    monkeypatch.setattr(replay_env, "part_middle",
                        lambda ds, episode, rows, geometry: np.full(rows.stop - rows.start, -0.6))
    middle_left = _drive_steady(spec.make(reference="driver-or-middle"), -0.15)
    assert len(middle_left[0]) < len(default[0]) and middle_left[0][0] > default[0][0]
    monkeypatch.setattr(replay_env, "part_middle",
                        lambda ds, episode, rows, geometry: np.full(rows.stop - rows.start, -5.0))
    assert _drive_steady(spec.make(reference="driver-or-middle"), -0.15) == default
    def wavy(ds, episode, rows, geometry):
        return 0.8 * np.sin(np.arange(rows.stop - rows.start) / 7.0)

    monkeypatch.setattr(replay_env, "part_middle", wavy)
    interventions, _, straight = _drive_steady(spec.make(reference="driver-or-middle"), 0.0)
    assert len(interventions) == straight  # the env's always-straight drive and the frame-free count agree
    with pytest.raises(ValueError, match="reference must be one of driver, driver-or-middle"):
        spec.make(reference="lane")


def test_interventions_where_the_middle_was_not_measured_are_counted(udacity_drive, monkeypatch):
    """driver-or-middle counts the interventions made where road.py measured no middle (its 0.0 fill): all of
    them when nothing was measured, none when every frame was; the driver's rule has no such count."""
    import envs.replay.env as replay_env

    spec = get_spec("replay:" + str(udacity_drive.resolve()))

    def final_info(env):
        return _final_info(env, -0.15), len(env._interventions)

    info, n = final_info(spec.make())
    assert "interventions_unmeasured" not in info and n >= 2
    monkeypatch.setattr(replay_env, "part_middle", lambda ds, episode, rows, geometry: np.zeros(rows.stop - rows.start))
    info, n = final_info(spec.make(reference="driver-or-middle"))
    assert info["interventions_unmeasured"] == n and type(info["interventions_unmeasured"]) is int
    monkeypatch.setattr(replay_env, "part_middle",
                        lambda ds, episode, rows, geometry: np.full(rows.stop - rows.start, -0.6))
    info, n = final_info(spec.make(reference="driver-or-middle"))
    assert info["interventions_unmeasured"] == 0 and n >= 1


@pytest.mark.parametrize("steer, left", [(-1.0, True), (1.0, False)])
def test_interventions_count_the_side_the_car_left_the_drivers_line(udacity_drive, steer, left):
    """A driver at full left lock leaves the line to the left every time, and at full right lock to the right."""
    env = get_spec("replay:" + str(udacity_drive.resolve())).make()
    env.reset(seed=0)
    for _ in range(DRIVE_STEPS):
        *_, truncated, info = env.step(np.full(1, steer, np.float32))
        if truncated:  # as evaluation: no intervention on the last step
            break
        if info["lane_departure"]:
            env.recenter()
    assert len(env._interventions) >= 2
    assert info["interventions_left"] == (len(env._interventions) if left else 0)
    assert type(info["interventions_left"]) is int  # it goes into JSON with the episode (DAgger data)
