"""Udacity-style first-person lane-keeping simulator: procedural tracks, kinematic car, homography cameras.

    import envs.udacity  # registers "UdacityStyle-v0"
    env = gymnasium.make("UdacityStyle-v0", theme="jungle", cameras=("left", "center", "right"))

Modules: track.py (closed tracks from a seed), vehicle.py (kinematic bicycle, DT = 0.1 s),
camera.py (320x160 frames by one perspective warp of a top-down texture), env.py (the gymnasium
env, privileged features, reward), teacher.py (StanleyDriver, the privileged reference driver).
`python -m benchmarks.udacity_sim` measures steps/s.
"""

import gymnasium as gym

from .camera import (
    CAMERA_HEIGHT_M,
    CAMERA_HFOV_DEG,
    CAMERA_PITCH_DEG,
    CAMERAS,
    FRAME_H,
    FRAME_W,
    SIDE_CAMERA_OFFSET_M,
    CameraModel,
    Renderer,
)
from .env import (
    FEATURE_NAMES,
    LOOKAHEAD_M,
    N_FEATURES,
    TARGET_SPEED,
    UdacityPrivilegedObservation,
    UdacityStyleEnv,
)
from .real_look import REAL_WHEELBASE_M
from .teacher import StanleyDriver
from .track import THEMES, Track, generate_track
from .vehicle import DT, MAX_STEER_DEG, WHEELBASE_M, Vehicle

ENV_ID = "UdacityStyle-v0"

HARD_ENV_ID = "UdacityStyle-v1"  # the hard world (hard_spec.py): hills, hairpins, mountain theme, throttle
REAL_LOOK_ENV_ID = "UdacityStyle-v2"  # the hard world drawn as the real simulator shows its roads (real_spec.py)

if ENV_ID not in gym.registry:  # importing twice (or reloading) must not register twice
    gym.register(id=ENV_ID, entry_point="envs.udacity.env:UdacityStyleEnv")
if HARD_ENV_ID not in gym.registry:
    gym.register(id=HARD_ENV_ID, entry_point="envs.udacity.env:UdacityStyleEnv",
                 kwargs={"world": "hard", "throttle_action": True})
if REAL_LOOK_ENV_ID not in gym.registry:
    gym.register(id=REAL_LOOK_ENV_ID, entry_point="envs.udacity.env:UdacityStyleEnv",
                 kwargs={"world": "hard", "throttle_action": True, "look": "real", "wheelbase_m": REAL_WHEELBASE_M})

__all__ = [
    "CAMERAS", "CAMERA_HEIGHT_M", "HARD_ENV_ID", "REAL_LOOK_ENV_ID", "CAMERA_HFOV_DEG", "CAMERA_PITCH_DEG", "DT",
    "ENV_ID", "FEATURE_NAMES", "FRAME_H",
    "FRAME_W", "LOOKAHEAD_M", "MAX_STEER_DEG", "N_FEATURES", "SIDE_CAMERA_OFFSET_M", "TARGET_SPEED", "THEMES",
    "WHEELBASE_M", "CameraModel", "Renderer", "StanleyDriver", "Track", "UdacityPrivilegedObservation",
    "UdacityStyleEnv", "Vehicle", "generate_track",
]
