"""Evaluation's plots, drawn with matplotlib (labelled axes, written atomically): a student's steering against a
recording over time (offline scores), and the path a replayed car drove against the recorded one (with its
per-step table, to find where in the recording the interventions came)."""
from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

import numpy as np

from common.files import atomic_write, atomic_write_text

STEERING_SIZE_IN, DPI = (14.0, 3.6), 100  # the offline steering plot: 1400 x 360 pixels


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path, dpi: int) -> Path:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    _pyplot().close(fig)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda f: f.write(buf.getvalue()))
    return path


def steering_plot(path: Path, times: np.ndarray, steer: np.ndarray, smooth: np.ndarray, predicted: np.ndarray,
                  title: str, smoothing_s: float) -> Path:
    """Recorded (grey), its centred average (blue) and predicted (orange) steering over time, as a PNG."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=STEERING_SIZE_IN)
    t = np.asarray(times, np.float64) - float(times[0])
    ax.plot(t, steer, color="0.65", lw=0.8, label="recorded")
    ax.plot(t, smooth, color="tab:blue", lw=1.6, label=f"recorded, {smoothing_s:g} s average")
    ax.plot(t, predicted, color="tab:orange", lw=1.6, label="predicted")
    ax.axhline(0.0, color="0.8", lw=0.8)
    ax.set_xlabel("time in the session (s)")
    ax.set_ylabel("steering (-1 left .. 1 right)")
    ax.set_title(title, fontsize=10)
    ax.legend(loc="upper right", fontsize=8, ncol=3)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return _save(fig, path, DPI)


def recorded_path(steer: np.ndarray, speed: np.ndarray, dt: np.ndarray, wheelbase: float, max_steer_deg: float
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x, y (m) and heading (rad) of the recorded path, integrated from the recorded steering and speed
    (a kinematic bicycle; x starts ahead, y to the left)."""
    k = np.tan(np.clip(steer, -1, 1) * math.radians(max_steer_deg)) / wheelbase  # + = right
    ds = np.maximum(speed, 0) * dt
    heading = np.concatenate([[0.0], np.cumsum(-k * ds)[:-1]])  # turning right = clockwise
    x = np.concatenate([[0.0], np.cumsum(ds * np.cos(heading))[:-1]])
    y = np.concatenate([[0.0], np.cumsum(ds * np.sin(heading))[:-1]])
    return x, y, heading


REPLAY_TABLE_COLUMNS = ("session", "row", "time_s", "offset_m", "yaw_rad", "recorded_steer", "steer", "speed_mps",
                        "intervention")


def write_replay_table(trace: dict[str, Any], path: Path) -> Path:
    """One line per replayed step: the recording's session and row (its frame), the car's pose off the driver's line
    (+ right), the recorded and the car's steering, the speed, and 1 where an intervention put the car back."""
    rows = np.asarray(trace["trace"], dtype=np.float64)
    hits = set(trace["interventions"])
    lines = [",".join(REPLAY_TABLE_COLUMNS)]
    for k, (t, offset, yaw, recorded, speed, steer) in enumerate(rows[:, :6]):
        lines.append(f"{trace['episode']},{trace['start'] + k},{t:.3f},{offset:.4f},{yaw:.5f},{recorded:.4f},"
                     f"{steer:.4f},{speed:.3f},{int(k in hits)}")
    return atomic_write_text(path, "\n".join(lines) + "\n")


def plot_replay_path(trace: dict[str, Any], path: Path, title: str, geometry: Any) -> Path:
    """Draw the recorded path and the driven one (recorded + offset along the normal), interventions marked."""
    plt = _pyplot()
    rows = np.asarray(trace["trace"], dtype=np.float64)
    if len(rows) == 0:
        return path
    t, offset, steer, speed = rows[:, 0], rows[:, 1], rows[:, 3], rows[:, 4]
    dt = np.asarray(trace["dt"], dtype=np.float64)[:len(rows)]
    x, y, heading = recorded_path(steer, speed * geometry.distance_scale, dt, geometry.wheelbase_m,
                                  geometry.max_steer_deg)
    # + offset = right of the path: the right normal of heading h is (sin h, -cos h)
    cx, cy = x + offset * np.sin(heading), y - offset * np.cos(heading)
    fig, (top, side) = plt.subplots(1, 2, figsize=(11, 4.5), gridspec_kw={"width_ratios": [1.3, 1]})
    top.plot(x, y, color="0.4", lw=2, label="recorded path")
    top.plot(cx, cy, color="tab:blue", lw=1, label="driven (replay)")
    hits = [k for k in trace["interventions"] if k < len(rows)]
    if hits:
        top.scatter(cx[hits], cy[hits], color="tab:red", marker="x", zorder=3, label=f"interventions ({len(hits)})")
    top.set_aspect("equal", adjustable="datalim")
    top.set_xlabel("x (m)")
    top.set_ylabel("y (m, left)")
    top.legend(loc="best", fontsize=8)
    top.set_title(title, fontsize=9)
    side.plot(t, offset, color="tab:blue", lw=1)
    for k in hits:
        side.axvline(t[k], color="tab:red", lw=0.6, alpha=0.6)
    side.set_xlabel("time (s)")
    side.set_ylabel("offset from the recorded path (m, + right)")
    side.grid(alpha=0.3)
    fig.tight_layout()
    return _save(fig, path, 90)
