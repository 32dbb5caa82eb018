"""agent/training/init_shape.py: --init takes the policy's shape and inputs from the checkpoint; a flag that asks for
another shape is refused in one line naming it, a flag at its default is filled in."""
from __future__ import annotations

from dataclasses import fields

import pytest

from agent.training.config import TrainArgs
from agent.training.init_shape import CORE_SIZES, SHAPE, checkpoint_shape
from tests.helpers import constant_policy_checkpoint

DEFAULTS = {f.name: f.default for f in fields(TrainArgs)}


def _given(**flags):
    return {name: flags.get(name, DEFAULTS[name]) for name in SHAPE + CORE_SIZES}


def test_the_checkpoint_sets_the_shape_and_the_flags_left_at_their_defaults(tmp_path):
    init = str(constant_policy_checkpoint(tmp_path / "a.pt"))  # lstm (hidden 8), window 3, stride 1, 8 features
    shape = checkpoint_shape(init, _given(), DEFAULTS, None, None, None)
    assert (shape["policy"], shape["window"], shape["frame_stride"], shape["feature_dim"]) == ("lstm", 3, 1, 8)
    assert shape["hidden"] == 8 and shape["latency_queue"] == 0
    assert checkpoint_shape(init, _given(window=3), DEFAULTS, None, None, None) == shape  # the checkpoint's own


@pytest.mark.parametrize("flags, says", [
    (dict(window=5), "--window 5 contradicts its 3"),
    (dict(policy="mlp"), "--core mlp contradicts its lstm"),
    (dict(hidden=32), "--hidden 32 contradicts its hidden 8"),
])
def test_a_flag_asking_for_another_shape_is_refused_naming_it(tmp_path, flags, says):
    init = str(constant_policy_checkpoint(tmp_path / "a.pt"))
    with pytest.raises(ValueError) as e:
        checkpoint_shape(init, _given(**flags), DEFAULTS, None, None, None)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_a_queue_needs_the_latency_input(tmp_path):
    init = str(constant_policy_checkpoint(tmp_path / "a.pt"))
    with pytest.raises(ValueError, match="--latency-queue 2 shows the actions on their way beside the latency input"):
        checkpoint_shape(init, _given(), DEFAULTS, None, None, 2)
