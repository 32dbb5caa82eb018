"""agent/training/latency.py: --latency-steps parsed once; --latency-queue checked against it and --latency-input."""
from __future__ import annotations

import pytest

from agent.training.latency import check_latency_queue, parse_latency_steps


def test_latency_steps():
    assert parse_latency_steps("0") == (0, 0) and parse_latency_steps("3:7") == (3, 7)
    assert parse_latency_steps("recorded") == "recorded"
    for bad in ("7:3", "-1", "x", "1:2:3", "1001"):
        with pytest.raises(ValueError, match=r"^--latency-steps must be D, A:B \(steps, 0 <= A <= B <= 1000\)"):
            parse_latency_steps(bad)


@pytest.mark.parametrize("steps, queue, told, says", [
    ("0:4", 2, "input", "--latency-queue 2 shows fewer actions than the 4 on their way under --latency-steps 0:4"),
    ("2", 2, "clock", "it needs --latency-input input, not clock"),
    ("2", -1, "input", "--latency-queue must be an integer in [0, 1000] (actions), got -1"),
    ("2", True, "input", "--latency-queue must be an integer in [0, 1000] (actions), got True"),
])
def test_a_queue_without_room_or_input_is_refused(steps, queue, told, says):
    with pytest.raises(ValueError) as e:
        check_latency_queue(steps, queue, told)
    assert says in str(e.value)


def test_a_queue_with_room_passes():
    for steps, queue, told in (("0:4", 4, "input"), ("recorded", 3, None), ("9", None, None), ("9", 0, "clock")):
        check_latency_queue(steps, queue, told)
