"""The replay-agreement benchmark re-runs a stopped step instead of taking its partial output as finished."""
from benchmarks import replay_agreement
from benchmarks.data_loading import make_dataset


def _record(monkeypatch):
    calls = []
    monkeypatch.setattr(replay_agreement.subprocess, "run", lambda cmd, check: calls.append(cmd))
    return calls


def test_a_stopped_collection_is_started_over(tmp_path, monkeypatch):
    calls = _record(monkeypatch)
    out = make_dataset(tmp_path / "drives", frames=10, episode=10)  # 1 of 4 episodes finished
    replay_agreement.collect(["collect.py", "--episodes", "4"], out, 4)
    assert calls == [["collect.py", "--episodes", "4", "--out", str(out)]] and not out.exists()
    assert replay_agreement.episodes_held(out) == 0


def test_a_finished_collection_is_reused(tmp_path, monkeypatch):
    calls = _record(monkeypatch)
    out = make_dataset(tmp_path / "drives", frames=40, episode=10)
    replay_agreement.collect(["collect.py"], out, 4)
    assert calls == []


def _run_folder(run, done: bool):
    """What train.py leaves in ``run``: args.json, a last.pt whose training state says whether it ran every epoch,
    and metrics.json once it did."""
    import torch

    from policies.checkpoint import CHECKPOINT_FORMAT, CHECKPOINT_VERSION

    run.mkdir(exist_ok=True)
    (run / "args.json").write_text("{}")
    torch.save({"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION, "config": {}, "state_dict": {},
                "train_state": {"done": done}}, run / "last.pt")
    if done:
        (run / "metrics.json").write_text("{}")


def test_a_stopped_training_resumes_and_a_finished_one_is_reused(tmp_path, monkeypatch):
    calls = _record(monkeypatch)
    run = tmp_path / "student"
    _run_folder(run, done=False)
    assert replay_agreement.train(["train.py"], run) == run / "best.pt"
    assert calls == [["train.py", "--out", str(run), "--resume"]]
    _run_folder(run, done=True)
    replay_agreement.train(["train.py"], run)
    assert len(calls) == 1
