"""The precision benchmark end to end on tiny settings (a recording as the simulator writes it, a small CarRacing
dataset): every stage in the table and the JSON, both precisions where the precision reaches; mistakes in one line."""
import json
import math

import pytest

from benchmarks import precision
from tests.agent.training.test_experiment import write_synthetic
from tests.agent.udacity.test_recordings import _sim_recording

TINY = ["--epochs", "2", "--repeats", "1", "--frames", "4", "--episodes", "1", "--max-steps", "10",
        "--threads", "1", "--no-progress"]


def _steady(lines):
    """Steering within [-1, 1] and a speed the simulator reaches, on every row of a longer recording."""
    rows = [line.split(", ") for line in lines[1:]]
    return lines[:1] + [", ".join(r[:3] + [f"{0.3 * math.sin(k / 5):.3f}", "0.9", "0", "20.5"])
                        for k, r in enumerate(rows)]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("precision")
    _sim_recording(root / "rec", offsets_s=tuple(round(0.1 * k, 1) for k in range(60)), header=True, rows=_steady)
    return root / "rec", write_synthetic(root / "carracing", episodes=3, length=40, size=96)


def test_one_run_measures_every_stage_under_both_precisions(inputs, tmp_path, capsys):
    rec, carracing = inputs
    out = tmp_path / "out"
    assert precision.main(["--data", str(rec), "--carracing", str(carracing), "--out", str(out), *TINY,
                           "--against", "bf16"]) == 0  # bf16 forced: another arithmetic than fp32 on any CPU
    report = json.loads((out / "precision.json").read_text())
    rows = {r["what"].split(":")[0].split(" (")[0]: r for r in report["rows"]}
    both = [r for r in report["rows"] if r["default"] is not None]
    once = [r for r in report["rows"] if r["default"] is None]
    assert [r["what"][:28] for r in once] == ["collect.py: the CarRacing ex", "evaluate.py: CarRacing, ship",
                                               "evaluate.py --replay: udacit"]
    assert len(both) == 7 and all(r["fp32"] > 0 and r["default"] > 0 and r["target"] for r in both)
    assert all(r["fp32"] > 0 and r["note"].startswith("the precision does not reach it") for r in once)
    trained = [r for r in both if r["unit"] == "samples/s"]
    assert [r["what"] for r in trained] == ["train.py on rec: training samples/s (median of 2 epochs)",
                                            "train.py on CarRacing: training samples/s (median of 2 epochs)"]
    for r in trained:
        assert all(len(r["measured"]["samples_per_s"][p]) == 2 for p in ("fp32", "default"))
        assert math.isclose(r["change"], r["default"] / r["fp32"]) and r["met"] == (r["change"] >= 1.8)
    losses = [r for r in both if r["what"].startswith("train.py") and r["unit"] == "mse"]
    assert len(losses) == 2
    assert report["machine"]["auto_reason"].startswith("auto: ")
    assert report["machine"]["measured_against_fp32"] == "bf16"
    assert all(r["measured"]["val_loss"]["fp32"] != r["measured"]["val_loss"]["default"] for r in losses)
    assert "policy step, carracing_nac, CarRacing frames" in rows and "evaluate.py --data" in rows
    md = (out / "precision.md").read_text()
    assert md.count("\n| ") == len(report["rows"]) + 1  # the header and one line per row
    assert "| train.py on rec: best validation loss after 2 epochs | mse |" in md and "| bf16 vs fp32 |" in md
    assert "fp32 against bf16, forced (--precision auto = " in md
    assert md.strip() in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--data", "{tmp}/nowhere"], "--data {tmp}/nowhere: not a simulator recording"),
    (["--data", "{tmp}"], "--data {tmp}: not a simulator recording"),
    (["--data", "{rec}", "--carracing", "{tmp}"], "dataset folder '{tmp}' holds no episodes"),
    (["--data", "{rec}", "--epochs", "0"], "--epochs, --repeats, --frames"),
    (["--data", "{rec}", "--span", "0.5:0.2"], "--span A:B needs 0 <= A < B <= 1"),
])
def test_bad_input_is_one_line(inputs, tmp_path, capsys, argv, message):
    rec, _ = inputs
    argv = [a.format(tmp=tmp_path, rec=rec) for a in argv]
    assert precision.main([*argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: " + message.format(tmp=tmp_path)) and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_without_data_the_usage_says_so(capsys):
    with pytest.raises(SystemExit) as e:
        precision.main([])
    assert e.value.code == 2 and "--data" in capsys.readouterr().err.splitlines()[-1]
