"""Does this project's ``nac-official`` layer compute what the authors' public TensorFlow layer computes?

Imports their layer (class ``NAC`` of ``neuronal_attention_circuit.py`` in a checkout of their repository given as
``--reference``; nothing of it is stored in this project) and builds it at small sizes, sets every trainable weight
of it at random, maps the weights into ``policies.nac.NAC(variant="official")`` and runs both on the same random
input, in each mode (exact, steady, euler) and each case: x alone (their t = 1), x with a time per sample, elu on
the output, and a key mask. Prints the largest absolute difference of the outputs per mode and case; a case their
layer cannot run is shown with the error it raises. Exit status 1 when a difference exceeds the tolerance.

It also checks, on their layer, what the mapping relies on (docs/nac.md, section 13): their q/k/v cells read
every input and carry no state between steps (a dense affine map, whatever the sparsity), and their backbone's
output does not depend on the pair (a constant; the gradient into its kernels is 0).

    pip install -e '.[official]'      # TensorFlow for the CPU, only for this benchmark
    python -m benchmarks.official_parity --reference DIR --out parity.json
"""
from __future__ import annotations

import importlib.util
import os
import re
import sys
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from common.cli import option, run_command

PROG = "python -m benchmarks.official_parity"
LAYER_FILE = "neuronal_attention_circuit.py"
PLACES = (".", "CarRacing_exp", "Udacity_exp")  # where a checkout has their layer (the copies are the same)
MODES = ("exact", "steady", "euler")
CASES = ("x", "x, t [B]", "x, elu", "x, mask")
TOLERANCE = 1e-5
INSTALL = "pip install -e '.[official]' (the optional extra official: tensorflow-cpu)"


@dataclass
class ParityArgs:
    reference: Path = option(None, "a checkout of the authors' repository (github.com/itxwaleedrazzaq/"
                                   "neuronal_attention_circuit): its neuronal_attention_circuit.py is imported",
                             group="input", required=True)
    batch: int = option(3, "samples", group="model")
    steps: int = option(10, "time steps per sample", group="model")
    features: int = option(12, "input features per step", group="model")
    d_model: int = option(16, "width", group="model")
    heads: int = option(4, "heads", group="model")
    topk: int = option(4, "keys per query", group="model")
    seed: int = option(0, "seed of the random weights and inputs", group="model")
    out: Path | None = option(None, "also write the figures as JSON to this file", group="output")


def reference_file(folder: Path) -> Path:
    """Their layer's file in ``folder``; ValueError in one line when the folder is missing or is not their repo."""
    if not folder.is_dir():
        raise ValueError(f"--reference {folder}: no such folder")
    for place in PLACES:
        path = folder / place / LAYER_FILE
        if path.is_file():
            text = path.read_text(errors="replace")
            if "class NAC(" in text and "class NCPCell(" in text:
                return path.resolve()
    raise ValueError(f"--reference {folder}: no {LAYER_FILE} with the NAC and NCPCell layers in it; give a checkout "
                     "of the authors' repository (github.com/itxwaleedrazzaq/neuronal_attention_circuit)")


def require_tensorflow() -> None:
    if find_spec("tensorflow") is None:
        raise ValueError(f"TensorFlow is not installed: {INSTALL}")


_LOADED: dict[Path, Any] = {}


def load_reference(path: Path):
    """Their module, imported once per process (Keras refuses to register its layer names twice)."""
    if path not in _LOADED:
        spec = importlib.util.spec_from_file_location("nac_official_reference", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        _LOADED[path] = module
    return _LOADED[path]


# ----------------------------------------------------------------------------- their weights, as our layer's
def cell_affine(cell) -> tuple[Any, Any, float]:
    """The affine map ``x -> x @ W + b`` one step of their NCP cell computes from a zero state, read from its
    weights, and how much of its state a next step would carry into those outputs (0: every step is the same map).

    A step: ``state' = ((x * input_w + input_b) @ (input_kernel * sensory_mask) + state @ (recurrent_kernel *
    sparsity_mask) + bias) * active_mask``, outputs ``state'[output_indices] * output_w + output_b``."""
    import numpy as np

    p = {name: np.asarray(value, np.float64) for name, value in cell._params.items()}
    active, out = np.asarray(cell.active_mask, np.float64), np.asarray(cell.output_indices)
    kernel = (p["input_kernel"] * p["sensory_sparsity_mask"])[:, out]
    scale = active[out] * p["output_w"]
    weight = p["input_w"][:, None] * kernel * scale
    bias = (p["input_b"] @ kernel + p["bias"][out]) * scale + p["output_b"]
    carried = (p["recurrent_kernel"] * p["sparsity_mask"])[active > 0][:, out] * scale
    return weight, bias, float(np.abs(carried).max(initial=0.0))


def first_line(e: BaseException) -> str:
    """An error in one short line (TensorFlow's op prefix ``{{function_node ...}}`` dropped)."""
    text = re.sub(r"\{\{[^}]*\}\}\s*", "", str(e).strip()).splitlines()
    return f"{type(e).__name__}: {(text[0] if text else '')[:160]}"


def their_checks(layer) -> dict[str, Any]:
    """What the mapping relies on, measured on their built layer."""
    import numpy as np

    checks: dict[str, Any] = {}
    cells = {name: getattr(layer, name).cell for name in ("q_proj", "k_proj", "v_proj")}
    checks["qkv_read_every_input"] = all(
        bool(np.asarray(c._params["sensory_sparsity_mask"])[:, np.asarray(c.output_indices)].all())
        for c in cells.values())
    checks["qkv_state_carried"] = max(cell_affine(c)[2] for c in cells.values())
    weight, _, _ = cell_affine(layer.out_ncp.cell)
    checks["backbone_reads_the_pair"] = bool(np.abs(weight).max() > 0)
    return checks


def map_weights(layer, ours) -> None:
    """Their layer's weights into ``ours`` (``NAC(variant="official")`` of the same sizes)."""
    import numpy as np
    import torch

    maps = [cell_affine(getattr(layer, name).cell) for name in ("q_proj", "k_proj", "v_proj")]
    if max(m[2] for m in maps):
        raise RuntimeError("their q/k/v cells carry state between steps at these sizes: no one affine map to map")
    weight, bias, _ = cell_affine(layer.out_ncp.cell)
    if np.abs(weight).max() > 0:
        raise RuntimeError("their backbone reads the pair at these sizes: its output is not one constant")

    def tensor(a) -> torch.Tensor:
        return torch.as_tensor(np.asarray(a, np.float64), dtype=torch.float32)

    with torch.no_grad():
        ours.sensory.weight.copy_(tensor(np.concatenate([m[0] for m in maps], 1)))
        ours.sensory.bias.copy_(tensor(np.concatenate([m[1] for m in maps])))
        ours.backbone.gate.fill_(float(bias[0]))
        time_kernel = np.concatenate([np.asarray(layer.time_a.kernel), np.asarray(layer.time_b.kernel)], 1)
        ours.backbone.w_time.copy_(tensor(time_kernel)[None])  # [1, 2 d_head, 2]: rows q then k, as their pair
        ours.backbone.b_time.copy_(tensor(np.concatenate([layer.time_a.bias, layer.time_b.bias]))[None, None])
        ours.out_proj.weight.copy_(tensor(layer.out_dense.kernel).T)
        ours.out_proj.bias.copy_(tensor(layer.out_dense.bias))


# ----------------------------------------------------------------------------- the comparison
def parity(a: ParityArgs) -> dict[str, Any]:
    """Build both layers, run every mode and case; {"max_abs_diff": {mode: {case: float | None}}, "errors", ...}."""
    path = reference_file(a.reference)
    require_tensorflow()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # before TensorFlow's first import: no C++ log lines
    import numpy as np
    import tensorflow as tf
    import torch

    from policies.nac import NAC, OFFICIAL_DEFAULTS

    module = load_reference(path)
    rng = np.random.default_rng(a.seed)
    x = rng.standard_normal((a.batch, a.steps, a.features)).astype(np.float32)
    t = rng.uniform(0.2, 3.0, a.batch).astype(np.float32)
    mask = np.ones((a.batch, a.steps), bool)
    mask[-1, a.steps // 2:] = False  # the last sample's second half is padding
    sizes = dict(d_model=a.d_model, num_heads=a.heads, topk=a.topk, euler_steps=OFFICIAL_DEFAULTS["euler_steps"],
                 delta_t=OFFICIAL_DEFAULTS["delta_t"], dt=0.7, sparsity=0.5, return_sequences=True)
    theirs = {act: module.NAC(mode="exact", activation=act, **sizes) for act in (None, "elu")}
    try:
        for layer in theirs.values():
            layer(tf.constant(x))  # builds it
    except Exception as e:  # noqa: BLE001 - e.g. a d_model their sensory wiring cannot give
        raise ValueError(f"their layer fails at these sizes: {first_line(e)}") from None
    for w in theirs[None].trainable_weights:
        w.assign(rng.normal(0.0, 0.5, tuple(w.shape)).astype(np.float32))
    theirs["elu"].set_weights(theirs[None].get_weights())
    checks = their_checks(theirs[None])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.square(theirs[None].call(tf.constant(x))))
    kernels = [w for w in theirs[None].out_ncp.trainable_weights if "kernel" in w.name]
    checks["backbone_kernel_grad_max"] = max(float(tf.reduce_max(tf.abs(g))) for g in tape.gradient(loss, kernels))

    ours = {act: NAC(a.features, a.d_model, a.heads, mode="exact", topk=a.topk, euler_steps=sizes["euler_steps"],
                     delta_t=sizes["delta_t"], dt=sizes["dt"], variant="official", activation=act or "none")
            for act in (None, "elu")}
    for layer in ours.values():
        map_weights(theirs[None], layer)

    def run_theirs(mode: str, case: str):
        layer = theirs["elu" if case == "x, elu" else None]
        layer.mode = mode
        if case == "x, t [B]":  # called directly: Keras' __call__ hands a tuple input a tuple of masks, which
            return layer.call((tf.constant(x), tf.constant(t)))  # their call multiplies into the logits and fails
        if case == "x, mask":
            return layer.call(tf.constant(x), mask=tf.constant(mask))
        return layer.call(tf.constant(x))

    def run_ours(mode: str, case: str) -> np.ndarray:
        layer = ours["elu" if case == "x, elu" else None]
        layer.mode = mode
        with torch.no_grad():
            y = layer(torch.from_numpy(x), time=torch.from_numpy(t) if case == "x, t [B]" else None,
                      key_padding_mask=torch.from_numpy(~mask) if case == "x, mask" else None)
        return y.numpy()

    diffs: dict[str, dict[str, float | None]] = {}
    errors: dict[str, str] = {}
    scale = 0.0  # the largest output, for scale
    for mode in MODES:
        diffs[mode] = {}
        for case in CASES:
            try:
                expected = np.asarray(run_theirs(mode, case))
            except Exception as e:  # noqa: BLE001 - their layer's own failure is a result to report
                errors[case] = first_line(e)
                diffs[mode][case] = None
                continue
            diffs[mode][case] = float(np.abs(run_ours(mode, case) - expected).max())
            scale = max(scale, float(np.abs(expected).max()))
    return {"reference": str(path), "tensorflow": tf.__version__,
            "sizes": {"batch": a.batch, "steps": a.steps, "features": a.features, **sizes}, "seed": a.seed,
            "tolerance": TOLERANCE, "max_abs_output": scale, "max_abs_diff": diffs, "their_errors": errors,
            "their_layer": checks}


def table(result: dict[str, Any]) -> str:
    diffs, errors = result["max_abs_diff"], result["their_errors"]
    rows = ["| mode | " + " | ".join(CASES) + " |", "|---|" + "---:|" * len(CASES)]
    for mode, cases in diffs.items():
        cells = ["their layer raises" if v is None else f"{v:.1e}" for v in cases.values()]
        rows.append(f"| {mode} | " + " | ".join(cells) + " |")
    lines = [f"their layer: {result['reference']} (TensorFlow {result['tensorflow']})",
             "sizes: " + ", ".join(f"{k} {v}" for k, v in result["sizes"].items()),
             f"max abs difference of the outputs (the largest output: {result['max_abs_output']:.2f})", "", *rows]
    lines += [f"their layer raises on '{case}': {text}" for case, text in errors.items()]
    c = result["their_layer"]
    lines.append(f"their layer: q/k/v read every input {c['qkv_read_every_input']}, state carried "
                 f"{c['qkv_state_carried']:g}; backbone reads the pair {c['backbone_reads_the_pair']}, gradient "
                 f"into its kernels {c['backbone_kernel_grad_max']:g}")
    return "\n".join(lines)


def worst(result: dict[str, Any]) -> float:
    return max((v for cases in result["max_abs_diff"].values() for v in cases.values() if v is not None),
               default=float("nan"))


def _benchmark(a: ParityArgs) -> int:
    for name in ("batch", "steps", "features", "d_model", "heads", "topk"):
        if getattr(a, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
    result = parity(a)
    print(table(result))
    high = worst(result)
    agree = high <= TOLERANCE
    print(f"largest difference {high:.1e}: {'within' if agree else 'ABOVE'} the tolerance {TOLERANCE:g}")
    if a.out is not None:
        from common.files import write_json

        print(f"wrote {write_json(a.out, {**result, 'worst': high, 'agree': agree})}")
    return 0 if agree else 1


def main(argv: list[str] | None = None) -> int:
    return run_command(ParityArgs, _benchmark, argv, prog=PROG, doc=__doc__, mistakes=(ValueError, OSError))


if __name__ == "__main__":
    raise SystemExit(main())
