"""NAC layer: the ODE identities and bounds (docs/nac.md), masks, selection, gradients, errors, and the
options that depart from the paper (learnable logit scale), off by default."""

import math
from pathlib import Path

import pytest
import torch

from policies.nac import NAC, attention_stats
from tests.policies.nac_reference import reference_nac


def make(**kw) -> NAC:
    args = dict(input_dim=6, d_model=16, num_heads=2)
    args.update(kw)
    return NAC(args.pop("input_dim"), args.pop("d_model"), args.pop("num_heads"), **args)


def run(layer, x, **kw):
    return layer(x, return_internals=True, **kw)


# ----------------------------------------------------------------------------- shapes
def test_shapes_and_internals():
    layer = make(topk=4)
    y, inner = run(layer, torch.randn(3, 10, 6))
    assert y.shape == (3, 10, 16)
    assert set(inner) == {"phi", "omega", "t", "logits", "attn", "index"}
    for value in inner.values():
        assert value.shape == (3, 2, 10, 4)
    assert inner["index"].dtype == torch.int64


def test_return_sequences_false_is_last_valid_step():
    seq, last = make(), make(return_sequences=False)
    x = torch.randn(2, 9, 6)
    pad = torch.zeros(2, 9, dtype=torch.bool)
    pad[1, 6:] = True  # sample 1 is right-padded: its last valid step is 5
    full = seq(x, key_padding_mask=pad)
    out = last(x, key_padding_mask=pad)
    assert out.shape == (2, 16)
    torch.testing.assert_close(out[0], full[0, 8], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[1], full[1, 5], atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- ODE identities (spec 2)
def test_exact_equals_steady_times_one_minus_exp_and_bounds():
    layer = make(topk=5)
    x = torch.randn(2, 12, 6)
    _, exact = run(layer, x)
    layer.mode = "steady"
    _, steady = run(layer, x)
    for key in ("phi", "omega", "t"):  # the modes share the gates
        torch.testing.assert_close(exact[key], steady[key])
    torch.testing.assert_close(steady["logits"], steady["phi"] / steady["omega"])
    expected = steady["logits"] * (1 - torch.exp(-exact["omega"] * exact["t"]))
    torch.testing.assert_close(exact["logits"], expected, atol=1e-6, rtol=1e-5)
    # theorem 1 with sigmoid phi: 0 <= a(t) <= phi / omega; corollary 1: |a - a*| = a* e^{-omega t}
    assert (exact["logits"] >= 0).all() and (exact["logits"] <= steady["logits"] * (1 + 1e-6)).all()
    gap = steady["logits"] - exact["logits"]
    torch.testing.assert_close(gap, steady["logits"] * torch.exp(-exact["omega"] * exact["t"]), atol=1e-6, rtol=1e-4)
    assert (exact["omega"] > 0).all()
    torch.testing.assert_close(exact["attn"].sum(-1), torch.ones(2, 2, 12))


def test_euler_converges_to_exact_and_respects_bounds():
    layer = make(topk=5, mode="euler", euler_steps=6)
    x = torch.randn(2, 12, 6)
    _, coarse = run(layer, x)
    h_omega = coarse["omega"] * coarse["t"] / 6
    inside = h_omega <= 1
    assert inside.any()
    a, a_star = coarse["logits"][inside], (coarse["phi"] / coarse["omega"])[inside]
    assert (a >= 0).all() and (a <= a_star * (1 + 1e-6)).all()
    layer.mode = "exact"
    _, exact = run(layer, x)
    errors = []
    for steps in (6, 60, 2000):
        layer.mode, layer.euler_steps = "euler", steps
        _, fine = run(layer, x)
        errors.append((fine["logits"] - exact["logits"]).abs().max().item())
    assert errors[0] > errors[1] > errors[2] and errors[2] < 1e-3, errors


def test_exact_approaches_steady_as_omega_t_grows():
    layer = make(topk=4)
    with torch.no_grad():
        layer.backbone.b_heads[..., 1] = 30.0  # omega ~ 30
        layer.backbone.b_time[..., 1] = 30.0  # t ~ 1
    _, exact = run(layer, torch.randn(1, 8, 6))
    ratio = exact["logits"] / (exact["phi"] / exact["omega"])  # 1 - e^{-omega t}
    assert (ratio > 1 - 1e-6).all()


# ----------------------------------------------------------------------------- masks
@pytest.mark.parametrize("selection", ["exact", "blocks"])
def test_causal_output_ignores_the_future(selection):
    layer = make(topk=3, causal=True, selection=selection)
    x = torch.randn(2, 40, 6)
    stamps = torch.cumsum(torch.rand(2, 40) + 0.1, 1)
    y = layer(x, time=stamps)
    # i = 30 sits in a partly visible key block (blocks of 7) with more visible blocks than kept ones,
    # so a centroid that peeked at the future would change which blocks are kept
    for i in (3, 17, 30):
        x2, stamps2 = x.clone(), stamps.clone()
        x2[:, i + 1:] = torch.randn(2, 40 - i - 1, 6) * 5
        stamps2[:, i + 1:] += 3.0
        y2 = layer(x2, time=stamps2)
        torch.testing.assert_close(y[:, : i + 1], y2[:, : i + 1], atol=1e-6, rtol=1e-6)
        assert not torch.allclose(y[:, i + 1:], y2[:, i + 1:])


@pytest.mark.parametrize("selection", ["exact", "blocks"])
def test_padding_gets_zero_attention_and_is_ignored(selection):
    layer = make(topk=4, selection=selection)
    x = torch.randn(2, 30, 6)
    pad = torch.zeros(2, 30, dtype=torch.bool)
    pad[0, 25:] = True
    pad[1, :7] = True
    pad[1, 12:15] = True
    y, inner = run(layer, x, key_padding_mask=pad)
    for b in range(2):
        chosen = inner["index"][b][inner["attn"][b] > 0]
        assert not pad[b, chosen].any()
        assert (inner["index"][b] >= 0).all()  # plenty of valid keys: no filler slots
    x2 = x.clone()
    x2[pad] = torch.randn(int(pad.sum()), 6) * 100
    y2 = layer(x2, key_padding_mask=pad)
    torch.testing.assert_close(y[~pad], y2[~pad], atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("selection", ["exact", "blocks"])
def test_fewer_valid_keys_than_k_are_masked(selection):
    layer = make(topk=6, causal=True, selection=selection)
    _, inner = run(layer, torch.randn(1, 20, 6))
    for i in range(20):
        valid = inner["index"][0, :, i] >= 0
        assert (valid.sum(-1) == min(i + 1, 6)).all()
        assert (inner["attn"][0, :, i][~valid] == 0).all()
        assert torch.isneginf(inner["logits"][0, :, i][~valid]).all()
    torch.testing.assert_close(inner["attn"].sum(-1), torch.ones(1, 2, 20))


def test_query_without_any_valid_key_outputs_zeros():
    layer = make(causal=True)
    x = torch.randn(2, 10, 6, requires_grad=True)
    pad = torch.zeros(2, 10, dtype=torch.bool)
    pad[0] = True  # every key padded
    pad[1, :4] = True  # causal + left padding: steps 0..3 see nothing
    y, inner = run(layer, x, key_padding_mask=pad)
    assert torch.isfinite(y).all() and (y[0] == 0).all() and (y[1, :4] == 0).all()
    assert (y[1, 4:] != 0).any()
    assert (inner["attn"][0] == 0).all() and (inner["index"][0] == -1).all()
    y.sum().backward()
    assert torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in layer.parameters() if p.grad is not None)


# ----------------------------------------------------------------------------- selection
def test_topk_at_least_t_pairs_every_query_with_every_key():
    layer = make(topk=50)
    _, inner = run(layer, torch.randn(2, 11, 6))
    assert inner["index"].shape[-1] == 11
    expected = torch.arange(11).expand(2, 2, 11, 11)
    assert torch.equal(inner["index"].sort(-1).values, expected)


def test_auto_selection_gives_same_output_as_exact_for_short_sequences():
    layer = make(selection="auto")
    x = torch.randn(1, 40, 6)
    y = layer(x)
    layer.selection = "exact"
    torch.testing.assert_close(layer(x), y)


# ----------------------------------------------------------------------------- gates and gradients
def test_phi_and_omega_depend_on_the_pair():
    _, inner = run(make(topk=6), torch.randn(2, 10, 6))
    for key in ("phi", "omega", "t"):
        assert inner[key].std() > 1e-3, key
        assert (inner[key][0, 0, 0].std() > 1e-4), key  # varies across the keys of one query too


@pytest.mark.parametrize("shared", [False, True])
def test_every_trainable_weight_gets_gradient_and_masked_ones_none(shared):
    layer = make(topk=4, shared_backbone=shared)
    y = layer(torch.randn(2, 12, 6), time=torch.cumsum(torch.rand(2, 12), 1))
    (y ** 2).sum().backward()
    masks = {"sensory.weight": layer.sensory.mask}
    for name in ("inter", "command", "recurrent", "motor"):
        masks[f"backbone.w_{name}"] = getattr(layer.backbone, f"mask_{name}")
    for name, param in layer.named_parameters():
        assert param.grad is not None, name
        mask = masks.get(name, torch.ones_like(param)).bool().expand_as(param)
        assert (param.grad[mask] != 0).all(), name
        assert (param.grad[~mask] == 0).all(), name


def test_state_dict_shared_across_modes_and_seed_determinism():
    base = make(seed=7)
    x = torch.randn(1, 9, 6)
    outputs = {}
    for mode in ("exact", "euler", "steady"):
        other = make(mode=mode, seed=123)
        other.load_state_dict(base.state_dict())
        outputs[mode] = other(x)
        base.mode = mode
        torch.testing.assert_close(base(x), outputs[mode])
    assert not torch.allclose(outputs["exact"], outputs["steady"])
    a, b, c = make(seed=7).state_dict(), make(seed=7).state_dict(), make(seed=8).state_dict()
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert not all(torch.equal(a[n], c[n]) for n in a)


def test_sparsity_zero_is_dense():
    layer = make(sparsity=0.0)
    assert layer.sensory.mask.all() and layer.backbone.mask_inter.all()


# ----------------------------------------------------------------------------- time
def test_timestamps_are_used():
    layer = make(topk=4)
    x = torch.randn(2, 10, 6)
    base = layer(x)
    per_sample = layer(x, time=torch.tensor([5.0, 0.2]))
    per_step = layer(x, time=torch.cumsum(torch.rand(2, 10), 1))
    assert not torch.allclose(base, per_sample) and not torch.allclose(base, per_step)
    torch.testing.assert_close(layer(x, time=torch.ones(2)), base)  # tau = 1 is the default
    _, inner = run(layer, x, time=torch.cumsum(torch.rand(2, 10), 1).double() + 1e9)
    assert inner["t"].dtype == torch.float32 and torch.isfinite(inner["t"]).all()


# ----------------------------------------------------------------------------- robustness
@pytest.mark.parametrize("selection", ["exact", "blocks"])
@pytest.mark.parametrize("mode", ["exact", "euler", "steady"])
def test_no_nan_or_inf_under_extreme_inputs(selection, mode):
    layer = make(topk=4, selection=selection, mode=mode, causal=True)
    pad = torch.zeros(3, 20, dtype=torch.bool)
    pad[2] = True
    for scale in (1e30, 1e-30, 0.0):
        x = torch.randn(3, 20, 6, requires_grad=True)
        stamps = torch.cumsum(torch.rand(3, 20), 1) * 1e30
        y = layer(x * scale, time=stamps, key_padding_mask=pad)
        assert torch.isfinite(y).all(), scale
        (y / max(scale, 1.0)).sum().backward()
        assert torch.isfinite(x.grad).all(), scale


# ----------------------------------------------------------------------------- errors
@pytest.mark.parametrize("kwargs,word", [
    (dict(d_model=15, num_heads=2), "num_heads"),
    (dict(mode="rk4"), "mode"),
    (dict(selection="random"), "selection"),
    (dict(phi_activation="relu"), "phi_activation"),
    (dict(sparsity=0.95), "sparsity"),
    (dict(sparsity=-0.1), "sparsity"),
    (dict(topk=0), "topk"),
    (dict(euler_steps=0), "euler_steps"),
    (dict(tau_epsilon=0.0), "tau_epsilon"),
    (dict(dt=-1.0), "dt"),
    (dict(logit_scale=True, logit_scale_init=0.0), "logit_scale_init"),
    (dict(logit_scale=True, logit_scale_init=float("inf")), "logit_scale_init"),
    (dict(logit_scale=1), "logit_scale"),
])
def test_bad_constructor_arguments(kwargs, word):
    with pytest.raises(ValueError, match=word):
        make(**kwargs)


def test_bad_mode_assignment():
    layer = make()
    with pytest.raises(ValueError, match="mode"):
        layer.mode = "fast"


@pytest.mark.parametrize("call,word", [
    (lambda m: m(torch.randn(2, 5, 7)), "input_dim"),
    (lambda m: m(torch.randn(5, 6)), "x must"),
    (lambda m: m(torch.randn(2, 5, 6), time=torch.zeros(3)), "time"),
    (lambda m: m(torch.randn(2, 5, 6), time=torch.zeros(2, 4)), "time"),
    (lambda m: m(torch.randn(2, 5, 6), key_padding_mask=torch.zeros(2, 4, dtype=torch.bool)), "key_padding_mask"),
    (lambda m: m(torch.randn(2, 5, 6), key_padding_mask=torch.zeros(2, 5)), "key_padding_mask"),
])
def test_bad_forward_arguments(call, word):
    with pytest.raises(ValueError, match=word) as info:
        call(make())
    assert "got" in str(info.value)


# ----------------------------------------------------------------------------- departures: logit scale
def set_scale(layer: NAC, value: float) -> None:
    with torch.no_grad():
        layer.log_logit_scale.fill_(math.log(value))


def test_logit_scale_is_off_by_default_and_changes_no_weight():
    plain = make(seed=5)
    assert plain.log_logit_scale is None and plain.logit_scales is None
    assert not any("scale" in name for name in plain.state_dict())  # old checkpoints keep loading
    scaled = make(seed=5, logit_scale=True)
    assert set(scaled.state_dict()) == set(plain.state_dict()) | {"log_logit_scale"}
    torch.testing.assert_close(scaled.logit_scales, torch.ones(2))
    x = torch.randn(2, 9, 6)
    torch.testing.assert_close(scaled(x), plain(x))  # init 1: the paper's layer, unchanged
    assert "logit_scale=True" in repr(scaled)
    torch.testing.assert_close(make(logit_scale=True, logit_scale_init=3.0).logit_scales, torch.full((2,), 3.0))


@pytest.mark.parametrize("mode", ["exact", "euler", "steady"])
def test_logit_scale_sharpens_attention_monotonically(mode):
    layer = make(topk=6, mode=mode, logit_scale=True, causal=True)
    x = torch.randn(2, 12, 6)
    entropies, max_weights = [], []
    for value in (0.25, 1.0, 4.0, 16.0, 64.0, 4096.0):
        set_scale(layer, value)
        _, inner = run(layer, x)
        valid = inner["index"] >= 0
        expected = torch.softmax(value * inner["logits"], -1)  # the ODE logits are unscaled
        torch.testing.assert_close(inner["attn"], expected.masked_fill(~valid, 0.0))
        stats = attention_stats(inner["attn"], inner["index"])
        entropies.append(stats["entropy_norm"].item())
        max_weights.append(stats["max_weight"].item())
    assert all(a > b for a, b in zip(entropies, entropies[1:])), entropies
    assert all(a < b for a, b in zip(max_weights, max_weights[1:])), max_weights
    assert entropies[0] > 0.99 and max_weights[-1] > 0.95  # nearly uniform -> nearly one key


def test_logit_scale_is_per_head_and_leaves_the_ode_alone():
    layer = make(topk=5, logit_scale=True)
    x = torch.randn(2, 10, 6)
    _, before = run(layer, x)
    with torch.no_grad():
        layer.log_logit_scale.copy_(torch.tensor([0.0, math.log(50.0)]))
    _, after = run(layer, x)
    for key in ("phi", "omega", "t", "logits", "index"):  # theorem 1 still holds for the logits themselves
        torch.testing.assert_close(before[key], after[key])
    torch.testing.assert_close(after["attn"][:, 0], before["attn"][:, 0])  # head 0 keeps scale 1
    s0 = attention_stats(after["attn"][:, :1], after["index"][:, :1])["entropy_norm"]
    s1 = attention_stats(after["attn"][:, 1:], after["index"][:, 1:])["entropy_norm"]
    assert s1 < s0


def test_logit_scale_gets_gradient_and_every_other_weight_still_does():
    layer = make(topk=4, logit_scale=True, logit_scale_init=2.0)
    y = layer(torch.randn(2, 12, 6), time=torch.cumsum(torch.rand(2, 12), 1))
    (y ** 2).sum().backward()
    assert layer.log_logit_scale.grad is not None and (layer.log_logit_scale.grad != 0).all()
    assert all(p.grad is not None for p in layer.parameters())


@pytest.mark.parametrize("selection", ["exact", "blocks"])
def test_masks_hold_with_a_large_logit_scale(selection):
    layer = make(topk=4, selection=selection, causal=True, logit_scale=True, logit_scale_init=1e4)
    x = torch.randn(2, 30, 6, requires_grad=True)
    pad = torch.zeros(2, 30, dtype=torch.bool)
    pad[0, 25:] = True
    pad[1, :7] = True  # steps 0..6 of sample 1 see no key at all
    pad[1, 12:15] = True
    y, inner = run(layer, x, key_padding_mask=pad)
    for b in range(2):
        chosen = inner["index"][b][inner["attn"][b] > 0]
        assert not pad[b, chosen].any()
        assert (chosen.view(-1) >= 0).all()
    filler = inner["index"] < 0
    assert (inner["attn"][filler] == 0).all() and torch.isneginf(inner["logits"][filler]).all()
    assert (y[1, :7] == 0).all() and torch.isfinite(y).all()
    x2 = x.detach().clone()
    x2[pad] = torch.randn(int(pad.sum()), 6) * 100
    torch.testing.assert_close(layer(x2, key_padding_mask=pad)[~pad], y[~pad], atol=1e-5, rtol=1e-5)
    y.sum().backward()
    assert torch.isfinite(x.grad).all() and torch.isfinite(layer.log_logit_scale.grad).all()


def test_unbounded_phi_lets_logits_leave_the_unit_interval():
    """Sigmoid phi and t in (0, 1) bound the exact logit by phi * t < 1; identity phi in steady mode does not."""
    bounded, free = make(topk=6, seed=3), make(topk=6, seed=3, mode="steady", phi_activation="identity")
    with torch.no_grad():
        for layer in (bounded, free):
            layer.backbone.b_heads[..., 0] = 5.0  # phi pre-activation ~ 5
            layer.backbone.b_heads[..., 1] = -3.0  # omega ~ 0.05
    x = torch.randn(2, 8, 6)
    _, a = run(bounded, x)
    _, b = run(free, x)
    assert a["logits"].max() < 1.0 and (a["logits"] <= a["phi"] * a["t"]).all()
    assert b["logits"].max() > 10.0 and torch.isfinite(b["logits"]).all()


@pytest.mark.parametrize("mode", ["exact", "steady"])
def test_no_nan_or_inf_under_extreme_inputs_with_a_logit_scale(mode):
    layer = make(topk=4, mode=mode, causal=True, logit_scale=True, logit_scale_init=100.0,
                 phi_activation="identity")
    pad = torch.zeros(3, 20, dtype=torch.bool)
    pad[2] = True
    for scale in (1e30, 1e-30, 0.0):
        x = torch.randn(3, 20, 6, requires_grad=True)
        y = layer(x * scale, time=torch.cumsum(torch.rand(3, 20), 1) * 1e30, key_padding_mask=pad)
        assert torch.isfinite(y).all(), scale
        (y / max(scale, 1.0)).sum().backward()
        assert torch.isfinite(x.grad).all(), scale


# ----------------------------------------------------------------------------- attention statistics
def test_attention_stats_reference_values():
    index = torch.tensor([[[[0, 1, 2, 3], [0, 1, -1, -1], [0, -1, -1, -1]]]])  # [1, 1, 3, 4]
    uniform = torch.tensor([[[[0.25] * 4, [0.5, 0.5, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]]])
    stats = attention_stats(uniform, index)  # the one-key query is left out
    torch.testing.assert_close(stats["entropy"], torch.tensor((math.log(4) + math.log(2)) / 2))
    torch.testing.assert_close(stats["entropy_norm"], torch.tensor(1.0))
    torch.testing.assert_close(stats["max_weight"], torch.tensor(0.375))
    torch.testing.assert_close(stats["uniform_max_weight"], torch.tensor(0.375))
    onehot = torch.tensor([[[[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]]])
    stats = attention_stats(onehot, index)
    assert stats["entropy"].item() == 0.0 and stats["entropy_norm"].item() == 0.0
    assert stats["max_weight"].item() == 1.0


def test_attention_stats_of_the_paper_layer_are_near_uniform():
    """The structural reason for the departures: exact logits lie in [0, phi t) with phi, t < 1."""
    _, inner = run(make(topk=8, causal=True), torch.randn(4, 8, 6))
    stats = attention_stats(inner["attn"], inner["index"])
    assert stats["entropy_norm"] > 0.98
    ratio = inner["attn"].amax(-1) / inner["attn"].masked_fill(inner["index"] < 0, 2.0).amin(-1)
    assert (ratio[..., 1:] < math.e).all()  # no key is ever preferred over another by more than a factor e


# ----------------------------------------------------------------------------- optimised path vs a plain reference
REFERENCE_CASES = {
    "exact, selection": (dict(topk=5), 40, {}),
    "euler, causal, padded, per-step time": (dict(mode="euler", causal=True, topk=4), 33, dict(pad=True, time="step")),
    "steady, logit scale, per-sample time": (dict(mode="steady", logit_scale=True, logit_scale_init=7.0), 30,
                                             dict(time="sample")),
    "blocks, shared backbone, tanh phi": (dict(selection="blocks", shared_backbone=True, phi_activation="tanh",
                                               topk=6), 50, dict(pad=True)),
    "pairwise, last step (the driving core)": (dict(topk=8, causal=True, return_sequences=False, num_heads=4), 8,
                                               dict(pad=True, time="step")),
    "identity phi, euler, dt": (dict(mode="euler", phi_activation="identity", dt=0.5, euler_steps=3), 20, {}),
}


@pytest.mark.parametrize("case", list(REFERENCE_CASES))
def test_optimised_layer_matches_the_plain_reference(case):
    """Values, internals and gradients of the optimised forward equal the plain maths up to float round-off."""
    kwargs, T, inputs = REFERENCE_CASES[case]
    torch.manual_seed(11)
    layer = make(**kwargs)
    with torch.no_grad():  # non-zero biases, so every folded bias term is exercised
        for name, param in layer.named_parameters():
            if "b_" in name or name.endswith("bias"):
                param.normal_(0, 0.3)
    B = 3
    x = torch.randn(B, T, 6, requires_grad=True)
    pad = None
    if inputs.get("pad"):
        pad = torch.zeros(B, T, dtype=torch.bool)
        pad[0, -5:] = True
        pad[1, :3] = True
        pad[2] = True  # a sample without any valid key
    time = {"step": torch.cumsum(torch.rand(B, T), 1), "sample": torch.tensor([0.5, 2.0, 1.0]), None: None}[
        inputs.get("time")]
    y, inner = layer(x, time=time, key_padding_mask=pad, return_internals=True)
    y_ref, ref = reference_nac(layer, x, time, pad, inner["index"])
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
    valid = inner["index"] >= 0
    for key in ("phi", "omega", "t", "attn"):
        torch.testing.assert_close(inner[key][valid], ref[key][valid], atol=1e-5, rtol=1e-5)
    assert torch.isneginf(inner["logits"][~valid]).all() and (inner["attn"][~valid] == 0).all()
    weights = torch.randn_like(y)
    grads = torch.autograd.grad((y * weights).sum(), [x, *layer.parameters()], allow_unused=True)
    grads_ref = torch.autograd.grad((y_ref * weights).sum(), [x, *layer.parameters()], allow_unused=True)
    for (name, param), g, g_ref in zip([("x", x), *layer.named_parameters()], grads, grads_ref):
        g = torch.zeros_like(param) if g is None else g  # (steady mode never reads the internal time)
        g_ref = torch.zeros_like(param) if g_ref is None else g_ref
        scale = max(1.0, g_ref.abs().max().item())  # round-off grows with the terms summed
        torch.testing.assert_close(g, g_ref, atol=1e-5 * scale, rtol=1e-4, msg=name)


@pytest.mark.parametrize("name", ["carracing_nac", "udacity_nac"])
def test_shipped_checkpoints_match_the_reference(name):
    """The shipped policies' NAC layers (state_dict unchanged) give the plain maths' outputs within 1e-5."""
    from policies.checkpoint import load_checkpoint

    path = Path(__file__).resolve().parents[2] / "checkpoints" / f"{name}.pt"
    layer = load_checkpoint(path).core.nac
    W = layer.topk  # the driving window: topk >= W pairs every query with every key
    torch.manual_seed(13)
    x = torch.randn(4, W, layer.input_dim)
    time = torch.arange(1.0 - W, 1.0).expand(4, W).clone()
    time[1, :3] = time[1, 3]  # repeated frames at an episode start
    with torch.no_grad():
        y, inner = layer(x, time=time, return_internals=True)
        y_ref, _ = reference_nac(layer, x, time, None, inner["index"])
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=0)


def test_folded_weights_follow_in_place_changes_under_no_grad():
    """Inference caches the backbone's folded weights; changing a parameter or a mask must still take effect."""
    layer = make(topk=4)
    x = torch.randn(2, 9, 6)
    with torch.no_grad():
        before = layer(x)
        torch.testing.assert_close(layer(x), before)  # cached: same values
        layer.backbone.b_heads[..., 0] += 1.0
        after = layer(x)
        assert not torch.allclose(after, before)
        layer.backbone.load_state_dict(make(topk=4, seed=99).backbone.state_dict())
        assert not torch.allclose(layer(x), after)
        torch.testing.assert_close(layer(x), reference_nac(layer, x, None, None, run(layer, x)[1]["index"])[0],
                                   atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- variant "official"
# The function of the authors' public code (docs/nac.md, section 13), restated here from its formulas; the
# benchmark benchmarks.official_parity compares the layer with their TensorFlow layer itself.
def official(**kw) -> NAC:
    return make(variant="official", topk=4, **kw)


def official_reference(layer: NAC, x, time=None, pad=None):
    """Dense q/k/v; top-K keys per head by q . k; phi = sigmoid(c), omega = softplus(c) + eps; t = sigmoid(alpha
    tau + beta), alpha and beta affine in [q; k] with one map for every head; Euler in steps of delta_t; padded
    keys' logits times 0; softmax; dt * sum of values; projection; activation."""
    B, T, _ = x.shape
    H, d, stage = layer.num_heads, layer.d_head, layer.backbone
    q, k, v = ((x @ layer.sensory.weight + layer.sensory.bias).view(B, T, 3, H, d).permute(2, 0, 3, 1, 4))
    K = min(layer.topk, T)
    index = (q @ k.transpose(-1, -2)).topk(K, dim=-1).indices  # [B, H, T, K]

    def gather(z):
        return z.gather(2, index.reshape(B, H, T * K, 1).expand(-1, -1, -1, d)).view(B, H, T, K, d)

    pair = torch.cat([q[:, :, :, None].expand(-1, -1, -1, K, -1), gather(k)], -1)
    alpha, beta = (pair @ stage.w_time[0] + stage.b_time[0, 0]).unbind(-1)
    tau = 1.0 if time is None else time.view(B, 1, 1, 1)
    t = torch.sigmoid(alpha * tau + beta)
    phi, omega = torch.sigmoid(stage.gate), torch.nn.functional.softplus(stage.gate) + layer.config.tau_epsilon
    if layer.mode == "steady":
        logits = (phi / omega).expand_as(t)
    elif layer.mode == "exact":
        logits = phi / omega * (1 - torch.exp(-omega * t))
    else:
        logits = torch.zeros_like(t)
        for _ in range(layer.euler_steps):
            logits = logits + layer.delta_t * (phi - omega * logits)
    if pad is not None:
        logits = logits * (~pad).float()[:, None, None, :].expand(B, H, T, T).gather(3, index)
    out = layer.dt * (torch.softmax(logits, -1)[..., None] * gather(v)).sum(3)
    y = layer.out_proj(out.transpose(1, 2).reshape(B, T, layer.d_model))
    return torch.nn.functional.elu(y) if layer.activation == "elu" else y


@pytest.mark.parametrize("mode", ["exact", "steady", "euler"])
def test_official_variant_is_the_authors_function(mode):
    torch.manual_seed(1)
    layer = official(mode=mode, dt=0.7, euler_steps=5, delta_t=0.4, activation="elu")
    with torch.no_grad():
        layer.backbone.gate.fill_(0.8)
        layer.backbone.b_time.normal_()
    x, time = torch.randn(3, 9, 6), torch.tensor([0.5, 1.0, 2.5])
    pad = torch.zeros(3, 9, dtype=torch.bool)
    pad[1, 5:] = True
    torch.testing.assert_close(layer(x), official_reference(layer, x), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(layer(x, time=time), official_reference(layer, x, time), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(layer(x, key_padding_mask=pad), official_reference(layer, x, pad=pad),
                               atol=1e-6, rtol=1e-5)
    layer.return_sequences = False  # the last position, padded or not, as theirs returns out[:, -1]
    torch.testing.assert_close(layer(x, key_padding_mask=pad), official_reference(layer, x, pad=pad)[:, -1],
                               atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("mode", ["steady", "euler"])
def test_official_steady_and_euler_attend_uniformly_over_the_top_k(mode):
    layer = official(mode=mode)
    x = torch.randn(2, 10, 6)
    y, inner = run(layer, x)
    assert torch.equal(inner["attn"], torch.full_like(inner["attn"], inner["attn"].flatten()[0].item()))
    torch.testing.assert_close(inner["attn"], torch.full_like(inner["attn"], 0.25))
    _, short = run(layer, x, time=torch.tensor([0.1, 9.0]))  # euler steps delta_t: the pair's time is not read
    torch.testing.assert_close(short["logits"], inner["logits"])
    # the output is the projected mean of the top-K values
    v = layer.sensory(x)[..., 2 * 16:].view(2, 10, 2, 8).transpose(1, 2)  # [B, H, T, d_head]
    index = inner["index"]
    chosen = v.gather(2, index.reshape(2, 2, 40, 1).expand(-1, -1, -1, 8)).view(2, 2, 10, 4, 8).mean(3)
    torch.testing.assert_close(y, layer.out_proj(chosen.transpose(1, 2).reshape(2, 10, 16)), atol=1e-6, rtol=1e-5)
    if mode == "euler":  # n steps of size delta_t from 0: a_n = (phi / omega) (1 - (1 - delta_t omega)^n)
        phi, omega = inner["phi"], inner["omega"]
        expected = phi / omega * (1 - (1 - 0.5 * omega) ** layer.euler_steps)
        torch.testing.assert_close(inner["logits"], expected, atol=1e-6, rtol=1e-5)


def test_official_exact_reads_the_pair_only_through_its_time_gate_shared_by_the_heads():
    layer = official()
    with torch.no_grad():
        layer.backbone.w_time.zero_()  # alpha = beta = 0: t = 1/2 for every pair, so every logit is the same
    _, inner = run(layer, torch.randn(2, 10, 6))
    assert torch.allclose(inner["attn"], torch.full_like(inner["attn"], 0.25))
    assert torch.equal(inner["t"], torch.full_like(inner["t"], 0.5))
    assert tuple(layer.backbone.w_time.shape) == (1, 2 * layer.d_head, 2)  # one map for all heads


def test_official_sparsity_changes_nothing_and_there_are_no_backbone_kernels():
    layers = [official(sparsity=s, seed=3) for s in (0.0, 0.5, 0.9)]
    states = [layer.state_dict() for layer in layers]
    assert all(s.keys() == states[0].keys() and all(torch.equal(s[n], states[0][n]) for n in s) for s in states)
    assert bool(layers[1].sensory.mask.all())  # q, k, v read every input
    assert {n for n, _ in layers[1].named_parameters()} == {
        "sensory.weight", "sensory.bias", "backbone.gate", "backbone.w_time", "backbone.b_time",
        "out_proj.weight", "out_proj.bias"}
    x = torch.randn(2, 7, 6)
    torch.testing.assert_close(layers[0](x), layers[2](x))
    y, inner = run(layers[1], x)
    c = layers[1].backbone.gate
    torch.testing.assert_close(inner["phi"], torch.sigmoid(c).expand_as(inner["phi"]))
    torch.testing.assert_close(inner["omega"], (torch.nn.functional.softplus(c) + 1e-6).expand_as(inner["omega"]))
    y.square().sum().backward()
    assert c.grad is not None and c.grad.abs() > 0  # exact mode: the scalar is learnt (steady: uniform whatever c)


@pytest.mark.parametrize("variant", ["paper", "official"])
@pytest.mark.parametrize("mode", ["exact", "steady", "euler"])
def test_one_frame_per_sample_reduces_every_nac_to_the_projection_of_its_value(variant, mode):
    layer = make(variant=variant, mode=mode, dt=0.5, activation="elu")
    x = torch.randn(4, 1, 6)
    v = layer.sensory(x)[..., 32:]
    torch.testing.assert_close(layer(x), torch.nn.functional.elu(layer.out_proj(0.5 * v)))


def test_official_options_are_checked():
    for kw, word in [({"variant": "authors"}, "variant"), ({"activation": "relu"}, "activation"),
                     ({"variant": "official", "phi_activation": "tanh"}, "sigmoid"), ({"delta_t": 0.0}, "delta_t"),
                     ({"delta_t": math.inf}, "delta_t"), ({"dt": True}, "dt")]:
        with pytest.raises(ValueError, match=word):
            make(**kw)
