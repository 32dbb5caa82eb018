"""train.py --preset paper-carracing / paper-udacity: what each sets, how a flag beside it is taken, and each trained
end to end on a tiny dataset, its checkpoint reloaded and driven one step."""
import json

import numpy as np
import pytest
import torch

from agent.controllers import PolicyController
from agent.training.config import TrainArgs, Windows, resolve
from agent.training.experiment import run
from agent.training.loop import make_schedule
from agent.training.presets import PRESETS
from agent.training.windows import batch_plan
from agent.udacity import bridge as ub
from policies.checkpoint import load_checkpoint
from tests.agent.training.test_experiment import main_in_process, write_synthetic
from tests.agent.udacity.test_bridge import _frames, _telemetry
from tests.agent.udacity.test_recordings import _write_dataset


def test_paper_carracing_trains_end_to_end_and_its_checkpoint_drives(tmp_path):
    data = write_synthetic(tmp_path / "discrete", episodes=4, length=30, action_space="discrete")
    out = tmp_path / "run"
    run(resolve(TrainArgs(preset="paper-carracing", data=str(data), out=str(out), epochs=1, threads=1,
                          progress=False)))
    args = json.loads((out / "args.json").read_text())
    assert args["preset"] == "paper-carracing" and args["epochs"] == 1  # the flag given beside it wins
    expected = {k: v for k, v in PRESETS["paper-carracing"].settings.items() if k not in ("data", "out", "epochs")}
    assert {k: args[k] for k in expected} == expected
    best = json.loads((out / "metrics.json").read_text())["best"]
    assert not any(k.startswith("attn_") for k in best)  # one token per window: no attention entropy, not NaN
    policy = load_checkpoint(out / "best.pt")
    c = policy.config
    assert (c.window, c.encoder, c.head, c.head_hidden, c.frame_tokens) == (1, "carracing-official", "discrete", 64, 0)
    assert c.feature_dim == policy.encoder.feature_dim == 30  # 32x32 frames: 30 channels of 1x1, no projection
    assert {k: c.core_options[k] for k in ("variant", "mode", "d_model", "heads", "topk", "sparsity", "delta_t")} == {
        "variant": "official", "mode": "exact", "d_model": 64, "heads": 16, "topk": 10, "sparsity": 0.7,
        "delta_t": 1.5}
    controller = PolicyController(policy, "paper")
    controller.reset(0)
    action, _ = controller.act(np.zeros((32, 32, 3), np.uint8), 0.0, {}, 0)
    assert action in range(5)


def test_paper_udacity_trains_end_to_end_and_drives_with_their_gain_and_throttle(tmp_path):
    data = _write_dataset(tmp_path / "sim", lengths=(12, 10, 11), meta={"action_space": "continuous"}).root
    out = tmp_path / "run"
    run(resolve(TrainArgs(preset="paper-udacity", data=str(data), out=str(out), epochs=1, epoch_steps=2,
                          batch_size=8, threads=1, progress=False)))
    args = json.loads((out / "args.json").read_text())
    assert args["preset"] == "paper-udacity" and (args["epoch_steps"], args["batch_size"]) == (2, 8)
    assert (args["side_correction"], args["flip"], args["shift_steer"], args["lr"], args["weight_decay"]) == (
        0.2, True, 0.002, 1e-4, 0.0)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["train_samples"] == 2 * 8  # --epoch-steps 2 batches of 8 frames, not a pass over the data
    policy = load_checkpoint(out / "best.pt")
    c = policy.config
    assert (c.window, c.encoder, c.frame_tokens, c.crop, c.image_size, c.color) == (
        1, "pilotnet-official", 64, [60, 135], [66, 200], "yuv")
    assert c.feature_dim == 1152 and policy.core.nac.input_dim == 18  # the 1x18x64 map as 64 tokens of 18
    assert {k: c.core_options[k] for k in ("variant", "mode", "d_model", "heads", "topk", "sparsity", "activation")} \
        == {"variant": "official", "mode": "exact", "d_model": 100, "heads": 20, "topk": 15, "sparsity": 0.7,
            "activation": "elu"}
    assert (c.action_names, c.steer_gain, c.steer_gain_from, c.fixed_throttle) == (["steer"], 3.0, 0.01, 0.05)
    # one step in an env that takes a throttle, and one through the simulator bridge: their throttle, 0.05
    controller = PolicyController(policy, "paper", env_names=["steer", "throttle"])
    controller.reset(0)
    frame = _frames(1)[0]
    action, _ = controller.act(frame, 0.0, {}, np.array([0.0, 0.7], np.float32))
    raw = float(policy.stream().step(frame)[0])
    assert action[1] == pytest.approx(0.05) and controller.filled == []
    assert action[0] == pytest.approx(np.clip(raw * (3 if abs(raw) >= 0.01 else 1), -1, 1), abs=1e-6)
    reply = ub.SteeringServer(policy).on_telemetry(_telemetry(frame))
    assert float(reply["throttle"]) == pytest.approx(0.05)


def test_a_flag_beside_a_preset_wins_and_one_that_changes_its_input_is_refused(tmp_path, capsys):
    plan = resolve(TrainArgs(preset="paper-udacity", data=str(tmp_path), lr=3e-4, policy="gru"))
    assert plan.optimisation.lr == 3e-4 and plan.specs == ["gru"] and plan.windows.batch_size == 40
    assert plan.model.d_model == 100 and plan.run.out.endswith("paper-udacity")
    # given on the command line, --window 8 is refused although 8 is train.py's default
    code, err = main_in_process(capsys, "--preset", "paper-carracing", "--window", "8", "--data", str(tmp_path))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--window 8 contradicts" in err, err
    code, err = main_in_process(capsys, "--preset", "paper-udacity", "--frame-tokens", "0", "--data", str(tmp_path))
    assert code == 2 and "--frame-tokens 0 contradicts" in err, err
    with pytest.raises(ValueError, match="--encoder pilotnet contradicts"):
        resolve(TrainArgs(preset="paper-udacity", encoder="pilotnet"))
    with pytest.raises(SystemExit):
        main_in_process(capsys, "--preset", "paper-imagenet")
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "paper-carracing" in err and "paper-udacity" in err, err
    with pytest.raises(ValueError, match="presets: paper-carracing, paper-udacity"):
        resolve(TrainArgs(preset="paper-imagenet"))


def test_help_says_what_each_preset_sets(capsys):
    with pytest.raises(SystemExit):
        main_in_process(capsys, "--help")
    text = " ".join(capsys.readouterr().out.split())
    for name, preset in PRESETS.items():
        assert f"{name}: {' '.join(preset.summary.split())}" in text


def test_a_constant_schedule_and_a_fixed_number_of_steps_per_epoch():
    opt = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=1e-4)
    schedule = make_schedule(opt, 100, 0.0, "constant")
    lrs = []
    for _ in range(100):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        schedule.step()
    assert lrs == [1e-4] * 100
    w = Windows(window=1, frame_stride=1, window_gaps=1, segment=1, batch_size=4, oversample_turns=1, seed=0,
                epoch_steps=7)
    batches = batch_plan({0: 5, 1: 3}, w, 0)
    assert len(batches) == 7 and all(len(b) == 4 for b in batches)
    first = [s for b in batches for s in b][:8]
    assert sorted(first) == sorted({s for b in batches for s in b}), "every segment once before any twice"
