"""UdacityStyle-v0 is frozen: the shipped Udacity expert and student were trained on its tracks and frames.

The harder world (UdacityStyle-v1, `--env udacity-hard`) is built beside it; these hashes pin v0's track
geometry, camera frames (center and left) and privileged features for two tracks, so no change made for v1
can move them. If one fails after a deliberate v0 change, the shipped udacity checkpoints must be re-made.
"""
import hashlib

import numpy as np
import pytest

from envs.udacity.spec import make
from envs.udacity.track import generate_track


def _h(data: bytes | np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(data).tobytes()).hexdigest()[:16]


@pytest.mark.parametrize("seed,theme,points,curvature", [
    (1000, "lake", "c0c55e5abdfd3f40", "acf8989a4a1091b2"),
    (1001, "jungle", "08105af7c536f3a2", "75063f31d3f16f00"),
])
def test_v0_tracks_are_unchanged(seed, theme, points, curvature):
    track = generate_track(seed, theme)
    assert (_h(np.round(track.points, 9)), _h(np.round(track.curvature, 9))) == (points, curvature)


def test_v0_frames_and_features_are_unchanged():
    env = make(side_cameras=True, max_episode_steps=50)
    got = []
    for seed in (1000, 1001):
        obs, info = env.reset(seed=seed)
        frames, feats = hashlib.sha256(), hashlib.sha256()
        for k in range(20):
            frames.update(obs.tobytes())
            frames.update(info["frame_left"].tobytes())
            feats.update(np.round(info["privileged"].astype(np.float64), 5).tobytes())
            obs, _, _, _, info = env.step(np.array([0.3 * np.sin(k / 3)], np.float32))
        got.append((seed, info["theme"], frames.hexdigest()[:16], feats.hexdigest()[:16]))
    env.close()
    assert got == [(1000, "lake", "b5d8e87a8402de96", "528bd9f84c2f9da7"),
                   (1001, "jungle", "56feabe55c9a78a1", "bd61cd16029e6ffa")]
