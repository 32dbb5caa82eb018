"""How well envs/replay/road.py measures the road's middle on a recording, checked against what is known: the
side cameras sit a fixed offset left and right of the center one, so the middle each of them sees must lie that
offset from the center camera's; the road's width must stay steady along a track; and how much of it is measured
at all. On this project's simulator data (collect.py --env udacity-real, drawn in the real simulator's look) the
truth is known: the middle must lie minus the recorded cross-track error from the car, per theme, every 10th frame.
docs/udacity.md and docs/results.md give what it showed on five public recordings.

    python -m benchmarks.road_middle REC [REC ...] [--span A:B]
    python -m benchmarks.road_middle data/udacity-real --against-truth
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from common.cli import option, run_command
from driving_data.dataset import is_recording, open_dataset
from envs.registry import dataset_env
from envs.replay.camera import CameraGeometry
from envs.replay.road import (MEASURED_SIDE_M, UNMEASURED, RoadEstimator, frames_of, measure_frames, one_sided,
                              plausible, smooth_middle)
from envs.replay.options import parse_span
from envs.replay.spec import geometry_of, span_slice


def validate(dataset: Any, geometry: CameraGeometry, span: tuple[float, float] = (0.0, 1.0)) -> dict[str, Any]:
    """Coverage, side-camera consistency and width of the estimate over ``span`` of every session of a dataset."""
    est = RoadEstimator(geometry)
    cams = ("frames", "frames_left", "frames_right")
    raw: dict[str, list[np.ndarray]] = {k: [] for k in cams}
    smooth: dict[str, list[np.ndarray]] = {k: [] for k in cams}
    for i in range(len(dataset)):
        rows = span_slice(span, int(dataset.episodes[i]["length"]))
        for key in cams:
            readings = one_sided(plausible(measure_frames(est, frames_of(dataset, i, key),
                                                          range(rows.start, rows.stop))))
            raw[key].append(readings)
            smooth[key].append(smooth_middle(readings[:, 0]))
    c, left, right = (np.concatenate(raw[k]) for k in cams)
    sc, sleft, sright = (np.concatenate(smooth[k]) for k in cams)
    known = np.isfinite(c[:, 0])
    both = known & np.isfinite(c[:, 1])  # both boundaries found (a width)
    out: dict[str, Any] = {"frames": len(c), "coverage": float(np.mean(known)), "both_sides": float(np.mean(both)),
                           "filled": float(np.mean(sc != UNMEASURED))}
    if both.any():
        w = c[both, 1]
        out["width"] = {q: float(np.percentile(w, p)) for q, p in (("q10", 10), ("q25", 25), ("median", 50),
                                                                  ("q75", 75), ("q90", 90))}
        out["middle"] = {"median": float(np.median(c[known, 0])), "mean_abs": float(np.mean(np.abs(c[known, 0]))),
                         "right_of_middle": float(np.mean(c[known, 0] < 0))}
    for name, side, smooth_side, sign in (("left", left, sleft, -1.0), ("right", right, sright, 1.0)):
        both = known & np.isfinite(side[:, 0])
        # the middle seen from a camera d right of the center one lies d further left: center - side = sign * d
        shift = sign * (c[both, 0] - side[both, 0])
        filled = (sc != UNMEASURED) & (smooth_side != UNMEASURED)
        smooth_shift = sign * (sc[filled] - smooth_side[filled])
        out[name] = {"pairs": int(both.sum()), "smoothed_pairs": int(filled.sum())}
        if both.any():
            out[name].update(median_shift_m=float(np.median(shift)), geometry_offset_m=geometry.side_offset_m,
                             abs_err_geometry=float(np.median(np.abs(shift - geometry.side_offset_m))),
                             abs_err_measured=float(np.median(np.abs(shift - MEASURED_SIDE_M))),
                             gross=float(np.mean(np.abs(shift - MEASURED_SIDE_M) > 0.5)))
        if filled.any():
            out[name].update(smoothed_abs_err=float(np.median(np.abs(smooth_shift - MEASURED_SIDE_M))),
                             smoothed_gross=float(np.mean(np.abs(smooth_shift - MEASURED_SIDE_M) > 0.5)))
    return out


def against_truth(dataset: Any, geometry: CameraGeometry, every: int = 10) -> dict[str, dict[str, float]]:
    """Simulator data: per theme, how often the middle is measured and its error against minus the cross-track
    error (the lane's centre, right of the car when the car is left of it), on every ``every``-th center frame."""
    names = list(dataset_env(dataset.card, dataset.episodes).feature_names)
    if "cte" not in names:
        raise ValueError("the dataset's privileged features have no cross-track error ('cte'): no truth to compare")
    est = RoadEstimator(geometry)
    seen: dict[str, list[bool]] = {}
    errors: dict[str, list[float]] = {}
    for i, meta in enumerate(dataset.episodes):
        theme = str(meta.get("theme", "?"))
        cte = dataset.load(i, keys=["privileged"])["privileged"][:, names.index("cte")]
        readings = one_sided(plausible(measure_frames(est, frames_of(dataset, i, "frames"), range(0, len(cte), every))))
        known = np.isfinite(readings[:, 0])
        seen.setdefault(theme, []).extend(known.tolist())
        errors.setdefault(theme, []).extend((readings[known, 0] + cte[::every][known]).tolist())
    return {theme: {"frames": len(seen[theme]), "coverage": float(np.mean(seen[theme])),
                    "median_abs_err": float(np.median(np.abs(errors[theme]))) if errors[theme] else math.nan,
                    "median_err": float(np.median(errors[theme])) if errors[theme] else math.nan}
            for theme in seen}


def report_truth(name: str, r: dict[str, dict[str, float]]) -> str:
    return "\n".join([f"{name}: against the simulator's cross-track error"] + [
        f"  {theme}: {v['frames']} frames, measured on {100 * v['coverage']:.1f} %, median abs error "
        f"{v['median_abs_err']:.2f} m (median {v['median_err']:+.2f} m)" for theme, v in r.items()])


def report(name: str, r: dict[str, Any]) -> str:
    lines = [f"{name}: {r['frames']} center frames, measured on {100 * r['coverage']:.1f} % (both sides "
             f"{100 * r['both_sides']:.1f} %), known after smoothing and filling {100 * r['filled']:.1f} %"]
    if "width" in r:
        w, m = r["width"], r["middle"]
        lines.append(f"  width m: median {w['median']:.2f}, quartiles {w['q25']:.2f}-{w['q75']:.2f}, "
                     f"10-90 % {w['q10']:.2f}-{w['q90']:.2f}; middle m: median {m['median']:+.2f}, "
                     f"mean |.| {m['mean_abs']:.2f}, driver right of the middle on {100 * m['right_of_middle']:.0f} %")
    for side in ("left", "right"):
        s = r[side]
        if s["pairs"]:
            lines.append(f"  {side} camera: {s['pairs']} frames with both measured: center - {side} = "
                         f"{s['median_shift_m']:.2f} m (median); median abs error against the geometry's "
                         f"{s['geometry_offset_m']:.2f} m {s['abs_err_geometry']:.2f}, against the real simulator's "
                         f"measured {MEASURED_SIDE_M} m {s['abs_err_measured']:.2f}; off by > 0.5 m from it on "
                         f"{100 * s['gross']:.1f} %")
        if s["smoothed_pairs"]:
            lines.append(f"    smoothed series ({s['smoothed_pairs']} frames): median abs error "
                         f"{s['smoothed_abs_err']:.2f},"
                         f" off by > 0.5 m on {100 * s['smoothed_gross']:.1f} %")
    return "\n".join(lines)


@dataclass
class RoadMiddleArgs:
    dataset: list[str] = option(help="imported recordings (dataset folders with frames_left / _right)", group="input",
                                positional=True, metavar="DATASET")
    span: str | None = option(None, "A:B, the part of every session measured (default 0:1)", group="data")
    against_truth: bool = option(False, "this project's simulator data: compare with the recorded cross-track error "
                                 "instead", group="data")


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(RoadMiddleArgs, _benchmark, argv, prog="python -m benchmarks.road_middle", doc=__doc__,
                       mistakes=(ValueError, OSError))


def _benchmark(a: RoadMiddleArgs) -> None:
    for folder in a.dataset:
        ds = open_dataset(folder)
        if a.against_truth:
            if any(is_recording(m) for m in ds.episodes):
                raise ValueError(f"--against-truth: {folder!r} is a recording of the real simulator, whose "
                                 "cross-track error nobody knows")
            print(report_truth(folder, against_truth(ds, geometry_of(ds))), flush=True)
        else:
            print(report(folder, validate(ds, geometry_of(ds), parse_span(a.span, "--span"))), flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
