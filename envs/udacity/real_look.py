"""UdacityStyle-v2's look: the hard world's roads drawn the way the real (Unity) simulator shows its own, with
every episode drawing its own variant, so that a student trained here has to steer by the road and not by one
palette.

Why: students trained on v0 / v1 frames steer frames of the real simulator no better than always-straight
(docs/results.md, "simulator to real"). Side by side the two differ in what a student steers by: the real
camera sits 1.2 m up, pitched 9.4 degrees down, with a 60-degree vertical field of view (v0 / v1: 1.5 m, 6
degrees, 65 degrees horizontal); the real lake road is gravelly grey asphalt with yellow edge lines and
red-white kerbs beside sand, dirt or dry grass; the real jungle road has two lanes with a white dashed centre
line, driven in the right lane.

What is drawn per episode (from the track seed, so a seed always gives the same scene):
* the camera: height 1.05-1.35 m, pitch 7.5-11.5 degrees, vertical field of view 54-66 degrees;
* the asphalt: grey 85-155 with a small tint, coarse grain; edge lines yellow or white, 1-3 texture pixels wide;
  kerbs in the bends or none;
* the road's layout: jungle roads are two-lane roads (three in four episodes) whose right lane is the driven line
  (the drawn road is shifted left by half a lane, a dashed white or yellow line between the lanes); lake and
  mountain roads are one wide lane, now and then with a yellow dashed centre line;
* the verges and ground: sand, dirt, dry or green grass, concrete, in any mix; trees, rocks, sky jittered.
The tracks, the privileged features and the expert are the hard world's (v1's); the car has the real simulator's
wheelbase (REAL_WHEELBASE_M).
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from .camera import FRAME_H, FRAME_W, PALETTES, CameraModel, Palette
from .track import THEMES, Track

REAL_CAMERA_HEIGHT_M = 1.2  # the real simulator's camera mount (its public source)
REAL_CAMERA_PITCH_DEG = 9.4
REAL_CAMERA_VFOV_DEG = 60.0
REAL_WHEELBASE_M = 2.87  # the real simulator's car: v2's car too, so that its steering labels mean what a
#                          recording's do (the same bend takes 15 % more steering than on v1's 2.5 m car)

_YELLOW, _WHITE = (226, 196, 64), (228, 228, 222)
_VERGES = {"sand": (196, 178, 130), "dirt": (126, 104, 74), "dry grass": (168, 156, 96),
           "green grass": (92, 124, 60), "concrete": (156, 156, 150), "gravel": (138, 128, 112)}
_GROUNDS = {"green": (84, 124, 52), "dry": (160, 148, 88), "brown": (120, 100, 70), "dark green": (48, 82, 36),
            "yellow grass": (186, 170, 96)}


def hfov_from_vfov(vfov_deg: float, width: int = FRAME_W, height: int = FRAME_H) -> float:
    f = (height / 2) / math.tan(math.radians(vfov_deg) / 2)
    return math.degrees(2 * math.atan((width / 2) / f))


def real_camera(rng: np.random.Generator | None = None) -> CameraModel:
    """The real simulator's camera, or (with `rng`) a draw around it."""
    if rng is None:
        return CameraModel(FRAME_W, FRAME_H, REAL_CAMERA_HEIGHT_M, REAL_CAMERA_PITCH_DEG,
                           hfov_from_vfov(REAL_CAMERA_VFOV_DEG))
    return CameraModel(FRAME_W, FRAME_H, float(rng.uniform(1.05, 1.35)), float(rng.uniform(7.5, 11.5)),
                       hfov_from_vfov(float(rng.uniform(54.0, 66.0))))


def _jitter(colour, rng: np.random.Generator, amount: float = 14.0) -> tuple[int, int, int]:
    v = np.asarray(colour, np.float64) + rng.uniform(-amount, amount, 3)
    r, g, b = (int(x) for x in np.clip(v, 0, 255))
    return r, g, b


def _pick(table: dict, rng: np.random.Generator):
    return table[list(table)[int(rng.integers(len(table)))]]


def real_palette(track: Track, theme: str, rng: np.random.Generator) -> Palette:
    """One episode's look (see the module docstring) as the hard world's palette of `theme`, redrawn."""
    base = PALETTES[theme]
    grey = rng.uniform(85.0, 155.0)
    r, g, b = (int(x) for x in np.clip(grey + rng.uniform(-8.0, 8.0, 3), 0, 255))
    road = (r, g, b)
    edge = _jitter(_YELLOW if rng.random() < 0.6 else _WHITE, rng, 10.0)
    two_lanes = theme == "jungle" and rng.random() < 0.75
    centre: tuple[int, int, int] | None
    if two_lanes:
        centre = _jitter(_WHITE if rng.random() < 0.7 else _YELLOW, rng, 10.0)
    else:
        centre = _jitter(_YELLOW, rng, 10.0) if rng.random() < 0.15 else None
    kerb = _jitter((204, 48, 42), rng, 12.0) if rng.random() < 0.6 else None
    ground = _jitter(_pick(_GROUNDS, rng), rng, 16.0)
    return replace(
        base,
        ground=ground, ground2=_jitter(_pick(_GROUNDS, rng), rng, 16.0), verge=_jitter(_pick(_VERGES, rng), rng, 14.0),
        road=road, edge_line=edge, centre_line=centre, kerb=kerb,
        tree=_jitter(base.tree, rng, 20.0), tree2=_jitter(base.tree2, rng, 20.0), rock=_jitter(base.rock, rng, 24.0),
        shore=_jitter(base.shore, rng), sky_top=_jitter((90, 145, 215), rng, 25.0),
        sky_horizon=_jitter((196, 212, 228), rng, 18.0), fog=_jitter(base.fog, rng), far=_jitter(base.far, rng, 20.0),
        fog_distance=base.fog_distance * float(rng.uniform(1.0, 2.0)), verge_width=float(rng.uniform(0.3, 2.5)),
        noise=float(rng.uniform(0.18, 0.45)), edge_line_px=int(rng.integers(1, 4)),
        road_shift=-0.5 * track.half_width if two_lanes else 0.0,
    )


def real_look(track: Track, theme: str, seed: int) -> tuple[Palette, CameraModel]:
    """The palette and camera of episode `seed` on `track` (its own generator: the scene's other draws, and
    therefore v1's scenes, are untouched)."""
    rng = np.random.default_rng([int(seed), THEMES.index(theme), 8])
    return real_palette(track, theme, rng), real_camera(rng)
