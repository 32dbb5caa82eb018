"""agent/data/card.py: the dataset card summed from the episodes' own metas, and what it keeps about the expert."""
import hashlib
from types import SimpleNamespace

import numpy as np
import pytest

from agent.data.card import build_card, expert_summary
from agent.data.recorder import action_stats, steer_bins
from envs.carracing import SPEC as CARRACING

CONFIG = {"env": "carracing", "action_space": "continuous", "seed": 3_000_000}


def _meta(seed, length, executed, label, **kw):
    """An episode meta as record_episode writes it (the stats from the executed and labelled actions)."""
    space = "discrete" if np.asarray(executed).ndim == 1 else "continuous"
    return {"episode_id": seed, "track_seed": seed, "return": float(length), "length": length, "terminated": False,
            "truncated": True, "stopped_early": None, "noise": 0.1, "lap_complete": False, "tiles_visited": seed,
            "env_meta_keys": ["lap_complete", "tiles_visited"],
            "stats": action_stats(space, np.asarray(executed), np.asarray(label), CARRACING.action_names[space],
                                  CARRACING.steer_limit[space]), **kw}


def test_expert_summary_keeps_the_files_hash_and_its_cards_headline(tmp_path):
    path = tmp_path / "expert.zip"
    path.write_bytes(b"weights")
    card = {"algorithm": "PPO", "train_seeds": "[100000, 2000000)", "selection": {"seeds": [90000]},
            "evaluation": {"seeds": [1000], "mean_return": 900.0, "std_return": 5.0, "laps_finished": 1,
                           "episodes": 1, "returns": [900.0]}, "init_sha256": "ab" * 32}
    summary = expert_summary(SimpleNamespace(card=card, path=path, action_space="continuous"))
    assert summary["path"] == str(path) and summary["sha256"] == hashlib.sha256(b"weights").hexdigest()
    assert summary["selection_seeds"] == [90000] and summary["algorithm"] == "PPO"
    assert summary["evaluation"] == {"seeds": [1000], "mean_return": 900.0, "std_return": 5.0, "laps_finished": 1,
                                     "episodes": 1}, "the headline, not every return"
    assert "init_sha256" not in summary and "driver" not in summary, "only a latency expert names its origin"
    latency = expert_summary(SimpleNamespace(card={**card, "latency_steps": [0, 5]}, path=path,
                                             action_space="continuous"))
    assert latency["init_sha256"] == "ab" * 32


def test_a_built_in_driver_has_no_file_and_names_itself():
    summary = expert_summary(SimpleNamespace(card={"driver": "path controller"}, path=None, action_space="continuous"))
    assert summary["path"] is None and summary["sha256"] is None and summary["driver"] == "path controller"
    assert summary["evaluation"] is None and summary["algorithm"] is None


def test_a_continuous_card_sums_the_episodes():
    label = np.array([[0.0, 1.0, 0.0], [0.3, 0.0, 0.5]], np.float32)
    a = _meta(3_000_000, 2, label + [0.1, 0.0, 0.0], label, mean_abs_noise=[0.1, 0.0, 0.0], lap_complete=True)
    b = _meta(3_000_001, 6, np.zeros((6, 3), np.float32), np.zeros((6, 3), np.float32),
              mean_abs_noise=[0.5, 0.2, 0.0], driver="student.pt", beta=0.5, renderer="fast")
    card = build_card(CONFIG, {"path": None}, [{"episodes_added": 2}], [a, b], CARRACING)
    counts = card["counts"]
    assert (counts["episodes"], counts["steps"], counts["laps_finished"], counts["truncated"]) == (2, 8, 1, 2)
    assert counts["hours_of_driving"] == pytest.approx(8 * 0.02 / 3600)
    assert counts["mean_abs_noise"] == pytest.approx([(0.1 * 2 + 0.5 * 6) / 8, 0.2 * 6 / 8, 0.0]), "step-weighted"
    assert counts["perturbed_steps"] is None, "continuous steps are all perturbed a little: no count"
    assert counts["driven_by"] == {"expert": 1, "student": 1}
    assert counts["renderers"] == {"pygame": 1, "fast": 1}, "an episode that names none had the default"
    assert "recovery_label_steps" not in counts
    assert card["seeds"]["first"] == 3_000_000 and card["seeds"]["last"] == 3_000_001
    assert card["returns"]["mean"] == pytest.approx(4.0) and card["expert_driven_returns"]["mean"] == 2.0
    hist = card["action_histogram"]
    assert hist["steer_bin_edges"] == pytest.approx(steer_bins(0.4).round(3).tolist())
    assert sum(hist["label"]["steer_counts"]) == sum(hist["executed"]["steer_counts"]) == 8
    assert hist["label"]["gas_fraction"] == pytest.approx(1 / 8)
    assert hist["label"]["mean_brake"] == pytest.approx(0.5 / 8)
    episodes = card["episodes"]
    assert [e["tiles_visited"] for e in episodes] == [3_000_000, 3_000_001], "the env's own keys, per episode"
    assert episodes[0]["lap_complete"] is True and episodes[1]["lap_complete"] is False
    assert episodes[1]["driver"] == "student.pt" and episodes[1]["renderer"] == "fast"
    assert card["cameras"] == ["frames"] and card["frame_shape"] == [96, 96, 3]
    assert card["runs"] == [{"episodes_added": 2}]


def test_a_discrete_card_counts_actions_and_perturbed_steps():
    a = _meta(5, 4, [3, 3, 1, 0], [3, 3, 3, 3], perturbed_fraction=0.5)
    b = _meta(6, 2, [4, 4], [4, 4], perturbed_fraction=0.0)
    card = build_card({**CONFIG, "action_space": "discrete"}, {}, [], [a, b], CARRACING)
    assert card["action_names"] == ["noop", "right", "left", "gas", "brake"]
    assert card["action_histogram"]["executed"] == [1, 1, 0, 2, 2]
    assert card["action_histogram"]["label"] == [0, 0, 0, 4, 2]
    assert card["counts"]["perturbed_steps"] == 2 and card["counts"]["mean_abs_noise"] is None


def test_recovery_counts_appear_only_in_datasets_recorded_with_them():
    label = np.zeros((3, 3), np.float32)
    metas = [_meta(1, 3, label, label, recovery_labels=True, recovery_label_steps=2, start={"heading": 1.0}),
             _meta(2, 3, label, label, recovery_labels=False, recovery_label_steps=0, start=None)]
    counts = build_card(CONFIG, {}, [], metas, CARRACING)["counts"]
    assert counts["recovery_label_steps"] == 2 and counts["recovery_labelled_episodes"] == 1
    assert counts["recovery_starts"] == 1


def test_the_card_of_no_episodes_says_so_without_failing():
    card = build_card(CONFIG, {}, [], [], CARRACING)
    assert card["counts"]["episodes"] == 0 and card["counts"]["steps"] == 0 and card["episodes"] == []
    assert card["returns"] == {"mean": None, "std": None, "min": None, "max": None}
    assert card["seeds"]["first"] is None and card["counts"]["mean_abs_noise"] is None
