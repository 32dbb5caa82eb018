"""NCP masks: shapes, density, connectivity, determinism."""

import pytest
import torch

from policies.wiring import backbone_masks, backbone_sizes, check_connected, sensory_mask


@pytest.mark.parametrize("input_dim,d_model", [(7, 16), (64, 64), (3, 100)])
def test_sensory_mask_shape_and_every_unit_connected(input_dim, d_model):
    mask = sensory_mask(input_dim, d_model, 0.5, seed=1)
    assert mask.shape == (input_dim, d_model) and mask.dtype == torch.bool
    check_connected(mask, "sensory")


@pytest.mark.parametrize("pair_dim", [2, 8, 32, 40])
def test_backbone_masks_shapes_chain(pair_dim):
    s = backbone_sizes(pair_dim)
    masks = backbone_masks(pair_dim, 0.5, seed=3)
    assert masks["inter"].shape == (pair_dim, s.inter)
    assert masks["command"].shape == (s.inter, s.command)
    assert masks["recurrent"].shape == (s.command, s.command)
    assert masks["motor"].shape == (s.command, s.motor)
    for name in ("inter", "command", "motor"):  # feed-forward chain: no unit left without a synapse
        check_connected(masks[name], name)


def test_sizes_for_d_head_16():
    s = backbone_sizes(32)
    assert (s.pair, s.inter, s.command, s.motor) == (32, 20, 12, 8)


def test_sparsity_zero_is_dense():
    assert sensory_mask(10, 16, 0.0, seed=0).all()
    assert all(m.all() for m in backbone_masks(16, 0.0, seed=0).values())


def test_sparsity_changes_density():
    dense = sensory_mask(64, 64, 0.1, seed=0).float().mean()
    sparse = sensory_mask(64, 64, 0.9, seed=0).float().mean()
    assert sparse < dense < 1.0
    b_dense = backbone_masks(32, 0.1, 0)["inter"].float().mean()
    b_sparse = backbone_masks(32, 0.9, 0)["inter"].float().mean()
    assert b_sparse < b_dense


def test_below_autoncp_range_still_sparse_and_connected():
    mask = sensory_mask(32, 32, 0.05, seed=0)
    assert 0.5 < mask.float().mean() < 1.0
    check_connected(mask, "sensory")


def test_determinism_by_seed():
    assert torch.equal(sensory_mask(20, 32, 0.5, seed=5), sensory_mask(20, 32, 0.5, seed=5))
    assert not torch.equal(sensory_mask(20, 32, 0.5, seed=5), sensory_mask(20, 32, 0.5, seed=6))
    a, b = backbone_masks(32, 0.5, 9), backbone_masks(32, 0.5, 9)
    assert all(torch.equal(a[n], b[n]) for n in a)


@pytest.mark.parametrize("bad", [-0.1, 0.95, 1.0, "half"])
def test_bad_sparsity(bad):
    with pytest.raises(ValueError, match="sparsity"):
        sensory_mask(8, 8, bad, seed=0)
