"""Offline evaluation on recorded driving (``evaluate.py --data REC --checkpoint CKPT``): how well a policy's
steering matches what a driver did, frame by frame, on a real simulator recording or a dataset.

Every episode (recording session) is streamed through the policy with its recorded timestamps, as the
closed-loop stream would see it (time-aware cores get the real, irregular clock). Steering is scored against
the recorded value and against its centred 0.5 s average (driving_data.labels: what a keyboard driver meant),
next to two trivial predictors that any useful policy must beat: always straight (0) and always the training
data's mean (from the checkpoint's target normalisation). Per session and pooled over all frames; one PNG per
session shows predicted and recorded steering over time (the plot users look at first).

A discrete student (CarRacing's five actions) is scored on the recorded action ids instead: how often its likeliest
action is the recorded one (beside always taking the commonest), the negative log-likelihood of the recorded action,
and the mean probability it puts on each action at the temperature it samples at -- e.g. how ready it is to brake,
which decides how fast it drives in closed loop (docs/results.md)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np
from tqdm import tqdm

from agent.controllers import load_policy, shipped_checkpoint
from driving_data.dataset import DemoDataset, dataset_action_spaces, is_recording, open_datasets
from driving_data.labels import DEFAULT_SMOOTHING_S, centred_average
from envs.registry import dataset_env
from agent.evaluation.config import EvalPlan
from agent.evaluation.drivers import check_action_options
from agent.evaluation.plots import steering_plot
from agent.runtime import NO_STRAIGHT_RATIO, mse_ratio, show_progress
from common.files import atomic_write_text, write_json
from policies.actions import at_temperature
from policies.checkpoint import RECORDING_STUDENT
from policies.precision import resolve as resolve_precision

PREDICTORS = ("policy", "straight", "mean")


def recorded_data(paths: list[str], out: Path, warn: Any = tqdm.write, made: list[Path] | None = None) -> DemoDataset:
    """The datasets, each once, with raw simulator recordings (driving_log.csv + IMG/) imported once into
    OUT/imported_data/<k>. ``made``: the imports made now."""
    from driving_data.udacity_import import import_recordings, once_each

    paths = once_each(paths, warn)
    roots = import_recordings(paths, [out / "imported_data" / str(k) for k in range(len(paths))], warn=warn, made=made)
    return open_datasets(roots if len(roots) > 1 else roots[0])


def scores(pred: np.ndarray, target: np.ndarray) -> dict[str, float]:
    err = np.asarray(pred, np.float64) - np.asarray(target, np.float64)
    return {"mse": float(np.mean(err ** 2)), "mae": float(np.mean(np.abs(err)))}


def score_episode(steer: np.ndarray, times: np.ndarray, predicted: np.ndarray, mean: float,
                  width_s: float = DEFAULT_SMOOTHING_S, keep: slice = slice(None)) -> dict[str, Any]:
    """MSE and MAE of the policy, always-straight and the training mean, against the raw steering and its
    centred average over ``width_s``, on the frames ``keep`` (the average still sees the frames around them)."""
    smooth = centred_average(times, steer, width_s)[keep]
    steer, predicted = steer[keep], predicted[keep]
    preds = {"policy": predicted, "straight": np.zeros_like(steer), "mean": np.full_like(steer, mean)}
    return {"frames": int(len(steer)),
            **{f"{name}_raw": scores(p, steer) for name, p in preds.items()},
            **{f"{name}_avg": scores(p, smooth) for name, p in preds.items()},
            "corr_raw": _corr(predicted, steer), "corr_avg": _corr(predicted, smooth),
            "pred_std": float(np.std(predicted)), "steer_std": float(np.std(steer))}


def _corr(a: np.ndarray, b: np.ndarray) -> float | None:
    if len(a) < 2 or np.std(a) == 0 or np.std(b) == 0:
        return None
    return float(np.corrcoef(a, b)[0, 1])


def pooled(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Frame-weighted means over sessions (so the pooled MSE is the MSE over every frame)."""
    n = np.array([r["frames"] for r in rows], dtype=np.float64)
    out: dict[str, Any] = {"frames": int(n.sum()), "sessions": len(rows)}
    for key in (f"{p}_{t}" for p in PREDICTORS for t in ("raw", "avg")):
        out[key] = {m: float(np.dot(n, [r[key][m] for r in rows]) / n.sum()) for m in ("mse", "mae")}
    for t in ("raw", "avg"):
        out[f"policy_vs_straight_mse_{t}"] = mse_ratio(out[f"policy_{t}"]["mse"], out[f"straight_{t}"]["mse"])
    return out


def score_discrete_episode(labels: np.ndarray, logits: np.ndarray, temperature: float = 1.0,
                           spared: Sequence[int] = ()) -> dict[str, Any]:
    """A discrete student's logits ``[T, K]`` against the recorded action ids ``[T]``: agreement of its likeliest
    action, the mean negative log-likelihood of the recorded action and the mean probability of each action, both
    under the softmax at ``temperature`` with ``spared`` actions kept (policies.actions.at_temperature: what
    ``sample`` draws from)."""
    z = np.asarray(logits, np.float64)
    logp = z - z.max(axis=1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(axis=1, keepdims=True))
    if temperature != 1.0:
        with np.errstate(divide="ignore"):
            logp = np.log(at_temperature(np.exp(logp), temperature, spared))
    labels = np.asarray(labels).astype(np.int64).reshape(-1)
    n, k = logp.shape
    if len(labels) != n:
        raise ValueError(f"{len(labels)} recorded actions for {n} frames")
    if n and (labels.min() < 0 or labels.max() >= k):
        raise ValueError(f"recorded actions must be ids of the student's {k} actions (0..{k - 1}); got "
                         f"{labels.min()}..{labels.max()}")
    return {"frames": int(n), "accuracy": float(np.mean(logp.argmax(axis=1) == labels)),
            "label_nll": float(-logp[np.arange(n), labels].mean()), "mean_probs": np.exp(logp).mean(axis=0).tolist(),
            "label_shares": (np.bincount(labels, minlength=k) / max(n, 1)).tolist()}


def pooled_discrete(rows: list[dict[str, Any]], action_names: list[str]) -> dict[str, Any]:
    """Frame-weighted means over sessions, and the agreement of always taking the commonest recorded action."""
    n = np.array([r["frames"] for r in rows], dtype=np.float64)
    w = n / n.sum()
    out: dict[str, Any] = {"frames": int(n.sum()), "sessions": len(rows), "action_names": list(action_names),
                           **{k: float(np.dot(w, [r[k] for r in rows])) for k in ("accuracy", "label_nll")},
                           **{k: (w @ np.array([r[k] for r in rows])).tolist() for k in ("mean_probs", "label_shares")}}
    common = int(np.argmax(out["label_shares"]))
    out["commonest_label"], out["commonest_label_accuracy"] = action_names[common], out["label_shares"][common]
    return out


def _evaluate_discrete(policy: Any, data: DemoDataset, out_dir: Path, name: str, temperature: float,
                       spared: Sequence[int], progress: bool) -> dict[str, Any]:
    names = list(policy.config.action_names)
    rows = []
    for i in tqdm(range(len(data)), desc=name, unit="episode", disable=not progress):
        arrays = data.load(i, keys=["frames", "time", "expert_action"])
        logits = policy.predict_episode(arrays["frames"], np.asarray(arrays["time"], np.float64))
        rows.append({"episode": i, **score_discrete_episode(arrays["expert_action"], logits, temperature, spared)})
    summary = {"name": name, "data": str(data.root), "precision": policy.precision, "temperature": temperature,
               **({"temperature_spares": [names[i] for i in spared]} if spared else {}),
               "pooled": pooled_discrete(rows, names), "sessions": rows}
    write_json(out_dir / "offline.json", summary)
    return summary


def recorded_frame_shape(data: Any) -> tuple[int, ...]:
    """The one size [H, W, C] of every episode's camera frames; ValueError when they differ (no student fits both)."""
    shapes = sorted({tuple(int(x) for x in data.array_shape(i, "frames")[1:]) for i in range(len(data))})
    if len(shapes) != 1:
        raise ValueError(f"{data.root} holds camera frames of several sizes {shapes}; a policy scores frames of the "
                         "one size it was trained on")
    return shapes[0]


def camera_students(data: Any) -> tuple[str, ...]:
    """Gym ids of the envs whose students can steer a real recording's frames: every first-person env whose camera
    frames have the recording's shape (a recording imports as `udacity`, but a udacity-hard student reads it too)."""
    from driving_data.dataset import is_recording
    from envs.registry import camera_envs

    if not any(is_recording(m) for m in data.episodes):
        return ()
    return camera_envs(data.card.get("frame_shape") or ())


def evaluate_recorded(policy: Any, data: DemoDataset, out_dir: Path, name: str, progress: bool = False,
                      temperature: float = 1.0, spared: Sequence[int] = (),
                      span: tuple[float, float] = (0.0, 1.0)) -> dict[str, Any]:
    """Score one policy on every episode of ``data``; writes OUT/offline.json and (steering) OUT/steering_<k>.png.
    ``temperature``, ``spared``: a discrete student's softmax temperature and the actions it leaves alone.
    ``span``: steering is scored on that part of every session (fractions, as the replay's), the policy streamed
    through the whole session as in closed loop, so its window is full when the part begins."""
    from envs.replay.spec import span_slice

    env = dataset_env(data.card, data.episodes)
    if policy.config.env != env.gym_id and policy.config.env not in camera_students(data):
        raise ValueError(f"checkpoint {name!r} drives {policy.config.env!r}; the data was recorded in {env.gym_id!r}")
    spaces = dataset_action_spaces(data.card, data.episodes)
    if spaces and spaces != {policy.config.action_space}:
        raise ValueError(f"checkpoint {name!r} has a {policy.config.action_space} action space; the data's actions "
                         f"are {', '.join(sorted(spaces))}")
    if policy.config.head == "discrete":
        return _evaluate_discrete(policy, data, out_dir, name, temperature, spared, progress)
    if "steer" not in policy.config.action_names:
        raise ValueError(f"checkpoint {name!r} predicts no continuous steering; offline scores compare steering")
    col = list(policy.config.action_names).index("steer")
    label_names = list(data.card.get("action_names") or env.action_names.get("continuous", ["steer"]))
    mean = float((policy.config.target_mean or [0.0] * policy.config.action_dim)[col])
    rows = []
    for i in tqdm(range(len(data)), desc=name, unit="session", disable=not progress):
        arrays = data.load(i, keys=["frames", "time", "expert_action"])
        labels = np.asarray(arrays["expert_action"], np.float64).reshape(len(arrays["time"]), -1)
        steer = labels[:, label_names.index("steer")]
        times = np.asarray(arrays["time"], np.float64)
        predicted = policy.steered(policy.predict_episode(arrays["frames"], times))[:, col].astype(np.float64)
        keep = span_slice(span, len(times))
        if keep.stop - keep.start < 2:
            continue  # a session too short to hold two frames in the span
        row = {"episode": i, "duration_s": float(times[keep][-1] - times[keep][0]),
               **score_episode(steer, times, predicted, mean, keep=keep)}
        rows.append(row)
        steering_plot(out_dir / f"steering_{i}.png", times, steer, centred_average(times, steer), predicted,
                      f"{name}, session {i}", DEFAULT_SMOOTHING_S)
    if not rows:
        raise ValueError(f"no session of {data.root} holds two frames in the span {span[0]:g}:{span[1]:g}")
    summary = {"name": name, "data": str(data.root), "precision": policy.precision, "smoothing_s": DEFAULT_SMOOTHING_S,
               "mean_predictor": mean,
               **({"span": list(span)} if tuple(span) != (0.0, 1.0) else {}), "pooled": pooled(rows), "sessions": rows}
    write_json(out_dir / "offline.json", summary)
    return summary


def offline_markdown(results: dict[str, dict[str, Any]]) -> str:
    """One row per policy (pooled over every frame), beside the trivial predictors."""
    first = next(iter(results.values()))["pooled"]
    if "accuracy" in first:
        return _discrete_markdown(results)
    lines = ["| predictor | MSE vs 0.5 s average | MAE vs 0.5 s average | MSE vs recorded | MAE vs recorded | "
             "MSE / straight's (avg) |",
             "|---|---|---|---|---|---|"]
    rows = [(n, r["pooled"], "policy") for n, r in results.items()] + [
        ("always straight", first, "straight"), ("training mean", first, "mean")]
    for label, p, key in rows:
        ratio = mse_ratio(p[f"{key}_avg"]["mse"], first["straight_avg"]["mse"])
        lines.append(f"| {label} | {p[f'{key}_avg']['mse']:.4f} | {p[f'{key}_avg']['mae']:.4f} | "
                     f"{p[f'{key}_raw']['mse']:.4f} | {p[f'{key}_raw']['mae']:.4f} | "
                     f"{'-' if ratio is None else f'{ratio:.2f}'} |")
    return ("\n".join(lines) + f"\n\n{first['frames']} frames in {first['sessions']} session(s)."
            + ("" if first["policy_vs_straight_mse_avg"] is not None else f" MSE / straight's: {NO_STRAIGHT_RATIO}.")
            + "\n")


def vs_straight(p: dict[str, Any]) -> str:
    """'(0.52 x always-straight's 0.0123)', or why there is no such ratio."""
    ratio = p["policy_vs_straight_mse_avg"]
    if ratio is None:
        return f"({NO_STRAIGHT_RATIO})"
    return f"({ratio:.2f} x always-straight's {p['straight_avg']['mse']:.4f})"


def _discrete_markdown(results: dict[str, dict[str, Any]]) -> str:
    first = next(iter(results.values()))["pooled"]
    names = first["action_names"]
    lines = ["| predictor | agrees with the recorded action | NLL of the recorded action | "
             + " | ".join(f"p({a})" for a in names) + " |", "|---|---|---|" + "---|" * len(names)]
    for label, r in results.items():
        p = r["pooled"]
        spares = "".join(f", {a} spared" for a in r.get("temperature_spares", []))
        lines.append(f"| {label} (temperature {r['temperature']:g}{spares}) | {p['accuracy']:.3f} | "
                     f"{p['label_nll']:.3f} | " + " | ".join(f"{x:.3f}" for x in p["mean_probs"]) + " |")
    lines.append(f"| always {first['commonest_label']} (the recorded actions' shares) | "
                 f"{first['commonest_label_accuracy']:.3f} | - | "
                 + " | ".join(f"{x:.3f}" for x in first["label_shares"]) + " |")
    return ("\n".join(lines) + f"\n\n{first['frames']} frames in {first['sessions']} episode(s); p(action): the mean "
            "probability of each action under the softmax at the temperature the student samples at.\n")


def evaluate_offline(plan: EvalPlan, made: list[Path] | None = None) -> dict[str, dict[str, Any]]:
    """evaluate.py --data: score every checkpoint on recorded driving: steering, or a discrete student's actions at
    the temperature it samples at (its own, or --action-temperature). ``made``: the imports made now."""
    d, root = plan.drivers, plan.outputs.out
    data = recorded_data(list(plan.track.data), root, made=made)
    env = dataset_env(data.card, data.episodes)
    # a person's recording of the real simulator: the student made for its frames
    real = any(is_recording(m) for m in data.episodes)
    paths = list(d.checkpoints) or [str(RECORDING_STUDENT if real else shipped_checkpoint(env.name))]
    device = plan.runtime.device
    precision = resolve_precision(plan.runtime.precision, device)
    policies = [load_policy(p, env.name, None, device, camera_students(data), recorded_frame_shape(data),
                            recorded=True).use_precision(precision)
                for p in paths]
    names = d.names_of(paths)
    for path, policy in zip(paths, policies):
        check_action_options(d, path, policy.config)
    results = {}
    for name, policy in zip(names, policies):
        temperature = (d.action_temperature if d.action_temperature is not None
                       else policy.config.temperature_for(d.discrete_actions))
        results[name] = evaluate_recorded(policy, data, root if len(paths) == 1 else root / name, name,
                                          progress=show_progress(plan.outputs.progress), temperature=temperature,
                                          spared=d.spared, span=plan.track.data_span)
        p = results[name]["pooled"]
        if "accuracy" in p:
            tqdm.write(f"{name}: agrees with the recorded action on {p['accuracy']:.3f} of {p['frames']} frames "
                       f"(always {p['commonest_label']}: {p['commonest_label_accuracy']:.3f}); mean probabilities at "
                       f"temperature {temperature:g}: " + ", ".join(
                           f"{a} {x:.3f}" for a, x in zip(p["action_names"], p["mean_probs"])))
        else:
            tqdm.write(f"{name}: steering MSE {p['policy_avg']['mse']:.4f} vs the 0.5 s average "
                       f"{vs_straight(p)}, "
                       f"{p['policy_raw']['mse']:.4f} vs the recorded values "
                       f"({p['straight_raw']['mse']:.4f} straight), "
                       f"{p['frames']} frames")
    discrete = "accuracy" in next(iter(results.values()))["pooled"]
    table = offline_markdown(results)
    atomic_write_text(root / "offline.md", f"# Offline {'action' if discrete else 'steering'} scores on "
                                           f"{', '.join(plan.track.data)}\n\n{table}")
    tqdm.write(f"outputs in {root}/: offline.md, offline.json" + ("" if discrete else ", steering_<session>.png"))
    return results
