"""The dataset format: atomic episode files, reading back, splits by episode, windows like a fresh stream."""
import json

import numpy as np
import pytest

from agent import demos


def _episode(T=12, discrete=False, seed=0):
    rng = np.random.default_rng(seed)
    act = rng.integers(0, 5, T) if discrete else rng.uniform(-1, 1, (T, 3)).astype(np.float32)
    return {
        "frames": rng.integers(0, 256, (T, 96, 96, 3), dtype=np.uint8),
        "action": act,
        "expert_action": act.copy(),
        "reward": rng.normal(size=T).astype(np.float32),
        "speed": rng.uniform(0, 50, T).astype(np.float32),
        "privileged": rng.normal(size=(T, 5)).astype(np.float32),
        "time": np.arange(T) * 0.02,
    }


def test_roundtrip_and_meta(tmp_path):
    ep = _episode()
    demos.write_episode(tmp_path, 3, ep, {"track_seed": 7})
    ds = demos.open_dataset(tmp_path)
    assert len(ds) == 1 and ds.episodes[0]["episode_id"] == 3 and ds.episodes[0]["length"] == 12
    back = ds.load(0)
    for k, v in ep.items():
        np.testing.assert_array_equal(back[k], v)
    assert not list(tmp_path.rglob("*.tmp")), "temporary files must not survive a write"


def test_write_rejects_inconsistent_lengths(tmp_path):
    ep = _episode()
    ep["reward"] = ep["reward"][:-1]
    with pytest.raises(ValueError, match="different lengths"):
        demos.write_episode(tmp_path, 0, ep, {})
    with pytest.raises(ValueError, match="missing"):
        demos.write_episode(tmp_path, 0, {"frames": ep["frames"]}, {})


def test_open_dataset_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        demos.open_dataset(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="no episodes"):
        demos.open_dataset(tmp_path)
    (tmp_path / "episodes").mkdir()
    (tmp_path / "episodes" / "episode_00000.npz").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="unreadable"):
        demos.open_dataset(tmp_path)


def test_window_repeats_first_frame_and_relative_time(tmp_path):
    demos.write_episode(tmp_path, 0, _episode(T=10), {})
    ds = demos.open_dataset(tmp_path)
    ep = ds.load(0)
    w = demos.WindowDataset(ds, window=4, frame_stride=2)
    assert len(w) == 10
    item = w[1]  # window ends at step 1: frames 0,0,0,1 (indices clipped at 0)
    np.testing.assert_array_equal(item["frames"].numpy(), ep["frames"][[0, 0, 0, 1]])
    item = w[9]  # frames 3,5,7,9
    np.testing.assert_array_equal(item["frames"].numpy(), ep["frames"][[3, 5, 7, 9]])
    np.testing.assert_allclose(item["time"].numpy(), [-0.12, -0.08, -0.04, 0.0], atol=1e-6)
    np.testing.assert_allclose(item["target"].numpy(), ep["expert_action"][9])


def test_discrete_targets_are_int64(tmp_path):
    demos.write_episode(tmp_path, 0, _episode(discrete=True), {})
    item = demos.WindowDataset(demos.open_dataset(tmp_path), window=2)[5]
    assert item["target"].dtype.is_floating_point is False and item["target"].ndim == 0


def test_splits_are_by_episode_and_disjoint():
    train, val = demos.split_episodes(10, 0.2, seed=1)
    assert set(train).isdisjoint(val) and sorted(train + val) == list(range(10)) and len(val) == 2
    folds = demos.kfold_episodes(10, 5, seed=1)
    vals = [v for _, v in folds]
    assert sorted(sum(vals, [])) == list(range(10))
    for tr, va in folds:
        assert set(tr).isdisjoint(va)
    with pytest.raises(ValueError, match="folds"):
        demos.kfold_episodes(3, 5, seed=0)
    with pytest.raises(ValueError, match="at least 2"):
        demos.split_episodes(1, 0.2, seed=0)


def test_json_atomic(tmp_path):
    demos.write_json_atomic(tmp_path / "a.json", {"x": 1})
    assert json.loads((tmp_path / "a.json").read_text()) == {"x": 1}


def test_final_arrays_are_one_step_and_optional(tmp_path):
    ep = _episode(T=6)
    ep["final_frames"] = ep["frames"][-1]
    ep["final_privileged"] = ep["privileged"][-1]
    demos.write_episode(tmp_path, 0, ep, {})
    back = demos.open_dataset(tmp_path).load(0)
    np.testing.assert_array_equal(back["final_frames"], ep["frames"][-1])
    assert len(demos.WindowDataset(demos.open_dataset(tmp_path), window=2)) == 6, "final_ arrays are not steps"
    bad = dict(ep, final_frames=ep["frames"][-2:])
    with pytest.raises(ValueError, match="final_frames must be one step"):
        demos.write_episode(tmp_path, 1, bad, {})
    with pytest.raises(ValueError, match="final_nothing"):
        demos.write_episode(tmp_path, 1, dict(ep, final_nothing=np.zeros(3)), {})


def test_files_are_readable_by_others_and_temp_files_are_found(tmp_path):
    path = demos.write_episode(tmp_path, 0, _episode(T=3), {})
    assert path.stat().st_mode & 0o777 == 0o644
    assert demos.temp_files(tmp_path) == []
    stale = tmp_path / "episodes" / ".episode_00001.npz.abc.tmp"
    stale.write_bytes(b"killed mid-write")
    assert demos.temp_files(tmp_path) == [stale]
    assert len(demos.open_dataset(tmp_path)) == 1, "a temp file is never read as an episode"
