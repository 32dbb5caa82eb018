"""--theme / --condition / --allow-held-out / --pi-speed on collect.py and evaluate.py (envs with scenes: udacity-hard):
the held-out split is enforced, every group is reported, and the user's mistakes are one-line errors (exit 2)."""
import json

import numpy as np
import pytest

import collect
import evaluate
from policies.config import PolicyConfig
from policies.checkpoint import save_checkpoint
from policies.policy import DrivingPolicy


def _err(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


@pytest.mark.parametrize("argv,says", [
    (["--env", "udacity-hard", "--theme", "mountain"], "mountain is held out"),
    (["--env", "udacity-hard", "--condition", "clear,fog"], "fog is held out"),
    (["--env", "udacity-hard", "--theme", "lake,desert"], "['lake', 'jungle', 'mountain']"),
    (["--env", "udacity-hard", "--condition", "rain"], "clear"),
    (["--env", "udacity", "--theme", "lake"], "not available for udacity"),
    (["--env", "carracing", "--condition", "fog"], "not available for carracing"),
])
def test_collect_refuses_held_out_and_unknown_scenes(argv, says, capsys, tmp_path):
    assert collect.main([*argv, "--episodes", "1", "--out", str(tmp_path / "d")]) == 2
    assert says in _err(capsys)
    assert not (tmp_path / "d").exists()


def test_collect_records_the_held_out_theme_only_when_allowed(tmp_path):
    out = tmp_path / "d"
    argv = ["--env", "udacity-hard", "--theme", "mountain", "--condition", "fog", "--episodes", "1", "--max-steps", "5",
            "--workers", "1", "--out", str(out), "--no-progress"]
    assert collect.main([*argv, "--allow-held-out"]) == 0
    card = json.loads((out / "dataset.json").read_text())
    assert card["runs"][-1]["themes"] == ["mountain"] and card["runs"][-1]["conditions"] == ["fog"]
    assert card["action_names"] == ["steer", "throttle"]
    meta = [e for e in card["episodes"]][0]
    assert (meta["theme"], meta["condition"]) == ("mountain", "fog")


def _checkpoint(path, names):
    cfg = PolicyConfig.for_actions("continuous", names, encoder="pilotnet", image_size=[66, 200], crop=[40, 146],
                                   feature_dim=8, core="mlp", window=2, frame_stride=1, frame_period=0.1,
                                   env="UdacityStyle-v1")
    return save_checkpoint(path, DrivingPolicy(cfg))


def test_evaluate_reports_every_theme_and_condition(tmp_path):
    ckpt = _checkpoint(tmp_path / "p.pt", ["steer", "throttle"])
    out = tmp_path / "e"
    assert evaluate.main(["--env", "udacity-hard", "--checkpoint", str(ckpt), "--episodes", "3", "--max-steps", "8",
                          "--no-video", "--workers", "1", "--theme", "lake,mountain", "--condition", "fog,dusk",
                          "--out", str(out), "--no-tensorboard"]) == 0
    m = json.loads((out / "metrics.json").read_text())
    # seeds 1000..1002: theme = themes[seed % 2], condition = conditions[(seed // 2) % 2]
    assert list(m["by_theme"]) == ["lake", "mountain"] and set(m["by_condition"]) == {"fog", "dusk"}
    assert sum(g["num_episodes"] for g in m["by_theme"].values()) == 3
    for g in m["by_theme"].values():
        assert {"autonomy", "mean_mean_abs_cte", "mean_mean_speed", "seconds_per_lap"} <= set(g)
    assert m["themes"] == ["lake", "mountain"] and m["conditions"] == ["fog", "dusk"]


def test_steering_only_checkpoints_need_pi_speed_and_drive_with_it(tmp_path, capsys):
    steer = _checkpoint(tmp_path / "s.pt", ["steer"])
    both = _checkpoint(tmp_path / "b.pt", ["steer", "throttle"])
    base = ["--env", "udacity-hard", "--episodes", "1", "--max-steps", "5", "--no-video", "--workers", "1",
            "--no-tensorboard"]
    assert evaluate.main([*base, "--checkpoint", str(steer), "--out", str(tmp_path / "a")]) == 2
    assert "--pi-speed" in _err(capsys)
    assert evaluate.main([*base, "--checkpoint", str(both), "--pi-speed", "--out", str(tmp_path / "b")]) == 2
    assert "['steer']" in _err(capsys)
    assert evaluate.main([*base, "--checkpoint", str(steer), "--pi-speed", "--out", str(tmp_path / "c")]) == 0
    capsys.readouterr()
    m = json.loads((tmp_path / "c" / "metrics.json").read_text())
    assert m["pi_speed"] is True and np.isfinite(m["mean_mean_speed"])
    assert evaluate.main(["--env", "udacity", "--pi-speed", "--episodes", "1", "--out", str(tmp_path / "d")]) == 2
    assert "always held" in _err(capsys)


def test_color_jitter_keeps_greys_and_light_and_turns_colours():
    """The colour augmentation that lets a student read roads in colours it never saw: a map that keeps luma and
    greys, is the identity at strength 0, and turns a yellow line into other hues (or grey) at strength 1."""
    import torch

    from agent.training.augment import color_jitter_matrices
    from policies.frames import _YUV

    torch.manual_seed(0)
    assert torch.allclose(color_jitter_matrices(4, 0.0), torch.eye(3).expand(4, 3, 3), atol=1e-6)
    maps = color_jitter_matrices(500, 1.0)
    grey = torch.full((3,), 0.4)
    assert torch.allclose(maps @ grey, grey.expand(500, 3), atol=1e-4)
    assert torch.allclose(_YUV[0] @ maps, _YUV[0].expand(500, 3), atol=1e-5)  # luma of every colour kept
    yellow = torch.tensor([0.9, 0.8, 0.1])
    turned = maps @ yellow
    assert (turned[:, 2] > turned[:, 0]).float().mean() > 0.2  # often bluer than red: the hue really turns
    assert ((turned - turned.mean(1, keepdim=True)).abs().max(1).values < 1e-4).float().mean() > 0.3  # ~half grey


def test_color_jitter_defaults_to_the_env_s_and_refuses_out_of_range(capsys, tmp_path):
    import train
    from agent.training.config import TrainArgs, resolve, with_env_defaults

    assert train.main(["--data", "nowhere", "--color-jitter", "1.5"]) == 2
    assert "--color-jitter must be in [0, 1]" in _err(capsys)
    data = tmp_path / "d"
    assert collect.main(["--env", "udacity-hard", "--episodes", "1", "--max-steps", "3", "--workers", "1",
                         "--out", str(data), "--no-progress"]) == 0
    assert with_env_defaults(resolve(TrainArgs(data=str(data)))).augmentation.color_jitter == 0.5
    assert with_env_defaults(resolve(TrainArgs(data=str(data), color_jitter=0.0))).augmentation.color_jitter == 0.0


def test_a_car_that_stands_still_is_a_stall_intervention_and_is_restarted(tmp_path):
    """Autonomy must not reward a car that brakes to a stop in its lane: below 0.5 m/s for 3 s it has stalled,
    which costs an intervention and restarts it at 5 m/s (a policy that always brakes stalls again and again)."""
    import torch

    cfg = PolicyConfig.for_actions("continuous", ["steer", "throttle"], encoder="pilotnet", image_size=[66, 200],
                                   crop=[40, 146], feature_dim=8, core="mlp", window=2, frame_stride=1,
                                   frame_period=0.1, env="UdacityStyle-v1")
    policy = DrivingPolicy(cfg)
    with torch.no_grad():
        policy.head.weight.zero_()
        policy.head.bias.copy_(torch.tensor([0.0, -1.0]))
    ckpt = save_checkpoint(tmp_path / "brake.pt", policy)
    out = tmp_path / "e"
    assert evaluate.main(["--env", "udacity-hard", "--checkpoint", str(ckpt), "--episodes", "1", "--max-steps", "130",
                          "--no-video", "--workers", "1", "--out", str(out), "--no-tensorboard"]) == 0
    episode = json.loads((out / "metrics.json").read_text())["episodes"][0]
    assert episode["stalls"] >= 2 and episode["interventions"] >= episode["stalls"]
    assert episode["autonomy"] == 0.0 and episode["interventions_per_100s"] >= 100 * 2 / 13  # clamped; 2 in 13 s
    from envs.registry import get_spec

    env = get_spec("udacity-hard").make(render=False)
    env.reset(seed=1)
    _, info = get_spec("udacity-hard").recover(env, 5.0)  # the restart of a stalled car
    assert info["speed"] == 5.0
