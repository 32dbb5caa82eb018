"""Worker processes, renderers and shards: `--workers 2` records the dataset / metrics / videos of one process,
byte for byte; Ctrl-C and kill -9 keep every finished episode and a re-run completes the run; `--renderer fast`
draws the frames and is recorded; `--shard I/N` collects exactly its part of the run's seeds."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import collect as collect_cli
from agent.data.collection import collect
from agent.data.config import DEFAULT_SEED, CollectConfig, CollectError, shard_range
from driving_data.dataset import open_dataset, temp_files
from agent.evaluation.args import EvalArgs
from agent.evaluation.config import resolve
from agent.evaluation.evaluate import evaluate
from common.stops import Interrupted
from agent.workers import default_workers
from envs.carracing import make_carracing
from tests.helpers import constant_policy_checkpoint

REPO = Path(__file__).resolve().parents[2]
STEPS = 30
TIMING = ("collected_at", "wall_s", "wall_seconds", "latency", "command", "created", "started", "workers",
          "steps_per_s")


def _collect(out: Path, **kw):
    kw.setdefault("max_steps", STEPS)
    return collect(CollectConfig(out=out, progress=False, **kw), log=lambda m: None)


def _untimed(x):
    """x without its timings (and the worker count): what must not depend on how many processes ran."""
    if isinstance(x, dict):
        return {k: _untimed(v) for k, v in x.items() if not any(t in k for t in TIMING)}
    if isinstance(x, list):
        return [_untimed(v) for v in x]
    return x


def _same_episodes(a: Path, b: Path, ids_a=None, ids_b=None) -> None:
    da, db = open_dataset(a), open_dataset(b)
    ia = list(range(len(da))) if ids_a is None else ids_a
    ib = list(range(len(db))) if ids_b is None else ids_b
    assert len(ia) == len(ib)
    for i, j in zip(ia, ib):
        ea, eb = da.load(i), db.load(j)
        assert sorted(ea) == sorted(eb)
        for k in ea:
            assert ea[k].dtype == eb[k].dtype and ea[k].tobytes() == eb[k].tobytes(), (i, j, k)
        ma = {k: v for k, v in da.episodes[i].items() if k != "episode_id"}
        mb = {k: v for k, v in db.episodes[j].items() if k != "episode_id"}
        assert _untimed(ma) == _untimed(mb)


@pytest.fixture(scope="module")
def dagger(tmp_path_factory):
    """The same 3 DAgger episodes (a constant student drives, the expert takes over with probability 0.5, DART
    noise on top) recorded by this process alone: the reference the worker processes must reproduce."""
    d = tmp_path_factory.mktemp("par")
    driver = constant_policy_checkpoint(d / "const.pt")
    kw = dict(episodes=3, driver=driver, beta=0.5, noise=0.2)
    res = _collect(d / "serial", workers=1, **kw)
    assert res.episodes_added == 3 and res.workers == 1
    return d, kw


def test_default_workers_follow_cores_episodes_and_threads(monkeypatch):
    import agent.workers as workers

    monkeypatch.setattr(workers, "usable_cores", lambda: 16)
    assert default_workers(100) == 8 and default_workers(3) == 3 and default_workers(100, threads=4) == 4
    monkeypatch.setattr(workers, "usable_cores", lambda: 1)
    assert default_workers(100) == 1 and default_workers(0) == 1


# ----------------------------------------------------------------------------- collection
def test_two_workers_record_the_serial_dataset(dagger):
    d, kw = dagger
    res = _collect(d / "parallel", workers=2, **kw)
    assert res.episodes_added == 3 and res.workers == 2 and not res.interrupted
    _same_episodes(d / "serial", d / "parallel")
    serial, parallel = (open_dataset(d / n).card for n in ("serial", "parallel"))
    assert _untimed({**serial, "runs": None}) == _untimed({**parallel, "runs": None})
    assert parallel["runs"][-1]["workers"] == 2 and parallel["counts"]["renderers"] == {"pygame": 3}
    fractions = [m["expert_driven_fraction"] for m in open_dataset(d / "parallel").episodes]
    assert all(0 < f < 1 for f in fractions), "the student drove part of every episode in the workers"


def test_interrupted_parallel_run_keeps_finished_episodes_and_a_rerun_completes_it(dagger):
    """Ctrl-C in the collector after its first saved episode: workers stop, their unfinished episodes are
    dropped, every finished one stays; the next run fills the holes first, giving the uninterrupted dataset."""
    d, kw = dagger
    out = d / "interrupted"

    def ctrl_c(episode_id):
        raise KeyboardInterrupt

    res = collect(CollectConfig(out=out, progress=False, workers=2, max_steps=STEPS, **kw), log=lambda m: None,
                  after_episode=ctrl_c)
    assert res.interrupted and res.episodes_added >= 1 and "interrupted: saved" in res.summary()
    ds = open_dataset(out)
    assert ds.card["counts"]["episodes"] == len(ds) == res.episodes_added and ds.card["runs"][-1]["interrupted"]
    assert not temp_files(out), "no half-written episode is left"
    first = [m["episode_id"] for m in ds.episodes]
    res = _collect(out, workers=1, **{**kw, "episodes": 3 - len(first)})
    ds = open_dataset(out)
    assert [m["episode_id"] for m in ds.episodes] == [0, 1, 2]
    assert [m["track_seed"] for m in ds.episodes] == [DEFAULT_SEED + i for i in range(3)]
    _same_episodes(d / "serial", out)


def _wait_for_episodes(out: Path, count: int, proc: subprocess.Popen, timeout: float = 180) -> None:
    """Until `count` episode files exist; any ids, since two workers finish their episodes in either order."""
    deadline = time.time() + timeout
    while len(list((out / "episodes").glob("episode_*.npz"))) < count:
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.1)


def test_ctrl_c_stops_a_parallel_cli_cleanly(tmp_path):
    """A terminal's Ctrl-C reaches the whole process group: collector, fork server and workers."""
    out = tmp_path / "d"
    cmd = [sys.executable, "collect.py", "--episodes", "200", "--max-steps", "30", "--out", str(out),
           "--no-progress", "--workers", "2", "--renderer", "fast"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        _wait_for_episodes(out, 2, proc)
        os.killpg(proc.pid, signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, stderr
    assert "interrupted: saved" in stdout and "(2 workers)" in stdout and "Traceback" not in stderr, stderr
    ds = open_dataset(out)
    assert 2 <= len(ds) < 200 and ds.card["counts"]["episodes"] == len(ds) and not temp_files(out)
    assert ds.card["counts"]["renderers"] == {"fast": len(ds)}
    assert all(ds.load(i)["frames"].shape == (30, 96, 96, 3) for i in range(len(ds)))


def _running_in_group(group: int) -> bool:
    """Whether a process of this process group is still running (a zombie no longer can write a file)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # it ended while we looked
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            return True
    return False


@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="reads process groups from /proc")
def test_kill_9_of_a_parallel_collector_keeps_finished_episodes(tmp_path):
    """SIGKILL gives no chance to clean up: the workers notice their collector is gone and quit, every
    episode file on disk is complete, and a re-run removes the leftovers and fills the holes."""
    out = tmp_path / "d"
    cmd = [sys.executable, "collect.py", "--episodes", "200", "--max-steps", "30", "--out", str(out),
           "--no-progress", "--workers", "2", "--renderer", "fast"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        _wait_for_episodes(out, 1, proc)
        proc.kill()
        proc.communicate(timeout=60)
        deadline = time.time() + 60
        while _running_in_group(proc.pid):  # a worker writing its file finishes it, then notices and quits
            assert time.time() < deadline, "the workers outlived their collector"
            time.sleep(0.1)
    finally:
        if _running_in_group(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
    ds = open_dataset(out)
    for i in range(len(ds)):
        assert ds.load(i)["frames"].shape == (30, 96, 96, 3)
    ids = [m["episode_id"] for m in ds.episodes]
    holes = sorted(set(range(max(ids) + 1)) - set(ids))
    res = _collect(out, workers=1, episodes=len(holes) + 1, max_steps=30, renderer="fast")
    assert res.episodes_added == len(holes) + 1
    ds = open_dataset(out)
    assert [m["episode_id"] for m in ds.episodes] == list(range(max(ids) + 2)) and not temp_files(out)
    assert ds.card["counts"]["episodes"] == len(ds)


# ----------------------------------------------------------------------------- shards
def test_shard_ranges_split_the_run_exactly():
    for episodes in (1, 2, 5, 7, 25, 100):
        for count in range(1, min(episodes, 6) + 1):
            parts = [shard_range(episodes, i, count) for i in range(1, count + 1)]
            assert [i for a, b in parts for i in range(a, b)] == list(range(episodes))
            assert max(b - a for a, b in parts) - min(b - a for a, b in parts) <= 1


def test_a_shard_records_its_part_of_the_run_and_a_rerun_completes_it(dagger, tmp_path, capsys):
    d, kw = dagger
    argv = ["--episodes", "3", "--shard", "2/2", "--max-steps", str(STEPS), "--driver", str(kw["driver"]),
            "--beta", "0.5", "--noise", "0.2", "--out", str(tmp_path / "run"), "--no-progress", "--workers", "1"]
    assert collect_cli.main(argv) == 0
    out = tmp_path / "run-shard-2-of-2"
    ds = open_dataset(out)
    # shard 2 of 2 of 3 episodes = episodes 1 and 2 of the run: seeds DEFAULT_SEED+1.., ids from 0 in its folder
    assert [m["track_seed"] for m in ds.episodes] == [DEFAULT_SEED + 1, DEFAULT_SEED + 2]
    assert ds.card["config"]["seed"] == DEFAULT_SEED + 1 and "2/2" in ds.card["runs"][-1]["shard"]
    _same_episodes(d / "serial", out, ids_a=[1, 2], ids_b=[0, 1])
    capsys.readouterr()
    assert collect_cli.main(argv) == 0
    assert "saved 0 new episode(s)" in capsys.readouterr().out and len(open_dataset(out)) == 2


@pytest.mark.parametrize("argv, message", [
    (["--shard", "0/3"], "1 <= I <= N"),
    (["--shard", "4/3"], "1 <= I <= N"),
    (["--shard", "half"], "--shard must look like I/N"),
    (["--shard", "2/4", "--episodes", "3"], "give --episodes >= 4"),
    (["--workers", "0"], "--workers must be an integer >= 1"),
    (["--renderer", "vulkan"], "--renderer must be one of ['pygame', 'fast'] for carracing"),
    (["--env", "udacity", "--renderer", "fast"], "--renderer must be one of ['native'] for udacity"),
])
def test_bad_parallel_arguments_are_one_line_errors(argv, message, tmp_path, capsys):
    try:
        code = collect_cli.main([*argv, "--out", str(tmp_path / "d"), "--no-progress"])
    except SystemExit as e:  # argparse's own errors
        code = e.code
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert not list(tmp_path.iterdir()), "a refused run creates nothing"


def test_a_shard_of_another_run_is_refused(tmp_path):
    _collect(tmp_path / "d-shard-1-of-2", episodes=1, max_steps=5, workers=1, renderer="fast")
    with pytest.raises(CollectError, match="shard 1/2 of this run starts at seed 5000000"):
        _collect(tmp_path / "d", episodes=4, shard="1/2", seed=5_000_000, max_steps=5, workers=1)


# ----------------------------------------------------------------------------- the fast renderer
def test_fast_renderer_frames_are_recorded_and_replay(tmp_path):
    res = _collect(tmp_path / "d", episodes=1, max_steps=20, workers=1, renderer="fast", noise=0)
    ds = open_dataset(res.out)
    assert ds.episodes[0]["renderer"] == "fast" and ds.card["counts"]["renderers"] == {"fast": 1}
    assert ds.card["runs"][-1]["renderer"] == "fast" and ds.card["episodes"][0]["renderer"] == "fast"
    ep = ds.load(0)
    fast = make_carracing("continuous", max_episode_steps=20, renderer="fast")
    pygame = make_carracing("continuous", max_episode_steps=20)
    a, _ = fast.reset(seed=DEFAULT_SEED)
    b, _ = pygame.reset(seed=DEFAULT_SEED)
    fast.close(), pygame.close()
    np.testing.assert_array_equal(ep["frames"][0], a)
    assert 0 < np.abs(ep["frames"][0].astype(int) - b).mean() < 2, "the fast frame is close to, not equal to, pygame's"


# ----------------------------------------------------------------------------- evaluation
@pytest.fixture(scope="module")
def student(tmp_path_factory) -> Path:
    import torch

    from policies.config import PolicyConfig
    from policies.checkpoint import save_checkpoint
    from policies.policy import DrivingPolicy

    torch.manual_seed(0)
    config = PolicyConfig.for_actions("continuous", core_options=dict(d_model=16, heads=4, topk=4), window=4,
                                      frame_stride=2, feature_dim=16)
    return save_checkpoint(tmp_path_factory.mktemp("ckpt") / "nac.pt", DrivingPolicy(config))


def test_two_workers_give_the_serial_metrics_and_videos(student, tmp_path):
    common = dict(checkpoint=[str(student)], with_expert=True, episodes=2, max_steps=25, seed=1234, video_episodes=2,
                  progress=False, tensorboard=False, renderer="fast")
    serial = evaluate(resolve(EvalArgs(out=str(tmp_path / "s"), workers=1, **common)))
    parallel = evaluate(resolve(EvalArgs(out=str(tmp_path / "p"), workers=2, **common)))
    assert list(parallel) == list(serial) == ["nac", "expert"]
    for name in serial:
        a, b = (json.loads((tmp_path / run / name / "metrics.json").read_text()) for run in ("s", "p"))
        assert b["workers"] == 2 and b["renderer"] == "fast" and a["workers"] == 1
        assert _untimed(a) == _untimed(b) and [e["seed"] for e in b["episodes"]] == [1234, 1235]
        for seed in (1234, 1235):
            video = f"{name}/videos/seed_{seed}.mp4"
            assert (tmp_path / "s" / video).read_bytes() == (tmp_path / "p" / video).read_bytes()
    a, b = (json.loads((tmp_path / run / "comparison.json").read_text()) for run in ("s", "p"))
    assert _untimed(a) == _untimed(b)


def test_ctrl_c_in_a_parallel_evaluation_keeps_the_finished_episodes(student, tmp_path, monkeypatch):
    class CtrlCAfterFirstEpisode:  # the collector's stderr: Ctrl-C arrives as the first episode is reported
        def write(self, text):
            if "episode " in text:
                raise KeyboardInterrupt
            return len(text)

        def flush(self):
            pass

        def isatty(self):
            return False

    monkeypatch.setattr(sys, "stderr", CtrlCAfterFirstEpisode())
    out = tmp_path / "e"
    with pytest.raises(Interrupted, match="interrupted: wrote 1 finished episode"):
        evaluate(resolve(EvalArgs(expert_drives=True, episodes=6, max_steps=25, seed=1234, out=str(out), workers=2,
                                  tensorboard=False)))
    monkeypatch.undo()
    m = json.loads((out / "metrics.json").read_text())
    assert m["interrupted"] is True and m["num_episodes"] == 1 and m["requested_seeds"] == list(range(1234, 1240))
    assert not list((out / "videos").glob(".tmp-*")), "the unfinished episodes' videos were discarded"


@pytest.mark.parametrize("argv, message", [
    (["--env", "udacity", "--expert-drives", "--renderer", "fast"], "--renderer must be one of ['native'] for udacity"),
    (["--expert-drives", "--workers", "0"], "--workers must be an integer >= 1"),
])
def test_evaluate_renderer_and_workers_errors(argv, message, tmp_path, capsys):
    import evaluate as cli

    assert cli.main([*argv, "--out", str(tmp_path / "o"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert not (tmp_path / "o").exists()
    assert resolve(EvalArgs(expert_drives=True, episodes=1)).runtime.workers == 1
    assert resolve(EvalArgs(expert_drives=True)).track.renderer == "pygame"


def test_a_worker_stops_on_the_first_sigint_and_ignores_the_next():
    """Ctrl-C reaches a worker twice (the terminal's, then its caller's): the second must not interrupt its
    clean-up (a clean-clone CI run once printed a worker traceback from exactly that)."""
    from agent.workers import _stop_once

    old = signal.signal(signal.SIGINT, _stop_once)
    try:
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1.0)  # the handler runs at the next bytecode boundary
        os.kill(os.getpid(), signal.SIGINT)  # ignored now
        time.sleep(0.1)
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, old)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the dropped exception, on purpose
def test_a_stop_signal_swallowed_by_a_destructor_is_raised_at_the_next_step():
    """Python drops an exception raised inside __del__ (Box2D's body definitions are collected during env steps): a
    SIGTERM landing there must still stop the command at the next step (a clean-clone CI run saw collect.py run on)."""
    import gc

    from common.stops import raise_if_stopped, sigterm_as_interrupt

    class SlowToDie:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.5)  # the handler's KeyboardInterrupt is raised here, and dropped

    with sigterm_as_interrupt():
        obj = SlowToDie()
        del obj
        gc.collect()
        with pytest.raises(KeyboardInterrupt):
            raise_if_stopped()
        raise_if_stopped()  # delivered once


def test_inside_safe_points_a_first_stop_waits_for_the_loop_and_a_second_stops_at_once():
    """Training defers the first stop to its next step: an exception raised inside TensorBoard's writer queue left
    SummaryWriter.close() waiting (a clean-clone CI run of test_sigterm_saves_a_resumable_checkpoint timed out).
    A second signal, or the block's end, still delivers it."""
    from common.stops import raise_if_stopped, sigterm_as_interrupt, stops_at_safe_points

    with sigterm_as_interrupt():
        waited = []
        with pytest.raises(KeyboardInterrupt):
            with stops_at_safe_points():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.2)  # nothing raised here
                waited.append("the loop's step")
                raise_if_stopped()
        with pytest.raises(KeyboardInterrupt):
            with stops_at_safe_points():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.2)
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.5)  # the second one raises here
                pytest.fail("a second stop signal must not wait for the loop")
        with pytest.raises(KeyboardInterrupt):  # still pending, as any raised stop is (it may have been dropped)
            raise_if_stopped()
        with pytest.raises(KeyboardInterrupt):
            with stops_at_safe_points():  # a stop the block never checked is raised as it ends
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.2)
                waited.append("the block's end")
        raise_if_stopped()  # delivered once
    assert waited == ["the loop's step", "the block's end"]


class Breaks:
    """What a stop landing inside Box2D leaves behind: a half-built object whose __del__ fails."""

    def __del__(self):
        raise TypeError("half-built")


@pytest.fixture
def no_stop_yet(monkeypatch):
    """Python's own hook for errors it cannot raise: the hook is process-wide, and earlier tests stopped this
    process; it is restored afterwards."""
    import common.stops as stops

    monkeypatch.setattr(sys, "unraisablehook", sys.__unraisablehook__)
    return stops


def test_errors_python_cannot_raise_are_quiet_only_after_a_stop(capsys, no_stop_yet):
    """Not printed once stopping, printed as usual otherwise."""
    import gc
    import signal

    from common.stops import stop_handler, stops_at_safe_points

    Breaks()
    gc.collect()
    assert "half-built" in capsys.readouterr().err
    with pytest.raises(KeyboardInterrupt):
        with stops_at_safe_points():  # the stop is requested here and raised at the block's end
            stop_handler(signal.SIGTERM, None)
            Breaks()
            gc.collect()
    assert "half-built" not in capsys.readouterr().err


def test_errors_python_cannot_raise_stay_quiet_after_the_stop_was_handled(capsys, no_stop_yet):
    """evaluate catches the stop and writes the finished episodes (stop_handled clears the request); the half-built
    Box2D object is collected later, when the env closes or the interpreter exits: still no traceback."""
    import gc
    import signal

    stops = no_stop_yet
    with pytest.raises(KeyboardInterrupt):
        stops.stop_handler(signal.SIGTERM, None)
    stops.stop_handled()
    Breaks()
    gc.collect()
    assert "half-built" not in capsys.readouterr().err


def test_importing_a_policy_or_the_pipeline_changes_no_process_wide_hook():
    code = ("import sys; hook = sys.unraisablehook; import policies.checkpoint, agent.runtime, common.stops, "
            "agent.evaluation.evaluate; assert sys.unraisablehook is hook")
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def _no_setup():
    return None


def _disk_full_episode(state, task, on_step):
    import errno

    raise OSError(errno.ENOSPC, "No space left on device", f"/data/episode_{task}.npz")


def test_a_full_disk_in_a_worker_reaches_the_caller_as_its_one_line_error():
    """A worker's full disk is the caller's OSError (errno and file kept), which the CLIs turn into one line."""
    import errno

    from agent.workers import EpisodePool

    with EpisodePool(1, _no_setup, (), _disk_full_episode) as pool:
        with pytest.raises(OSError) as e:
            list(pool.run([(0, 7)]))
    assert e.value.errno == errno.ENOSPC and e.value.filename == "/data/episode_7.npz"
