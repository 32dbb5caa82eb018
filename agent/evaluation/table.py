"""Several trainings of each policy, one table: a closed-loop comparison of cores across training seeds.

One training of a core says little: two trainings of the same core differ in closed loop as much as two cores
do. So a comparison trains every core k times (training seeds) and evaluates each set on the same tracks:
`evaluate.py --checkpoint A B C --name a b c --out RUN_k`, one folder per training seed. This module reads
those folders and writes one table: per policy, its figures pooled over every training seed (each seed's
headline figure listed too), per scene group where the env has scenes (themes, conditions; held-out ones
marked), and its paired difference to the first policy -- per (training seed, track) pair, other minus first,
mean (standard error over the pairs), so a track's own difficulty cancels out.

    python -m agent.evaluation.table eval/hard_cmp/s1 eval/hard_cmp/s2 eval/hard_cmp/s3 --out table.md

Folders evaluated under different timing conditions (evaluate.py --drop-prob / --jitter / --latency-steps, read
from each metrics.json's ``timing`` block) make a timing table: one column per condition, in the order first
given, each condition's folders in the same training-seed order, so that a policy pairs with itself across
conditions per (training seed, track):

    python -m agent.evaluation.table eval/t/{regular,drop,jitter,latency}/s{1,2,3}

Discrete students driven under different action rules (evaluate.py --discrete-actions / --action-temperature, read
from metrics.json) are conditions in the same way: ``eval/T1/s{1,2,3} eval/T1.5/s{1,2,3}`` pairs each policy with
itself sampled at the two temperatures.

Policies of one training seed evaluated in separate runs on the same tracks count as one evaluation when their
folders are joined by commas (``eval/a/s1,eval/b/s1``); ``--pair A:B`` adds B minus A, paired the same way, for
pairs other than "each policy minus the first" (a core trained two ways, say). Folders that each hold a single
policy (``evaluate.py --checkpoint X --out eval/x/drop``) are one policy, whatever the folders are called.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from agent.evaluation.metrics import METRICS, aggregate, autonomy_formula, columns, paired_differences, paired_keys
from agent.evaluation.timing import TimingConditions, parse_jitter
from common.cli import option, run_command
from common.files import atomic_write_text

PROG = "python -m agent.evaluation.table"

Run = dict[str, dict[str, Any]]  # policy name -> its metrics.json (episodes included)


def read_run(folder: str | Path) -> Run:
    """Every policy evaluated in one evaluate.py output folder, in comparison order: name -> metrics.json. Folders
    joined by commas are read as one run (each policy's name must then be unique among them)."""
    if "," in str(folder):
        joined: Run = {}
        for part in _given_names([read_run(part) for part in str(folder).split(",")]):
            for name, summary in part.items():
                if name in joined:
                    raise ValueError(f"{str(folder)!r}: policy {name!r} is in more than one of the joined folders")
                joined[name] = summary
        return joined
    folder = Path(folder)
    comparison = folder / "comparison.json"
    if comparison.is_file():
        names = list(json.loads(comparison.read_text()))
    elif (folder / "metrics.json").is_file():
        return {folder.name: json.loads((folder / "metrics.json").read_text())}
    else:
        raise FileNotFoundError(f"{str(folder)!r} holds no evaluate.py output (no comparison.json or metrics.json)")
    run = {}
    for name in names:
        path = folder / name / "metrics.json"
        if not path.is_file():
            raise FileNotFoundError(f"{str(folder)!r}: comparison.json names {name!r} but {path} is missing")
        run[name] = json.loads(path.read_text())
    return run


def _given_names(parts: list[Run]) -> list[Run]:
    """Joined folders that each hold one policy (``eval/lstm_s1,eval/gru_s1``) name them as evaluate.py --name did,
    so that every training seed's run holds the same names; by their folders where those names are missing or
    would collide (two runs of checkpoints that kept the default name)."""
    singles = {k: next(iter(part.values())) for k, part in enumerate(parts) if len(part) == 1}
    given = [summary.get("name") for summary in singles.values()]
    if None in given or len(set(given)) < len(given):
        return parts
    return [{singles[k]["name"]: singles[k]} if k in singles else part for k, part in enumerate(parts)]


def same_single_policy(runs: Sequence[Run]) -> list[Run]:
    """Folders that each hold one policy hold the same one (a table pools one policy's trainings or conditions), so
    they are named alike: by the name evaluate.py gave it, when every run agrees on it, else by the first folder.
    Without this, ``eval/x/{regular,drop}`` of one checkpoint would read as two policies named by their folders."""
    if len(runs) < 2 or any(len(run) != 1 for run in runs):
        return list(runs)
    given = {next(iter(run.values())).get("name") for run in runs}
    name = given.pop() if len(given) == 1 and None not in given else next(iter(runs[0]))
    return [{name: next(iter(run.values()))} for run in runs]


def check_runs(runs: Sequence[Run]) -> list[str]:
    """The policy names every run holds, in the first run's order. The runs must hold the same policies on the same
    env and tracks, or their pooled figures would mix different tests."""
    if not runs:
        raise ValueError("give at least one evaluation folder")
    names = list(runs[0])
    for k, run in enumerate(runs[1:], 2):
        if sorted(run) != sorted(names):
            raise ValueError(f"evaluation {k} holds policies {sorted(run)}, the first {sorted(names)}: "
                             "every folder must evaluate the same policies")
    first = runs[0][names[0]]
    for run in runs:
        for name, s in run.items():
            if s.get("env") != first.get("env") or sorted(s.get("seeds", [])) != sorted(first.get("seeds", [])):
                raise ValueError(f"{name!r}: env {s.get('env')!r} on seeds {_span(s.get('seeds', []))} differs from "
                                 f"{first.get('env')!r} on {_span(first.get('seeds', []))}: compare on the same tracks")
    return names


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _span(seeds: Sequence[int]) -> str:
    return f"{min(seeds)}..{max(seeds)}" if seeds else "none"


def _scenes(env: str | None) -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
    """Per scene kind, (all names in the env's order, the ones held out of training); empty for envs without."""
    from envs.registry import get_spec

    try:
        spec = get_spec(str(env))
    except ValueError:  # an env this project does not know: episodes in their own order, nothing marked
        return {}
    return {"theme": (spec.themes, tuple(t for t in spec.themes if t not in spec.train_themes)),
            "condition": (spec.conditions, tuple(c for c in spec.conditions if c not in spec.train_conditions))}


def _groups(summary: dict[str, Any]) -> list[tuple[str, str, Any]]:
    """(label, episode key, value) of every scene group driven, themes then conditions in the env's order; `all`
    first of all."""
    out: list[tuple[str, str, Any]] = [("all", "", None)]
    scenes = _scenes(summary.get("env"))
    for key in ("theme", "condition"):
        order, held = scenes.get(key, ((), ()))
        driven = set(e[key] for e in summary["episodes"] if key in e)
        values = [v for v in order if v in driven] + sorted(driven - set(order))
        out += [(f"{v} (held out)" if v in held else v, key, v) for v in values]
    return out


def _pick(episodes: list[dict[str, Any]], key: str, value: Any) -> list[dict[str, Any]]:
    return episodes if not key else [e for e in episodes if e.get(key) == value]


def _tagged(runs: Sequence[Run], name: str) -> list[dict[str, Any]]:
    """A policy's episodes over every run, each seed tagged by its run so that pairs match (run, track)."""
    return [{**e, "seed": (k, e["seed"])} for k, run in enumerate(runs) for e in run[name]["episodes"]]


def _summary(episodes: list[dict[str, Any]], first: dict[str, Any]) -> dict[str, Any]:
    """evaluate.py's own summary of a pool of episodes: autonomy counts every intervention against all the time
    driven, means skip NaN, in the units of the first run."""
    units = {k: first[k] for k in ("dt", "intervention_cost_s") if k in first}
    return aggregate(episodes, groups=False, **units)


def _lane_table(runs: Sequence[Run], names: list[str]) -> str:
    """The table for lane-keeping envs (udacity): autonomy per group, interventions, |CTE|, steering jerk."""
    first = runs[0][names[0]]
    groups = _groups(first)
    autonomy = METRICS["autonomy"]
    pooled_columns = columns("lane pool")
    head = ["policy", f"{autonomy.label} per training seed"] + [f"{g[0]} %" for g in groups] + [
        c.header for c in pooled_columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in names:
        eps = _tagged(runs, name)
        pooled = {**_summary(eps, first), "runs": len(runs)}
        cells = [name, " / ".join(f"{_summary(run[name]['episodes'], first)['autonomy']:{autonomy.fmt}}"
                                  for run in runs)]
        cells += [f"{_summary(_pick(eps, key, value), first)['autonomy']:{autonomy.fmt}}" for _, key, value in groups]
        cells += [c.cell(pooled) for c in pooled_columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + f"\n\n{autonomy_formula(float(first.get('intervention_cost_s', 6.0)))}.\n"


def _race_table(runs: Sequence[Run], names: list[str]) -> str:
    """The table for racing envs (CarRacing): return per training seed, completion, laps, wrong-way driving (mean
    steps, and in how many episodes at all), off-track steps."""
    first = runs[0][names[0]]
    ret = METRICS["return"]
    pooled_columns = columns("race pool")  # after the return per training seed: the policy's pooled episodes
    head = ["policy", f"{ret.label} per training seed"] + [c.header for c in pooled_columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in names:
        pooled = _summary(_tagged(runs, name), first)
        lines.append("| " + " | ".join([name, " / ".join(f"{run[name]['mean_return']:{ret.fmt}}" for run in runs)]
                                       + [c.cell(pooled) for c in pooled_columns]) + " |")
    return "\n".join(lines) + "\n"


def _paired_table(runs: Sequence[Run], names: list[str]) -> str:
    """Each policy minus the first, per (training seed, track) pair: mean (standard error). One row per policy: the
    headline figure (autonomy, or return) in every group, the other figures over all episodes."""
    first = runs[0][names[0]]
    (headline, hfmt), *others = paired_keys(first)
    groups = _groups(first)  # "all" first: its pair count heads the row
    base = _tagged(runs, names[0])
    head = ["policy", "pairs"] + [f"{headline}: {label}" for label, _, _ in groups] + [k for k, _ in others]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in names[1:]:
        other = _tagged(runs, name)
        diffs = [paired_differences(_pick(base, key, value), _pick(other, key, value), headline)
                 for _, key, value in groups]
        diffs += [paired_differences(base, other, k) for k, _ in others]
        fmts = [hfmt] * len(groups) + [fmt for _, fmt in others]
        cells = ["n/a" if n == 0 else f"{m:+{fmt}} ({se:{fmt}})" for (m, se, n), fmt in zip(diffs, fmts)]
        lines.append(f"| {name} | {diffs[0][2]} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def timing_label(run: Run) -> str:
    """The run's timing condition in words ('regular timing', '20 % dropped frames', ...), from its metrics.json
    files; a run (joined folders, say) whose policies were driven under different conditions is refused."""
    labels = {}
    for name, summary in run.items():
        block = summary.get("timing") or {}
        labels[name] = TimingConditions(drop_prob=float(block.get("drop_prob", 0.0)),
                                        jitter=parse_jitter(block.get("jitter")),
                                        latency_steps=int(block.get("latency_steps", 0))).label()
    if len(set(labels.values())) > 1:
        raise ValueError("one evaluation mixes timing conditions (" + ", ".join(f"{n}: {lab}" for n, lab in
                         labels.items()) + "): join only folders driven under the same one")
    return next(iter(labels.values()))


def action_rule_label(run: Run) -> str:
    """How the run's discrete students chose their actions, in words ('argmax', 'sampling at temperature 1.5');
    policies of one run on different rules are named each; '' where no policy is discrete."""
    rules = {}
    for name, summary in run.items():
        rule = summary.get("discrete_actions")
        if rule is None:
            continue
        temperature = summary.get("action_temperature")  # not recorded before temperatures existed: 1 then
        rules[name] = rule if rule == "argmax" else (
            f"{'sampling' if rule == 'sample' else rule}" +
            ("" if temperature in (None, 1.0) else f" at temperature {float(temperature):g}") +
            "".join(f", {a} spared" for a in summary.get("temperature_spares", [])))
    if len(set(rules.values())) > 1:
        return "; ".join(f"{name} {rule}" for name, rule in rules.items())
    return next(iter(rules.values()), "")


def condition_labels(runs: Sequence[Run]) -> list[str]:
    """Each run's driving condition: its timing condition, and its discrete action rule where the runs do not all
    share one (one checkpoint sampled at two temperatures pairs with itself like a timing condition)."""
    timing = [timing_label(run) for run in runs]
    if not _rules_differ(runs):
        return timing
    return [f"{t}, {action_rule_label(run) or 'continuous'}" for t, run in zip(timing, runs)]


def _rules_differ(runs: Sequence[Run]) -> bool:
    return len({action_rule_label(run) for run in runs}) > 1


def _by_condition(runs: Sequence[Run], folders: Sequence[str]) -> dict[str, tuple[list[Run], list[str]]]:
    """Runs (and folders) grouped by driving condition, in the order first given; every condition needs as many
    trainings as the first, or pairs across conditions would not match."""
    groups: dict[str, tuple[list[Run], list[str]]] = {}
    for run, folder, label in zip(runs, folders, condition_labels(runs)):
        rs, fs = groups.setdefault(label, ([], []))
        rs.append(run)
        fs.append(folder)
    counts = {label: len(rs) for label, (rs, _) in groups.items()}
    if len(set(counts.values())) > 1:
        raise ValueError(f"every condition needs the same trainings, in the same order; got folders per "
                         f"condition {counts}")
    return groups


def _signed(x: float, fmt: str) -> str:
    """x with its sign, '+0.0' rather than '-0.0' when it rounds to zero."""
    text = f"{x:+{fmt}}"
    return text.replace("-", "+") if float(text) == 0 else text


def _paired_cell(base: list[dict[str, Any]], other: list[dict[str, Any]], key: str, fmt: str) -> str:
    """other minus base on ``key``, per matching (training seed, track): 'mean (standard error, n=pairs)'."""
    m, se, n = paired_differences(base, other, key)
    return "n/a" if n == 0 else f"{_signed(m, fmt)} ({se:{fmt}}, n={n})"


def _pooled_headline(runs: Sequence[Run], name: str) -> float:
    pooled = _summary(_tagged(runs, name), runs[0][name])
    return float(pooled["autonomy"] if "autonomy" in pooled else pooled["mean_return"])


def _timing_tables(groups: dict[str, tuple[list[Run], list[str]]], names: list[str]) -> str:
    """Policy x condition: the pooled headline and its share of the first condition's; then each policy minus the
    first policy per condition, and each condition minus the first condition per policy (paired, mean (SE))."""
    labels = list(groups)
    base_label = labels[0]
    key, fmt = paired_keys(groups[base_label][0][0][names[0]])[0]
    pooled = {(label, name): _pooled_headline(groups[label][0], name) for label in labels for name in names}
    lines = ["| policy | " + " | ".join(labels) + " |", "|" + "---|" * (len(labels) + 1)]
    for name in names:
        base = pooled[base_label, name]
        cells = [f"{base:{fmt}}"] + [
            f"{pooled[label, name]:{fmt}} ({100 * pooled[label, name] / base:.1f} %)" if base else
            f"{pooled[label, name]:{fmt}}" for label in labels[1:]]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")

    def cell(base: list[dict[str, Any]], other: list[dict[str, Any]]) -> str:
        return _paired_cell(base, other, key, fmt)

    text = (f"{key} pooled over every training and track; in brackets, its share of the same policy's {key} under "
            f"{base_label}.\n\n" + "\n".join(lines) + "\n")
    text += (f"\n### Each policy minus {names[0]}, per condition\n\nPer (training seed, track) pair: mean (standard "
             f"error, pairs) of {key}.\n\n| policy | " + " | ".join(labels) + " |\n|" + "---|" * (len(labels) + 1)
             + "\n")
    firsts = {label: _tagged(groups[label][0], names[0]) for label in labels}
    for name in names[1:]:
        text += f"| {name} | " + " | ".join(cell(firsts[label], _tagged(groups[label][0], name))
                                           for label in labels) + " |\n"
    text += (f"\n### Each condition minus {base_label}, per policy\n\nThe same policy on the same (training seed, "
             f"track) pair: mean (standard error, pairs) of {key}.\n\n| policy | " + " | ".join(labels[1:]) +
             " |\n|" + "---|" * len(labels) + "\n")
    for name in names:
        base = _tagged(groups[base_label][0], name)
        text += f"| {name} | " + " | ".join(cell(base, _tagged(groups[label][0], name))
                                           for label in labels[1:]) + " |\n"
    return text


def parse_pair(text: str, names: Sequence[str]) -> tuple[str, str]:
    """``A:B`` -> (A, B), both policies of the runs: the row B minus A."""
    base, sep, other = text.partition(":")
    if not sep or not base or not other:
        raise ValueError(f"--pair takes BASE:OTHER, two policy names, got {text!r}")
    for name in (base, other):
        if name not in names:
            raise ValueError(f"--pair {text}: no policy {name!r} in the runs (they hold {', '.join(names)})")
    return base, other


def _seed_cell(runs: Sequence[Run], base: str, other: str, key: str, fmt: str) -> str:
    """other minus base per training seed (its mean over the tracks): 'mean (standard error over seeds): each seed'.
    The per-track standard error leaves out how much one training differs from the next; this one does not."""
    per_seed = [paired_differences(run[base]["episodes"], run[other]["episodes"], key)[0] for run in runs]
    d = np.asarray([x for x in per_seed if not math.isnan(x)], dtype=np.float64)
    if len(d) < 2:
        return "n/a"
    each = ", ".join(_signed(x, fmt) for x in d)
    return f"{_signed(d.mean(), fmt)} ({d.std(ddof=1) / math.sqrt(len(d)):{fmt}}): {each}"


def _pairs_table(groups: dict[str, tuple[list[Run], list[str]]], pairs: Sequence[tuple[str, str]]) -> str:
    """The chosen pairs, other minus base per (training seed, track), one column per timing condition; then, with
    two trainings or more, the same pairs per training seed."""
    labels = list(groups)
    key, fmt = paired_keys(groups[labels[0]][0][0][pairs[0][0]])[0]
    head = ["| pair | " + " | ".join(labels) + " |", "|" + "---|" * (len(labels) + 1)]
    lines = list(head)
    for base, other in pairs:
        cells = [_paired_cell(_tagged(groups[label][0], base), _tagged(groups[label][0], other), key, fmt)
                 for label in labels]
        lines.append(f"| {other} minus {base} | " + " | ".join(cells) + " |")
    text = f"Per (training seed, track) pair: mean (standard error, pairs) of {key}.\n\n" + "\n".join(lines) + "\n"
    if len(groups[labels[0]][0]) < 2:
        return text
    lines = list(head)
    for base, other in pairs:
        cells = [_seed_cell(groups[label][0], base, other, key, fmt) for label in labels]
        lines.append(f"| {other} minus {base} | " + " | ".join(cells) + " |")
    return (text + "\nPer training seed (its mean over the tracks): mean (standard error over seeds): each seed's "
            "difference, in the order given.\n\n" + "\n".join(lines) + "\n")


def table_markdown(runs: Sequence[Run], folders: Sequence[str], pairs: Sequence[str] = ()) -> str:
    """The whole report: what was pooled, the summary table, the paired differences (per timing condition, after
    the timing tables, when the folders were driven under several), then the ``--pair`` rows asked for."""
    runs = same_single_policy(runs)
    names = check_runs(runs)
    chosen = [parse_pair(p, names) for p in pairs]
    groups = _by_condition(runs, folders)
    extra = f"\n## Chosen pairs\n\n{_pairs_table(groups, chosen)}" if chosen else ""
    if len(groups) == 1:
        seeds = runs[0][names[0]].get("seeds", [])
        return (f"# {len(names)} policies x {_count(len(runs), 'training')}, closed loop on "
                f"{runs[0][names[0]].get('env')}, tracks {_span(seeds)} ({len(seeds)} per training)\n\n"
                + _report(runs, folders, names, "##") + extra)
    kind = "" if _rules_differ(runs) else "timing "
    return (f"# {len(names)} policies x {_count(len(next(iter(groups.values()))[0]), 'training')} x {len(groups)} "
            f"{kind}conditions, closed loop on {runs[0][names[0]].get('env')}\n\n" + _timing_tables(groups, names) +
            extra +
            "".join(f"\n## {label}\n\n" + _report(rs, fs, names, "###") for label, (rs, fs) in groups.items()))


def _report(runs: Sequence[Run], folders: Sequence[str], names: list[str], level: str) -> str:
    """One condition's summary table and paired differences, its sub-heading at markdown ``level``."""
    first = runs[0][names[0]]
    summary = (_lane_table if "autonomy" in first else _race_table)(runs, names)
    return (f"Evaluations: {', '.join(folders)}. Figures pool every training's episodes; autonomy pools each group's "
            "interventions against its driving time.\n\n" + summary +
            f"\n{level} Paired differences: each policy minus {names[0]}\n\n"
            "Per (training seed, track) pair, mean (standard error over the pairs); autonomy per episode here.\n\n"
            + _paired_table(runs, names))


@dataclass
class TableArgs:
    folders: list[str] = option(help="evaluate.py --out folders, one per training seed (and per timing condition); "
                                "folders joined by commas (A,B) are one training seed's policies evaluated in separate "
                                "runs (a folder holding one policy goes by its evaluate.py --name)", group="input",
                                positional=True)
    pair: list[str] = option(default_factory=list, help="add the paired difference OTHER minus BASE for each "
                             "BASE:OTHER given, beside each policy minus the first", group="output",
                             metavar="BASE:OTHER")
    out: str | None = option(None, "write the markdown here as well as printing it", group="output")


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(TableArgs, _write_table, argv, prog=PROG, doc=__doc__)


def _write_table(a: TableArgs) -> None:
    text = table_markdown([read_run(f) for f in a.folders], a.folders, a.pair)
    print(text)
    if a.out:
        atomic_write_text(Path(a.out), text)


if __name__ == "__main__":
    raise SystemExit(main())
