"""python -m benchmarks.road_middle on a recorded drive of the udacity env and of its real look."""
from __future__ import annotations

import collect as collect_cli
from driving_data.dataset import open_dataset
from envs.replay.spec import geometry_of
from tests.helpers import DRIVE_STEPS


def test_the_road_middle_benchmark_reports_a_drive_and_refuses_a_missing_folder(udacity_drive, tmp_path, capsys):
    """`python -m benchmarks.road_middle`: coverage and side-camera agreement on a recorded drive, one-line error
    for a folder that is not there."""
    from benchmarks import road_middle

    assert road_middle.main([str(udacity_drive)]) == 0
    out = capsys.readouterr().out
    assert "center frames, measured on" in out and "left camera" in out
    assert road_middle.main([str(udacity_drive.parent / "missing")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "does not exist" in err and "\n" not in err
    # this project's simulator in the real look knows its cross-track error: the middle measured against it
    real_look = tmp_path / "real_look"
    assert collect_cli.main(["--env", "udacity-real", "--episodes", "1", "--max-steps", str(DRIVE_STEPS), "--noise",
                             "0.3", "--seed", "3000001", "--workers", "1", "--out", str(real_look),
                             "--no-progress"]) == 0
    assert road_middle.main([str(real_look), "--against-truth"]) == 0
    assert "against the simulator's cross-track error" in capsys.readouterr().out
    ds = open_dataset(real_look)
    (theme, found), = road_middle.against_truth(ds, geometry_of(ds)).items()
    assert found["frames"] == -(-DRIVE_STEPS // 10) and found["coverage"] > 0.5 and found["median_abs_err"] < 0.4
