"""Timing conditions in closed loop: dropped frames, irregular control steps, actuation latency.

``TimingConditions`` (the options of evaluate.py: ``--drop-prob``, ``--jitter``, ``--latency-steps``) makes one
``EpisodeTiming`` per episode, which ``agent.evaluation.episode.run_episode`` asks two things at every env step:

* ``sees_frame(step)``: does the policy get this step's frame? Frames *arrive* at the steps of a schedule:
  every step, or with ``--jitter K1:K2`` every k steps, k drawn from K1..K2 (inclusive) at each arrival. An
  arriving frame is lost with probability ``--drop-prob`` (the first frame of an episode always arrives:
  there is no action to hold yet). When the policy gets no frame its stream is not stepped, and its last
  action is held; the frames it does get carry their true timestamps (step x the env's dt).
* ``action(decision)``: the action the env receives this step, given the controller's new action (or
  ``None``: hold the last one). With ``--latency-steps D`` every action reaches the env D steps after it
  was decided; the first D steps of an episode apply the env's neutral action (``neutral_action``: zeros,
  i.e. no steering, no gas, no brake on CarRacing; CarRacing discrete: noop).

The env keeps its own dt; the expert still labels every visited state (steering MAE against the action the
env received). An intervention (lane-keeping envs) does not reset the timing. Draws come from a generator of
their own, seeded by the track seed and ``STREAM``, so an episode repeats exactly in any worker process; with
every option off nothing is drawn and every action passes straight through (regular timing, as before the
options existed).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from agent.experts.latency import ActionDelay
from common.checks import is_int

STREAM = 22  # the timing generator's stream constant: np.random.default_rng([STREAM, track seed])


def parse_jitter(text: str | None) -> tuple[int, int] | None:
    """``"K1:K2"`` -> (K1, K2); None stays None. ValueError (naming --jitter) on anything else."""
    if text is None:
        return None
    parts = str(text).split(":")
    try:
        k1, k2 = (int(p) for p in parts) if len(parts) == 2 else (None, None)
    except ValueError:
        k1 = k2 = None
    if k1 is None:
        raise ValueError(f"--jitter must be K1:K2, two integers (the policy acts every k env steps, k drawn from "
                         f"K1..K2), got {text!r}")
    if k1 < 1 or k2 < k1:
        raise ValueError(f"--jitter K1:K2 needs 1 <= K1 <= K2 (a step gap of at least one env step), got {text!r}")
    return k1, k2


@dataclass(frozen=True)
class TimingConditions:
    """The run's timing options (checked by ``check``); ``episode(seed, neutral)`` makes an episode's clock."""

    drop_prob: float = 0.0  # probability that an arriving frame is lost (its step holds the last action)
    jitter: tuple[int, int] | None = None  # (K1, K2): frames arrive every k env steps, k drawn from K1..K2
    latency_steps: int = 0  # env steps between an action's decision and its application

    @property
    def regular(self) -> bool:
        return self.drop_prob == 0 and self.jitter is None and self.latency_steps == 0

    def check(self, max_steps: int) -> "TimingConditions":
        p = self.drop_prob
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:  # NaN fails too
            raise ValueError(f"--drop-prob must be a probability in [0, 1), got {p!r}")
        d = self.latency_steps
        if not is_int(d, 0):
            raise ValueError(f"--latency-steps must be an integer >= 0, got {d!r}")
        if d >= max_steps:
            raise ValueError(f"--latency-steps {d} leaves no step of a {max_steps}-step episode to the policy "
                             f"(--max-steps {max_steps})")
        if self.jitter is not None and self.jitter[1] > max_steps:
            raise ValueError(f"--jitter {self.jitter[0]}:{self.jitter[1]}: a gap of {self.jitter[1]} steps is longer "
                             f"than the episode (--max-steps {max_steps})")
        return self

    def describe(self, dt: float) -> dict[str, Any]:
        """The options as metrics.json's ``timing`` block records them."""
        return {"regular": self.regular, "drop_prob": float(self.drop_prob),
                "jitter": None if self.jitter is None else f"{self.jitter[0]}:{self.jitter[1]}",
                "latency_steps": self.latency_steps, "latency_s": round(self.latency_steps * dt, 9),
                "initial_action": "the env's neutral action (zeros: no steering, no gas, no brake; discrete: noop) "
                                  "for the first latency_steps steps",
                "rng": f"numpy default_rng([{STREAM}, track seed])"}

    def label(self) -> str:
        """A short phrase for titles: 'regular timing' or e.g. '20 % dropped frames, latency 5 steps'."""
        if self.regular:
            return "regular timing"
        parts = [f"{100 * self.drop_prob:g} % dropped frames"] if self.drop_prob else []
        parts += [f"jitter {self.jitter[0]}:{self.jitter[1]} steps"] if self.jitter else []
        steps = self.latency_steps
        parts += [f"latency {steps} step{'' if steps == 1 else 's'}"] if steps else []
        return ", ".join(parts)

    def episode(self, seed: int, neutral: Any) -> "EpisodeTiming":
        return EpisodeTiming(self, seed, neutral)


class EpisodeTiming:
    """One episode's clock: which steps the policy sees, the held action, the latency queue, the counts."""

    def __init__(self, conditions: TimingConditions, seed: int, neutral: Any) -> None:
        self.conditions = conditions
        self.rng = None if conditions.drop_prob == 0 and conditions.jitter is None else \
            np.random.default_rng([STREAM, int(seed)])
        self.next_arrival = 0
        self.held: Any = None  # the last decided action
        self.delay = ActionDelay(conditions.latency_steps, neutral)
        self.steps = self.frames_seen = self.dropped_frames = 0

    def sees_frame(self, step: int) -> bool:
        """Whether the policy gets the frame of env step ``step`` (call once per step, in order)."""
        self.steps += 1
        if step < self.next_arrival:
            return False
        c = self.conditions
        lost = step > 0 and c.drop_prob > 0 and self.rng.random() < c.drop_prob
        if c.jitter is None:
            self.next_arrival = step + 1
        else:
            self.next_arrival = step + int(self.rng.integers(c.jitter[0], c.jitter[1] + 1))
        self.dropped_frames += lost
        self.frames_seen += not lost
        return not lost

    def action(self, decision: Any) -> Any:
        """The action the env receives this step; ``decision`` is the controller's new action, None = hold."""
        if decision is not None:
            self.held = decision
        return self.delay(self.held)

    @property
    def queue(self) -> Any:
        """The actions on their way, next to land first (what a policy shown its queue sees)."""
        return self.delay.pending

    def stats(self) -> dict[str, int]:
        """The episode row's timing columns."""
        return {"frames_seen": self.frames_seen, "held_steps": self.steps - self.frames_seen,
                "dropped_frames": self.dropped_frames,
                "neutral_steps": min(self.steps, self.conditions.latency_steps)}


def timing_summary(conditions: TimingConditions, dt: float, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """metrics.json's ``timing`` block: the options and, over the run's episodes, what the policy got."""
    steps = sum(int(r["length"]) for r in rows)
    seen = sum(int(r.get("frames_seen", r["length"])) for r in rows)
    return {**conditions.describe(dt), "steps": steps, "frames_seen": seen, "held_steps": steps - seen,
            "frames_seen_fraction": seen / steps if steps else float("nan"),
            "dropped_frames": sum(int(r.get("dropped_frames", 0)) for r in rows),
            "neutral_steps": sum(int(r.get("neutral_steps", 0)) for r in rows)}
