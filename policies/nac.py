"""Neuronal Attention Circuit (NAC): attention whose logits solve a gated linear ODE.

    1. Sensory gates    q, k, v = S_q(x), S_k(x), S_v(x)     masked linear maps, NCP sensory wiring
    2. Top-K curation   each query i keeps its K best keys j_1..j_K by the score q_i . k_j  (policies/topk.py)
    3. Pair backbone    h = Backbone([q_i; k_j])               masked NCP net inter -> command -> motor
                        phi = act(W_phi h), omega = softplus(W_omega h) + eps
                        t_ij = sigmoid(alpha(p) * tau_ij + beta(p))   internal time
    4. Logit ODE        da/dt = -omega a + phi, a(0) = 0, read at t_ij  (exact / euler / steady)
    5. Output           o_i = dt * sum_k softmax_k(a_ik) v_{j_k}; heads concatenated; linear projection

With its default arguments this layer is the paper's; options that depart from it are off by default.
``variant="official"`` is instead the function the authors' public code computes (``OfficialPairStage``):
dense q/k/v, phi and omega from one learnable scalar, time gates shared by the heads, Euler in fixed steps
of ``delta_t``, padded keys' logits multiplied by 0, an optional output activation.
docs/nac.md is the method section: every numerical choice (selection, filler slots, masking, init), the
departures with the measurements behind them, what each implementation choice here saves, and how the
official variant differs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from common.checks import is_int
from policies import nac_native
from policies.topk import Selection, select_blocks, select_exact, select_pairwise
from policies.wiring import backbone_masks, backbone_sizes, check_sparsity, sensory_mask

MODES = ("exact", "euler", "steady")
PHI_ACTIVATIONS = ("sigmoid", "tanh", "identity")
SELECTIONS = ("auto", "exact", "blocks")
VARIANTS = ("paper", "official")  # the paper's text | the authors' public code (docs/nac.md, section 13)
OFFICIAL_DEFAULTS = {"euler_steps": 5, "delta_t": 0.5}  # the authors' layer's defaults where they differ from ours
ACTIVATIONS = ("none", "elu")  # on the layer's output (the authors' Udacity model uses elu)
COMMAND_UNROLL = 1  # passes of the command layer's recurrent synapses
AUTO_BLOCK_THRESHOLD = 1024  # selection="auto" uses block selection when T_k exceeds this


# ----------------------------------------------------------------------------- configuration
@dataclass
class NACConfig:
    """Every constructor argument of :class:`NAC`, validated in one place."""

    input_dim: int
    d_model: int
    num_heads: int
    mode: str = "exact"
    topk: int = 8
    sparsity: float = 0.5
    euler_steps: int = 6
    dt: float = 1.0
    tau_epsilon: float = 1e-6
    phi_activation: str = "sigmoid"
    selection: str = "auto"
    causal: bool = False
    dropout: float = 0.0
    return_sequences: bool = True
    shared_backbone: bool = False
    seed: int = 22222
    logit_scale: bool = False
    logit_scale_init: float = 1.0
    variant: str = "paper"
    delta_t: float = 0.5  # variant "official" only: its Euler step (the paper's text steps t / euler_steps)
    activation: str = "none"

    def validate(self) -> None:
        def positive_int(name: str) -> None:
            value = getattr(self, name)
            if not is_int(value, 1):
                raise ValueError(f"{name} must be an integer >= 1; got {value!r}")

        for name in ("input_dim", "d_model", "num_heads", "topk", "euler_steps"):
            positive_int(name)
        if self.d_model % self.num_heads:
            raise ValueError(
                f"num_heads must divide d_model; got d_model={self.d_model}, num_heads={self.num_heads}")
        if self.d_model < 2:
            raise ValueError(f"d_model must be >= 2 (an NCP needs two inter neurons); got {self.d_model}")
        check_mode(self.mode)
        check_choice("phi_activation", self.phi_activation, PHI_ACTIVATIONS)
        check_choice("selection", self.selection, SELECTIONS)
        check_sparsity(self.sparsity)
        check_choice("variant", self.variant, VARIANTS)
        check_choice("activation", self.activation, ACTIVATIONS)
        if self.variant == "official" and self.phi_activation != "sigmoid":
            raise ValueError(f"variant official computes phi = sigmoid(c); phi_activation must be sigmoid, "
                             f"got {self.phi_activation!r}")
        for name in ("dt", "delta_t"):
            value = getattr(self, name)
            if isinstance(value, bool) or not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0; got {value!r}")
        if not (isinstance(self.tau_epsilon, (int, float)) and math.isfinite(self.tau_epsilon)
                and self.tau_epsilon > 0):
            raise ValueError(f"tau_epsilon must be a finite number > 0 (omega must stay positive); "
                             f"got {self.tau_epsilon!r}")
        if not (isinstance(self.dropout, (int, float)) and 0.0 <= self.dropout < 1.0):
            raise ValueError(f"dropout must be a number in [0, 1); got {self.dropout!r}")
        if not isinstance(self.logit_scale, bool):
            raise ValueError(f"logit_scale must be True or False; got {self.logit_scale!r}")
        if not (isinstance(self.logit_scale_init, (int, float)) and not isinstance(self.logit_scale_init, bool)
                and math.isfinite(self.logit_scale_init) and self.logit_scale_init > 0):
            raise ValueError(f"logit_scale_init must be a finite number > 0; got {self.logit_scale_init!r}")


def check_choice(name: str, value: object, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}; got {value!r}")
    return value


def check_mode(mode: object) -> str:
    return check_choice("mode", mode, MODES)


# ----------------------------------------------------------------------------- masked layers
def _lecun_uniform_(weight: torch.Tensor, mask: torch.Tensor, generator: torch.Generator) -> None:
    """U(-sqrt(3/fan_in), +) per output unit, fan_in counted under the mask (weight/mask [..., in, out])."""
    fan_in = mask.sum(-2, keepdim=True).clamp(min=1).to(weight.dtype)
    with torch.no_grad():
        weight.uniform_(-1.0, 1.0, generator=generator).mul_(torch.sqrt(3.0 / fan_in) * mask)


class MaskedLinear(nn.Module):
    """``y = x @ (W * M) + b`` with a fixed bool mask ``M`` [in, out] (one NCP synapse per True)."""

    mask: torch.Tensor  # a buffer

    def __init__(self, mask: torch.Tensor, generator: torch.Generator):
        super().__init__()
        self.register_buffer("mask", mask.float())
        self.weight = nn.Parameter(torch.empty(mask.shape))
        self.bias = nn.Parameter(torch.zeros(mask.shape[-1]))
        _lecun_uniform_(self.weight, self.mask, generator)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight * self.mask).view(
            *x.shape[:-1], -1)


class PairBackbone(nn.Module):
    """The NCP backbone on pairs p = [q; k], one masked network per head, batched as [H, in, out].

    ``token_features`` runs the layers that are linear in p (inter pre-activation, alpha, beta) once per
    token; ``forward`` finishes them per pair and returns (phi, omega, t).
    """

    def __init__(self, d_head: int, num_heads: int, sparsity: float, seed: int, shared: bool,
                 phi_activation: str, tau_epsilon: float, generator: torch.Generator):
        super().__init__()
        self.d_head, self.phi_activation, self.tau_epsilon = d_head, phi_activation, tau_epsilon
        self.num_heads = num_heads
        self.sizes = backbone_sizes(2 * d_head)
        wirings = [backbone_masks(2 * d_head, sparsity, seed + 3 + h) for h in range(1 if shared else num_heads)]
        for name in ("inter", "command", "recurrent", "motor"):
            mask = torch.stack([w[name] for w in wirings]).float()  # [H or 1, in, out]
            self.register_buffer(f"mask_{name}", mask)
            weight = nn.Parameter(torch.empty(mask.shape))
            _lecun_uniform_(weight, mask, generator)
            setattr(self, f"w_{name}", weight)
        G, S = len(wirings), self.sizes
        self.b_inter = nn.Parameter(torch.zeros(G, 1, S.inter))
        self.b_command = nn.Parameter(torch.zeros(G, 1, S.command))
        self.b_motor = nn.Parameter(torch.zeros(G, 1, S.motor))
        # alpha, beta: dense affine maps of the pair (internal time), and the two gate heads
        self.w_time = nn.Parameter(torch.empty(G, 2 * d_head, 2))
        self.b_time = nn.Parameter(torch.zeros(G, 1, 2))
        self.w_heads = nn.Parameter(torch.empty(G, S.motor, 2))  # [:, :, 0] phi, [:, :, 1] omega
        self.b_heads = nn.Parameter(torch.zeros(G, 1, 2))
        _lecun_uniform_(self.w_time, torch.ones_like(self.w_time), generator)
        _lecun_uniform_(self.w_heads, torch.ones_like(self.w_heads), generator)

    def folded(self) -> "_Folded":
        """The weights in the sigmoid form of ``forward``, expanded to [H, in, out].

        Recomputed on every call under autograd (so gradients reach the parameters); under ``no_grad``
        cached until a parameter or mask changes (in place or replaced), which saves streaming ~20 small ops.
        """
        tensors = (*self.parameters(), *self.buffers())
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            return self._fold()
        key = tuple((t.data_ptr(), t._version, t.dtype, t.device) for t in tensors)
        if getattr(self, "_folded_key", None) != key:
            self._folded_cache, self._folded_key = self._fold(), key
        return self._folded_cache

    def _fold(self) -> "_Folded":
        H, d = self.num_heads, self.d_head

        def masked(name: str) -> torch.Tensor:
            return getattr(self, f"w_{name}") * getattr(self, f"mask_{name}")

        def twice(weight: torch.Tensor, bias: torch.Tensor | float) -> tuple[torch.Tensor, torch.Tensor]:
            """Transposed (4W, 2(b - 1^T W)): twice the pre-activation of a layer whose input tanh = 2s - 1
            is given as s."""
            return (4.0 * weight).transpose(1, 2).expand(H, -1, -1), \
                (2.0 * (bias - weight.sum(1, keepdim=True))).transpose(1, 2)

        w_token = torch.cat([2.0 * masked("inter"), self.w_time], dim=-1).transpose(1, 2).expand(H, -1, -1)
        w_command, b_command = twice(masked("command"), self.b_command)
        w_recurrent, b_recurrent = twice(masked("recurrent"), 0.0)  # the recurrent synapses have no bias
        w_motor, b_motor = twice(masked("motor"), self.b_motor)
        return _Folded(  # the gate heads read tanh = 2s - 1 as well
            w_token[..., :d], w_token[..., d:], torch.cat([2.0 * self.b_inter, self.b_time], dim=-1).transpose(1, 2),
            w_command, b_command, w_recurrent, b_recurrent, w_motor, b_motor,
            (2.0 * self.w_heads).transpose(1, 2).expand(H, -1, -1),
            (self.b_heads - self.w_heads.sum(1, keepdim=True)).transpose(1, 2))

    def token_features(self, q: torch.Tensor, k: torch.Tensor, w: "_Folded") -> tuple[torch.Tensor, torch.Tensor]:
        """Query-side and key-side halves of the pair's affine layers, feature-major.

        ``q`` [H, d_head, Nq], ``k`` [H, d_head, Nk] -> [H, inter + 2, Nq], [H, inter + 2, Nk]: the inter
        rows hold *twice* the pre-activation (the sigmoid form of ``forward``), the last two alpha and beta;
        the biases ride on the query side.
        """
        return torch.baddbmm(w.b_token, w.w_query, q), torch.bmm(w.w_key, k)

    def forward(self, pre: torch.Tensor, tau: torch.Tensor | float, w: "_Folded") -> tuple[torch.Tensor, ...]:
        """``pre`` [H, inter + 2, P] summed pair halves (``token_features``) -> phi, omega, t: [H, P] each.

        Sigmoid form: each tanh layer keeps ``s = sigmoid(2z) = (tanh(z) + 1) / 2`` and the next layer reads
        ``tanh(z) = 2s - 1`` through weights ``2W`` and bias ``b - 1^T W``, so a layer is one ``baddbmm`` and
        one sigmoid (the same function as tanh; only round-off differs). Feature-major ([H, features, P]):
        every matmul has the P pairs as its long output dimension. ``tau`` broadcasts to [H, P].
        """
        u, time = pre.split([self.sizes.inter, 2], dim=1)
        drive = torch.baddbmm(w.b_command, w.w_command, torch.sigmoid(u))  # twice the command drive
        s = torch.sigmoid(drive)
        if COMMAND_UNROLL:  # c = tanh(drive + W_cc c)
            drive = drive + w.b_recurrent
            for _ in range(COMMAND_UNROLL):
                s = torch.baddbmm(drive, w.w_recurrent, s).sigmoid_()
        s = torch.baddbmm(w.b_motor, w.w_motor, s).sigmoid_()
        phi, omega = torch.baddbmm(w.b_heads, w.w_heads, s).unbind(1)
        phi = {"sigmoid": torch.sigmoid, "tanh": torch.tanh, "identity": lambda z: z}[self.phi_activation](phi)
        omega = F.softplus(omega) + self.tau_epsilon
        alpha, beta = time.unbind(1)
        t = torch.sigmoid(alpha * tau + beta)
        return phi, omega, t


class _Folded(NamedTuple):
    """``PairBackbone.folded()``: the backbone's weights in sigmoid form, transposed: [H, out, in], [H, out, 1]."""

    w_query: torch.Tensor
    w_key: torch.Tensor
    b_token: torch.Tensor
    w_command: torch.Tensor
    b_command: torch.Tensor
    w_recurrent: torch.Tensor
    b_recurrent: torch.Tensor
    w_motor: torch.Tensor
    b_motor: torch.Tensor
    w_heads: torch.Tensor
    b_heads: torch.Tensor


class OfficialPairStage(nn.Module):
    """The pair stage of the authors' public code (variant "official"), with ``PairBackbone``'s interface.

    Their backbone runs one step of an NCP cell from a zero state on a length-1 sequence per pair, and the
    motor neuron it reads has no input synapse: its output is one constant c per layer, whatever the pair
    (their kernels get zero gradient). So phi = sigmoid(c) and omega = softplus(c) + eps for every head, pair
    and sample, c one learnable scalar here (theirs is bias * output_w + output_b). The internal time
    t = sigmoid(alpha * tau + beta) keeps alpha and beta affine in the pair p = [q; k]: one pair of maps shared
    by every head.
    """

    def __init__(self, d_head: int, num_heads: int, tau_epsilon: float, generator: torch.Generator):
        super().__init__()
        self.d_head, self.num_heads, self.tau_epsilon = d_head, num_heads, tau_epsilon
        self.gate = nn.Parameter(torch.zeros(()))  # c; theirs starts at 0 too (a zero bias)
        self.w_time = nn.Parameter(torch.empty(1, 2 * d_head, 2))  # [:, :, 0] alpha, [:, :, 1] beta
        self.b_time = nn.Parameter(torch.zeros(1, 1, 2))
        _lecun_uniform_(self.w_time, torch.ones_like(self.w_time), generator)

    def folded(self) -> "_TimeWeights":
        w = self.w_time.transpose(1, 2).expand(self.num_heads, -1, -1)  # [H, 2, 2 d_head], the same for every head
        return _TimeWeights(w[..., :self.d_head], w[..., self.d_head:], self.b_time.transpose(1, 2))

    def token_features(self, q: torch.Tensor, k: torch.Tensor, w: "_TimeWeights") -> tuple[torch.Tensor, torch.Tensor]:
        """Query-side and key-side halves of alpha and beta: [H, 2, Nq], [H, 2, Nk] (biases on the query side)."""
        return torch.baddbmm(w.b_token, w.w_query, q), torch.bmm(w.w_key, k)

    def forward(self, pre: torch.Tensor, tau: torch.Tensor | float, w: "_TimeWeights") -> tuple[torch.Tensor, ...]:
        """``pre`` [H, 2, P] summed pair halves -> phi, omega, t: [H, P] each (phi, omega one value, expanded)."""
        alpha, beta = pre.unbind(1)
        t = torch.sigmoid(alpha * tau + beta)
        phi = torch.sigmoid(self.gate).expand_as(t)
        omega = (F.softplus(self.gate) + self.tau_epsilon).expand_as(t)
        return phi, omega, t


class _TimeWeights(NamedTuple):
    """``OfficialPairStage.folded()``: the time gates' weights, [H, 2, d_head] per side and [1, 2, 1] biases."""

    w_query: torch.Tensor
    w_key: torch.Tensor
    b_token: torch.Tensor


class _PairInputs(torch.autograd.Function):
    """The key side and v of every pair, gathered, with the query side added to the key side's features:
    ``keys`` [H, F, N], ``query`` [H, Fq, M], ``rows`` [H, K, M] -> [H, F, K*M]. One native pass where
    ``policies.nac_native`` is built (bit-identical to the torch ops it replaces, ~1.5x faster), otherwise
    a gather and a broadcast add; the backward is torch's in both cases."""

    @staticmethod
    def forward(ctx, keys: torch.Tensor, query: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        (H, F, N), (Fq, K, M) = keys.shape, (query.shape[1], *rows.shape[1:])
        ctx.save_for_backward(rows)
        ctx.sizes = (N, Fq)
        out = nac_native.gather_pairs(keys, query, rows)
        if out is None:
            out = keys.gather(2, rows.reshape(H, 1, K * M).expand(-1, F, -1))
            out[:, :Fq] += query[:, :, None, :].expand(-1, -1, K, -1).reshape(H, Fq, K * M)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (rows,), (N, Fq) = ctx.saved_tensors, ctx.sizes
        H, F, P = grad.shape
        K, M = rows.shape[1:]
        keys_grad = grad.new_zeros(H, F, N).scatter_add_(2, rows.reshape(H, 1, P).expand(-1, F, -1), grad)
        return keys_grad, grad[:, :Fq].reshape(H, Fq, K, M).sum(2), None


# ----------------------------------------------------------------------------- diagnostics
@torch.no_grad()
def attention_stats(attn: torch.Tensor, index: torch.Tensor) -> dict[str, torch.Tensor]:
    """How focused the attention is: 0-dim tensors "entropy" (nats), "entropy_norm", "max_weight".

    ``attn``/``index`` are the layer's internals ``[B, H, Tq, K]`` (index -1 = filler slot). Per query and
    head: the entropy ``-sum_k w_k log w_k`` over its valid slots, that entropy divided by ``log n`` (n = its
    number of valid keys: 1.0 is uniform, 0.0 all weight on one key) and its largest weight. Each is the
    mean over batch, heads and the queries with at least two valid keys (a query with one key has no
    choice to make: entropy 0, weight 1); NaN when no query has two. Uniform attention over n keys has
    max weight 1/n, so compare ``max_weight`` with the mean of 1/n over the same queries.
    """
    valid = index >= 0
    n = valid.sum(-1)
    p = attn.float().masked_fill(~valid, 0.0)
    entropy = -(p * torch.log(p.clamp(min=torch.finfo(p.dtype).tiny))).sum(-1)
    keep = n >= 2
    norm = entropy / torch.log(n.clamp(min=2).to(p.dtype))
    return {"entropy": entropy[keep].mean(), "entropy_norm": norm[keep].mean(),
            "max_weight": p.amax(-1)[keep].mean(), "uniform_max_weight": (1.0 / n[keep].to(p.dtype)).mean()}


def _pair_time(time: torch.Tensor | None, query_time: torch.Tensor | None, q_pos: torch.Tensor,
               index: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | float:
    """The ODE's time per pair, laid out like ``index`` [H, K, B, Tq] and flattened to [H or 1, K*B*Tq]: 1 without
    timestamps; a per-sample time [B] for every pair of the sample; else the elapsed time t_query - t_key,
    differenced in the timestamps' dtype (``query_time`` [B] replaces the query's own stamp)."""
    H, K, B, Tq = index.shape
    if time is None:
        return 1.0
    if time.dim() == 1:
        return time.to(dtype).view(1, 1, B, 1).expand(1, K, B, Tq).reshape(1, -1)
    t_query = time.gather(1, q_pos) if query_time is None else query_time.to(time.dtype)[:, None]  # [B, Tq]
    t_key = time.gather(1, index.permute(2, 0, 1, 3).reshape(B, -1)).view(B, H, K, Tq).permute(1, 2, 0, 3)
    return (t_query - t_key).to(dtype).reshape(H, -1)


# ----------------------------------------------------------------------------- the layer
class NAC(nn.Module):
    """Neuronal Attention Circuit layer: ``[B, T, input_dim] -> [B, T, d_model]`` (or ``[B, d_model]``).

    Modes share every parameter: set ``layer.mode = "steady"`` on a trained layer to switch.
    ``forward(x, time=None, key_padding_mask=None, return_internals=False)``; with
    ``return_internals=True`` returns ``(y, internals)``, internals a dict of ``[B, H, Tq, K]`` tensors
    "phi", "omega", "t", "logits", "attn", "index" (filler slots: docs/nac.md, section 7).

    ``variant="official"``: the authors' public code's function (module docstring; ``delta_t`` is its Euler
    step). There a padded key stays selectable and its logit is multiplied by 0, and ``return_sequences=False``
    returns the last position, as theirs does.
    """

    def __init__(self, input_dim: int, d_model: int, num_heads: int, *, mode: str = "exact", topk: int = 8,
                 sparsity: float = 0.5, euler_steps: int = 6, dt: float = 1.0, tau_epsilon: float = 1e-6,
                 phi_activation: str = "sigmoid", selection: str = "auto", causal: bool = False,
                 dropout: float = 0.0, return_sequences: bool = True, shared_backbone: bool = False,
                 seed: int = 22222, logit_scale: bool = False, logit_scale_init: float = 1.0,
                 variant: str = "paper", delta_t: float = 0.5, activation: str = "none"):
        super().__init__()
        self.config = NACConfig(
            input_dim=input_dim, d_model=d_model, num_heads=num_heads, mode=mode, topk=topk, sparsity=sparsity,
            euler_steps=euler_steps, dt=dt, tau_epsilon=tau_epsilon, phi_activation=phi_activation,
            selection=selection, causal=causal, dropout=dropout, return_sequences=return_sequences,
            shared_backbone=shared_backbone, seed=seed, logit_scale=logit_scale, logit_scale_init=logit_scale_init,
            variant=variant, delta_t=delta_t, activation=activation)
        self.config.validate()
        self.input_dim, self.d_model, self.num_heads = input_dim, d_model, num_heads
        self.d_head = d_model // num_heads
        self._mode = mode
        self.topk, self.euler_steps, self.dt = topk, euler_steps, float(dt)
        self.selection, self.causal, self.return_sequences = selection, causal, return_sequences
        self.official, self.delta_t, self.activation = variant == "official", float(delta_t), activation

        generator = torch.Generator().manual_seed(seed)
        dense = 0.0 if self.official else sparsity  # the authors' q/k/v cells read every input, whatever the sparsity
        qkv_mask = torch.cat([sensory_mask(input_dim, d_model, dense, seed + i) for i in range(3)], dim=1)
        self.sensory = MaskedLinear(qkv_mask, generator)  # 1. sensory gates q | k | v
        self.backbone = (  # 3. the pair stage
            OfficialPairStage(self.d_head, num_heads, tau_epsilon, generator) if self.official
            else PairBackbone(self.d_head, num_heads, sparsity, seed, shared_backbone, phi_activation, tau_epsilon,
                              generator))
        self.attn_dropout = nn.Dropout(dropout)
        self.out_proj = nn.Linear(d_model, d_model)  # 5. output projection
        with torch.no_grad():
            bound = 1.0 / math.sqrt(d_model)
            self.out_proj.weight.uniform_(-bound, bound, generator=generator)
            self.out_proj.bias.zero_()
        # departure 1 (off by default): a learnable per-head scale s_h = exp(log_logit_scale_h) > 0 of the logits
        if logit_scale:
            self.log_logit_scale = nn.Parameter(torch.full((num_heads,), math.log(logit_scale_init)))
        else:
            self.register_parameter("log_logit_scale", None)

    @property
    def logit_scales(self) -> torch.Tensor | None:
        """The per-head logit scales ``[H]`` (None when the layer has none, i.e. the paper's scale 1)."""
        return None if self.log_logit_scale is None else self.log_logit_scale.exp()

    @property
    def mode(self) -> str:
        return self._mode

    @mode.setter
    def mode(self, value: str) -> None:
        self._mode = check_mode(value)

    def extra_repr(self) -> str:
        c = self.config
        return (f"input_dim={c.input_dim}, d_model={c.d_model}, num_heads={c.num_heads}, mode={self.mode}, "
                f"topk={self.topk}, sparsity={c.sparsity}, selection={self.selection}, causal={self.causal}"
                + (f", logit_scale=True (init {c.logit_scale_init:g})" if c.logit_scale else "")
                + (f", variant=official, delta_t={c.delta_t:g}" if self.official else "")
                + (f", activation={c.activation}" if c.activation != "none" else ""))

    # ------------------------------------------------------------------ input checks
    def _check_inputs(self, x: torch.Tensor, time: torch.Tensor | None,
                      key_padding_mask: torch.Tensor | None) -> None:
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.input_dim:
            got: tuple[int, ...] | str = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"x must be a tensor [B, T, input_dim={self.input_dim}]; got shape {got}")
        if not x.is_floating_point():
            raise ValueError(f"x must be a floating-point tensor; got dtype {x.dtype}")
        B, T, _ = x.shape
        if T < 1:
            raise ValueError(f"x must have at least one time step; got shape {tuple(x.shape)}")
        if time is not None and (not isinstance(time, torch.Tensor) or tuple(time.shape) not in ((B,), (B, T))):
            got = tuple(time.shape) if isinstance(time, torch.Tensor) else type(time).__name__
            raise ValueError(f"time must be None, a tensor [B]={(B,)} or [B, T]={(B, T)}; got {got}")
        if key_padding_mask is not None and (
                not isinstance(key_padding_mask, torch.Tensor) or key_padding_mask.dtype != torch.bool
                or tuple(key_padding_mask.shape) != (B, T)):
            got = (f"shape {tuple(key_padding_mask.shape)}, dtype {key_padding_mask.dtype}"
                   if isinstance(key_padding_mask, torch.Tensor) else type(key_padding_mask).__name__)
            raise ValueError(f"key_padding_mask must be a bool tensor [B, T]={(B, T)} (True = padded); got {got}")

    # ------------------------------------------------------------------ forward
    def select(self, q: torch.Tensor, k: torch.Tensor, key_valid: torch.Tensor, q_pos: torch.Tensor) -> Selection:
        """2. Top-K curation by the configured scheme."""
        Tk = k.shape[2]
        if self.topk >= Tk:
            return select_pairwise(key_valid, q_pos, self.causal, self.num_heads)
        blocks = self.selection == "blocks" or (self.selection == "auto" and Tk > AUTO_BLOCK_THRESHOLD)
        return (select_blocks if blocks else select_exact)(q, k, key_valid, q_pos, self.causal, self.topk)

    def ode_logits(self, phi: torch.Tensor, omega: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """4. The logit a(t) of da/dt = -omega a + phi, a(0) = 0, in the current mode."""
        if self.mode == "steady":
            return phi / omega
        if self.mode == "exact":
            return phi * -torch.expm1(-omega * t) / omega
        h = self.delta_t if self.official else t / self.euler_steps  # the authors' code steps delta_t, ignoring t
        a = torch.zeros_like(phi)
        for _ in range(self.euler_steps):
            a = a + h * (phi - omega * a)
        return a

    def forward(self, x: torch.Tensor, time: torch.Tensor | None = None,
                key_padding_mask: torch.Tensor | None = None, return_internals: bool = False,
                query_time: torch.Tensor | None = None):
        self._check_inputs(x, time, key_padding_mask)
        if query_time is not None and (time is None or time.dim() != 2 or self.return_sequences
                                       or tuple(query_time.shape) != (x.shape[0],)):
            raise ValueError("query_time [B] needs time [B, T] and one query per sample (return_sequences False)")
        B, T, _ = x.shape
        H, dh = self.num_heads, self.d_head
        key_valid = (torch.ones(B, T, dtype=torch.bool, device=x.device)
                     if key_padding_mask is None or self.official else ~key_padding_mask)

        # 1. sensory gates, all steps at once: [B, H, T, d_head] each
        q, k, v = self.sensory(x).view(B, T, 3, H, dh).permute(2, 0, 3, 1, 4)
        if self.return_sequences:
            q_pos = torch.arange(T, device=x.device).expand(B, T)
        else:  # the last valid step of each sample (T-1 when nothing is padded or all is)
            last = T - 1 - key_valid.flip(1).to(torch.uint8).argmax(1)
            q_pos = last[:, None]
            q = q.gather(2, q_pos[:, None, :, None].expand(B, H, 1, dh))
        Tq = q_pos.shape[1]

        # 2. top-K keys per query
        sel = self.select(q, k, key_valid, q_pos)  # [B, H, Tq, K]
        K = sel.index.shape[-1]
        # the pairs are laid out [H, K, B, Tq] (head-major, then slot-major: reductions over the K slots run
        # along an outer axis, which vectorises); filler slots read key 0 as a placeholder
        index = sel.index.clamp(min=0).permute(1, 3, 0, 2)
        invalid = ~sel.valid.permute(1, 3, 0, 2)

        # 3. pair backbone, head-major and feature-major ([H, features, tokens or pairs]: one bmm per layer
        # whatever B is, the pairs as the long dimension): per-token halves of the affine layers, the key side
        # gathered once together with v
        def feature_major(z: torch.Tensor) -> torch.Tensor:  # [B, H, N, d_head] -> [H, d_head, B*N]
            return z.permute(1, 3, 0, 2).reshape(H, dh, -1)  # (a view for the sensory outputs: no copy)

        folded = self.backbone.folded()
        # each backbone takes back what its own folded() gave; mypy cannot pair the members of the two unions
        q_side, k_side = self.backbone.token_features(feature_major(q), feature_major(k),
                                                      folded)  # type: ignore[arg-type]
        keys = torch.cat([k_side, feature_major(v)], dim=1)  # [H, inter + 2 + d_head, B*T]
        rows = index + (torch.arange(B, device=x.device) * T).view(1, 1, B, 1)  # [H, K, B, Tq] into B*T
        pre, v_sel = _PairInputs.apply(keys, q_side, rows.reshape(H, K, B * Tq)).split(
            [keys.shape[1] - dh, dh], dim=1)  # [H, features, K*B*Tq]

        tau = _pair_time(time, query_time, q_pos, index, x.dtype)
        phi, omega, t = (z.view(H, K, B, Tq) for z in self.backbone(pre, tau, folded))

        # 4. logits from the ODE, softmax over the selected keys (-inf on filler slots); with logit_scale the
        # softmax reads s_h * a (s_h > 0 keeps -inf at -inf), "logits" stays the ODE's a
        # (scaled before masking: d(-inf * s)/ds would be -inf * 0 = NaN)
        ode = self.ode_logits(phi, omega, t)
        if self.official and key_padding_mask is not None:  # the authors' mask multiplies the selected keys' logits
            kept = (~key_padding_mask).to(ode.dtype).gather(1, index.permute(2, 0, 1, 3).reshape(B, -1))
            ode = ode * kept.view(B, H, K, Tq).permute(1, 2, 0, 3)
        logits = ode.masked_fill(invalid, -math.inf)
        scaled = logits if self.log_logit_scale is None else (
            ode * self.log_logit_scale.exp().view(H, 1, 1, 1)).masked_fill(invalid, -math.inf)
        empty = invalid.all(1, keepdim=True)  # a query without any valid key (the same for every head)
        attn = torch.softmax(scaled.masked_fill(empty, 0.0), dim=1).masked_fill(invalid, 0.0)
        attn = self.attn_dropout(attn)

        # 5. quadrature of the attention-weighted values, heads concatenated, projection
        context = self.dt * (attn.view(H, 1, K, B * Tq) * v_sel.view(H, dh, K, B * Tq)).sum(2)  # [H, dh, B*Tq]
        y = self.out_proj(context.view(H, dh, B, Tq).permute(2, 3, 0, 1).reshape(B, Tq, self.d_model))
        if self.activation == "elu":
            y = F.elu(y)
        y = y.masked_fill(empty[0, 0, :, :, None], 0.0)
        if not self.return_sequences:
            y = y[:, 0]
        if not return_internals:
            return y
        phi, omega, t, logits, attn = (z.permute(2, 0, 3, 1) for z in (phi, omega, t, logits, attn))
        internals = {"phi": phi, "omega": omega, "t": t, "logits": logits, "attn": attn, "index": sel.index}
        return y, internals
