"""Sequence cores: one interface over a window of frame features, one registry of builders.

Every core maps ``x [B, W, F]`` (the window's per-frame features, oldest first, the current frame
last) and ``time [B, W]`` (frame times in *core units*, the last frame at 0 and earlier frames
negative) to ``[B, output_dim]``: its feature for the **last** step. Each core is causal over the
window (the last step may see every earlier frame, nothing else exists), so the policy's answer at
step t never depends on frames after t.

Time unit: the policy divides timestamps (seconds) by ``frame_period * frame_stride`` before calling a
core, so consecutive window frames are 1 unit apart (frames repeated at an episode start are 0
apart). Cores that ignore time (lstm, gru, mha with learned positions, mlp) simply do not read it.

Registry ``CORES`` (``build_core(name, input_dim, window, **options)``):

=========  ==========================================================================================
``nac``    Neuronal Attention Circuit (policies.nac.NAC), causal, output at the last step; time
           passed as ``[B, W]`` timestamps (the layer uses t_i - t_j). Options: d_model (64),
           heads (16), mode (exact|euler|steady), topk (8), sparsity (0.5), euler_steps, dropout.
``lstm``   torch LSTM, hidden (64), layers (1).
``gru``    torch GRU, hidden (64), layers (1).
``cfc``    ncps CfC, units (64), cfc_mode (default|pure|no_gate); elapsed time between frames.
``ltc``    ncps LTC (fully connected wiring), units (32), ode_unfolds (6); elapsed time between frames.
``mha``    one pre-norm transformer block of nn.MultiheadAttention with a causal mask; d_model (64),
           heads (4), layers (1), positions learned|sinusoidal (sinusoidal of the frame time).
``mlp``    no memory: an MLP on the last frame only (the floor), hidden (64).
=========  ==========================================================================================

ncps' own sequence loops squeeze ``timespans[:, t]`` to ``[B]``, which broadcasts against the wrong
axis of a ``[B, units]`` state, so the cfc and ltc cores run the ncps *cells* in their own loop with
elapsed time shaped ``[B, 1]``.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn as nn

from policies.nac import NAC


class Core(nn.Module):
    """Base class: ``forward(x [B, W, F], time [B, W]) -> [B, output_dim]``."""

    output_dim: int

    def internals(self, x: torch.Tensor, time: torch.Tensor) -> dict[str, torch.Tensor] | None:
        """Diagnostic tensors for TensorBoard (NAC only); None for cores that have none."""
        return None


def _elapsed(time: torch.Tensor, minimum: float = 1e-2) -> torch.Tensor:
    """Elapsed time before each frame ``[B, W, 1]``: 1 before the first, t_i - t_{i-1} after.

    Repeated frames at an episode start are 0 apart; the floor keeps the LTC's ODE step finite.
    """
    first = torch.ones_like(time[:, :1])
    return torch.cat([first, time.diff(dim=1)], dim=1).clamp(min=minimum).unsqueeze(-1)


class NACCore(Core):
    def __init__(self, input_dim: int, window: int, d_model: int = 64, heads: int = 16, mode: str = "exact",
                 topk: int = 8, sparsity: float = 0.5, euler_steps: int = 6, dropout: float = 0.0,
                 seed: int = 22222):
        super().__init__()
        self.nac = NAC(input_dim, d_model, heads, mode=mode, topk=topk, sparsity=sparsity,
                       euler_steps=euler_steps, dropout=dropout, causal=True, return_sequences=False, seed=seed)
        self.output_dim = d_model

    def forward(self, x: torch.Tensor, time: torch.Tensor) -> torch.Tensor:
        return self.nac(x, time=time)

    @torch.no_grad()
    def internals(self, x: torch.Tensor, time: torch.Tensor) -> dict[str, torch.Tensor]:
        """Internals with every step as a query (causal), so the attention map covers the whole window."""
        self.nac.return_sequences = True
        try:
            _, internals = self.nac(x, time=time, return_internals=True)
        finally:
            self.nac.return_sequences = False
        return internals


class RNNCore(Core):
    def __init__(self, input_dim: int, window: int, kind: str = "lstm", hidden: int = 64, layers: int = 1):
        super().__init__()
        self.rnn = {"lstm": nn.LSTM, "gru": nn.GRU}[kind](input_dim, hidden, num_layers=layers, batch_first=True)
        self.output_dim = hidden

    def forward(self, x: torch.Tensor, time: torch.Tensor) -> torch.Tensor:
        return self.rnn(x)[0][:, -1]


class CfCCore(Core):
    def __init__(self, input_dim: int, window: int, units: int = 64, cfc_mode: str = "default"):
        super().__init__()
        from ncps.torch import CfC

        self.cell = CfC(input_dim, units, mode=cfc_mode).rnn_cell
        self.units = self.output_dim = units

    def forward(self, x: torch.Tensor, time: torch.Tensor) -> torch.Tensor:
        elapsed = _elapsed(time)
        h = x.new_zeros(x.shape[0], self.units)
        for t in range(x.shape[1]):
            out, h = self.cell(x[:, t], h, elapsed[:, t])
        return out


class LTCCore(Core):
    def __init__(self, input_dim: int, window: int, units: int = 32, ode_unfolds: int = 6):
        super().__init__()
        from ncps.torch import LTC

        self.cell = LTC(input_dim, units, ode_unfolds=ode_unfolds).rnn_cell
        self.units = self.output_dim = units

    def forward(self, x: torch.Tensor, time: torch.Tensor) -> torch.Tensor:
        elapsed = _elapsed(time)
        h = x.new_zeros(x.shape[0], self.units)
        for t in range(x.shape[1]):
            out, h = self.cell(x[:, t], h, elapsed[:, t])
        return out


def sinusoidal(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """Transformer sinusoids of real-valued positions ``[B, W]`` -> ``[B, W, dim]``."""
    freqs = torch.exp(torch.arange(0, dim, 2, device=positions.device, dtype=positions.dtype)
                      * (-math.log(10000.0) / dim))
    angles = positions.unsqueeze(-1) * freqs
    return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(-2)[..., :dim]


class MHABlock(nn.Module):
    """Pre-norm transformer block: x + MHA(LN x) with a causal mask, then x + FFN(LN x)."""

    def __init__(self, d_model: int, heads: int, dropout: float):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.attn = nn.MultiheadAttention(d_model, heads, dropout=dropout, batch_first=True)
        self.ffn = nn.Sequential(nn.Linear(d_model, 2 * d_model), nn.GELU(), nn.Linear(2 * d_model, d_model))

    def forward(self, x: torch.Tensor, causal_mask: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, attn_mask=causal_mask, need_weights=False)[0]
        return x + self.ffn(self.norm2(x))


class MHACore(Core):
    def __init__(self, input_dim: int, window: int, d_model: int = 64, heads: int = 4, layers: int = 1,
                 positions: str = "learned", dropout: float = 0.0):
        super().__init__()
        if positions not in ("learned", "sinusoidal"):
            raise ValueError(f"mha positions must be 'learned' or 'sinusoidal', got {positions!r}")
        if d_model % heads:
            raise ValueError(f"mha heads must divide d_model; got d_model={d_model}, heads={heads}")
        self.positions, self.d_model, self.window = positions, d_model, window
        self.inp = nn.Linear(input_dim, d_model)
        if positions == "learned":
            self.pos = nn.Parameter(torch.randn(window, d_model) * 0.02)
        self.blocks = nn.ModuleList(MHABlock(d_model, heads, dropout) for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)
        self.register_buffer("causal_mask", torch.triu(torch.ones(window, window, dtype=torch.bool), 1),
                             persistent=False)
        self.output_dim = d_model

    def forward(self, x: torch.Tensor, time: torch.Tensor) -> torch.Tensor:
        W = x.shape[1]
        if W != self.window:
            raise ValueError(f"mha core was built for window {self.window}, got {W} frames")
        pos = self.pos if self.positions == "learned" else sinusoidal(time, self.d_model)
        h = self.inp(x) + pos
        for block in self.blocks:
            h = block(h, self.causal_mask)
        return self.norm(h[:, -1])


class MLPCore(Core):
    def __init__(self, input_dim: int, window: int, hidden: int = 64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(input_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())
        self.output_dim = hidden

    def forward(self, x: torch.Tensor, time: torch.Tensor) -> torch.Tensor:
        return self.net(x[:, -1])


CORES: dict[str, Callable[..., Core]] = {
    "nac": NACCore,
    "lstm": lambda input_dim, window, **o: RNNCore(input_dim, window, kind="lstm", **o),
    "gru": lambda input_dim, window, **o: RNNCore(input_dim, window, kind="gru", **o),
    "cfc": CfCCore,
    "ltc": LTCCore,
    "mha": MHACore,
    "mlp": MLPCore,
}


def build_core(name: str, input_dim: int, window: int, **options) -> Core:
    """Core by registry name; ValueError naming the valid names / the bad option."""
    if name not in CORES:
        raise ValueError(f"unknown core {name!r}; valid cores: {', '.join(CORES)}")
    try:
        return CORES[name](input_dim, window, **options)
    except TypeError as e:  # an option this core does not take
        raise ValueError(f"core {name!r}: bad options {options}: {e}") from None
