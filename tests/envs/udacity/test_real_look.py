"""UdacityStyle-v2 (--env udacity-real): the hard world drawn with the real simulator's camera and look, a variant
per track seed; v1's scenes untouched; the two-lane layout keeps the driven line in the right lane."""
import math

import numpy as np
import pytest

from envs.registry import get_spec
from envs.udacity.camera import CENTER_CAMERA
from envs.udacity.env import UdacityStyleEnv
from envs.udacity.real_look import REAL_CAMERA_PITCH_DEG, real_camera, real_look
from envs.udacity.scene import HillsRenderer
from envs.udacity.track import generate_track

SPEC = get_spec("udacity-real")


def _frames(seed: int, theme: str = "lake", steps: int = 3) -> np.ndarray:
    env = SPEC.make("continuous", themes=theme, conditions="clear")
    obs, _ = env.reset(seed=seed)
    out = [obs]
    for _ in range(steps):
        obs, *_ = env.step(np.array([0.0, 0.3], np.float32))
        out.append(obs)
    return np.stack(out)


def test_the_real_look_is_deterministic_by_seed_and_differs_between_seeds():
    a, b = _frames(5), _frames(5)
    assert np.array_equal(a, b)
    assert np.abs(_frames(6).astype(int) - a).mean() > 5
    assert SPEC.gym_id == "UdacityStyle-v2" and SPEC.default_crop == (60, 135)


def test_the_camera_is_drawn_around_the_real_simulators_and_its_rays_match_its_pinhole_model():
    track = generate_track(11, "lake", "hard")
    cams = [real_look(track, "lake", seed)[1] for seed in range(30)]
    assert all(1.05 <= c.cam_height <= 1.35 and 7.5 <= c.pitch_deg <= 11.5 for c in cams)
    assert real_camera().pitch_deg == REAL_CAMERA_PITCH_DEG
    assert math.isclose(2 * math.degrees(math.atan(80 / real_camera().f)), 60.0, rel_tol=1e-9)
    assert len({c.hfov_deg for c in cams}) == 30  # every seed its own field of view
    r = HillsRenderer(track, "lake", 3, look="real")
    r.height[:] = 0.0  # flat ground: the ray cast must agree with the camera's own pinhole formula
    cam = r.camera
    dist, hit, _, _ = r._cast(r.view, 0.0, 0.0, 0.0, cam.pitch_deg, cam.cam_height)
    exact = cam.row_distance(np.arange(cam.height))
    near = exact < 150
    assert hit[near].all()
    np.testing.assert_allclose(dist[near], exact[near], rtol=0.02)


def test_v1_keeps_its_own_camera_and_palette():
    track = generate_track(11, "jungle", "hard")
    sim = HillsRenderer(track, "jungle", 3)
    assert sim.camera == CENTER_CAMERA and sim.palette.road_shift == 0.0 and sim.palette.edge_line_px == 2


def _texture_at(r: HillsRenderer, points: np.ndarray) -> np.ndarray:
    uv = points @ r.to_tex[:2, :2].T + r.to_tex[:2, 2]
    px = np.round(uv).astype(int)
    return r.mips[0][px[:, 1], px[:, 0], :3].astype(int)


def test_a_two_lane_road_puts_the_driven_line_in_its_right_lane():
    track = generate_track(21, "jungle", "hard")
    hw = track.half_width

    def contrasting_two_lanes(seed: int) -> bool:
        pal = real_look(track, "jungle", seed)[0]
        return pal.road_shift < 0 and np.abs(np.subtract(pal.road, pal.verge)).sum() > 90

    seed = next(s for s in range(200) if contrasting_two_lanes(s))
    r = HillsRenderer(track, "jungle", seed, look="real")
    assert r.palette.road_shift == pytest.approx(-hw / 2)
    straight = np.flatnonzero(np.abs(track.curvature) < 1 / 200)[::40]  # away from kerbs
    road, verge = np.asarray(r.palette.road, int), np.asarray(r.palette.verge, int)

    def looks_like_road(lateral: float) -> bool:
        colours = _texture_at(r, track.offset_points(lateral)[straight])
        return np.median(np.abs(colours - road).sum(1)) < np.median(np.abs(colours - verge).sum(1))

    # the driven line and the left lane are asphalt; just beyond the right edge (hw / 2 from the line) is verge
    assert looks_like_road(0.0) and looks_like_road(-hw) and looks_like_road(-1.4 * hw)
    assert not looks_like_road(hw / 2 + 0.15)


def test_bad_looks_are_clear_errors():
    with pytest.raises(ValueError, match="look must be one of"):
        UdacityStyleEnv("lake", world="hard", look="photo")
    with pytest.raises(ValueError, match="needs world='hard'"):
        UdacityStyleEnv("lake", look="real")


def test_collect_records_the_real_look_with_the_hard_worlds_expert(tmp_path):
    import json

    import collect
    from driving_data.dataset import CARD_NAME, open_dataset

    out = tmp_path / "real"
    assert collect.main(["--env", "udacity-real", "--episodes", "1", "--max-steps", "12", "--workers", "1",
                         "--seed", "3000002", "--out", str(out), "--no-progress"]) == 0
    ds = open_dataset(out)
    assert json.loads((out / CARD_NAME).read_text())["env"] == "udacity-real"
    frames = ds.load(0, "frames")["frames"]
    assert frames.shape == (12, 160, 320, 3) and frames.std() > 10
    env = SPEC.make("continuous", render=False)
    env.reset(seed=3000002)
    assert env.unwrapped.vehicle.wheelbase == pytest.approx(2.87)
