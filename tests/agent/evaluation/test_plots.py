"""agent/evaluation/plots.py: the recorded path integrated from steering and speed, the replay's per-step table, and
the path's PNG (its pixel size read from the file's header). (The steering plot's PNG:
tests/agent/udacity/test_recordings.py.)"""
import struct
from types import SimpleNamespace

import numpy as np
import pytest

from agent.evaluation.plots import REPLAY_TABLE_COLUMNS, plot_replay_path, recorded_path, write_replay_table


def _png_size(path):
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", "a PNG file"
    return struct.unpack(">II", head[16:24])  # IHDR: width, height


def test_a_straight_recording_drives_straight_ahead():
    x, y, heading = recorded_path(np.zeros(4), np.full(4, 2.0), np.full(4, 0.5), wheelbase=2.5, max_steer_deg=25)
    np.testing.assert_allclose(x, [0, 1, 2, 3])
    assert np.all(y == 0) and np.all(heading == 0)


def test_steering_right_turns_clockwise_by_the_bicycle_models_curvature():
    steer, ds = 0.5, 0.1
    x, y, heading = recorded_path(np.full(50, steer), np.full(50, 1.0), np.full(50, ds), wheelbase=2.0,
                                  max_steer_deg=30)
    k = np.tan(steer * np.radians(30)) / 2.0
    np.testing.assert_allclose(heading, -k * ds * np.arange(50), atol=1e-12)
    assert np.all(y[2:] < 0), "to the right is -y"
    radius = np.hypot(x[-1], y[-1] + 1 / k)  # the path stays on the circle about (0, -1/k)
    assert radius == pytest.approx(1 / k, rel=1e-2)  # forward Euler drifts outwards a little
    _, y_full, _ = recorded_path(np.full(50, 3.0), np.full(50, -1.0), np.full(50, ds), 2.0, 30)
    assert np.all(y_full == 0), "reversing is not driven (speed clipped at 0); steering clipped to [-1, 1]"


def test_the_replay_table_has_one_line_per_step_with_its_recording_row_and_interventions(tmp_path):
    trace = {"episode": 2, "start": 10, "interventions": [1],
             "trace": [[0.0, 0.1, 0.01, -0.2, 5.0, -0.1], [0.05, 0.25, 0.02, -0.2, 5.5, -0.3]]}
    path = write_replay_table(trace, tmp_path / "replay.csv")
    lines = path.read_text().splitlines()
    assert lines[0] == ",".join(REPLAY_TABLE_COLUMNS)
    assert lines[1] == "2,10,0.000,0.1000,0.01000,-0.2000,-0.1000,5.000,0"
    assert lines[2] == "2,11,0.050,0.2500,0.02000,-0.2000,-0.3000,5.500,1"


def test_the_replay_path_plot_draws_the_driven_path_and_nothing_for_an_empty_trace(tmp_path):
    geometry = SimpleNamespace(distance_scale=1.0, wheelbase_m=2.5, max_steer_deg=25)
    empty = {"trace": np.zeros((0, 6)), "interventions": [], "dt": []}
    assert plot_replay_path(empty, tmp_path / "none.png", "empty", geometry) == tmp_path / "none.png"
    assert not (tmp_path / "none.png").exists()
    rows = [[0.1 * k, 0.05 * k, 0.0, 0.2, 5.0, 0.2] for k in range(10)]
    trace = {"trace": rows, "interventions": [4, 99], "dt": [0.1] * 12}  # an index past the rows is ignored
    path = plot_replay_path(trace, tmp_path / "path.png", "replay", geometry)
    assert _png_size(path) == (990, 405)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["path.png"], "written atomically, no temp file left"
