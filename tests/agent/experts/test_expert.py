"""The PPO expert: shipped files load and drive, a tiny real training run, clear errors for bad input."""

import json
from pathlib import Path

import numpy as np
import pytest

from agent.experts.expert import Expert
from agent.experts.ppo import PPOTrainArgs, main, resolve, train
from envs.carracing import (
    N_FEATURES,
    SPEC,
    ScriptedDriver,
    ShapedReward,
    Shaping,
    make_carracing,
    make_expert_env,
    ppo_to_env_action,
)

DEFAULT_EXPERT_PATHS = SPEC.default_expert


def _drive(expert: Expert, seed: int, steps: int) -> tuple[float, dict]:
    env = make_carracing(expert.action_space, render=False)
    _, info = env.reset(seed=seed)
    total = 0.0
    for _ in range(steps):
        _, r, term, trunc, info = env.step(expert.act(info["privileged"]))
        total += r
        if term or trunc:
            break
    return total, info


@pytest.mark.parametrize("space", ["continuous", "discrete"])
def test_shipped_expert_loads_and_drives(space):
    expert = Expert.load(action_space=space)  # the default = the shipped file
    assert expert.action_space == space
    assert expert.card["action_space"] == space and len(expert.card["features"]) == N_FEATURES
    ret, info = _drive(expert, seed=123_456_7, steps=250)
    # 250 frames cost 25 points; a driving expert collects far more from tiles and stays on the road.
    assert ret > 100.0, f"{space} expert gained only {ret:.1f} in 250 frames"
    assert info["on_track"]


def test_continuous_act_returns_env_action():
    expert = Expert.load(action_space="continuous")
    _, info = make_carracing(render=False).reset(seed=3)
    a = expert.act(info["privileged"])
    assert a.shape == (3,) and a.dtype == np.float32
    assert -1 <= a[0] <= 1 and 0 <= a[1] <= 1 and 0 <= a[2] <= 1 and min(a[1], a[2]) == 0
    np.testing.assert_array_equal(a, expert.act(info["privileged"]))  # deterministic
    with pytest.raises(ValueError, match="discrete"):
        expert.action_probs(info["privileged"])


def test_discrete_action_probs_match_act():
    expert = Expert.load(action_space="discrete")
    env = make_carracing("discrete", render=False)
    _, info = env.reset(seed=4)
    for _ in range(30):
        p = expert.action_probs(info["privileged"])
        a = expert.act(info["privileged"])
        assert p.shape == (5,) and p.dtype == np.float32 and abs(p.sum() - 1) < 1e-5
        assert isinstance(a, int) and a == int(np.argmax(p))
        _, _, _, _, info = env.step(a)


def test_ppo_action_mapping():
    np.testing.assert_allclose(ppo_to_env_action(np.array([1.0, 0.5])), [0.4, 0.5, 0.0])
    np.testing.assert_allclose(ppo_to_env_action(np.array([-2.0, -0.7])), [-0.4, 0.0, 0.7], rtol=1e-6)


def test_tiny_training_run_writes_loadable_zip_and_card(tmp_path):
    out = tmp_path / "tiny.zip"
    args = PPOTrainArgs(
        action_space="discrete", timesteps=256, out=out, n_envs=2, n_steps=64, batch_size=64,
        eval_every=128, eval_episodes=1, card_episodes=1, logdir=tmp_path / "runs",
    )
    train(resolve(args), command="test", log=lambda *_: None)
    expert = Expert.load(out, "discrete")
    card = json.loads(out.with_suffix(".json").read_text())
    assert card == expert.card
    assert card["timesteps"] >= 256 and card["action_space"] == "discrete"
    assert card["evaluation"]["seeds"] == [1000] and len(card["evaluation"]["returns"]) == 1
    assert not (set(card["evaluation"]["seeds"]) & set(card["selection"]["seeds"]))
    assert any((tmp_path / "runs").rglob("events.out.tfevents*")), "TensorBoard log written"
    assert not list(tmp_path.glob("*.tmp*")), "no temporary files left behind"
    assert isinstance(expert.act(np.zeros(N_FEATURES, np.float32)), int)


def test_resolve_cuts_the_plan_train_reads(tmp_path):
    """resolve checks the arguments, takes the env's first action space when none is given, and cuts the plan;
    the card's hyperparameters keep every argument, the action space resolved."""
    plan = resolve(PPOTrainArgs(out=tmp_path / "e.zip", latency_steps="1:3", eval_episodes=5, learning_rate=1e-4))
    assert plan.spec is SPEC and plan.action_space == "continuous" and plan.record["action_space"] == "continuous"
    assert plan.latency == plan.validation.latency == (1, 3) and plan.validation.latencies() == [1, 2, 3, 1, 2]
    assert (plan.ppo.learning_rate, plan.ppo.seed, plan.validation.every) == (1e-4, 0, 50_000)
    assert set(plan.record) == set(PPOTrainArgs.__dataclass_fields__)
    with pytest.raises(ValueError, match="--latency-steps needs --action-space continuous"):
        resolve(PPOTrainArgs(out=tmp_path / "e.zip", latency_steps="1:3", action_space="discrete"))


def test_load_errors(tmp_path):
    with pytest.raises(ValueError, match="action_space"):
        Expert.load(action_space="hover")
    with pytest.raises(FileNotFoundError, match="missing.zip"):
        Expert.load(tmp_path / "missing.zip")
    with pytest.raises(ValueError, match="'continuous' expert"):
        Expert.load(DEFAULT_EXPERT_PATHS["continuous"], action_space="discrete")
    junk = tmp_path / "junk.zip"
    junk.write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="not a loadable"):
        Expert.load(junk)
    expert = Expert.load(action_space="continuous")
    with pytest.raises(ValueError, match="shape"):
        expert.act(np.zeros(3, np.float32))


def test_cli_errors_are_one_line_exit_2(tmp_path, capsys):
    assert main(["evaluate", "--expert", str(tmp_path / "nope.zip")]) == 2
    assert capsys.readouterr().err.startswith("error: ")
    assert main(["train", "--action-space", "sideways", "--out", str(tmp_path / "x.zip")]) == 2
    assert "action_space must be one of" in capsys.readouterr().err
    assert main(["train", "--action-space", "continuous", "--timesteps", "0", "--out", str(tmp_path / "x.zip")]) == 2
    assert "--timesteps must be positive" in capsys.readouterr().err
    assert main(["evaluate", "--expert", str(Path(DEFAULT_EXPERT_PATHS["continuous"])), "--action-space",
                 "discrete"]) == 2


@pytest.mark.parametrize("space", ["continuous", "discrete"])
def test_scripted_teacher_finishes_a_lap(space):
    driver = ScriptedDriver()
    env = make_carracing(space, render=False)
    _, info = env.reset(seed=77)
    act = driver.continuous if space == "continuous" else driver.discrete
    for _ in range(1000):
        _, _, term, trunc, info = env.step(act(info["privileged"]))
        if term or trunc:
            break
    assert term and info["lap_complete"] and info["tiles_visited"] == info["num_tiles"]


def _shaped_total(skip_penalty: float, remove_tiles: bool) -> float:
    env = ShapedReward(make_expert_env("continuous"), Shaping(skip_penalty=skip_penalty, offroad_penalty=0.0))
    obs, _ = env.reset(seed=5)
    if remove_tiles:  # the car can no longer touch tiles 20 and 21: it passes them "skipped"
        for k in (20, 21):
            env.unwrapped.world.DestroyBody(env.unwrapped.road[k])
    driver, total = ScriptedDriver(), 0.0
    for _ in range(150):
        obs, r, *_ = env.step(driver.ppo_action(obs, "continuous"))
        total += r
    return total


def test_shaping_penalises_each_skipped_tile():
    assert _shaped_total(5.0, remove_tiles=False) == pytest.approx(_shaped_total(0.0, remove_tiles=False))
    assert _shaped_total(0.0, remove_tiles=True) - _shaped_total(5.0, remove_tiles=True) == pytest.approx(10.0)
