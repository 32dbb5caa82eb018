"""python -m benchmarks.label_drift on a recorded drive of the udacity env."""
from __future__ import annotations

import numpy as np
import pytest

from agent.evaluation.args import EvalArgs
from agent.evaluation.config import resolve
from agent.evaluation.evaluate import evaluate
from driving_data.dataset import open_dataset
from tests.helpers import DRIVE_STEPS



def _evaluate(**args):
    """evaluate.py's library path: the arguments resolved into their plan, then run."""
    return evaluate(resolve(EvalArgs(**args)))

def test_the_label_drift_benchmark_drives_the_labels_open_loop(udacity_drive, tmp_path, capsys):
    """`python -m benchmarks.label_drift`: the recorded steering never leaves its own line, always-straight is
    charged what the replay charges it, a label played late differs from the label; bad input is one line."""
    from benchmarks import label_drift

    counts, seconds = label_drift.drift_table(open_dataset(udacity_drive), (0.0, 1.0), [3])
    assert seconds == pytest.approx(DRIVE_STEPS * 0.1, rel=0.02)
    assert counts[("driver", "recorded steering")] == counts[("driver-or-middle", "recorded steering")] == 0
    replayed = _evaluate(replay=str(udacity_drive), expert_drives=True, out=str(tmp_path / "e"), workers=1,
                         video_episodes=0, progress=False, tensorboard=False)["expert"]
    assert counts[("driver", "always straight")] == replayed["straight_interventions"] >= 1
    late = label_drift.label_drivers(np.arange(5.0), np.arange(5) * 0.1, [2])["the label 2 rows late"]
    assert late.tolist() == pytest.approx([1.0, 1.0, 1.0, 1.5, 2.0])  # the 0.5 s label of 0..4 at 10 Hz, 2 rows late
    assert label_drift.main([str(udacity_drive), "--span", "0:1", "--shift-steps", "2"]) == 0
    assert "| the label 2 rows early |" in capsys.readouterr().out
    assert label_drift.main([str(udacity_drive), "--shift-steps", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "--shift-steps" in err and "\n" not in err
