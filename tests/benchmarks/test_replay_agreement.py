"""The replay-agreement benchmark re-runs a stopped step instead of taking its partial output as finished."""
import json

from benchmarks import replay_agreement


def _record(monkeypatch):
    calls = []
    monkeypatch.setattr(replay_agreement.subprocess, "run", lambda cmd, check: calls.append(cmd))
    return calls


def test_a_stopped_collection_is_started_over(tmp_path, monkeypatch):
    calls = _record(monkeypatch)
    out = tmp_path / "drives"
    out.mkdir()
    (out / "dataset.json").write_text(json.dumps({"episodes": [{}]}))  # 1 of 4 episodes finished
    replay_agreement.collect(["collect.py", "--episodes", "4"], out, 4)
    assert calls == [["collect.py", "--episodes", "4", "--out", str(out)]] and not out.exists()


def test_a_finished_collection_is_reused(tmp_path, monkeypatch):
    calls = _record(monkeypatch)
    out = tmp_path / "drives"
    out.mkdir()
    (out / "dataset.json").write_text(json.dumps({"episodes": [{}] * 4}))
    replay_agreement.collect(["collect.py"], out, 4)
    assert calls == []


def test_a_stopped_training_resumes_and_a_finished_one_is_reused(tmp_path, monkeypatch):
    calls = _record(monkeypatch)
    run = tmp_path / "student"
    run.mkdir()
    (run / "best.pt").write_bytes(b"")  # a stopped run leaves best.pt and last.pt, no metrics.json
    (run / "last.pt").write_bytes(b"")
    assert replay_agreement.train(["train.py"], run) == run / "best.pt"
    assert calls == [["train.py", "--out", str(run), "--resume"]]
    (run / "metrics.json").write_text("{}")
    replay_agreement.train(["train.py"], run)
    assert len(calls) == 1
