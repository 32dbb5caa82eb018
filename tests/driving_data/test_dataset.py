"""The dataset format: atomic episode files, reading back, splits by episode, windows like a fresh stream."""

import json

import numpy as np
import pytest

from agent.training.windows import WindowDataset, kfold_episodes, split_episodes
from common.files import write_json
from driving_data.dataset import open_dataset, temp_files, write_episode
from driving_data.frames import JpegFrames, encode_jpeg


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
    write_episode(tmp_path, 3, ep, {"track_seed": 7})
    ds = open_dataset(tmp_path)
    assert len(ds) == 1 and ds.episodes[0]["episode_id"] == 3 and ds.episodes[0]["length"] == 12
    back = ds.load(0)
    for k, v in ep.items():
        np.testing.assert_array_equal(back[k], v)
    assert not list(tmp_path.rglob("*.tmp")), "temporary files must not survive a write"


def test_write_rejects_inconsistent_lengths(tmp_path):
    ep = _episode()
    ep["reward"] = ep["reward"][:-1]
    with pytest.raises(ValueError, match="different lengths"):
        write_episode(tmp_path, 0, ep, {})
    with pytest.raises(ValueError, match="missing"):
        write_episode(tmp_path, 0, {"frames": ep["frames"]}, {})


def test_open_dataset_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        open_dataset(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="no episodes"):
        open_dataset(tmp_path)
    (tmp_path / "episodes").mkdir()
    (tmp_path / "episodes" / "episode_00000.npz").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="unreadable"):
        open_dataset(tmp_path)


def test_window_repeats_first_frame_and_relative_time(tmp_path):
    write_episode(tmp_path, 0, _episode(T=10), {})
    ds = open_dataset(tmp_path)
    ep = ds.load(0)
    w = WindowDataset(ds, window=4, frame_stride=2)
    assert len(w) == 10
    item = w[1]  # window ends at step 1: frames 0,0,0,1 (indices clipped at 0)
    np.testing.assert_array_equal(item["frames"].numpy(), ep["frames"][[0, 0, 0, 1]])
    item = w[9]  # frames 3,5,7,9
    np.testing.assert_array_equal(item["frames"].numpy(), ep["frames"][[3, 5, 7, 9]])
    np.testing.assert_allclose(item["time"].numpy(), [-0.12, -0.08, -0.04, 0.0], atol=1e-6)
    np.testing.assert_allclose(item["target"].numpy(), ep["expert_action"][9])


def test_discrete_targets_are_int64(tmp_path):
    write_episode(tmp_path, 0, _episode(discrete=True), {})
    item = WindowDataset(open_dataset(tmp_path), window=2)[5]
    assert item["target"].dtype.is_floating_point is False and item["target"].ndim == 0


def test_splits_are_by_episode_and_disjoint():
    train, val = split_episodes(10, 0.2, seed=1)
    assert set(train).isdisjoint(val) and sorted(train + val) == list(range(10)) and len(val) == 2
    folds = kfold_episodes(10, 5, seed=1)
    vals = [v for _, v in folds]
    assert sorted(sum(vals, [])) == list(range(10))
    for tr, va in folds:
        assert set(tr).isdisjoint(va)
    with pytest.raises(ValueError, match="folds"):
        kfold_episodes(3, 5, seed=0)
    with pytest.raises(ValueError, match="at least 2"):
        split_episodes(1, 0.2, seed=0)


def test_json_atomic(tmp_path):
    write_json(tmp_path / "a.json", {"x": 1})
    assert json.loads((tmp_path / "a.json").read_text()) == {"x": 1}


def test_final_arrays_are_one_step_and_optional(tmp_path):
    ep = _episode(T=6)
    ep["final_frames"] = ep["frames"][-1]
    ep["final_privileged"] = ep["privileged"][-1]
    write_episode(tmp_path, 0, ep, {})
    back = open_dataset(tmp_path).load(0)
    np.testing.assert_array_equal(back["final_frames"], ep["frames"][-1])
    assert len(WindowDataset(open_dataset(tmp_path), window=2)) == 6, "final_ arrays are not steps"
    bad = dict(ep, final_frames=ep["frames"][-2:])
    with pytest.raises(ValueError, match="final_frames must be one step"):
        write_episode(tmp_path, 1, bad, {})
    with pytest.raises(ValueError, match="final_nothing"):
        write_episode(tmp_path, 1, dict(ep, final_nothing=np.zeros(3)), {})


def test_files_are_readable_by_others_and_temp_files_are_found(tmp_path):
    path = write_episode(tmp_path, 0, _episode(T=3), {})
    assert path.stat().st_mode & 0o777 == 0o644
    assert temp_files(tmp_path) == []
    stale = tmp_path / "episodes" / ".episode_00001.npz.abc.tmp"
    stale.write_bytes(b"killed mid-write")
    assert temp_files(tmp_path) == [stale]
    assert len(open_dataset(tmp_path)) == 1, "a temp file is never read as an episode"


# ------------------------------------------------------------------ JPEG frame storage
def _road(T, seed=0, h=160, w=320):
    """Smooth road-like frames (sky gradient, road, a lane line): what JPEG is meant for, unlike noise."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    out = np.empty((T, h, w, 3), np.uint8)
    for t in range(T):
        cx = w / 2 + 40 * np.sin(0.3 * t + seed)
        road = (yy > h * 0.4) & (np.abs(xx - cx) < (yy - h * 0.4) * 1.2)
        img = np.stack([100 + yy * 0.5, 150 + yy * 0.3, 230 - yy * 0.4], -1)
        img = np.where(road[..., None], 90.0, np.where((yy > h * 0.4)[..., None], [60, 130, 50], img))
        img[road & (np.abs(xx - cx) < 2)] = (230, 200, 40)
        out[t] = np.clip(img + rng.normal(0, 1, img.shape), 0, 255)
    return out


def _cam_episode(T=6, seed=0):
    ep = _episode(T=T, seed=seed)
    ep["frames"] = _road(T, seed)
    ep["frames_left"] = _road(T, seed + 1)
    ep["frames_right"] = _road(T, seed + 2)
    return ep


def test_jpeg_storage_round_trip_is_transparent(tmp_path):
    ep = _cam_episode()
    ep["final_frames"] = ep["frames"][-1]
    write_episode(tmp_path, 0, ep, {"track_seed": 1}, jpeg_quality=95)
    ds = open_dataset(tmp_path)
    meta = ds.episodes[0]
    assert meta["frame_codec"] == {k: "jpeg95" for k in ("frames", "frames_left", "frames_right", "final_frames")}
    assert meta["frame_shapes"]["frames"] == [160, 320, 3] and meta["length"] == 6
    back = ds.load(0)
    assert sorted(back) == sorted(ep)
    for k in ("frames", "frames_left", "frames_right", "final_frames"):
        assert back[k].dtype == np.uint8 and back[k].shape == ep[k].shape
        assert np.abs(back[k].astype(int) - ep[k]).mean() < 2.0, k
    for k in ("action", "reward", "time", "privileged"):
        np.testing.assert_array_equal(back[k], ep[k])
    w = WindowDataset(ds, window=2)
    assert len(w) == 6 and w[3]["frames"].shape == (2, 160, 320, 3)


def test_jpeg_is_smaller_and_not_deflated(tmp_path):
    import zipfile

    ep = _cam_episode(T=4)
    raw = write_episode(tmp_path / "raw", 0, ep, {})
    jpg = write_episode(tmp_path / "jpg", 0, ep, {}, jpeg_quality=90)
    assert jpg.stat().st_size < raw.stat().st_size / 2
    with zipfile.ZipFile(jpg) as z:
        kinds = {i.filename: i.compress_type for i in z.infolist()}
    assert kinds["frames__jpeg.npy"] == zipfile.ZIP_STORED and kinds["action.npy"] == zipfile.ZIP_DEFLATED


def test_pre_encoded_frames_are_stored_byte_for_byte(tmp_path):
    ep = _cam_episode(T=5)
    files = [encode_jpeg(f, 80) for f in ep["frames"]]  # as an importer would read them from disk
    ep["frames"] = JpegFrames.from_bytes(files)
    assert len(ep["frames"]) == 5 and ep["frames"].shape == (5, 160, 320, 3)
    write_episode(tmp_path, 0, ep, {})  # no jpeg_quality: the other cameras stay raw
    ds = open_dataset(tmp_path)
    assert ds.episodes[0]["frame_codec"] == {"frames": "jpeg"}
    stored = ds.jpeg_frames(0, "frames")
    assert [stored[t] for t in range(5)] == files
    assert ds.jpeg_frames(0, "frames_left") is None, "raw arrays have no JPEG bytes"
    np.testing.assert_array_equal(ds.load(0, keys=["frames_left"])["frames_left"], ep["frames_left"])
    decoded = ds.load(0, keys=["frames"])["frames"]
    np.testing.assert_array_equal(decoded, ep["frames"].decode())


def test_load_only_the_asked_keys(tmp_path):
    write_episode(tmp_path, 0, _cam_episode(T=3), {}, jpeg_quality=90)
    ds = open_dataset(tmp_path)
    assert sorted(ds.array_names(0)) == sorted(_cam_episode(T=3))
    assert sorted(ds.load(0, keys=["frames", "time"])) == ["frames", "time"]
    assert list(ds.load(0, keys="speed")) == ["speed"]
    with pytest.raises(ValueError, match=r"has no array \['depth'\]"):
        ds.load(0, keys=["frames", "depth"])


def test_jpeg_write_errors(tmp_path):
    ep = _cam_episode(T=4)
    with pytest.raises(ValueError, match="jpeg_quality must be an integer in"):
        write_episode(tmp_path, 0, ep, {}, jpeg_quality=101)
    with pytest.raises(ValueError, match="frames_left must be uint8"):
        write_episode(tmp_path, 0, dict(ep, frames_left=ep["frames_left"].astype(np.float32)), {}, jpeg_quality=90)
    with pytest.raises(ValueError, match="different lengths"):
        write_episode(tmp_path, 0, dict(ep, frames_right=JpegFrames.encode(ep["frames_right"][:3])), {})
    with pytest.raises(ValueError, match="may not contain"):
        write_episode(tmp_path, 0, dict(ep, frames__jpeg=np.zeros(4)), {})
    with pytest.raises(ValueError, match="frame 1 is not a JPEG"):
        JpegFrames.from_bytes([encode_jpeg(ep["frames"][0], 90), b"PNG not a jpeg"])
    small = encode_jpeg(ep["frames"][0][:80], 90)
    with pytest.raises(ValueError, match="frame 1 is 80x320x3"):
        JpegFrames.from_bytes([encode_jpeg(ep["frames"][0], 90), small])
    assert not (tmp_path / "episodes").exists() or not list((tmp_path / "episodes").iterdir())
