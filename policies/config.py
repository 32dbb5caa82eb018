"""A driving policy's config, ``PolicyConfig``: plain data that rebuilds the policy (``policies.policy.DrivingPolicy``).

Its own module because it is the one piece every side reads without the network: a checkpoint stores it beside the
weights as a JSON-able dict (``policies.checkpoint``), the trainer builds it from the command line, and the closed
loops read its frame size, window and temperature from it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from common.checks import is_int
from policies.actions import DISCRETE_ACTION_RULES, DISCRETE_ACTIONS, check_temperature
from policies.cores import CORES
from policies.encoders import ENCODERS

HEADS = ("discrete", "continuous")
COLORS = ("rgb", "yuv")
TIME_INPUTS = ("seconds", "index")
# how a policy is told its latency, the time from its newest frame to the moment its action lands:
# none (it is not told) | clock (NAC: the query's timestamp is that moment) | input (one more input feature)
LATENCY_INPUTS = ("none", "clock", "input")
# throttle < 0 brakes
ACTION_RANGES = {"steer": (-1.0, 1.0), "gas": (0.0, 1.0), "brake": (0.0, 1.0), "throttle": (-1.0, 1.0)}



@dataclass
class PolicyConfig:
    """Everything needed to rebuild a policy (saved as a JSON-able dict in every checkpoint)."""

    encoder: str = "carracing"  # policies.encoders.ENCODERS
    image_size: list[int] = field(default_factory=lambda: [96, 96])  # encoder input [h, w]; frames resized to it
    crop: list[int] | None = None  # [top, bottom): rows of the camera frame kept before the resize (None: all)
    frame_shape: list[int] | None = None  # [H, W, C] of the camera frames it was trained on (None: its env's camera)
    color: str = "rgb"  # rgb | yuv: the colour space the encoder sees (PilotNet's recipe uses YUV)
    feature_dim: int = 64  # per-frame embedding size
    encoder_dropout: float = 0.2
    core: str = "nac"  # policies.cores.CORES
    core_options: dict[str, Any] = field(default_factory=dict)  # keyword arguments of the core
    window: int = 8  # frames per window
    frame_stride: int = 3  # steps between window frames (window spans (window-1)*frame_stride steps)
    frame_period: float = 0.02  # seconds between consecutive recorded frames (CarRacing: 50 Hz)
    # what the core gets as time: seconds (the frames' true timestamps) | index (their window positions: the ablation
    # that hides the clock)
    time_input: str = "seconds"
    head: str = "continuous"  # "discrete" (5-way classifier) | "continuous" (regressor)
    action_names: list[str] = field(default_factory=lambda: ["steer", "gas", "brake"])
    action_low: list[float] = field(default_factory=lambda: [-1.0, 0.0, 0.0])  # clip range of to_env_action
    action_high: list[float] = field(default_factory=lambda: [1.0, 1.0, 1.0])
    target_mean: list[float] | None = None  # continuous: training-set statistics of the targets
    target_std: list[float] | None = None
    env: str = "CarRacing-v3"
    action_space: str = "continuous"
    # discrete head: the rule it drives with unless told (policies.actions.DISCRETE_ACTION_RULES); a student trained on
    # sampling drivers' data drives best sampling
    discrete_actions: str = "argmax"
    # discrete head, sample / dither: the softmax temperature it drives at unless told
    # (policies.actions.check_temperature)
    action_temperature: float = 1.0
    # how it is told its latency (LATENCY_INPUTS): none | clock (the nac core's query time) | input (a feature)
    latency_input: str = "none"
    # input only: it is also shown up to this many of its actions on their way (next to land first)
    queue_steps: int = 0
    # continuous steering is multiplied by it before the clip (DrivingPolicy.steered; benchmarks.steer_gain)
    steer_gain: float = 1.0
    # the gain acts only where |steering| >= this (the authors' Udacity drive.py: x3 from 0.01)
    steer_gain_from: float = 0.0
    # the throttle it drives with, whatever it predicts (their drive.py: 0.05); None: its own / the driver's rule
    fixed_throttle: float | None = None
    # window 1 only: each frame's features cut in order into this many tokens, the sequence the core reads (0: the
    # window is the sequence)
    frame_tokens: int = 0
    # a hidden ReLU layer of this width before the action layer (their CarRacing model: 64); 0: one linear layer
    head_hidden: int = 0

    def temperature_for(self, rule: str | None) -> float:
        """The temperature a discrete student samples at under ``rule`` (None: its own rule): its own temperature
        with its own rule, 1 with any other (a temperature was chosen for the rule it was stored with)."""
        return self.action_temperature if rule in (None, self.discrete_actions) else 1.0

    @property
    def action_dim(self) -> int:
        return len(self.action_names)

    @property
    def told_features(self) -> int:
        """Features the core reads beside each frame's embedding: the latency, and the actions on their way."""
        return (self.latency_input == "input") + self.queue_steps * self.action_dim

    @classmethod
    def for_actions(cls, head: str, action_names: list[str] | None = None, **kwargs) -> "PolicyConfig":
        """A config whose action names and ranges follow the head: discrete 5-way, or named continuous dims."""
        if head == "discrete":
            names = list(DISCRETE_ACTIONS)
            low, high = [0.0] * 5, [1.0] * 5
        else:
            names = list(action_names or ["steer", "gas", "brake"])
            unknown = [n for n in names if n not in ACTION_RANGES]
            if unknown:
                raise ValueError(f"unknown action names {unknown}; known: {list(ACTION_RANGES)}")
            low, high = [ACTION_RANGES[n][0] for n in names], [ACTION_RANGES[n][1] for n in names]
        return cls(head=head, action_names=names, action_low=low, action_high=high, **kwargs)

    def validate(self) -> "PolicyConfig":
        if self.encoder not in ENCODERS:
            raise ValueError(f"unknown encoder {self.encoder!r}; valid encoders: {', '.join(ENCODERS)}")
        if self.core not in CORES:
            raise ValueError(f"unknown core {self.core!r}; valid cores: {', '.join(CORES)}")
        if self.head not in HEADS:
            raise ValueError(f"head must be one of {HEADS}, got {self.head!r}")
        for name in ("window", "frame_stride", "feature_dim"):
            value = getattr(self, name)
            if not is_int(value, 1):
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if len(self.image_size) != 2 or min(self.image_size) < 1:
            raise ValueError(f"image_size must be [height, width], got {self.image_size!r}")
        if self.time_input not in TIME_INPUTS:
            raise ValueError(f"time_input must be one of {TIME_INPUTS}, got {self.time_input!r}")
        if self.latency_input not in LATENCY_INPUTS:
            raise ValueError(f"latency_input must be one of {LATENCY_INPUTS}, got {self.latency_input!r}")
        official = self.core == "nac" and self.core_options.get("variant") == "official"  # reads no frame times
        if self.latency_input == "clock" and (self.core != "nac" or official):
            core = "nac-official" if official else self.core
            raise ValueError(f"latency_input clock gives the nac core's query a timestamp; core {core!r} has "
                             "none (tell it with latency_input input)")
        if not is_int(self.queue_steps, 0, 1000):
            raise ValueError(f"queue_steps must be an integer in [0, 1000], got {self.queue_steps!r}")
        if self.queue_steps and (self.latency_input != "input" or self.head != "continuous"):
            raise ValueError("the actions on their way (queue_steps) are shown to a continuous policy told its latency "
                             f"as an input, not to a {self.head} one told by {self.latency_input!r}")
        if self.color not in COLORS:
            raise ValueError(f"color must be one of {COLORS}, got {self.color!r}")
        if self.crop is not None and (len(self.crop) != 2 or not 0 <= self.crop[0] < self.crop[1]):
            raise ValueError(f"crop must be [top, bottom) rows with 0 <= top < bottom, got {self.crop!r}")
        if self.frame_shape is not None and (len(self.frame_shape) != 3 or min(self.frame_shape) < 1):
            raise ValueError(f"frame_shape must be [height, width, channels], got {self.frame_shape!r}")
        if not self.frame_period > 0:
            raise ValueError(f"frame_period must be > 0 seconds, got {self.frame_period!r}")
        if not (len(self.action_low) == len(self.action_high) == self.action_dim >= 1):
            raise ValueError("action_names, action_low and action_high must have the same non-zero length")
        if self.head == "discrete" and self.action_dim != len(DISCRETE_ACTIONS):
            raise ValueError(f"a discrete head has {len(DISCRETE_ACTIONS)} actions, got {self.action_names}")
        if self.discrete_actions not in DISCRETE_ACTION_RULES:
            raise ValueError(f"discrete_actions must be one of {DISCRETE_ACTION_RULES}, got {self.discrete_actions!r}")
        if self.discrete_actions != "argmax" and self.head != "discrete":
            raise ValueError(f"discrete_actions {self.discrete_actions!r} is for a discrete "
                             f"head, not a {self.head} one")
        check_temperature(self.action_temperature, self.discrete_actions)
        if not (isinstance(self.steer_gain, (int, float)) and 0 < self.steer_gain <= 4):
            raise ValueError(f"steer_gain must be a number in (0, 4], got {self.steer_gain!r}")
        if self.steer_gain != 1 and (self.head != "continuous" or "steer" not in self.action_names):
            raise ValueError(f"steer_gain scales continuous steering; a {self.head} head of "
                             f"{self.action_names} has none")
        if not (isinstance(self.steer_gain_from, (int, float)) and 0 <= self.steer_gain_from < 1):
            raise ValueError(f"steer_gain_from must be a number in [0, 1), got {self.steer_gain_from!r}")
        if self.fixed_throttle is not None:
            if isinstance(self.fixed_throttle, bool) or not isinstance(self.fixed_throttle, (int, float)) \
                    or not -1 <= self.fixed_throttle <= 1:
                raise ValueError(f"fixed_throttle must be a number in [-1, 1] or None, got {self.fixed_throttle!r}")
            if self.head != "continuous":
                raise ValueError("fixed_throttle is the throttle of a continuous steering policy, "
                                 f"not of a {self.head} one")
        for name in ("frame_tokens", "head_hidden"):
            if not is_int(getattr(self, name), 0):
                raise ValueError(f"{name} must be an integer >= 0, got {getattr(self, name)!r}")
        if self.frame_tokens and self.window != 1:
            raise ValueError("frame_tokens cuts one frame's features into a sequence: it needs "
                             f"window 1, got {self.window}")
        if self.frame_tokens and self.latency_input != "none":
            raise ValueError("frame_tokens: a policy whose sequence is one frame's tokens cannot be told its latency")
        for stat in ("target_mean", "target_std"):
            value = getattr(self, stat)
            if value is not None and len(value) != self.action_dim:
                raise ValueError(f"{stat} must have {self.action_dim} entries, got {value}")
        return self

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "PolicyConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"policy config has unknown fields {unknown}; known: {sorted(known)}")
        return cls(**d).validate()
