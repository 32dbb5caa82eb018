"""python -m envs.replay.calibrate on a recorded drive of this project's simulator."""

from __future__ import annotations


def test_calibration_recovers_the_simulators_side_cameras_and_forward_scale(udacity_drive, capsys):
    """python -m envs.replay.calibrate on a drive of this project's simulator finds its 1.0 m side cameras and a
    forward scale of 1 (the frames move as speed x dt says)."""
    from envs.replay import calibrate

    assert calibrate.main([str(udacity_drive), "--frames", "8", "--pairs", "12"]) == 0
    text = capsys.readouterr().out
    assert text.count("at 1.00 m") == 2 and "forward scale median 1.00" in text
    assert calibrate.main(["does/not/exist"]) == 2
