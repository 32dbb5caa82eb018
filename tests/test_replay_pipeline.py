"""A recording through the whole product in closed loop: evaluate.py --replay on a recorded drive of the udacity env
(the recorded steering scores 100 %, always-straight leaves a curved road, students of both worlds drive, bad input
gets one line), a real simulator recording scored and replayed, collect.py DAgger data in a replay, train.py
fine-tuning on a recording, and a DAgger lineage (python -m agent.training.dagger --replay)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import collect as collect_cli
import evaluate as evaluate_cli
from agent.evaluation.args import EvalArgs
from agent.evaluation.config import resolve
from agent.evaluation.evaluate import evaluate
from envs.replay.spec import SIM_V0
from tests.helpers import DRIVE_STEPS



def _evaluate(**args):
    """evaluate.py's library path: the arguments resolved into their plan, then run."""
    return evaluate(resolve(EvalArgs(**args)))

def test_recorded_steering_scores_100_and_always_straight_leaves_a_curved_road(udacity_drive, tmp_path):
    out = tmp_path / "expert"
    results = _evaluate(replay=str(udacity_drive), expert_drives=True, out=str(out), workers=1,
                        video_episodes=1, progress=False, tensorboard=False)
    s = results["expert"]
    assert s["autonomy"] == 100.0 and s["total_interventions"] == 0 and s["max_abs_cte"] == 0.0
    assert s["straight_interventions"] >= 1 and s["straight_autonomy"] < 100.0
    assert s["interventions_per_100s"] == 0.0 and s["straight_interventions_per_100s"] > 0
    assert s["elapsed_s"] == pytest.approx(DRIVE_STEPS * 0.1, rel=0.02)
    saved = json.loads((out / "metrics.json").read_text())
    assert saved["replay"]["geometry"]["cam_height_m"] == SIM_V0.cam_height_m
    assert "path_trace" not in saved["episodes"][0]
    assert (out / "paths" / "part_0.png").stat().st_size > 1000 and (out / "videos" / "seed_0.mp4").is_file()
    table = _replay_table(out / "paths" / "part_0.csv")
    assert len(table) == DRIVE_STEPS and [int(r["row"]) for r in table] == list(range(DRIVE_STEPS))
    assert all(float(r["steer"]) == pytest.approx(float(r["recorded_steer"]), abs=1e-4) for r in table)
    assert sum(int(r["intervention"]) for r in table) == 0


def _replay_table(path):
    import csv

    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_students_of_both_worlds_drive_the_replay_and_get_a_comparison(udacity_drive, tmp_path):
    out = tmp_path / "students"
    results = _evaluate(replay=str(udacity_drive), checkpoint=["checkpoints/udacity_nac.pt",
                                                       "checkpoints/udacity-hard_nac.pt"],
                        out=str(out), workers=1, video_episodes=0, progress=False, tensorboard=False,
                        replay_span="0.5:1")
    assert set(results) == {"udacity_nac", "udacity-hard_nac"}
    for s in results["udacity_nac"], results["udacity-hard_nac"]:
        assert s["episodes"][0]["length"] == DRIVE_STEPS - DRIVE_STEPS // 2 and s["mean_mean_abs_cte"] >= 0
        assert "straight_autonomy" in s
    text = (out / "comparison.md").read_text()
    assert "always-straight (reference)" in text and "interventions_per_100s" in text
    table = [line for line in text.split("## Paired")[0].splitlines() if line.startswith("|")]
    assert "laps" not in table[0] and "Episodes end at" not in text  # a part is driven once, to its end
    assert {line.count("|") for line in table} == {table[0].count("|")}  # every row has the header's cells
    for name, s in results.items():  # the per-step table says where in the recording each intervention came
        table = _replay_table(out / name / "paths" / "part_0.csv")
        assert int(table[0]["row"]) == DRIVE_STEPS // 2 and len(table) == DRIVE_STEPS - DRIVE_STEPS // 2
        assert sum(int(r["intervention"]) for r in table) == s["total_interventions"]


@pytest.mark.parametrize("argv,needle", [
    (["--replay", "does/not/exist", "--expert-drives"], "does not exist"),
    (["--replay", "{drive}"], "pass --checkpoint CKPT"),
    (["--replay-span", "0.8:1"], "options of a --replay recording"),
    (["--replay", "{drive}", "--replay-max-offset", "0", "--expert-drives"],
     "--replay-max-offset must be a distance > 0"),
    (["--replay", "{drive}", "--replay-span", "0.9:0.2", "--expert-drives"], "0 <= A < B <= 1"),
    (["--replay", "{drive}", "--replay-span", "last", "--expert-drives"], "--replay-span takes A:B"),
    (["--replay", "{drive}", "--env", "udacity", "--expert-drives"], "drop --env"),
    (["--replay", "{drive}", "--data", "{drive}", "--expert-drives"], "give one of them"),
    (["--replay", "{drive}", "--seed", "1", "--episodes", "1", "--expert-drives"], "has 1 part(s)"),
    (["--replay", "{drive}", "--expert-drives", "--expert", "checkpoints/expert_udacity.zip"], "built in"),
    (["--replay", "{drive}", "--replay-reference", "lane", "--expert-drives"],
     "argument --replay-reference: invalid choice: 'lane'"),
    (["--replay-reference", "driver-or-middle"], "options of a --replay recording"),
    (["--replay", "{drive}", "--checkpoint", "checkpoints/carracing_nac.pt"],
     "steers CarRacing-v3 frames; a replay shows 160x320 first-person camera frames and drives students of udacity"),
])
def test_bad_replay_flags_are_one_line_errors(udacity_drive, tmp_path, capsys, argv, needle):
    argv = [a.replace("{drive}", str(udacity_drive)) for a in argv]
    try:
        code = evaluate_cli.main([*argv, "--out", str(tmp_path / "x"), "--workers", "1", "--no-progress"])
    except SystemExit as e:  # a value the parser refuses (a choice)
        code = e.code
    err = capsys.readouterr().err.strip()
    assert code == 2 and needle in err and len(err.splitlines()) == 1, err


def test_a_real_recording_is_scored_and_replayed_by_students_of_both_worlds(udacity_drive, tmp_path):
    """A raw simulator recording imports as `udacity`; a udacity-hard student reads its frames too (offline and in
    replay), and the replay of a real recording uses the real simulator's camera."""
    from agent.udacity.recordings import export_udacity

    rec = tmp_path / "rec"
    export_udacity(udacity_drive, rec)
    (rec / "exported_dataset.json").unlink()  # as the Unity simulator records: no export card, its camera
    hard = "checkpoints/udacity-hard_nac.pt"
    offline = _evaluate(data=[str(rec)], checkpoint=[hard], out=str(tmp_path / "off"), progress=False)
    assert offline["udacity-hard_nac"]["pooled"]["frames"] == DRIVE_STEPS
    # without --checkpoint a real recording is scored by the student made for real frames
    default = _evaluate(data=[str(rec)], out=str(tmp_path / "default"), progress=False)
    assert set(default) == {"udacity_real_nac"} and default["udacity_real_nac"]["pooled"]["frames"] == DRIVE_STEPS
    # and the replay of a person's recording drives it without --checkpoint too
    loop = _evaluate(replay=str(rec), out=str(tmp_path / "default_loop"), workers=1, video_episodes=0,
                     progress=False, tensorboard=False)
    assert set(loop) == {"udacity_real_nac"}
    closed = _evaluate(replay=str(rec), checkpoint=[hard], out=str(tmp_path / "loop"), workers=1,
                       video_episodes=0, progress=False, tensorboard=False)
    saved = json.loads((tmp_path / "loop" / "metrics.json").read_text())
    assert closed["udacity-hard_nac"]["num_episodes"] == 1
    assert saved["replay"]["geometry"]["cam_height_m"] == 1.2 and (tmp_path / "loop" / "imported_data").is_dir()


def test_the_middle_reference_runs_end_to_end_and_says_so(udacity_drive, tmp_path):
    """The recorded steering never leaves the driver's line, so it needs no intervention whatever the middle."""
    results = _evaluate(replay=str(udacity_drive), expert_drives=True, out=str(tmp_path / "road"), workers=1,
                        video_episodes=0, progress=False, tensorboard=False,
                        replay_reference="driver-or-middle")
    assert results["expert"]["total_interventions"] == 0
    saved = json.loads((tmp_path / "road" / "metrics.json").read_text())
    assert "road's middle" in saved["replay"]["intervention"] and saved["reference"] == "driver-or-middle"


def test_a_wrong_checkpoint_for_a_person_s_recording_names_the_student_made_for_its_frames(udacity_drive, tmp_path,
                                                                                            capsys):
    from policies.checkpoint import RECORDING_STUDENT
    from agent.udacity.recordings import export_udacity

    rec = tmp_path / "rec"
    export_udacity(udacity_drive, rec)
    (rec / "exported_dataset.json").unlink()  # as the simulator records: the real camera
    assert evaluate_cli.main(["--replay", str(rec), "--checkpoint", "checkpoints/carracing_nac.pt", "--out",
                              str(tmp_path / "e"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"(e.g. {RECORDING_STUDENT}, or one train.py made" in err[0], err


def test_a_disk_that_fills_up_while_a_video_is_written_is_one_line_and_removes_the_import(udacity_drive, tmp_path,
                                                                                         monkeypatch, capsys):
    """ffmpeg dies of the full disk and imageio raises a broken pipe: evaluate.py answers with the one disk-full line
    and exit 2, as for any other full disk, and takes back the import it made for the run (freeing its room)."""
    import shutil
    from collections import namedtuple

    from agent.udacity.recordings import export_udacity

    rec = tmp_path / "rec"
    export_udacity(udacity_drive, rec)
    (rec / "exported_dataset.json").unlink()  # as the simulator records: imported into OUT/imported_data

    class DeadFfmpeg:  # imageio's writer once ffmpeg has died: what imageio-ffmpeg raises around the broken pipe
        def append_data(self, img):
            raise OSError("[Errno 32] Broken pipe\n\nFFMPEG COMMAND:\n...")

        def close(self):
            pass

    import imageio.v2

    monkeypatch.setattr(imageio.v2, "get_writer", lambda *a, **k: DeadFfmpeg())
    usage = namedtuple("usage", "total used free")
    real_usage = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**9, 10**9, 0) if "videos" in str(p) else real_usage(p))
    out = tmp_path / "eval"
    assert evaluate_cli.main(["--replay", str(rec), "--expert-drives", "--max-steps", "20", "--workers", "1",
                              "--out", str(out), "--no-progress", "--no-tensorboard"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("error: no space left on the disk while writing ") and ".mp4" in err[0], err
    assert not (out / "imported_data").exists()


def test_dagger_data_is_recorded_in_the_replay(udacity_drive, tmp_path):
    """collect.py --driver in a replay: the student drives, the path controller labels the states it reaches."""
    out = tmp_path / "dagger"
    env = "replay:" + str(udacity_drive.resolve())
    assert collect_cli.main(["--env", env, "--episodes", "1", "--seed", "0", "--max-steps", "40", "--driver",
                             "checkpoints/udacity_nac.pt", "--out", str(out), "--workers", "1", "--no-progress"]) == 0
    from driving_data.dataset import open_dataset

    ds = open_dataset(out)
    ep = ds.load(0, keys=["action", "expert_action", "privileged"])
    assert ep["action"].shape == ep["expert_action"].shape == (40, 1) and ep["privileged"].shape == (40, 4)
    assert not np.allclose(ep["action"], ep["expert_action"]), "the student drove, the controller labelled"
    assert ds.card["expert"]["path"] is None and "recorded path" in ds.card["expert"]["driver"]


def test_dagger_in_a_replay_drives_only_the_span_it_is_given(udacity_drive, tmp_path, capsys):
    """--replay-span keeps DAgger rounds off the held-out end of a recording: an episode is one session's part."""
    from driving_data.dataset import open_dataset

    env = "replay:" + str(udacity_drive.resolve())
    whole = open_dataset(udacity_drive).episodes[0]["length"]
    out = tmp_path / "dagger"
    assert collect_cli.main(["--env", env, "--episodes", "1", "--seed", "0", "--driver", "checkpoints/udacity_nac.pt",
                             "--replay-span", "0:0.5", "--out", str(out), "--workers", "1", "--no-progress"]) == 0
    meta = open_dataset(out).episodes[0]
    # the whole half is driven: a replay puts the car back on the path (counted) instead of ending the episode
    assert whole // 2 - 2 <= meta["length"] <= whole // 2 and "interventions" in meta
    # the DAgger episodes train with the recording they replay: their env is the recording's
    from driving_data.dataset import dataset_env_name

    dagger = open_dataset(out)
    assert dataset_env_name(dagger.card, dagger.episodes) == open_dataset(udacity_drive).card["env"]
    assert collect_cli.main(["--replay-span", "0:0.5", "--out", str(tmp_path / "x")]) == 2
    assert "--replay-span is the driven part of a recording" in capsys.readouterr().err


def test_a_simulator_student_fine_tunes_on_a_recording_and_a_rerun_is_told_the_folder_holds_a_run(
        udacity_drive, tmp_path, capsys):
    """--init with the shipped udacity-real student on a raw recording: it becomes the recording's student (its crop
    and head kept); the same command again says the run folder is taken (not that the recording holds no episodes)."""
    import train as train_cli
    from agent.udacity.recordings import export_udacity
    from policies.checkpoint import load_checkpoint

    rec = tmp_path / "rec"
    export_udacity(udacity_drive, rec)
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


def test_a_dagger_lineage_in_the_replay_of_a_recording(udacity_drive, tmp_path, capsys):
    """python -m agent.training.dagger --replay on a raw simulator recording: it is imported once, round 0 trains
    on it, round 1's student drives the replay of the trained part only (0:0.8), the path controller labels it, and
    the next student fine-tunes on the recording plus those episodes; the summary names the command that judges
    every round on the held-out end."""
    from driving_data.dataset import open_dataset
    from agent.training.dagger import Lineage, Recipe, Round, main, run_lineage
    from agent.udacity.recordings import export_udacity

    rec = tmp_path / "rec"
    export_udacity(udacity_drive, rec)
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
    assert episode["driver"] == str(runs / "r0" / "best.pt") and episode["length"] <= 0.8 * DRIVE_STEPS
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
    assert tuned.name == "rec_from-udacity_sim2real_nac_s1"
    assert Path(plans[1].collects[0][0].out) == Path("data/dagger") / tuned.name / "r1"
    # --rounds: a finished lineage goes on with the recipe's last round repeated; fewer rounds stop early
    longer = plan_rounds(replace(lin, rounds=4), recipe["replay"], log=lambda m: None)
    assert [p.run_dir.name for p in longer] == ["r0", "r1", "r2", "r3", "r4"]
    assert longer[4].train.init == str(runs / "r3" / "best.pt") and longer[4].train.lr == 5e-4
    assert len(longer[4].train.data) == 5
    assert longer[2].train == plan_rounds(lin, recipe["replay"], lambda m: None)[2].train
    assert len(plan_rounds(replace(lin, rounds=1), recipe["replay"], log=lambda m: None)) == 2
    # --noise: the rounds' students drive with DART noise on their steering (held 3 frames); round 0 collects nothing
    noisy = plan_rounds(replace(lin, noise=0.1), recipe["replay"], log=lambda m: None)
    assert (noisy[1].collects[0][0].noise, noisy[1].collects[0][0].noise_hold) == (0.1, 3) and noisy[0].collects == []
    assert "--noise 0.1 --noise-hold 3" in _command("collect.py", noisy[2].collects[0][0])
    assert plan_rounds(lin, recipe["replay"], log=lambda m: None)[1].collects[0][0].noise is None

    for argv, needle in ([["--replay", str(rec), "--recipe", "long"], "give --recipe replay with --replay"],
                         [["--replay", str(rec), "--init", "nothing.pt"], "--init 'nothing.pt' is not a file"],
                         [["--recipe", "replay"], "give --replay REC"],
                         [["--rehearsal", str(rec)], "--rehearsal trains beside a recording: give --replay"],
                         [["--replay", str(rec), "--rounds", "0"], "--rounds must be an integer >= 1"],
                         [["--replay", str(rec), "--noise", "-0.1"], "--noise must be a number >= 0"],
                         [["--replay", str(tmp_path / "nowhere")], "is not a folder"]):
        assert main([*argv, "--out", str(tmp_path / "x")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0], err
    assert not (tmp_path / "x").exists()


def test_the_fine_tune_recipe_is_the_readme_fine_tune_then_one_round_in_the_replay(udacity_drive, tmp_path, capsys,
                                                                                   monkeypatch):
    """--recipe fine-tune: round 0 fine-tunes --init (5 epochs at lr 5e-4, best.pt blended half and half with it),
    round 1 drives the replay of the trained part and fine-tunes the blend, blended half and half with it in turn
    (--round-blend W sets that share)."""
    from dataclasses import replace

    from agent.training.dagger import Lineage, main, plan_rounds

    lin = Lineage(recording=str(udacity_drive), init="checkpoints/udacity_real_nac.pt", recipe="fine-tune", seed=2,
                  data=str(tmp_path / "data"), out=str(tmp_path / "runs"), progress=False)
    plans = plan_rounds(lin, lin.validate(), log=lambda m: None)
    first, second = plans[0].train, plans[1].train
    assert (first.init, first.epochs, first.lr, first.blend_init) == ("checkpoints/udacity_real_nac.pt", 5, 5e-4, 0.5)
    assert first.split == "blocks" and first.val_fraction == 0.2 and plans[0].collects == []
    assert (second.init, second.lr, second.blend_init) == (str(tmp_path / "runs" / "r0" / "best.pt"), 5e-4, 0.5)
    assert len(plans) == 2 and plans[1].collects[0][0].replay_span == "0:0.8"
    assert lin.name.endswith("_fine-tune_from-udacity_real_nac_s2")  # not the replay recipe's folders
    unblended = plan_rounds(replace(lin, round_blend=1.0), lin.validate(), log=lambda m: None)
    assert unblended[1].train.blend_init == 1.0 and unblended[0].train == first
    # --rehearsal: every round trains the other folders beside the recording; the rounds drive its replay only
    other = tmp_path / "other"
    other.mkdir()
    (other / "dataset.json").write_text("{}")
    rehearsed = plan_rounds(replace(lin, rehearsal=[str(other)]), lin.validate(), log=lambda m: None)
    assert rehearsed[0].train.data == [first.data, str(other.resolve())]
    assert rehearsed[1].train.data == [*second.data, str(other.resolve())]
    assert [c.env for c, _ in rehearsed[1].collects] == [c.env for c, _ in plans[1].collects]
    # the lineage's summary judges the recording's held-out end, not the rehearsal folders
    from types import SimpleNamespace

    from agent.data import collection
    from agent.training import config, dagger, experiment

    monkeypatch.setattr(experiment, "finished", lambda run: False)
    monkeypatch.setattr(experiment, "run", lambda plan: None)
    monkeypatch.setattr(config, "resolve", lambda args: args)
    monkeypatch.setattr(collection, "collect", lambda *a, **k: SimpleNamespace(interrupted=False))
    summary = dagger.run_lineage(replace(lin, rehearsal=[str(other)]), log=lambda m: None)
    assert summary["evaluate"].startswith(f"python evaluate.py --replay {first.data} --replay-span 0.8:1")
    for argv, needle in ([["--recipe", "fine-tune"], "fine-tunes a student to the recording: give --init"],
                         [["--init", "checkpoints/udacity_real_nac.pt", "--rehearsal", str(tmp_path)],
                          "is not a dataset folder"],
                         [["--init", "checkpoints/udacity_real_nac.pt", "--recipe", "fine-tune", "--round-blend",
                           "0"], "--round-blend must be a share in (0, 1]"]):
        assert main(["--replay", str(udacity_drive), *argv, "--out", str(tmp_path / "x")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0], err
    assert not (tmp_path / "x").exists()


def test_a_student_of_other_frames_never_drives_the_replay(udacity_drive, tmp_path, capsys):
    from tests.helpers import steering_checkpoint

    ckpt = steering_checkpoint(tmp_path / "big.pt", frame_shape=[480, 640, 3])
    assert evaluate_cli.main(["--replay", str(udacity_drive), "--checkpoint", str(ckpt), "--out", str(tmp_path / "e"),
                              "--workers", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and ("was trained on 480x640x3 frames; the camera frames of replay:" in err[0]
                              and "are 160x320x3" in err[0]), err


def test_a_full_disk_while_plotting_the_path_keeps_the_scores_in_one_line(udacity_drive, tmp_path, monkeypatch, capsys):
    from tests.helpers import full_disk

    full_disk(monkeypatch, ".part_0.png.")
    out = tmp_path / "e"
    assert evaluate_cli.main(["--replay", str(udacity_drive), "--expert-drives", "--out", str(out), "--workers", "1",
                              "--no-video", "--no-tensorboard", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: no space left on the disk while writing {str(out / 'paths' / 'part_0.png')!r}; free some "
                   "space and run the command again"], err
    assert json.loads((out / "metrics.json").read_text())["autonomy"] == 100.0 and (out / "episodes.csv").is_file()
