"""The hard world (UdacityStyle-v1, --env udacity-hard): tracks with hills and hairpins, the ray-cast camera on
slopes and crests, scenes by seed, speed control, and the errors a user can cause."""

import math

import numpy as np
import pytest

from envs.registry import get_spec
from envs.udacity.camera import CENTER_CAMERA
from envs.udacity.env import CONDITIONS, HARD_FEATURE_NAMES, UdacityStyleEnv
from envs.udacity.scene import HOOD_ROWS, HillsRenderer
from envs.udacity.track import ELEVATION, HARD_TRACK_PARAMS, THEMES, Track, generate_track
from envs.udacity.vehicle import Vehicle

SPEC = get_spec("udacity-hard")


@pytest.mark.parametrize("theme", THEMES)
def test_hard_tracks_have_hills_within_the_grade_limit_and_close_their_lap(theme):
    for seed in range(4):
        t = generate_track(seed, theme, "hard")
        e = ELEVATION[theme]
        assert np.ptp(t.elevation) > 1.0, "a hard track has hills"
        assert np.abs(t.grade).max() <= e.max_grade + 1e-9  # includes the step from the last point to the first
        assert t.elevation[0] == 0.0
        assert 1 / np.abs(t.curvature).max() >= 0.97 * HARD_TRACK_PARAMS[theme].min_radius
        assert not t.self_intersects()


def test_mountain_tracks_have_hairpins_and_hard_tracks_are_not_v0_tracks():
    for seed in range(8):
        assert generate_track(seed, "mountain", "hard").hairpins(turn_deg=150, within_m=60) >= 1
    hard, classic = generate_track(5, "lake", "hard"), generate_track(5, "lake")
    assert hard.n != classic.n or not np.allclose(hard.points, classic.points)
    assert not classic.hilly and hard.hilly


def test_hard_tracks_are_deterministic_by_seed():
    a, b = generate_track(17, "jungle", "hard"), generate_track(17, "jungle", "hard")
    assert np.array_equal(a.points, b.points) and np.array_equal(a.elevation, b.elevation)


def _flat_renderer(height_fn=None) -> HillsRenderer:
    """A renderer on a big flat circle, its heightmap replaced by height_fn(x, y) when given."""
    ang = np.linspace(0, 2 * np.pi, 1200, endpoint=False)
    track = Track.from_points(np.stack([200 * np.cos(ang), 200 * np.sin(ang)], 1), 8.0, theme="lake")
    r = HillsRenderer(track, "lake", 0)
    if height_fn is not None:
        h, w = r.height.shape
        gy, gx = np.mgrid[0:h, 0:w]
        xs = r._lo[0] + (gx + 0.5) * 2.0
        ys = r._lo[1] + (gy + 0.5) * 2.0
        r.height = height_fn(xs, ys).astype(np.float32)
    return r


def test_ray_cast_on_flat_ground_matches_the_pinhole_formula():
    r = _flat_renderer()
    dist, hit, _, _ = r._cast(r.view, 200.0, 0.0, math.pi / 2, CENTER_CAMERA.pitch_deg, CENTER_CAMERA.cam_height)
    exact = CENTER_CAMERA.row_distance(np.arange(CENTER_CAMERA.height))
    near = exact < 150
    assert hit[near].all() and not hit[exact == np.inf].any()
    np.testing.assert_allclose(dist[near], exact[near], rtol=0.02)


def test_a_camera_pitched_with_a_uniform_slope_sees_it_as_flat_ground():
    g = 0.1
    r = _flat_renderer(lambda x, y: g * x)  # uphill towards +x
    pitch = CENTER_CAMERA.pitch_deg - math.degrees(math.atan(g))
    dist, hit, _, _ = r._cast(r.view, 0.0, 0.0, 0.0, pitch, CENTER_CAMERA.cam_height)
    # the camera is 1.5 m above the slope vertically, 1.5 cos(th) m from it perpendicularly (th = atan g), and the
    # foot of that perpendicular lies 1.5 sin(th) cos(th) m ahead horizontally: rows see a flat ground at that
    # height, measured along the slope from the foot
    cam = CENTER_CAMERA
    flat_rows = np.arange(cam.height)
    ang = np.arctan((flat_rows - cam.cy) / cam.f) + math.radians(cam.pitch_deg)
    along = np.where(ang > 0, 1.5 * math.cos(math.atan(g)) / np.tan(np.maximum(ang, 1e-9)), np.inf)
    th = math.atan(g)
    expected = along * math.cos(th) + 1.5 * math.sin(th) * math.cos(th)
    near = expected < 60
    np.testing.assert_allclose(dist[near], expected[near], rtol=0.01)


def test_uphill_pitch_moves_the_horizon_down_and_a_crest_hides_the_road_behind_it():
    r = _flat_renderer()
    first_ground = []
    for grade in (0.0, 0.1):
        pitch = CENTER_CAMERA.pitch_deg - math.degrees(math.atan(grade))
        _, hit, _, _ = r._cast(r.view, 200.0, 0.0, math.pi / 2, pitch, 1.5)
        first_ground.append(int(np.argmax(hit)))
    assert first_ground[1] > first_ground[0] + 10
    # a crest 20 m ahead, a dip (down 6 m at 15 %) and up again: the rows just above the crest's line see the far
    # slope (about 67 m away) and the dip behind the crest is hidden: a jump in distance between adjacent rows
    crest = _flat_renderer(lambda x, y: np.where(x < 20, 0.0, np.where(x < 60, -(x - 20) * 0.15, -6 + (x - 60) * 0.15)))
    dist, hit, _, _ = crest._cast(crest.view, 0.0, 0.0, 0.0, CENTER_CAMERA.pitch_deg, 1.5)
    d = dist[hit]
    assert np.max(d[:-1] - d[1:]) > 20.0, "the road beyond the crest is hidden: a jump in distance between rows"


def test_scenes_by_seed_cover_every_theme_and_condition_once_per_cycle():
    env = SPEC.make(render=False, max_episode_steps=5)
    seen = set()
    for seed in range(12):
        _, info = env.reset(seed=seed)
        seen.add((info["theme"], info["condition"]))
    assert seen == {(t, c) for t in THEMES for c in CONDITIONS}
    env = SPEC.make(render=False, themes="mountain", conditions=("fog",))
    assert {env.reset(seed=s)[1]["theme"] for s in range(4)} == {"mountain"}


def test_frames_are_deterministic_by_seed_and_conditions_change_the_look():
    def frames(condition, seed=3):
        env = UdacityStyleEnv("jungle", world="hard", throttle_action=True)
        obs, _ = env.reset(seed=seed, options={"condition": condition})
        out = [obs]
        for _ in range(3):
            obs, *_ = env.step(np.array([0.05, 0.3], np.float32))
            out.append(obs)
        return np.stack(out)

    a, b = frames("clear"), frames("clear")
    assert np.array_equal(a, b)
    assert np.abs(frames("dusk").astype(int) - a).mean() > 10
    # the hood: the bottom centre rows are the same in every frame
    assert np.array_equal(a[0, -4:, 150:170], a[-1, -4:, 150:170])
    assert a[0, -HOOD_ROWS:, 160].std(axis=0).max() < 40


def test_hard_world_features_speed_control_and_gravity():
    env = UdacityStyleEnv("mountain", world="hard", throttle_action=True, render=False)
    _, info = env.reset(seed=2)
    assert info["privileged"].shape == (len(HARD_FEATURE_NAMES),)
    assert env.action_space.shape == (2,)
    speed0 = info["speed"]
    for _ in range(10):
        _, _, _, _, info = env.step(np.array([0.0, -1.0], np.float32))
    assert info["speed"] < speed0 - 5 and info["brake"] == 1.0
    flat, up = Vehicle(8.0), Vehicle(8.0)
    for v in (flat, up):
        v.reset(0, 0, 0, speed=8.0)
    for _ in range(10):
        flat.step(0.0, 0.0)
        up.step(0.0, 0.0, grade=0.12)
    assert up.state.speed < flat.state.speed - 0.9 * 9.81 * 0.12 * 1.0 * 0.9


def test_recovery_starts_place_the_car_off_centre_turned_and_slow_and_the_teacher_recovers():
    from envs.udacity.env import START_OPTIONS, recovery_start

    env = get_spec("udacity-hard").make_expert_env(max_episode_steps=120, themes="jungle", conditions="clear")
    teacher = SPEC.teacher()
    _, usual = env.reset(seed=7)
    start = {"start_offset": 0.5, "start_turn": -0.25, "start_speed_ratio": 0.0}
    obs, info = env.reset(seed=7, options=start)
    assert info["speed"] == 0.0 and info["cte"] == pytest.approx(0.5 * info["road_half_width"], abs=0.05)
    # road minus car
    assert info["heading_error"] == pytest.approx(usual["heading_error"] - start["start_turn"], abs=0.02)
    for _ in range(120):
        obs, _, term, _, info = env.step(teacher.ppo_action(obs, "continuous"))
        assert not term
    assert abs(info["cte"]) < 0.5 and info["speed"] > 8.0  # back near the centre line and up to speed
    for bad in ({"start_offset": 1.5}, {"start_speed_ratio": -0.1}, {"start_turn": "left"}, {"start_lap": 0.3}):
        with pytest.raises(ValueError, match="reset option"):
            env.reset(seed=7, options=bad)
    rng = np.random.default_rng(0)
    for _ in range(50):  # every drawn start is a valid reset option inside its range
        for name, v in recovery_start(rng).items():
            assert START_OPTIONS[name][0] <= v <= START_OPTIONS[name][1]
    assert SPEC.recovery_start is recovery_start and get_spec("udacity").recovery_start is recovery_start


@pytest.mark.parametrize("theme", THEMES)
def test_the_privileged_teacher_drives_every_theme_and_slows_for_bends(theme):
    env = get_spec("udacity-hard").make_expert_env(max_episode_steps=400, themes=theme, conditions="clear")
    teacher = SPEC.teacher()
    obs, info = env.reset(seed=90_001)
    speeds, curv = [], []
    for _ in range(400):
        obs, _, term, trunc, info = env.step(teacher.ppo_action(obs, "continuous"))
        assert not term
        speeds.append(info["speed"])
        curv.append(abs(obs[HARD_FEATURE_NAMES.index("ahead7m_curv")]))
    speeds, curv = np.array(speeds), np.array(curv)
    assert info["distance"] > 400 * 0.1 * 5
    if curv.max() > 0.8:  # a bend tighter than 15 m: the teacher is slower there than on the straights
        assert speeds[curv > 0.8].mean() < speeds[curv < 0.2].mean()


def test_bad_scene_names_and_world_options_are_clear_errors():
    with pytest.raises(ValueError, match="lake"):
        SPEC.check_scene("theme", "lake,desert")
    with pytest.raises(ValueError, match="fog"):
        SPEC.make(render=False, conditions="rain")
    with pytest.raises(ValueError, match="no theme"):
        get_spec("carracing").check_scene("theme", "lake")
    with pytest.raises(ValueError, match="mountain is held out.*--allow-held-out"):
        SPEC.scene("lake,mountain", collect=True)
    assert SPEC.scene(collect=True) == {"themes": ("lake", "jungle"), "conditions": ("clear", "overcast", "dusk")}
    assert SPEC.scene("mountain", "fog", collect=True, allow_held_out=True)["themes"] == ("mountain",)
    assert SPEC.scene()["themes"] == THEMES
    with pytest.raises(ValueError, match="world"):
        UdacityStyleEnv(world="medium")
    env = UdacityStyleEnv(render=False)
    with pytest.raises(ValueError, match="condition"):
        env.reset(seed=0, options={"condition": "fog"})  # the classic world has one look
