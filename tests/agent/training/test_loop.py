"""One training run (agent/training/loop.py) driven directly, on a tiny synthetic dataset: the Trainer's epochs,
its checkpoints, a diverged loss, resuming from last.pt (and the format last.pt keeps), --blend-init and
--stay-near-init and --freeze-encoder."""
import math
import re
from pathlib import Path

import pytest
import torch

import agent.training.loop as loop
from agent.training.config import resolve, with_env_defaults
from agent.training.data import load_data, resolve_head
from agent.training.distributed import SINGLE
from agent.training.loop import Trainer, TrainState
from agent.training.starting_policy import init_anchor
from agent.training.windows import make_splits
from policies.checkpoint import load_checkpoint, read_checkpoint
from tests.agent.training.test_experiment import tiny_args, write_synthetic

# what last.pt's train_state has always held: older checkpoints hold these keys, newer ones must too
SAVED_KEYS = {"epoch", "batch", "global_step", "best_val_loss", "best_epoch", "history", "initial_val", "train_time",
              "train_samples", "epoch_loss_sum", "epoch_samples", "done", "optimizer", "scheduler", "rng"}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return write_synthetic(tmp_path_factory.mktemp("loop"), episodes=4, length=32)


def trainer(data_dir: Path, out: Path, resume: bool = False, **kw) -> Trainer:
    """A Trainer as train_run makes it (mlp core, 32x32 frames, one thread) on ``out``; ``resume``: from last.pt."""
    base = dict(policy="mlp", epochs=2, val_fraction=0.25, progress=False, image_size="32x32")
    plan = with_env_defaults(resolve(tiny_args(data_dir, out, **{**base, **kw})))
    data = load_data(plan.data)
    head = resolve_head(plan, data)
    data, splits = make_splits(plan.split, plan.windows, data)
    resumed = read_checkpoint(out / "last.pt") if resume else None
    return Trainer(plan, plan.specs[0], data, splits[0], out, "test", SINGLE, torch.device("cpu"), head, resumed)


def scalars(run_dir: Path, tag: str) -> list[float]:
    """The values of one TensorBoard scalar the run in ``run_dir`` wrote, read back from its event file."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return [e.value for e in acc.Scalars(tag)] if tag in acc.Tags()["scalars"] else []


def scripted_validation(monkeypatch, losses: list[float]) -> None:
    """Trainer.validate answers its real scores with ``losses`` as val_loss, one per call in turn."""
    real, calls = Trainer.validate, iter(losses)

    def validate(self):
        return {**real(self), "val_loss": next(calls)}

    monkeypatch.setattr(Trainer, "validate", validate)


def test_one_epoch_lowers_the_validation_loss_and_counts_its_windows(data_dir, tmp_path):
    t = trainer(data_dir, tmp_path / "run", epochs=1)
    t.state.initial_val = t.validate()
    t.train_epoch()
    windows = sum(t.lengths.values())
    assert t.state.batch > 0 and t.state.epoch_samples == t.state.train_samples == t.state.global_step == windows
    t.end_epoch()
    s = t.state
    assert (s.epoch, s.batch, s.epoch_samples, s.best_epoch) == (1, 0, 0, 1)
    assert s.history[0]["val_loss"] == s.best_val_loss < s.initial_val["val_loss"]
    assert s.history[0]["train_loss"] > 0


def test_best_pt_is_the_epoch_with_the_lowest_validation_loss(data_dir, tmp_path, monkeypatch):
    scripted_validation(monkeypatch, [5.0, 3.0, 1.0, 2.0])  # untrained, then epochs 1-3: epoch 2 is the best
    out = tmp_path / "run"
    metrics = trainer(data_dir, out, epochs=3).fit()
    assert metrics["best_epoch"] == 2 and metrics["best"]["val_loss"] == 1.0 and metrics["last"]["epoch"] == 3
    assert metrics["initial"]["val_loss"] == 5.0
    best, last = read_checkpoint(out / "best.pt"), read_checkpoint(out / "last.pt")
    assert best["metadata"]["epoch"] == 2 and best["metadata"]["val"]["val_loss"] == 1.0
    assert last["train_state"]["epoch"] == 3 and last["train_state"]["done"]
    assert last["train_state"]["best_epoch"] == 2
    moved = [k for k, v in best["state_dict"].items() if not torch.equal(v, last["state_dict"][k])]
    assert moved, "best.pt keeps epoch 2's weights, not the last epoch's"


def test_a_nan_loss_stops_the_run_and_keeps_the_last_good_epoch(data_dir, tmp_path, monkeypatch):
    out = tmp_path / "run"
    t = trainer(data_dir, out, epochs=3)
    real_loss = loop.loss_fn
    monkeypatch.setattr(loop, "loss_fn", lambda *a, **k: real_loss(*a, **k) * (math.nan if t.state.epoch else 1.0))
    with pytest.raises(ValueError, match=r"the training loss became nan \(gradient norm nan\) at epoch 2, step 1.*"
                                         r"\(last.pt keeps epoch 1, best.pt epoch 1\)"):
        t.fit()
    last = read_checkpoint(out / "last.pt")
    assert last["train_state"]["epoch"] == 1 and not last["train_state"]["done"]
    assert read_checkpoint(out / "best.pt")["metadata"]["epoch"] == 1
    assert all(torch.isfinite(v).all() for v in last["state_dict"].values() if v.is_floating_point())
    assert not (out / "metrics.json").exists()


def test_last_pt_keeps_the_state_in_its_saved_format_and_a_resume_continues_from_it(data_dir, tmp_path):
    out = tmp_path / "run"
    first = trainer(data_dir, out)
    first.state.initial_val = first.validate()
    first.train_epoch()
    first.end_epoch()  # epoch 1 of 2: last.pt saved, not done
    saved = read_checkpoint(out / "last.pt")["train_state"]
    assert set(saved) == SAVED_KEYS and not saved["done"]
    assert {k: saved[k] for k in SAVED_KEYS - {"done", "optimizer", "scheduler", "rng"}} == first.state.saved()
    expected_draw = torch.rand(3)  # the RNG as last.pt saved it, drawn from
    resumed = trainer(data_dir, out, resume=True)
    assert resumed.resumed and resumed.state == first.state
    torch.testing.assert_close(torch.rand(3), expected_draw)  # the run's random stream goes on where it stopped
    assert resumed.scheduler.last_epoch == first.scheduler.last_epoch > 0
    assert resumed.optimizer.state_dict()["state"].keys() == first.optimizer.state_dict()["state"].keys()
    for k, v in first.policy.state_dict().items():
        torch.testing.assert_close(resumed.policy.state_dict()[k], v)
    metrics = resumed.fit()  # the run's second epoch, and no new untrained score
    assert [h["epoch"] for h in metrics["history"]] == [1, 2] and metrics["initial"] == first.state.initial_val
    assert read_checkpoint(out / "last.pt")["train_state"]["done"]


def test_a_train_state_of_an_older_last_pt_restores_with_defaults_for_what_it_lacks():
    old = {"epoch": 2, "batch": 5, "global_step": 900, "best_val_loss": 0.25, "best_epoch": 2,
           "history": [{"epoch": 1, "val_loss": 0.5}, {"epoch": 2, "val_loss": 0.25}], "initial_val": {"val_loss": 1.0},
           "train_time": 3.5, "train_samples": 900, "done": False, "optimizer": {}, "scheduler": {}, "rng": {}}
    state = TrainState.from_saved(old)  # no epoch_loss_sum / epoch_samples: the running epoch's sums start at 0
    assert (state.epoch, state.batch, state.global_step, state.best_val_loss) == (2, 5, 900, 0.25)
    assert state.history == old["history"] and state.initial_val == {"val_loss": 1.0}
    assert (state.epoch_loss_sum, state.epoch_samples) == (0.0, 0)
    assert set(state.saved()) == SAVED_KEYS - {"done", "optimizer", "scheduler", "rng"}
    fresh = TrainState()
    assert (fresh.epoch, fresh.best_epoch, fresh.best_val_loss, fresh.history) == (0, -1, math.inf, [])


def test_blend_with_init_writes_the_weight_mix_of_init_and_the_best_student(data_dir, tmp_path):
    start = trainer(data_dir, tmp_path / "start", epochs=1)
    start.fit()
    init = tmp_path / "start" / "best.pt"
    out = tmp_path / "tuned"
    t = trainer(data_dir, out, epochs=1, init=str(init), blend_init=0.25)
    metrics = t.fit()  # fit blends at the end
    tuned = load_checkpoint(out / "best_tuned.pt").state_dict()
    first, blend = load_checkpoint(init).state_dict(), load_checkpoint(out / "best.pt").state_dict()
    assert any(not torch.equal(first[k], tuned[k]) for k in first), "the fine-tune moved the weights"
    for k in first:
        torch.testing.assert_close(blend[k], 0.75 * first[k] + 0.25 * tuned[k])
    assert metrics["blend"]["share"] == 0.25 and metrics["blend"]["tuned"] == str(out / "best_tuned.pt")
    assert metrics["blend"]["val_loss"] == pytest.approx(t.validate()["val_loss"])  # scored as the blend
    t.blend_with_init()  # a rerun blends from the kept fine-tune again, never from the blend
    again = load_checkpoint(out / "best.pt").state_dict()
    for k in first:
        torch.testing.assert_close(again[k], blend[k])


def test_stay_near_init_pulls_the_fine_tune_toward_its_start_and_logs_the_distance(data_dir, tmp_path):
    start = trainer(data_dir, tmp_path / "start", epochs=1)
    start.fit()
    init = str(tmp_path / "start" / "best.pt")
    distances = {}
    for weight in (0.0, 10.0):
        t = trainer(data_dir, tmp_path / f"tuned_{weight:g}", epochs=1, init=init, stay_near_init=weight, lr=5e-2)
        assert (len(t.anchor) == len(list(t.policy.parameters()))) == (weight > 0)  # every weight pulled, or none
        t.fit()
        t.anchor = init_anchor(init, t.policy)
        distances[weight] = t.distance_from_init().item()
    assert 0 < distances[10.0] < 0.5 * distances[0.0]
    logged = scalars(tmp_path / "tuned_10", "charts/distance_from_init")
    assert logged and all(v >= 0 for v in logged) and logged[-1] > 0


@pytest.mark.parametrize("flags, needle", [(dict(stay_near_init=1.0), "needs --init and a finite weight >= 0, got "
                                            "1.0 without --init"), (dict(stay_near_init=-1.0, init="x.pt"), ">= 0"),
                                           (dict(stay_near_init=float("nan"), init="x.pt"), "got nan")])
def test_stay_near_init_refuses_a_weight_without_init_or_out_of_range_in_one_line(data_dir, tmp_path, flags, needle):
    with pytest.raises(ValueError, match=r"^--stay-near-init .*" + re.escape(needle)):
        resolve(tiny_args(data_dir, tmp_path / "no", **flags))


def test_freeze_encoder_trains_the_core_and_head_and_keeps_the_start_s_encoder_exactly(data_dir, tmp_path):
    start = trainer(data_dir, tmp_path / "start", epochs=1)
    start.fit()
    init = tmp_path / "start" / "best.pt"
    t = trainer(data_dir, tmp_path / "frozen", epochs=1, init=str(init), freeze_encoder=True, lr=5e-2)
    t.fit()
    before, after = load_checkpoint(init).state_dict(), load_checkpoint(tmp_path / "frozen" / "best.pt").state_dict()
    encoder = [k for k in before if k.startswith("encoder.")]
    assert encoder and all(torch.equal(before[k], after[k]) for k in encoder)
    assert any(not torch.equal(before[k], after[k]) for k in before if not k.startswith("encoder."))


def test_freeze_encoder_without_init_is_one_line(data_dir, tmp_path):
    with pytest.raises(ValueError, match=r"^--freeze-encoder keeps the --init checkpoint's encoder: it needs --init$"):
        resolve(tiny_args(data_dir, tmp_path / "no", freeze_encoder=True))
