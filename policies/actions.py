"""Action vocabularies shared by the policy, the CLIs and their configs; torch-free so that a config can check
its arguments before anything heavy is imported."""
from __future__ import annotations

from typing import Sequence

import numpy as np

DISCRETE_ACTIONS = ("noop", "right", "left", "gas", "brake")  # CarRacing's discrete action ids 0..4

# How a discrete student picks its action from its softmax. argmax: the likeliest. sample: drawn from it -- the
# discrete CarRacing expert pulses gas and steering, and where a frame does not show which pulse comes next argmax
# takes the commoner one, gas, every time (docs/results.md, "The discrete CarRacing student").
# dither: error diffusion, deterministic pulses -- over consecutive steps each action is taken as often as its
# probability says (gas at 0.6 and brake at 0.4: gas, brake, gas, gas, brake, ...), without sampling's runs of luck.
DISCRETE_ACTION_RULES = ("argmax", "sample", "dither")
# Temperature T reshapes the softmax before sample / dither draw from it (p -> p ** (1 / T), renormalised): above 1
# the student's minority actions (brake, the other steering pulse) come more often. argmax ignores it. Spared
# actions keep their temperature-1 probability and the others share the rest at temperature T. What either does
# to a student's driving: docs/results.md, "The discrete CarRacing student".


def spared_ids(names: Sequence[str] | str | None) -> tuple[int, ...]:
    """Action names ("brake", or "noop,brake") as ids of DISCRETE_ACTIONS; at least one action must stay unspared."""
    if names is None:
        return ()
    items = [n.strip() for n in names.split(",")] if isinstance(names, str) else [str(n) for n in names]
    unknown = [n for n in items if n not in DISCRETE_ACTIONS]
    if unknown or not items:
        raise ValueError(f"spared actions must be names of {DISCRETE_ACTIONS}, comma-separated; got {names!r}")
    ids = tuple(sorted({DISCRETE_ACTIONS.index(n) for n in items}))
    if len(ids) == len(DISCRETE_ACTIONS):
        raise ValueError("sparing every action leaves the temperature nothing to change")
    return ids


def at_temperature(probs: np.ndarray, temperature: float, spared: Sequence[int] = ()) -> np.ndarray:
    """Probabilities ``[..., K]`` at ``temperature``: p ** (1 / T) renormalised (in log space: a probability that
    underflows stays 0, not NaN); ``spared`` ids keep their probability and the rest share what they leave."""
    p = np.asarray(probs, dtype=np.float64)
    p = p / p.sum(axis=-1, keepdims=True)
    if temperature == 1.0:
        return p
    with np.errstate(divide="ignore"):
        logq = np.log(p) / temperature
    q = np.exp(logq - logq.max(axis=-1, keepdims=True))
    if not spared:
        return q / q.sum(axis=-1, keepdims=True)
    keep = np.zeros(p.shape[-1], dtype=bool)
    keep[list(spared)] = True
    q[..., keep] = 0.0
    rest = q.sum(axis=-1, keepdims=True)
    left = 1.0 - p[..., keep].sum(axis=-1, keepdims=True)
    q *= left / np.where(rest > 0, rest, 1.0)  # rest 0: every unspared probability underflowed, and stays 0
    q[..., keep] = p[..., keep]
    return q


def check_temperature(temperature: float, rule: str) -> float:
    """A sampling temperature: a finite number > 0, and not 1 only for a rule that draws from the softmax."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or \
            not np.isfinite(temperature) or temperature <= 0:
        raise ValueError(f"the action temperature must be a number > 0, got {temperature!r}")
    if temperature != 1 and rule == "argmax":
        raise ValueError(f"an action temperature ({temperature}) changes only the sample and dither rules; argmax "
                         "takes the likeliest action at any temperature")
    return float(temperature)


def check_discrete_options(head: str, own_rule: str, rule: str | None, temperature: float | None, spared: bool,
                           subject: str, names: Sequence[str] = ("actions", "temperature", "spared actions")) -> None:
    """One rule set for a student's action options, worded with the caller's ``names`` for the rule, the temperature
    and the spared actions (a library's arguments or a CLI's flags), so the user reads the option they gave: a rule
    other than argmax, a temperature and spared actions need a discrete head; a temperature other than 1 and spared
    actions change only a rule that draws from the softmax. ``rule`` / ``temperature`` None: not given (``own_rule``,
    the student's, applies); ``subject`` names the student ("checkpoint 'a.pt'"); a caller that has no spared
    actions passes ``spared`` False and any third name."""
    rule_name, temperature_name, spared_name = names
    if head != "discrete":
        for name, given in ((f"{rule_name} {rule}", rule not in (None, "argmax")),
                            (temperature_name, temperature is not None), (spared_name, spared)):
            if given:
                raise ValueError(f"{name} is for discrete students; {subject} has a {head} head")
    elif (rule or own_rule) == "argmax":
        for name, given in ((temperature_name, temperature not in (None, 1)), (spared_name, spared)):
            if given:
                raise ValueError(f"{name} changes only the sample and dither rules; {subject} drives argmax "
                                 f"(add {rule_name} sample)")


class DiscreteChooser:
    """One episode's action choice by ``rule`` from the per-step softmax at ``temperature``; ``seed`` seeds
    ``sample`` (an episode repeats exactly in any worker), ``dither`` carries each action's unspent probability from
    step to step."""

    def __init__(self, rule: str, seed: int | None = None, temperature: float = 1.0,
                 spared: Sequence[int] = ()) -> None:
        if rule not in DISCRETE_ACTION_RULES:
            raise ValueError(f"the discrete action rule must be one of {DISCRETE_ACTION_RULES}, got {rule!r}")
        self.rule, self.temperature, self.spared = rule, check_temperature(temperature, rule), tuple(spared)
        self.rng = np.random.default_rng(None if seed is None else [int(seed), 0xD15C]) if rule == "sample" else None
        self.owed: np.ndarray | None = None  # dither: probability received minus actions taken, per action

    def __call__(self, probs: np.ndarray) -> int:
        p = np.asarray(probs, dtype=np.float64).reshape(-1)
        if self.rule == "argmax":
            return int(p.argmax())
        p = at_temperature(p, self.temperature, self.spared)
        if self.rule == "sample":
            assert self.rng is not None  # made for the sample rule
            return int(self.rng.choice(len(p), p=p / p.sum()))
        self.owed = p / p.sum() + (0.0 if self.owed is None else self.owed)
        k = int(self.owed.argmax())
        self.owed[k] -= 1.0
        return k
