"""What an attention core attends to, in TensorBoard: NAC's phi and omega histograms and the attention
over a validation window, with its entropy (uniform attention is a core that learned nothing to attend to)."""
from __future__ import annotations

import torch

from agent.training.data import Data
from agent.training.windows import gather_segments
from policies.policy import DrivingPolicy


def log_nac_internals(writer, policy: DrivingPolicy, data: Data, episode: int, step: int,
                      cols: slice | None) -> dict[str, float]:
    """Attention diagnostics of an attention core (nac, mha) over a validation chunk (its first 128 windows).

    Scalars ``attention/entropy`` (nats), ``attention/entropy_norm`` (entropy / log(valid keys): 1 uniform),
    ``attention/max_weight`` and ``attention/uniform_max_weight`` (what uniform attention would give on the
    same queries), see ``policies.nac.attention_stats``; NAC also histograms of phi and omega (and of its
    logit scales when it has them); an image of one window's causal attention map. Returns
    ``{"attn_entropy", "attn_entropy_norm", "attn_max_weight"}`` (the comparison table's columns; ``{}``
    for cores without attention, and where no query sees two keys)."""
    if policy.config.core not in ("nac", "mha"):
        return {}
    policy.eval()
    W, S = policy.config.window, policy.config.frame_stride
    n = len(data.frames[episode])
    with torch.no_grad():
        frames, _, index, times, _ = gather_segments(data, [(episode, 0, min(n, 128))], W, S, cols)
        emb = policy.encode(torch.from_numpy(frames)[None])[0]
        x = emb[torch.from_numpy(index).to(emb.device)]
        time = policy.core_time(torch.from_numpy(times).to(emb.device), *x.shape[:2])
        seq, time = policy.core_sequence(policy.core_input(x), time)  # a frame's tokens, with frame_tokens
        internals = policy.core.internals(seq, time)
    if not internals or "attn" not in internals:
        return {}
    if not bool((internals["index"] >= 0).sum(-1).ge(2).any()):  # one key per query (a window of one token):
        return {}  # nothing to choose among, so no entropy to report (attention_stats gives NaN)
    for key in ("entropy", "entropy_norm", "max_weight", "uniform_max_weight"):
        writer.add_scalar(f"attention/{key}", float(internals[key]), step)
    valid = internals["index"] >= 0
    if "phi" in internals:
        writer.add_histogram("nac/phi", internals["phi"][valid].float().cpu(), step)
        writer.add_histogram("nac/omega", internals["omega"][valid].float().cpu(), step)
    if "logit_scale" in internals:
        writer.add_histogram("nac/logit_scale", internals["logit_scale"].float().cpu(), step)
        writer.add_scalar("attention/logit_scale_mean", float(internals["logit_scale"].mean()), step)
    sample = len(x) - 1  # the last window of the chunk: a full window past the episode start
    attn, idx = internals["attn"][sample], internals["index"][sample].clamp(min=0)  # [H, T, K]
    dense = torch.zeros(*attn.shape[:2], seq.shape[1], device=attn.device).scatter_add_(-1, idx, attn).mean(0)  # [T, T]
    image = (dense / dense.max().clamp(min=1e-8)).cpu()
    image = image.repeat_interleave(16, 0).repeat_interleave(16, 1)[None]  # [1, 16T, 16T], query rows, key cols
    writer.add_image(f"{policy.config.core}/attention", image, step, dataformats="CHW")
    return {f"attn_{key}": float(internals[key]) for key in ("entropy", "entropy_norm", "max_weight")}
