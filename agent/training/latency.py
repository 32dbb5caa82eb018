"""train.py's latency flags: ``--latency-steps`` (D, A:B or recorded: how many steps after its frame an action lands)
parsed once, and ``--latency-queue`` (the actions on their way a policy is shown) checked against it and against
``--latency-input``. The labels and windows they shape: agent.training.windows; the policy's inputs:
policies.config."""
from __future__ import annotations

from common.checks import is_int


def check_latency_queue(latency_steps: str, queue: int | None, latency_input: str | None) -> None:
    """--latency-steps parses; --latency-queue K needs the latency input and room for every latency trained."""
    latency = parse_latency_steps(latency_steps)
    if queue is None:
        return
    if not is_int(queue, 0, 1000):
        raise ValueError(f"--latency-queue must be an integer in [0, 1000] (actions), got {queue!r}")
    if queue and latency_input not in (None, "input"):
        raise ValueError(f"--latency-queue shows the actions on their way beside the latency input; it needs "
                         f"--latency-input input, not {latency_input}")
    if queue and latency != "recorded" and latency[1] > queue:
        raise ValueError(f"--latency-queue {queue} shows fewer actions than the {latency[1]} on their "
                         f"way under --latency-steps {latency_steps}")


def parse_latency_steps(text: str) -> tuple[int, int] | str:
    """``--latency-steps 5`` -> (5, 5); ``0:10`` -> (0, 10); ``recorded`` stays (each episode's own)."""
    if text == "recorded":
        return text
    try:
        lo, hi = (int(v) for v in (text.split(":") if ":" in str(text) else (text, text)))
        assert 0 <= lo <= hi <= 1000
    except (ValueError, AssertionError):
        raise ValueError("--latency-steps must be D, A:B (steps, 0 <= A <= B <= 1000) "
                         f"or recorded, got {text!r}") from None
    return lo, hi
