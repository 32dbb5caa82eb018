"""The held-out drivers' table: every checkpoint on every recording, a {name} checkpoint per recording, reuse."""
import json

import pytest

from driving_data.udacity_import import import_udacity
from benchmarks import heldout_drivers
from tests.driving_data.test_udacity_import import _sim_recording
from tests.helpers import steering_checkpoint


def test_a_table_of_every_checkpoint_on_every_recording(tmp_path, capsys):
    for name in ("a", "b"):
        _sim_recording(tmp_path / "raw" / name, offsets_s=tuple(0.1 * k for k in range(10)))
        import_udacity(tmp_path / "raw" / name, tmp_path / "held" / name)
        steering_checkpoint(tmp_path / "own" / name / "best.pt", 0.0)
    steering_checkpoint(tmp_path / "right.pt", 0.3)
    args = ["--recordings", str(tmp_path / "held" / "a"), str(tmp_path / "held" / "b"), "--checkpoint",
            str(tmp_path / "right.pt"), str(tmp_path / "own" / "{name}" / "best.pt"), "--name", "right", "own",
            "--no-replay", "--out", str(tmp_path / "out")]
    assert heldout_drivers.main(args) == 0
    rows = json.loads((tmp_path / "out" / "table.json").read_text())["rows"]
    assert set(rows) == {"a", "b"} and rows["a"]["own"]["offline_vs_straight"] == pytest.approx(1.0), \
        "a student that answers 0 is always-straight"
    assert rows["a"]["right"]["offline_vs_straight"] > 1.0
    assert "| a | 10 |" in capsys.readouterr().out
    done = tmp_path / "out" / "a" / "right" / "offline" / "offline.json"
    stamp = done.stat().st_mtime_ns
    assert heldout_drivers.main(args) == 0
    assert done.stat().st_mtime_ns == stamp, "reused"
    done.write_text(json.dumps({**json.loads(done.read_text()), "interrupted": True, "pooled": {}}))
    assert heldout_drivers.main(args) == 0, "an interrupted run's partial result is run again, not read"
    assert not json.loads(done.read_text()).get("interrupted")


def test_mistakes_are_one_line(tmp_path, capsys):
    assert heldout_drivers.main(["--recordings", str(tmp_path), "--checkpoint", "x.pt", "--no-replay"]) == 2
    assert "not dataset folders" in capsys.readouterr().err
