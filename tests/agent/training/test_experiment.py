"""Behaviour cloning end to end on tiny synthetic datasets: every core learns, checkpoints, resume, TensorBoard, CLI
errors."""
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

import agent.training.loop as loop
from agent.training.config import TrainArgs, default_out, resolve
from agent.training.experiment import NOT_LEARNED_RATIO, finished, not_learned, resume_args, run
from agent.training.loop import Interrupted
from driving_data.dataset import write_episode
from envs.carracing import SPEC as CARRACING
from policies.cores import CORES
from policies.checkpoint import load_checkpoint, read_checkpoint

ROOT = Path(__file__).resolve().parents[3]
SIZE = 32


def write_synthetic(root, episodes=5, length=40, action_space="continuous", seed=0, size=SIZE) -> Path:
    """Frames with a bright vertical bar that drifts; the label is where the bar is (steer) and follows from it.

    Learnable from the current frame alone, so every core (the memoryless mlp too) can fit it.
    """
    rng = np.random.default_rng(seed)
    for e in range(episodes):
        pos = np.clip(np.cumsum(rng.normal(0, 1.5, length)) + rng.uniform(8, size - 8), 3, size - 4)
        frames = rng.integers(0, 40, (length, size, size, 3), dtype=np.uint8)
        for t, c in enumerate(pos.round().astype(int)):
            frames[t, :, c - 2: c + 2] = 230
        steer = pos / (size - 1) * 2 - 1
        if action_space == "continuous":
            act = np.stack([steer, 1 - 0.5 * np.abs(steer), 0.3 * (steer > 0.5)], 1).astype(np.float32)
            extra = {}
        else:
            act = np.clip(((steer + 1) / 2 * 5).astype(np.int64), 0, 4)
            extra = {"expert_probs": np.eye(5, dtype=np.float32)[act]}
        arrays = dict(frames=frames, action=act, expert_action=act, reward=np.zeros(length, np.float32),
                      speed=np.zeros(length, np.float32), privileged=np.zeros((length, 4), np.float32),
                      time=np.arange(length) * 0.02, **extra)
        write_episode(root, e, arrays, {"env": "carracing", "action_space": action_space, "track_seed": e})
    return Path(root)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return write_synthetic(tmp_path_factory.mktemp("demos"), episodes=6)


def tiny_args(data, out, **kw) -> TrainArgs:
    base = dict(data=str(data), out=str(out), window=3, frame_stride=2, epochs=4, batch_size=32, segment=8,
                lr=5e-3, feature_dim=16, d_model=16, heads=4, hidden=16, threads=1, log_every=2)
    base.update(kw)
    return TrainArgs(**base)


def test_resolve_cuts_the_plan_the_run_trains_and_records(data_dir, tmp_path):
    """resolve cuts the arguments once; what the dataset decides (--frame-stride 0, the encoder, the
    augmentations) is filled in by with_env_defaults, and the run trains that plan and records it as args.json."""
    from agent.training.config import with_env_defaults

    plan = resolve(tiny_args(data_dir, tmp_path / "r", policy="mlp", epochs=1, frame_stride=0))
    assert (plan.run.out, plan.run.threads, plan.specs) == (str(tmp_path / "r"), 1, ["mlp"])
    assert (plan.model.encoder, plan.windows.frame_stride, plan.augmentation.flip) == ("auto", 0, None)
    full = with_env_defaults(plan)
    assert full.model.encoder != "auto" and full.windows.frame_stride == full.model.frame_stride > 0
    assert full.augmentation.flip is not None and full.augmentation.side_correction is not None
    assert {k: full.record[k] for k in ("encoder", "frame_stride")} == {"encoder": full.model.encoder,
                                                                         "frame_stride": full.model.frame_stride}
    run(plan)
    written = json.loads((tmp_path / "r" / "args.json").read_text())
    chosen = written.pop("precision_resolved")  # what --precision auto chose on this machine, and why
    assert chosen["precision"] in ("fp32", "bf16") and chosen["reason"]
    assert written == json.loads(json.dumps({**full.record, "dataset_weight": "frames"}))
    assert read_checkpoint(tmp_path / "r" / "best.pt")["config"]["frame_stride"] == full.model.frame_stride


@pytest.mark.parametrize("core", list(CORES))
def test_every_core_learns_the_synthetic_task(core, data_dir, tmp_path):
    result = run(resolve(tiny_args(data_dir, tmp_path / core, policy=core, epochs=6, val_fraction=0.34)))
    metrics = json.loads((tmp_path / core / "metrics.json").read_text())
    history = metrics["history"]
    assert metrics["best"]["val_loss"] < 0.7 * metrics["initial"]["val_loss"], (metrics["initial"], history)
    # better than always answering the training mean (the val metrics are in env units)
    steer = np.concatenate([np.load(p)["expert_action"][:, 0] for p in sorted((data_dir / "episodes").glob("*.npz"))])
    assert metrics["best"]["val_steer_mae"] < np.abs(steer - steer.mean()).mean()
    assert result["summaries"][0]["param_count"] == metrics["param_count"] > 0
    policy = load_checkpoint(tmp_path / core / "best.pt")
    assert policy.config.core == core and policy.config.target_mean is not None


def test_a_run_that_has_not_learned_to_steer_says_so(data_dir, tmp_path, capsys):
    """A stuck run (here: a learning rate too small to move) ends like a finished one; its summary says it is not."""
    run(resolve(tiny_args(data_dir, tmp_path / "stuck", policy="mlp", epochs=1, lr=1e-12)))
    out = capsys.readouterr().out
    ratio = json.loads((tmp_path / "stuck" / "metrics.json").read_text())["best"]["val_steer_vs_straight"]
    assert ratio >= NOT_LEARNED_RATIO and "warning: mlp has not learned to steer" in out and f"{ratio:.2f}x" in out
    assert not_learned({"policy": "mlp", "val_steer_vs_straight": {"mean": 0.6}}) is None
    assert not_learned({"policy": "mlp", "val_accuracy": {"mean": 0.9}}) is None, "discrete students have no ratio"


def test_discrete_head_with_class_weights(tmp_path):
    data = write_synthetic(tmp_path / "d", episodes=4, action_space="discrete")
    run(resolve(tiny_args(data, tmp_path / "run", policy="gru", class_weights=True, epochs=3)))
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert 0.0 <= metrics["best"]["val_accuracy"] <= 1.0 and "val_mae" not in metrics["best"]
    policy = load_checkpoint(tmp_path / "run" / "best.pt")
    assert policy.config.head == "discrete"
    assert isinstance(policy.to_env_action(policy(torch.zeros(1, 3, SIZE, SIZE, 3, dtype=torch.uint8))[0]), int)


def test_discrete_students_carry_the_action_rule_they_drive_with(data_dir, tmp_path):
    """--discrete-actions is written into the checkpoint (evaluate.py's and collect.py --driver's default);
    --init keeps the checkpoint's unless told; a continuous student is refused the flag with a clear error."""
    discrete = write_synthetic(tmp_path / "d", episodes=3, action_space="discrete")
    run(resolve(tiny_args(discrete, tmp_path / "plain", policy="mlp", epochs=1)))
    assert load_checkpoint(tmp_path / "plain" / "best.pt").config.discrete_actions == "argmax"
    run(resolve(tiny_args(discrete, tmp_path / "sampled", policy="mlp", epochs=1, discrete_actions="sample")))
    sampled = tmp_path / "sampled" / "best.pt"
    assert load_checkpoint(sampled).config.discrete_actions == "sample"
    run(resolve(tiny_args(discrete, tmp_path / "kept", epochs=1, init=str(sampled))))
    assert load_checkpoint(tmp_path / "kept" / "best.pt").config.discrete_actions == "sample"
    run(resolve(tiny_args(discrete, tmp_path / "told", epochs=1, init=str(sampled), discrete_actions="dither")))
    assert load_checkpoint(tmp_path / "told" / "best.pt").config.discrete_actions == "dither"
    with pytest.raises(ValueError, match="--discrete-actions sample is for discrete students"):
        run(resolve(tiny_args(data_dir, tmp_path / "cont", policy="mlp", epochs=1, discrete_actions="sample")))
    with pytest.raises(ValueError, match="--discrete-actions must be one of argmax, sample, dither"):
        run(resolve(tiny_args(discrete, tmp_path / "bad", policy="mlp", epochs=1, discrete_actions="greedy")))
    # the sampling temperature travels the same way; a new rule starts at 1, argmax takes none
    warm = tmp_path / "warm" / "best.pt"
    run(resolve(tiny_args(discrete, tmp_path / "warm", epochs=1, init=str(sampled), action_temperature=1.5)))
    assert load_checkpoint(warm).config.action_temperature == 1.5
    run(resolve(tiny_args(discrete, tmp_path / "warm_kept", epochs=1, init=str(warm))))
    assert load_checkpoint(tmp_path / "warm_kept" / "best.pt").config.action_temperature == 1.5
    run(resolve(tiny_args(discrete, tmp_path / "warm_dither", epochs=1, init=str(warm), discrete_actions="dither")))
    assert load_checkpoint(tmp_path / "warm_dither" / "best.pt").config.action_temperature == 1.0
    with pytest.raises(ValueError, match="--action-temperature: .*argmax.*add --discrete-actions sample"):
        run(resolve(tiny_args(discrete, tmp_path / "cold", policy="mlp", epochs=1, action_temperature=1.5)))
    with pytest.raises(ValueError, match="--action-temperature: .*drives argmax"):
        run(resolve(tiny_args(discrete, tmp_path / "cold2", epochs=1, init=str(tmp_path / "plain" / "best.pt"),
                      action_temperature=1.5)))
    with pytest.raises(ValueError, match="--action-temperature is for discrete students"):
        run(resolve(tiny_args(data_dir, tmp_path / "cont2", policy="mlp", epochs=1, action_temperature=1.5)))


def test_tensorboard_scalars_and_nac_internals_are_written(data_dir, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run(resolve(tiny_args(data_dir, tmp_path / "tb", policy="nac", epochs=2)))
    events = list((tmp_path / "tb").glob("events.out.tfevents.*"))
    assert len(events) == 1
    acc = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0, "histograms": 0, "images": 0})
    acc.Reload()
    tags = acc.Tags()
    for tag in ("losses/train", "losses/val", "metrics/val_mae", "metrics/val_mse", "metrics/val_steer_mae",
                "charts/learning_rate", "charts/grad_norm", "charts/samples_per_sec"):
        assert tag in tags["scalars"], (tag, tags["scalars"])
    assert {"nac/phi", "nac/omega"} <= set(tags["histograms"]) and "nac/attention" in tags["images"]
    val = [e.value for e in acc.Scalars("losses/val")]
    metrics = json.loads((tmp_path / "tb" / "metrics.json").read_text())
    assert val == pytest.approx([metrics["initial"]["val_loss"]] + [h["val_loss"] for h in metrics["history"]],
                                rel=1e-6)
    lrs = [e.value for e in acc.Scalars("charts/learning_rate")]
    assert max(lrs) <= 5e-3 * (1 + 1e-6) and lrs[-1] < max(lrs)  # warmup + cosine decay


def test_resume_after_interrupt_matches_an_uninterrupted_run(data_dir, tmp_path, monkeypatch):
    args = tiny_args(data_dir, tmp_path / "ref", policy="lstm", epochs=2)
    run(resolve(args))
    reference = torch.load(tmp_path / "ref" / "last.pt", weights_only=True)

    calls = {"n": 0}
    real_loss = loop.loss_fn

    def interrupting_loss(*a, **kw):
        calls["n"] += 1
        if calls["n"] == 6:  # mid-way through epoch 2 (4-5 batches per epoch)
            raise KeyboardInterrupt
        return real_loss(*a, **kw)

    monkeypatch.setattr(loop, "loss_fn", interrupting_loss)
    out = tmp_path / "cut"
    with pytest.raises(Interrupted, match="--resume"):
        run(resolve(replace(args, out=str(out))))
    state = read_checkpoint(out / "last.pt")["train_state"]
    assert not state["done"] and (state["epoch"], state["batch"]) != (0, 0)
    assert not finished(out) and resume_args(out) == ["--out", str(out), "--resume"]
    assert finished(tmp_path / "ref") and resume_args(tmp_path / "new") == ["--out", str(tmp_path / "new")]
    monkeypatch.setattr(loop, "loss_fn", real_loss)
    run(resolve(TrainArgs(out=str(out), resume=True, threads=1)))  # everything else comes from the run's args.json
    assert finished(out)
    resumed = torch.load(out / "last.pt", weights_only=True)
    assert resumed["train_state"]["done"] and resumed["train_state"]["epoch"] == 2
    for k, v in reference["state_dict"].items():
        torch.testing.assert_close(resumed["state_dict"][k], v, atol=1e-5, rtol=1e-4)
    assert [h["val_loss"] for h in resumed["train_state"]["history"]] == pytest.approx(
        [h["val_loss"] for h in reference["train_state"]["history"]], rel=1e-4)


def test_a_resumed_run_shows_no_training_step_twice_in_tensorboard(data_dir, tmp_path, monkeypatch):
    """What a killed run logged after its last checkpoint is hidden once the run resumes from that checkpoint."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    calls = {"n": 0}
    real_loss = loop.loss_fn

    def interrupting_loss(*a, **kw):
        calls["n"] += 1
        if calls["n"] == 6:
            raise KeyboardInterrupt
        return real_loss(*a, **kw)

    monkeypatch.setattr(loop, "loss_fn", interrupting_loss)
    out = tmp_path / "killed"
    with pytest.raises(Interrupted):
        run(resolve(tiny_args(data_dir, out, policy="mlp", epochs=2, log_every=1)))
    saved = read_checkpoint(out / "last.pt")["train_state"]["global_step"]
    late = SummaryWriter(str(out))  # a process killed with -9 after the checkpoint kept on logging
    for k in range(1, 4):
        late.add_scalar("losses/train", 99.0, saved + k)
    late.close()
    monkeypatch.setattr(loop, "loss_fn", real_loss)
    run(resolve(TrainArgs(out=str(out), resume=True, threads=1)))
    acc = EventAccumulator(str(out), size_guidance={"scalars": 0})
    acc.Reload()
    steps = [e.step for e in acc.Scalars("losses/train")]
    assert len(steps) == len(set(steps)) and 99.0 not in [e.value for e in acc.Scalars("losses/train")]


def test_comparison_and_folds(data_dir, tmp_path):
    out = tmp_path / "cmp"
    run(resolve(tiny_args(data_dir, out, policy="mlp,nac-steady", epochs=1, folds=2)))
    table = (out / "comparison.md").read_text()
    assert "| mlp |" in table and "| nac-steady |" in table and "±" in table and "samples/s" in table
    summary = json.loads((out / "comparison.json").read_text())["summaries"]
    assert [s["policy"] for s in summary] == ["mlp", "nac-steady"]
    for name in ("mlp", "nac-steady"):
        assert (out / name / "fold_0" / "best.pt").exists() and (out / name / "fold_1" / "metrics.json").exists()
    steady = load_checkpoint(out / "nac-steady" / "fold_0" / "best.pt")
    assert steady.core.nac.mode == "steady"
    # the two folds validate on disjoint episodes that cover the dataset
    folds = [json.loads((out / "mlp" / f"fold_{k}" / "metrics.json").read_text())["val_episodes"] for k in (0, 1)]
    assert sorted(folds[0] + folds[1]) == list(range(6))


def test_defaults_are_the_shipped_recipe():
    a = TrainArgs()
    assert a.data == "data/carracing_continuous" and a.policy == "nac-focus" and a.encoder == "auto"
    assert (a.d_model, a.heads) == (64, 16) and a.window >= 4 and a.frame_stride == 0
    # "auto" resolves from the dataset's env: the shipped CarRacing recipe
    assert (CARRACING.default_encoder, CARRACING.default_frame_stride) == ("carracing", 3)
    assert default_out(a.policy) == str(Path("runs/train/nac-focus"))


def cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, str(ROOT / "train.py"), *args], capture_output=True, text=True,
                          cwd=cwd, timeout=120)


def main_in_process(capsys, *args) -> tuple[int, str]:
    """train.py's main() with its arguments, in this process (no interpreter start-up): exit code and stderr."""
    import train

    code = train.main(list(args))
    return code, capsys.readouterr().err


@pytest.mark.parametrize("case", ["missing_data", "unknown_policy", "bad_window", "corrupted_checkpoint"])
def test_cli_bad_input_is_one_clear_error(case, data_dir, tmp_path, capsys):
    if case == "missing_data":
        code, err = main_in_process(capsys, "--data", str(tmp_path / "nope"), "--out", str(tmp_path / "o"))
        expect = "does not exist"
    elif case == "unknown_policy":
        code, err = main_in_process(capsys, "--data", str(data_dir), "--core", "nac,transformer",
                                    "--out", str(tmp_path / "o"))
        expect = "valid policies: nac, lstm"
    elif case == "bad_window":
        code, err = main_in_process(capsys, "--data", str(data_dir), "--window", "0", "--out", str(tmp_path / "o"))
        expect = "--window must be >= 1"
    else:
        out = tmp_path / "o"
        out.mkdir()
        (out / "args.json").write_text(json.dumps({"data": str(data_dir), "policy": "mlp"}))
        (out / "last.pt").write_bytes(b"\x00garbage" * 100)
        code, err = main_in_process(capsys, "--resume", "--out", str(out))
        expect = "corrupted"
    assert code == 2, err
    assert err.startswith("error:") and expect in err and len(err.strip().splitlines()) == 1, err


def test_cli_trains_and_prints_a_summary(data_dir, tmp_path, capsys):
    """The real process (interpreter, __main__, exit code); its refusals then in-process, as the cases above."""
    out = tmp_path / "cli"
    r = cli("--data", str(data_dir), "--core", "mlp", "--epochs", "1", "--window", "2", "--batch-size", "32",
            "--segment", "8", "--threads", "1", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "mlp: val_loss" in r.stdout and "samples/s" in r.stdout
    assert {"best.pt", "last.pt", "metrics.json", "args.json"} <= {p.name for p in out.iterdir()}
    code, err = main_in_process(capsys, "--data", str(data_dir), "--core", "mlp", "--out", str(out))
    assert code == 2 and "--resume" in err  # never clobber a run silently
    code, err = main_in_process(capsys, "--data", str(tmp_path / "nope"), "--core", "mlp", "--out", str(out))
    assert code == 2 and "does not exist" in err and "--resume" not in err  # the data error wins


def test_init_fine_tunes_from_a_checkpoint(data_dir, tmp_path):
    """--init starts from the checkpoint's weights (its untrained score is the checkpoint's best) and architecture."""
    first = tmp_path / "first"
    run(resolve(tiny_args(data_dir, first, policy="gru", epochs=3, split_seed=1)))
    best = json.loads((first / "metrics.json").read_text())["best"]["val_loss"]
    again = tmp_path / "again"
    # a shape flag set to something else than the checkpoint's would be ignored: refused, naming the flag
    for flags, needle in ((dict(policy="mlp"), "--core mlp contradicts its gru"),
                          (dict(window=5), "--window 5 contradicts its 3")):
        with pytest.raises(ValueError, match=needle):
            run(resolve(tiny_args(data_dir, again, epochs=1, split_seed=1, init=str(first / "best.pt"), **flags)))
    # left at their defaults (--core) or equal to the checkpoint's (tiny_args' window 3), they take its shape
    run(resolve(tiny_args(data_dir, again, epochs=1, split_seed=1, init=str(first / "best.pt"))))
    metrics = json.loads((again / "metrics.json").read_text())
    assert metrics["initial"]["val_loss"] == pytest.approx(best, rel=1e-4)
    tuned = load_checkpoint(again / "best.pt")
    assert tuned.config.core == "gru" and tuned.config.window == 3
    assert metrics["policy"] == "gru" and read_checkpoint(again / "best.pt")["metadata"]["policy"] == "gru"
    assert tuned.config.target_mean == load_checkpoint(first / "best.pt").config.target_mean
    assert tuned.config.time_input == "seconds"
    # the time input is what the core is fed, not an architecture: --time-input given with --init applies
    blind = tmp_path / "blind"
    run(resolve(tiny_args(data_dir, blind, epochs=1, split_seed=1, time_input="index", init=str(again / "best.pt"))))
    assert load_checkpoint(blind / "best.pt").config.time_input == "index"
    kept = tmp_path / "kept"
    run(resolve(tiny_args(data_dir, kept, epochs=1, split_seed=1, init=str(blind / "best.pt"))))
    assert load_checkpoint(kept / "best.pt").config.time_input == "index"


def test_blend_init_writes_the_weight_mix_of_start_and_fine_tune_as_best_pt(data_dir, tmp_path, capsys):
    """--blend-init W: best.pt is (1 - W) x the --init checkpoint + W x the fine-tuned best (kept as best_tuned.pt),
    tensor by tensor, validated into metrics.json; without --init, or outside (0, 1], one clear error."""
    first = tmp_path / "first"
    run(resolve(tiny_args(data_dir, first, policy="mlp", epochs=1, split_seed=1)))
    tuned_dir = tmp_path / "tuned"
    run(resolve(tiny_args(data_dir, tuned_dir, epochs=2, split_seed=1, init=str(first / "best.pt"), blend_init=0.25)))
    start, tuned = (load_checkpoint(p).state_dict() for p in (first / "best.pt", tuned_dir / "best_tuned.pt"))
    blended = load_checkpoint(tuned_dir / "best.pt").state_dict()
    moved = [k for k, v in tuned.items() if v.is_floating_point() and not torch.equal(v, start[k])]
    assert moved  # the fine-tune changed weights, so the blend is neither of the two
    for k in moved:
        torch.testing.assert_close(blended[k], 0.75 * start[k] + 0.25 * tuned[k])
    metrics = json.loads((tuned_dir / "metrics.json").read_text())
    assert metrics["blend"]["share"] == 0.25 and np.isfinite(metrics["blend"]["val_loss"])
    assert "best.pt is the blend 0.75 x --init + 0.25 x epoch" in capsys.readouterr().out
    for flags, needle in ((dict(blend_init=0.5), "needs --init"),
                          (dict(blend_init=1.5, init=str(first / "best.pt")), r"in \(0, 1\]")):
        with pytest.raises(ValueError, match=needle):
            resolve(tiny_args(data_dir, tmp_path / "no", epochs=1, **flags))


def test_init_refuses_core_sizes_other_than_the_checkpoints_and_records_its_own(data_dir, tmp_path):
    """--d-model, --heads, --topk, --sparsity, --nac-mode, --hidden are the checkpoint's under --init: one given
    another value is refused, naming it; left at their defaults, args.json records the sizes the run trained."""
    first = tmp_path / "first"
    run(resolve(tiny_args(data_dir, first, policy="nac", epochs=1, topk=2, sparsity=0.25)))
    init = str(first / "best.pt")
    sizes = {f: getattr(TrainArgs, f) for f in ("d_model", "heads", "topk", "sparsity", "nac_mode", "hidden")}
    for flags, needle in ((dict(d_model=32), "--d-model 32 contradicts its d_model 16"),
                          (dict(heads=8), "--heads 8 contradicts its heads 4"),
                          (dict(topk=4), "--topk 4 contradicts its topk 2"),
                          (dict(sparsity=0.75), "--sparsity 0.75 contradicts its sparsity 0.25"),
                          (dict(nac_mode="euler"), "--nac-mode euler contradicts its mode exact")):
        with pytest.raises(ValueError, match=needle):
            resolve(tiny_args(data_dir, tmp_path / "again", epochs=1, init=init, **{**sizes, **flags}))
    # equal to the checkpoint's (d_model 16 given) or left at the defaults: its sizes, recorded as such
    again = tmp_path / "again"
    run(resolve(tiny_args(data_dir, again, epochs=1, init=init, **{**sizes, "d_model": 16})))
    written = json.loads((again / "args.json").read_text())
    assert {k: written[k] for k in ("d_model", "heads", "topk", "sparsity", "nac_mode")} == {
        "d_model": 16, "heads": 4, "topk": 2, "sparsity": 0.25, "nac_mode": "exact"}
    # a recurrent core: --hidden is its width, --topk is not one of its sizes (ignored, as without --init)
    gru = tmp_path / "gru"
    run(resolve(tiny_args(data_dir, gru, policy="gru", epochs=1)))
    with pytest.raises(ValueError, match="--hidden 32 contradicts its hidden 16"):
        resolve(tiny_args(data_dir, tmp_path / "g2", init=str(gru / "best.pt"), hidden=32))
    assert resolve(tiny_args(data_dir, tmp_path / "g2", init=str(gru / "best.pt"), topk=3, hidden=64,
                             d_model=64)).record["hidden"] == 16


def test_init_refuses_a_checkpoint_for_other_actions(data_dir, tmp_path):
    discrete = write_synthetic(tmp_path / "d", episodes=3, action_space="discrete")
    run(resolve(tiny_args(discrete, tmp_path / "disc", policy="mlp", epochs=1)))
    r = cli("--data", str(data_dir), "--init", str(tmp_path / "disc" / "best.pt"), "--out", str(tmp_path / "o"))
    assert r.returncode == 2 and "cannot be fine-tuned" in r.stderr and "head 'discrete'" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_sigterm_saves_a_resumable_checkpoint(data_dir, tmp_path):
    """`kill PID` (a scheduler, a shell script) stops a single-process run like Ctrl-C: last.pt is saved mid-epoch
    and --resume finishes the run."""
    import signal
    import time

    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, str(ROOT / "train.py"), "--data", str(data_dir), "--core", "gru",
                             "--epochs", "500", "--window", "2", "--batch-size", "8", "--segment", "4",
                             "--threads", "1", "--out", str(out)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 90
    while not list(out.glob("events.out.tfevents.*")) and time.monotonic() < deadline:  # training has begun
        time.sleep(0.2)
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted at epoch" in err and "--resume" in err and "Traceback" not in err
    state = read_checkpoint(out / "last.pt")["train_state"]
    assert not state["done"] and state["global_step"] > 0


def test_a_single_episode_trains_on_time_blocks_with_a_window_gap(tmp_path):
    """One recording session: the last --val-fraction of its steps validate, and the steps just before them
    (one window span) are used by neither side, so no training window or label touches a validation frame."""
    from agent.training.windows import block_pieces, window_span

    data = write_synthetic(tmp_path / "one", episodes=1, length=120)
    run(resolve(tiny_args(data, tmp_path / "run", epochs=3, val_fraction=0.25)))
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    span = window_span(3, 2)  # tiny_args: window 3, frame stride 2
    assert metrics["time_blocks"] == [[0, 0, 120 - 30 - span], [0, 90, 120]]
    assert metrics["train_episodes"] == [0] and metrics["val_episodes"] == [1]
    assert metrics["val_windows"] == 30 and metrics["train_windows"] == 120 - 30 - span
    assert metrics["best"]["val_loss"] < metrics["initial"]["val_loss"]
    # several episodes: each one's end validates; one too short for both blocks and the gap trains whole
    train, val = block_pieces([100, 6, 50], 0.2, gap=5)
    assert train == [(0, 0, 75), (1, 0, 6), (2, 0, 35)] and val == [(0, 80, 100), (2, 40, 50)]
    with pytest.raises(ValueError, match="long enough"):
        block_pieces([4], 0.2, gap=5)


def test_auto_split_holds_out_sessions_only_when_their_share_is_sensible():
    """Recorded sessions end where the person paused: a held-out session holding most of the steps (or almost
    none) gives time blocks instead; collected datasets keep their split by episode whatever the lengths."""
    from types import SimpleNamespace

    from agent.training.windows import auto_split_mode

    def mode(lengths, held_out, recorded):
        data = SimpleNamespace(frames=[np.zeros(n) for n in lengths], recorded=[recorded] * len(lengths))
        episodes = list(range(len(lengths)))
        split = ([e for e in episodes if e not in held_out], held_out)
        return auto_split_mode(data, episodes, split, 0.2)

    assert mode([93, 4608], [1], recorded=True) == "blocks"  # validation would be 98 % of the steps
    assert mode([93, 4608], [0], recorded=True) == "blocks"  # 2 %: too little to measure on
    assert mode([2330, 1042, 2842], [0], recorded=True) == "episodes"  # 37 %
    assert mode([2305, 2460], [0], recorded=True) == "blocks"  # 48 %: one of two laps, more than twice 20 %
    assert mode([93, 4608], [1], recorded=False) == "episodes"  # an expert's episodes
    assert auto_split_mode(SimpleNamespace(frames=[np.zeros(9)], recorded=[True]), [0], None, 0.2) == "blocks"


def test_oversample_turns_repeats_the_sharpest_segments_and_still_covers_every_step():
    from agent.training.windows import make_segments

    lengths = {0: 100, 1: 37}
    turns = {0: np.abs(np.sin(np.arange(100) / 7.0)), 1: np.linspace(0, 1, 37)}
    plain = make_segments(lengths, 8, np.random.default_rng(3))
    more = make_segments(lengths, 8, np.random.default_rng(3), turns, repeat=4)
    assert sorted(set(more)) == sorted(plain)  # the same segments, each step still covered
    counts = {seg: more.count(seg) for seg in plain}
    assert set(counts.values()) == {1, 4}
    sharpness = {seg: turns[seg[0]][seg[1]:seg[2]].max() for seg in plain}
    repeated = [sharpness[s] for s, c in counts.items() if c == 4]
    once = [sharpness[s] for s, c in counts.items() if c == 1]
    assert min(repeated) >= max(once) and len(repeated) == pytest.approx(0.1 * len(plain), abs=1.5)
    assert make_segments(lengths, 8, np.random.default_rng(3), turns, repeat=4) == more  # deterministic


def test_oversample_turns_trains_longer_epochs_and_needs_steering_labels(data_dir, tmp_path):
    run(resolve(tiny_args(data_dir, tmp_path / "plain", policy="mlp", epochs=1, split_seed=1)))
    run(resolve(tiny_args(data_dir, tmp_path / "turns", policy="mlp", epochs=1, split_seed=1, oversample_turns=3)))
    samples = [json.loads((tmp_path / n / "metrics.json").read_text())["train_samples"] for n in ("plain", "turns")]
    assert samples[0] < samples[1] <= 1.25 * samples[0]
    discrete = write_synthetic(tmp_path / "discrete", episodes=3, action_space="discrete")
    with pytest.raises(ValueError, match="--oversample-turns reads the steering labels"):
        run(resolve(tiny_args(discrete, tmp_path / "d", policy="mlp", epochs=1, oversample_turns=2)))


def test_a_single_episode_cannot_be_split_by_episode_or_folded(tmp_path):
    data = write_synthetic(tmp_path / "one", episodes=1, length=60)
    with pytest.raises(ValueError, match="--split blocks"):
        run(resolve(tiny_args(data, tmp_path / "a", split="episodes")))
    with pytest.raises(ValueError, match="drop --folds"):
        run(resolve(tiny_args(data, tmp_path / "b", folds=2)))


def test_irregular_training_windows_keep_true_timestamps(tmp_path):
    """--window-gaps K: each gap between a window's frames is frame_stride x k, k in 1..K, ending at its step,
    and the times the core gets are the frames' true timestamps relative to the last one."""
    from driving_data.dataset import open_dataset
    from agent.training.config import with_env_defaults
    from agent.training.data import load_data
    from agent.training.windows import gather_segments, irregular_window_indices

    torch.manual_seed(0)
    idx = irregular_window_indices(np.arange(30, 60), window=4, stride=2, max_gap=3)
    gaps = np.diff(idx, axis=1)
    assert (idx[:, -1] == np.arange(30, 60)).all() and set(np.unique(gaps)) == {2, 4, 6}
    data_dir = write_synthetic(tmp_path / "d", episodes=2, length=50)
    data = load_data(with_env_defaults(resolve(tiny_args(data_dir, tmp_path / "o", window=4, frame_stride=2))).data)
    torch.manual_seed(1)
    frames, _, index, times, _ = gather_segments(data, [(1, 20, 36)], 4, 2, None, max_gap=3)
    ts = open_dataset(data_dir).load(1, keys=["time"])["time"]
    lo = 20 - 3 * 2 * 3
    np.testing.assert_allclose(times, ts[index + lo] - ts[np.arange(20, 36)][:, None], atol=1e-6)
    np.testing.assert_array_equal(frames[index[:, -1]], np.asarray(data.frames[1][20:36]))
    run(resolve(tiny_args(data_dir, tmp_path / "run", window=4, frame_stride=2, window_gaps=3, epochs=1)))


def test_time_input_index_hides_the_clock_from_the_core():
    from policies.config import PolicyConfig
    from policies.policy import DrivingPolicy

    frames = torch.randint(0, 255, (2, 4, 32, 32, 3), dtype=torch.uint8)
    regular = -torch.arange(3, -1, -1, dtype=torch.float32).expand(2, 4) * 0.06
    late = regular * torch.tensor([3.0, 2.0, 1.5, 1.0])
    outputs = {}
    for time_input in ("seconds", "index"):
        torch.manual_seed(0)
        policy = DrivingPolicy(PolicyConfig.for_actions("continuous", encoder="carracing", feature_dim=8, core="nac",
                                                        core_options={"d_model": 16, "heads": 4, "topk": 3}, window=4,
                                                        frame_stride=3, image_size=[32, 32],
                                                        time_input=time_input)).eval()
        outputs[time_input] = [policy(frames, t) for t in (regular, late)]
    assert not torch.allclose(*outputs["seconds"]), "NAC reads the timestamps"
    torch.testing.assert_close(*outputs["index"])


def test_precision_is_recorded_and_bf16_learns_as_fp32_does(data_dir, tmp_path, capsys):
    """--precision: the run's precision (auto resolved) and why, printed in one line at the start and kept in
    args.json, metrics.json and every checkpoint; bf16 lands near fp32."""
    from policies.precision import choose as choose_precision

    best = {}
    for precision in ("fp32", "bf16", "auto"):
        out = tmp_path / precision
        capsys.readouterr()
        run(resolve(tiny_args(data_dir, out, policy="mlp", epochs=3, precision=precision)))
        choice = choose_precision(precision, "cpu")
        assert capsys.readouterr().out.startswith(choice.line() + "\n")
        assert json.loads((out / "args.json").read_text())["precision_resolved"] == choice.record()
        metrics = json.loads((out / "metrics.json").read_text())
        resolved = choice.precision
        assert metrics["precision"] == resolved and metrics["args"]["precision"] == precision
        assert metrics["precision_reason"] == choice.reason
        assert choice.reason.startswith("auto: " if precision == "auto" else "asked for: --precision ")
        assert read_checkpoint(out / "best.pt")["metadata"]["precision"] == resolved
        best[precision] = metrics["best"]["val_loss"]
    assert abs(best["bf16"] - best["fp32"]) < 0.15 * best["fp32"], best


def test_a_bad_precision_is_one_line(data_dir, tmp_path, capsys):
    import train

    with pytest.raises(SystemExit) as e:
        train.main(["--data", str(data_dir), "--out", str(tmp_path / "o"), "--precision", "fp16"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "--precision: invalid choice: 'fp16'" in err[0], err
    with pytest.raises(ValueError, match=r"^--precision must be one of auto, fp32, bf16, got 'half'$"):
        run(resolve(tiny_args(data_dir, tmp_path / "o", precision="half")))
    assert not (tmp_path / "o").exists()


def test_resume_refuses_options_that_contradict_the_run(data_dir, tmp_path, capsys):
    """--resume continues the run as it started: another --data or --epochs is refused in one line, not ignored."""
    out = tmp_path / "run"
    run(resolve(tiny_args(data_dir, out, policy="mlp", epochs=1)))
    other = write_synthetic(tmp_path / "other", episodes=3)
    code, err = main_in_process(capsys, "--resume", "--out", str(out), "--data", str(other), "--epochs", "3")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert (f"this command contradicts: --data {other} (the run's: {data_dir}); --epochs 3 (the run's: 1); drop them"
            in err), err
    # the run's own values, or none, are no contradiction
    code, err = main_in_process(capsys, "--resume", "--out", str(out), "--data", str(data_dir), "--epochs", "1",
                                "--threads", "1")
    assert code == 0, err


def test_a_full_disk_ends_training_in_one_line_and_resume_continues_from_the_last_saved_epoch(data_dir, tmp_path,
                                                                                                  monkeypatch, capsys):
    from tests.helpers import full_disk

    reference = tmp_path / "ref"
    run(resolve(tiny_args(data_dir, reference, policy="gru", epochs=3)))
    out = tmp_path / "cut"
    argv = ["--data", str(data_dir), "--out", str(out), "--core", "gru", "--window", "3", "--frame-stride", "2",
            "--epochs", "3", "--batch-size", "32", "--segment", "8", "--lr", "5e-3", "--feature-dim", "16",
            "--d-model", "16", "--heads", "4", "--hidden", "16", "--threads", "1", "--log-every", "2", "--no-progress"]
    with monkeypatch.context() as m:
        full_disk(m, ".last.pt.", after=1)  # epoch 1's checkpoints are written, epoch 2's are not
        code, err = main_in_process(capsys, *argv)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith(f"error: no space left on the disk while writing {str(out / 'last.pt')!r}; free some space "
                          f"and run the command again (epoch 2 finished but is not saved; python train.py --resume "
                          f"--out {out} continues from the last.pt saved before it)"), err
    assert read_checkpoint(out / "last.pt")["train_state"]["epoch"] == 1
    assert read_checkpoint(out / "best.pt")["metadata"]["epoch"] == 1, "best.pt and last.pt written together"
    assert not list(out.glob(".*.tmp")), "no temp file left"
    code, err = main_in_process(capsys, "--resume", "--out", str(out))
    assert code == 0, err
    resumed, ref = torch.load(out / "last.pt", weights_only=True), torch.load(reference / "last.pt", weights_only=True)
    assert resumed["train_state"]["epoch"] == 3
    for k, v in ref["state_dict"].items():
        torch.testing.assert_close(resumed["state_dict"][k], v, atol=1e-5, rtol=1e-4)


def test_a_checkpoint_records_its_frames_and_is_fine_tuned_on_those_only(data_dir, tmp_path):
    run(resolve(tiny_args(data_dir, tmp_path / "first", policy="mlp", epochs=1)))
    assert load_checkpoint(tmp_path / "first" / "best.pt").config.frame_shape == [SIZE, SIZE, 3]
    smaller = write_synthetic(tmp_path / "small", episodes=3, size=24)
    with pytest.raises(ValueError, match=f"was trained on {SIZE}x{SIZE}x3 frames; this dataset's frames are 24x24x3"):
        run(resolve(tiny_args(smaller, tmp_path / "tuned", epochs=1, init=str(tmp_path / "first" / "best.pt"))))
