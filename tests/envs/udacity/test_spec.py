"""UdacityStyle-v0 is frozen: the shipped Udacity expert and student were trained on its tracks and frames.

The harder world (UdacityStyle-v1, `--env udacity-hard`) is built beside it; these tests pin v0's track geometry,
camera frames (center and left) and privileged features for two tracks against reference arrays stored beside this
file (v0_reference.npz), so no change made for v1 can move them.

They compare within tolerances, not bit for bit: the same code on another CPU or library build (numpy's SIMD loops,
OpenBLAS's, OpenCV's and libm's kernels) rounds its floats differently, and a frame can then differ from the
reference by a grey level here and there (the sha256 pins these tests replaced failed on an AVX-512 Xeon and on an
AMD EPYC). The tolerances are far below what a real change moves: the last tests show that a one-pixel shift of the
road or a 1 % change of one feature fails, and that +-1 grey level of noise on every pixel passes.

If a comparison fails after a deliberate v0 change, the shipped udacity checkpoints must be re-made, and the
references re-pinned (about 5 s; the file is about 50 KB):

    .venv/bin/python -m tests.envs.udacity.test_spec
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from envs.udacity.spec import make
from envs.udacity.track import generate_track

REFERENCE = Path(__file__).with_name("v0_reference.npz")
SEEDS = {1000: "lake", 1001: "jungle"}
STEPS = 20  # steps driven per track, steering 0.3 sin(k / 3)
PINNED_STEPS = (0, 19)  # steps whose center and left frames are stored (as 4x4 block means); every step's features
TRACK_STRIDE = 5  # every 5th track point is stored

# Frames are compared as means of BLOCK x BLOCK pixels, rounded to grey levels. +-1 grey level on any share of
# the pixels moves a rounded block mean by at most 2, so only a block that moves by more counts as changed; a
# frame may have up to CHANGED_BLOCKS of its blocks changed (a few isolated pixels rasterised on the other side
# of an edge). A one-pixel shift of the road changes 2-6 % of a frame's blocks (test below).
BLOCK = 4
BLOCK_TOL = 2
CHANGED_BLOCKS = 0.005
MEAN_TOL = 1.0  # grey levels: each channel's mean over every frame of every step (+-1 noise moves it by <= 1)
FEATURE_RTOL, FEATURE_ATOL = 1e-4, 1e-6  # float32 features: round-off is ~1e-7 relative, a real change >= 1e-3
POINT_ATOL, CURVATURE_ATOL = 1e-6, 1e-9  # metres, 1/m (float64 geometry; points up to ~150 m, curvature < 0.05)


def blocks(frames: np.ndarray) -> np.ndarray:
    """uint8 frames [..., H, W, 3] -> their BLOCK x BLOCK means rounded to grey levels, uint8 [..., H/4, W/4, 3]."""
    *lead, h, w, c = frames.shape
    means = frames.reshape(*lead, h // BLOCK, BLOCK, w // BLOCK, BLOCK, c).mean((-4, -2))
    return np.round(means).astype(np.uint8)


def frame_mismatch(got: np.ndarray, ref: np.ndarray) -> str | None:
    """None where the block means ``got`` and ``ref`` [..., h, w, 3] agree frame by frame within the tolerance,
    else which frames do not."""
    changed = np.abs(got.astype(np.int16) - ref.astype(np.int16)) > BLOCK_TOL
    share = changed.reshape(*changed.shape[:-3], -1).mean(-1)
    bad = np.argwhere(share > CHANGED_BLOCKS)
    if not len(bad):
        return None
    return (f"{len(bad)} frame(s) with more than {CHANGED_BLOCKS:.1%} of their {BLOCK}x{BLOCK} blocks "
            f"{BLOCK_TOL}+ grey levels away, e.g. frame {tuple(bad[0])}: {share[tuple(bad[0])]:.2%}")


def render() -> dict[str, np.ndarray]:
    """Drive v0 on both tracks: full-size pinned frames (``frames``, [seed, step, camera, H, W, 3]), the per-channel
    means of every frame (``frame_means``, [seed, step, camera, 3]) and the features (``features``, [seed, step, F])."""
    env = make(side_cameras=True, max_episode_steps=50)
    frames, means, features, themes = [], [], [], []
    try:
        for seed in SEEDS:
            obs, info = env.reset(seed=seed)
            f, m, p = [], [], []
            for k in range(STEPS):
                both = np.stack([obs, info["frame_left"]])
                if k in PINNED_STEPS:
                    f.append(both)
                m.append(both.reshape(2, -1, 3).mean(1))
                p.append(np.asarray(info["privileged"], np.float32))
                obs, _, _, _, info = env.step(np.array([0.3 * np.sin(k / 3)], np.float32))
            frames.append(f), means.append(m), features.append(p), themes.append(info["theme"])
    finally:
        env.close()
    return {"frames": np.array(frames), "frame_means": np.array(means, np.float32),
            "features": np.array(features), "themes": np.array(themes)}


def reference_arrays(rendered: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """What v0_reference.npz holds: the pinned frames as block means, the frame means, the features, and every
    TRACK_STRIDE-th point and curvature of both tracks with their number of points."""
    out = {"blocks": blocks(rendered["frames"]), **{k: rendered[k] for k in ("frame_means", "features", "themes")}}
    for seed, theme in SEEDS.items():
        track = generate_track(seed, theme)
        out[f"track_{seed}_n"] = np.array(len(track.points))
        out[f"track_{seed}_points"] = track.points[::TRACK_STRIDE]
        out[f"track_{seed}_curvature"] = track.curvature[::TRACK_STRIDE]
    return out


@pytest.fixture(scope="module")
def rendered():
    return render()


@pytest.fixture(scope="module")
def ref():
    with np.load(REFERENCE) as f:
        return dict(f)


@pytest.mark.parametrize("seed", list(SEEDS))
def test_v0_tracks_are_unchanged(seed, ref):
    track = generate_track(seed, SEEDS[seed])
    assert len(track.points) == ref[f"track_{seed}_n"]
    np.testing.assert_allclose(track.points[::TRACK_STRIDE], ref[f"track_{seed}_points"], rtol=0, atol=POINT_ATOL)
    np.testing.assert_allclose(track.curvature[::TRACK_STRIDE], ref[f"track_{seed}_curvature"], rtol=0,
                               atol=CURVATURE_ATOL)


def test_v0_frames_and_features_are_unchanged(rendered, ref):
    assert rendered["themes"].tolist() == ref["themes"].tolist() == list(SEEDS.values())
    assert (problem := frame_mismatch(blocks(rendered["frames"]), ref["blocks"])) is None, problem
    np.testing.assert_allclose(rendered["frame_means"], ref["frame_means"], rtol=0, atol=MEAN_TOL)
    np.testing.assert_allclose(rendered["features"], ref["features"], rtol=FEATURE_RTOL, atol=FEATURE_ATOL)


# ---- the tolerances: loose enough for round-off, tight enough for a real change ------------------------------------

def test_grey_level_noise_and_a_few_flipped_pixels_pass(rendered, ref):
    rng = np.random.default_rng(0)
    frames = rendered["frames"].astype(np.int16)
    for share in (0.02, 1.0):  # +-1 on 2 % of the pixels, on all of them
        noise = rng.choice(np.int16([-1, 1]), frames.shape) * (rng.random(frames.shape) < share)
        noisy = np.clip(frames + noise, 0, 255).astype(np.uint8)
        assert frame_mismatch(blocks(noisy), ref["blocks"]) is None, share
        np.testing.assert_allclose(noisy.reshape(*noisy.shape[:3], -1, 3).mean(3),
                                   rendered["frame_means"][:, list(PINNED_STEPS)], rtol=0, atol=MEAN_TOL)
    flipped = rendered["frames"].copy()  # 10 pixels per frame drawn in another colour altogether
    h, w = flipped.shape[-3:-1]
    for idx in np.ndindex(flipped.shape[:3]):
        flipped[idx][rng.integers(0, h, 10), rng.integers(0, w, 10)] = rng.integers(0, 256, (10, 3))
    assert frame_mismatch(blocks(flipped), ref["blocks"]) is None
    features = rendered["features"]
    ulp = np.nextafter(features, np.where(rng.random(features.shape) < 0.5, np.inf, -np.inf).astype(np.float32))
    np.testing.assert_allclose(ulp, ref["features"], rtol=FEATURE_RTOL, atol=FEATURE_ATOL)


def test_a_one_pixel_shift_of_the_road_fails_in_every_frame(rendered, ref):
    frames = rendered["frames"]
    road = frames.shape[-3] // 2  # the lower half of a frame is road and verge (the horizon is above it)
    right, left, down = frames.copy(), frames.copy(), frames.copy()
    right[..., road:, 1:, :] = frames[..., road:, :-1, :]
    left[..., road:, :-1, :] = frames[..., road:, 1:, :]
    down[..., 1:, :, :] = frames[..., :-1, :, :]
    for shifted in (right, left, down):
        for idx in np.ndindex(frames.shape[:3]):  # each frame alone
            assert frame_mismatch(blocks(shifted[idx]), ref["blocks"][idx]) is not None, idx


def test_a_one_percent_change_of_any_feature_fails(rendered, ref):
    features = rendered["features"]
    for seed in range(features.shape[0]):
        for j in range(features.shape[-1]):
            changed = features.copy()
            changed[seed, :, j] *= 1.01
            with pytest.raises(AssertionError):
                np.testing.assert_allclose(changed, ref["features"], rtol=FEATURE_RTOL, atol=FEATURE_ATOL)


def test_a_track_moved_by_a_millimetre_fails(ref):
    track = generate_track(1000, SEEDS[1000])
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(track.points[::TRACK_STRIDE] + 1e-3, ref["track_1000_points"], rtol=0,
                                   atol=POINT_ATOL)


if __name__ == "__main__":  # re-pin after a deliberate v0 change (see the module docstring)
    arrays = reference_arrays(render())
    np.savez_compressed(REFERENCE, **arrays)
    print(f"wrote {REFERENCE} ({REFERENCE.stat().st_size / 1024:.0f} KB)")
