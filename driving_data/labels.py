"""What a recorded steering label means, beside what was logged.

Keyboard and mouse steering in the real simulator is a train of taps: most frames say 0, a few say up to
±1. What the driver meant is the steering averaged over a short time, and no image can predict where a tap
falls inside that time. ``centred_average`` gives that meaning: the mean of the labels within ``width_s``
seconds centred on each frame, inside its episode (its session). Offline scores are reported against both the
raw labels and this average, and training can regress the average (``train.py --smooth-labels``)."""

from __future__ import annotations

import numpy as np

DEFAULT_SMOOTHING_S = 0.5  # a keyboard tap lasts about one frame at 10 Hz; 0.5 s holds a few of them


def centred_average(times: np.ndarray, values: np.ndarray, width_s: float = DEFAULT_SMOOTHING_S) -> np.ndarray:
    """For every step, the mean of ``values`` over the steps whose time is within ``width_s / 2`` of its own
    (``times`` in seconds, non-decreasing; ``values`` ``[T]`` or ``[T, D]``). ``width_s`` 0 returns the values."""
    values = np.asarray(values, dtype=np.float64)
    if width_s <= 0 or len(values) == 0:
        return values.copy()
    times = np.asarray(times, dtype=np.float64)
    lo = np.searchsorted(times, times - width_s / 2, side="left")
    hi = np.searchsorted(times, times + width_s / 2, side="right")
    flat = values.reshape(len(values), -1)
    sums = np.concatenate([np.zeros((1, flat.shape[1])), np.cumsum(flat, axis=0)])
    mean = (sums[hi] - sums[lo]) / (hi - lo)[:, None]
    return mean.reshape(values.shape)
