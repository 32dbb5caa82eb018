"""The replay simulator (envs/replay): view synthesis recovers known geometry, the vehicle model, and evaluate.py
--replay end to end on a recorded drive of the udacity env (the recorded steering scores 100 %, always-straight
leaves a curved road, a student drives, bad input gets one line)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

import collect as collect_cli
from driving_data.dataset import open_dataset
import evaluate as evaluate_cli
from driving_data.dataset import open_dataset
from agent.evaluation.args import EvalArgs
from agent.evaluation.config import resolve
from agent.evaluation.evaluate import evaluate
from envs.registry import get_spec
from envs.replay.camera import Reprojector
from envs.replay.spec import SIM_V0, geometry_of, parse_span
from envs.replay.vehicle import PathController, PathPose, PathVehicle, count_interventions
from envs.udacity.camera import Renderer
from envs.udacity.track import generate_track

STEPS = 120


def _moved(pose, offset, yaw):
    """The car pose `offset` m to the right and turned `yaw` rad to the right of `pose` (x, y, yaw CCW)."""
    x, y, h = pose
    return x + offset * math.sin(h), y - offset * math.cos(h), h - yaw


def _error(a, b, rows):
    return float(np.mean(np.abs(a[rows].astype(np.float64) - b[rows].astype(np.float64))))


@pytest.fixture(scope="module")
def scene():
    track = generate_track(7, "lake")
    return track, Renderer(track, "lake", 7), Reprojector(SIM_V0)


@pytest.mark.parametrize("offset,yaw", [(0.6, 0.0), (-0.8, 0.0), (0.0, 0.08), (0.5, -0.06)])
def test_reprojection_recovers_a_known_pose_from_rendered_frames(scene, offset, yaw):
    """Frames drawn at a known pose off the path: the reprojection of the on-path frame matches them far better than
    the unwarped frame, and a search over poses finds the true one (the mirrored pose is worse than none)."""
    track, renderer, rp = scene
    pose = track.pose_at(150.0)
    recorded, truth = renderer.render(pose), renderer.render(_moved(pose, offset, yaw))
    ground = slice(rp.horizon + 2, 160)
    warped = _error(rp.warp(recorded, offset, yaw), truth, ground)
    assert warped < 0.35 * _error(recorded, truth, ground)
    assert _error(rp.warp(recorded, -offset, -yaw), truth, ground) > _error(recorded, truth, ground)
    offsets, yaws = np.round(np.arange(-1.0, 1.01, 0.1), 2), np.round(np.arange(-0.1, 0.101, 0.02), 2)
    errors = {(o, y): _error(rp.warp(recorded, o, y), truth, ground) for o in offsets for y in yaws}
    best = min(errors, key=errors.get)
    assert abs(best[0] - offset) <= 0.1 + 1e-9 and abs(best[1] - yaw) <= 0.02 + 1e-9


def test_hood_rows_are_kept_and_never_sampled():
    rp = Reprojector(SIM_V0.__class__(**{**SIM_V0.to_dict(), "hood_row": 140}))
    frame = np.zeros((160, 320, 3), np.uint8)
    frame[140:] = 200  # the hood
    out = rp.warp(frame, 0.9, 0.1)
    assert (out[140:] == 200).all() and (out[:140] == 0).all()


def test_vehicle_stays_on_the_path_with_the_recorded_steering_and_drifts_with_another():
    v = PathVehicle(2.5, 25.0, steer_tau_s=0.08)
    pose = PathPose()
    for _ in range(50):
        pose = v.step(pose, 0.3, 0.3, 10.0, 0.1)
    assert pose.offset == 0.0 and pose.yaw == 0.0
    pose = PathVehicle(2.5, 25.0).step(PathPose(), 0.2, 0.0, 10.0, 0.1)  # no lag: yaw grows by v dt tan(0.2 * 25 deg) / L
    assert pose.yaw == pytest.approx(1.0 * math.tan(math.radians(5.0)) / 2.5)
    assert pose.offset == pytest.approx(1.0 * math.sin(pose.yaw / 2))
    assert count_interventions(v, np.zeros(100), np.full(100, 0.3), np.full(100, 10.0), np.full(100, 0.1), 1.0, 0.5) > 0


def test_path_controller_steers_as_recorded_on_the_path_and_back_towards_it_off_it():
    c = PathController(PathVehicle(2.5, 25.0))
    assert c.steer(0.0, 0.0, 0.37, 10.0) == pytest.approx(0.37)
    assert c.steer(0.8, 0.0, 0.0, 10.0) < 0 < c.steer(-0.8, 0.0, 0.0, 10.0)  # right of the path: steer left
    assert c.steer(0.0, 0.1, 0.0, 10.0) < 0  # pointing right: steer left


@pytest.fixture(scope="module")
def drive(tmp_path_factory):
    """The udacity expert's drive on one track without noise, as collect.py records it."""
    out = tmp_path_factory.mktemp("replay") / "drive"
    assert collect_cli.main(["--env", "udacity", "--episodes", "1", "--max-steps", str(STEPS), "--noise", "0",
                             "--seed", "3000001", "--workers", "1", "--out", str(out), "--no-progress"]) == 0
    return out


def test_recorded_steering_scores_100_and_always_straight_leaves_a_curved_road(drive, tmp_path):
    out = tmp_path / "expert"
    results = evaluate(resolve(EvalArgs(replay=str(drive), expert_drives=True, out=str(out), workers=1,
                                        video_episodes=1, progress=False, tensorboard=False)))
    s = results["expert"]
    assert s["autonomy"] == 100.0 and s["total_interventions"] == 0 and s["max_abs_cte"] == 0.0
    assert s["straight_interventions"] >= 1 and s["straight_autonomy"] < 100.0
    assert s["interventions_per_100s"] == 0.0 and s["straight_interventions_per_100s"] > 0
    assert s["elapsed_s"] == pytest.approx(STEPS * 0.1, rel=0.02)
    saved = json.loads((out / "metrics.json").read_text())
    assert saved["replay"]["geometry"]["cam_height_m"] == SIM_V0.cam_height_m
    assert "path_trace" not in saved["episodes"][0]
    assert (out / "paths" / "part_0.png").stat().st_size > 1000 and (out / "videos" / "seed_0.mp4").is_file()
    table = _replay_table(out / "paths" / "part_0.csv")
    assert len(table) == STEPS and [int(r["row"]) for r in table] == list(range(STEPS))
    assert all(float(r["steer"]) == pytest.approx(float(r["recorded_steer"]), abs=1e-4) for r in table)
    assert sum(int(r["intervention"]) for r in table) == 0


def _replay_table(path):
    import csv

    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_students_of_both_worlds_drive_the_replay_and_get_a_comparison(drive, tmp_path):
    out = tmp_path / "students"
    results = evaluate(resolve(EvalArgs(replay=str(drive), checkpoint=["checkpoints/udacity_nac.pt",
                                                                       "checkpoints/udacity-hard_nac.pt"],
                                        out=str(out), workers=1, video_episodes=0, progress=False, tensorboard=False,
                                        replay_span="0.5:1")))
    assert set(results) == {"udacity_nac", "udacity-hard_nac"}
    for s in results["udacity_nac"], results["udacity-hard_nac"]:
        assert s["episodes"][0]["length"] == STEPS - STEPS // 2 and s["mean_mean_abs_cte"] >= 0
        assert "straight_autonomy" in s
    text = (out / "comparison.md").read_text()
    assert "always-straight (reference)" in text and "interventions_per_100s" in text
    table = [line for line in text.split("## Paired")[0].splitlines() if line.startswith("|")]
    assert "laps" not in table[0] and "Episodes end at" not in text  # a part is driven once, to its end
    assert {line.count("|") for line in table} == {table[0].count("|")}  # every row has the header's cells
    for name, s in results.items():  # the per-step table says where in the recording each intervention came
        table = _replay_table(out / name / "paths" / "part_0.csv")
        assert int(table[0]["row"]) == STEPS // 2 and len(table) == STEPS - STEPS // 2
        assert sum(int(r["intervention"]) for r in table) == s["total_interventions"]


def test_the_replay_env_is_a_gym_env_with_the_recorded_time(drive):
    spec = get_spec("replay:" + str(drive.resolve()))
    env = spec.make(max_episode_steps=30)
    frame, info = env.reset(seed=0)
    assert frame.shape == (160, 320, 3) and info["time"] == 0.0 and spec.parts(None) == 1
    frame, _, terminated, truncated, info = env.step(np.array([1.0], np.float32))
    assert info["time"] == pytest.approx(0.1, abs=0.02) and info["cte"] != 0.0 and not terminated and not truncated
    with pytest.raises(ValueError, match="outside the recording's parts"):
        env.reset(seed=1)


@pytest.mark.parametrize("argv,needle", [
    (["--replay", "does/not/exist", "--expert-drives"], "does not exist"),
    (["--replay", "{drive}"], "pass --checkpoint CKPT"),
    (["--replay-span", "0.8:1"], "options of a --replay recording"),
    (["--replay", "{drive}", "--replay-max-offset", "0", "--expert-drives"], "--replay-max-offset must be a distance > 0"),
    (["--replay", "{drive}", "--replay-span", "0.9:0.2", "--expert-drives"], "0 <= A < B <= 1"),
    (["--replay", "{drive}", "--replay-span", "last", "--expert-drives"], "--replay-span takes A:B"),
    (["--replay", "{drive}", "--env", "udacity", "--expert-drives"], "drop --env"),
    (["--replay", "{drive}", "--data", "{drive}", "--expert-drives"], "give one of them"),
    (["--replay", "{drive}", "--seed", "1", "--episodes", "1", "--expert-drives"], "has 1 part(s)"),
    (["--replay", "{drive}", "--expert-drives", "--expert", "checkpoints/expert_udacity.zip"], "built in"),
    (["--replay", "{drive}", "--replay-reference", "lane", "--expert-drives"],
     "--replay-reference must be one of driver, driver-or-middle"),
    (["--replay-reference", "driver-or-middle"], "options of a --replay recording"),
    (["--replay", "{drive}", "--checkpoint", "checkpoints/carracing_nac.pt"],
     "steers CarRacing-v3 frames; a replay shows 160x320 first-person camera frames and drives students of udacity"),
])
def test_bad_replay_flags_are_one_line_errors(drive, tmp_path, capsys, argv, needle):
    argv = [a.replace("{drive}", str(drive)) for a in argv]
    code = evaluate_cli.main([*argv, "--out", str(tmp_path / "x"), "--workers", "1", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and needle in err and len(err.splitlines()) == 1, err


def test_a_recording_of_other_frames_is_refused(drive, tmp_path):
    from driving_data.dataset import open_dataset
    from envs.replay.spec import replay_spec

    ds = open_dataset(drive)
    assert ds.card["frame_shape"] == [160, 320, 3]
    with pytest.raises(ValueError, match="0 <= A < B <= 1"):
        parse_span("0.5:1.5")
    with pytest.raises(ValueError, match="frames are 96x96"):
        replay_spec(str(_carracing_like(tmp_path)))


def _carracing_like(tmp_path):
    from driving_data.dataset import CARD_NAME, FORMAT, write_episode

    root = tmp_path / "cr"
    T = 12
    write_episode(root, 0, {"frames": np.zeros((T, 96, 96, 3), np.uint8), "action": np.zeros((T, 1), np.float32),
                            "expert_action": np.zeros((T, 1), np.float32), "speed": np.ones(T, np.float32),
                            "reward": np.zeros(T, np.float32), "time": np.arange(T) * 0.1,
                            "privileged": np.zeros((T, 0), np.float32)},
                  {"env": "udacity", "action_space": "continuous"})
    (root / CARD_NAME).write_text(json.dumps({"format": FORMAT, "env": "udacity", "action_space": "continuous"}))
    return root


def test_a_real_recording_is_scored_and_replayed_by_students_of_both_worlds(drive, tmp_path):
    """A raw simulator recording imports as `udacity`; a udacity-hard student reads its frames too (offline and in
    replay), and the replay of a real recording uses the real simulator's camera."""
    from agent.udacity.recordings import export_udacity

    rec = tmp_path / "rec"
    export_udacity(drive, rec)
    (rec / "exported_dataset.json").unlink()  # as the Unity simulator records: no export card, its camera
    hard = "checkpoints/udacity-hard_nac.pt"
    offline = evaluate(resolve(EvalArgs(data=[str(rec)], checkpoint=[hard], out=str(tmp_path / "off"), progress=False)))
    assert offline["udacity-hard_nac"]["pooled"]["frames"] == STEPS
    # without --checkpoint a real recording is scored by the student made for real frames
    default = evaluate(resolve(EvalArgs(data=[str(rec)], out=str(tmp_path / "default"), progress=False)))
    assert set(default) == {"udacity_real_nac"} and default["udacity_real_nac"]["pooled"]["frames"] == STEPS
    # and the replay of a person's recording drives it without --checkpoint too
    loop = evaluate(resolve(EvalArgs(replay=str(rec), out=str(tmp_path / "default_loop"), workers=1, video_episodes=0,
                                     progress=False, tensorboard=False)))
    assert set(loop) == {"udacity_real_nac"}
    closed = evaluate(resolve(EvalArgs(replay=str(rec), checkpoint=[hard], out=str(tmp_path / "loop"), workers=1,
                                       video_episodes=0, progress=False, tensorboard=False)))
    saved = json.loads((tmp_path / "loop" / "metrics.json").read_text())
    assert closed["udacity-hard_nac"]["num_episodes"] == 1
    assert saved["replay"]["geometry"]["cam_height_m"] == 1.2 and (tmp_path / "loop" / "imported_data").is_dir()


def test_a_wider_intervention_limit_counts_fewer_interventions(drive):
    spec = get_spec("replay:" + str(drive.resolve()))
    counts = []
    for limit in (0.5, 1.0, 3.0):
        env = spec.make(max_offset=limit)
        env.reset(seed=0)
        for _ in range(STEPS):
            *_, truncated, info = env.step(np.zeros(1, np.float32))
            if info["lane_departure"]:
                env.recenter()
            if truncated:
                break
        counts.append((len(env._interventions), info["straight_interventions"]))
    assert [c[0] for c in counts] == [c[1] for c in counts], "a straight driver's replay matches the reference count"
    assert counts[0][0] > counts[1][0] >= counts[2][0]


def _final_info(env, steer):
    """Steer ``steer`` through the whole part, put back at every intervention as evaluation does; the last info."""
    env.reset(seed=0)
    for _ in range(STEPS):
        *_, truncated, info = env.step(np.full(1, steer, np.float32))
        if truncated:
            break
        if info["lane_departure"]:
            env.recenter()
    return info


def _drive_steady(env, steer):
    info = _final_info(env, steer)
    return list(env._interventions), info["interventions_left"], info["straight_interventions"]


def test_the_driver_reference_is_the_rule_of_old_and_the_middle_widens_where_the_car_may_be(drive, monkeypatch):
    """reference="driver" (the default) counts exactly what the replay always counted; "driver-or-middle" also
    lets the car be near the middle road.py measured (here replaced by known ones): a middle of 0 is the driver's
    line, a middle left of the driver lets a car that drifts left go further, a middle further than the car ever
    gets changes nothing, and always-straight's count follows the same rule."""
    import envs.replay.env as replay_env

    spec = get_spec("replay:" + str(drive.resolve()))
    default = _drive_steady(spec.make(), -0.15)
    assert _drive_steady(spec.make(reference="driver"), -0.15) == default and len(default[0]) >= 2
    monkeypatch.setattr(replay_env, "part_middle", lambda ds, episode, rows, geometry: np.zeros(rows.stop - rows.start))
    assert _drive_steady(spec.make(reference="driver-or-middle"), -0.15) == default
    monkeypatch.setattr(replay_env, "part_middle", lambda ds, episode, rows, geometry: np.full(rows.stop - rows.start, -0.6))
    middle_left = _drive_steady(spec.make(reference="driver-or-middle"), -0.15)
    assert len(middle_left[0]) < len(default[0]) and middle_left[0][0] > default[0][0]
    monkeypatch.setattr(replay_env, "part_middle", lambda ds, episode, rows, geometry: np.full(rows.stop - rows.start, -5.0))
    assert _drive_steady(spec.make(reference="driver-or-middle"), -0.15) == default
    wavy = lambda ds, episode, rows, geometry: 0.8 * np.sin(np.arange(rows.stop - rows.start) / 7.0)
    monkeypatch.setattr(replay_env, "part_middle", wavy)
    interventions, _, straight = _drive_steady(spec.make(reference="driver-or-middle"), 0.0)
    assert len(interventions) == straight  # the env's always-straight drive and the frame-free count agree
    with pytest.raises(ValueError, match="reference must be one of driver, driver-or-middle"):
        spec.make(reference="lane")


def test_interventions_where_the_middle_was_not_measured_are_counted(drive, monkeypatch):
    """driver-or-middle counts the interventions made where road.py measured no middle (its 0.0 fill): all of
    them when nothing was measured, none when every frame was; the driver's rule has no such count."""
    import envs.replay.env as replay_env

    spec = get_spec("replay:" + str(drive.resolve()))

    def final_info(env):
        return _final_info(env, -0.15), len(env._interventions)

    info, n = final_info(spec.make())
    assert "interventions_unmeasured" not in info and n >= 2
    monkeypatch.setattr(replay_env, "part_middle", lambda ds, episode, rows, geometry: np.zeros(rows.stop - rows.start))
    info, n = final_info(spec.make(reference="driver-or-middle"))
    assert info["interventions_unmeasured"] == n and type(info["interventions_unmeasured"]) is int
    monkeypatch.setattr(replay_env, "part_middle", lambda ds, episode, rows, geometry: np.full(rows.stop - rows.start, -0.6))
    info, n = final_info(spec.make(reference="driver-or-middle"))
    assert info["interventions_unmeasured"] == 0 and n >= 1


def test_the_middle_reference_runs_end_to_end_and_says_so(drive, tmp_path):
    """The recorded steering never leaves the driver's line, so it needs no intervention whatever the middle."""
    results = evaluate(resolve(EvalArgs(replay=str(drive), expert_drives=True, out=str(tmp_path / "road"), workers=1,
                                        video_episodes=0, progress=False, tensorboard=False,
                                        replay_reference="driver-or-middle")))
    assert results["expert"]["total_interventions"] == 0
    saved = json.loads((tmp_path / "road" / "metrics.json").read_text())
    assert "road's middle" in saved["replay"]["intervention"] and saved["reference"] == "driver-or-middle"


@pytest.mark.parametrize("steer, left", [(-1.0, True), (1.0, False)])
def test_interventions_count_the_side_the_car_left_the_drivers_line(drive, steer, left):
    """A driver at full left lock leaves the line to the left every time, and at full right lock to the right."""
    env = get_spec("replay:" + str(drive.resolve())).make()
    env.reset(seed=0)
    for _ in range(STEPS):
        *_, truncated, info = env.step(np.full(1, steer, np.float32))
        if truncated:  # as evaluation: no intervention on the last step
            break
        if info["lane_departure"]:
            env.recenter()
    assert len(env._interventions) >= 2
    assert info["interventions_left"] == (len(env._interventions) if left else 0)
    assert type(info["interventions_left"]) is int  # it goes into JSON with the episode (DAgger data)


def test_dagger_data_is_recorded_in_the_replay(drive, tmp_path):
    """collect.py --driver in a replay: the student drives, the path controller labels the states it reaches."""
    out = tmp_path / "dagger"
    env = "replay:" + str(drive.resolve())
    assert collect_cli.main(["--env", env, "--episodes", "1", "--seed", "0", "--max-steps", "40", "--driver",
                             "checkpoints/udacity_nac.pt", "--out", str(out), "--workers", "1", "--no-progress"]) == 0
    from driving_data.dataset import open_dataset

    ds = open_dataset(out)
    ep = ds.load(0, keys=["action", "expert_action", "privileged"])
    assert ep["action"].shape == ep["expert_action"].shape == (40, 1) and ep["privileged"].shape == (40, 4)
    assert not np.allclose(ep["action"], ep["expert_action"]), "the student drove, the controller labelled"
    assert ds.card["expert"]["path"] is None and "recorded path" in ds.card["expert"]["driver"]


def test_calibration_recovers_the_simulators_side_cameras_and_forward_scale(drive, capsys):
    """python -m envs.replay.calibrate on a drive of this project's simulator finds its 1.0 m side cameras and a
    forward scale of 1 (the frames move as speed x dt says)."""
    from envs.replay import calibrate

    assert calibrate.main([str(drive), "--frames", "8", "--pairs", "12"]) == 0
    text = capsys.readouterr().out
    assert text.count("at 1.00 m") == 2 and "forward scale median 1.00" in text
    assert calibrate.main(["does/not/exist"]) == 2


def test_dagger_in_a_replay_drives_only_the_span_it_is_given(drive, tmp_path, capsys):
    """--replay-span keeps DAgger rounds off the held-out end of a recording: an episode is one session's part."""
    from driving_data.dataset import open_dataset

    env = "replay:" + str(drive.resolve())
    whole = open_dataset(drive).episodes[0]["length"]
    out = tmp_path / "dagger"
    assert collect_cli.main(["--env", env, "--episodes", "1", "--seed", "0", "--driver", "checkpoints/udacity_nac.pt",
                             "--replay-span", "0:0.5", "--out", str(out), "--workers", "1", "--no-progress"]) == 0
    meta = open_dataset(out).episodes[0]
    # the whole half is driven: a replay puts the car back on the path (counted) instead of ending the episode
    assert whole // 2 - 2 <= meta["length"] <= whole // 2 and "interventions" in meta
    # the DAgger episodes train with the recording they replay: their env is the recording's
    from driving_data.dataset import dataset_env_name

    dagger = open_dataset(out)
    assert dataset_env_name(dagger.card, dagger.episodes) == open_dataset(drive).card["env"]
    assert collect_cli.main(["--replay-span", "0:0.5", "--out", str(tmp_path / "x")]) == 2
    assert "--replay-span is the driven part of a recording" in capsys.readouterr().err


def test_a_simulator_student_fine_tunes_on_a_recording_and_a_rerun_is_told_the_folder_holds_a_run(drive, tmp_path,
                                                                                                   capsys):
    """--init with the shipped udacity-real student on a raw recording: it becomes the recording's student (its crop
    and head kept); the same command again says the run folder is taken (not that the recording holds no episodes)."""
    import train as train_cli
    from agent.udacity.recordings import export_udacity
    from policies.policy import load_checkpoint

    rec = tmp_path / "rec"
    export_udacity(drive, rec)
    (rec / "exported_dataset.json").unlink()  # as the Unity simulator records: no export card, its camera
    argv = ["--data", str(rec), "--init", "checkpoints/udacity_sim2real_nac.pt", "--head", "steer", "--epochs", "1",
            "--threads", "1", "--out", str(tmp_path / "tuned"), "--no-progress"]
    assert train_cli.main(argv) == 0
    tuned = load_checkpoint(tmp_path / "tuned" / "best.pt")
    assert tuned.config.env == "UdacityStyle-v0" and list(tuned.config.crop) == [60, 135]
    assert list(tuned.config.action_names) == ["steer"]
    capsys.readouterr()
    assert train_cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "already holds a run" in err and "Traceback" not in err
    # a student of a world with other frames is still refused
    carracing = ["--data", str(rec), "--init", "checkpoints/carracing_nac.pt", "--out", str(tmp_path / "cr")]
    assert train_cli.main(carracing) == 2 and "cannot be fine-tuned" in capsys.readouterr().err


def test_a_dagger_lineage_in_the_replay_of_a_recording(drive, tmp_path, capsys):
    """python -m agent.training.dagger --replay on a raw simulator recording: it is imported once, round 0 trains
    on it, round 1's student drives the replay of the trained part only (0:0.8), the path controller labels it, and
    the next student fine-tunes on the recording plus those episodes; the summary names the command that judges
    every round on the held-out end."""
    from driving_data.dataset import open_dataset
    from agent.training.dagger import Lineage, Recipe, Round, main, run_lineage
    from agent.udacity.recordings import export_udacity

    rec = tmp_path / "rec"
    export_udacity(drive, rec)
    (rec / "exported_dataset.json").unlink()  # as the Unity simulator records: no export card, its camera

    recipe = {"replay": Recipe(0, 1, 0, (Round(0.0, 1, 5e-4),) * 2, "argmax", action_space="continuous",
                               val_fraction=0.2, split="blocks")}
    tiny = dict(window=3, frame_stride=2, batch_size=32, segment=8, feature_dim=16, hidden=16, log_every=2)
    lin = Lineage(recording=str(rec), core="mlp", seed=1, data=str(tmp_path / "data"), out=str(tmp_path / "runs"),
                  workers=1, threads=1, progress=False, train_options=tiny)
    summary = run_lineage(lin, recipe, log=lambda m: None)
    runs, r1_data = tmp_path / "runs", tmp_path / "data" / "r1"
    imported = str((runs / "recording").resolve())
    episode = open_dataset(r1_data).episodes[0]
    assert episode["driver"] == str(runs / "r0" / "best.pt") and episode["length"] <= 0.8 * STEPS
    assert open_dataset(r1_data).card["runs"][0]["span"] == [0.0, 0.8]  # the driven part, as numbers
    args = json.loads((runs / "r1" / "args.json").read_text())
    assert args["data"] == [imported, str(r1_data)] and args["init"] == str(runs / "r0" / "best.pt")
    second = json.loads((runs / "r2" / "args.json").read_text())  # round 2: the recording and both rounds' episodes
    assert second["data"] == [imported, str(r1_data), str(tmp_path / "data" / "r2")]
    assert open_dataset(tmp_path / "data" / "r2").episodes[0]["driver"] == str(runs / "r1" / "best.pt")
    assert args["split"] == "blocks" and json.loads((runs / "r0" / "args.json").read_text())["data"] == imported
    assert "--replay-span 0.8:1" in summary["evaluate"] and "r2/best.pt" in summary["evaluate"]
    assert "--replay-span 0:0.8" in summary["rounds"][1]["collect"] and "collect" not in summary["rounds"][0]

    # --init: round 0 fine-tunes a given student (a simulator student on a short recording), the rounds follow it
    from dataclasses import replace

    from agent.training.dagger import _command, plan_rounds

    tuned = replace(lin, init="checkpoints/udacity_sim2real_nac.pt", out=str(tmp_path / "ft"), data=None)
    plans = plan_rounds(tuned, recipe["replay"], log=lambda m: None)
    assert plans[0].train.init == "checkpoints/udacity_sim2real_nac.pt" and plans[0].collects == []
    assert plans[1].train.init == str(tmp_path / "ft" / "r0" / "best.pt")
    assert tuned.name == "rec_from-udacity_sim2real_nac_s1" and Path(plans[1].collects[0][0].out) == Path("data/dagger") / tuned.name / "r1"
    # --rounds: a finished lineage goes on with the recipe's last round repeated; fewer rounds stop early
    longer = plan_rounds(replace(lin, rounds=4), recipe["replay"], log=lambda m: None)
    assert [p.run_dir.name for p in longer] == ["r0", "r1", "r2", "r3", "r4"]
    assert longer[4].train.init == str(runs / "r3" / "best.pt") and longer[4].train.lr == 5e-4
    assert len(longer[4].train.data) == 5 and longer[2].train == plan_rounds(lin, recipe["replay"], lambda m: None)[2].train
    assert len(plan_rounds(replace(lin, rounds=1), recipe["replay"], log=lambda m: None)) == 2
    # --noise: the rounds' students drive with DART noise on their steering (held 3 frames); round 0 collects nothing
    noisy = plan_rounds(replace(lin, noise=0.1), recipe["replay"], log=lambda m: None)
    assert (noisy[1].collects[0][0].noise, noisy[1].collects[0][0].noise_hold) == (0.1, 3) and noisy[0].collects == []
    assert "--noise 0.1 --noise-hold 3" in _command("collect.py", noisy[2].collects[0][0])
    assert plan_rounds(lin, recipe["replay"], log=lambda m: None)[1].collects[0][0].noise is None

    for argv, needle in ([["--replay", str(rec), "--recipe", "long"], "give --recipe replay with --replay"],
                         [["--replay", str(rec), "--init", "nothing.pt"], "--init 'nothing.pt' is not a file"],
                         [["--recipe", "replay"], "give --replay REC"],
                         [["--replay", str(rec), "--rounds", "0"], "--rounds must be an integer >= 1"],
                         [["--replay", str(rec), "--noise", "-0.1"], "--noise must be a number >= 0"],
                         [["--replay", str(tmp_path / "nowhere")], "is not a folder"]):
        assert main([*argv, "--out", str(tmp_path / "x")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0], err
    assert not (tmp_path / "x").exists()


def test_the_road_middle_benchmark_reports_a_drive_and_refuses_a_missing_folder(drive, tmp_path, capsys):
    """`python -m benchmarks.road_middle`: coverage and side-camera agreement on a recorded drive, one-line error
    for a folder that is not there."""
    from benchmarks import road_middle

    assert road_middle.main([str(drive)]) == 0
    out = capsys.readouterr().out
    assert "center frames, measured on" in out and "left camera" in out
    assert road_middle.main([str(drive.parent / "missing")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "does not exist" in err and "\n" not in err
    # this project's simulator in the real look knows its cross-track error: the middle measured against it
    real_look = tmp_path / "real_look"
    assert collect_cli.main(["--env", "udacity-real", "--episodes", "1", "--max-steps", str(STEPS), "--noise", "0.3",
                             "--seed", "3000001", "--workers", "1", "--out", str(real_look), "--no-progress"]) == 0
    assert road_middle.main([str(real_look), "--against-truth"]) == 0
    assert "against the simulator's cross-track error" in capsys.readouterr().out
    ds = open_dataset(real_look)
    (theme, found), = road_middle.against_truth(ds, geometry_of(ds)).items()
    assert found["frames"] == -(-STEPS // 10) and found["coverage"] > 0.5 and found["median_abs_err"] < 0.4


def test_the_label_drift_benchmark_drives_the_labels_open_loop(drive, tmp_path, capsys):
    """`python -m benchmarks.label_drift`: the recorded steering never leaves its own line, always-straight is
    charged what the replay charges it, a label played late differs from the label; bad input is one line."""
    from benchmarks import label_drift

    counts, seconds = label_drift.drift_table(open_dataset(drive), (0.0, 1.0), [3])
    assert seconds == pytest.approx(STEPS * 0.1, rel=0.02)
    assert counts[("driver", "recorded steering")] == counts[("driver-or-middle", "recorded steering")] == 0
    replayed = evaluate(resolve(EvalArgs(replay=str(drive), expert_drives=True, out=str(tmp_path / "e"), workers=1,
                                         video_episodes=0, progress=False, tensorboard=False)))["expert"]
    assert counts[("driver", "always straight")] == replayed["straight_interventions"] >= 1
    late = label_drift.label_drivers(np.arange(5.0), np.arange(5) * 0.1, [2])["the label 2 rows late"]
    assert late.tolist() == pytest.approx([1.0, 1.0, 1.0, 1.5, 2.0])  # the 0.5 s label of 0..4 at 10 Hz, 2 rows late
    assert label_drift.main([str(drive), "--span", "0:1", "--shift-steps", "2"]) == 0
    assert "| the label 2 rows early |" in capsys.readouterr().out
    assert label_drift.main([str(drive), "--shift-steps", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "--shift-steps" in err and "\n" not in err


def _speeds_dataset(root, speeds):
    """A replayable dataset (160x320 frames, the udacity env) with one episode per array of speeds (m/s)."""
    from driving_data.dataset import CARD_NAME, FORMAT, write_episode

    for e, speed in enumerate(speeds):
        T = len(speed)
        write_episode(root, e, {"frames": np.zeros((T, 160, 320, 3), np.uint8), "action": np.zeros((T, 1), np.float32),
                                "expert_action": np.zeros((T, 1), np.float32), "speed": np.asarray(speed, np.float32),
                                "reward": np.zeros(T, np.float32), "time": np.arange(T) * 0.1,
                                "privileged": np.zeros((T, 0), np.float32)},
                      {"env": "udacity", "action_space": "continuous"})
    (root / CARD_NAME).write_text(json.dumps({"format": FORMAT, "env": "udacity", "action_space": "continuous",
                                              "frame_shape": [160, 320, 3], "dt": 0.1}))
    return root


def test_a_car_that_does_not_move_forward_is_never_scored(tmp_path, capsys):
    """A session whose car stands is not replayed (it would score every driver 100 % over a road never driven); a
    speed below zero is refused in one line; a part of brief stops between driving is replayed as before."""
    from envs.replay.spec import replay_spec

    stops = np.r_[np.full(10, 8.0), np.zeros(5), np.full(15, 8.0)]
    mixed = _speeds_dataset(tmp_path / "mixed", [np.full(30, 8.0), np.zeros(30), stops])
    assert [(p.episode, p.length) for p in replay_spec(str(mixed)).make().parts] == [(0, 30), (2, 30)]
    standing = _speeds_dataset(tmp_path / "standing", [np.zeros(30), np.full(30, 0.2)])
    assert evaluate_cli.main(["--replay", str(standing), "--expert-drives", "--out", str(tmp_path / "e"),
                              "--workers", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith("frames in the span 0:1 in which the car moves"), err
    backwards = _speeds_dataset(tmp_path / "backwards", [np.full(30, -6.0)])
    assert evaluate_cli.main(["--replay", str(backwards), "--expert-drives", "--out", str(tmp_path / "e"),
                              "--workers", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "episode 0 step 0: speed -6 m/s is below zero" in err[0], err
    assert not (tmp_path / "e").exists()


def test_a_student_of_other_frames_never_drives_the_replay(drive, tmp_path, capsys):
    from tests.helpers import steering_checkpoint

    ckpt = steering_checkpoint(tmp_path / "big.pt", frame_shape=[480, 640, 3])
    assert evaluate_cli.main(["--replay", str(drive), "--checkpoint", str(ckpt), "--out", str(tmp_path / "e"),
                              "--workers", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and ("was trained on 480x640x3 frames; the camera frames of replay:" in err[0]
                              and "are 160x320x3" in err[0]), err


def test_a_full_disk_while_plotting_the_path_keeps_the_scores_in_one_line(drive, tmp_path, monkeypatch, capsys):
    from tests.helpers import full_disk

    full_disk(monkeypatch, ".part_0.png.")
    out = tmp_path / "e"
    assert evaluate_cli.main(["--replay", str(drive), "--expert-drives", "--out", str(out), "--workers", "1",
                              "--no-video", "--no-tensorboard", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: no space left on the disk while writing {str(out / 'paths' / 'part_0.png')!r}; free some "
                   "space and run the command again"], err
    assert json.loads((out / "metrics.json").read_text())["autonomy"] == 100.0 and (out / "episodes.csv").is_file()
