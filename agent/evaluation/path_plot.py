"""The path a replayed car drove against the recorded one, seen from above (one PNG per replayed part)."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np


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


def plot_replay_path(trace: dict[str, Any], path: Path, title: str, geometry: Any) -> Path:
    """Draw the recorded path and the driven one (recorded + offset along the normal), interventions marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
