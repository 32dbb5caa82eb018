"""The NAC layer's maths written the plain way, to check the optimised layer against (tests/policies/test_nac.py)."""

import math

import torch

import policies.nac as nac_module
from policies.nac import NAC


def reference_nac(layer: NAC, x, time=None, key_padding_mask=None, index=None):
    """The layer's maths written the plain way (docs/nac.md): concatenated pairs p = [q_i; k_j], torch.tanh,
    explicit masks, per-head weights picked by head, no folding, no layout tricks. ``index`` [B, H, Tq, K]
    (-1 = filler) is the selection to use (top-K is checked on its own below). Returns (y, internals)."""
    B, T, _ = x.shape
    H, dh, bb = layer.num_heads, layer.d_head, layer.backbone
    qkv = x @ (layer.sensory.weight * layer.sensory.mask) + layer.sensory.bias
    q, k, v = (qkv[..., i * layer.d_model:(i + 1) * layer.d_model].view(B, T, H, dh).transpose(1, 2) for i in range(3))
    valid_key = torch.ones(B, T, dtype=torch.bool) if key_padding_mask is None else ~key_padding_mask
    if layer.return_sequences:
        q_pos = torch.arange(T).expand(B, T)
    else:
        q_pos = torch.stack([torch.nonzero(r).max() if r.any() else torch.tensor(T - 1) for r in valid_key])[:, None]
        q = q.gather(2, q_pos[:, None, :, None].expand(B, H, 1, dh))
    valid = index >= 0
    j = index.clamp(min=0)
    k_sel = k[torch.arange(B)[:, None, None, None], torch.arange(H)[None, :, None, None], j]  # [B, H, Tq, K, dh]
    v_sel = v[torch.arange(B)[:, None, None, None], torch.arange(H)[None, :, None, None], j]
    p = torch.cat([q[:, :, :, None, :].expand_as(k_sel), k_sel], -1)  # the pair, [B, H, Tq, K, 2 dh]

    def per_head(name):  # a backbone tensor [G, a, b] -> [H, a, b] (G = 1 for a shared backbone)
        w = getattr(bb, name)
        return w.expand(H, *w.shape[1:])

    def affine(h, weight, bias):  # h [B, H, Tq, K, a] times the head's weight [H, a, b], plus bias [H, 1, b]
        return torch.einsum("bhqka,hac->bhqkc", h, weight) + bias[None, :, None]

    W = {n: per_head(f"w_{n}") * per_head(f"mask_{n}") for n in ("inter", "command", "recurrent", "motor")}
    inter = torch.tanh(affine(p, W["inter"], per_head("b_inter")))
    drive = affine(inter, W["command"], per_head("b_command"))
    command = torch.tanh(drive)
    for _ in range(nac_module.COMMAND_UNROLL):
        command = torch.tanh(drive + affine(command, W["recurrent"], torch.zeros(H, 1, 1)))
    motor = torch.tanh(affine(command, W["motor"], per_head("b_motor")))
    heads = affine(motor, per_head("w_heads"), per_head("b_heads"))
    phi = {"sigmoid": torch.sigmoid, "tanh": torch.tanh, "identity": lambda z: z}[bb.phi_activation](heads[..., 0])
    omega = torch.nn.functional.softplus(heads[..., 1]) + bb.tau_epsilon
    alpha_beta = affine(p, per_head("w_time"), per_head("b_time"))
    if time is None:
        tau = torch.ones(())
    elif time.dim() == 1:
        tau = time.to(x.dtype).view(B, 1, 1, 1)
    else:
        t_query = time.gather(1, q_pos)[:, None, :, None]
        tau = (t_query - time.gather(1, j.flatten(1)).view(j.shape)).to(x.dtype)
    t = torch.sigmoid(alpha_beta[..., 0] * tau + alpha_beta[..., 1])
    if layer.mode == "exact":
        a = phi / omega * (1 - torch.exp(-omega * t))
    elif layer.mode == "steady":
        a = phi / omega
    else:
        a, h = torch.zeros_like(phi), t / layer.euler_steps
        for _ in range(layer.euler_steps):
            a = a + h * (phi - omega * a)
    scale = 1.0 if layer.log_logit_scale is None else layer.log_logit_scale.exp().view(1, H, 1, 1)
    logits = a.masked_fill(~valid, -math.inf)
    empty = ~valid.any(-1, keepdim=True)
    attn = torch.softmax((a * scale).masked_fill(~valid, -math.inf).masked_fill(empty, 0.0), -1).masked_fill(~valid, 0)
    context = layer.dt * (attn[..., None] * v_sel).sum(-2)  # [B, H, Tq, dh]
    y = layer.out_proj(context.transpose(1, 2).reshape(B, -1, layer.d_model)).masked_fill(empty[:, 0], 0.0)
    y = y if layer.return_sequences else y[:, 0]
    return y, {"phi": phi, "omega": omega, "t": t, "logits": logits, "attn": attn}
