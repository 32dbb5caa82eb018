"""Sequence cores: one interface, last-step output, memory where there should be memory, time where it is read;
block structures, policy names, attention statistics."""
import math

import pytest
import torch

from policies.cores import CORES, PRESETS, block_of, build_core, parse_core_name, policy_core_options

B, W, F = 3, 6, 12
MEMORY_CORES = [c for c in CORES if c != "mlp"]
TIME_CORES = ["nac", "cfc", "ltc"]


def make(name: str, **options):
    torch.manual_seed(0)
    small = {"nac": {"d_model": 16, "heads": 4}, "ltc": {"units": 8}}
    return build_core(name, F, W, **{**small.get(name, {}), **options}).eval()


def default_time():
    return torch.arange(1 - W, 1, dtype=torch.float32).expand(B, W)


@pytest.mark.parametrize("name", list(CORES))
def test_core_maps_window_to_last_step_feature(name):
    core = make(name)
    x = torch.randn(B, W, F, requires_grad=True)
    y = core(x, default_time())
    assert y.shape == (B, core.output_dim) and torch.isfinite(y).all()
    (y * torch.randn_like(y)).sum().backward()  # (a plain sum is constant after the mha core's LayerNorm)
    assert x.grad is not None and x.grad[:, -1].abs().sum() > 0  # the current frame always matters
    for b in range(B):  # samples do not mix
        torch.testing.assert_close(core(x[b: b + 1], default_time()[b: b + 1]), y[b: b + 1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", MEMORY_CORES)
def test_memory_cores_read_earlier_frames(name):
    core = make(name)
    x = torch.randn(B, W, F)
    x2 = x.clone()
    x2[:, -2] += 3.0  # the previous frame (the LTC forgets older ones fast at its initial time constants)
    assert not torch.allclose(core(x, default_time()), core(x2, default_time()), atol=1e-4)


def test_mlp_is_the_memoryless_floor():
    core = make("mlp")
    x = torch.randn(B, W, F)
    x2 = x.clone()
    x2[:, :-1] = torch.randn(B, W - 1, F)
    torch.testing.assert_close(core(x, default_time()), core(x2, default_time()))


@pytest.mark.parametrize("name", TIME_CORES)
def test_continuous_time_cores_read_timestamps(name):
    core = make(name)
    x = torch.randn(B, W, F)
    stretched = default_time() * 3.0
    assert not torch.allclose(core(x, default_time()), core(x, stretched), atol=1e-5)


def test_repeated_frames_at_episode_start_are_finite():
    """An episode start repeats frame 0 with equal timestamps (0 elapsed time): no NaN, no inf."""
    time = torch.tensor([[-2.0, -2.0, -2.0, -2.0, -1.0, 0.0]]).expand(B, W)
    for name in CORES:
        assert torch.isfinite(make(name)(torch.randn(B, W, F), time)).all(), name


def test_nac_core_is_causal_and_exposes_internals():
    core = make("nac", d_model=16, heads=4, topk=4)
    assert core.nac.causal and not core.nac.return_sequences
    x = torch.randn(B, W, F)
    internals = core.internals(x, default_time())
    assert internals["attn"].shape == (B, 4, W, 4)
    assert (internals["index"] <= torch.arange(W).view(1, 1, W, 1)).all()  # no query looks ahead
    torch.testing.assert_close(internals["attn"].sum(-1), torch.ones(B, 4, W))
    assert core.nac.return_sequences is False  # diagnostics leave the layer as they found it
    for mode in ("euler", "steady"):
        assert torch.isfinite(make("nac", mode=mode)(x, default_time())).all()


def test_mha_positions_and_window():
    x = torch.randn(B, W, F)
    for positions in ("learned", "sinusoidal"):
        assert make("mha", positions=positions)(x, default_time()).shape == (B, 64)
    with pytest.raises(ValueError, match="window 6"):
        make("mha")(torch.randn(B, W + 1, F), torch.zeros(B, W + 1))
    with pytest.raises(ValueError, match="learned"):
        make("mha", positions="rotary")


def test_unknown_core_and_bad_option():
    with pytest.raises(ValueError, match="valid cores: nac, lstm, gru, cfc, ltc, mha, mlp"):
        build_core("transformer", F, W)
    with pytest.raises(ValueError, match="core 'lstm'"):
        build_core("lstm", F, W, units=3)


# ----------------------------------------------------------------------------- block structures and variants
ATTENTION_VARIANTS = [
    ("nac", {"block": "bare"}), ("nac", {"block": "prenorm"}),
    ("nac", {"block": "prenorm", "mode": "steady", "logit_scale": True, "logit_scale_init": 4.0}),
    ("nac", {"block": "bare", "logit_scale": True}),
    ("mha", {"block": "bare"}), ("mha", {"block": "prenorm"}), ("mha", {"block": "bare", "layers": 2}),
]


@pytest.mark.parametrize("name,options", ATTENTION_VARIANTS)
def test_attention_variants_are_causal_last_step_cores_with_attention_stats(name, options):
    core = make(name, **options)
    x = torch.randn(B, W, F, requires_grad=True)
    y = core(x, default_time())
    assert y.shape == (B, 16 if name == "nac" else 64) and torch.isfinite(y).all()
    (y * torch.randn_like(y)).sum().backward()
    assert x.grad[:, -1].abs().sum() > 0 and x.grad[:, -2].abs().sum() > 0
    x2 = x.detach().clone()
    x2[:, 0] += 3.0  # the oldest frame still matters
    assert not torch.allclose(core(x2, default_time()), y, atol=1e-5)
    inner = core.internals(x.detach(), default_time())
    assert (inner["index"] <= torch.arange(W).view(1, 1, W, 1)).all()  # no query looks ahead
    torch.testing.assert_close(inner["attn"].sum(-1), torch.ones(inner["attn"].shape[:-1]))
    assert 0.0 <= inner["entropy_norm"].item() <= 1.0 + 1e-5 and 0.0 < inner["max_weight"].item() <= 1.0
    assert inner["entropy"].dim() == 0 and inner["max_weight"].item() >= inner["uniform_max_weight"].item() - 1e-6
    if options.get("logit_scale"):
        torch.testing.assert_close(inner["logit_scale"], torch.full((4,), options.get("logit_scale_init", 1.0)))
    core.train()  # internals leave the layer as they found it
    if name == "nac":
        assert core.nac.return_sequences is False


def test_prenorm_block_has_a_residual_path_and_bare_does_not():
    bare, pre = make("nac", block="bare"), make("nac", block="prenorm")
    assert not hasattr(bare, "block") and all(k.startswith("nac.") for k in bare.state_dict())  # old checkpoints
    assert {"inp.weight", "block.norm1.weight", "block.ffn.0.weight", "norm.weight"} <= set(pre.state_dict())
    assert pre.nac.input_dim == 16  # the layer reads LN(Linear(x)) in a prenorm block
    x = torch.randn(B, W, F)
    h = pre.inp(x)
    attn_out = pre.nac(pre.block.norm1(h), time=default_time())
    mid = h[:, -1] + attn_out
    expected = pre.norm(mid + pre.block.ffn(pre.block.norm2(mid)))
    torch.testing.assert_close(pre(x, default_time()), expected)
    with torch.no_grad():  # silence the attention: the bare core outputs its projection's bias, prenorm keeps x
        for core in (bare, pre):
            core.nac.out_proj.weight.zero_()
    assert torch.allclose(bare(x, default_time()), bare(torch.randn(B, W, F), default_time()))
    assert not torch.allclose(pre(x, default_time()), pre(torch.randn(B, W, F), default_time()))


def test_mha_block_structures():
    bare, pre = make("mha", block="bare"), make("mha")  # mha's default stays prenorm (old checkpoints)
    assert not hasattr(bare, "norm") and not hasattr(bare.blocks[0], "ffn")
    assert {"blocks.0.norm1.weight", "blocks.0.attn.in_proj_weight", "blocks.0.ffn.0.weight", "norm.weight"} \
        <= set(pre.state_dict())
    x = torch.randn(B, W, F)
    h = bare.inp(x) + bare.pos
    expected = bare.blocks[0].attn(h, h, h, attn_mask=bare.causal_mask, need_weights=False)[0][:, -1]
    torch.testing.assert_close(bare(x, default_time()), expected)
    with pytest.raises(ValueError, match="block"):
        make("mha", block="postnorm")
    with pytest.raises(ValueError, match="block"):
        make("nac", block="residual")


def test_width_is_d_model_for_every_core_unless_overridden():
    for name in CORES:
        core = build_core(name, F, W, d_model=24, **({"heads": 4} if name in ("nac", "mha") else {}))
        assert core.output_dim == (12 if name == "ltc" else 24), name
    assert make("gru", d_model=24, hidden=8).output_dim == 8
    assert make("cfc", d_model=24, units=10).output_dim == 10


# ----------------------------------------------------------------------------- policy names
@pytest.mark.parametrize("name,expected", [
    ("nac", ("nac", {})),
    ("gru", ("gru", {})),
    ("nac-euler", ("nac", {"mode": "euler"})),
    ("nac-steady+prenorm", ("nac", {"mode": "steady", "block": "prenorm"})),
    ("nac-exact+prenorm+scale", ("nac", {"mode": "exact", "block": "prenorm", "logit_scale": True})),
    ("nac+scale=4", ("nac", {"logit_scale": True, "logit_scale_init": 4.0})),
    ("nac-steady+phi_activation=identity+topk=4", ("nac", {"mode": "steady", "phi_activation": "identity",
                                                           "topk": 4})),
    ("mha+bare", ("mha", {"block": "bare"})),
    ("mha+positions=sinusoidal+layers=2", ("mha", {"positions": "sinusoidal", "layers": 2})),
    ("gru+hidden=32", ("gru", {"hidden": 32})),
    ("nac+dropout=0.1", ("nac", {"dropout": 0.1})),
])
def test_parse_core_name(name, expected):
    assert parse_core_name(name) == expected


@pytest.mark.parametrize("name,word", [
    ("transformer", "valid policies: nac, lstm, gru, cfc, ltc, mha, mlp, nac-exact"),
    ("nac-rk4", "nac mode"),
    ("gru-exact", "nac mode"),
    ("gru+prenorm", "attention cores"),
    ("nac+bare+prenorm", "set twice"),
    ("nac-exact+mode=steady", "set twice"),
    ("nac+scale=-1", "S > 0"),
    ("nac+sharp", "unknown flag"),
    ("nac+colour=red", "no option 'colour'"),
    ("lstm+kind=gru", "no option 'kind'"),
    ("nac+", "empty flag"),
    ("", "unknown policy"),
])
def test_bad_policy_names(name, word):
    with pytest.raises(ValueError, match=word.replace("+", r"\+")):
        parse_core_name(name)


def test_a_mistyped_core_name_lists_the_modes_and_presets_and_guesses_the_name():
    with pytest.raises(ValueError) as e:
        parse_core_name("nac-fcous")
    text = str(e.value)
    assert "'-fcous' is not a nac mode" in text and "the preset nac-focus" in text
    assert text.endswith("did you mean nac-focus?")
    with pytest.raises(ValueError, match="nac-focus is nac-exact"):
        parse_core_name("nac-focus+foo")  # a preset takes no flags; it is not "-focus" as a mode


def test_every_parsed_name_builds_and_presets_parse():
    for name in ["nac-exact+prenorm+scale=2", "mha+bare", "nac-euler+bare+euler_steps=3", *PRESETS]:
        core, options = parse_core_name(name)
        assert isinstance(build_core(core, F, W, **{**options, "d_model": 16, "heads": 4}), torch.nn.Module)


def test_policy_core_options_share_one_width_and_record_the_block():
    core, options = policy_core_options("lstm", d_model=96)
    assert (core, options) == ("lstm", {"d_model": 96})
    assert policy_core_options("lstm", d_model=96, hidden=32)[1] == {"d_model": 96, "hidden": 32}
    assert policy_core_options("ltc", hidden=32)[1]["units"] == 16
    core, options = policy_core_options("nac-steady+prenorm", d_model=32, heads=8, nac_mode="exact", seed=7)
    assert options == {"d_model": 32, "heads": 8, "mode": "steady", "topk": 8, "sparsity": 0.5, "seed": 7,
                       "block": "prenorm"}
    assert policy_core_options("nac", nac_mode="euler")[1]["mode"] == "euler"
    assert policy_core_options("nac")[1]["block"] == "bare" and policy_core_options("mha")[1]["block"] == "prenorm"
    assert [block_of(n) for n in ("nac", "nac-exact+prenorm", "mha", "mha+bare", "gru")] == \
        ["bare", "prenorm", "prenorm", "bare", None]


def test_mha_internals_match_its_attention():
    core = make("mha", block="bare")
    x = torch.randn(B, W, F)
    inner = core.internals(x, default_time())
    assert inner["attn"].shape == (B, 4, W, W)
    future = torch.ones(W, W, dtype=torch.bool).triu(1)
    assert (inner["attn"][..., future] == 0).all() and (inner["index"][..., future] == -1).all()
    assert inner["uniform_max_weight"].item() == pytest.approx(sum(1 / n for n in range(2, W + 1)) / (W - 1))
    assert math.isfinite(inner["entropy"].item())


def test_nac_official_is_a_policy_name_with_the_authors_defaults_and_reads_no_frame_times():
    assert parse_core_name("nac-official") == ("nac", {"variant": "official"})
    assert parse_core_name("nac-official-steady+activation=elu") == (
        "nac", {"variant": "official", "mode": "steady", "activation": "elu"})
    with pytest.raises(ValueError, match="set twice"):
        parse_core_name("nac-official+variant=paper")
    with pytest.raises(ValueError, match="not a nac mode"):
        parse_core_name("nac-official-rk4")
    core, options = policy_core_options("nac-official", d_model=16, heads=4, nac_mode="euler")
    assert options["variant"] == "official" and options["mode"] == "euler"
    assert (options["euler_steps"], options["delta_t"]) == (5, 0.5)  # their layer's defaults
    assert policy_core_options("nac-official+euler_steps=3")[1]["euler_steps"] == 3  # the name wins
    nac = build_core(core, F, W, **options).eval()
    x = torch.randn(B, W, F)
    assert torch.equal(nac(x, default_time()), nac(x, 5 * default_time()))  # t = 1, as their experiments call it
    with pytest.raises(ValueError, match="reads no clock"):
        nac(x, default_time(), query_time=torch.zeros(B))
    inner = nac.internals(x, default_time())
    assert inner["attn"].shape == (B, 4, W, min(8, W)) and float(inner["entropy_norm"]) == pytest.approx(1.0)
