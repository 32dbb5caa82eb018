"""Recovery views (PilotNet's): training segments seen from the car moved off the recorded path, labelled
with the steering that brings it back.

A person's recording (or an expert's) only shows the car on its own line, so a student never learns what
to do off it. ``--recovery-views P`` takes a share P of the training segments; each draws one pose (an
offset uniform in +-``--recovery-offset`` m, + = right of the recorded path, and a yaw uniform in
+-``--recovery-yaw`` degrees, + = pointing right) that holds for the whole segment, like the other
one-draw-per-segment augmentations. Every frame of the segment is reprojected to that pose with the replay's
view synthesis (``envs.replay.camera.Reprojector``: flat ground below the horizon, rotation above, hood
rows copied), and the steering label of every window is replaced by the replay's path controller
(``envs.replay.vehicle.PathController``: the recorded steering plus pure pursuit back onto the path) at that
pose, the label's own steering and the frame's recorded speed. Other label columns (throttle) stay.

The trainer holds frames already cropped and resized (``policies.frames.prepare_frames``), so the warp runs
in that space: crop + resize is an affine map ``A`` of pixel coordinates, and the full frame's homography
``H`` (new-view pixel -> recorded pixel) becomes ``A H A^-1`` on prepared frames, exact up to interpolation.
Rows of the prepared frame above the horizon take the rotation, rows on the hood are copied.

A side camera (left or right, at -/+ ``side_offset_m``) is already a view from off the path: it is
reprojected from its own pose, so its label is the controller's at offset ``d -/+ side_offset_m`` (in place
of the fixed ``--side-correction``). A mirror (``--flip``) comes after the reprojection and negates the new
label, as it negates any other.
"""
from __future__ import annotations

import math
from typing import Any

import cv2
import numpy as np
import torch

from envs.replay.camera import CameraGeometry, Reprojector
from envs.replay.vehicle import PathController, PathVehicle

MAX_OFFSET_M = 3.0  # --recovery-offset above this is refused: the flat-ground view synthesis breaks down
MAX_YAW_DEG = 30.0  # --recovery-yaw above this is refused (the replay intervenes at 30 degrees)


def dataset_geometry(dataset: Any, env: Any, crop: list[int] | None) -> CameraGeometry:
    """The one camera geometry of a training dataset for --recovery-views (the replay's, ``envs.replay.spec``);
    ValueError (one line) for a dataset that is not first-person, mixes geometries, or whose frames or crop
    do not fit it."""
    from driving_data.dataset import is_recording
    from envs.replay.spec import GEOMETRIES, REAL_UDACITY

    if not env.first_person:
        raise ValueError(f"--recovery-views reprojects a car-mounted camera: it needs a first-person dataset "
                         f"(udacity, udacity-hard or a real simulator recording), not {env.name}")
    kinds = {"a real recording" if is_recording(m) else env.gym_id for m in dataset.episodes}
    if len(kinds) > 1:
        raise ValueError(f"--recovery-views needs one camera geometry; the data mixes {', '.join(sorted(kinds))} "
                         f"(train them apart, or drop --recovery-views)")
    kind = kinds.pop()
    geometry = REAL_UDACITY if kind == "a real recording" else GEOMETRIES.get(kind)
    if geometry is None:
        raise ValueError(f"--recovery-views knows no camera geometry for {env.name} ({kind})")
    shape = tuple(dataset.array_shape(0, "frames")[1:3])
    if shape != (geometry.height, geometry.width):
        raise ValueError(f"--recovery-views: frames are {shape[0]}x{shape[1]}, the camera model is "
                         f"{geometry.height}x{geometry.width}")
    if crop is not None and crop[1] > geometry.height:
        raise ValueError(f"--recovery-views: --crop {crop[0]}:{crop[1]} runs past the frame's {geometry.height} rows")
    return geometry


class RecoveryViews:
    """The warp of prepared frames and the labels of one dataset's camera (see the module docstring)."""

    def __init__(self, geometry: CameraGeometry, crop: list[int] | None, image_size: list[int],
                 fraction: float, max_offset_m: float, max_yaw_deg: float, return_s: float = 1.0) -> None:
        self.geometry = geometry
        self.fraction, self.max_offset, self.max_yaw = float(fraction), float(max_offset_m), math.radians(max_yaw_deg)
        self.reprojector = Reprojector(geometry)
        self.controller = PathController(PathVehicle.of(geometry), lookahead_s=return_s)
        top, bottom = crop if crop is not None else (0, geometry.height)
        h, w = int(image_size[0]), int(image_size[1])
        self.size = (w, h)
        sx, sy = w / geometry.width, h / (bottom - top)
        # full-frame pixel -> prepared pixel (pixel centres at integers, as cv2.resize and warpPerspective use)
        self.affine = np.array([[sx, 0.0, 0.5 * sx - 0.5], [0.0, sy, (0.5 - top) * sy - 0.5], [0.0, 0.0, 1.0]])
        self.affine_inv = np.linalg.inv(self.affine)
        # prepared rows [0, horizon) show the sky, [horizon, hood) the ground, [hood, h) the hood
        self.horizon = min(max(round((self.reprojector.horizon - top) * sy), 0), h)
        self.hood = min(max(round((self.reprojector.hood - top) * sy), self.horizon), h)
        self.side_offset = {"center": 0.0, "left": -geometry.side_offset_m, "right": geometry.side_offset_m}

    def homographies(self, offset: float, yaw: float) -> tuple[np.ndarray, np.ndarray]:
        """(ground, sky): 3x3 maps from a prepared pixel of the new view to the prepared recorded frame."""
        ground, sky = self.reprojector.homographies(offset, yaw)
        return self.affine @ ground @ self.affine_inv, self.affine @ sky @ self.affine_inv

    def warp(self, frame: np.ndarray, offset: float, yaw: float) -> np.ndarray:
        """A prepared uint8 frame ``[h, w, 3]`` seen from ``offset`` m right and ``yaw`` rad right of its pose."""
        ground, sky = self.homographies(offset, yaw)
        w, hz, hood = self.size[0], self.horizon, self.hood
        out = np.empty_like(frame)
        src = np.ascontiguousarray(frame[:hood])  # the hood is never sampled as road
        flags = cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP
        if hz > 0:
            out[:hz] = cv2.warpPerspective(src, sky, (w, hz), flags=flags, borderMode=cv2.BORDER_REPLICATE)
        if hood > hz:
            shift = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, hz], [0.0, 0.0, 1.0]])  # output row r is row hz + r
            out[hz:hood] = cv2.warpPerspective(src, ground @ shift, (w, hood - hz), flags=flags,
                                               borderMode=cv2.BORDER_REPLICATE)
        out[hood:] = frame[hood:]
        return out

    def label(self, offset: float, yaw: float, steer: np.ndarray, speed: np.ndarray) -> np.ndarray:
        """The controller's steering at the pose, per step, from the steps' labels and recorded speeds (m/s)."""
        return np.array([self.controller.steer(offset, yaw, float(s), float(v)) for s, v in zip(steer, speed)],
                        dtype=np.float32)

    def draw(self, n_segments: int) -> list[tuple[float, float] | None]:
        """Per segment: its pose (offset m, yaw rad), or None for a segment left as recorded (torch's generator)."""
        r = torch.rand(n_segments, 3).tolist()
        return [((2 * u - 1) * self.max_offset, (2 * v - 1) * self.max_yaw) if p < self.fraction else None
                for p, u, v in r]

    def apply_(self, frames: np.ndarray, target: np.ndarray, segments: list[tuple[int, int, int]],
               slices: list[tuple[int, int]], speeds: list[np.ndarray], cameras: list[str] | None = None
               ) -> list[bool]:
        """Reproject the frames of the drawn segments (``frames[s:e]`` of each slice, in place) and set column 0
        of their windows' targets (``target``: one row per step of the segments, in order) to the controller's
        steering. Returns, per segment, whether it was reprojected."""
        done = []
        row = 0
        for k, (pose, (e, a, b), (s, f)) in enumerate(zip(self.draw(len(segments)), segments, slices)):
            if pose is not None:
                d, yaw = pose
                for i in range(s, f):
                    frames[i] = self.warp(frames[i], d, yaw)
                at = d + self.side_offset["center" if cameras is None else cameras[k]]
                target[row: row + b - a, 0] = self.label(at, yaw, target[row: row + b - a, 0], speeds[e][a:b])
            done.append(pose is not None)
            row += b - a
        return done
