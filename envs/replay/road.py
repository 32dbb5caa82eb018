"""Where the recorded driver was on the road: the lateral offset of the road's (lane's) middle from the driver's
car, measured on each recorded center frame from the painted lines and road boundaries it shows.

Why: the replay counts an intervention when the car is more than ``max_offset`` from the DRIVER'S line, because a
recording has no map; NVIDIA counts one when the car leaves the LANE'S centre by more than 1 m. A driver who
keeps to one side makes a student that keeps the middle look like it drifts. With the middle measured here, the
replay lets the car be near the driver's line or near the middle (``ReplayEnv(reference="driver-or-middle")``).

How, per frame (a few ms):

* marking pixels by colour (HSV): yellow lines (more saturated than the ground on both sides: a faded line
  passes, a yellowish verge of sand or dry grass does not), red kerb stripes, white lines and kerb stripes (low
  saturation, brighter than the road around them in the same row), and the near-black walls of the lake track's bridge;
* every image row between ``near_m`` and ``far_m`` ahead is a line of constant distance on the flat ground of the
  replay's camera model (envs/replay/camera.py: a camera pitched down, no roll), so a pixel's column gives its
  lateral position in metres; each horizontal run of marking pixels gives one ground point, at its edge nearest
  the car;
* the boundaries are taken to be parallel curves ``y = a + b x + c x^2`` (x ahead, y right of the camera, metres):
  a vote over (b, c) picks the shape that gathers the points best, then the intercepts ``a`` of the points form
  peaks, one per line; the nearest peak on each side of the car (enough rows, spread along the road) is that
  side's boundary. Middle = the mean of the two intercepts (at the camera, x = 0), width = their difference;
  a frame with one side missing or an implausible width gets NaN (the one side found is kept);
* over the frames of a stretch (``one_sided``): a frame where one boundary alone was found gets its middle from
  that boundary and the stretch's median width, where the boundary continues the one seen in the last frame that
  found both (within 0.75 m, 3 s before at most).

On the two-lane jungle track, driven in its right lane, the nearest line on the left is the dashed centre line:
the "middle" is the lane's middle. Over time (``smooth_middle``): a running median, interpolation over short
gaps, and the driver's own line (middle 0) where nothing is known for longer.

``python -m benchmarks.road_middle REC [REC ...]`` validates the estimate on recordings (coverage, the side cameras'
known offsets, the width along the track): docs/udacity.md says what it showed.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Sequence

import cv2
import numpy as np

from driving_data.dataset import open_dataset
from envs.replay.camera import CameraGeometry
from envs.replay.options import REFERENCES


@dataclass(frozen=True)
class RoadReading:
    """One frame's measurement, ``at_m`` ahead of the camera (metres, + right); NaN where it cannot tell. A side's
    fit is its boundary ``y = a + b (x - at_m) + c (x - at_m)^2`` as (a, b, c), None where none was found."""

    middle_m: float
    width_m: float
    left_fit: tuple[float, float, float] | None = None
    right_fit: tuple[float, float, float] | None = None

    @property
    def left_m(self) -> float:
        return self.left_fit[0] if self.left_fit else math.nan

    @property
    def right_m(self) -> float:
        return self.right_fit[0] if self.right_fit else math.nan


RIDGE_GAP_M = 0.35  # a white line's ridge test looks this far beside it (a line is up to ~0.3 m wide)
RIDGE_SIDE_PX = 5  # over this many pixels on each side
WIDTH_TOLERANCE = 0.15  # a frame's width this far (a fraction) off the stretch's median took a wrong line
MEASURED_SIDE_M = 0.72  # the side cameras' offset the photometric fit finds (0.70-0.75 m; the source says 0.81)
MIN_PEAK_SHARE = 0.3  # a boundary gathers at least this share of the points of its side's strongest line
NO_READING = RoadReading(math.nan, math.nan)
UNMEASURED = 0.0  # smooth_middle's middle where nothing was measured: the driver's own line


class RoadEstimator:
    """Measures the road's middle on frames of one camera geometry (see the module docstring)."""

    def __init__(self, geometry: CameraGeometry, *, near_m: float = 2.2, far_m: float = 10.0,
                 max_lateral_m: float = 7.0, min_width_m: float = 2.5, max_width_m: float = 12.0,
                 min_rows: int = 5, min_span_m: float = 1.0, at_m: float = 3.0) -> None:
        self.geometry = geometry
        cam = geometry.model()
        rows = np.arange(geometry.height)
        dist = cam.row_distance(rows)
        hood = min(geometry.hood_row, geometry.height) - 2  # the hood's edge reflects the scene: keep off it
        self.rows = rows[(dist >= near_m) & (dist <= far_m) & (rows < hood)]
        if len(self.rows) < min_rows:
            raise ValueError(f"the camera sees no ground between {near_m} and {far_m} m ahead above the hood")
        inv = np.linalg.inv(cam.ground_to_image(0.0, 0.0, 0.0))
        left = inv @ np.stack([np.zeros(len(self.rows)), self.rows, np.ones(len(self.rows))])
        right = inv @ np.stack([np.full(len(self.rows), cam.width - 1.0), self.rows, np.ones(len(self.rows))])
        left, right = left[:2] / left[2], right[:2] / right[2]
        self.row_x = left[0]  # metres ahead of every band row
        self.row_y0 = -left[1]  # lateral (+ right) of column 0
        self.row_dy = (-right[1] - self.row_y0) / (cam.width - 1.0)  # metres per column
        self.band_rows = self.rows - self.rows[0]  # the rows of the band cut from a frame (rows[0]..rows[-1])
        self.ridge_gap = np.clip(np.round(RIDGE_GAP_M / self.row_dy), 3, 24).astype(int)
        self.max_lateral = max_lateral_m
        self.min_width, self.max_width = min_width_m, max_width_m
        self.min_rows, self.min_span = min_rows, min_span_m
        self.at = at_m
        self.bin_m = 0.1
        self.n_bins = int(round(2 * (max_lateral_m + 3.0) / self.bin_m))
        b, c = np.meshgrid(np.arange(-0.5, 0.5001, 0.025), np.arange(-0.04, 0.04001, 0.01), indexing="ij")
        self.shapes = np.stack([b.ravel(), c.ravel()], axis=1)  # (heading slope, curvature term) candidates

    # -- pixels -> ground points --------------------------------------------------------------------------------
    def marking_mask(self, frame: np.ndarray) -> np.ndarray:
        """Marking pixels of the band rows (bool [rows, W]): see the module docstring for the colours."""
        band = np.ascontiguousarray(frame[self.rows[0]: self.rows[-1] + 1])
        hsv = cv2.cvtColor(band, cv2.COLOR_RGB2HSV)
        h, s, v = (hsv[..., i] for i in range(3))
        # a yellow line is more saturated than what lies on BOTH sides of it (a faded line on grey asphalt too),
        # where a yellowish verge of sand or dry grass is a plain, not a ridge
        soft_s = cv2.medianBlur(s, 3).astype(np.int16)
        hue = (h >= 15) & (h <= 35)
        yellow = hue & (((s >= 85) & (v >= 90)) | ((soft_s >= 45) & (v >= 60) & (soft_s - self._beside(soft_s) >= 20)))
        red = ((h <= 8) | (h >= 170)) & (s >= 100) & (v >= 80)
        soft = cv2.medianBlur(v, 3).astype(np.int16)  # asphalt's bright specks are dots; lines are long
        # a white line is a ridge: brighter than the road on BOTH sides (a shadow's lit edge is brighter on one only)
        white = (s <= 50) & (soft - self._beside(soft) >= 35) & (soft >= 120)
        wall = band.max(axis=2) <= 12
        mask = yellow | red | white | wall
        return mask[self.band_rows]

    def _beside(self, channel: np.ndarray) -> np.ndarray:
        """Per pixel, the larger of the channel's means just left and just right of it, a line's width away (wide
        near the car, a few pixels far ahead): a ridge is above both."""
        side = cv2.blur(channel, (RIDGE_SIDE_PX, 1), borderType=cv2.BORDER_REPLICATE)
        beside = np.empty_like(channel)
        for gap in np.unique(self.ridge_gap):
            rows = self.band_rows[self.ridge_gap == gap]
            shift = int(gap) + RIDGE_SIDE_PX // 2
            beside[rows] = np.maximum(np.pad(side[rows], ((0, 0), (shift, 0)), mode="edge")[:, :-shift],
                                      np.pad(side[rows], ((0, 0), (0, shift)), mode="edge")[:, shift:])
        return beside

    def ground_points(self, frame: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(x ahead, y right, band row index) of every run of >= 2 marking pixels, at its edge nearest the car."""
        mask = self.marking_mask(frame)
        pad = np.zeros((mask.shape[0], 1), bool)
        edges = np.diff(np.concatenate([pad, mask, pad], axis=1).astype(np.int8), axis=1)
        r0, u0 = np.nonzero(edges == 1)
        r1, u1 = np.nonzero(edges == -1)  # same order: row-major, runs alternate start/end
        long_enough = (u1 - u0) >= 2
        r, u0, u1 = r0[long_enough], u0[long_enough], u1[long_enough] - 1
        y0 = self.row_y0[r] + self.row_dy[r] * u0
        y1 = self.row_y0[r] + self.row_dy[r] * u1
        keep = (y1 < 0) | (y0 > 0)  # a run across the car's own column is no boundary
        y = np.where(y1 < 0, y1, y0)[keep]
        r = r[keep]
        near = np.abs(y) <= self.max_lateral
        return self.row_x[r][near], y[near], r[near]

    # -- ground points -> boundaries ----------------------------------------------------------------------------
    def measure(self, frame: np.ndarray) -> RoadReading:
        x, y, r = self.ground_points(frame)
        if len(x) < 2 * self.min_rows:
            return NO_READING
        u = x - self.at
        a = y[None, :] - self.shapes[:, :1] * u[None, :] - self.shapes[:, 1:] * (u * u)[None, :]
        bins = np.clip(((a + self.max_lateral + 3.0) / self.bin_m).astype(np.int64), 0, self.n_bins - 1)
        counts = np.bincount((bins + self.n_bins * np.arange(len(self.shapes))[:, None]).ravel(),
                             minlength=len(self.shapes) * self.n_bins).reshape(len(self.shapes), self.n_bins)
        counts = counts[:, :-2] + counts[:, 1:-1] + counts[:, 2:]  # a line straddles bins
        best = int(np.argmax((counts.astype(np.float64) ** 2).sum(axis=1)))
        centres = (np.arange(counts.shape[1]) + 1.5) * self.bin_m - self.max_lateral - 3.0  # bin k spans 3
        left = self._nearest_line(a[best], x, r, counts[best], centres, side=-1)
        right = self._nearest_line(a[best], x, r, counts[best], centres, side=1)
        if left is None and right is None:
            return NO_READING
        if left is None or right is None:  # one boundary: its fit alone (one_sided() may place the middle from it)
            side = left if left is not None else right
            assert side is not None  # not both None: returned above
            (a0, b0, c0), *_ = np.linalg.lstsq(np.stack([np.ones(int(side.sum())), u[side], u[side] ** 2], 1),
                                                y[side], rcond=None)
            fit = (float(a0), float(b0), float(c0))
            return RoadReading(math.nan, math.nan, fit if left is not None else None,
                               fit if right is not None else None)
        right &= ~left
        # both lines' points, one least-squares fit of two parallel curves: the vote's shape refined
        ones, zeros = np.ones(len(u)), np.zeros(len(u))
        design = np.stack([np.where(left, ones, zeros), np.where(right, ones, zeros), u, u * u], 1)[left | right]
        (a_left, a_right, b, c), *_ = np.linalg.lstsq(design, y[left | right], rcond=None)
        fits = (float(a_left), float(b), float(c)), (float(a_right), float(b), float(c))
        width = float(a_right - a_left)
        if not (a_left < 0 < a_right and self.min_width <= width <= self.max_width):
            return RoadReading(math.nan, width, *fits)
        return RoadReading(0.5 * float(a_left + a_right), width, *fits)

    def _nearest_line(self, a: np.ndarray, x: np.ndarray, r: np.ndarray, hist: np.ndarray, centres: np.ndarray,
                      side: int) -> np.ndarray | None:
        """The points of the nearest peak of ``hist`` on one side that is a line: points on enough rows, spread
        along the road, and at least ``MIN_PEAK_SHARE`` of that side's strongest peak; None if none."""
        peaks = np.flatnonzero((hist >= self.min_rows) & (hist >= np.roll(hist, 1)) & (hist >= np.roll(hist, -1)))
        peaks = peaks[side * centres[peaks] > 0]
        if len(peaks) == 0:
            return None
        peaks = peaks[hist[peaks] >= MIN_PEAK_SHARE * hist[peaks].max()]
        for k in peaks[np.argsort(side * centres[peaks])]:
            near = np.abs(a - centres[k]) <= 0.2
            if len(np.unique(r[near])) >= self.min_rows and np.ptp(x[near]) >= self.min_span:
                return near
        return None


def plausible(readings: np.ndarray, tolerance: float = WIDTH_TOLERANCE) -> np.ndarray:
    """``readings`` ([T, 4]: middle, width, left, right) with the middle set to NaN where the width is more than
    ``tolerance`` (a fraction) off the median width of the stretch: a road keeps its width, so a frame whose width
    is off took a wrong line (a verge, a kerb's far edge, a texture) on one side."""
    out = np.array(readings, np.float64)
    known = np.isfinite(out[:, 0])
    if known.any():
        typical = float(np.median(out[known, 1]))
        out[known & (np.abs(out[:, 1] / typical - 1.0) > tolerance), 0] = np.nan
    return out


def one_sided(readings: np.ndarray, max_jump: float = 0.75, memory: int = 30) -> np.ndarray:
    """``readings`` (after ``plausible``) with a middle for the frames where one boundary alone was found: that
    boundary plus (left) or minus (right) half the median width of the stretch's frames where both were (a road
    keeps its width). Only where that boundary is within ``max_jump`` m of where the same side's boundary was in the
    last frame that found both, at most ``memory`` frames before: a lone line is taken for the boundary it
    continues, not for another line (a lane's far edge, a wall) that a missing one leaves nearest."""
    out = np.array(readings, np.float64)
    both = np.isfinite(out[:, 0])
    if not both.any():
        return out
    half = 0.5 * float(np.median(out[both, 1]))
    t = np.arange(len(out))
    last = np.maximum.accumulate(np.where(both, t, -10 ** 9))  # the last frame with both boundaries, at or before t
    recent = (t - last) <= memory
    for col, sign in ((2, 1.0), (3, -1.0)):  # left boundary: middle = left + half; right: middle = right - half
        other = 5 - col
        lone = ~both & np.isfinite(out[:, col]) & ~np.isfinite(out[:, other]) & recent
        before = out[np.clip(last, 0, None), col]
        ok = lone & (np.abs(out[:, col] - before) <= max_jump)
        out[ok, 0] = out[ok, col] + sign * half
    return out


def smooth_middle(middle: np.ndarray, window: int = 5, max_gap: int = 10) -> np.ndarray:
    """A time series of middles (NaN: unknown) made usable: a running median over ``window`` frames of the known
    values, linear interpolation over gaps of up to ``max_gap`` frames, ``UNMEASURED`` (the driver's own line)
    elsewhere."""
    m = np.asarray(middle, np.float64)
    out = np.full(len(m), UNMEASURED)
    known = np.flatnonzero(np.isfinite(m))
    if len(known) == 0:
        return out
    half = window // 2
    med = np.array([np.nanmedian(m[max(k - half, 0): k + half + 1]) for k in known])
    t = np.arange(len(m))
    filled = np.interp(t, known, med)
    # a frame is bridged when the known frames before and after it are at most max_gap + 1 apart
    prev = np.maximum.accumulate(np.where(np.isfinite(m), t, -10 ** 9))
    nxt = np.minimum.accumulate(np.where(np.isfinite(m), t, 10 ** 9)[::-1])[::-1]
    bridged = (nxt - prev) <= max_gap + 1
    out[bridged] = filled[bridged]
    return out


def measure_frames(estimator: RoadEstimator, frames: Any, rows: Sequence[int]) -> np.ndarray:
    """[len(rows), 4] readings (middle, width, left, right) of ``frames.decode`` (driving_data.frames.JpegFrames)
    or an array of frames, at ``rows``."""
    out = np.full((len(rows), 4), np.nan)
    for j, t in enumerate(rows):
        frame = frames.decode([t])[0] if hasattr(frames, "decode") else np.asarray(frames[t])
        reading = estimator.measure(frame)
        out[j] = (reading.middle_m, reading.width_m, reading.left_m, reading.right_m)
    return out


def frames_of(dataset: Any, episode: int, key: str) -> Any:
    """One camera's frames of a dataset episode, decoded on demand where they are stored as JPEG."""
    frames = dataset.jpeg_frames(episode, key)
    return frames if frames is not None else dataset.load(episode, keys=key)[key]


def check_reference(reference: str) -> str:
    """ReplayEnv's ``reference``, one of REFERENCES (evaluate.py's --replay-reference is checked where it is parsed)."""
    if reference not in REFERENCES:
        raise ValueError(f"the replay's reference must be one of {', '.join(REFERENCES)}, got {reference!r}")
    return reference


@functools.lru_cache(maxsize=32)
def _cached_middle(root: str, episode: int, start: int, stop: int, geometry: CameraGeometry) -> np.ndarray:
    return episode_middle(open_dataset(root), episode, geometry, slice(start, stop))


def part_middle(dataset: Any, episode: int, rows: slice, geometry: CameraGeometry) -> np.ndarray:
    """``episode_middle``, measured once per process for a dataset folder (every student replayed on the same
    part sees the same middle; a part of 1,000 frames takes a few seconds)."""
    root = getattr(dataset, "root", None)
    if root is None:
        return episode_middle(dataset, episode, geometry, rows)
    return _cached_middle(str(root), episode, rows.start, rows.stop, geometry).copy()


def episode_middle(dataset: Any, episode: int, geometry: CameraGeometry, rows: slice,
                   estimator: RoadEstimator | None = None) -> np.ndarray:
    """The middle (m, + right of the driver) the replay uses at each center frame of ``rows`` of a dataset
    episode: measured, the implausible widths dropped, smoothed and filled (``smooth_middle``)."""
    est = estimator or RoadEstimator(geometry)
    readings = measure_frames(est, frames_of(dataset, episode, "frames"), range(rows.start, rows.stop))
    return smooth_middle(one_sided(plausible(readings))[:, 0])
