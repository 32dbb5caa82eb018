"""Action vocabularies shared by the policy, the CLIs and their configs; torch-free so that a config can check
its arguments before anything heavy is imported."""
from __future__ import annotations

import numpy as np

DISCRETE_ACTIONS = ("noop", "right", "left", "gas", "brake")  # CarRacing's discrete action ids 0..4

# How a discrete student picks its action from its softmax. argmax: the likeliest. sample: drawn from it -- the
# discrete CarRacing expert pulses gas and steering within a fraction of a second, and in a state that does not
# show which pulse comes next argmax takes the commoner one, gas, every time (measured: docs/results.md, issue 23).
# dither: error diffusion, deterministic pulses -- over consecutive steps each action is taken as often as its
# probability says (gas at 0.6 and brake at 0.4: gas, brake, gas, gas, brake, ...), without sampling's runs of luck.
DISCRETE_ACTION_RULES = ("argmax", "sample", "dither")


class DiscreteChooser:
    """One episode's action choice by ``rule`` from the per-step softmax; ``seed`` seeds ``sample`` (an episode
    repeats exactly in any worker), ``dither`` carries each action's unspent probability from step to step."""

    def __init__(self, rule: str, seed: int | None = None) -> None:
        if rule not in DISCRETE_ACTION_RULES:
            raise ValueError(f"the discrete action rule must be one of {DISCRETE_ACTION_RULES}, got {rule!r}")
        self.rule = rule
        self.rng = np.random.default_rng(None if seed is None else [int(seed), 0xD15C]) if rule == "sample" else None
        self.owed: np.ndarray | None = None  # dither: probability received minus actions taken, per action

    def __call__(self, probs: np.ndarray) -> int:
        p = np.asarray(probs, dtype=np.float64).reshape(-1)
        if self.rule == "argmax":
            return int(p.argmax())
        if self.rule == "sample":
            return int(self.rng.choice(len(p), p=p / p.sum()))
        self.owed = p / p.sum() + (0.0 if self.owed is None else self.owed)
        k = int(self.owed.argmax())
        self.owed[k] -= 1.0
        return k
