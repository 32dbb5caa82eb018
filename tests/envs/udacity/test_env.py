"""Udacity-style simulator: tracks, vehicle model, camera geometry, env invariants, the Stanley teacher."""

import math
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import envs.udacity as U
from envs.udacity import (
    CAMERA_PITCH_DEG,
    DT,
    FEATURE_NAMES,
    N_FEATURES,
    Renderer,
    StanleyDriver,
    Track,
    UdacityPrivilegedObservation,
    UdacityStyleEnv,
    Vehicle,
    generate_track,
)
from envs.udacity.camera import CENTER_CAMERA
from envs.udacity.track import TRACK_PARAMS

F = {name: k for k, name in enumerate(FEATURE_NAMES)}


def _wrap(a):
    return (a + np.pi) % (2 * np.pi) - np.pi


# --- tracks -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tracks():
    return {theme: [generate_track(s, theme) for s in range(4)] for theme in ("lake", "jungle")}


def test_tracks_are_closed_smooth_and_simple(tracks):
    for theme, ts in tracks.items():
        p = TRACK_PARAMS[theme]
        for t in ts:
            gap = np.hypot(*(t.points[0] - t.points[-1]))
            assert abs(gap - t.ds) < 0.01, "the last point must join the first at the usual spacing"
            assert abs(t.ds - 0.5) < 0.01
            assert abs(_wrap(t.headings[0] - t.headings[-1])) < 0.05, "heading continuous across the join"
            assert abs(t.curvature[0] - t.curvature[-1]) < 0.01, "curvature continuous across the join"
            assert np.abs(t.curvature).max() <= 1.02 / p.min_radius, f"{theme}: a bend tighter than the minimum radius"
            assert np.abs(np.diff(t.curvature)).max() < 0.01, "curvature has no jumps"
            assert p.length_range[0] - 1 <= t.length <= p.length_range[1] + 1
            assert not t.self_intersects()
            assert t.min_clearance(exclude_arc=40.0) > t.road_width + 5.0, "stretches of road keep apart"
            # headings agree with the direction to the next point
            d = np.roll(t.points, -1, axis=0) - t.points
            assert np.abs(_wrap(np.arctan2(d[:, 1], d[:, 0]) - t.headings)).max() < 0.05


def test_tracks_are_deterministic_and_differ_by_seed(tracks):
    again = generate_track(2, "jungle")
    assert np.array_equal(again.points, tracks["jungle"][2].points)
    assert np.array_equal(again.curvature, tracks["jungle"][2].curvature)
    lengths = {round(t.length, 3) for ts in tracks.values() for t in ts}
    assert len(lengths) == 8, "every (theme, seed) gives a different track"
    assert not np.allclose(tracks["lake"][0].points[:100], tracks["lake"][1].points[:100])


def test_jungle_is_narrower_and_sharper_than_lake(tracks):
    assert tracks["jungle"][0].road_width < tracks["lake"][0].road_width
    sharp = {theme: np.median([np.abs(t.curvature).max() for t in ts]) for theme, ts in tracks.items()}
    assert sharp["jungle"] > 2 * sharp["lake"]
    # both turn both ways over the seeds (clockwise and counter-clockwise loops)
    for ts in tracks.values():
        turning = {np.sign(np.sum(t.curvature)) for t in ts}
        assert turning == {-1.0, 1.0} or len(ts) < 4


def test_project_matches_brute_force_and_pose_at(tracks):
    t = tracks["jungle"][1]
    rng = np.random.default_rng(0)
    hint = None
    for s in np.linspace(0, t.length, 120, endpoint=False):
        lat = rng.uniform(-4, 4)
        x, y, h = t.pose_at(s)
        px, py = x + lat * math.sin(h), y - lat * math.cos(h)  # `lat` metres to the right
        s2, lat2, idx = t.project(px, py, hint)
        hint = idx
        assert abs(lat2 - lat) < 0.05
        assert abs(_wrap((s2 - s) / t.length * 2 * np.pi)) * t.length / (2 * np.pi) < 0.2
        brute = int(np.argmin(np.hypot(t.points[:, 0] - px, t.points[:, 1] - py)))
        assert min(abs(idx - brute), t.n - abs(idx - brute)) <= 1
        s3, lat3, _ = t.project(px, py)  # no hint: global search, same answer
        assert abs(s3 - s2) < 1e-9 and abs(lat3 - lat2) < 1e-9
    s4, _, _ = t.project(*t.pose_at(100.0)[:2], hint=(hint + t.n // 2))  # a stale hint falls back
    assert abs(s4 - 100.0) < 0.05


# --- vehicle ------------------------------------------------------------------------------------


def test_zero_steer_drives_straight():
    v = Vehicle(9.0)
    v.reset(0.0, 0.0, 0.3, speed=9.0)
    for _ in range(100):
        v.step(0.0)
    st = v.state
    assert abs(st.yaw - 0.3) < 1e-12
    assert abs(math.atan2(st.y, st.x) - 0.3) < 1e-9
    assert abs(math.hypot(st.x, st.y) - 90.0) < 0.5


@pytest.mark.parametrize("steer", [0.4, -0.8])
def test_constant_steer_gives_the_bicycle_circle(steer):
    v = Vehicle(8.0)
    v.reset(0.0, 0.0, 0.0, speed=8.0)
    for _ in range(20):  # let the steering lag settle
        v.step(steer)
    pts = []
    for _ in range(150):
        v.step(steer)
        pts.append((v.state.x, v.state.y))
    pts = np.array(pts)
    # least-squares circle fit: x^2 + y^2 + D x + E y + F = 0
    a = np.column_stack([pts, np.ones(len(pts))])
    d, e, f = np.linalg.lstsq(a, -(pts**2).sum(1), rcond=None)[0]
    radius = math.sqrt(d * d / 4 + e * e / 4 - f)
    expected = 2.5 / math.tan(abs(steer) * math.radians(25))
    assert abs(radius - expected) / expected < 0.02
    yaw0 = v.state.yaw
    v.step(steer)
    assert math.copysign(1, _wrap(v.state.yaw - yaw0)) == -math.copysign(1, steer), "+ steer turns clockwise (right)"
    assert math.copysign(1, v.state.yaw_rate) == math.copysign(1, steer)


def test_pi_controller_reaches_the_target_speed_and_throttle_overrides():
    v = Vehicle(9.0)
    v.reset(0.0, 0.0, 0.0, speed=0.0)
    speeds = []
    for _ in range(150):
        v.step(0.0)
        speeds.append(v.state.speed)
    assert abs(speeds[-1] - 9.0) < 0.05
    assert max(speeds) < 9.0 * 1.1, "little overshoot"
    assert speeds[40] > 8.0, "reaches speed within a few seconds"
    for _ in range(30):
        v.step(0.0, -1.0)  # agent brakes
    assert v.state.speed == 0.0 and v.state.brake == 1.0, "brakes to a stop, never reverses"
    v.step(0.0, 1.0)
    assert v.state.throttle == 1.0 and v.state.speed > 0


# --- camera geometry ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stadium():
    """A stadium-shaped track with 200 m straights: the camera tests need a straight road."""
    r, straight = 60.0, 200.0
    pts = [(x, -r) for x in np.arange(0, straight, 0.5)]
    pts += [(straight + r * math.sin(a), -r * math.cos(a)) for a in np.arange(0, math.pi, 0.5 / r)]
    pts += [(x, r) for x in np.arange(straight, 0, -0.5)]
    pts += [(-r * math.sin(a), r * math.cos(a)) for a in np.arange(0, math.pi, 0.5 / r)]
    track = Track.from_points(np.array(pts), road_width=10.0)
    return track, Renderer(track, "lake", 0)


def _road_mask(frame):
    """Asphalt pixels: grey (channels within 14 of each other), neither dark nor white."""
    f = frame.astype(np.int16)
    spread = f.max(-1) - f.min(-1)
    mean = f.mean(-1)
    return (spread < 14) & (mean > 70) & (mean < 175)


def _road_rows(frame, rows=range(62, 160)):
    """(row, first road column, last road column) for rows whose road lies wholly inside the frame."""
    mask = _road_mask(frame)
    out = []
    for r in rows:
        cols = np.nonzero(mask[r])[0]
        if len(cols) > 5 and cols.min() > 2 and cols.max() < frame.shape[1] - 3:
            out.append((r, cols.min(), cols.max()))
    return np.array(out, dtype=np.float64)


def _road_column(frame):
    """Mean column of the road's middle over the rows 62..91 (far enough that the road fits in the frame)."""
    rr = _road_rows(frame, range(62, 92))
    assert len(rr) > 20
    return float(np.mean(0.5 * (rr[:, 1] + rr[:, 2])))


def test_vanishing_point_lies_on_the_horizon(stadium):
    track, renderer = stadium
    frame = renderer.render((60.0, -60.0, 0.0))  # on the straight, centred, heading along it
    rr = _road_rows(frame)
    assert len(rr) > 25
    rows, widths, centres = rr[:, 0], rr[:, 2] - rr[:, 1], 0.5 * (rr[:, 1] + rr[:, 2])
    slope, icept = np.polyfit(rows, widths, 1)  # a ground strip's width in pixels is linear in the row ...
    vanish_row = -icept / slope  # ... and vanishes on the horizon
    assert abs(vanish_row - CENTER_CAMERA.horizon_row()) < 1.5, (vanish_row, CENTER_CAMERA.horizon_row())
    expected = CENTER_CAMERA.cy - CENTER_CAMERA.f * math.tan(math.radians(CAMERA_PITCH_DEG))
    assert abs(CENTER_CAMERA.horizon_row() - expected) < 1e-9
    assert abs(np.mean(centres) - CENTER_CAMERA.cx) < 2.0, "a centred car sees the road centred"


def test_offsets_and_side_cameras_shift_the_road(stadium):
    _, renderer = stadium
    centred = _road_column(renderer.render((60.0, -60.0, 0.0)))
    right_of_centre = _road_column(renderer.render((60.0, -61.5, 0.0)))  # heading +x: -y is the car's right
    assert right_of_centre < centred - 10, "a car right of the centre sees the road to its left"
    left_cam = _road_column(renderer.render((60.0, -60.0, 0.0), "left"))
    right_cam = _road_column(renderer.render((60.0, -60.0, 0.0), "right"))
    assert left_cam > centred + 5 and right_cam < centred - 5
    assert abs((left_cam - centred) + (right_cam - centred)) < 3, "symmetric rig"


def test_themes_look_different_and_frames_are_plausible(stadium):
    lake = UdacityStyleEnv("lake").reset(seed=5)[0]
    jungle = UdacityStyleEnv("jungle").reset(seed=5)[0]
    assert lake.shape == jungle.shape == (160, 320, 3)
    assert lake.mean() > jungle.mean() + 15, "the jungle is darker"
    horizon = int(CENTER_CAMERA.horizon_row())
    sky = lake[: horizon - 25].reshape(-1, 3).mean(0)
    assert sky[2] > sky[0] + 40, "blue sky on top"
    assert _road_mask(lake[120:]).mean() > 0.3, "the road fills the bottom of the frame"


# --- env ----------------------------------------------------------------------------------------


def test_check_env_passes_directly_and_via_make():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_env(UdacityStyleEnv("lake", cameras=("left", "center", "right")).unwrapped, skip_render_check=True)
        env = gym.make("UdacityStyle-v0", theme="jungle", render_mode="rgb_array")
        check_env(env.unwrapped)
    assert U.ENV_ID in gym.registry
    import importlib

    importlib.reload(U)  # a second import must not register twice (gymnasium would warn)


def test_spaces_obs_and_info_keys():
    env = UdacityStyleEnv("lake", cameras=("center", "left", "right"))
    obs, info = env.reset(seed=3)
    assert env.observation_space.contains(obs) and obs.dtype == np.uint8 and obs.shape == (160, 320, 3)
    assert env.action_space.shape == (1,)
    keys = {"privileged", "speed", "speed_mph", "steering_angle", "steer", "throttle", "brake", "cte", "heading_error",
            "progress", "distance", "laps", "lane_departure", "off_road", "road_half_width", "track_seed", "theme",
            "frame_left", "frame_right"}
    assert keys <= info.keys()
    assert info["frame_left"].shape == (160, 320, 3) and info["frame_left"].dtype == np.uint8
    assert not np.array_equal(info["frame_left"], info["frame_right"])
    assert info["privileged"].shape == (N_FEATURES,) and info["privileged"].dtype == np.float32
    assert len(set(FEATURE_NAMES)) == N_FEATURES
    assert abs(info["speed_mph"] - info["speed"] * 2.23694) < 1e-3
    assert abs(info["cte"]) < 1e-6 and info["progress"] == 0.0 and info["laps"] == 0 and info["track_seed"] == 3
    obs, _, _, _, info = env.step(np.array([0.0], np.float32))
    assert "frame_left" in info and "frame_right" in info
    centre_only = UdacityStyleEnv("jungle")
    _, info = centre_only.reset(seed=3)
    assert "frame_left" not in info and "frame_right" not in info
    assert info["road_half_width"] == 3.5 and info["theme"] == "jungle"
    two = UdacityStyleEnv("lake", throttle_action=True, render=False)
    assert two.action_space.shape == (2,)


def test_same_seed_same_frames_and_info_and_physics_only_matches():
    actions = [np.array([0.4 * math.sin(k / 7.0)], np.float32) for k in range(60)]

    def run(env):
        obs, info = env.reset(seed=11)
        frames, infos = [obs], [{**info, "reward": 0.0}]
        for a in actions:
            obs, r, term, trunc, info = env.step(a)
            frames.append(obs)
            infos.append({**info, "reward": r})
        return frames, infos

    f1, i1 = run(UdacityStyleEnv("jungle"))
    f2, i2 = run(UdacityStyleEnv("jungle"))
    f3, i3 = run(UdacityStyleEnv("jungle", render=False))
    assert all(np.array_equal(a, b) for a, b in zip(f1, f2))
    assert not np.array_equal(f1[0], f1[-1])
    for a, b, c in zip(i1, i2, i3):
        for k in ("cte", "progress", "distance", "heading_error", "speed", "reward"):
            assert a[k] == b[k] == c[k], k
        assert np.array_equal(a["privileged"], c["privileged"])
    assert all(not f.any() for f in f3), "physics-only frames are zeros"
    assert f3[0].shape == (160, 320, 3) and f3[0].dtype == np.uint8


def test_reset_without_seed_and_theme_option():
    env = UdacityStyleEnv("lake", render=False)
    _, info = env.reset(seed=4)
    _, info2 = env.reset()  # next track from the env's RNG: deterministic after a seeded reset
    env_b = UdacityStyleEnv("lake", render=False)
    env_b.reset(seed=4)
    assert env_b.reset()[1]["track_seed"] == info2["track_seed"] != info["track_seed"]
    _, info = env.reset(seed=4, options={"theme": "jungle"})
    assert info["theme"] == "jungle" and info["road_half_width"] == 3.5
    assert env.unwrapped.target_speed == 7.0
    _, info = env.reset(seed=4)
    assert info["theme"] == "lake", "the option lasts one episode"


@pytest.mark.parametrize("theme", ["lake", "jungle"])
def test_stanley_driver_laps_without_lane_departure(theme):
    for seed in (0, 7):
        env = UdacityStyleEnv(theme, render=False, max_laps=1)
        driver = StanleyDriver()
        _, info = env.reset(seed=seed)
        worst, ret, steps = 0.0, 0.0, 0
        while True:
            _, r, term, trunc, info = env.step(driver(info["privileged"]))
            ret += r
            steps += 1
            worst = max(worst, abs(info["cte"]))
            assert not info["lane_departure"], (theme, seed, steps, info["cte"])
            assert np.all(np.abs(info["privileged"]) < 1.6), "features stay roughly in [-1, 1]"
            if term or trunc:
                break
        assert trunc and not term and info["laps"] == 1
        assert worst < 1.0
        assert 0.85 < ret / steps < 1.02, "about 1 reward per step at the target speed"


def test_stanley_driver_with_throttle_action():
    env = UdacityStyleEnv("jungle", render=False, throttle_action=True, max_episode_steps=400)
    driver = StanleyDriver(throttle=True)
    _, info = env.reset(seed=2)
    for _ in range(400):
        _, _, term, trunc, info = env.step(driver(info["privileged"]))
        assert not info["lane_departure"]
        if term or trunc:
            break
    assert abs(info["speed"] - 7.0) < 1.0


def test_signs_of_privileged_features_follow_the_steer_side():
    for steer, sign in ((0.5, 1.0), (-0.5, -1.0)):
        env = UdacityStyleEnv("lake", render=False)
        _, info = env.reset(seed=1)
        for _ in range(8):
            _, _, _, _, info = env.step(np.array([steer], np.float32))
        p = info["privileged"]
        assert sign * info["cte"] > 0 and sign * p[F["cte"]] > 0
        assert sign * info["heading_error"] > 0 and sign * p[F["sin_heading_error"]] > 0
        assert sign * p[F["yaw_rate"]] > 0 and sign * p[F["steer"]] > 0.45
        assert sign * p[F["ahead10m_x"]] < 0, "the road ahead is now on the other side"
        assert sign * info["steering_angle"] > 10


def test_lookahead_points_and_curvature_on_a_bend(tracks):
    env = UdacityStyleEnv("jungle", render=False)
    _, info = env.reset(seed=0)
    track = env.unwrapped.track
    i = int(np.argmax(np.abs(track.curvature)))  # the sharpest bend
    side = np.sign(track.curvature[i])  # + = right-hand
    env.unwrapped.vehicle.place_center(*track.pose_at(i * track.ds - 3.0))  # 3 m before it
    _, info = env.unwrapped.recenter()
    p = info["privileged"]
    assert abs(info["cte"]) < 1e-6
    assert side * p[F["ahead2m_curv"]] > 0.8, "a right-hand bend has + curvature"
    assert side * p[F["ahead7m_x"]] > 0.05, "and the road ahead bends to the right"
    assert abs(p[F["ahead2m_y"]] - 1.0) < 0.05
    assert p[F["ahead40m_x"]] ** 2 + p[F["ahead40m_y"]] ** 2 < 1.0, "a chord is shorter than its arc"


def test_recenter_puts_the_car_back_on_the_centreline():
    env = UdacityStyleEnv("jungle")
    _, info = env.reset(seed=6)
    for _ in range(10):
        _, _, _, _, info = env.step(np.array([0.35], np.float32))
    assert info["cte"] > 1.0
    speed, distance = info["speed"], info["distance"]
    obs, info = env.unwrapped.recenter()
    assert abs(info["cte"]) < 0.05 and abs(info["heading_error"]) < 0.02
    assert info["speed"] == speed and abs(info["distance"] - distance) < 0.1 and info["steering_angle"] == 0.0
    assert obs.shape == (160, 320, 3) and obs.any()
    assert env.unwrapped.n_recenters == 1


def test_off_road_terminates_with_a_penalty_and_max_laps_truncates():
    env = UdacityStyleEnv("jungle", render=False)
    env.reset(seed=1)
    for _ in range(100):
        _, r, term, trunc, info = env.step(np.array([1.0], np.float32))
        if term:
            break
    assert term and info["off_road"] and info["lane_departure"] and r < -5
    env = UdacityStyleEnv("lake", render=False, max_episode_steps=5)
    env.reset(seed=1)
    for k in range(5):
        _, _, term, trunc, _ = env.step(np.zeros(1, np.float32))
    assert trunc and not term


def test_render_views():
    for view in ("hud", "chase"):
        env = UdacityStyleEnv("lake", render_mode="rgb_array", render_view=view)
        env.reset(seed=2)
        env.step(np.array([0.2], np.float32))
        img = env.render()
        assert img.shape == (320, 640, 3) and img.dtype == np.uint8
    with pytest.warns(UserWarning, match="render_mode"):
        assert UdacityStyleEnv("lake").render() is None  # no render_mode: warns, returns None


def test_privileged_observation_wrapper():
    env = UdacityPrivilegedObservation(UdacityStyleEnv("lake", render=False))
    obs, info = env.reset(seed=1)
    assert np.array_equal(obs, info["privileged"]) and env.observation_space.shape == (N_FEATURES,)
    obs, *_ = env.step(np.zeros(1, np.float32))
    assert obs.shape == (N_FEATURES,)
    assert DT == 0.1


def test_bad_inputs_give_clear_errors():
    with pytest.raises(ValueError, match="theme must be one of"):
        UdacityStyleEnv("desert")
    for cams in ("center", ("left",), ("center", "top"), ("center", "center"), ()):
        with pytest.raises(ValueError, match="cameras"):
            UdacityStyleEnv("lake", cameras=cams)
    with pytest.raises(ValueError, match="render_view"):
        UdacityStyleEnv("lake", render_view="bird")
    with pytest.raises(ValueError, match="needs render=True"):
        UdacityStyleEnv("lake", render=False, render_mode="rgb_array")
    env = UdacityStyleEnv("lake", render=False)
    for seed in (-1, 1.5, "3", True):
        with pytest.raises(ValueError, match="seed must be a non-negative int"):
            env.reset(seed=seed)
    with pytest.raises(ValueError, match="theme must be one of"):
        env.reset(seed=1, options={"theme": "moon"})
    env.reset(seed=1)
    with pytest.raises(ValueError, match=r"action must have shape \(1,\)"):
        env.step(np.zeros(2, np.float32))
    with pytest.raises(ValueError, match="finite"):
        env.step(np.array([np.nan], np.float32))
    with pytest.raises(ValueError, match="seed"):
        generate_track(-3, "lake")


def test_wrong_way_when_the_car_points_back_along_the_road():
    """The spec's wrong_way (evaluate.py's wrong-way steps): off while following the road, on when turned round."""
    from envs.udacity.spec import SPEC

    env = UdacityStyleEnv("lake", render=False)
    _, info = env.reset(seed=1)
    _, _, _, _, info = env.step(np.array([0.0], np.float32))
    assert not SPEC.wrong_way(info)
    x, y, heading = env.unwrapped.track.pose_at(40.0)
    env.unwrapped.vehicle.place_center(x, y, heading + np.pi)
    _, _, _, _, info = env.step(np.array([0.0], np.float32))
    assert abs(info["heading_error"]) > 2.5 and SPEC.wrong_way(info)
