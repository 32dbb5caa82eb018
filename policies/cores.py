"""Sequence cores: one interface over a window of frame features, one registry of builders, one policy-name parser.

Every core maps ``x [B, W, F]`` (the window's per-frame features, oldest first, the current frame
last) and ``time [B, W]`` (frame times in *core units*, the last frame at 0 and earlier frames
negative) to ``[B, output_dim]``: its feature for the **last** step. Each core is causal over the
window (the last step may see every earlier frame, nothing else exists), so the policy's answer at
step t never depends on frames after t.

Time unit: the policy divides timestamps (seconds) by ``frame_period * frame_stride`` before calling a
core, so consecutive window frames are 1 unit apart (frames repeated at an episode start are 0
apart). Cores that ignore time (lstm, gru, mha with learned positions, mlp) simply do not read it.

Registry ``CORES`` (``build_core(name, input_dim, window, **options)``). Every core takes ``d_model``
(64), its width; the recurrent cores and the MLP take it as their hidden size unless ``hidden`` /
``units`` overrides it, so one width means the same for every core:

=========  ==========================================================================================
``nac``    Neuronal Attention Circuit (policies.nac.NAC), one causal layer, output at the last step;
           time passed as ``[B, W]`` timestamps (the layer uses t_i - t_j). Options: d_model (64),
           heads (16), mode (exact|euler|steady), topk (8), sparsity (0.5), euler_steps, dropout,
           phi_activation (sigmoid|tanh|identity), logit_scale (False), logit_scale_init (1.0),
           block (**bare**|prenorm), variant (**paper**|official), delta_t (0.5), activation (none|elu).
           ``variant="official"`` (name ``nac-official``) is the function of the authors' public code
           (docs/nac.md, section 13); it reads no frame times, as their experiments call it on x alone (t = 1).
``lstm``   torch LSTM, hidden (= d_model), layers (1).
``gru``    torch GRU, hidden (= d_model), layers (1).
``cfc``    ncps CfC, units (= d_model), cfc_mode (default|pure|no_gate); elapsed time between frames.
``ltc``    ncps LTC (fully connected wiring), units (= d_model // 2, its ODE solver is 6x costlier),
           ode_unfolds (6); elapsed time between frames.
``mha``    nn.MultiheadAttention with a causal mask; d_model (64), heads (4), layers (1), positions
           learned|sinusoidal (sinusoidal of the frame time), block (bare|**prenorm**).
``mlp``    no memory: an MLP on the last frame only (the floor), hidden (= d_model).
=========  ==========================================================================================

Block structure (``block``, the attention cores nac and mha, applied the same way to both):

* ``"bare"``: the attention layer alone, its output (already projected to d_model by the layer's output
  projection) read at the last step. The nac layer maps ``F -> d_model`` itself (its sensory gates);
  mha first maps ``F -> d_model`` with a linear layer plus positions (it has no other notion of order).
* ``"prenorm"``: a pre-norm transformer block, ``h = Linear(x)`` (+ positions for mha), then
  ``h = h + Attn(LN(h))``, ``h = h + FFN(LN(h))`` (FFN: d_model -> 2 d_model -> GELU -> d_model), and a final
  LayerNorm of the last step. The residual path carries the current frame past the attention average.

A nac core without ``block`` is bare (the paper's layer), an mha core without ``block`` is prenorm, so
checkpoints that do not name a block load. The comparison table names the block.

Policy names (``train.py --core``), parsed here only (``parse_core_name``, ``policy_core_options``)::

    CORE[-official][-MODE][+FLAG]...
    CORE   nac | lstm | gru | cfc | ltc | mha | mlp
    -official  nac only: variant "official", the authors' code's function (their Euler defaults: 5 steps of 0.5)
    MODE   nac only: exact | euler | steady          (plain "nac": train.py's --nac-mode)
    FLAG   bare | prenorm                            block structure (nac, mha)
           scale | scale=S                           nac: learnable per-head logit scale, initial value S (1)
           KEY=VALUE                                 any option of the core, e.g. topk=4, heads=8,
                                                     phi_activation=identity, positions=sinusoidal

e.g. ``nac-exact`` (the paper's layer, bare), ``nac-steady+prenorm``, ``nac-exact+prenorm+scale=4``,
``nac-official-steady``, ``mha+bare``, ``gru+hidden=32``. Presets (``PRESETS``): ``nac-focus`` names the NAC variant
that measured best in docs/nac.md. Unknown cores, flags or option names raise ValueError listing the valid ones.

ncps' own sequence loops squeeze ``timespans[:, t]`` to ``[B]``, which broadcasts against the wrong
axis of a ``[B, units]`` state, so the cfc and ltc cores run the ncps *cells* in their own loop with
elapsed time shaped ``[B, 1]``.
"""
from __future__ import annotations

import difflib
import functools
import inspect
import math
from typing import Any, Callable, cast

import torch
import torch.nn as nn

from policies.nac import MODES as NAC_MODES
from policies.nac import OFFICIAL_DEFAULTS
from policies.nac import NAC, attention_stats

BLOCKS = ("bare", "prenorm")
ATTENTION_CORES = ("nac", "mha")


def check_block(block: object) -> str:
    if block not in BLOCKS:
        raise ValueError(f"block must be one of {', '.join(BLOCKS)}; got {block!r}")
    return block


class Core(nn.Module):
    """Base class: ``forward(x [B, W, F], time [B, W]) -> [B, output_dim]``."""

    output_dim: int

    def internals(self, x: torch.Tensor, time: torch.Tensor) -> dict[str, torch.Tensor] | None:
        """Diagnostic tensors for TensorBoard (attention cores); None for cores that have none."""
        return None


def _elapsed(time: torch.Tensor, minimum: float = 1e-2) -> torch.Tensor:
    """Elapsed time before each frame ``[B, W, 1]``: 1 before the first, t_i - t_{i-1} after.

    Repeated frames at an episode start are 0 apart; the floor keeps the LTC's ODE step finite.
    """
    first = torch.ones_like(time[:, :1])
    return torch.cat([first, time.diff(dim=1)], dim=1).clamp(min=minimum).unsqueeze(-1)


class AttentionBlock(nn.Module):
    """The one block structure of every attention core (see the module docstring).

    ``forward(x, attend)``: ``attend`` maps a ``[B, T, d]`` sequence to ``[B, T, d]`` (every step) or
    ``[B, d]`` (the last step only; the residual then keeps the last step only too). ``attn`` (optional)
    is registered as this block's ``attn`` sub-module.
    """

    def __init__(self, d_model: int, block: str, attn: nn.Module | None = None):
        super().__init__()
        self.kind = check_block(block)
        if self.kind == "prenorm":
            self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        if attn is not None:
            self.attn = attn
        if self.kind == "prenorm":
            self.ffn = nn.Sequential(nn.Linear(d_model, 2 * d_model), nn.GELU(), nn.Linear(2 * d_model, d_model))

    def attention_input(self, x: torch.Tensor) -> torch.Tensor:
        """What the attention layer reads: LN(x) in a pre-norm block, x itself in a bare one."""
        return self.norm1(x) if self.kind == "prenorm" else x

    def forward(self, x: torch.Tensor, attend: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        y = attend(self.attention_input(x))
        if self.kind == "bare":
            return y
        if y.dim() < x.dim():
            x = x[:, -1]
        x = x + y
        return x + self.ffn(self.norm2(x))


class NACCore(Core):
    def __init__(self, input_dim: int, window: int, d_model: int = 64, heads: int = 16, mode: str = "exact",
                 topk: int = 8, sparsity: float = 0.5, euler_steps: int = 6, dropout: float = 0.0,
                 seed: int = 22222, block: str = "bare", logit_scale: bool = False,
                 logit_scale_init: float = 1.0, phi_activation: str = "sigmoid", variant: str = "paper",
                 delta_t: float = 0.5, activation: str = "none"):
        super().__init__()
        self.block_kind = check_block(block)
        if block == "prenorm":
            self.inp = nn.Linear(input_dim, d_model)
        self.nac = NAC(d_model if block == "prenorm" else input_dim, d_model, heads, mode=mode, topk=topk,
                       sparsity=sparsity, euler_steps=euler_steps, dropout=dropout, causal=True,
                       return_sequences=False, seed=seed, logit_scale=logit_scale,
                       logit_scale_init=logit_scale_init, phi_activation=phi_activation, variant=variant,
                       delta_t=delta_t, activation=activation)
        self.reads_time = variant != "official"  # the authors' experiments call their layer on x alone: t = 1
        if block == "prenorm":
            self.block = AttentionBlock(d_model, block)
            self.norm = nn.LayerNorm(d_model)
        self.output_dim = d_model

    def forward(self, x: torch.Tensor, time: torch.Tensor | None,
                query_time: torch.Tensor | None = None) -> torch.Tensor:
        """``query_time`` [B]: the moment the last step's answer is for, when not its frame's (NAC's clock)."""
        if not self.reads_time:
            if query_time is not None:
                raise ValueError("the nac-official core reads no clock (query_time); tell it the latency as an input")
            time = None
        if self.block_kind == "bare":
            return self.nac(x, time=time, query_time=query_time)
        h = self.block(self.inp(x), lambda z: self.nac(z, time=time, query_time=query_time))
        return self.norm(h)

    @torch.no_grad()
    def internals(self, x: torch.Tensor, time: torch.Tensor) -> dict[str, torch.Tensor]:
        """The layer's internals with every step as a query (causal), so the attention map covers the whole
        window, plus ``attention_stats`` (0-dim "entropy", "entropy_norm", "max_weight", "uniform_max_weight")
        and, with a logit scale, "logit_scale" ``[H]``."""
        z = x if self.block_kind == "bare" else self.block.attention_input(self.inp(x))
        self.nac.return_sequences = True
        try:
            _, internals = self.nac(z, time=time if self.reads_time else None, return_internals=True)
        finally:
            self.nac.return_sequences = False
        internals.update(attention_stats(internals["attn"], internals["index"]))
        if self.nac.logit_scales is not None:
            internals["logit_scale"] = self.nac.logit_scales.detach()
        return internals


class RNNCore(Core):
    def __init__(self, input_dim: int, window: int, kind: str = "lstm", hidden: int | None = None,
                 layers: int = 1, d_model: int = 64):
        super().__init__()
        hidden = hidden or d_model
        self.rnn = {"lstm": nn.LSTM, "gru": nn.GRU}[kind](input_dim, hidden, num_layers=layers, batch_first=True)
        self.output_dim = hidden

    def forward(self, x: torch.Tensor, time: torch.Tensor) -> torch.Tensor:
        return self.rnn(x)[0][:, -1]


class ContinuousTimeCellCore(Core):
    """An ncps cell stepped over the window, each step told the time elapsed since the previous frame."""

    cell: nn.Module
    units: int

    def forward(self, x: torch.Tensor, time: torch.Tensor) -> torch.Tensor:
        elapsed = _elapsed(time)
        h = x.new_zeros(x.shape[0], self.units)
        for t in range(x.shape[1]):
            out, h = self.cell(x[:, t], h, elapsed[:, t])
        return out


class CfCCore(ContinuousTimeCellCore):
    def __init__(self, input_dim: int, window: int, units: int | None = None, cfc_mode: str = "default",
                 d_model: int = 64):
        super().__init__()
        from ncps.torch import CfC

        units = units or d_model
        self.cell = CfC(input_dim, units, mode=cfc_mode).rnn_cell
        self.units = self.output_dim = units


class LTCCore(ContinuousTimeCellCore):
    def __init__(self, input_dim: int, window: int, units: int | None = None, ode_unfolds: int = 6,
                 d_model: int = 64):
        super().__init__()
        from ncps.torch import LTC

        units = units or max(2, d_model // 2)
        self.cell = LTC(input_dim, units, ode_unfolds=ode_unfolds).rnn_cell
        self.units = self.output_dim = units


def sinusoidal(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """Transformer sinusoids of real-valued positions ``[B, W]`` -> ``[B, W, dim]``."""
    freqs = torch.exp(torch.arange(0, dim, 2, device=positions.device, dtype=positions.dtype)
                      * (-math.log(10000.0) / dim))
    angles = positions.unsqueeze(-1) * freqs
    return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(-2)[..., :dim]


class MHABlock(AttentionBlock):
    """nn.MultiheadAttention with a causal mask inside an AttentionBlock (prenorm: x + MHA(LN x), x + FFN(LN x))."""

    def __init__(self, d_model: int, heads: int, dropout: float, block: str = "prenorm"):
        super().__init__(d_model, block, nn.MultiheadAttention(d_model, heads, dropout=dropout, batch_first=True))

    # the block binds its own attention: its callers pass the causal mask, not an attend function
    def forward(self, x: torch.Tensor, causal_mask: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return super().forward(x, lambda h: self.attn(h, h, h, attn_mask=causal_mask, need_weights=False)[0])


class MHACore(Core):
    causal_mask: torch.Tensor  # a buffer

    def __init__(self, input_dim: int, window: int, d_model: int = 64, heads: int = 4, layers: int = 1,
                 positions: str = "learned", dropout: float = 0.0, block: str = "prenorm"):
        super().__init__()
        if positions not in ("learned", "sinusoidal"):
            raise ValueError(f"mha positions must be 'learned' or 'sinusoidal', got {positions!r}")
        if d_model % heads:
            raise ValueError(f"mha heads must divide d_model; got d_model={d_model}, heads={heads}")
        self.block_kind = check_block(block)
        self.positions, self.d_model, self.window = positions, d_model, window
        self.inp = nn.Linear(input_dim, d_model)
        if positions == "learned":
            self.pos = nn.Parameter(torch.randn(window, d_model) * 0.02)
        self.blocks = nn.ModuleList(MHABlock(d_model, heads, dropout, block) for _ in range(layers))
        if block == "prenorm":
            self.norm = nn.LayerNorm(d_model)
        self.register_buffer("causal_mask", torch.triu(torch.ones(window, window, dtype=torch.bool), 1),
                             persistent=False)
        self.output_dim = d_model

    def _embed(self, x: torch.Tensor, time: torch.Tensor) -> torch.Tensor:
        W = x.shape[1]
        if W != self.window:
            raise ValueError(f"mha core was built for window {self.window}, got {W} frames")
        pos = self.pos if self.positions == "learned" else sinusoidal(time, self.d_model)
        return self.inp(x) + pos

    def forward(self, x: torch.Tensor, time: torch.Tensor) -> torch.Tensor:
        h = self._embed(x, time)
        for block in self.blocks:
            h = block(h, self.causal_mask)
        return self.norm(h[:, -1]) if self.block_kind == "prenorm" else h[:, -1]

    @torch.no_grad()
    def internals(self, x: torch.Tensor, time: torch.Tensor) -> dict[str, torch.Tensor]:
        """The last block's per-head causal attention as NAC-style ``attn``/``index`` ``[B, H, W, W]``
        (index -1 on future keys) plus ``attention_stats``."""
        h = self._embed(x, time)
        for block in self.blocks[:-1]:
            h = block(h, self.causal_mask)
        last = cast(MHABlock, self.blocks[-1])
        z = last.attention_input(h)
        attn = last.attn(z, z, z, attn_mask=self.causal_mask, need_weights=True,
                         average_attn_weights=False)[1]  # [B, H, W, W]
        W = x.shape[1]
        index = torch.arange(W, device=x.device).expand_as(attn).masked_fill(self.causal_mask, -1)
        internals = {"attn": attn.masked_fill(index < 0, 0.0), "index": index}
        internals.update(attention_stats(internals["attn"], index))
        return internals


class MLPCore(Core):
    def __init__(self, input_dim: int, window: int, hidden: int | None = None, d_model: int = 64):
        super().__init__()
        hidden = hidden or d_model
        self.net = nn.Sequential(nn.Linear(input_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())
        self.output_dim = hidden

    def forward(self, x: torch.Tensor, time: torch.Tensor) -> torch.Tensor:
        return self.net(x[:, -1])


CORES: dict[str, Callable[..., Core]] = {
    "nac": NACCore,
    "lstm": functools.partial(RNNCore, kind="lstm"),
    "gru": functools.partial(RNNCore, kind="gru"),
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


# ----------------------------------------------------------------------------- policy names
# a preset is a name for a full policy name; nac-focus is the variant that measured best (docs/nac.md)
PRESETS: dict[str, str] = {"nac-focus": "nac-exact+prenorm+scale=64"}
FLAGS = ("bare", "prenorm", "scale", "scale=S", "KEY=VALUE")


def core_parameters(core: str) -> dict[str, inspect.Parameter]:
    """The keyword options a registry core takes (not input_dim, window, or the rnn's fixed kind)."""
    params = dict(inspect.signature(CORES[core]).parameters)
    for name in ("input_dim", "window", "kind"):
        params.pop(name, None)
    return params


def _value(text: str) -> Any:
    """'4' -> 4, '0.5' -> 0.5, 'true'/'false' -> bool, anything else stays a string."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def valid_policy_names() -> list[str]:
    return list(CORES) + [f"nac-{m}" for m in NAC_MODES] + ["nac-official"] + list(PRESETS)


def _unknown(name: str, why: str = "") -> ValueError:
    head, valid = name.split("+")[0], valid_policy_names()
    close = [] if head in valid else difflib.get_close_matches(head, valid, n=1)
    return ValueError(f"unknown policy {name!r}{f' ({why})' if why else ''}; valid policies: "
                      f"{', '.join(valid)}, each optionally followed by +FLAGs "
                      f"({' | '.join(FLAGS)}), e.g. nac-steady+prenorm+scale"
                      + (f"; did you mean {close[0]}?" if close else ""))


def parse_core_name(name: str) -> tuple[str, dict[str, Any]]:
    """A policy name (grammar in the module docstring) -> (registry core, the options the name sets).

    ``"nac-euler"`` -> ("nac", {"mode": "euler"}); ``"mha+bare"`` -> ("mha", {"block": "bare"});
    ``"nac-official-steady"`` -> ("nac", {"variant": "official", "mode": "steady"});
    ``"nac-exact+prenorm+scale=4"`` -> ("nac", {"mode": "exact", "block": "prenorm", "logit_scale": True,
    "logit_scale_init": 4.0}); a plain core name -> (name, {}). ValueError on anything else.
    """
    if not isinstance(name, str) or not name.strip():
        raise _unknown(str(name))
    name = PRESETS.get(name.strip(), name.strip())
    head, *flags = name.split("+")
    core, _, mode = head.partition("-")
    if core not in CORES:
        raise _unknown(name)
    options: dict[str, Any] = {}
    if head in PRESETS:  # a preset is a whole name: its flags are already chosen
        raise _unknown(name, f"{head} is {PRESETS[head]} and takes no +FLAGs; write {PRESETS[head]}+FLAG")
    if core == "nac" and mode.partition("-")[0] == "official":  # nac-official[-MODE]
        options["variant"], mode = "official", mode.partition("-")[2]
    if mode:
        modes = f"{', '.join(NAC_MODES)}, and the preset{'s' if len(PRESETS) > 1 else ''} {', '.join(PRESETS)}"
        if core != "nac":
            raise _unknown(name, f"{core} takes no -MODE; the nac modes are {modes}")
        if mode not in NAC_MODES:
            raise _unknown(name, f"'-{mode}' is not a nac mode; nac's modes: {modes}")
        options["mode"] = mode
    known = core_parameters(core)

    def put(key: str, value: Any) -> None:
        if key not in known:
            raise _unknown(name, f"core {core!r} has no option {key!r}; its options: {', '.join(known)}")
        if key in options:
            raise _unknown(name, f"{key!r} is set twice")
        options[key] = value

    for flag in flags:
        key, eq, text = flag.partition("=")
        if not key:
            raise _unknown(name, "empty flag")
        if key in BLOCKS and not eq:
            if core not in ATTENTION_CORES:
                raise _unknown(name, f"+{key} is a block structure of the attention cores "
                                     f"{', '.join(ATTENTION_CORES)}")
            put("block", key)
        elif key == "scale":
            put("logit_scale", True)
            if eq:
                scale = _value(text)
                if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
                    raise _unknown(name, f"+scale=S needs a number S > 0, got {text!r}")
                put("logit_scale_init", float(scale))
        elif eq and text:
            put(key, _value(text))
        else:
            raise _unknown(name, f"unknown flag +{flag}")
    return core, options


def policy_core_options(name: str, *, d_model: int = 64, heads: int = 16, topk: int = 8, sparsity: float = 0.5,
                        nac_mode: str = "exact", hidden: int | None = None, seed: int = 22222
                        ) -> tuple[str, dict[str, Any]]:
    """A policy name plus the run's shared settings -> (core, every option of the core), the name winning.

    One width for all: ``d_model`` is every core's width; ``hidden`` (when given) overrides it for the
    recurrent cores and the MLP (the LTC takes half of it). ``heads`` is NAC's head count (mha uses 4);
    ``nac_mode`` is the mode of a plain ``nac``. Attention cores always get an explicit ``block`` (their
    default), so a checkpoint records which structure it has.
    """
    core, named = parse_core_name(name)
    width = {} if hidden is None else {"hidden": hidden}
    presets: dict[str, dict[str, Any]] = {
        "nac": {"d_model": d_model, "heads": heads, "mode": nac_mode, "topk": topk, "sparsity": sparsity,
                "seed": seed, "block": "bare"},
        "mha": {"d_model": d_model, "heads": 4, "block": "prenorm"},
        "lstm": {"d_model": d_model, **width}, "gru": {"d_model": d_model, **width},
        "cfc": {"d_model": d_model, **({"units": hidden} if hidden else {})},
        "ltc": {"d_model": d_model, **({"units": max(2, hidden // 2)} if hidden else {})},
        "mlp": {"d_model": d_model, **width},
    }
    base = presets[core]
    if named.get("variant") == "official":
        base.update(OFFICIAL_DEFAULTS)
    return core, {**base, **named}


def block_of(name: str) -> str | None:
    """The block structure a policy name trains ("bare"/"prenorm"); None for non-attention cores."""
    core, options = parse_core_name(name)
    if core not in ATTENTION_CORES:
        return None
    return options.get("block", core_parameters(core)["block"].default)
