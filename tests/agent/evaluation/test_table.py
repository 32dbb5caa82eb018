"""The core-comparison table across training seeds (agent.evaluation.table): pooling, pairing and bad input."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from agent.evaluation.table import main, read_run, table_markdown


def _episode(seed: int, theme: str, interventions: int, cte: float) -> dict:
    return {"seed": seed, "theme": theme, "condition": "clear", "length": 100, "interventions": interventions,
            "autonomy": 100.0 * (1 - interventions * 6.0 / 10.0), "mean_abs_cte": cte, "steer_jerk": 0.01,
            "return": 1.0, "completion": 1.0, "lap_completed": True}


def _write_eval(folder: Path, policies: dict[str, list[dict]]) -> Path:
    """An evaluate.py output folder: comparison.json naming the policies, <name>/metrics.json with episodes."""
    folder.mkdir(parents=True)
    summaries = {}
    for name, episodes in policies.items():
        summary = {"env": "udacity-hard", "dt": 0.1, "intervention_cost_s": 6.0, "autonomy": 0.0,
                   "seeds": [e["seed"] for e in episodes], "episodes": episodes}
        (folder / name).mkdir()
        (folder / name / "metrics.json").write_text(json.dumps(summary))
        summaries[name] = {k: v for k, v in summary.items() if k != "episodes"}
    (folder / "comparison.json").write_text(json.dumps(summaries))
    return folder


def _two_trainings(tmp_path: Path) -> list[Path]:
    # training 1: a never intervenes, b once on mountain; training 2: a once on lake, b twice on mountain
    return [
        _write_eval(tmp_path / "s1", {"a": [_episode(1, "lake", 0, 0.1), _episode(2, "mountain", 0, 0.2)],
                                      "b": [_episode(1, "lake", 0, 0.1), _episode(2, "mountain", 1, 0.4)]}),
        _write_eval(tmp_path / "s2", {"a": [_episode(1, "lake", 1, 0.3), _episode(2, "mountain", 0, 0.2)],
                                      "b": [_episode(1, "lake", 0, 0.1), _episode(2, "mountain", 2, 0.6)]}),
    ]


def test_table_pools_trainings_and_pairs_by_training_and_track(tmp_path):
    folders = _two_trainings(tmp_path)
    text = table_markdown([read_run(f) for f in folders], [str(f) for f in folders])
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in text.split("## Paired")[0].splitlines() if line.startswith("| a ") or line.startswith("| b ")}
    # autonomy pools interventions against time: b, training 1 = 1 x 6 s in 20 s -> 70 %; training 2 -> 40 %
    assert rows["b"][0] == "70.0 / 40.0" and rows["a"][0] == "100.0 / 70.0"
    # all / lake / mountain (held out: the hard world keeps mountain out of training) / clear, over both trainings
    assert "mountain (held out) %" in text and rows["b"][1:4] == ["55.0", "100.0", "10.0"]
    assert rows["b"][-3:] == ["1.5", "0.300", "0.0100"]  # interventions per training, mean |CTE|, jerk
    # paired b - a per (training, track): autonomy differences 0, -60, +60, -120 -> mean -30
    # one row per policy: autonomy in every group (all, lake, mountain, clear), then the others over all episodes
    paired = text.split("## Paired")[1]
    d = np.array([0.0, -60.0, 60.0, -120.0])
    row = next(line for line in paired.splitlines() if line.startswith("| b |"))
    cells = [c.strip() for c in row.split("|")[2:-1]]
    assert cells[:5] == ["4", f"{d.mean():+.1f} ({d.std(ddof=1) / 2:.1f})", "+30.0 (30.0)", "-90.0 (30.0)",
                         f"{d.mean():+.1f} ({d.std(ddof=1) / 2:.1f})"]
    assert cells[5] == "+0.5 (0.6)"  # interventions: 0, +1, -1, +2 per pair


def test_table_refuses_trainings_of_different_policies_in_one_line(tmp_path, capsys):
    s1 = _write_eval(tmp_path / "s1", {"a": [_episode(1, "lake", 0, 0.1)], "b": [_episode(1, "lake", 0, 0.1)]})
    s2 = _write_eval(tmp_path / "s2", {"a": [_episode(1, "lake", 0, 0.1)], "c": [_episode(1, "lake", 0, 0.1)]})
    assert main([str(s1), str(s2)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "same policies" in err
    assert main([str(tmp_path / "nowhere")]) == 2 and "no evaluate.py output" in capsys.readouterr().err


def test_table_refuses_trainings_driven_on_different_tracks(tmp_path):
    s1 = _write_eval(tmp_path / "s1", {"a": [_episode(1, "lake", 0, 0.1)]})
    s2 = _write_eval(tmp_path / "s2", {"a": [_episode(5, "lake", 0, 0.1)]})
    with pytest.raises(ValueError, match="same tracks"):
        table_markdown([read_run(s1), read_run(s2)], ["s1", "s2"])


def test_race_table_pools_returns_and_laps_over_trainings(tmp_path):
    def ep(seed, ret, lap):
        return {"seed": seed, "return": ret, "length": 1000, "completion": 1.0 if lap else 0.5, "lap_completed": lap,
                "off_track_steps": 0, "wrong_way_steps": 0 if lap else 40}
    folders = []
    for k, rets in enumerate(((900.0, 800.0), (700.0, 600.0)), 1):
        folder = _write_eval(tmp_path / f"s{k}", {"a": [ep(1, rets[0], True), ep(2, rets[1], False)],
                                                  "b": [ep(1, rets[0] - 10, True), ep(2, rets[1] + 30, True)]})
        for name in ("a", "b"):  # a CarRacing summary: no autonomy, its mean return as evaluate.py writes it
            m = json.loads((folder / name / "metrics.json").read_text())
            m.update(env="carracing", mean_return=float(np.mean([e["return"] for e in m["episodes"]])))
            del m["autonomy"]
            (folder / name / "metrics.json").write_text(json.dumps(m))
        folders.append(folder)
    text = table_markdown([read_run(f) for f in folders], [str(f) for f in folders])
    assert "| a | 850.0 / 650.0 | 750.0 | 0.750 | 2/4 | 20.0 | 2/4 | 0.0 |" in text
    assert "| b | 4 | +10.0 (11.5) |" in text  # return b - a per pair: -10, +30, -10, +30


def _with_timing(folder: Path, **timing) -> Path:
    """Mark an evaluation folder as driven under a timing condition (metrics.json's ``timing`` block)."""
    for path in folder.glob("*/metrics.json"):
        m = json.loads(path.read_text())
        m["timing"] = {"regular": not timing, "drop_prob": 0.0, "jitter": None, "latency_steps": 0, **timing}
        path.write_text(json.dumps(m))
    return folder


def test_timing_table_pairs_each_policy_with_itself_across_conditions(tmp_path):
    regular = [_with_timing(f) for f in _two_trainings(tmp_path / "regular")]
    dropped = []  # under drops: a intervenes once more on every mountain track, b as before
    for k, folder in enumerate(_two_trainings(tmp_path / "drop"), 1):
        m = json.loads((folder / "a" / "metrics.json").read_text())
        for e in m["episodes"]:
            if e["theme"] == "mountain":
                e["interventions"] += 1
                e["autonomy"] -= 60.0
        (folder / "a" / "metrics.json").write_text(json.dumps(m))
        dropped.append(_with_timing(folder, drop_prob=0.2))
    folders = [*regular, *dropped]
    text = table_markdown([read_run(f) for f in folders], [str(f) for f in folders])
    assert text.startswith("# 2 policies x 2 trainings x 2 timing conditions")
    matrix = text.split("###")[0]
    # a: regular 1 intervention in 40 s -> 85 %; dropped 3 -> 55 % (64.7 % of regular); b unchanged
    assert "| a | 85.0 | 55.0 (64.7 %) |" in matrix and "| b | 55.0 | 55.0 (100.0 %) |" in matrix
    across = text.split("### Each condition minus regular timing, per policy")[1].split("##")[0]
    assert "| a | -30.0 (17.3, n=4) |" in across  # 0, -60, 0, -60 per (training, track) pair
    assert "| b | +0.0 (0.0, n=4) |" in across
    per_policy = text.split("### Each policy minus a, per condition")[1].split("###")[0]
    assert "| b | -30.0 (38.7, n=4) | +0.0 (24.5, n=4) |" in per_policy  # b - a: 0, -60, 60, -120; 0, 0, 60, -60
    # each condition's own full table follows, under its label
    assert "\n## regular timing\n" in text and "\n## 20 % dropped frames\n" in text


def test_timing_table_refuses_conditions_with_different_trainings(tmp_path):
    regular = [_with_timing(f) for f in _two_trainings(tmp_path / "regular")]
    dropped = _with_timing(_two_trainings(tmp_path / "drop")[0], drop_prob=0.2)
    folders = [*regular, dropped]
    with pytest.raises(ValueError, match="same trainings"):
        table_markdown([read_run(f) for f in folders], [str(f) for f in folders])


def test_joined_folders_are_one_training_and_pairs_are_chosen_by_name(tmp_path, capsys):
    """b evaluated in a run of its own on the same tracks: 'A,B' joins it to a's run; --pair a:b pairs them as
    the first-policy rows would, and a pair of names the runs do not hold is one clear error."""
    joined = []
    for k, folder in enumerate(_two_trainings(tmp_path / "together"), 1):
        m = json.loads((folder / "b" / "metrics.json").read_text())
        alone = _write_eval(tmp_path / "alone" / f"s{k}", {"b2": m["episodes"]})
        joined.append(f"{tmp_path / 'together' / f's{k}' / 'a'},{alone}")  # a's own metrics.json, b2's run
    text = table_markdown([read_run(f) for f in joined], joined, ["a:b2"])
    row = next(line for line in text.split("## Chosen pairs")[1].splitlines() if line.startswith("| b2 minus a"))
    d = np.array([0.0, -60.0, 60.0, -120.0])  # the b - a pairs of the first test
    assert row == f"| b2 minus a | {d.mean():+.1f} ({d.std(ddof=1) / 2:.1f}, n=4) |"
    seeds = d.reshape(2, 2).mean(axis=1)  # per training seed: its mean over its two tracks
    per_seed = text.split("Per training seed")[1]
    row = next(line for line in per_seed.splitlines() if line.startswith("| b2 minus a"))
    assert row == (f"| b2 minus a | {seeds.mean():+.1f} ({seeds.std(ddof=1) / np.sqrt(2):.1f}): "
                   f"{seeds[0]:+.1f}, {seeds[1]:+.1f} |")
    assert table_markdown([read_run(joined[0])], joined[:1]).startswith("# 2 policies x 1 training, closed loop")
    assert main([*joined, "--pair", "a:c"]) == 2 and "no policy 'c'" in capsys.readouterr().err
    assert main([*joined, "--pair", "a-b2"]) == 2 and "BASE:OTHER" in capsys.readouterr().err
    twice = f"{joined[0]},{tmp_path / 'alone' / 's1'}"
    assert main([twice]) == 2 and "more than one of the joined folders" in capsys.readouterr().err
    same_tracks = [_episode(1, "lake", 0, 0.1), _episode(2, "mountain", 0, 0.2)]
    dropped = _with_timing(_write_eval(tmp_path / "drop", {"b3": same_tracks}), drop_prob=0.2)
    mixed = f"{_with_timing(tmp_path / 'together' / 's1')},{dropped}"
    assert main([mixed]) == 2 and "mixes timing conditions" in capsys.readouterr().err


def test_one_policy_per_folder_is_one_policy_whatever_the_folders_are_called(tmp_path):
    """One checkpoint driven under two conditions into folders named after them (metrics.json only, no
    comparison.json) pools as one policy under the name evaluate.py gave it, not as two named by the folders."""
    folders = []
    for condition, drop in (("regular", 0.0), ("drop", 0.2)):
        folder = tmp_path / condition
        folder.mkdir()
        episodes = [_episode(1, "lake", 0, 0.1), _episode(2, "mountain", 1, 0.2)]
        (folder / "metrics.json").write_text(json.dumps({
            "name": "student", "env": "udacity-hard", "dt": 0.1, "intervention_cost_s": 6.0, "autonomy": 0.0,
            "seeds": [1, 2], "episodes": episodes,
            "timing": {"regular": not drop, "drop_prob": drop, "jitter": None, "latency_steps": 0}}))
        folders.append(folder)
    text = table_markdown([read_run(f) for f in folders], [str(f) for f in folders])
    assert "| student |" in text and "| regular |" not in text and "| drop |" not in text
    assert text.startswith("# 1 policies x 1 training x 2 timing conditions")


def test_discrete_students_at_two_temperatures_are_two_conditions_of_joined_single_folders(tmp_path):
    """The CarRacing core table: each core's lineage evaluated alone (eval/<temperature>/<core>_sS, one metrics.json,
    --name <core>), joined per training seed and driven at temperatures 1 and 1.5: the folders go by the names
    evaluate.py gave, each temperature is a condition the cores pair with themselves across, and the wrong-way
    column counts episodes that drove the wrong way at all."""
    def ep(seed, ret, wrong_way):
        return {"seed": seed, "return": ret, "length": 1000, "completion": 1.0, "lap_completed": not wrong_way,
                "off_track_steps": 0, "wrong_way_steps": wrong_way}

    def evaluate(folder: Path, name: str, temperature: float, returns) -> str:
        folder.mkdir(parents=True)
        episodes = [ep(seed, r, 30 if r < 700 else 0) for seed, r in zip((1, 2), returns)]
        (folder / "metrics.json").write_text(json.dumps({
            "name": name, "env": "carracing", "dt": 0.02, "seeds": [1, 2], "episodes": episodes,
            "mean_return": float(np.mean(returns)), "discrete_actions": "sample", "action_temperature": temperature}))
        return str(folder)

    folders = []
    for temperature, bonus in ((1.0, 0.0), (1.5, 50.0)):  # nac gains 50 on every track at 1.5, lstm nothing
        for s in (1, 2):
            folders.append(",".join(evaluate(tmp_path / f"T{temperature}" / f"{core}_s{s}", core, temperature,
                                             [r + (bonus if core == "nac" else 0.0) for r in returns])
                                    for core, returns in (("nac", (800.0 + s, 650.0)), ("lstm", (750.0, 600.0)))))
    text = table_markdown([read_run(f) for f in folders], folders)
    assert text.startswith("# 2 policies x 2 trainings x 2 conditions, closed loop on carracing")
    assert "| nac | 725.8 | 775.8 (106.9 %) |" in text.split("###")[0]  # (801 + 650 + 802 + 650) / 4, then + 50
    across = text.split("### Each condition minus regular timing, sampling, per policy")[1].split("##")[0]
    assert "| nac | +50.0 (0.0, n=4) |" in across and "| lstm | +0.0 (0.0, n=4) |" in across
    assert "\n## regular timing, sampling at temperature 1.5\n" in text
    at_one = text.split("\n## regular timing, sampling\n")[1].split("###")[0]
    assert "| lstm | 675.0 / 675.0 | 675.0 | 1.000 | 2/4 | 15.0 | 2/4 | 0.0 |" in at_one
    # the same names given twice in one join: by folders, which then differ per seed -- one clear error
    twice = [",".join(evaluate(tmp_path / "dup" / f"{core}_s{s}", "best", 1.0, (700.0, 700.0)) for core in ("a", "b"))
             for s in (1, 2)]
    with pytest.raises(ValueError, match="same policies"):
        table_markdown([read_run(f) for f in twice], twice)
