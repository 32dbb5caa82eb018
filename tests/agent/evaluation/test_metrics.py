"""Each metric is declared once (agent.evaluation.metrics.METRICS): a tiny real evaluation writes every declared
figure to metrics.json, TensorBoard and comparison.md, a metric declared in a test reaches them all, and the
tables' text is pinned (tests/agent/evaluation/golden/) so that reading the declarations changes no output."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from agent.evaluation.args import EvalArgs
from agent.evaluation.config import resolve
from agent.evaluation.evaluate import evaluate
from agent.evaluation.metrics import METRICS, TABLES, Column, Metric, aggregate, columns, comparison_markdown
from agent.evaluation.table import table_markdown
from tests.helpers import constant_policy_checkpoint

GOLDEN = Path(__file__).parent / "golden"


def _tb_tags(logdir: Path) -> set[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir))
    acc.Reload()
    return set(acc.Tags()["scalars"])


def _two_policies(tmp_path: Path) -> dict:
    a = constant_policy_checkpoint(tmp_path / "a.pt", action=(0.3, 0.2, 0.0))
    b = constant_policy_checkpoint(tmp_path / "b.pt", action=(-0.1, 0.5, 0.0))
    out = tmp_path / "eval"
    evaluate(resolve(EvalArgs(checkpoint=[str(a), str(b)], episodes=2, max_steps=12, seed=1234, out=str(out),
                              progress=False, workers=1, video=False)))
    return {"out": out, "names": ["a", "b"]}


def test_a_tiny_evaluation_writes_every_declared_metric_where_its_declaration_says(tmp_path):
    run = _two_policies(tmp_path)
    out = run["out"]
    comparison = (out / "comparison.md").read_text()
    table, paired = comparison.split("## Paired differences")
    assert "| policy | " + " | ".join(c.header for c in columns("race")) + " |" in table
    assert "| policy | episodes | n | " + " | ".join(c.metric for c in columns("race pairs")) + " |" in paired
    for name in run["names"]:
        m = json.loads((out / name / "metrics.json").read_text())
        recorded = set(m["episodes"][0])
        for key in [k for k, metric in METRICS.items() if metric.mean]:
            assert (f"mean_{key}" in m) == (key in recorded), key
            if key in recorded:
                assert m[f"mean_{key}"] == pytest.approx(np.nanmean([float(e[key]) for e in m["episodes"]]))
        curves = {f"eval/{k}" for k, metric in METRICS.items() if metric.curve and k in recorded}
        summaries = {f"eval/{k}" for k, v in m.items() if (k.startswith(("mean_", "std_", "latency_"))
                     or k == "laps_completed") and isinstance(v, (int, float)) and not np.isnan(v)}
        assert _tb_tags(out / name / "tb") == curves | summaries
        row = next(line for line in table.splitlines() if line.startswith(f"| {name} |"))
        assert row == f"| {name} | " + " | ".join(c.cell(m) for c in columns("race")) + " |"


def test_a_metric_declared_once_reaches_metrics_json_tensorboard_and_the_comparison(tmp_path, monkeypatch):
    """The episode row's `truncated` flag, declared as a metric with columns in the racing tables, is averaged,
    drawn per episode, shown and compared per pair with nothing else changed."""
    monkeypatch.setitem(METRICS, "truncated", Metric("truncated", "cut short", ".2f", curve=True,
                                                     columns=(Column("race", 95), Column("race pairs", 40))))
    out = _two_policies(tmp_path)["out"]
    m = json.loads((out / "a" / "metrics.json").read_text())
    assert m["mean_truncated"] == 1.0  # both episodes end at --max-steps
    assert {"eval/truncated", "eval/mean_truncated"} <= _tb_tags(out / "a" / "tb")
    table, paired = (out / "comparison.md").read_text().split("## Paired differences")
    assert "| cut short |" in table and "| 1.00 |" in table
    assert "| wrong_way_steps | truncated |" in paired and "| +0.0 (0.0) |" in paired


# ---- the tables' text, pinned: synthetic episodes whose every figure is known --------------------------------------

def _episodes(kind: str, policy: int, run: int) -> list[dict]:
    rng = np.random.default_rng([policy, run, len(kind)])
    rows = []
    for k in range(6):
        n = int(rng.integers(200, 1000))
        e = {"seed": 1000 + k, "return": float(rng.normal(600, 200)), "length": n,
             "completion": float(rng.uniform(0.3, 1.0)), "lap_completed": bool(rng.random() < 0.4),
             "terminated": False, "truncated": True, "off_track_steps": int(rng.integers(0, 50)),
             "off_track_fraction": float(rng.uniform(0, 0.1)), "steer_mae": float(rng.uniform(0, 0.2)),
             "steer_mse": float(rng.uniform(0, 0.05)), "steer_jerk": float(rng.uniform(0, 0.05)),
             "steer_smoothness": float(rng.uniform(0, 0.1)), "expert_steer_smoothness": float(rng.uniform(0, 0.1)),
             "mean_speed": float(rng.uniform(5, 30)), "latency_median_ms": float(rng.uniform(1, 5)),
             "latency_p95_ms": float(rng.uniform(5, 9)), "wall_seconds": 1.0, "video": ""}
        if kind == "race":
            e["wrong_way_steps"] = int(rng.integers(0, 3)) * int(rng.integers(0, 40))
        else:
            i = int(rng.integers(0, 4))
            e.update(theme=("lake", "jungle", "mountain")[k % 3], condition=("clear", "fog")[k % 2],
                     interventions=i, stalls=int(i > 2), autonomy=100 * (1 - 6 * i / (n * 0.1)),
                     interventions_per_100s=100 * i / (n * 0.1), mean_abs_cte=float(rng.uniform(0.1, 0.6)),
                     max_abs_cte=float(rng.uniform(0.6, 2.0)), wrong_way_steps=0)
            if kind == "replay":
                e.update(straight_interventions=i + 2, elapsed_s=n * 0.1)
        rows.append(e)
    return rows


ENVS = {"race": ("carracing", {}), "lane": ("udacity-hard", {"dt": 0.1, "intervention_cost_s": 6.0}),
        "replay": ("udacity-hard", {"dt": 0.1, "intervention_cost_s": 6.0})}


def _run(kind: str, run: int) -> dict[str, dict]:
    env, units = ENVS[kind]
    return {name: aggregate(_episodes(kind, p, run), [1.0, 2.0, 4.0 + p], name=name, env=env,
                            seeds=list(range(1000, 1006)), **units) for p, name in enumerate(["nac", "gru", "mha"])}


def rendered() -> dict[str, str]:
    """Every table of the synthetic runs, by golden file name."""
    out = {f"comparison_{kind}.md": comparison_markdown(list(_run(kind, 0).items())) for kind in ENVS}
    out["table_race.md"] = table_markdown([_run("race", 0), _run("race", 1)], ["s1", "s2"], ["gru:mha"])
    out["table_lane.md"] = table_markdown([_run("lane", 0), _run("lane", 1)], ["s1", "s2"])
    return out


@pytest.mark.parametrize("name", ["comparison_race.md", "comparison_lane.md", "comparison_replay.md",
                                  "table_race.md", "table_lane.md"])
def test_the_tables_text_is_unchanged(name):
    assert rendered()[name] == (GOLDEN / name).read_text()


def test_a_metric_declared_once_shows_in_every_table_it_names(monkeypatch):
    """One line in METRICS puts a metric into the tables its columns name, at their places, with its header and
    format: comparison.md (racing, lane keeping, replay), the paired differences, and agent.evaluation.table's pooled
    tables."""
    before = rendered()
    monkeypatch.setitem(METRICS, "off_track_fraction", Metric("off_track_fraction", "off-road share", ".2f", columns=(
        Column(("race", "lane", "replay", "race pool", "lane pool"), 15), Column(("race pairs", "lane pairs"), 99))))
    after = rendered()
    assert {c.metric for table in TABLES for c in columns(table)} >= {"off_track_fraction"}
    for name, text in after.items():
        header = next(line for line in text.splitlines() if line.startswith("| policy |"))
        assert "| off-road share |" in header, name
        assert "off_track_fraction |" in text.split("aired")[-1], name  # the paired table's last column
        assert text != before[name]
    race = after["comparison_race.md"].splitlines()
    cells = [c.strip() for c in race[0].split("|")[1:-1]]
    assert cells[cells.index("off-road share") - 1] == "return"  # place 15: after return (10), before completion (20)
    nac = [c.strip() for c in race[2].split("|")[1:-1]]
    assert nac[cells.index("off-road share")] == f"{_run('race', 0)['nac']['mean_off_track_fraction']:.2f}"


def test_a_column_in_an_unknown_table_is_refused():
    with pytest.raises(ValueError, match="Column tables must be among"):
        Column("racing", 10)
    with pytest.raises(ValueError, match="table must be one of"):
        columns("racing")


def test_autonomy_is_clamped_at_zero_and_the_tables_state_its_formula():
    """A short drive with many interventions: NVIDIA's formula would go below 0 (-148.9 % for 30 interventions in
    121 s); autonomy stops at 0, interventions per 100 s keep the difference, and every table says how it is made."""
    from agent.evaluation.metrics import autonomy, per_100s

    assert autonomy(30, 121.0, 6.0) == 0.0 and per_100s(30, 121.0) == pytest.approx(24.79, abs=0.01)
    assert autonomy(1, 120.0, 6.0) == pytest.approx(95.0)
    episodes = [dict(e, interventions=40, length=100) for e in _episodes("lane", 0, 0)]
    s = aggregate(episodes, [1.0], name="x", env="udacity-hard", dt=0.1, intervention_cost_s=6.0)
    assert s["autonomy"] == 0.0 and s["interventions_per_100s"] > 0
    formula = "autonomy % = max(0, 100 * (1 - interventions * 6 s / elapsed s))"
    for name, text in rendered().items():
        if "lane" in name or "replay" in name:
            assert formula in text, name


def test_the_lane_keeping_laps_column_counts_laps_not_mean_completion():
    """A student with no lap must not show a bigger "laps" figure than one that drove a lap (0.91 against 0.88)."""
    rows = []
    for name, completion, lap in (("no_lap", 0.9, False), ("one_lap", 0.88, True)):
        eps = [dict(e, completion=completion if k == 0 else 0.5, lap_completed=lap and k == 0)
               for k, e in enumerate(_episodes("lane", 0, 0)[:2])]
        rows.append((name, aggregate(eps, [1.0], name=name, env="udacity-hard", dt=0.1, intervention_cost_s=6.0)))
    header, _, no_lap, one_lap = comparison_markdown(rows).splitlines()[:4]
    cells = [c.strip() for c in header.strip("|").split("|")]
    laps, completion = cells.index("laps"), cells.index("mean completion")
    assert [c.strip() for c in no_lap.strip("|").split("|")][laps] == "0/2"
    assert [c.strip() for c in one_lap.strip("|").split("|")][laps] == "1/2"
    assert [c.strip() for c in no_lap.strip("|").split("|")][completion] == "0.70"
