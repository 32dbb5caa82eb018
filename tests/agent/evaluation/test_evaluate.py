"""Closed-loop evaluation: real rendered CarRacing episodes (short), metrics files, comparison, CLI errors."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import imageio.v3 as iio
import numpy as np
import pytest
import torch

import agent.evaluation.evaluate as evaluation
from agent.controllers import shipped_checkpoint
from agent.evaluation.args import EvalArgs, run_names
from agent.evaluation.config import resolve
from agent.evaluation.evaluate import evaluate
from common.stops import Interrupted
from agent.evaluation.metrics import EpisodeRecorder, aggregate, comparison_markdown, steer_of
from agent.evaluation.table import action_rule_label
from envs.carracing import FEATURE_NAMES
from envs.registry import get_spec
from policies.config import PolicyConfig
from policies.checkpoint import save_checkpoint
from policies.policy import DrivingPolicy
from tests.helpers import constant_policy_checkpoint

REPO = Path(__file__).resolve().parents[3]
TINY = dict(core_options=dict(d_model=16, heads=4, topk=4), window=4, frame_stride=2, feature_dim=16)


def _tiny(path: Path, head: str = "continuous", **overrides) -> Path:
    torch.manual_seed(0)
    kwargs = {**TINY, **overrides}
    if head == "discrete":
        kwargs.setdefault("action_space", "discrete")
    config = PolicyConfig.for_actions(head, **kwargs)
    return save_checkpoint(path, DrivingPolicy(config))


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("ckpt")
    nac = _tiny(d / "nac.pt")
    # every step [steer 0.3, gas 0.2, brake 0]
    const = constant_policy_checkpoint(d / "const.pt", action=(0.3, 0.2, 0.0))
    return {
        "nac": nac,
        "const": const,
        "discrete": _tiny(d / "disc.pt", head="discrete"),
        "other_env": _tiny(d / "udacity.pt", env="Udacity-v0"),
    }


def _args(out: Path, **kw) -> EvalArgs:
    base = dict(episodes=1, max_steps=30, seed=1234, out=str(out), progress=False, workers=1)
    base.update(kw)
    return EvalArgs(**base)


def _video_frames(path: Path) -> np.ndarray:
    return iio.imread(path)  # [T, H, W, 3], decoded by ffmpeg


# ----------------------------------------------------------------------------- closed loop, real env
def test_expert_drives_two_episodes_and_writes_consistent_metrics(tmp_path):
    out = tmp_path / "expert"
    res = evaluate(resolve(_args(out, expert_drives=True, episodes=2, max_steps=40)))["expert"]
    m = json.loads((out / "metrics.json").read_text())
    assert {"mean_return", "std_return", "episodes", "laps_completed", "latency_median_ms"} <= set(m)
    assert [e["seed"] for e in m["episodes"]] == [1234, 1235]
    returns = [e["return"] for e in m["episodes"]]
    assert m["mean_return"] == pytest.approx(np.mean(returns)) and m["std_return"] == pytest.approx(np.std(returns))
    for e in m["episodes"]:
        assert 0.0 <= e["completion"] <= 1.0 and e["length"] == 40 and e["truncated"]
        assert e["steer_mae"] == 0.0  # the expert shadows itself
        assert e["return"] > 0  # it drives forward over new tiles in 40 steps
    assert m == json.loads(json.dumps(res))  # what evaluate returns is what it wrote
    with open(out / "episodes.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["seed"]) for r in rows] == [1234, 1235]
    assert [float(r["return"]) for r in rows] == pytest.approx(returns, rel=1e-5)
    assert list((out / "tb").glob("events.out.tfevents*"))
    # Only the first episode is recorded by default; one video frame per step; no panel for the expert.
    assert sorted(p.name for p in (out / "videos").iterdir()) == ["seed_1234.mp4"]
    frames = _video_frames(out / "videos" / "seed_1234.mp4")
    assert frames.shape == (40, 496, 384, 3)
    assert iio.immeta(out / "videos" / "seed_1234.mp4")["fps"] == 50.0  # CarRacing steps at 50 Hz: real time


def test_driver_executes_the_policy_action(tmp_path, ckpts):
    """A constant policy must produce exactly the return of the same constant action applied open loop."""
    from envs.carracing import make_carracing

    out = tmp_path / "const"
    threads = torch.get_num_threads()
    m = evaluate(resolve(_args(out, checkpoint=[str(ckpts["const"])], max_steps=30, video=False)))["const"]
    env = make_carracing("continuous", render=True, max_episode_steps=30)
    env.reset(seed=1234)
    ret, action = 0.0, np.array([0.3, 0.2, 0.0], np.float32)
    for _ in range(30):
        ret += env.step(action)[1]
    env.close()
    e = m["episodes"][0]
    assert e["return"] == pytest.approx(ret, abs=1e-6)
    assert e["steer_smoothness"] == pytest.approx(0.0, abs=1e-6)
    assert e["steer_mae"] > 0  # the expert does not hold a constant 0.3 steer from the start line
    assert not (out / "videos").exists()
    assert torch.get_num_threads() == threads  # evaluate() restores the caller's thread count


def test_tiny_nac_policy_video_has_attention_panel_and_saliency(tmp_path, ckpts):
    out = tmp_path / "nac"
    m = evaluate(resolve(_args(out, checkpoint=[str(ckpts["nac"])], saliency=True, max_steps=25)))["nac"]
    e = m["episodes"][0]
    assert e["length"] == 25 and e["video"] == "videos/seed_1234.mp4"
    assert m["policy_config"]["core"] == "nac" and m["latency_steps"] == 25
    assert 0 < m["latency_median_ms"] <= m["latency_p95_ms"]
    frames = _video_frames(out / e["video"])
    assert frames.shape == (25, 496, 640, 3)  # 384 view + 256 attention panel


def test_discrete_policy_drives_with_discrete_steering(tmp_path, ckpts):
    m = evaluate(resolve(_args(tmp_path, checkpoint=[str(ckpts["discrete"])], video=False)))["disc"]
    assert m["action_space"] == "discrete"
    assert 0.0 <= m["episodes"][0]["steer_mae"] <= 2.0


def test_sampled_discrete_actions_repeat_per_track_seed_in_any_worker(tmp_path, ckpts):
    """--discrete-actions sample: actions drawn from a generator seeded by the track seed, so a rerun (serial or
    with workers) gives the same episodes, and they are not argmax's; dither's are recorded as such."""
    kw = dict(checkpoint=[str(ckpts["discrete"])], video=False, episodes=2, max_steps=30, renderer="fast")
    runs = [evaluate(resolve(_args(tmp_path / name, discrete_actions=actions, workers=workers, **kw)))["disc"]
            for name, actions, workers in (("a", "sample", 1), ("b", "sample", 2), ("c", "argmax", 1),
                                           ("d", "dither", 1))]
    returns = [[(e["return"], e["steer_mae"]) for e in m["episodes"]] for m in runs]
    assert returns[0] == returns[1] and returns[0] != returns[2]
    assert runs[0]["discrete_actions"] == "sample" and runs[2]["discrete_actions"] == "argmax"
    assert runs[3]["discrete_actions"] == "dither" and returns[3] != returns[2]


def test_workers_beyond_the_episodes_are_recorded_as_the_processes_that_ran(tmp_path, ckpts):
    """--workers 1000 starts one process per episode (as collect.py does), and metrics.json says so, not 1000."""
    one = resolve(_args(tmp_path / "one", checkpoint=[str(ckpts["const"])], episodes=2, workers=1000))
    two = resolve(_args(tmp_path / "two", checkpoint=[str(ckpts["const"])], with_expert=True, episodes=2,
                        workers=1000))
    assert (one.runtime.workers, two.runtime.workers) == (2, 4)


def test_a_checkpoint_that_names_its_action_rule_drives_with_it_unless_told(tmp_path, ckpts):
    """A discrete student trained to sample (its config's discrete_actions) samples by default, as the same
    weights told --discrete-actions sample do; an explicit rule overrides the checkpoint's."""
    payload = torch.load(ckpts["discrete"], weights_only=True)
    payload["config"]["discrete_actions"] = "sample"
    sampler = tmp_path / "sampler.pt"
    torch.save(payload, sampler)
    kw = dict(video=False, episodes=2, max_steps=30, renderer="fast")
    told = evaluate(resolve(_args(tmp_path / "told", checkpoint=[str(ckpts["discrete"])], discrete_actions="sample",
                                  **kw)))
    own = evaluate(resolve(_args(tmp_path / "own", checkpoint=[str(sampler)], workers=2, **kw)))
    argmax = evaluate(resolve(_args(tmp_path / "argmax", checkpoint=[str(sampler)], discrete_actions="argmax", **kw)))
    (told,), (own,), (argmax,) = (list(r.values()) for r in (told, own, argmax))
    episodes = [[(e["return"], e["steer_mae"]) for e in m["episodes"]] for m in (told, own, argmax)]
    assert episodes[0] == episodes[1] != episodes[2]
    assert (own["discrete_actions"], argmax["discrete_actions"]) == ("sample", "argmax")


def test_a_checkpoint_drives_at_its_own_temperature_unless_told(tmp_path, ckpts):
    """A sampling checkpoint that names a temperature drives at it by default, as the plain weights told
    --action-temperature do; --discrete-actions with another rule drops it to 1; argmax and continuous students
    refuse the flag with a clear error."""
    payload = torch.load(ckpts["discrete"], weights_only=True)
    payload["config"].update(discrete_actions="sample", action_temperature=3.0)
    warm = tmp_path / "warm.pt"
    torch.save(payload, warm)
    kw = dict(video=False, episodes=2, max_steps=30, renderer="fast")
    runs = [next(iter(evaluate(resolve(_args(tmp_path / name, checkpoint=[str(c)], **kw, **extra))).values()))
            for name, c, extra in (("own", warm, {}),
                                   ("told", ckpts["discrete"], dict(discrete_actions="sample", action_temperature=3.0)),
                                   ("plain", ckpts["discrete"], dict(discrete_actions="sample")),
                                   ("dither", warm, dict(discrete_actions="dither")),
                                   ("spared", warm, dict(temperature_spares="brake")))]
    episodes = [[(e["return"], e["steer_mae"]) for e in m["episodes"]] for m in runs]
    assert episodes[0] == episodes[1] != episodes[2]
    assert [m["action_temperature"] for m in runs] == [3.0, 3.0, 1.0, 1.0, 3.0]
    assert [m.get("temperature_spares") for m in runs] == [None] * 4 + [["brake"]]
    assert action_rule_label({"spared": runs[4]}) == "sampling at temperature 3, brake spared"
    with pytest.raises(ValueError, match="--action-temperature changes only the sample and dither rules"):
        evaluate(resolve(_args(tmp_path / "x", checkpoint=[str(ckpts["discrete"])], action_temperature=2.0, **kw)))
    with pytest.raises(ValueError, match="--action-temperature is for discrete students"):
        evaluate(resolve(_args(tmp_path / "y", checkpoint=[str(ckpts["nac"])], action_temperature=2.0, **kw)))
    with pytest.raises(ValueError, match="--action-temperature: the action temperature must be a number > 0"):
        evaluate(resolve(_args(tmp_path / "z", checkpoint=[str(ckpts["discrete"])], action_temperature=0.0, **kw)))


def test_comparison_of_checkpoints_and_expert_on_the_same_seeds(tmp_path, ckpts):
    out = tmp_path / "cmp"
    res = evaluate(resolve(_args(out, checkpoint=[str(ckpts["nac"]), str(ckpts["const"])], with_expert=True,
                                 episodes=2, max_steps=20, video=False)))
    assert list(res) == ["nac", "const", "expert"]
    for name in res:
        m = json.loads((out / name / "metrics.json").read_text())
        assert [e["seed"] for e in m["episodes"]] == [1234, 1235]
    table, paired = (out / "comparison.md").read_text().split("## Paired differences: each policy minus nac")
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| policy")]
    assert [r.split("|")[1].strip() for r in rows] == ["nac", "const", "expert"]
    paired_rows = [line.split("|")[1:3] for line in paired.splitlines()
                   if line.startswith("| ") and "policy" not in line]
    assert [[c.strip() for c in r] for r in paired_rows] == [["const", "all"], ["expert", "all"]]
    assert f"{res['expert']['mean_return']:.1f} ± {res['expert']['std_return']:.1f}" in table
    # episodes cut at 20 of CarRacing's 1000 steps: the table says its figures are not the full episodes' ones
    assert "Episodes end at 20 steps (0.4 s), before carracing's own 1000" in table
    assert "autonomy" not in paired  # a race table has no autonomy column to explain
    assert set(json.loads((out / "comparison.json").read_text())) == {"nac", "const", "expert"}


def test_ctrl_c_keeps_the_finished_episodes(tmp_path, monkeypatch):
    real = evaluation.run_episode
    calls = []

    def interrupt_second(*a, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(evaluation, "run_episode", interrupt_second)
    out = tmp_path / "int"
    with pytest.raises(Interrupted):
        evaluate(resolve(_args(out, expert_drives=True, episodes=3, max_steps=10, video=False)))
    m = json.loads((out / "metrics.json").read_text())
    assert m["interrupted"] is True and [e["seed"] for e in m["episodes"]] == [1234]


def test_sigterm_cli_keeps_the_finished_episodes(tmp_path):
    """`kill PID` stops evaluate.py like Ctrl-C: exit 130, metrics of the finished episodes, no traceback."""
    out = tmp_path / "term"
    cmd = [sys.executable, "evaluate.py", "--expert-drives", "--episodes", "500", "--max-steps", "30", "--no-video",
           "--renderer", "fast", "--workers", "1", "--progress", "--out", str(out)]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        seen = []
        for line in proc.stderr:  # not a terminal: one plain line per finished episode
            seen.append(line)
            if "episode 2/500" in line:
                break
        assert proc.poll() is None, "".join(seen)
        proc.terminate()
        _, rest = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    stderr = "".join(seen) + rest
    assert proc.returncode == 130, stderr
    assert "interrupted: wrote" in stderr and "Traceback" not in stderr
    m = json.loads((out / "metrics.json").read_text())
    assert m["interrupted"] is True and 2 <= len(m["episodes"]) < 500


def test_a_stop_while_tensorboard_is_written_waits_until_the_writer_is_closed(tmp_path, monkeypatch):
    """A stop raised inside SummaryWriter's queue code can leave close() waiting on its thread for 120 s, so a stop
    signal landing while evaluate writes its scalars is raised after close(), with every scalar written. The stop
    an interrupted evaluation already handled is not raised a second time by that write."""
    import signal

    from torch.utils.tensorboard import SummaryWriter
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from agent.evaluation.metrics import write_tensorboard
    from common.stops import raise_if_stopped, sigterm_as_interrupt, stop_handled

    summary = {"episodes": [{"return": float(i)} for i in range(5)], "mean_return": 2.0}
    add_scalar = SummaryWriter.add_scalar

    def add_scalar_then_stop(self, tag, value, step):
        add_scalar(self, tag, value, step)
        if tag == "eval/return" and step == 1:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(SummaryWriter, "add_scalar", add_scalar_then_stop)
    with sigterm_as_interrupt():
        with pytest.raises(KeyboardInterrupt):
            write_tensorboard(tmp_path / "stopped", summary)
        with pytest.raises(KeyboardInterrupt):  # a stop caught and handled, as evaluate_controller does
            os.kill(os.getpid(), signal.SIGTERM)
            raise_if_stopped()
        stop_handled()
        monkeypatch.setattr(SummaryWriter, "add_scalar", add_scalar)
        write_tensorboard(tmp_path / "after", summary)  # not raised again
    acc = EventAccumulator(str(tmp_path / "stopped"))
    acc.Reload()
    assert [e.value for e in acc.Scalars("eval/return")] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert [e.value for e in acc.Scalars("eval/mean_return")] == [2.0]


# ----------------------------------------------------------------------------- metrics units
def test_steer_of_and_recorder():
    assert [steer_of(a, "discrete") for a in range(5)] == [0.0, 1.0, -1.0, 0.0, 0.0]
    assert steer_of(np.array([-0.25, 1.0, 0.0]), "continuous") == -0.25
    with pytest.raises(ValueError, match="action_space"):
        steer_of(0, "hybrid")
    rec = EpisodeRecorder(7, "continuous", get_spec("carracing"))
    policy = [0.1, 0.3, -0.1, -0.1]
    expert = [0.0, 0.4, 0.0, 0.1]
    cos_heading = FEATURE_NAMES.index("cos_heading_error")
    for i, (p, e) in enumerate(zip(policy, expert)):
        privileged = np.zeros(len(FEATURE_NAMES), np.float32)
        privileged[cos_heading] = -0.5 if i == 3 else 1.0  # the last step points backwards
        info = {"speed": 10.0 * i, "on_track": i != 2, "tiles_visited": i + 1, "num_tiles": 8, "unvisited_tiles": "",
                "lap_complete": False,
                "privileged": privileged}
        rec.record(reward=1.0, policy_action=[p, 0, 0], expert_action=[e, 0, 0], latency_s=0.001 * (i + 1), info=info)
    row = rec.finish(terminated=False, truncated=True)
    assert row["steer_mae"] == pytest.approx(np.mean([0.1, 0.1, 0.1, 0.2]))
    assert row["steer_smoothness"] == pytest.approx(np.mean([0.2, 0.4, 0.0]))
    assert row["completion"] == 0.5 and row["off_track_steps"] == 1 and row["return"] == 4.0
    assert row["mean_speed"] == 15.0 and row["latency_median_ms"] == pytest.approx(2.5)
    assert row["wrong_way_steps"] == 1
    s = aggregate([row, {**row, "seed": 8, "return": 0.0, "lap_completed": True}], [1.0, 2.0, 3.0])
    assert s["mean_return"] == 2.0 and s["std_return"] == 2.0 and s["laps_completed"] == 1
    assert s["latency_median_ms"] == 2.0
    assert s["mean_wrong_way_steps"] == 1.0
    table = comparison_markdown([("x", s)])
    assert "| x | 2.0 ± 2.0 |" in table and "| 1.0 | 1.0 |" in table  # off-track steps, then wrong-way steps


def test_run_names_are_unique():
    assert run_names(["a/nac/best.pt", "b/lstm/best.pt"]) == ["nac_best", "lstm_best"]
    assert run_names(["runs/nac.pt", "runs/lstm.pt"]) == ["nac", "lstm"]


def test_display_names_label_the_comparison(tmp_path, ckpts):
    """--name: comparison rows and folders say what each policy is, not 'best'."""
    evaluate(resolve(_args(tmp_path, checkpoint=[str(ckpts["nac"]), str(ckpts["const"])], max_steps=5, video=False,
                           tensorboard=False, name=["trained just now", "shipped"])))
    table = (tmp_path / "comparison.md").read_text()
    assert "| trained_just_now |" in table and "| shipped |" in table
    assert (tmp_path / "trained_just_now" / "metrics.json").is_file()
    with pytest.raises(ValueError, match="one name per --checkpoint"):
        evaluate(resolve(_args(tmp_path / "x", checkpoint=[str(ckpts["nac"]), str(ckpts["const"])], name=["only one"])))


# ----------------------------------------------------------------------------- errors
@pytest.mark.parametrize("bad, match", [
    (dict(expert_drives=True, checkpoint=["x.pt"]), "not both"),
    (dict(episodes=0, expert_drives=True), "--episodes"),
    (dict(expert_drives=True, saliency=True), "saliency"),
    (dict(env="mars", expert_drives=True), "--env"),
])
def test_bad_arguments_raise_clear_errors(tmp_path, bad, match):
    with pytest.raises(ValueError, match=match):
        evaluate(resolve(_args(tmp_path, **bad)))


def test_mixed_action_spaces_are_refused(tmp_path, ckpts):
    with pytest.raises(ValueError, match="mix action spaces"):
        evaluate(resolve(_args(tmp_path, checkpoint=[str(ckpts["nac"]), str(ckpts["discrete"])])))


def test_cli_missing_checkpoint_is_one_line_error(tmp_path, capsys):
    import evaluate as cli

    assert cli.main(["--checkpoint", str(tmp_path / "nope.pt"), "--out", str(tmp_path / "o"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "does not exist" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("case, needle", [
    ("other_env", "Udacity-v0"),
    ("wrong_space", "'continuous' action space"),
    ("bad_seed", "--seed"),
    ("sample_continuous", "--discrete-actions sample is for discrete students"),
])
def test_cli_main_turns_bad_input_into_exit_2(tmp_path, ckpts, capsys, case, needle):
    import evaluate as cli

    argv = {
        "other_env": ["--checkpoint", str(ckpts["other_env"])],
        "wrong_space": ["--checkpoint", str(ckpts["nac"]), "--action-space", "discrete"],
        "bad_seed": ["--expert-drives", "--seed", "-3"],
        "sample_continuous": ["--checkpoint", str(ckpts["nac"]), "--discrete-actions", "sample"],
    }[case]
    assert cli.main([*argv, "--out", str(tmp_path / "o"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and needle in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_cli_default_is_the_shipped_checkpoint(tmp_path, monkeypatch, capsys):
    """No --checkpoint: the shipped student drives (from any folder), or a clear error says it is missing."""
    import evaluate as cli

    monkeypatch.chdir(tmp_path)
    code = cli.main(["--episodes", "1", "--max-steps", "5", "--no-video", "--out", str(tmp_path / "o"),
                     "--no-progress"])
    err = capsys.readouterr().err
    if (REPO / shipped_checkpoint("carracing")).is_file():
        assert code == 0, err
        assert json.loads((tmp_path / "o" / "metrics.json").read_text())["num_episodes"] == 1
    else:
        assert code == 2 and "carracing_nac.pt" in err and len(err.strip().splitlines()) == 1, err


def test_paired_differences_pair_episodes_by_seed_and_report_their_standard_error():
    from agent.evaluation.metrics import paired_differences, paired_markdown

    base = [{"seed": s, "autonomy": a, "theme": t} for s, a, t in ((1, 100.0, "lake"), (2, 50.0, "jungle"),
                                                                   (3, 80.0, "lake"))]
    other = [{"seed": s, "autonomy": a, "theme": t} for s, a, t in ((3, 90.0, "lake"), (1, 90.0, "lake"),
                                                                    (2, 60.0, "jungle"))]
    mean, se, n = paired_differences(base, other, "autonomy")  # differences +10, -10, +10 whatever the order
    assert n == 3 and mean == pytest.approx(10 / 3) and se == pytest.approx(np.std([-10, 10, 10], ddof=1) / np.sqrt(3))
    table = paired_markdown([("a", {"autonomy": 1.0, "episodes": base}), ("b", {"autonomy": 1.0, "episodes": other})])
    assert "| b | all | 3 | +3.3 (6.7) |" in table and "| b | jungle | 1 | +10.0 (n/a) |" in table
    assert paired_markdown([("a", {"autonomy": 1.0, "episodes": base})]) == ""


def test_offline_scores_of_a_discrete_student_on_recorded_expert_actions(tmp_path, ckpts, capsys):
    """evaluate.py --data DATASET --checkpoint DISCRETE: a student with fixed logits, scored on recorded action
    ids; agreement, the recorded action's NLL and the mean probabilities at its temperature are checked against
    values computed here. A continuous checkpoint on discrete data, or --action-temperature for it, is one line."""
    import evaluate as cli
    from driving_data.dataset import write_episode

    labels = [np.array([3, 3, 1, 2, 3, 4]), np.array([3, 0, 3, 3])]
    for k, y in enumerate(labels):
        T = len(y)
        write_episode(tmp_path / "demos", k, {
            "frames": np.random.default_rng(k).integers(0, 255, (T, 96, 96, 3), dtype=np.uint8),
            "action": y, "expert_action": y, "reward": np.zeros(T, np.float32), "speed": np.zeros(T, np.float32),
            "privileged": np.zeros((T, 4), np.float32), "time": np.arange(T) * 0.02},
            {"env": "carracing", "action_space": "discrete", "track_seed": k})
    logits = torch.tensor([0.0, 1.0, 1.5, 3.0, -1.0])
    payload = torch.load(ckpts["discrete"], weights_only=True)
    weight = next(k for k in payload["state_dict"] if k.startswith("head.") and k.endswith("weight"))
    payload["state_dict"][weight].zero_()
    payload["state_dict"][weight.replace("weight", "bias")].copy_(logits)
    fixed = tmp_path / "fixed.pt"
    torch.save(payload, fixed)
    out = tmp_path / "off"
    assert cli.main(["--data", str(tmp_path / "demos"), "--checkpoint", str(fixed), "--out", str(out), "--no-progress",
                     "--discrete-actions", "sample", "--action-temperature", "1.5"]) == 0
    result = json.loads((out / "offline.json").read_text())
    logp = torch.log_softmax(logits / 1.5, 0).double().numpy()
    y = np.concatenate(labels)
    assert result["temperature"] == 1.5 and [s["frames"] for s in result["sessions"]] == [6, 4]
    p = result["pooled"]
    assert p["accuracy"] == pytest.approx(np.mean(y == 3))  # gas is the likeliest action on every frame
    assert p["label_nll"] == pytest.approx(-logp[y].mean(), rel=1e-5)
    np.testing.assert_allclose(p["mean_probs"], np.exp(logp), rtol=1e-5)
    assert (p["commonest_label"], p["commonest_label_accuracy"]) == ("gas", pytest.approx(0.6))
    table = (out / "offline.md").read_text()
    assert "# Offline action scores" in table and "| always gas (the recorded actions' shares) | 0.600 |" in table
    assert "agrees with the recorded action on 0.600 of 10 frames" in capsys.readouterr().out
    spared = tmp_path / "spared"  # brake keeps its temperature-1 probability, the rest share the remainder at 1.5
    assert cli.main(["--data", str(tmp_path / "demos"), "--checkpoint", str(fixed), "--out", str(spared),
                     "--no-progress", "--discrete-actions", "sample", "--action-temperature", "1.5",
                     "--temperature-spares", "brake"]) == 0
    probs = json.loads((spared / "offline.json").read_text())["pooled"]["mean_probs"]
    p1 = torch.softmax(logits, 0).double().numpy()
    assert probs[4] == pytest.approx(p1[4], rel=1e-6) and sum(probs) == pytest.approx(1.0)
    np.testing.assert_allclose(np.array(probs[:4]) / sum(probs[:4]), np.exp(logp[:4]) / np.exp(logp[:4]).sum(),
                               rtol=1e-6)
    assert "(temperature 1.5, brake spared)" in (spared / "offline.md").read_text()
    capsys.readouterr()
    for extra, needle in ((["--checkpoint", str(ckpts["nac"])],
                           "continuous action space; the data's actions are discrete"),
                          (["--checkpoint", str(ckpts["nac"]), "--action-temperature", "2"],
                           "--action-temperature is for discrete students"),
                          (["--checkpoint", str(ckpts["nac"]), "--temperature-spares", "brake"],
                           "--temperature-spares is for discrete students"),
                          (["--checkpoint", str(fixed), "--temperature-spares", "brake"],
                           "--temperature-spares changes only the sample and dither rules"),
                          (["--checkpoint", str(fixed), "--discrete-actions", "sample", "--temperature-spares",
                            "clutch"],
                           "--temperature-spares: spared actions must be names of"),
                          (["--checkpoint", str(ckpts["other_env"])],  # the data's env, not a --env to change
                           "the data was recorded in carracing ('CarRacing-v3'): score a student of that env")):
        assert cli.main(["--data", str(tmp_path / "demos"), "--out", str(tmp_path / "e"), *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error:") and needle in err[0], err


def test_precision_scores_recorded_frames_in_bf16_and_drives_exactly_as_fp32(tmp_path, ckpts, capsys):
    """--precision bf16 encodes --data's frames in bfloat16 (scores within round-off of fp32's); a drive steps one
    frame at a time, in fp32 under every precision, so the shipped student drives the same episode under both."""
    import evaluate as cli
    from driving_data.dataset import write_episode

    for k in range(2):
        T = 40
        act = np.random.default_rng(k).uniform(-1, 1, (T, 3)).astype(np.float32)
        write_episode(tmp_path / "demos", k, {
            "frames": np.random.default_rng(k).integers(0, 255, (T, 96, 96, 3), dtype=np.uint8), "action": act,
            "expert_action": act, "reward": np.zeros(T, np.float32), "speed": np.zeros(T, np.float32),
            "privileged": np.zeros((T, 4), np.float32), "time": np.arange(T) * 0.02},
            {"env": "carracing", "action_space": "continuous", "track_seed": k})
    scores = {}
    for p in ("fp32", "bf16"):
        assert cli.main(["--data", str(tmp_path / "demos"), "--checkpoint", str(ckpts["nac"]), "--out",
                         str(tmp_path / p), "--no-progress", "--precision", p]) == 0
        offline = json.loads((tmp_path / p / "offline.json").read_text())
        assert offline["precision"] == p
        scores[p] = offline["pooled"]["policy_raw"]["mse"]
    assert scores["bf16"] != scores["fp32"] and scores["bf16"] == pytest.approx(scores["fp32"], rel=0.02)
    shipped = REPO / shipped_checkpoint("carracing")
    drives = {p: evaluate(resolve(_args(tmp_path / f"drive_{p}", checkpoint=[str(shipped)], precision=p, video=False,
                                        max_steps=60)))["carracing_nac"] for p in ("fp32", "bf16")}
    assert drives["fp32"]["precision"] == drives["bf16"]["precision"] == "fp32"
    same = ("return", "completion", "steer_mae", "steer_smoothness")
    assert [[e[k] for k in same] for e in drives["bf16"]["episodes"]] == [[e[k] for k in same]
                                                                          for e in drives["fp32"]["episodes"]]
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        cli.main(["--precision", "half", "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "--precision: invalid choice: 'half'" in err[0], err
