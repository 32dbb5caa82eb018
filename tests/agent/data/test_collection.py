"""collect.py: real env + shipped experts; frames replay exactly, DART labels, interruption, append, errors, Minari."""
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import collect as collect_cli
from agent.data.collection import collect
from agent.data.config import DEFAULT_SEED, CollectConfig, CollectError
from agent.data.recorder import DartNoise, record_episode
from agent.experts.expert import Expert
from common.files import REPO_ROOT
from driving_data.dataset import CARD_NAME, open_dataset, temp_files
from envs.carracing import FEATURE_NAMES, N_FEATURES, make_carracing
from envs.carracing import SPEC as CARRACING
from tests.helpers import constant_policy_checkpoint

DEFAULT_EXPERT_PATHS = CARRACING.default_expert

STEPS = 30


def _collect(out, **kw):
    kw.setdefault("max_steps", STEPS)
    kw.setdefault("workers", 1)  # this process (tests/agent/test_workers.py runs the worker processes)
    return collect(CollectConfig(out=Path(out), progress=False, **kw), log=lambda m: None)


@pytest.fixture(scope="module")
def continuous_ds(tmp_path_factory):
    out = tmp_path_factory.mktemp("cont") / "data"
    res = _collect(out, episodes=2, noise=0.3, noise_hold=2)
    return out, res


# ----------------------------------------------------------------------------------------------- noise model
def test_dart_noise_continuous_and_discrete():
    label = np.array([0.1, 0.6, 0.0], dtype=np.float32)
    assert DartNoise("continuous", 0.0, 1, seed=1)(0, label) is label
    noise = DartNoise("continuous", 0.3, 4, seed=1)
    out = np.array([noise(t, label) for t in range(400)])
    assert np.all(out[:, 0] >= -1) and np.all(out[:, 0] <= 1) and np.all(out[:, 1:] >= 0) and np.all(out[:, 1:] <= 1)
    assert not np.any((out[:, 1] > 0) & (out[:, 2] > 0)), "gas and brake are never pressed together"
    assert np.all(out[0:4] == out[0]) and not np.all(out[4] == out[0]), "one noise sample is held noise_hold frames"
    assert 0.2 < np.std(out[::4, 0]) < 0.4  # steer noise has the requested scale

    assert all(DartNoise("discrete", 0.0, 1, seed=2)(t, 3) == 3 for t in range(50))
    assert all(DartNoise("discrete", 1.0, 1, seed=2)(t, 3) != 3 for t in range(200))
    noise = DartNoise("discrete", 0.3, 1, seed=2)
    acts = np.array([noise(t, 3) for t in range(3000)])
    assert 0.25 < np.mean(acts != 3) < 0.35
    assert set(acts[acts != 3]) == {0, 1, 2, 4}, "a random OTHER action, each of them"


class _FakeEnv:
    """State i has frame value i; the car drives for `moving` steps, then stands still (speed 0); in the states
    `backwards` holds it points against the course."""

    def __init__(self, moving, backwards=()):
        self.moving, self.backwards, self.i = moving, backwards, 0

    def _info(self):
        priv = np.zeros(N_FEATURES, np.float32)
        priv[9] = 1.0  # wheels_on_road
        priv[FEATURE_NAMES.index("cos_heading_error")] = -1.0 if self.i in self.backwards else 1.0
        return {"privileged": priv, "speed": 10.0 if 0 < self.i <= self.moving else 0.0,
                "lap_complete": False, "tiles_visited": self.i, "num_tiles": 300, "unvisited_tiles": "",
                "on_track": True}

    def reset(self, seed=None):
        self.i = 0
        return np.full((96, 96, 3), 0, np.uint8), self._info()

    def step(self, action):
        self.i += 1
        return np.full((96, 96, 3), self.i % 256, np.uint8), -0.1, False, self.i >= 1000, self._info()


class _FakeExpert:
    action_space = "continuous"
    spec = CARRACING

    def act(self, priv):
        return np.array([0.0, 1.0, 0.0], np.float32)


def test_stuck_car_ends_the_episode_and_the_stuck_stretch_is_cut():
    arrays, meta = record_episode(_FakeEnv(moving=20), _FakeExpert(), 0, DartNoise("continuous", 0.0, 1, 0))
    # States 1..20 move, state 21 is the first of the stopped stretch: keep steps 0..20, end at state 21.
    assert meta["stopped_early"] == "stuck" and meta["truncated"] and len(arrays["frames"]) == 21
    np.testing.assert_array_equal(arrays["frames"][:, 0, 0, 0], np.arange(21))
    assert arrays["final_frames"][0, 0, 0] == 21 and arrays["final_speed"] == 0.0
    np.testing.assert_allclose(meta["return"], -0.1 * 21, rtol=1e-5)
    arrays, meta = record_episode(_FakeEnv(moving=20), _FakeExpert(), 0, DartNoise("continuous", 0.0, 1, 0),
                                  early_stop=False)
    assert meta["stopped_early"] is None and len(arrays["frames"]) == 1000


def test_cut_wrong_way_ends_the_episode_after_one_second_backwards_and_drops_that_stretch():
    """--cut-wrong-way: 50 steps (1 s) pointing against the course end the episode; the backwards stretch is cut, so
    the last recorded state is the last one facing the right way. Off (the default), nothing ends the episode."""
    noise = DartNoise("continuous", 0.0, 1, 0)
    arrays, meta = record_episode(_FakeEnv(2000, range(30, 2000)), _FakeExpert(), 0, noise, cut_wrong_way=True)
    assert meta["stopped_early"] == "wrong_way" and meta["truncated"] and len(arrays["frames"]) == 30
    assert arrays["final_frames"][0, 0, 0] == 30
    arrays, meta = record_episode(_FakeEnv(2000, range(30, 2000)), _FakeExpert(), 0, noise)
    assert meta["stopped_early"] is None and len(arrays["frames"]) == 1000
    # 49 steps backwards (under 1 s), then the right way again: nothing is cut
    arrays, meta = record_episode(_FakeEnv(2000, range(30, 79)), _FakeExpert(), 0, noise, cut_wrong_way=True)
    assert meta["stopped_early"] is None and len(arrays["frames"]) == 1000


# ----------------------------------------------------------------------------------------------- recording
def test_frames_replay_exactly_and_labels_are_the_experts(continuous_ds):
    out, res = continuous_ds
    ds = open_dataset(out)
    assert len(ds) == 2 and res.episodes_added == 2 and not res.interrupted
    expert = Expert.load(None, "continuous")
    for i, meta in enumerate(ds.episodes):
        assert meta["episode_id"] == i and meta["track_seed"] == DEFAULT_SEED + i
        ep = ds.load(i)
        T = meta["length"]
        assert T == STEPS and meta["truncated"] and not meta["terminated"]
        assert ep["frames"].shape == (T, 96, 96, 3) and ep["frames"].dtype == np.uint8
        assert ep["action"].shape == ep["expert_action"].shape == (T, 3)
        assert ep["action"].dtype == ep["expert_action"].dtype == np.float32
        assert ep["privileged"].shape == (T, N_FEATURES) and ep["reward"].dtype == np.float32
        np.testing.assert_allclose(ep["time"], np.arange(T) * 0.02)
        assert "expert_probs" not in ep
        # Replay the executed actions on the same track in a fresh env: identical frames and rewards.
        env = make_carracing("continuous", render=True, max_episode_steps=STEPS)
        obs, info = env.reset(seed=meta["track_seed"])
        for t in range(T):
            np.testing.assert_array_equal(ep["frames"][t], obs, err_msg=f"frame {t} of episode {i}")
            np.testing.assert_array_equal(ep["privileged"][t], info["privileged"])
            # The label is the expert's action on the state actually visited.
            np.testing.assert_allclose(ep["expert_action"][t], expert.act(info["privileged"]), atol=1e-6)
            obs, r, term, trunc, info = env.step(ep["action"][t])
            assert ep["reward"][t] == np.float32(r)
        np.testing.assert_array_equal(ep["final_frames"], obs)
        env.close()
        # DART: noise > 0 makes the executed action differ from the label.
        assert np.any(np.abs(ep["action"] - ep["expert_action"]) > 1e-3)
        assert meta["perturbed_fraction"] > 0.5


def test_card_is_consistent_with_the_files(continuous_ds):
    out, _ = continuous_ds
    card = json.loads((out / "dataset.json").read_text())
    ds = open_dataset(out)
    assert card["counts"]["episodes"] == 2 and card["counts"]["steps"] == ds.num_steps == 2 * STEPS
    assert card["action_space"] == "continuous" and card["config"]["seed"] == DEFAULT_SEED
    assert card["config"]["noise"] == 0.3 and card["expert"]["sha256"] and card["expert"]["evaluation"]
    assert [e["track_seed"] for e in card["episodes"]] == [DEFAULT_SEED, DEFAULT_SEED + 1]
    np.testing.assert_allclose(card["returns"]["mean"], np.mean([m["return"] for m in ds.episodes]))
    hist = card["action_histogram"]
    assert sum(hist["label"]["steer_counts"]) == sum(hist["executed"]["steer_counts"]) == 2 * STEPS
    assert card["counts"]["laps_finished"] == 0  # 30 steps never finish a lap
    steer_noise = np.mean([np.abs(e["action"][:, 0] - e["expert_action"][:, 0]).mean() for e in map(ds.load, range(2))])
    np.testing.assert_allclose(card["counts"]["mean_abs_noise"][0], steer_noise, rtol=1e-3)
    assert len(card["runs"]) == 1 and card["runs"][0]["episodes_added"] == 2


def test_discrete_noise_zero_executes_the_label(tmp_path, capsys):
    """Through the CLI, with the Minari export of a discrete dataset when h5py is there."""
    argv = ["--action-space", "discrete", "--episodes", "1", "--noise", "0", "--max-steps", "25",
            "--out", str(tmp_path / "d"), "--no-progress"]
    export = importlib.util.find_spec("h5py") is not None
    if export:
        argv += ["--export-minari", "carracing/disc-v0", "--minari-path", str(tmp_path / "minari")]
    assert collect_cli.main(argv) == 0
    assert "saved 1 new episode(s) (25 steps" in capsys.readouterr().out
    ds = open_dataset(tmp_path / "d")
    ep = ds.load(0)
    assert ep["action"].dtype == ep["expert_action"].dtype == np.int64 and ep["action"].shape == (25,)
    np.testing.assert_array_equal(ep["action"], ep["expert_action"])
    assert ep["expert_probs"].shape == (25, 5) and ep["expert_probs"].dtype == np.float32
    np.testing.assert_allclose(ep["expert_probs"].sum(1), 1, atol=1e-5)
    np.testing.assert_array_equal(ep["expert_probs"].argmax(1), ep["expert_action"])
    assert ds.episodes[0]["perturbed_fraction"] == 0
    card = ds.card
    assert sum(card["action_histogram"]["label"]) == 25
    assert card["action_histogram"]["label"] == card["action_histogram"]["executed"]
    assert card["runs"][0]["command"].startswith("python collect.py --action-space discrete")
    if export:
        from agent.data.minari_export import load_minari

        m = load_minari("carracing/disc-v0", tmp_path / "minari")
        e = m[0]
        np.testing.assert_array_equal(e.actions, ep["action"])
        assert m.action_space.n == 5 and e.infos["expert_probs"].shape == (26, 5)


# ----------------------------------------------------------------------------------------------- resume
def test_rerun_appends_and_refuses_incompatible(tmp_path, monkeypatch):
    out = tmp_path / "d"
    _collect(out, episodes=1, max_steps=10)
    (out / "episodes" / ".episode_00001.npz.x.tmp").write_bytes(b"half a file from a SIGKILL")
    res = _collect(out, episodes=1, max_steps=10)
    ds = open_dataset(out)
    assert [m["episode_id"] for m in ds.episodes] == [0, 1] and res.episodes_total == 2
    assert [m["track_seed"] for m in ds.episodes] == [DEFAULT_SEED, DEFAULT_SEED + 1]
    assert not temp_files(out), "stale temp files are removed"
    assert len(ds.card["runs"]) == 2 and ds.card["counts"]["episodes"] == 2
    with pytest.raises(CollectError, match="action_space='continuous'"):
        _collect(out, action_space="discrete", episodes=1)
    with pytest.raises(CollectError, match="--seed 5"):
        _collect(out, episodes=1, seed=5)
    import agent.data.card as card

    monkeypatch.setattr(card, "file_sha256", lambda path: "f" * 64)  # as if the expert were retrained
    with pytest.raises(CollectError, match="different expert"):
        _collect(out, episodes=1)
    monkeypatch.undo()
    assert len(open_dataset(out)) == 2, "refused runs add nothing"
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("not a dataset")
    with pytest.raises(CollectError, match="not a collect.py dataset"):
        _collect(tmp_path / "other", episodes=1)


def test_exception_mid_run_keeps_finished_episodes(tmp_path, monkeypatch):
    """An exception in episode 2 (here Ctrl-C, injected mid-episode) drops only that episode."""
    import agent.data.collection as collection

    real = collection.record_episode
    calls = {"n": 0}

    def flaky(env, expert, seed, noise, **kw):
        calls["n"] += 1
        if calls["n"] == 2:
            env.reset(seed=seed)
            raise KeyboardInterrupt
        return real(env, expert, seed, noise, **kw)

    monkeypatch.setattr(collection, "record_episode", flaky)
    res = _collect(tmp_path / "d", episodes=3, max_steps=10)
    assert res.interrupted and res.episodes_added == 1 and "interrupted" in res.summary()
    ds = open_dataset(tmp_path / "d")
    assert len(ds) == 1 and ds.card["counts"]["episodes"] == 1 and ds.card["runs"][-1]["interrupted"]
    assert not temp_files(tmp_path / "d")


def test_a_full_disk_ends_collect_in_one_line_and_keeps_the_saved_episodes(tmp_path, monkeypatch, capsys):
    from tests.helpers import full_disk

    out = tmp_path / "d"
    argv = ["--max-steps", "10", "--workers", "1", "--out", str(out), "--no-progress"]
    with monkeypatch.context() as m:
        full_disk(m, ".episode_00001.npz.")
        assert collect_cli.main(["--episodes", "2", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == ("error: no space left on the disk while writing "
                       f"{str(out / 'episodes' / 'episode_00001.npz')!r}; "
                       "free some space and run the command again"), err
    assert "Traceback" not in "\n".join(err)
    assert len(open_dataset(out)) == 1 and not temp_files(out), "the saved episode stays, no half file"
    assert collect_cli.main(["--episodes", "1", *argv]) == 0  # a re-run appends where it stopped
    assert [m["episode_id"] for m in open_dataset(out).episodes] == [0, 1]


def test_killed_cli_leaves_readable_data(tmp_path):
    out = tmp_path / "d"
    cmd = [sys.executable, "collect.py", "--episodes", "500", "--max-steps", "40", "--out", str(out), "--no-progress",
           "--workers", "1", "--renderer", "fast"]
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while not (out / "episodes" / "episode_00000.npz").exists():
            assert proc.poll() is None and time.time() < deadline, proc.communicate()
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    assert "interrupted: saved" in stdout and "Traceback" not in stderr
    ds = open_dataset(out)
    assert 1 <= len(ds) < 500 and ds.card["counts"]["episodes"] == len(ds)
    for i in range(len(ds)):
        assert ds.load(i)["frames"].shape == (40, 96, 96, 3)
    assert not temp_files(out)


# ----------------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    "argv, message",
    [
        (["--env", "doom"], "or replay:FOLDER (a dataset replayed)"),
        (["--action-space", "hybrid"], "--action-space must be one of"),
        (["--episodes", "0"], "--episodes must be >= 1"),
        (["--noise", "-0.1"], "--noise must be a finite number >= 0"),
        (["--action-space", "discrete", "--noise", "1.5"], "probability"),
        (["--expert", "no/such/expert.zip"], "--expert file not found"),
        (["--out", "README.md"], "is a file"),
        (["--action-space", "discrete", "--expert", str(DEFAULT_EXPERT_PATHS["continuous"])], "'continuous' expert"),
    ],
)
def test_bad_arguments_give_one_line_errors(argv, message, capsys, tmp_path):
    cwd = os.getcwd()
    os.chdir(REPO_ROOT)
    try:
        if "--out" not in argv:
            argv = [*argv, "--out", str(tmp_path / "d")]
        assert collect_cli.main(argv) == 2
    finally:
        os.chdir(cwd)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert not (tmp_path / "d").exists(), "a refused run creates nothing"


def test_cli_errors_without_traceback(tmp_path):
    r = subprocess.run([sys.executable, "collect.py", "--episodes", "abc", "--out", str(tmp_path / "d")],
                       cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.startswith("error: ") and "Traceback" not in r.stderr, r.stderr
    assert "--episodes" in r.stderr and len(r.stderr.strip().splitlines()) == 1


# ----------------------------------------------------------------------------------------------- Minari
def test_minari_export_roundtrip(continuous_ds, tmp_path):
    pytest.importorskip("h5py", reason="Minari 0.5 stores datasets with h5py (pip install 'minari[hdf5]')")
    from agent.data.minari_export import export_minari, load_minari

    out, _ = continuous_ds
    before = os.environ.get("MINARI_DATASETS_PATH")
    path = export_minari(out, "carracing/test-v0", datasets_path=tmp_path / "minari")
    assert os.environ.get("MINARI_DATASETS_PATH") == before, "the export must not leak its datasets path"
    assert path.is_dir() and tmp_path / "minari" in path.parents
    m = load_minari("carracing/test-v0", tmp_path / "minari")
    ds = open_dataset(out)
    assert m.total_episodes == 2 and m.total_steps == ds.num_steps
    for i, e in enumerate(m.iterate_episodes()):
        ep = ds.load(i)
        np.testing.assert_array_equal(e.actions, ep["action"])
        np.testing.assert_array_equal(e.observations[:-1], ep["frames"])  # lossless by default
        np.testing.assert_array_equal(e.observations[-1], ep["final_frames"])
        np.testing.assert_array_equal(e.infos["expert_action"][:-1], ep["expert_action"])
        np.testing.assert_allclose(e.rewards, ep["reward"])
        assert e.truncations[-1] and not e.truncations[:-1].any() and not e.terminations.any()
    with pytest.raises(ValueError, match="already exists"):
        export_minari(out, "carracing/test-v0", datasets_path=tmp_path / "minari")
    with pytest.raises(ValueError, match="must look like"):
        export_minari(out, "no version", datasets_path=tmp_path / "minari")


def test_minari_cli_errors(tmp_path, capsys):
    from agent.data.minari_export import main

    assert main([str(tmp_path / "missing"), "carracing/y-v0"]) == 2
    assert capsys.readouterr().err.startswith("error: dataset folder")


def test_second_collector_into_the_same_folder_is_refused(tmp_path):
    from common.files import folder_lock

    with folder_lock(tmp_path / "d"):
        with pytest.raises(ValueError, match="another collect.py is writing"):
            _collect(tmp_path / "d", episodes=1, max_steps=5)
    assert _collect(tmp_path / "d", episodes=1, max_steps=5).episodes_added == 1, "the lock dies with its holder"


# ----------------------------------------------------------------------------------------------- DAgger
@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_dagger_driver_executes_its_actions_and_expert_labels_every_state(tmp_path, beta):
    driver = constant_policy_checkpoint(tmp_path / "const.pt")
    out = tmp_path / "d"
    _collect(out, episodes=1, noise=0.0, driver=driver, beta=beta, max_steps=60, early_stop=False)
    ds = open_dataset(out)
    ep, meta = ds.load(0), ds.episodes[0]
    student = np.array([0.3, 0.2, 0.0], np.float32)
    by_student = np.all(np.isclose(ep["action"], student, atol=1e-6), axis=1)
    by_expert = np.all(ep["action"] == ep["expert_action"], axis=1)
    assert np.all(by_student | by_expert), "every executed action is the driver's or the expert's"
    expert = Expert.load(None, "continuous")
    relabel = np.array([expert.act(p) for p in ep["privileged"]])
    np.testing.assert_allclose(ep["expert_action"], relabel, atol=1e-6)  # labels: the expert on the visited state
    assert meta["driver"] == str(driver) and len(meta["driver_sha256"]) == 64 and meta["beta"] == beta
    frac = meta["expert_driven_fraction"]
    if beta == 0.0:
        assert by_student.all() and frac == 0.0
    elif beta == 1.0:
        assert by_expert.all() and frac == 1.0
    else:
        assert 0.2 < frac < 0.8 and by_student.any() and by_expert.any()
    card = json.loads((out / CARD_NAME).read_text())
    assert card["runs"][-1]["driver"] == str(driver) and card["runs"][-1]["beta"] == beta
    assert card["counts"]["driven_by"] == {"expert": 0, "student": 1} and card["episodes"][0]["driver"] == str(driver)


def test_a_discrete_driver_picks_its_actions_by_its_checkpoints_rule_unless_told(tmp_path):
    """A student trained to sample at temperature 1.5 (train.py --discrete-actions sample --action-temperature 1.5)
    samples so as a DAgger driver; the run and its episodes say so; --driver-temperature replaces the temperature;
    --driver-actions argmax overrides both (uniform logits: argmax is always the same action)."""
    driver = constant_policy_checkpoint(tmp_path / "u.pt", action_space="discrete", discrete_actions="sample",
                                        action_temperature=1.5)
    runs = {"own": {}, "hot": {"driver_temperature": 2.0}, "told": {"driver_actions": "argmax"}}
    for name, kw in runs.items():
        _collect(tmp_path / name, episodes=1, noise=0.0, driver=driver, max_steps=40, early_stop=False,
                 action_space="discrete", **kw)
    own, hot, told = (open_dataset(tmp_path / n) for n in runs)
    assert len(set(own.load(0)["action"].tolist())) >= 3 and len(set(told.load(0)["action"].tolist())) == 1
    assert own.episodes[0]["driver_actions"] == "sample" and "driver_actions" not in told.episodes[0]
    assert own.episodes[0]["driver_temperature"] == 1.5 and hot.episodes[0]["driver_temperature"] == 2.0
    assert "driver_temperature" not in told.episodes[0]
    card = json.loads((tmp_path / "own" / CARD_NAME).read_text())
    assert card["runs"][-1]["driver_actions"] == "sample" and card["runs"][-1]["driver_temperature"] == 1.5


def test_dagger_bad_arguments_are_clear_errors(tmp_path, capsys):
    disc = constant_policy_checkpoint(tmp_path / "disc.pt", action_space="discrete")
    constant_policy_checkpoint(tmp_path / "cont.pt")
    cases = [
        (["--beta", "0.5"], "give --driver CKPT too"),
        (["--driver", str(tmp_path / "nope.pt")], "--driver file not found"),
        (["--driver", str(disc), "--beta", "1.5"], "--beta is a probability"),
        (["--driver", str(disc)], "'discrete' action space"),
        (["--driver-actions", "sample"], "give --driver CKPT too"),
        (["--cut-wrong-way", "--recovery-labels"], "choose one"),
        (["--driver", str(tmp_path / "cont.pt"), "--driver-actions", "sample"],
         "--driver-actions sample is for discrete students"),
        (["--driver-temperature", "1.5"], "give --driver CKPT too"),
        (["--driver", str(tmp_path / "cont.pt"), "--driver-temperature", "1.5"],
         "--driver-temperature is for discrete students"),
        (["--driver", str(disc), "--action-space", "discrete", "--driver-temperature", "1.5"],
         "only the sample and dither rules"),
        (["--driver", str(disc), "--action-space", "discrete", "--driver-temperature", "0"], "must be a number > 0"),
        (["--driver", str(disc), "--action-space", "discrete", "--driver-actions", "argmax",
          "--driver-temperature", "2"], "argmax takes the likeliest action"),
    ]
    for argv, message in cases:
        assert collect_cli.main([*argv, "--out", str(tmp_path / "d"), "--no-progress"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], (argv, err)
        assert not (tmp_path / "d").exists(), "a refused run creates nothing"


def test_appending_takes_the_datasets_action_space(tmp_path):
    """A DAgger round on a discrete dataset needs no --action-space: the card names it."""
    from agent.data.config import CollectConfig

    out = tmp_path / "disc"
    out.mkdir()
    (out / CARD_NAME).write_text(json.dumps({"env": "carracing", "action_space": "discrete"}))
    cfg = CollectConfig(out=str(out))
    cfg.validate()
    assert cfg.action_space == "discrete"
    fresh = CollectConfig(out=str(tmp_path / "new"))
    fresh.validate()
    assert fresh.action_space == "continuous"


# ----------------------------------------------------------------------------------------------- recovery labels
def _check_labels(ep, space):
    """Every label is the recovery teacher's where it needs() the state, else the expert's; label_source says so."""
    from envs.carracing import RecoveryDriver

    teacher, expert = RecoveryDriver(), Expert.load(None, space)
    needs = np.array([teacher.needs(p) for p in ep["privileged"]])
    np.testing.assert_array_equal(ep["label_source"], needs.astype(np.uint8))
    assert ep["label_source"].dtype == np.uint8 and needs.any() and not needs.all()
    for p, label, source in zip(ep["privileged"], ep["expert_action"], ep["label_source"]):
        want = teacher.env_action(p, space) if source else expert.act(p)
        np.testing.assert_allclose(label, want, atol=1e-6)


def test_recovery_labels_and_start_in_expert_data(tmp_path):
    """Discrete, the expert drives from a recovery start (track 3000000 draws one turned 113 degrees): the
    recovery teacher labels (and so drives) until the car points along the course; its probabilities are one-hot;
    the start replays from the meta's reset options; the card counts it all."""
    out = tmp_path / "d"
    _collect(out, episodes=1, action_space="discrete", noise=0.0, max_steps=150, early_stop=False,
             recovery_labels=True, recovery_starts=1.0, renderer="fast")
    ds = open_dataset(out)
    ep, meta = ds.load(0), ds.episodes[0]
    _check_labels(ep, "discrete")
    rec = ep["label_source"] == 1
    assert rec[0] and meta["recovery_labels"] and meta["recovery_label_steps"] == int(rec.sum())
    np.testing.assert_array_equal(ep["expert_probs"][rec], np.eye(5, dtype=np.float32)[ep["expert_action"][rec]])
    np.testing.assert_array_equal(ep["action"], ep["expert_action"])  # noise 0: the labeller drives
    assert set(meta["start"]) == {"start_fraction", "start_turn", "start_offset"}
    assert abs(meta["start"]["start_turn"]) > 1.9
    env = make_carracing("discrete", render=True, max_episode_steps=150, renderer="fast")
    obs, info = env.reset(seed=meta["track_seed"], options=meta["start"])
    np.testing.assert_array_equal(ep["frames"][0], obs)
    np.testing.assert_array_equal(ep["privileged"][0], info["privileged"])
    card = json.loads((out / CARD_NAME).read_text())
    assert card["counts"]["recovery_label_steps"] == int(rec.sum())
    assert card["counts"]["recovery_starts"] == card["counts"]["recovery_labelled_episodes"] == 1
    assert card["runs"][-1]["recovery_labels"] is True and card["runs"][-1]["recovery_starts"] == 1.0


def test_recovery_labels_in_a_dagger_round(tmp_path):
    """Continuous DAgger: the student (a constant right turn) drives from a recovery start; labels switch between
    the recovery teacher and the expert with the state, the student's actions are executed."""
    driver = constant_policy_checkpoint(tmp_path / "const.pt")
    out = tmp_path / "d"
    _collect(out, episodes=1, noise=0.0, driver=driver, max_steps=120, early_stop=False, recovery_labels=True,
             recovery_starts=1.0)
    ep = open_dataset(out).load(0)
    _check_labels(ep, "continuous")
    np.testing.assert_allclose(ep["action"], np.tile([0.3, 0.2, 0.0], (len(ep["action"]), 1)), atol=1e-6)


def test_without_the_options_nothing_changes(continuous_ds):
    out, _ = continuous_ds
    ds = open_dataset(out)
    assert "label_source" not in ds.load(0) and "recovery_labels" not in ds.episodes[0]
    card = json.loads((out / CARD_NAME).read_text())
    assert "recovery_label_steps" not in card["counts"] and "recovery_labels" not in card["runs"][-1]


@pytest.mark.parametrize("argv, message", [
    (["--env", "udacity", "--recovery-labels"], "--recovery-labels needs an env with a recovery teacher"),
    (["--recovery-starts", "1.5"], "--recovery-starts is a probability"),
    (["--env", "udacity", "--recovery-starts", "-0.5"], "--recovery-starts is a probability"),
])
def test_recovery_options_bad_arguments(argv, message, capsys, tmp_path):
    assert collect_cli.main([*argv, "--out", str(tmp_path / "d"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert not (tmp_path / "d").exists()


def test_recovery_starts_need_an_env_that_can_place_its_car():
    from dataclasses import replace

    from agent.data.config import CollectConfig, CollectError

    cfg = CollectConfig(env="udacity", recovery_starts=0.5)
    cfg._check_recovery(cfg.spec)  # the udacity envs can (envs.udacity.env.recovery_start)
    with pytest.raises(CollectError, match="--recovery-starts needs an env that can place its car"):
        cfg._check_recovery(replace(cfg.spec, recovery_start=None))


def test_datasets_of_the_older_format_name_open_and_unknown_formats_are_refused(tmp_path):
    """The card's format string changed its name, not its layout: old datasets still open; a foreign one is named."""
    import json

    from driving_data.dataset import FORMAT, READABLE_FORMATS, open_dataset
    from tests.envs.replay.test_spec import _carracing_like

    root = _carracing_like(tmp_path)
    for name in READABLE_FORMATS:
        (root / "dataset.json").write_text(json.dumps({"format": name, "env": "udacity"}))
        assert len(open_dataset(root)) == 1
    (root / "dataset.json").write_text(json.dumps({"format": "another tool v9"}))
    with pytest.raises(ValueError,
                       match=re.escape(f"names the format 'another tool v9'; this version reads '{FORMAT}'")):
        open_dataset(root)


def test_latency_steps_apply_each_chosen_action_that_many_steps_later(tmp_path):
    """Under --latency-steps D the recorded (applied) action at step t is the one chosen at t - D (the expert's
    label there, without noise); the first D apply the neutral action, and the label stays the expert's."""
    import collect
    from driving_data.dataset import open_dataset

    out = tmp_path / "late"
    assert collect.main(["--episodes", "1", "--max-steps", "40", "--noise", "0", "--latency-steps", "3", "--renderer",
                         "fast", "--workers", "1", "--out", str(out), "--no-progress", "--no-early-stop"]) == 0
    ds = open_dataset(out)
    arrays = ds.load(0, keys=["action", "expert_action"])
    np.testing.assert_array_equal(arrays["action"][3:], arrays["expert_action"][:-3])
    np.testing.assert_array_equal(arrays["action"][:3], np.zeros((3, 3), np.float32))
    assert ds.episodes[0]["latency_steps"] == 3


def test_a_latency_experts_labels_are_its_answers_to_the_recorded_queue(tmp_path):
    """Each label of the shipped latency expert is its answer shown the actions applied over the next D steps
    (driving_data.dataset.queued_actions), and not the same shown them one step later: the queue it was shown is
    recoverable from the recorded actions, which is what a student told its actions on their way trains on."""
    import collect
    from driving_data.dataset import open_dataset
    from driving_data.dataset import queued_actions

    expert_zip = REPO_ROOT / "checkpoints/expert_carracing_latency.zip"
    out = tmp_path / "data"
    assert collect.main(["--episodes", "1", "--max-steps", "40", "--latency-steps", "3", "--expert", str(expert_zip),
                         "--renderer", "fast", "--workers", "1", "--out", str(out), "--no-progress",
                         "--no-early-stop"]) == 0
    arrays = open_dataset(out).load(0, keys=["action", "expert_action", "privileged"])
    expert = Expert.load(expert_zip)
    steps = np.arange(5, len(arrays["action"]) - 4)
    for shift, same in ((0, True), (1, False)):
        queues = queued_actions(arrays["action"], steps + shift, np.full(len(steps), 3), 3)
        again = np.stack([expert.act(arrays["privileged"][t], 3, list(q)) for t, q in zip(steps, queues)])
        assert np.allclose(again, arrays["expert_action"][steps], atol=1e-6) == same, shift


def test_a_latency_expert_labels_for_when_the_action_lands(tmp_path, capsys):
    """With a latency expert (agent.experts.latency) each label is its answer shown the latency and the actions on
    their way, which are the ones applied over the next D steps; the episode says its labels need no hindsight."""
    import collect
    from common.files import file_sha256
    from driving_data.dataset import join_datasets, open_dataset
    from agent.experts.ppo import PPOTrainArgs, resolve, train
    from benchmarks.latency_labels import queue_dependence
    from envs.carracing import SPEC

    expert_zip = tmp_path / "late.zip"
    train(resolve(PPOTrainArgs(action_space="continuous", timesteps=64, out=expert_zip, n_envs=1, n_steps=64,
                               batch_size=64, eval_every=64, eval_episodes=1, card_episodes=1, max_steps=20,
                               logdir=tmp_path / "tb", init=SPEC.default_expert["continuous"], latency_steps="0:4")),
          log=lambda *_: None)
    out = tmp_path / "data"
    assert collect.main(["--episodes", "1", "--max-steps", "30", "--noise", "0", "--latency-steps", "3", "--expert",
                         str(expert_zip), "--renderer", "fast", "--workers", "1", "--out", str(out), "--no-progress",
                         "--no-early-stop"]) == 0
    ds = open_dataset(out)
    assert ds.episodes[0]["labels_land"] and ds.episodes[0]["latency_steps"] == 3
    expert = Expert.load(expert_zip)
    # how much of its labels the actions on their way set (benchmarks.latency_labels): a share of each variance
    shares = queue_dependence(expert, ds, states=5, every=1)
    assert list(shares) == ["steer", "gas", "brake"] and all(v >= 0 for v in shares.values())
    assert collect.main(["--episodes", "1", "--latency-steps", "5", "--expert", str(expert_zip), "--out",
                         str(tmp_path / "too_late"), "--no-progress"]) == 2
    assert "trained for up to 4 steps" in capsys.readouterr().err
    # it counts as the expert it was fine-tuned from: its rounds join that expert's (D = 0 labelled at once)
    assert ds.episodes[0]["expert_base_sha256"] == file_sha256(REPO_ROOT / SPEC.default_expert["continuous"])
    regular = tmp_path / "regular"
    assert collect.main(["--episodes", "1", "--max-steps", "20", "--renderer", "fast", "--workers", "1", "--out",
                         str(regular), "--no-progress", "--seed", "3000100"]) == 0
    assert len(join_datasets([regular, out])[1]) == 2
    with pytest.raises(ValueError, match="not labelled by a latency expert"):
        queue_dependence(expert, open_dataset(regular), states=5)
    other_zip = tmp_path / "other.zip"  # another regular expert (fine-tuned a little): its labels differ
    train(resolve(PPOTrainArgs(action_space="continuous", timesteps=64, out=other_zip, n_envs=1, n_steps=64,
                               batch_size=64, eval_every=64, eval_episodes=1, card_episodes=1, max_steps=20,
                               logdir=tmp_path / "tb", init=SPEC.default_expert["continuous"])), log=lambda *_: None)
    other = tmp_path / "other"
    assert collect.main(["--episodes", "1", "--max-steps", "20", "--renderer", "fast", "--workers", "1", "--out",
                         str(other), "--no-progress", "--expert", str(other_zip)]) == 0
    with pytest.raises(ValueError, match="in its expert"):
        join_datasets([regular, other])
    from benchmarks import latency_labels

    assert latency_labels.main([str(out), "--expert", str(other_zip)]) == 2
    assert "is not a latency expert" in capsys.readouterr().err
