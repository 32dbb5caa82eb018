"""The whole train.py command: one or several cores, one split or k folds, one process or a torchrun group;
a summary line per core and, for several, a comparison table (comparison.md / .json)."""
from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agent.runtime import NO_STRAIGHT_RATIO
from agent.training import distributed
from agent.training.config import TrainPlan, data_label, data_paths, imported, with_env_defaults
from agent.training.data import load_data, resolve_head, use_recording
from agent.training.distributed import barrier, device_for
from agent.training.loop import train_run
from agent.training.starting_policy import fine_tuned
from agent.training.windows import describe_blocks, make_splits, validation_candidates
from common.files import run_folder, write_json
from driving_data.dataset import DemoDataset, open_datasets
from policies.precision import choose as choose_precision

SUMMARY_KEYS = ("val_loss", "val_accuracy", "val_mae", "val_mse", "val_steer_mae", "val_steer_mse",
                "val_steer_vs_straight", "val_steer_vs_mean",
                "attn_entropy", "attn_entropy_norm", "attn_max_weight")  # attn_*: log_nac_internals


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean and std (over folds) of the best-epoch validation metrics and the costs."""
    out: dict[str, Any] = {"policy": runs[0]["policy"], "runs": len(runs),
                           "param_count": runs[0]["param_count"]}
    for key in SUMMARY_KEYS + ("train_time_s", "samples_per_sec"):
        values = [r["best"][key] if key in r["best"] else r.get(key) for r in runs]
        if all(v is not None for v in values):
            out[key] = {"mean": float(np.mean(values)), "std": float(np.std(values)), "values": values}
    return out


def fmt(stat: dict[str, Any] | None, digits: int = 4) -> str:
    if stat is None:
        return "-"
    if len(stat["values"]) == 1:
        return f"{stat['mean']:.{digits}f}"
    return f"{stat['mean']:.{digits}f} ± {stat['std']:.{digits}f}"


def comparison_table(summaries: list[dict[str, Any]]) -> str:
    """Markdown table, one row per policy: its block structure (attention cores), the best-epoch validation
    metrics, the attention statistics where the run recorded them, parameters and cost."""
    from policies.cores import block_of

    keys = [k for k in SUMMARY_KEYS if any(k in s for s in summaries)]
    header = ["policy", "block"] + keys + ["params", "train time (s)", "samples/s"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for s in summaries:
        try:
            block = block_of(s["policy"]) or "-"
        except ValueError:  # a core name policies.cores does not parse (a comparison.json written elsewhere)
            block = "?"
        row = [s["policy"], block] + [fmt(s.get(k), 3 if k.startswith("attn_") else 4) for k in keys] + [
            f"{s['param_count']:,}", fmt(s.get("train_time_s"), 0), fmt(s.get("samples_per_sec"), 0)]
        lines.append("| " + " | ".join(row) + " |")
    if any(k.startswith("attn_") for k in keys):
        lines.append("\nattn_*: attention of the attention cores on 128 validation windows (mean over heads and the "
                     "queries with >= 2 visible keys); uniform attention has attn_entropy_norm 1.000 and "
                     "attn_max_weight = the mean of 1/(visible keys), 0.245 for 8 causal frames.")
    return "\n".join(lines) + "\n"


def auto_threads(processes: int = 1) -> int:
    """2 threads on an idle 2-core machine; 1 when other jobs already load it (there 2 threads wait on each
    other and train slower than 1). Under torchrun the ``processes`` of a machine share its cores."""
    cores = (os.cpu_count() or 1) // max(1, processes)
    try:
        busy = os.getloadavg()[0] >= cores - 0.5
    except OSError:
        busy = False
    return 1 if busy or cores < 2 else 2


def resume_args(out: Path) -> list[str]:
    """train.py's ``--out OUT``, with ``--resume`` where a run began there: a stopped run goes on from its last
    epoch and a finished one is reused, so a script that trains step by step can simply be run again."""
    return ["--out", str(out), *(["--resume"] if (out / "args.json").is_file() else [])]


def finished(out: Path) -> bool:
    """Whether the one-core train.py run in ``out`` ran all its epochs: its last.pt says so and its metrics.json is
    written (a stopped run has a last.pt that does not, and no metrics.json)."""
    from policies.checkpoint import read_checkpoint

    last = out / "last.pt"
    return (out / "metrics.json").is_file() and last.is_file() and \
        bool(read_checkpoint(last).get("train_state", {}).get("done"))


def run(plan: TrainPlan) -> dict[str, Any]:
    """The whole command, from its plan (agent.training.config.resolve: the arguments checked and resolved before
    anything touches --out): one or several policies, one split or k folds. Returns the summaries.

    The folder is locked (by rank 0 alone), then what the data decides is resolved once (resolve_data). Under
    torchrun (agent.training.distributed) every rank resolves its arguments and runs this: the checks and the data
    on each, one process group around the training runs, the files written by rank 0."""
    out = Path(plan.run.out)
    with run_folder(out, "train.py", lock=int(os.environ.get("RANK", "0")) == 0):
        if not plan.run.resume and (out / "args.json").exists() and not plan.run.overwrite:
            from driving_data.udacity_import import is_raw_recording

            # a recording is imported, not opened
            datasets = [d for d in data_paths(plan.data.paths) if not is_raw_recording(d)]
            if datasets:
                open_datasets(datasets)  # a mistyped --data is the likelier mistake: say that first
            raise ValueError(f"{str(out)!r} already holds a run; pass --resume to continue it, --overwrite to "
                             f"start again, or another --out")
        from driving_data.udacity_import import removed_if_refused

        made: list[Path] = []
        with removed_if_refused(made):  # a run refused after importing its recording leaves no import behind
            return _run_in(plan, made)


def resolve_data(plan: TrainPlan, world: distributed.World,
                 made: list[Path] | None = None) -> tuple[TrainPlan, DemoDataset]:
    """What the data decides, resolved once: a raw recording imported into --out (by rank 0 first, the others then
    read the import), the defaults of the dataset's env. Returns the plan and the opened dataset. ``made``: the
    imports made now."""
    d, out = plan.data, Path(plan.run.out)
    if world.main:
        data, weight = use_recording(d.paths, d.dataset_weight, d.strict_images, out, made)
    barrier(world)
    if not world.main:
        data, weight = use_recording(d.paths, d.dataset_weight, d.strict_images, out)
    plan = imported(plan, data, weight)
    dataset = open_datasets(plan.data.paths)
    return with_env_defaults(plan, dataset), dataset


def _run_in(plan: TrainPlan, made: list[Path]) -> dict[str, Any]:
    out = Path(plan.run.out)
    world = distributed.from_env()
    device = device_for(plan.run.device, world)
    with distributed.joined(world, device) as world:
        barrier(world)  # every rank has read and checked the folder before rank 0 writes into it
        torch.set_num_threads(plan.run.threads or auto_threads(world.local_size))
        precision = choose_precision(plan.run.precision, device)  # chosen once: every run trains in it
        if world.main:
            print(precision.line())
        plan, dataset = resolve_data(plan, world, made)
        plan = replace(plan, record={**plan.record, "precision_resolved": precision.record()})  # args.json keeps it
        folds = plan.run.folds
        data = load_data(plan.data, world, out, dataset)
        head = resolve_head(plan, data)  # fail early on a head the data cannot feed
        if plan.model.init is not None and not plan.run.resume:  # and on a checkpoint it cannot fine-tune
            fine_tuned(plan.model, data, head.kind, head.names)
        held = validation_candidates(data)
        if len(held) < data.num_episodes and world.main:
            print(f"real recordings with other episodes (a simulator's, or a replay's DAgger rounds): validation is "
                  f"drawn from the {len(held)} recorded sessions only; the {data.num_episodes - len(held)} other "
                  f"episodes always train")
        data, splits = make_splits(plan.split, plan.windows, data)
        if data.pieces is not None and world.main:
            print(describe_blocks(data, splits[0]))
        if world.main:
            out.mkdir(parents=True, exist_ok=True)
            write_json(out / "args.json", plan.record)
        made.clear()  # the run has begun: its imports are its data from now on (--resume reads them)

        summaries = []
        for spec in plan.specs:
            spec_dir = out / spec if len(plan.specs) > 1 else out
            runs = []
            for k, (train_eps, val_eps) in enumerate(splits):
                run_dir = spec_dir / f"fold_{k}" if folds else spec_dir
                desc = f"{spec} fold {k + 1}/{folds}" if folds else spec
                runs.append(train_run(plan, spec, data, head, train_eps, val_eps, run_dir, desc, world, device,
                                      precision))
            summary = summarize(runs)
            summaries.append(summary)
            if folds and world.main:
                write_json(spec_dir / "folds.json", {"summary": summary, "runs": [r["run_dir"] for r in runs]})
            if world.main:
                print(one_line(summary, runs))
                if (warning := not_learned(summary)) is not None:
                    print(warning)
        if (len(plan.specs) > 1 or folds) and world.main:
            table = comparison_table(summaries)
            w = plan.windows
            (out / "comparison.md").write_text(
                f"Behaviour cloning on `{data_label(plan.data.paths)}` (seed {plan.run.seed}, window {w.window}, "
                f"stride {w.frame_stride}, {plan.optimisation.epochs} epochs{f', {folds} folds' if folds else ''}); "
                "validation metrics at the best epoch.\n\n" + table)
            write_json(out / "comparison.json", {"args": plan.record, "summaries": summaries})
            print("\n" + table)
    return {"out": str(out), "summaries": summaries}


NOT_LEARNED_RATIO = 0.9  # on the pool, students that learned scored 0.54-0.71x always-straight; stuck ones 0.96-1.01x


def not_learned(summary: dict[str, Any]) -> str | None:
    """A warning when the best epoch steers hardly better than always-straight: a stuck run (recurrent cores after
    one epoch on a pool, at some seeds) looks like a finished one, and drives like a straight line."""
    ratio = (summary.get("val_steer_vs_straight") or {}).get("mean")
    if ratio is None or ratio < NOT_LEARNED_RATIO:
        return None
    return (f"warning: {summary['policy']} has not learned to steer: its validation steering error is {ratio:.2f}x "
            "always-straight's; train longer (--epochs) or from another --seed before driving with it")


def one_line(summary: dict[str, Any], runs: list[dict[str, Any]]) -> str:
    metrics = " ".join(f"{k} {fmt(summary[k])}" for k in SUMMARY_KEYS if k in summary)
    where = runs[0]["run_dir"] + "/best.pt" if len(runs) == 1 else f"{len(runs)} folds"
    if "val_steer_mse" in summary and "val_steer_vs_straight" not in summary:
        metrics += f" ({NO_STRAIGHT_RATIO})"
    return (f"{summary['policy']}: {metrics} | {summary['param_count']:,} params | "
            f"{fmt(summary['train_time_s'], 0)} s | {fmt(summary['samples_per_sec'], 0)} samples/s -> {where}")
