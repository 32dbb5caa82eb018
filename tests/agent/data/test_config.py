"""agent/data/config.py: collect.py's arguments checked before anything is touched (one-line CollectError), the
shard syntax, the dataset's own action space when appending, and the plan resolve cuts with every default filled."""
import json

import pytest

from agent.data.config import CollectConfig, CollectError, existing_action_space, parse_shard, resolve
from driving_data.dataset import CARD_NAME
from envs.registry import get_spec


def test_parse_shard_reads_i_of_n_and_refuses_anything_else():
    assert parse_shard("2/4") == (2, 4) and parse_shard(" 1 / 1 ") == (1, 1)
    for text, message in (("0/3", "1 <= I <= N"), ("4/3", "1 <= I <= N"), ("2", "must look like I/N"),
                          ("-1/3", "must look like I/N"), ("a/b", "must look like I/N")):
        with pytest.raises(ValueError, match=message):
            parse_shard(text)


def test_existing_action_space_is_the_cards_or_none(tmp_path):
    assert existing_action_space(None) is None and existing_action_space(tmp_path / "new") is None
    (tmp_path / CARD_NAME).write_text(json.dumps({"action_space": "discrete"}))
    assert existing_action_space(tmp_path) == "discrete"
    (tmp_path / CARD_NAME).write_text("{half a card")
    assert existing_action_space(tmp_path) is None, "a broken card is reported later, by the dataset checks"


def test_resolve_fills_every_default_the_dataset_does_not_decide(tmp_path):
    plan = resolve(CollectConfig(env="udacity-hard", out=tmp_path / "d", shard="2/4", episodes=8, noise=0.1,
                                 progress=False))
    spec = get_spec("udacity-hard")
    assert plan.out == tmp_path / "d-shard-2-of-4", "a shard writes beside the run's folder, never into it"
    assert (plan.where.action_space, plan.where.max_steps, plan.where.renderer) == (
        "continuous", spec.default_max_steps, spec.renderers[0])
    assert plan.where.shard == (2, 4) and plan.where.seed is None and plan.where.episodes == 8
    assert plan.where.scene["themes"] and "mountain" not in plan.where.scene["themes"], "held out by default"
    assert plan.recorded.noise == 0.1 and plan.recorded.noise_hold is None, "None: the dataset's, else the env's"
    assert plan.drives.expert is None and plan.drives.driver is None and plan.progress is False


def test_without_out_the_env_names_the_folder():
    cfg = CollectConfig(action_space="discrete")
    assert cfg.out_dir == get_spec("carracing").default_out("discrete")


@pytest.mark.parametrize("kw, message", [
    (dict(max_steps=0), "--max-steps must be >= 1, got 0"),
    (dict(max_steps=10, latency_steps=10), r"--latency-steps must be in \[0, --max-steps 10\), got 10"),
    (dict(seed=-1), "--seed must be >= 0"),
    (dict(noise_hold=0), "--noise-hold must be >= 1 frame"),
    (dict(noise=float("nan")), "--noise must be a finite number >= 0, got nan"),
    (dict(episodes=2, shard=(1, 3)), "give --episodes >= 3"),
    (dict(theme="lake"), "not available for carracing"),
    (dict(env="udacity-hard", theme="mountain"), "pass --allow-held-out"),
    (dict(replay_span="0:0.8"), "--env carracing is not a replay"),
    (dict(driver_actions="greedy"), "--driver-actions must be one of"),
])
def test_bad_requests_are_one_line_collect_errors(tmp_path, kw, message):
    cfg = CollectConfig(out=tmp_path / "d", **kw)
    with pytest.raises(CollectError, match=message) as e:
        cfg.validate()
    assert "\n" not in str(e.value)
    assert not (tmp_path / "d").exists(), "nothing is touched before the checks pass"


def test_held_out_scenes_are_recorded_when_allowed(tmp_path):
    plan = resolve(CollectConfig(env="udacity-hard", theme="mountain", allow_held_out=True, out=tmp_path / "d"))
    assert plan.where.scene["themes"] == ("mountain",)
