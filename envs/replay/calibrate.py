"""Measure a recording's camera geometry instead of assuming it: what the replay's figures rest on.

    python -m envs.replay.calibrate RECORDING [--pairs 120] [--frames 60]

Three checks, each a search over poses that minimises the photometric error (mean absolute difference of the
ground rows below the horizon and above the hood, central columns) between a reprojected frame and a recorded one:

* side cameras: the center frame reprojected sideways against the recorded left / right frames. The best offset
  pins the ratio of the side cameras' offset to the camera height (a flat ground looks the same for d / h); the
  error of the reprojection at the assumed offset is reported beside the unwarped center frame's;
* yaw gain: consecutive center frames, the second reprojected from the first moved ahead by speed x dt and
  turned by a searched yaw; the slope of the found yaw on the yaw the recorded steering predicts (speed x dt x
  tan(steer x max angle) / wheelbase) is the gain of the vehicle model (1: wheelbase and steering range agree);
* forward scale: the found forward distance over speed x dt x the geometry's distance scale (1: the camera
  height, the speed and the distance scale agree).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from common.cli import option, run_command
from envs.replay.camera import CameraGeometry, Reprojector

COLUMNS = slice(40, 280)  # central columns: the sides fill in from outside the recorded frame


@dataclass
class SideFit:
    camera: str
    frames: int
    unwarped: float  # mean photometric error, center frame as it is
    assumed: float  # center reprojected to the assumed side offset
    best: float  # at the best offset
    best_offset_m: float  # signed (+ right), at the assumed camera height


def _error(a: np.ndarray, b: np.ndarray, rows: slice) -> float:
    return float(np.mean(np.abs(a[rows, COLUMNS].astype(np.float32) - b[rows, COLUMNS].astype(np.float32))))


def fit_side(rp: Reprojector, centers: Sequence[np.ndarray], sides: Sequence[np.ndarray], camera: str,
             offsets: np.ndarray) -> SideFit:
    """The offset (m, + right) that best turns the center frames into the side camera's (summed over frames)."""
    rows = slice(rp.horizon + 4, rp.hood)
    sign = -1.0 if camera == "left" else 1.0
    assumed = sign * rp.geometry.side_offset_m
    totals = np.zeros(len(offsets))
    unwarped = at_assumed = 0.0
    for c, s in zip(centers, sides):
        totals += [_error(rp.warp(c, float(o), 0.0), s, rows) for o in offsets]
        unwarped += _error(c, s, rows)
        at_assumed += _error(rp.warp(c, assumed, 0.0), s, rows)
    n = max(len(centers), 1)
    k = int(np.argmin(totals))
    return SideFit(camera, len(centers), unwarped / n, at_assumed / n, float(totals[k]) / n, float(offsets[k]))


def fit_pair(rp: Reprojector, first: np.ndarray, second: np.ndarray, forward: float, yaws: np.ndarray,
             scales: np.ndarray) -> tuple[float, float, float]:
    """(yaw rad + right, forward scale, error) that best turn `first` into `second` (the car moved `forward` m)."""
    rows = slice(rp.horizon + 4, rp.hood)
    errs = [_error(rp.warp(first, 0.0, float(y), forward), second, slice(0, rp.hood)) for y in yaws]
    yaw = float(yaws[int(np.argmin(errs))])
    errs2 = [_error(rp.warp(first, 0.0, yaw, forward * float(s)), second, rows) for s in scales]
    k = int(np.argmin(errs2))
    return yaw, float(scales[k]), float(errs2[k])


def calibrate(dataset: Any, geometry: CameraGeometry, *, frames: int = 60, pairs: int = 120,
              min_speed: float = 3.0) -> dict[str, Any]:
    """The three checks of the module docstring on an open dataset (driving_data.dataset.DemoDataset)."""
    rp = Reprojector(geometry)
    picks = _rows(dataset, frames, min_speed)
    out: dict[str, Any] = {"geometry": geometry.to_dict(), "frames": len(picks)}
    names = set(dataset.array_names(0))
    if {"frames_left", "frames_right"} <= names and picks:
        offsets = np.round(np.arange(-2.5, 2.501, 0.05), 3)
        centers, lefts, rights = [], [], []
        for i, t in picks:
            centers.append(_frame(dataset, i, "frames", t))
            lefts.append(_frame(dataset, i, "frames_left", t))
            rights.append(_frame(dataset, i, "frames_right", t))
        out["side"] = [fit_side(rp, centers, lefts, "left", offsets[offsets <= 0]).__dict__,
                       fit_side(rp, centers, rights, "right", offsets[offsets >= 0]).__dict__]
    measured, predicted, scales = [], [], []
    yaws, grid = np.arange(-0.12, 0.1201, 0.0025), np.arange(0.0, 2.501, 0.1)
    arrays: dict[int, dict[str, np.ndarray]] = {}
    for i, t in _rows(dataset, pairs, min_speed, pair=True):
        a = arrays.setdefault(i, dataset.load(i, keys=["action", "speed", "time"]))
        dt, v = float(a["time"][t + 1] - a["time"][t]), float(a["speed"][t])
        if not 0 < dt < 0.3:
            continue
        steer = float(np.asarray(a["action"]).reshape(len(a["time"]), -1)[t, 0])
        ds = v * dt * geometry.distance_scale
        yaw, scale, _ = fit_pair(rp, _frame(dataset, i, "frames", t), _frame(dataset, i, "frames", t + 1), ds, yaws,
                                 grid)
        measured.append(yaw)
        predicted.append(ds * math.tan(steer * math.radians(geometry.max_steer_deg)) / geometry.wheelbase_m)
        scales.append(scale)
    if measured:
        m, p = np.asarray(measured), np.asarray(predicted)
        out["distance_scale"] = geometry.distance_scale
        out["yaw"] = {"pairs": len(m), "gain": float(np.dot(m, p) / max(np.dot(p, p), 1e-12)),
                      "corr": float(np.corrcoef(m, p)[0, 1]) if m.std() > 0 and p.std() > 0 else None,
                      "median_abs_measured_rad": float(np.median(np.abs(m)))}
        out["forward_scale"] = {"median": float(np.median(scales)), "q25": float(np.percentile(scales, 25)),
                                "q75": float(np.percentile(scales, 75))}
    return out


def _frame(dataset: Any, i: int, key: str, t: int) -> np.ndarray:
    """One frame, decoding just it (a recording's episode holds thousands)."""
    jpeg = dataset.jpeg_frames(i, key)
    return jpeg.decode([t])[0] if jpeg is not None else dataset.load(i, keys=key)[key][t]


def _rows(dataset: Any, n: int, min_speed: float, pair: bool = False) -> list[tuple[int, int]]:
    """Up to n (episode, row) evenly over the dataset where the car moves (and, for pairs, row + 1 exists)."""
    cands = []
    for i in range(len(dataset)):
        speed = dataset.load(i, keys="speed")["speed"]
        rows = np.flatnonzero(speed[: len(speed) - 1 if pair else len(speed)] >= min_speed / 2.23694)
        cands += [(i, int(t)) for t in rows]
    if not cands:
        return []
    idx = np.unique(np.linspace(0, len(cands) - 1, min(n, len(cands))).round().astype(int))
    return [cands[k] for k in idx]


def report(name: str, r: dict[str, Any]) -> str:
    g = r["geometry"]
    lines = [f"{name}: camera {g['cam_height_m']} m up, pitch {g['pitch_deg']} deg, hfov {g['hfov_deg']:.1f} deg, "
             f"side cameras {g['side_offset_m']} m, wheelbase {g['wheelbase_m']} m ({g['source']})"]
    for s in r.get("side", []):
        lines.append(f"  {s['camera']} camera ({s['frames']} frames): photometric error unwarped {s['unwarped']:.1f}, "
                     f"reprojected to {g['side_offset_m']} m {s['assumed']:.1f}, best {s['best']:.1f} at "
                     f"{abs(s['best_offset_m']):.2f} m (offset / height "
                     f"{abs(s['best_offset_m']) / g['cam_height_m']:.2f})")
    if "yaw" in r:
        y, f = r["yaw"], r["forward_scale"]
        lines.append(f"  yaw between frames ({y['pairs']} pairs): gain {y['gain']:.2f} over the steering's prediction "
                     f"(corr {y['corr'] if y['corr'] is None else round(y['corr'], 2)}); forward scale median "
                     f"{f['median']:.2f} (quartiles {f['q25']:.2f}-{f['q75']:.2f}) of speed x "
                     f"dt x {r['distance_scale']}")
    return "\n".join(lines)


@dataclass
class CalibrateArgs:
    recording: list[str] = option(help="recordings (driving_log.csv + IMG/) or udacity datasets", group="input",
                                  positional=True)
    frames: int = option(60, "frames for the side-camera fit", group="evaluation conditions")
    pairs: int = option(120, "consecutive pairs for yaw and forward scale", group="evaluation conditions")
    out: str = option("eval/calibrate", "output folder: raw recordings are imported into it", group="output",
                      former=("--work",))


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(CalibrateArgs, _calibrate_all, argv, prog="python -m envs.replay.calibrate", doc=__doc__,
                       mistakes=(ValueError, OSError))


def _calibrate_all(a: CalibrateArgs) -> None:
    from pathlib import Path

    from driving_data.dataset import open_dataset
    from driving_data.udacity_import import import_recordings
    from envs.replay.spec import geometry_of

    for k, rec in enumerate(a.recording):
        [folder] = import_recordings([rec], [Path(a.out) / f"imported_{k}"])
        ds = open_dataset(folder)
        print(report(rec, calibrate(ds, geometry_of(ds), frames=a.frames, pairs=a.pairs)), flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
