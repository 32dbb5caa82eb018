"""The one rule for "an integer" that flags, env options and configs are checked with: Python's ``True`` is an
``int``, so a plain isinstance check would take a boolean for a count."""

from __future__ import annotations

from typing import Any

import numpy as np


def is_int(value: Any, low: int | None = None, high: int | None = None) -> bool:
    """``value`` is an integer (a Python or numpy int, not a bool or a float) within [low, high] where given."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        return False
    return bool((low is None or value >= low) and (high is None or value <= high))
