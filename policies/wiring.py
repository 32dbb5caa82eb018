"""Fixed NCP connectivity masks for the NAC layer, generated with ``ncps.wirings``.

A Neural Circuit Policy (NCP) wires four neuron groups in a chain,
sensory -> inter -> command (with a few recurrent command synapses) -> motor.
The NAC layer re-uses that connectivity as *binary masks* over ordinary weight
matrices: the masks are fixed buffers, the weights under them are trained.

Two kinds of masks are built here:

* ``sensory_mask(input_dim, d_model, ...)`` -- the q/k/v sensory gates (paper eq. 13).
  It is the sensory adjacency (input -> inter neurons) of ``AutoNCP(units, 0, sparsity)``
  with ``units = ceil((d_model - 0.5) / 0.6)`` (the authors' sizing), which yields exactly
  ``d_model`` inter neurons (checked; a nearby ``units`` is searched if the formula misses).
* ``backbone_masks(pair_dim, ...)`` -- the pair backbone (eq. 14) that reads ``p = [q_i; k_j]``
  (``pair_dim = 2 * d_head``). Sizes, chosen so the backbone stays small next to the pair
  (it runs on ``T * K`` pairs per head) while keeping AutoNCP's 60/40 inter/command split:
  ``motor = max(1, d_head // 2)`` and ``units = motor + max(pair_dim, 3)``, i.e.
  ``inter + command = pair_dim``; AutoNCP then makes ``command = int(0.4 * pair_dim)``.
  For d_head=16 (d_model 64, 4 heads): 32 inputs -> 20 inter -> 12 command -> 8 motor.

Every unit of every masked layer has at least one incoming synapse and every source
unit at least one outgoing one (NCP connects "forgotten" neurons), so gradients reach
every unmasked weight; ``check_connected`` asserts it. ``sparsity=0`` gives dense
(all-ones) masks of the same sizes, the paper's "NAC-FC" ablation. AutoNCP rejects
sparsity levels below 0.1; for ``0 < sparsity < 0.1`` the same sizes and fan-outs are
built with ``ncps.wirings.NCP`` directly (AutoNCP's arithmetic, computed here).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from ncps.wirings import NCP, AutoNCP

MAX_SPARSITY = 0.9


def check_sparsity(sparsity: float) -> float:
    """Validate ``sparsity`` (0 = dense masks, up to 0.9 = AutoNCP's sparsest)."""
    if isinstance(sparsity, bool) or not isinstance(sparsity, (int, float)) or not (0.0 <= sparsity <= MAX_SPARSITY):
        raise ValueError(f"sparsity must be a number in [0, {MAX_SPARSITY}] (0 = dense masks); got {sparsity!r}")
    return float(sparsity)


def _ncp(units: int, output_size: int, sparsity: float, seed: int, input_dim: int) -> NCP:
    """An AutoNCP-sized wiring, built for ``input_dim`` sensory neurons."""
    if sparsity >= 0.1:
        wiring: NCP = AutoNCP(units, output_size, sparsity_level=sparsity, seed=seed)
    else:  # AutoNCP's own arithmetic, for the levels it refuses (0 < sparsity < 0.1)
        density = 1.0 - sparsity
        inter_and_command = units - output_size
        command = max(int(0.4 * inter_and_command), 1)
        inter = inter_and_command - command
        wiring = NCP(
            inter, command, output_size,
            sensory_fanout=max(int(inter * density), 1),
            inter_fanout=max(int(command * density), 1),
            recurrent_command_synapses=max(int(command * density * 2), 1),
            motor_fanin=max(int(command * density), 1),
            seed=seed,
        )
    wiring.build(input_dim)
    return wiring


def _sensory_units(d_model: int) -> int:
    """Smallest AutoNCP size near the authors' formula with exactly ``d_model`` inter neurons."""
    start = math.ceil((d_model - 0.5) / 0.6)
    for units in [start] + [start + d for d in (-1, 1, -2, 2, -3, 3)]:
        if units >= 3 and units - max(int(0.4 * units), 1) == d_model:
            return units
    raise ValueError(f"d_model must be >= 2 to build an NCP sensory gate; got {d_model}")


def sensory_mask(input_dim: int, d_model: int, sparsity: float, seed: int) -> torch.Tensor:
    """Bool mask ``[input_dim, d_model]``: which input feature feeds which q/k/v unit."""
    sparsity = check_sparsity(sparsity)
    if sparsity == 0.0:
        return torch.ones(input_dim, d_model, dtype=torch.bool)
    wiring = _ncp(_sensory_units(d_model), 0, sparsity, seed, input_dim)
    inter = wiring.get_neurons_of_layer(0)
    return torch.from_numpy(wiring.sensory_adjacency_matrix[:, inter] != 0)


@dataclass(frozen=True)
class BackboneSizes:
    """Neuron counts of the pair backbone: pair (sensory) -> inter -> command -> motor."""

    pair: int
    inter: int
    command: int
    motor: int


def backbone_sizes(pair_dim: int) -> BackboneSizes:
    """Backbone sizes for a pair of ``pair_dim = 2 * d_head`` features (see module docstring)."""
    d_head = max(pair_dim // 2, 1)
    motor = max(1, d_head // 2)
    inter_and_command = max(pair_dim, 3)
    command = max(int(0.4 * inter_and_command), 1)
    return BackboneSizes(pair_dim, inter_and_command - command, command, motor)


def backbone_masks(pair_dim: int, sparsity: float, seed: int) -> dict[str, torch.Tensor]:
    """Bool masks of the backbone layers, keyed by layer.

    ``inter`` [pair, inter], ``command`` [inter, command], ``recurrent`` [command, command],
    ``motor`` [command, motor]. Rows are sources, columns destinations.
    """
    sparsity = check_sparsity(sparsity)
    s = backbone_sizes(pair_dim)
    if sparsity == 0.0:
        ones = lambda a, b: torch.ones(a, b, dtype=torch.bool)  # noqa: E731
        return {"inter": ones(s.pair, s.inter), "command": ones(s.inter, s.command),
                "recurrent": ones(s.command, s.command), "motor": ones(s.command, s.motor)}
    wiring = _ncp(s.motor + s.inter + s.command, s.motor, sparsity, seed, pair_dim)
    inter, command, motor = (wiring.get_neurons_of_layer(i) for i in range(3))
    assert (len(inter), len(command), len(motor)) == (s.inter, s.command, s.motor), "AutoNCP sizing changed"
    adj = wiring.adjacency_matrix != 0
    return {
        "inter": torch.from_numpy(wiring.sensory_adjacency_matrix[:, inter] != 0),
        "command": torch.from_numpy(adj[np.ix_(inter, command)]),
        "recurrent": torch.from_numpy(adj[np.ix_(command, command)]),
        "motor": torch.from_numpy(adj[np.ix_(command, motor)]),
    }


def check_connected(mask: torch.Tensor, name: str) -> None:
    """Every destination unit has an input and every source an output (so every unit gets gradient)."""
    if not bool(mask.any(0).all()) or not bool(mask.any(1).all()):
        raise AssertionError(f"NCP mask {name!r} leaves a unit without a synapse")
