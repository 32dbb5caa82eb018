"""Reprojection of a recorded camera frame to a nearby pose of the car: the view synthesis of the replay.

The model (NVIDIA's PilotNet simulator, in this project's terms): the car moved sideways by ``offset`` metres
(+ = right of the recorded path) and turned by ``yaw`` radians (+ = clockwise, to the right). Every pixel of the
new view is looked up in the recorded frame:

* below the horizon the world is a flat ground plane: the new pixel's ray meets the ground, and that ground point
  is projected into the recorded camera (one plane homography, ``cv2.warpPerspective``);
* above the horizon everything is at infinity: only the rotation matters (the homography ``K R0 R1^T K^-1``);
* the car's hood (rows from ``hood_row`` down) moves with the camera, so it is copied unwarped;
* a pixel whose source lies outside the recorded frame (it entered the view from the side) takes the nearest
  recorded pixel (``BORDER_REPLICATE``); the hood rows of the source are never sampled for the road.

The horizon row is the same in both views (the pitch does not change: a yaw about the vertical axis keeps the
vanishing line of the ground). Hills break the flat-ground assumption: near ground is placed right, far ground on
a slope is placed as if it were flat (docs/results.md measures what that costs).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import cv2
import numpy as np

from envs.udacity.camera import CameraModel


@dataclass(frozen=True)
class CameraGeometry:
    """The recorded camera: pinhole intrinsics, mounting, side cameras, hood, and the car's steering geometry."""

    width: int = 320
    height: int = 160
    cam_height_m: float = 1.5  # above the road
    pitch_deg: float = 6.0  # down
    hfov_deg: float = 65.0  # horizontal field of view (square pixels, principal point at the centre)
    side_offset_m: float = 1.0  # the left / right cameras sit this far left / right of the center one
    hood_row: int = 160  # rows from here down show the car's hood (160: no hood)
    wheelbase_m: float = 2.5
    max_steer_deg: float = 25.0  # wheel angle of a steering command of 1
    steer_tau_s: float = 0.0  # first-order lag of the wheel behind the command (0: none)
    distance_scale: float = 1.0  # metres the view moves per metre of recorded speed x time (measured on recordings)
    source: str = ""  # where the numbers come from

    def model(self) -> CameraModel:
        return CameraModel(self.width, self.height, self.cam_height_m, self.pitch_deg, self.hfov_deg)

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


class Reprojector:
    """Warps frames of one camera to lateral offsets and yaws (see the module docstring)."""

    def __init__(self, geometry: CameraGeometry) -> None:
        self.geometry = geometry
        cam = geometry.model()
        self.cam = cam
        self.size = (geometry.width, geometry.height)
        self.horizon = min(max(int(math.ceil(cam.horizon_row())), 0), geometry.height)
        self.hood = min(max(geometry.hood_row, self.horizon), geometry.height)
        self._g0 = cam.ground_to_image(0.0, 0.0, 0.0)
        self._k = cam.intrinsics()
        self._k_inv = np.linalg.inv(self._k)
        self._r0 = cam.extrinsics(0.0, 0.0, 0.0)[:, :3]

    def homographies(self, offset: float, yaw: float, forward: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
        """(ground, sky): 3x3 maps from a pixel of the new view to the recorded frame's pixel. ``forward``: metres
        ahead of the recorded pose (used to measure the forward scale on consecutive frames)."""
        x, y, heading = forward, -offset, -yaw  # the camera model's world: x ahead, y left, yaw counter-clockwise
        ground = self._g0 @ np.linalg.inv(self.cam.ground_to_image(x, y, heading))
        r1 = self.cam.extrinsics(x, y, heading)[:, :3]
        sky = self._k @ self._r0 @ r1.T @ self._k_inv
        return ground, sky

    def warp(self, frame: np.ndarray, offset: float, yaw: float, forward: float = 0.0) -> np.ndarray:
        """``frame`` (H, W, 3 uint8) as seen from the car moved ``offset`` m right and turned ``yaw`` rad right."""
        if offset == 0.0 and yaw == 0.0 and forward == 0.0:
            return frame
        ground, sky = self.homographies(offset, yaw, forward)
        out = np.empty_like(frame)
        w, hz, hood = self.size[0], self.horizon, self.hood
        src = frame[:hood]  # the hood is never sampled as road
        flags = cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP
        if hz > 0:
            out[:hz] = cv2.warpPerspective(src, sky, (w, hz), flags=flags, borderMode=cv2.BORDER_REPLICATE)
        if hood > hz:
            shift = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, hz], [0.0, 0.0, 1.0]])  # output row r is frame row hz + r
            out[hz:hood] = cv2.warpPerspective(src, ground @ shift, (w, hood - hz), flags=flags,
                                               borderMode=cv2.BORDER_REPLICATE)
        out[hood:] = frame[hood:]
        return out
