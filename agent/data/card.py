"""The dataset card (DATA/dataset.json): what a dataset holds, who recorded it and how, derived from the
episodes' own metadata so it is right even after a crash between an episode file and its card."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

import numpy as np

from agent.data.recorder import steer_bins
from common.files import file_sha256
from driving_data.dataset import FORMAT
from envs.registry import EnvSpec


def expert_summary(expert: Any) -> dict[str, Any]:
    """What the dataset card keeps about the expert: identity and its own card's headline numbers."""
    card = expert.card or {}
    ev = card.get("evaluation", {})
    built_in = expert.path is None  # a replay's path controller: no file
    return {
        "path": None if built_in else str(expert.path),
        "sha256": None if built_in else file_sha256(Path(expert.path)),
        **({"init_sha256": card["init_sha256"]} if card.get("latency_steps") and card.get("init_sha256") else {}),
        **({"driver": card.get("driver")} if built_in else {}),
        "action_space": expert.action_space,
        "algorithm": card.get("algorithm"),
        "train_seeds": card.get("train_seeds"),
        "selection_seeds": card.get("selection", {}).get("seeds"),
        "evaluation": ({k: ev.get(k) for k in ("seeds", "mean_return", "std_return", "laps_finished", "episodes")}
                       if ev else None),
    }


def _mean_std(x: list[float]) -> dict[str, float | None]:
    if not x:
        return {"mean": None, "std": None, "min": None, "max": None}
    a = np.asarray(x, dtype=np.float64)
    return {"mean": float(a.mean()), "std": float(a.std()), "min": float(a.min()), "max": float(a.max())}


def _weighted_noise(metas: list[dict]) -> list[float] | None:
    rows = [(m["mean_abs_noise"], m["length"]) for m in metas if m.get("mean_abs_noise") is not None]
    if not rows:
        return None
    return (np.average([r for r, _ in rows], axis=0, weights=[n for _, n in rows])).round(5).tolist()


def _counts(values: Iterable[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return out


def _episode_meta_keys(metas: list[dict]) -> list[str]:
    """The env's own per-episode keys (spec.episode_meta), in first-seen order."""
    known = {"episode_id", "track_seed", "return", "length", "terminated", "truncated", "stopped_early", "noise",
             "perturbed_fraction", "driver", "beta", "renderer"}
    keys: dict[str, None] = {}
    for m in metas:
        keys.update({k: None for k in m.get("env_meta_keys", ()) if k not in known})
    return list(keys)


def _action_histogram(metas: list[dict], spec: EnvSpec, space: str) -> dict[str, Any]:
    """The episodes' action histograms (executed and label) summed: counts per discrete action, or steering
    bins and pedal use."""
    names = spec.action_names[space]
    stats = [m.get("stats", {}) for m in metas]

    def total(key: str) -> Any:
        vals = [s[key] for s in stats if key in s]
        if not vals:
            return None
        return np.sum(np.asarray(vals), axis=0).tolist()

    if space == "discrete":
        return {"names": list(names), "executed": total("executed_counts"), "label": total("label_counts")}
    steps = max(1, sum(m["length"] for m in metas))
    hist: dict[str, Any] = {"steer_bin_edges": steer_bins(spec.steer_limit[space]).round(3).tolist()}
    for name in ("executed", "label"):
        hist[name] = {"steer_counts": total(f"{name}_steer_counts")}
        for pedal in ("gas", "brake"):
            if pedal in names:
                hist[name][f"{pedal}_fraction"] = (total(f"{name}_{pedal}_steps") or 0) / steps
                hist[name][f"mean_{pedal}"] = (total(f"{name}_{pedal}_sum") or 0.0) / steps
    return hist


def _recovery_counts(metas: list[dict]) -> dict[str, Any]:
    """collect.py --recovery-labels / --recovery-starts: steps the recovery teacher labelled, episodes that
    started placed (absent from datasets recorded without them)."""
    if not any("recovery_labels" in m for m in metas):
        return {}
    return {"recovery_label_steps": int(sum(m.get("recovery_label_steps", 0) for m in metas)),
            "recovery_labelled_episodes": int(sum(bool(m.get("recovery_labels")) for m in metas)),
            "recovery_starts": int(sum(m.get("start") is not None for m in metas))}


def build_card(config: dict, expert: dict, runs: list[dict], metas: list[dict], spec: EnvSpec) -> dict[str, Any]:
    """The dataset card, derived from the episode metas (so it is right even after a crash between an
    episode file and its card update)."""
    space = config["action_space"]
    names = spec.action_names[space]
    dt = spec.dt
    returns = [m["return"] for m in metas]
    hist = _action_histogram(metas, spec, space)
    seeds = [m["track_seed"] for m in metas]
    steps_total = int(sum(m["length"] for m in metas))
    return {
        "format": FORMAT,
        "env": config["env"],
        "gym_id": spec.gym_id,
        "action_space": space,
        "frame_shape": list(spec.frame_shape),
        "cameras": ["frames", *[k for k in spec.recorded_info if k.startswith("frames")]],
        "action_names": list(names),
        "dt": dt,
        "config": config,
        "seeds": {
            "rule": "episode k uses track seed config.seed + k",
            "first": min(seeds) if seeds else None,
            "last": max(seeds) if seeds else None,
            "why": "disjoint from the expert's training draws [100000, 2000000), its validation 90000.. and card "
                   "evaluation 1000.. tracks, and evaluate.py's default 1000..; seeds < 100000 are for evaluation",
        },
        "expert": expert,
        "counts": {
            "episodes": len(metas),
            "steps": steps_total,
            "hours_of_driving": steps_total * dt / 3600,
            "laps_finished": int(sum(m.get("lap_complete", False) for m in metas)),
            "terminated": int(sum(m["terminated"] for m in metas)),
            "truncated": int(sum(m["truncated"] for m in metas)),
            "stopped_early": int(sum(bool(m.get("stopped_early")) for m in metas)),
            # discrete: steps whose executed action is not the label; continuous: mean |executed - label| per
            # action dimension (every continuous step is perturbed a little, so a count would say nothing)
            "perturbed_steps": int(sum(round(m.get("perturbed_fraction", 0) * m["length"]) for m in metas))
            if space == "discrete" else None,
            "mean_abs_noise": None if space == "discrete" else _weighted_noise(metas),
            # DAgger: episodes a student drove (collect.py --driver); their returns are the student's
            "driven_by": {"expert": sum(m.get("driver") is None for m in metas),
                          "student": sum(m.get("driver") is not None for m in metas)},
            # who drew the frames (collect.py --renderer); episodes from before the option had the default
            "renderers": _counts(m.get("renderer", spec.renderers[0]) for m in metas),
            **_recovery_counts(metas),
        },
        "returns": _mean_std(returns),
        "expert_driven_returns": _mean_std([m["return"] for m in metas if m.get("driver") is None]),
        "action_histogram": hist,
        "feature_names": list(spec.feature_names),
        "episodes": [
            {k: m.get(k) for k in ("episode_id", "track_seed", "return", "length", *_episode_meta_keys(metas),
                                   "terminated", "truncated", "stopped_early", "noise", "perturbed_fraction",
                                   "driver", "beta", "renderer")}
            for m in metas
        ],
        "runs": runs,
    }
