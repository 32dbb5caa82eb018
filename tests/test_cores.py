"""Sequence cores: one interface, last-step output, memory where there should be memory, time where it is read."""
import pytest
import torch

from policies.cores import CORES, build_core

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
