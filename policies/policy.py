"""The driving policy: frame encoder -> sequence core -> action head, its config, checkpoints and streaming.

    frames [B, W, H, W, 3] --frames_to_float--> [B, W, 3, h, w] --encoder--> [B, W, F]
        --core (causal, last step)--> [B, C] --head--> logits [B, 5] | normalised actions [B, A]

* ``PolicyConfig`` is plain data (JSON round trip); a checkpoint stores it beside the weights, so the
  file alone rebuilds its policy (``load_checkpoint``), LeRobot style.
* Discrete heads output logits over CarRacing's 5 actions. Continuous heads regress actions
  normalised with the training set's mean/std (kept in the config, hence in the checkpoint);
  ``forward`` returns actions in env units and ``to_env_action`` clips them to the valid range.
* Time: ``forward`` takes the window's timestamps in seconds, last frame 0 (what
  ``agent.training.windows.WindowDataset`` yields). Cores get them in units of ``frame_period * frame_stride``,
  i.e. consecutive window frames 1 apart. ``time=None`` means evenly spaced frames.
* Streaming (``stream()``): one new frame per control step, one CNN pass on it and one core pass on
  a window of cached per-frame embeddings; at reset the window is filled with the first frame,
  exactly like ``agent.training.windows.window_indices``, so its output equals ``forward`` on the same window.
* Precision (``use_precision``): fp32 by default; bf16 runs the encoder under bfloat16 autocast on batches of
  frames and keeps the rest in fp32 (``policies.precision`` says what and why).
"""
from __future__ import annotations

import io
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from common.checks import is_int
from common.files import atomic_write
from policies.actions import DISCRETE_ACTION_RULES, DISCRETE_ACTIONS, check_temperature
from policies.cores import CORES, build_core
from policies.encoders import ENCODERS, build_encoder
from policies.precision import bf16_autocast, runs_bf16

CHECKPOINT_FORMAT = "nac-drive/driving-policy"
CHECKPOINT_VERSION = 1
# the student shipped for people's recordings of the real simulator (evaluate.py --data / --replay REC, the bridge):
# trained on many drivers' public recordings, it steers drivers it never saw better than the simulator-trained one
RECORDING_STUDENT = Path("checkpoints/udacity_real_nac.pt")
HEADS = ("discrete", "continuous")
COLORS = ("rgb", "yuv")
# RGB -> YUV (BT.601, as OpenCV's COLOR_RGB2YUV) on [0, 1] pixels, U and V centred on 0.5
_YUV = torch.tensor([[0.299, 0.587, 0.114], [-0.14713, -0.28886, 0.436], [0.615, -0.51499, -0.10001]])
TIME_INPUTS = ("seconds", "index")
# how a policy is told its latency, the time from its newest frame to the moment its action lands:
# none (it is not told) | clock (NAC: the query's timestamp is that moment) | input (one more input feature)
LATENCY_INPUTS = ("none", "clock", "input")
# throttle < 0 brakes
ACTION_RANGES = {"steer": (-1.0, 1.0), "gas": (0.0, 1.0), "brake": (0.0, 1.0), "throttle": (-1.0, 1.0)}


# ----------------------------------------------------------------------------- configuration
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


def check_frame_shape(trained: Sequence[int], frames: Sequence[int], who: str, what: str) -> None:
    """The one rule where a policy meets camera frames (offline scores, the replay and every closed loop, the
    bridge): frames of another size than it was trained on are refused in one line, never cropped and resized into
    a view it never saw (a 160x320 crop of a 480-row frame is sky)."""
    if tuple(int(x) for x in frames) != tuple(int(x) for x in trained):
        raise ValueError(f"{who} was trained on {'x'.join(map(str, trained))} frames; {what} are "
                         f"{'x'.join(map(str, frames))} (height x width x channels): a policy never scores or drives "
                         "frames of another size")


# ----------------------------------------------------------------------------- the policy
def prepare_frames(frames: np.ndarray, crop: list[int] | None, image_size: list[int] | tuple[int, int]) -> np.ndarray:
    """Camera frames uint8 ``[..., H, W, 3]`` -> the encoder's size: keep rows ``crop`` (sky and bonnet off),
    then an area resize to ``image_size`` (OpenCV, as PilotNet's recipe). Identity when nothing changes, so
    the trainer can store prepared frames (a 160x320 camera frame shrinks 3.9x at 66x200)."""
    import cv2

    frames = np.asarray(frames)
    if crop is not None:
        frames = frames[..., crop[0]:crop[1], :, :]
    h, w = int(image_size[0]), int(image_size[1])
    if frames.shape[-3:-1] == (h, w):
        return np.ascontiguousarray(frames)
    flat = frames.reshape(-1, *frames.shape[-3:])
    out = np.empty((len(flat), h, w, 3), dtype=frames.dtype)
    for i, f in enumerate(flat):
        out[i] = cv2.resize(f, (w, h), interpolation=cv2.INTER_AREA)
    return out.reshape(*frames.shape[:-3], h, w, 3)


def to_color_space(x: torch.Tensor, color: str) -> torch.Tensor:
    """Float RGB ``[..., 3, h, w]`` in [0, 1] -> the encoder's colour space (in place of a copy for yuv)."""
    if color == "rgb":
        return x
    m = _YUV.to(x.device, x.dtype)
    yuv = torch.einsum("ij,...jhw->...ihw", m, x)
    yuv[..., 1:, :, :] += 0.5
    return yuv


def frames_to_float(frames: torch.Tensor | np.ndarray, image_size: list[int] | tuple[int, int],
                    device: torch.device | str | None = None, color: str = "rgb") -> torch.Tensor:
    """The one place where frames become network input: ``[..., H, W, 3]`` -> float ``[..., 3, h, w]`` in [0, 1].

    uint8 frames are divided by 255; float frames are taken as already in [0, 1]. Frames whose size is
    not ``image_size`` are resized (bilinear, antialiased). ``color="yuv"`` converts to YUV last.
    """
    frames = torch.as_tensor(frames, device=device)
    if frames.dim() < 3 or frames.shape[-1] != 3:
        raise ValueError(f"frames must be [..., H, W, 3] (channels last), got shape {tuple(frames.shape)}")
    lead = frames.shape[:-3]
    # NHWC -> NCHW as a permuted view: the memory stays channels-last, which the CPU convolutions
    # run ~1.5x faster on than a contiguous NCHW copy
    x = frames.reshape(-1, *frames.shape[-3:]).permute(0, 3, 1, 2)
    x = x.float().div_(255.0) if x.dtype == torch.uint8 else x.float()
    if list(x.shape[-2:]) != list(image_size):
        x = F.interpolate(x, size=tuple(image_size), mode="bilinear", align_corners=False, antialias=True)
    return to_color_space(x, color).view(*lead, 3, *image_size)


class DrivingPolicy(nn.Module):
    """Encoder + causal sequence core + head (see the module docstring)."""

    target_mean: torch.Tensor  # buffers: the continuous targets' normalisation
    target_std: torch.Tensor

    def __init__(self, config: PolicyConfig):
        super().__init__()
        self.config = config.validate()
        c = config
        h, w = c.image_size  # validate(): [height, width]
        self.encoder = build_encoder(c.encoder, (h, w), c.feature_dim, c.encoder_dropout)
        features = self.encoder.feature_dim  # an official encoder's map size, else feature_dim
        if c.frame_tokens:
            if features % c.frame_tokens:
                raise ValueError(f"frame_tokens {c.frame_tokens} does not divide the {features} features of a frame")
            self.core = build_core(c.core, features // c.frame_tokens, c.frame_tokens, **c.core_options)
        else:
            self.core = build_core(c.core, features + c.told_features, c.window, **c.core_options)
        self.head = (nn.Linear(self.core.output_dim, c.action_dim) if not c.head_hidden else
                     nn.Sequential(nn.Linear(self.core.output_dim, c.head_hidden), nn.ReLU(),
                                   nn.Linear(c.head_hidden, c.action_dim)))
        mean = c.target_mean if c.target_mean is not None else [0.0] * c.action_dim
        std = c.target_std if c.target_std is not None else [1.0] * c.action_dim
        self.register_buffer("target_mean", torch.tensor(mean, dtype=torch.float32), persistent=False)
        self.register_buffer("target_std", torch.tensor(std, dtype=torch.float32), persistent=False)
        self.precision = "fp32"  # how encode() computes (use_precision); not part of the checkpoint

    def use_precision(self, precision: str) -> "DrivingPolicy":
        """Run the encoder at ``precision`` (fp32 | bf16, as policies.precision.resolve gives it) from now on:
        bf16 autocast on batches of frames, everything after the encoder in fp32 (policies.precision)."""
        if precision not in ("fp32", "bf16"):
            raise ValueError(f"precision must be fp32 or bf16 (resolve auto first), got {precision!r}")
        self.precision = precision
        return self

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    # ------------------------------------------------------------------ pieces
    def encode(self, frames: torch.Tensor | np.ndarray) -> torch.Tensor:
        """Per-frame embeddings: uint8/float ``[B, T, H, W, 3]`` (or already float ``[B, T, 3, h, w]``) ->
        ``[B, T, F]``."""
        if isinstance(frames, torch.Tensor) and frames.is_floating_point() and frames.dim() == 5 \
                and frames.shape[2] == 3 and frames.shape[-1] != 3:
            x = frames.to(self.device)  # already converted (training augments converted frames)
        else:
            if frames.ndim != 5:
                raise ValueError(f"frames must be [B, T, H, W, 3], got shape {tuple(frames.shape)}")
            c = self.config
            if c.crop is not None and tuple(frames.shape[-3:-1]) != tuple(c.image_size):  # raw camera frames
                frames = prepare_frames(torch.as_tensor(frames).cpu().numpy(), c.crop, c.image_size)
            x = frames_to_float(frames, c.image_size, self.device, c.color)
        if runs_bf16(self.precision, x.shape[0] * x.shape[1]):
            with bf16_autocast(x.device):
                return self.encoder(x, channels_last=True).float()
        return self.encoder(x)

    def core_time(self, time: torch.Tensor | None, batch: int, window: int) -> torch.Tensor:
        """Seconds relative to the last frame ``[B, W]`` -> core units (window frames 1 apart). With
        ``time_input`` "index" the core gets window positions whatever the clock said."""
        if time is None or self.config.time_input == "index":
            return torch.arange(1 - window, 1, device=self.device, dtype=torch.float32).expand(batch, window)
        time = torch.as_tensor(time, device=self.device)
        if tuple(time.shape) != (batch, window):
            raise ValueError(f"time must be [B, W]={(batch, window)} seconds, got shape {tuple(time.shape)}")
        return (time / (self.config.frame_period * self.config.frame_stride)).float()

    def raw_from_embeddings(self, emb: torch.Tensor, time: torch.Tensor | None = None,
                            latency: torch.Tensor | float | None = None,
                            on_the_way: torch.Tensor | np.ndarray | None = None) -> torch.Tensor:
        """Head output from a window of embeddings ``[B, W, F]``: logits, or *normalised* actions. ``latency``:
        seconds from the newest frame to the moment the action lands (a float or ``[B]``; None = 0), told to a
        policy with a ``latency_input`` and ignored by one without; ``on_the_way``: the env-unit actions chosen
        but not yet applied, next to land first (``[B, n, A]`` or ``[n, A]``; None = none), shown to a policy
        with ``queue_steps`` (the first ``queue_steps``, zeros past the end) and ignored by one without."""
        B, W = emb.shape[:2]
        time = self.core_time(time, B, W)
        if self.config.latency_input == "clock":
            return self.head(self.core(emb, time, query_time=self.latency_units(latency, B, emb.device)))
        return self.head(self.core(*self.core_sequence(self.core_input(emb, latency, on_the_way), time)))

    def core_sequence(self, x: torch.Tensor, time: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The sequence the core reads and its times: the window itself, or with ``frame_tokens`` N the one frame's
        features ``[B, 1, F]`` cut in order into ``[B, N, F / N]`` (the authors' Udacity model reshapes its conv map
        so), the tokens 1 apart in core time."""
        n = self.config.frame_tokens
        if not n:
            return x, time
        B = x.shape[0]
        return (x.reshape(B, n, x.shape[-1] // n),
                torch.arange(1 - n, 1, device=x.device, dtype=torch.float32).expand(B, n))

    def latency_units(self, latency: torch.Tensor | float | None, batch: int, device: torch.device) -> torch.Tensor:
        """A latency in seconds (float or ``[B]``; None = 0) -> core units ``[B]``, as the window's times."""
        units = torch.as_tensor(0.0 if latency is None else latency, dtype=torch.float32, device=device)
        return units.expand(batch) / (self.config.frame_period * self.config.frame_stride)

    def core_input(self, emb: torch.Tensor, latency: torch.Tensor | float | None = None,
                   on_the_way: torch.Tensor | np.ndarray | None = None) -> torch.Tensor:
        """What the core reads: the embeddings ``[B, W, F]``, and for ``latency_input`` "input" the latency in
        core units (then the ``queue_steps`` actions on their way, flattened) as more features of every frame."""
        c = self.config
        if c.latency_input != "input":
            return emb
        B, W = emb.shape[:2]
        told = [self.latency_units(latency, B, emb.device).view(B, 1)]
        if c.queue_steps:
            told.append(self.queue_features(on_the_way, B, emb.device))
        told_t = torch.cat(told, -1).to(emb.dtype)
        return torch.cat([emb, told_t[:, None].expand(B, W, told_t.shape[-1])], -1)

    def queue_features(self, on_the_way: torch.Tensor | np.ndarray | None, batch: int,
                       device: torch.device) -> torch.Tensor:
        """The actions on their way (``[B, n, A]`` or ``[n, A]`` env units; None = none) -> ``[B, queue_steps * A]``:
        the first ``queue_steps`` of them, zeros past the end."""
        K, A = self.config.queue_steps, self.config.action_dim
        out = torch.zeros(batch, K, A, device=device)
        if on_the_way is not None and len(on_the_way):
            q = torch.as_tensor(on_the_way if isinstance(on_the_way, torch.Tensor) else np.asarray(on_the_way),
                                dtype=torch.float32, device=device)
            q = q.expand(batch, *q.shape) if q.dim() == 2 else q
            if q.dim() != 3 or q.shape[0] != batch or q.shape[-1] != A:
                raise ValueError(f"on_the_way must be [B, n, {A}] or [n, {A}] actions, got shape {tuple(q.shape)}")
            n = min(K, q.shape[1])
            out[:, :n] = q[:, :n]
        return out.view(batch, K * A)

    def forward_raw(self, frames: torch.Tensor, time: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (discrete) or normalised actions (continuous): what the training loss compares."""
        return self.raw_from_embeddings(self.encode(frames), time)

    def postprocess(self, raw: torch.Tensor) -> torch.Tensor:
        if self.config.head == "discrete":
            return raw
        return raw * self.target_std + self.target_mean

    def normalize_target(self, target: torch.Tensor) -> torch.Tensor:
        """Continuous targets in env units -> the normalised space the head regresses."""
        return (target - self.target_mean) / self.target_std

    def forward(self, frames: torch.Tensor, time: torch.Tensor | None = None) -> torch.Tensor:
        """``frames`` uint8|float ``[B, W, H, W, 3]``, ``time`` seconds ``[B, W]`` (last 0) -> logits or actions
        ``[B, out]``."""
        return self.postprocess(self.forward_raw(frames, time))

    def to_env_action(self, output: torch.Tensor | np.ndarray,
                      choose: Callable[[np.ndarray], int] | None = None) -> np.ndarray | int:
        """One step's output ``[out]`` -> env action: clipped float32 array (continuous); discrete: the argmax id,
        or the id ``choose`` picks from the softmax of the logits (``policies.actions.DiscreteChooser``)."""
        out = torch.as_tensor(output).detach().float().cpu().reshape(-1)
        if out.numel() != self.config.action_dim:
            raise ValueError(f"output must have {self.config.action_dim} entries, got shape {tuple(out.shape)}")
        if self.config.head == "discrete":
            if choose is None:
                return int(out.argmax())
            return int(choose(torch.softmax(out.double(), 0).numpy()))
        low, high = np.asarray(self.config.action_low, np.float32), np.asarray(self.config.action_high, np.float32)
        action = np.clip(self.steered(out.numpy().astype(np.float32)), low, high)
        if self.config.fixed_throttle is not None and "throttle" in self.config.action_names:
            action[list(self.config.action_names).index("throttle")] = self.config.fixed_throttle
        return action

    def steered(self, outputs: np.ndarray) -> np.ndarray:
        """Continuous outputs ``[..., out]`` with the steering column times ``config.steer_gain`` (a copy), where
        its magnitude is at least ``config.steer_gain_from``."""
        outputs = np.array(outputs)
        if self.config.steer_gain != 1:
            col = list(self.config.action_names).index("steer")
            steer = outputs[..., col]
            outputs[..., col] = np.where(np.abs(steer) >= self.config.steer_gain_from,
                                         steer * self.config.steer_gain, steer)
        return outputs

    def throttle_for(self, otherwise: float) -> float:
        """The throttle a driver sends beside this policy's steering: ``config.fixed_throttle``, else
        ``otherwise`` (the driver's own rule)."""
        return otherwise if self.config.fixed_throttle is None else float(self.config.fixed_throttle)

    @torch.no_grad()
    def predict_episode(self, frames: np.ndarray, times: np.ndarray | None = None, batch: int = 256,
                        latency: float | None = None) -> np.ndarray:
        """Outputs ``[T, out]`` for a whole recorded episode (frames ``[T, H, W, 3]``, times in seconds), the ones
        ``stream()`` gives stepping through it frame by frame, computed in batches: every frame is encoded once
        and each step's window gathers its embeddings (frame 0 repeats before the start, as in the stream)."""
        self.eval()
        c = self.config
        T = len(frames)
        times = np.arange(T) * c.frame_period if times is None else np.asarray(times, dtype=np.float64)
        emb = torch.cat([self.encode(torch.as_tensor(np.asarray(frames[a:a + batch]))[None])[0]
                         for a in range(0, T, batch)]) if T else torch.zeros(0)
        offsets = c.frame_stride * np.arange(c.window - 1, -1, -1)
        out = []
        for a in range(0, T, batch):
            steps = np.arange(a, min(a + batch, T))
            idx = np.maximum(steps[:, None] - offsets[None], 0)
            rel = torch.from_numpy((times[idx] - times[steps][:, None]).astype(np.float32))
            out.append(self.postprocess(self.raw_from_embeddings(emb[torch.from_numpy(idx)], rel, latency)))
        return torch.cat(out).cpu().numpy() if out else np.zeros((0, c.action_dim), np.float32)

    def stream(self, clock: str = "steps") -> "PolicyStream":
        """A closed-loop runner: ``s = policy.stream(); s.reset(); out = s.step(frame, t)`` (eval mode); ``clock``:
        how the window is picked from the frames received (``PolicyStream``)."""
        return PolicyStream(self, clock)


WINDOW_CLOCKS = ("steps", "time")  # how a stream picks its window from the frames it received (PolicyStream)


class PolicyStream:
    """One frame per control step; caches per-frame embeddings so a step is one CNN pass + one core pass.

    The window ends at the newest frame and reaches back as in training: ``clock="steps"`` takes every
    ``frame_stride``-th of the last ``(window - 1) * frame_stride + 1`` frames received; ``clock="time"`` takes,
    for each of the trained offsets ``k * frame_stride * frame_period`` seconds, the newest frame received at or
    before that time, so when frames arrive late, dropped or irregularly the window still spans the time it was
    trained on (with every frame delivered on the training clock both pick the same frames). Measured against
    the nearest frame (which may be newer than the offset): the same under jitter, fewer lost tracks under drops. At the
    first step after ``reset`` the cache is filled with that frame (and its timestamp), as
    ``agent.training.windows.window_indices`` repeats frame 0 before an episode start. ``t`` defaults to
    ``step_index * frame_period`` (the recorded datasets' clock).
    """

    def __init__(self, policy: DrivingPolicy, clock: str = "steps"):
        if clock not in WINDOW_CLOCKS:
            raise ValueError(f"clock must be one of {WINDOW_CLOCKS}, got {clock!r}")
        self.policy = policy.eval()
        self.clock = clock
        c = policy.config
        self.span = (c.window - 1) * c.frame_stride + 1
        self.cache_len = self.span if clock == "steps" else 2 * self.span - 1  # room for frames faster than trained
        self.reset()

    def reset(self) -> None:
        self.policy.eval()
        self.embeddings: deque[torch.Tensor] = deque(maxlen=self.cache_len)
        self.times: deque[float] = deque(maxlen=self.cache_len)
        self.steps = 0

    def picks(self) -> list[int]:
        """Cache positions of the current window's frames, oldest first (the last is the newest frame)."""
        c = self.policy.config
        n = len(self.times)
        if self.clock == "steps" or n == 1:
            return list(range(n - self.span, n, c.frame_stride))
        times = np.asarray(self.times, dtype=np.float64)
        want = times[-1] - c.frame_stride * c.frame_period * np.arange(c.window - 1, -1, -1)
        # the newest frame received at or before each wanted time (a thousandth of a period absorbs rounding)
        return np.maximum(np.searchsorted(times, want + 1e-3 * c.frame_period, side="right") - 1, 0).tolist()

    def window(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The current window: embeddings ``[1, W, F]`` and seconds relative to the newest frame ``[1, W]``."""
        picks = self.picks()
        times = np.array([self.times[i] for i in picks], dtype=np.float64)
        return (torch.stack([self.embeddings[i] for i in picks])[None],
                torch.from_numpy((times - times[-1]).astype(np.float32))[None])

    @torch.no_grad()
    def step(self, frame: torch.Tensor | np.ndarray, t: float | None = None,
             latency: float | None = None, on_the_way: np.ndarray | None = None) -> torch.Tensor:
        """``frame`` uint8 ``[H, W, 3]`` (t: seconds, optional; latency: seconds until the action lands, for a
        policy told its latency; on_the_way ``[n, A]``: its actions not yet applied, next first, for a policy shown
        them) -> output ``[out]`` (logits or env-unit actions)."""
        if tuple(torch.as_tensor(frame).shape[-1:]) != (3,) or torch.as_tensor(frame).dim() != 3:
            raise ValueError(f"frame must be [H, W, 3], got shape {tuple(torch.as_tensor(frame).shape)}")
        t = self.steps * self.policy.config.frame_period if t is None else float(t)
        emb = self.policy.encode(torch.as_tensor(frame)[None, None])[0, 0]
        if not self.embeddings:
            self.embeddings.extend([emb] * self.cache_len)
            self.times.extend([t] * self.cache_len)
        else:
            self.embeddings.append(emb)
            self.times.append(t)
        self.steps += 1
        window, rel = self.window()
        return self.policy.postprocess(self.policy.raw_from_embeddings(window, rel, latency, on_the_way))[0]


# ----------------------------------------------------------------------------- checkpoints
def save_checkpoint(path: str | Path, policy: DrivingPolicy, **extra: Any) -> Path:
    """Atomically write weights + config (+ ``extra``: metadata, optimizer state, ...) to ``path``.

    Everything is tensors and plain Python data, so the file loads with ``torch.load(weights_only=True)``.
    """
    path = Path(path)
    atomic_write(path, checkpoint_writer(policy, **extra))  # a reader never sees half a checkpoint
    return path


def checkpoint_writer(policy: DrivingPolicy, **extra: Any) -> Callable[[Any], Any]:
    """What ``save_checkpoint`` writes, as a function of the open file: several checkpoints that belong together
    are written at once (common.files.atomic_write_all)."""
    payload = {
        "format": CHECKPOINT_FORMAT,
        "version": CHECKPOINT_VERSION,
        "config": policy.config.to_dict(),
        "state_dict": {k: v.detach().cpu() for k, v in policy.state_dict().items()},
        **extra,
    }
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    return lambda f: f.write(buffer.getbuffer())


_EXPECTED = "expected a .pt file written by train.py (a run folder's best.pt or last.pt)"


def _what_the_file_is(path: Path, error: Exception) -> str:
    """Why ``torch.load(path, weights_only=True)`` failed, in the user's words: one sentence that says what
    the file is not, what was expected and what to do (never torch's own advice to load it unsafely)."""
    import pickle
    import zipfile

    unreadable = "is not a readable driving-policy checkpoint (corrupted, truncated or another binary format)"
    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as z:
                names = set(z.namelist())
        except (zipfile.BadZipFile, OSError):
            names = set()
        if "policy.pth" in names and ("data" in names or "_stable_baselines3_version" in names):
            return (f"{str(path)!r} is a PPO expert (a stable-baselines3 .zip), not a driving-policy checkpoint; "
                    f"evaluate it with python evaluate.py --expert-drives --expert {path}")
        if not any(n.endswith("data.pkl") for n in names):
            return f"{str(path)!r} is a .zip archive, not a driving-policy checkpoint; {_EXPECTED}"
        if isinstance(error, pickle.UnpicklingError):  # a torch.save of arbitrary Python objects
            return (f"{str(path)!r} is a PyTorch file that holds Python objects besides tensors and plain data, so "
                    f"it is not a driving-policy checkpoint and is not loaded; {_EXPECTED}")
        return f"{str(path)!r} {unreadable}; {_EXPECTED}"
    with open(path, "rb") as f:
        head = f.read(4096)
    try:
        head.decode("utf-8")
        utf8 = True
    except UnicodeDecodeError as e:
        utf8 = e.start >= len(head) - 3  # only a character cut at the 4096-byte boundary
    text = utf8 and not any(c < 32 and c not in b"\t\n\f\r" for c in head)
    beside = path.with_suffix(".pt")
    todo = f"did you mean {beside}?" if path.suffix != ".pt" and beside.is_file() else _EXPECTED
    if not head:
        return f"{str(path)!r} is empty, not a driving-policy checkpoint; {todo}"
    if text:
        return f"{str(path)!r} is a text file, not a driving-policy checkpoint; {todo}"
    return f"{str(path)!r} {unreadable}; {todo}"


def not_a_checkpoint_file(path: Path, what: str) -> str:
    """Why ``path`` cannot be read as a checkpoint: missing, or a folder (a run folder given instead of its best.pt)."""
    if not path.is_dir():
        return f"{what} {str(path)!r} does not exist"
    found = sorted(p.name for p in path.glob("*.pt"))
    pick = "best.pt" if "best.pt" in found else (found[0] if found else None)
    hint = f": pass a file in it, e.g. {str(path / pick)!r}" if pick else " (and holds no .pt file)"
    return f"{what} {str(path)!r} is a folder, not a checkpoint file{hint}"


def read_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """The checkpoint's dict, checked to be a policy checkpoint (clear errors otherwise).

    Loads with ``weights_only=True`` only: a file that needs arbitrary Python objects is refused, never unpickled."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(not_a_checkpoint_file(path, "checkpoint"))
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:
        raise ValueError(_what_the_file_is(path, e)) from None
    if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{str(path)!r} is a PyTorch file but not a driving-policy checkpoint (it has no "
                         f"format {CHECKPOINT_FORMAT!r}); {_EXPECTED}")
    if payload.get("version") != CHECKPOINT_VERSION:
        raise ValueError(f"{str(path)!r} is a driving-policy checkpoint of version "
                         f"{payload.get('version')!r}, but this "
                         f"code reads version {CHECKPOINT_VERSION}; train it again with this train.py")
    if not isinstance(payload.get("config"), dict) or not isinstance(payload.get("state_dict"), dict):
        raise ValueError(f"{str(path)!r} is an incomplete driving-policy checkpoint (no config or no state_dict); "
                         f"save it again with train.py")
    return payload


def policy_from_checkpoint(payload: dict[str, Any], where: str = "checkpoint") -> DrivingPolicy:
    try:
        policy = DrivingPolicy(PolicyConfig.from_dict(payload["config"]))
        policy.load_state_dict(payload["state_dict"])
    except (ValueError, TypeError, RuntimeError) as e:
        raise ValueError(f"{where}: cannot rebuild the policy ({str(e).splitlines()[0][:300]})") from None
    return policy


def with_latency_input(policy: DrivingPolicy, queue_steps: int = 0) -> DrivingPolicy:
    """The same policy told its latency as an input feature (and shown ``queue_steps`` of its actions on their
    way): every weight kept, the new inputs' weights 0, so it answers exactly as before until training teaches it
    the latency (fine-tuning a student that was not told, or was told the latency alone)."""
    c = policy.config
    if c.latency_input == "clock" or (c.latency_input == "input" and queue_steps <= c.queue_steps):
        raise ValueError(f"the policy is already told its latency ({c.latency_input}"
                         + (f", {c.queue_steps} actions on their way)" if c.queue_steps else ")"))
    if c.queue_steps:
        raise ValueError(f"the policy is shown {c.queue_steps} actions on their way; it cannot be widened to "
                         f"{queue_steps} (train it from one that is shown none)")
    config = PolicyConfig.from_dict({**c.to_dict(), "latency_input": "input", "queue_steps": queue_steps})
    told = DrivingPolicy(config).to(policy.device)
    added = config.told_features - c.told_features
    old = policy.state_dict()
    state = {}
    for key, new in told.state_dict().items():
        was = old[key]
        if new.shape == was.shape:
            state[key] = was
        elif new.shape[:-1] == was.shape[:-1] and new.shape[-1] == was.shape[-1] + added:  # the core's input layer
            state[key] = torch.cat([was, was.new_zeros(*was.shape[:-1], added)], -1)
        else:  # e.g. a bare nac core, whose sparse wiring is drawn for its input size
            raise ValueError(f"{key} changes shape {tuple(was.shape)} -> {tuple(new.shape)} with {added} more "
                             "inputs: this core cannot keep its weights; train the latency-aware student from scratch")
    told.load_state_dict(state)
    return told


def told_as_input(policy: DrivingPolicy, queue_steps: int = 0) -> DrivingPolicy:
    """``policy`` told its latency as an input and shown ``queue_steps`` actions on their way: itself when it
    already is (or shown more), else widened by ``with_latency_input`` (what ``train.py --init`` and a mix with a
    fine-tune of it both start from)."""
    c = policy.config
    if c.latency_input == "none" or (c.latency_input == "input" and queue_steps > c.queue_steps):
        return with_latency_input(policy, queue_steps)
    return policy


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> DrivingPolicy:
    """Rebuild a policy from its checkpoint file alone (in eval mode)."""
    payload = read_checkpoint(path, map_location)
    return policy_from_checkpoint(payload, f"checkpoint {str(path)!r}").to(map_location).eval()
