"""Top-K selection (policies/topk.py) and the native kernels it runs on (policies/nac_native.py): block selection
against exact selection, exact selection against the brute-force top K of the scores, and each instruction-set
version of the native top-K scan and of the fused scoring kernel. The layer's own selection tests (NAC-PW, "auto",
the layer without the native kernel, the memory at T = 16384) stay in test_nac.py."""

import math

import pytest
import torch

from policies import nac_native
from policies.topk import _scoring_inputs, select_blocks, select_exact


# ----------------------------------------------------------------------------- block selection
def _visible(T, pad, causal):
    vis = ~pad[:, None, :].expand(-1, T, -1)
    if causal:
        vis = vis & torch.ones(T, T, dtype=torch.bool).tril()
    return vis  # [B, Tq, Tk]


@pytest.mark.parametrize("causal", [False, True])
def test_block_selection_returns_distinct_valid_keys(causal):
    torch.manual_seed(1)
    B, H, T, d, K = 3, 2, 70, 4, 8
    q, k = torch.randn(B, H, T, d), torch.randn(B, H, T, d)
    pad = torch.rand(B, T) < 0.3  # scattered padding
    pad[2] = True
    pad[2, 50:53] = False  # a sample with only three valid keys
    sel = select_blocks(q, k, ~pad, torch.arange(T).expand(B, T), causal, K)
    vis = _visible(T, pad, causal)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                chosen = sel.index[b, h, i][sel.valid[b, h, i]]
                assert len(set(chosen.tolist())) == len(chosen)
                assert vis[b, i, chosen].all()
                assert len(chosen) == min(K, int(vis[b, i].sum()))


def test_block_selection_matches_exact_when_top_keys_share_a_block():
    torch.manual_seed(2)
    T, d, K = 64, 8, 6  # blocks of 8 keys; the best 8 keys all sit in block 2, so its centroid wins
    u = torch.nn.functional.normalize(torch.randn(d), dim=0)
    k = 0.1 * torch.randn(1, 1, T, d)
    k[0, 0, 16:24] = u * (2 + torch.rand(8, 1)) + 0.05 * torch.randn(8, d)
    q = u + 0.01 * torch.randn(1, 1, T, d)
    args = (torch.ones(1, T, dtype=torch.bool), torch.arange(T)[None], False, K)
    exact, blocks = select_exact(q, k, *args), select_blocks(q, k, *args)
    assert ((exact.index >= 16) & (exact.index < 24)).all()
    assert torch.equal(exact.index.sort(-1).values, blocks.index.sort(-1).values)


def test_block_selection_equals_exact_when_all_blocks_are_kept():
    torch.manual_seed(3)
    T, K = 16, 5  # b = 4, blocks kept = ceil(5/4) + 2 = 4 = all of them
    q, k = torch.randn(2, 3, T, 4), torch.randn(2, 3, T, 4)
    pad = torch.zeros(2, T, dtype=torch.bool)
    pad[1, 10:] = True
    for causal in (False, True):
        args = (~pad, torch.arange(T).expand(2, T), causal, K)
        exact, blocks = select_exact(q, k, *args), select_blocks(q, k, *args)
        assert torch.equal(exact.valid, blocks.valid)
        assert torch.equal(exact.index.sort(-1).values, blocks.index.sort(-1).values)


# ----------------------------------------------------------------------------- exact selection
def test_exact_selection_is_the_top_k_of_the_scores():
    """select_exact (native kernel or torch.topk) keeps the K best visible keys of every query, up to near-ties."""
    torch.manual_seed(12)
    for B, H, T, d, K, causal in ((2, 3, 300, 4, 8, True), (1, 2, 513, 8, 5, False), (2, 1, 70, 4, 32, True)):
        q, k = torch.randn(B, H, T, d), torch.randn(B, H, T, d)
        pad = torch.rand(B, T) < 0.2
        sel = select_exact(q, k, ~pad, torch.arange(T).expand(B, T), causal, K)
        qs, ks = _scoring_inputs(q, k)  # the same ranking as q . k, the scale it scores on
        scores = (qs @ ks.transpose(-1, -2)).masked_fill(~_visible(T, pad, causal)[:, None], -math.inf)
        values = scores.gather(-1, sel.index.clamp(min=0)).masked_fill(~sel.valid, -math.inf)
        # the same keys up to near-ties: two matmuls of another shape round differently on another CPU
        assert _top_k_agrees(values, sel.index, scores, K) > 0.99
        assert torch.equal(sel.valid, sel.index >= 0)


def _top_k_agrees(values, index, scores, K, tol=1e-5):
    """``values``/``index`` [..., K] (-inf / -1 = filler) against the brute-force ``scores`` [..., n] (-inf =
    invisible): values equal the K best scores within ``tol`` relative; indices are the same set wherever the
    K-th and (K+1)-th best scores differ by more than ``tol`` (closer ones may swap with float round-off).
    Returns the fraction of rows where the indices were compared."""
    best = scores.topk(min(K + 1, scores.shape[-1]), -1)
    top = best.values[..., :K]
    torch.testing.assert_close(values, top, rtol=tol, atol=tol, equal_nan=True)
    expected = best.indices[..., :K].masked_fill(torch.isneginf(top), -1)
    if best.values.shape[-1] > K:
        kth, next_ = best.values[..., K - 1], best.values[..., K]
        separated = ~(kth - next_ <= tol * kth.abs().clamp(min=1.0))  # (-inf - -inf = nan: both filler)
    else:
        separated = torch.ones_like(top[..., 0], dtype=torch.bool)
    assert torch.equal(index[separated].sort(-1).values, expected[separated].sort(-1).values)
    assert torch.equal(index == -1, torch.isneginf(values))
    return separated.float().mean().item()


@pytest.mark.parametrize("causal", [False, True])
def test_exact_selection_without_padding_is_the_top_k_of_the_scores(causal, monkeypatch):
    """With every key valid select_exact scores and selects in the fused native kernel (no score matrix): it
    keeps the K best visible keys of every query, up to near-ties, as the brute-force top K of q . k."""
    calls = []
    if nac_native.available():
        fused = nac_native.scores_topk
        monkeypatch.setattr(nac_native, "scores_topk", lambda *a: calls.append(1) or fused(*a))
    torch.manual_seed(15)
    for B, H, T, d, K in ((2, 3, 300, 4, 8), (1, 2, 513, 16, 5), (1, 1, 1030, 8, 32), (3, 2, 64, 16, 8)):
        q, k = torch.randn(B, H, T, d), torch.randn(B, H, T, d)
        sel = select_exact(q, k, torch.ones(B, T, dtype=torch.bool), torch.arange(T).expand(B, T), causal, K)
        qs, ks = _scoring_inputs(q, k)  # the same ranking as q . k, the scale the kernel scores on
        scores = (qs @ ks.transpose(-1, -2)).masked_fill(~_visible(T, torch.zeros(B, T, dtype=torch.bool),
                                                                   causal)[:, None], -math.inf)
        values = scores.gather(-1, sel.index.clamp(min=0)).masked_fill(~sel.valid, -math.inf)
        assert _top_k_agrees(values, sel.index, scores, K) > 0.99
        assert torch.equal(sel.valid, sel.index >= 0)
    assert len(calls) == (4 if nac_native.available() else 0)


@pytest.fixture(params=[0, 1, 2], ids=["plain C", "AVX2", "AVX-512"])
def scan_level(request):
    """Each instruction-set version of the native top-K scan this CPU can run (the best one afterwards)."""
    if not nac_native.available():
        pytest.skip("no C compiler here: the layer uses torch.topk (covered by every other test)")
    if nac_native.scan_level(request.param) != request.param:
        nac_native.scan_level(-1)
        pytest.skip("this CPU lacks that instruction set")
    yield request.param
    nac_native.scan_level(-1)


def test_fused_kernel_equals_the_brute_force_top_k(scan_level):
    """nac_native.scores_topk: the top K of q . k (keys 0..length-1 visible) without the score matrix; values
    within 1e-5 relative of the brute-force scores' top K, indices the same wherever K-th and (K+1)-th differ
    by more than that. Rows shorter than K end in filler; exact ties and NaN rank as in topk_rows."""
    torch.manual_seed(16)
    cases = [  # B, H, Tq, Tk, d, K, lengths
        (1, 1, 1, 1, 1, 1, None), (2, 3, 70, 300, 4, 8, "causal"), (1, 2, 129, 1000, 16, 8, None),
        (1, 1, 50, 64, 17, 32, "random"), (2, 1, 33, 777, 3, 5, "random"), (1, 1, 10, 5000, 16, 8, None),
        (1, 1, 3, 70000, 2, 4, "causal"), (1, 4, 200, 200, 16, 1, "causal")]
    for B, H, Tq, Tk, d, K, kind in cases:
        q, keys = torch.randn(B, H, Tq, d), torch.randn(B, H, Tk, d)
        lengths = {None: None, "causal": (torch.arange(Tq) + 1).expand(B, Tq).contiguous(),
                   "random": torch.randint(-2, Tk + 5, (B, Tq))}[kind]
        values, index = nac_native.scores_topk(q, keys, lengths, K)
        scores = (q.double() @ keys.double().transpose(-1, -2)).float()
        if lengths is not None:
            scores = scores.masked_fill(torch.arange(Tk) >= lengths[:, None, :, None], -math.inf)
        assert _top_k_agrees(values, index, scores, K) > 0.98, (B, H, Tq, Tk, d, K, kind)
    # exact ties (equal keys) go to the lower index, past the candidate list's capacity too; NaN ranks first
    q, keys = torch.randn(1, 1, 2, 16), torch.randn(1, 1, 1, 16).expand(1, 1, 600, 16).clone()
    keys[0, 0, 300:] = 0.5 * keys[0, 0, 0]  # (q . k has one sign: the first or the second half wins)
    rows = nac_native.scores_topk(q, keys, None, 4)[1][0, 0].tolist()
    assert all(r in ([0, 1, 2, 3], [300, 301, 302, 303]) for r in rows)
    q[0, 0, 1, 3] = math.nan
    keys[0, 0, 5, 0] = math.nan
    values, index = nac_native.scores_topk(q, keys, None, 4)
    assert index[0, 0, 0, 0] == 5 and values[0, 0, 0, 0].isnan()  # a NaN key: first in every row
    assert index[0, 0, 1].tolist() == [0, 1, 2, 3] and values[0, 0, 1].isnan().all()  # a NaN query: all NaN
    assert nac_native.scores_topk(q.double(), keys.double(), None, 4) is None  # not float32: the caller's path
    assert nac_native.scores_topk(q, keys, None, 33) is None  # k above MAX_K


# ----------------------------------------------------------------------------- the native top-K kernel
def test_native_top_k_equals_torch_topk(scan_level):
    """Values equal torch.topk's exactly; indices too, except that ties go to the lower index."""
    torch.manual_seed(14)
    for shape, k in (((3, 5, 1024), 8), ((2, 300), 1), ((4, 777), 32), ((6, 40), 7), ((1, 64 * 4), 8)):
        s = torch.randn(shape)
        s[..., ::7] = -math.inf  # masked keys
        s[0, 0, ] = -math.inf  # a row of masked keys only: every slot is filler
        s[-1, :3] = math.nan  # NaN ranks first, as in torch
        values, index = nac_native.topk_rows(s, k)
        expected = s.topk(k, -1)
        torch.testing.assert_close(values, expected.values, equal_nan=True)
        number, filler = ~torch.isneginf(values) & ~values.isnan(), torch.isneginf(values)
        assert torch.equal(index[number], expected.indices[number]) and (index[filler] == -1).all()
        nan_rows = values.isnan().any(-1)  # NaNs tie with each other: compare them as sets
        assert torch.equal(index[nan_rows].sort(-1).values, expected.indices[nan_rows].sort(-1).values)
    ties = torch.zeros(2, 512)
    ties[1, 100:] = 1.0
    assert nac_native.topk_rows(ties, 4)[1].tolist() == [[0, 1, 2, 3], [100, 101, 102, 103]]
    assert nac_native.topk_rows(torch.randn(2, 50).double(), 4) is None  # not float32: the caller uses torch
    assert nac_native.topk_rows(torch.randn(2, 50), 33) is None  # k above MAX_K
