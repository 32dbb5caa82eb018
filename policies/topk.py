"""Top-K selection for the NAC layer: which K keys each query is paired with (``policies.nac``, step 2).

Three selections: ``select_pairwise`` (K >= T, every visible key), ``select_exact`` (full score rows, in chunks,
or the native fused kernel) and ``select_blocks`` (square-root block selection, O(T sqrt(T))). Its own module
because it is a job of its own: from q, k, the padding and the positions it returns key indices, with no
weights and no gradient (the choice is not differentiable), and it is where most of the layer's speed work lives
(chunked scoring, reused buffers, the native kernels of ``policies.nac_native``); the layer
(``policies.nac.NAC.select``) only chooses which selection runs. The method: docs/nac.md, section 3.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from policies import nac_native

BLOCK_MARGIN = 1  # extra key blocks kept by block selection, beyond the guaranteed minimum
CHUNK_ELEMENTS = 1 << 22  # exact selection scores queries in chunks of about this many scores
BLOCK_CHUNK_ELEMENTS = 1 << 20  # block selection gathers about this many key floats per chunk (4 MB)


@dataclass
class Selection:
    """The K keys each query is paired with: ``index`` [B, H, Tq, K] (-1 = filler), ``valid`` bool."""

    index: torch.Tensor
    valid: torch.Tensor


SCORE_CLAMP = 1e15  # |k| bound for selection scores: d_head * 1 * 1e15 cannot overflow float32


def _scoring_inputs(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Overflow-proof stand-ins for q and k with the same per-query ranking of q . k.

    Each query row is divided by its own max-abs (a positive per-row scale: ranking unchanged, and it
    depends on that query only, so causality holds); keys are clamped elementwise (changes nothing below
    1e15). Scores then stay finite without a pass over the T x T matrix.
    """
    q = q / q.abs().amax(-1, keepdim=True).clamp(min=torch.finfo(q.dtype).tiny)
    return q, k.clamp(-SCORE_CLAMP, SCORE_CLAMP)


def _finish(scores: torch.Tensor, positions: torch.Tensor | None, k: int) -> Selection:
    """Top-k of -inf-masked scores; -inf winners become filler slots."""
    native = nac_native.topk_rows(scores, k)
    values, top = native if native is not None else scores.topk(k, dim=-1)
    return _selection(values, top if positions is None else positions.gather(-1, top))


def _selection(values: torch.Tensor, index: torch.Tensor) -> Selection:
    """The top-K values and key indices as a Selection: -inf winners become filler slots."""
    valid = values != -math.inf  # (a NaN score from NaN inputs still marks a visible key)
    return Selection(index.masked_fill(~valid, -1), valid)


def _chunks(total: int, per_item: int, budget: int = CHUNK_ELEMENTS) -> list[slice]:
    """Slices of ``total`` items with about ``budget`` elements each (``per_item`` elements per item)."""
    step = max(1, budget // max(per_item, 1))
    return [slice(i, min(i + step, total)) for i in range(0, total, step)]


def visible_keys(key_valid: torch.Tensor, q_pos: torch.Tensor, causal: bool) -> torch.Tensor:
    """bool [B, 1, Tq, Tk]: key j is visible to the query at position i (not padded; j <= i if causal)."""
    visible = key_valid[:, None, None, :]
    if causal:
        positions = torch.arange(key_valid.shape[1], device=key_valid.device)
        visible = visible & (positions <= q_pos[:, None, :, None])
    return visible


def select_pairwise(key_valid: torch.Tensor, q_pos: torch.Tensor, causal: bool, num_heads: int) -> Selection:
    """topk >= T (NAC-PW): every query is paired with every key, in position order."""
    B, Tk = key_valid.shape
    visible = visible_keys(key_valid, q_pos, causal).expand(B, num_heads, q_pos.shape[1], Tk)
    index = torch.arange(Tk, device=key_valid.device).expand_as(visible)
    return Selection(index.masked_fill(~visible, -1), visible)


@torch.no_grad()
def select_exact(q: torch.Tensor, k: torch.Tensor, key_valid: torch.Tensor, q_pos: torch.Tensor,
                 causal: bool, topk: int) -> Selection:
    """Full q.k score rows (queries in chunks), -inf on invisible keys, top K per row.

    Where every key is valid (no padding; causal or not) the native fused kernel scores and selects in one
    pass without the score matrix (``nac_native.scores_topk``); otherwise, or where it is not built, the
    score rows are computed with matmul and masked, and their top K taken.
    """
    Tq, Tk = q.shape[2], k.shape[2]
    q, k = _scoring_inputs(q, k)
    all_valid = bool(key_valid.all())
    if all_valid:
        lengths = (q_pos + 1).clamp(max=Tk) if causal else None  # causal: query i sees keys 0..i
        fused = nac_native.scores_topk(q, k, lengths, topk)
        if fused is not None:
            return _selection(*fused)
    k_t = k.transpose(-1, -2).contiguous()
    needs_mask = causal or not all_valid
    B, H = q.shape[:2]
    chunks = _chunks(Tq, B * H * Tk)
    # several chunks: one score buffer for all of them. A fresh 16 MB tensor per chunk, freed while the chunk's
    # small results stay, ratchets glibc's heap up (T = 16384: 0.8-1.7 GB of RSS instead of 0.2, by its arenas).
    # One chunk: a plain matmul (matmul into out= is several times slower on small batched products).
    buffer = q.new_empty(B * H * (chunks[0].stop - chunks[0].start) * Tk) if len(chunks) > 1 else None
    parts = []
    for c in chunks:
        rows = c.stop - c.start
        out = None if buffer is None else buffer[: B * H * rows * Tk].view(B, H, rows, Tk)
        scores = torch.matmul(q[:, :, c], k_t, out=out)
        if needs_mask:
            scores.masked_fill_(~visible_keys(key_valid, q_pos[:, c], causal), -math.inf)
        parts.append(_finish(scores, None, topk))
    if len(parts) == 1:
        return parts[0]
    return Selection(torch.cat([p.index for p in parts], 2), torch.cat([p.valid for p in parts], 2))


@torch.no_grad()
def select_blocks(q: torch.Tensor, k: torch.Tensor, key_valid: torch.Tensor, q_pos: torch.Tensor,
                  causal: bool, topk: int) -> Selection:
    """Square-root block selection, O(T sqrt(T)) time and memory (docs/nac.md, section 3)."""
    B, H, Tq, d = q.shape
    Tk = k.shape[2]
    # compact: valid keys first (stable), so each query's visible keys are a prefix of length n
    order = torch.sort((~key_valid).to(torch.uint8), dim=1, stable=True).indices  # [B, Tk]
    counts = key_valid.long().cumsum(1)
    n = counts.gather(1, q_pos) if causal else counts[:, -1:].expand(B, Tq)  # [B, Tq]
    q, k = _scoring_inputs(q, k)
    k = k.gather(2, order[:, None, :, None].expand(B, H, Tk, d))

    b = math.ceil(math.sqrt(Tk))
    nb = math.ceil(Tk / b)
    k = F.pad(k, (0, 0, 0, nb * b - Tk))
    prefix = k.view(B, H, nb, b, d).cumsum(3)  # within-block prefix sums: no cross-block cancellation
    centroids = prefix[:, :, :, -1] / b  # [B, H, nb, d]
    scores = q @ centroids.transpose(-1, -2)  # [B, H, Tq, nb]
    last = (n - 1).clamp(min=0) // b  # last visible block, partly visible in general
    seen = (n - last * b).clamp(min=1).to(q.dtype)  # its visible keys
    partial = prefix.view(B, H, nb * b, d).gather(2, (n - 1).clamp(min=0)[:, None, :, None].expand(B, H, Tq, d))
    partial_score = (q * partial).sum(-1) / seen[:, None]
    scores = scores.scatter(-1, last[:, None, :, None].expand(B, H, Tq, 1), partial_score[..., None])
    blocks = torch.arange(nb, device=q.device)
    block_ok = (blocks <= last[..., None]) & (n[..., None] > 0)  # [B, Tq, nb]
    scores = scores.masked_fill(~block_ok[:, None], -math.inf)
    m = min(nb, math.ceil(topk / b) + 1 + BLOCK_MARGIN)
    block_score, kept = scores.topk(m, dim=-1)  # [B, H, Tq, m]

    # exact scores inside the kept blocks, top K; queries in chunks, whole blocks copied as contiguous
    # rows of b*d floats into one reused buffer (a fresh multi-MB tensor per chunk costs page faults).
    in_block = torch.where(block_score > -math.inf, n[:, None, :, None] - kept * b, 0)  # visible keys per block
    flat_blocks = k.view(B * H * nb, b * d)
    first = (torch.arange(B * H, device=q.device) * nb).view(B, H, 1, 1)
    chunks = _chunks(Tq, B * H * m * b * d, BLOCK_CHUNK_ELEMENTS)
    buffer = flat_blocks.new_empty(B * H * (chunks[0].stop - chunks[0].start) * m, b * d)  # reused
    parts = []
    for c in chunks:
        rows = (kept[:, :, c] + first).flatten()
        gathered = torch.index_select(flat_blocks, 0, rows, out=buffer[: rows.numel()]).view(-1, m * b, d)
        # multiply-and-sum, not bmm: bmm over thousands of tiny (m*b x d) @ (d x 1) products is ~10x slower
        scores = (gathered * q[:, :, c].reshape(-1, 1, d)).sum(-1).view(B, H, -1, m * b)
        hidden = (torch.arange(b, device=q.device) >= in_block[:, :, c, :, None]).flatten(-2)
        parts.append(_finish(scores.masked_fill_(hidden, -math.inf), None, min(topk, m * b)))
    slot = torch.cat([p.index for p in parts], 2).clamp(min=0)
    valid = torch.cat([p.valid for p in parts], 2)
    compact = kept.gather(-1, slot // b) * b + slot % b
    original = order[:, None].expand(B, H, Tk).gather(2, compact.clamp(max=Tk - 1).flatten(2)).view_as(slot)
    return Selection(original.masked_fill(~valid, -1), valid)
