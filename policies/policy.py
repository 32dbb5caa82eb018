"""The driving policy: frame encoder -> sequence core -> action head, and its streaming. Its config is
``policies.config``, the frames' way in ``policies.frames``, its checkpoints ``policies.checkpoint``.

    frames [B, W, H, W, 3] --frames_to_float--> [B, W, 3, h, w] --encoder--> [B, W, F]
        --core (causal, last step)--> [B, C] --head--> logits [B, 5] | normalised actions [B, A]

* ``PolicyConfig`` is plain data (JSON round trip); a checkpoint stores it beside the weights, so the
  file alone rebuilds its policy (``policies.checkpoint.load_checkpoint``), LeRobot style.
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

from collections import deque
from collections.abc import Callable

import numpy as np
import torch
import torch.nn as nn

from policies.config import PolicyConfig
from policies.cores import build_core
from policies.encoders import build_encoder
from policies.frames import frames_to_float, prepare_frames
from policies.precision import bf16_autocast, runs_bf16


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
    trained on (with every frame delivered on the training clock both pick the same frames). Not the nearest frame,
    which may be newer than the offset: that drove no better under jitter and lost more tracks under drops. At the
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
