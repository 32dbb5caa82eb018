"""train.py --preset: the authors' experiments as train.py arguments. Each preset is a set of TrainArgs values
(``settings``) that fill in every flag the command does not give; a flag given beside the preset wins, except one
that changes what the authors' model reads (``essence``: the window, the encoder, the frame tokens), refused in one
line. What each sets, against this project's defaults, and what cannot be matched: docs/usage.md, "The paper's
experiments as presets"."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Preset:
    """A named set of train.py arguments (``settings``: TrainArgs fields), what ``--help`` says of it (``summary``)
    and the fields a flag beside it may not change (``essence``: what the policy reads)."""

    summary: str
    settings: dict[str, Any]
    essence: tuple[str, ...] = ("window", "encoder", "frame_tokens")


# The authors' public trainers (their repository's CarRacing_exp/carracing_trainer.py and Udacity_exp/
# udacity_trainer.py, utils.py, drive.py) in this project's terms; docs/usage.md tabulates what each sets and
# what it cannot match.
_ADAM = dict(weight_decay=0.0, warmup=0.0, lr_schedule="constant", grad_clip=0.0, lr=1e-4, segment=1,
             val_fraction=0.1)  # Adam at a constant 1e-4, no clipping; batches of frames drawn one by one
PRESETS: dict[str, Preset] = {
    "paper-carracing": Preset(
        "one frame per sample; their CNN's 2430 conv features straight into nac-official (exact, d_model 64, "
        "16 heads, top-K 10, sparsity 0.7); Dense 64 ReLU -> the 5 discrete actions; Adam 1e-4, batch 32, 100 "
        "epochs; no augmentation; data/carracing_discrete (collect.py --action-space discrete)",
        dict(data="data/carracing_discrete", out="runs/train/paper-carracing", head="discrete", window=1,
             encoder="carracing-official", policy="nac-official-exact+delta_t=1.5", d_model=64, heads=16, topk=10,
             sparsity=0.7, head_hidden=64, batch_size=32, epochs=100, augment=False, **_ADAM)),
    "paper-udacity": Preset(
        "one YUV frame (rows 60:135, 66x200); the NVIDIA conv stack, its 1x18x64 map as 64 tokens of 18 into "
        "nac-official (exact, ELU output, d_model 100, 20 heads, top-K 15, sparsity 0.7), last token -> steering; "
        "Adam 1e-4, batch 40, 15 epochs of 500 steps; side cameras +-0.2, flips, shifts, shadows, brightness; "
        "drives with steering x3 where |s| >= 0.01 and throttle 0.05; data/udacity",
        dict(data="data/udacity", out="runs/train/paper-udacity", head="steer", window=1,
             encoder="pilotnet-official", frame_tokens=64, crop="60:135", image_size="66x200", color="yuv",
             policy="nac-official-exact+activation=elu", d_model=100, heads=20, topk=15, sparsity=0.7,
             batch_size=40, epochs=15, epoch_steps=500, loss="mse", smooth_labels="0", augment=True,
             side_correction=0.2, flip=True, shift_steer=0.002, shadows=True, color_jitter=0.0, steer_gain=3.0,
             steer_gain_from=0.01, fixed_throttle=0.05, **_ADAM)),
}


def preset_help() -> str:
    """--preset's --help: what each preset sets."""
    return ("the authors' experiment, as this trainer can run it (docs/usage.md, \"The paper's experiments as "
            "presets\"); a flag given beside it wins, except --window, --encoder and --frame-tokens, which are "
            "refused: " + "; ".join(f"{name}: {p.summary}" for name, p in PRESETS.items()))


def preset_settings(name: str, values: dict[str, Any], given: set[str] | frozenset[str],
                    flags: dict[str, tuple[str, Any]]) -> dict[str, Any]:
    """The arguments preset ``name`` sets for a command whose arguments are ``values`` (TrainArgs as a dict) and
    which gave the fields ``given``: the preset's settings except the given ones. ``flags``: each field's flag and
    default, for the one-line refusals (an unknown preset; a given flag that changes the preset's essence)."""
    if name not in PRESETS:
        raise ValueError(f"unknown --preset {name!r}; presets: {', '.join(PRESETS)}")
    preset = PRESETS[name]
    for field in preset.essence:
        flag, default = flags[field]
        wanted = preset.settings.get(field, default)
        if field in given and values[field] != wanted:
            raise ValueError(f"--preset {name} trains on what the authors' model reads ({flag} {wanted}); {flag} "
                             f"{values[field]} contradicts it: drop {flag}, or train without --preset")
    return {k: v for k, v in preset.settings.items() if k not in given}
