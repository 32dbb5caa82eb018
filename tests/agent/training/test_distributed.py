"""Beyond one machine: torchrun training (two gloo processes, real subprocesses), frames read lazily with bounded
memory, and collection shards merged into the dataset one collection would have written."""
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

import agent.training.data as training_data
import agent.training.loop as loop
from agent.data.collection import collect
from agent.data.config import CollectConfig
from agent.data.merge import merge_datasets
from agent.data.out_folder import inspect_out
from agent.training.config import resolve, with_env_defaults
from agent.training.data import load_data, resolve_head, use_lazy_loading
from agent.training.distributed import World, from_env, step_seed
from agent.training.experiment import run
from agent.training.loop import Interrupted, evaluate
from driving_data.dataset import CACHE_DIR, open_dataset, open_datasets
from driving_data.frames import FrameFile
from tests.helpers import constant_policy_checkpoint
from tests.agent.training.test_experiment import tiny_args, write_synthetic

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def _cpu_only(monkeypatch):
    """These tests claim bit-identical training across data paths and process counts, a CPU property (a GPU's
    kernels may round differently), and start two gloo processes, more than one GPU takes: on the CPU always."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return write_synthetic(tmp_path_factory.mktemp("scale") / "data", episodes=6)


def torchrun(nproc: int, *args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    """train.py under torchrun (its module form: no reliance on a script on PATH), one thread per process."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
           str(ROOT / "train.py"), *args, "--threads", "1", "--no-progress"]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=timeout,
                          env={**__import__("os").environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""})


def cli_args(data: Path, out: Path, **kw) -> list[str]:
    """tiny_args as train.py flags."""
    a = tiny_args(data, out, **kw)
    flags = {"core": a.policy, "window": a.window, "frame-stride": a.frame_stride, "epochs": a.epochs,
             "batch-size": a.batch_size, "segment": a.segment, "lr": a.lr, "feature-dim": a.feature_dim,
             "d-model": a.d_model, "heads": a.heads, "hidden": a.hidden, "log-every": a.log_every,
             "val-fraction": a.val_fraction}
    return ["--data", str(data), "--out", str(out), *[x for k, v in flags.items() for x in (f"--{k}", str(v))]]


# ----------------------------------------------------------------------------- torchrun / DDP
def test_two_processes_continue_a_run_and_score_it_as_one_process_would(data_dir, tmp_path, monkeypatch):
    """One torchrun launch (they are slow to start): a one-process run stopped mid-way through epoch 2 of 3
    is resumed by two gloo processes, which share every step's batch and write through rank 0 alone."""
    calls = {"n": 0}
    real_loss = loop.loss_fn

    def interrupting_loss(*a, **kw):
        calls["n"] += 1
        if calls["n"] == 13:  # in epoch 2 (each validation scores 2 episodes, an epoch is about 6 batches)
            raise KeyboardInterrupt
        return real_loss(*a, **kw)

    monkeypatch.setattr(loop, "loss_fn", interrupting_loss)
    out = tmp_path / "run"
    with pytest.raises(Interrupted):
        # 2 val episodes: one per rank
        run(resolve(tiny_args(data_dir, out, policy="gru", epochs=3, val_fraction=0.34)))
    monkeypatch.setattr(loop, "loss_fn", real_loss)
    cut = torch.load(out / "last.pt", weights_only=True)["train_state"]
    assert cut["epoch"] == 1 and 0 < cut["batch"] and not cut["done"]

    r = torchrun(2, "--resume", "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "on 2 processes" in r.stdout and r.stdout.count("gru: val_loss") == 1, r.stdout + r.stderr
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["processes"] == 2 and [h["epoch"] for h in metrics["history"]] == [1, 2, 3]
    assert metrics["history"][0] == cut["history"][0]  # the epoch done before the cut is kept as it was
    assert len(list(out.glob("events.out.tfevents.*"))) == 2  # the first run's and rank 0's, none from rank 1
    last = torch.load(out / "last.pt", weights_only=True)
    assert last["train_state"]["done"]
    # every step's windows were counted once, over both ranks: the single process's epochs
    assert last["train_state"]["global_step"] == 3 * metrics["train_windows"]
    # the ranks scored one validation episode each and reduced them in episode order: one process's numbers
    plan = with_env_defaults(resolve(tiny_args(data_dir, out, policy="gru", val_fraction=0.34)))
    data = load_data(plan.data)
    from policies.checkpoint import policy_from_checkpoint

    val = evaluate(policy_from_checkpoint(last).use_precision(metrics["precision"]), data, metrics["val_episodes"],
                   plan.optimisation.loss, resolve_head(plan, data).cols)
    assert val["val_loss"] == pytest.approx(metrics["last"]["val_loss"], rel=1e-6)
    assert metrics["best"]["val_loss"] < 0.8 * metrics["initial"]["val_loss"], metrics["history"]


def test_world_from_torchrun_variables():
    assert from_env({}) == World() and not World().active
    w = from_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"})
    assert (w.rank, w.size, w.local_rank, w.local_size, w.active, w.main) == (3, 4, 1, 2, True, False)
    assert w.part(list(range(10))) == [3, 7]
    with pytest.raises(ValueError, match="inconsistent"):
        from_env({"RANK": "4", "WORLD_SIZE": "4"})
    with pytest.raises(ValueError, match="not all integers"):
        from_env({"RANK": "x", "WORLD_SIZE": "2"})
    seeds = {step_seed(1, e, b, r) for e in range(2) for b in range(3) for r in range(2)}
    assert len(seeds) == 12 and step_seed(1, 0, 0, 0) == step_seed(1, 0, 0, 0)


def test_data_parallel_turns_buffer_sync_off_under_old_and_new_torch(monkeypatch):
    """torch 2.13 renamed DDP's broadcast_buffers to forward_sync_buffers; torch 2.11 (a CUDA build) refused the
    new name, so torchrun training failed there. Either signature gets its own switch, and a GPU its index."""
    import agent.training.distributed as distributed

    seen = []

    class New:
        def __init__(self, module, device_ids=None, broadcast_buffers=None, forward_sync_buffers=None):
            seen.append((device_ids, broadcast_buffers, forward_sync_buffers))

    class Old:
        def __init__(self, module, device_ids=None, broadcast_buffers=True):
            seen.append((device_ids, broadcast_buffers))

    for ddp in (New, Old):
        monkeypatch.setattr(distributed, "DistributedDataParallel", ddp)
        distributed.data_parallel(torch.nn.Linear(2, 2), torch.device("cpu"))
    distributed.data_parallel(torch.nn.Linear(2, 2), torch.device("cuda", 1))
    assert seen == [(None, None, False), (None, False), ([1], False)]


# ----------------------------------------------------------------------------- lazy frames
def test_lazy_loading_trains_identically_and_the_folder_still_takes_appends(data_dir, tmp_path):
    run(resolve(tiny_args(data_dir, tmp_path / "mem", policy="mlp", epochs=2, data_loading="memory")))
    run(resolve(tiny_args(data_dir, tmp_path / "lazy", policy="mlp", epochs=2, data_loading="lazy")))
    mem, lazy = (json.loads((tmp_path / n / "metrics.json").read_text()) for n in ("mem", "lazy"))
    assert (mem["data_loading"], lazy["data_loading"]) == ("memory", "lazy")
    assert mem["history"] == lazy["history"] and mem["initial"] == lazy["initial"]
    cached = sorted((data_dir / CACHE_DIR).rglob("*.npy"))
    assert len(cached) == 6
    inspect_out(data_dir)  # collect.py --out DATA still accepts the folder (the cache is a dot folder)
    assert len(open_dataset(data_dir)) == 6
    frames = FrameFile(cached[2])
    whole = np.load(cached[2])
    assert len(frames) == len(whole) and frames.shape == whole.shape
    np.testing.assert_array_equal(frames[5:17], whole[5:17])
    np.testing.assert_array_equal(frames[-1], whole[-1])
    assert frames[len(frames):].shape == (0, *whole.shape[1:])
    with pytest.raises(TypeError):
        frames[::2]


def test_auto_loading_goes_lazy_when_frames_would_crowd_memory(data_dir, tmp_path, monkeypatch):
    options = with_env_defaults(resolve(tiny_args(data_dir, tmp_path, data_loading="auto"))).data
    assert not load_data(options).lazy  # a few MB: memory
    monkeypatch.setattr(training_data, "available_memory", lambda: 1_000_000)  # 1 MB free
    assert load_data(options).lazy
    monkeypatch.setattr(training_data, "available_memory", lambda: None)
    dataset = open_dataset(data_dir)  # two ranks on one machine would each hold a copy:
    assert use_lazy_loading(options.loading, dataset, [32, 32], [], World(1, 2, 1, 2))
    assert not use_lazy_loading(options.loading, dataset, [32, 32], [], World(1, 2, 0, 1))  # one per machine


MEASURE = r"""
import sys
import cv2, tqdm  # imported by loading in either mode: not part of what is measured
from agent.training.config import TrainArgs, resolve, with_env_defaults
from agent.training.data import load_data
from agent.training.windows import gather_segments

def rss(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024

# with_env_defaults imports the env
plan = with_env_defaults(resolve(TrainArgs(data=sys.argv[1], data_loading=sys.argv[2], progress=False)))
before = rss("VmRSS")
data = load_data(plan.data)
for e in range(data.num_episodes):  # read every window once, as an epoch does
    n = len(data.frames[e])
    for s in range(0, n, 64):
        gather_segments(data, [(e, s, min(s + 64, n))], 8, 3, slice(0, 3))
print(rss("VmHWM") - before, rss("VmRSS") - before)
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads resident memory from /proc")
def test_lazy_loading_bounds_resident_memory(tmp_path):
    """24 episodes x 200 frames of 96x96x3 = 133 MB of prepared frames: in memory the process grows by all of
    them; lazily by a small fraction (one episode while its cache file is written, one batch after)."""
    from benchmarks.data_loading import make_dataset

    data = make_dataset(tmp_path / "big", 24 * 200, episode=200)
    total = 24 * 200 * 96 * 96 * 3
    grown = {}
    for mode in ("memory", "lazy"):  # lazy: prepares the cache, then reads every window from it
        out = subprocess.run([sys.executable, "-c", MEASURE, str(data), mode], capture_output=True, text=True,
                             cwd=ROOT, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        grown.setdefault(mode, []).append([int(x) for x in out.stdout.split()])
    assert grown["memory"][0][1] > 0.9 * total, grown  # what the test sees without lazy loading
    peak, now = grown["lazy"][0]
    assert peak < 0.15 * total and now < 0.1 * total, (grown, total)


# ----------------------------------------------------------------------------- shards and merge
def _collect(out, **kw):
    return collect(CollectConfig(out=Path(out), progress=False, max_steps=30, **kw), log=lambda m: None)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Two shards over disjoint seed ranges (shard I of N = its own --seed range) and one run over all seeds."""
    root = tmp_path_factory.mktemp("shards")
    _collect(root / "shard0", episodes=1, seed=4_000_000)
    _collect(root / "shard1", episodes=2, seed=4_000_001)
    _collect(root / "single", episodes=3, seed=4_000_000)
    return root


def test_merged_shards_equal_one_collection_and_take_a_dagger_round(shards, tmp_path):
    merged = merge_datasets([shards / "shard1", shards / "shard0"], tmp_path / "merged")  # any order
    single = open_dataset(shards / "single")
    assert [m["episode_id"] for m in merged.episodes] == [0, 1, 2]
    assert [m["track_seed"] for m in merged.episodes] == [m["track_seed"] for m in single.episodes]
    for i in range(len(single)):
        a, b = single.load(i), merged.load(i)
        assert sorted(a) == sorted(b)
        for k in a:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)
        differ = {k for k in single.episodes[i].keys() | merged.episodes[i].keys()
                  if single.episodes[i].get(k) != merged.episodes[i].get(k)}
        assert differ <= {"collected_at", "wall_s"}, differ
    for key in ("env", "action_space", "config", "seeds", "counts", "returns", "expert_driven_returns",
                "action_histogram", "episodes", "expert"):
        assert merged.card[key] == single.card[key], key
    sources = merged.card["runs"][-1]["merged_from"]
    assert [s["track_seeds"] for s in sources] == [[4_000_001, 4_000_002], [4_000_000, 4_000_000]]

    driver = constant_policy_checkpoint(tmp_path / "student.pt")  # DAgger appends to the merged dataset
    res = _collect(tmp_path / "merged", episodes=1, driver=driver, beta=0.5)
    assert (res.first_seed, res.episodes_total) == (4_000_003, 4)
    card = json.loads((tmp_path / "merged" / "dataset.json").read_text())
    assert card["counts"]["driven_by"] == {"expert": 3, "student": 1} and card["runs"][-2]["merged_from"]


def test_training_on_several_folders_is_training_on_their_merge(shards, tmp_path):
    merge_datasets([shards / "shard0", shards / "shard1"], tmp_path / "merged")
    kw = dict(policy="mlp", epochs=1, window=2, val_fraction=0.34)
    run(resolve(tiny_args(tmp_path / "merged", tmp_path / "a", **kw)))
    run(resolve(replace(tiny_args("", tmp_path / "b", **kw), data=[str(shards / "shard1"), str(shards / "shard0")])))
    a, b = (json.loads((tmp_path / n / "metrics.json").read_text()) for n in ("a", "b"))
    assert a["history"] == b["history"] and a["val_episodes"] == b["val_episodes"]
    assert b["args"]["data"] == [str(shards / "shard1"), str(shards / "shard0")]


def test_merge_refusals_are_one_line_errors(data_dir, shards, tmp_path):
    other = write_synthetic(tmp_path / "other", episodes=2)  # track seeds 0, 1: also in data_dir
    discrete = write_synthetic(tmp_path / "disc", episodes=2, action_space="discrete")

    def merge_cli(*args):
        return subprocess.run([sys.executable, "-m", "agent.data.merge", *args], capture_output=True,
                              text=True, cwd=ROOT, timeout=60)

    r = merge_cli(str(data_dir), str(other), "--out", str(tmp_path / "m"))
    assert r.returncode == 2 and "track seed 0 is in both" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "m").exists()
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    with pytest.raises(ValueError, match="action space"):
        merge_datasets([other, discrete], tmp_path / "m")
    with pytest.raises(ValueError, match="not empty"):
        merge_datasets([shards / "shard0", shards / "shard1"], tmp_path / "other")
    with pytest.raises(ValueError, match="one of the datasets"):
        merge_datasets([shards / "shard0", shards / "shard1"], shards / "shard1")
    with pytest.raises(ValueError, match="named twice"):
        open_datasets([data_dir, data_dir])
    with pytest.raises(ValueError, match="at least two"):
        merge_datasets([data_dir], tmp_path / "m")
    with pytest.raises(ValueError, match="track seed 0 is in both"):  # train.py --data A B: the same check
        run(resolve(replace(tiny_args("", tmp_path / "t"), data=[str(data_dir), str(other)])))
