"""The Minari export (agent/data/minari_export.py) on small hand-made episodes: the episode mapping, the dataset's
action space, the target folder, and what a failed export leaves behind. collect.py's own export is tested in
test_collection.py."""
import os

import numpy as np
import pytest

from agent.data import minari_export
from agent.data.minari_export import episode_buffer, export_minari, load_minari
from driving_data.dataset import open_dataset, write_episode

pytest.importorskip("minari", reason="the export needs minari (pip install 'minari[hdf5]')")


def arrays(steps: int = 4, seed: int = 0, final: bool = True) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = {"frames": rng.integers(0, 255, (steps, 96, 96, 3), dtype=np.uint8),
         "action": rng.uniform(-1, 1, (steps, 3)).astype(np.float32),
         "expert_action": rng.uniform(-1, 1, (steps, 3)).astype(np.float32),
         "reward": rng.normal(size=steps).astype(np.float32), "speed": np.arange(steps, dtype=np.float32),
         "privileged": np.zeros((steps, 4), np.float32), "time": np.arange(steps) * 0.02}
    if final:
        a |= {"final_frames": rng.integers(0, 255, (96, 96, 3), dtype=np.uint8),
              "final_expert_action": np.zeros(3, np.float32), "final_speed": np.float32(steps)}
    return a


def write(root, episodes: int = 2, final: bool = True, spaces=("continuous", "continuous")):
    for e in range(episodes):
        write_episode(root, e, arrays(seed=e, final=final),
                      {"env": "carracing", "action_space": spaces[e], "track_seed": 10 + e, "truncated": True})
    return root


def test_an_episode_maps_to_t_plus_1_observations_and_t_actions():
    a = arrays(steps=4)
    buf = episode_buffer(a, {"episode_id": 3, "track_seed": 7, "terminated": True, "truncated": True}, 3, dt=0.02)
    assert buf.id == 3 and buf.seed == 7
    assert buf.observations.shape == (5, 96, 96, 3) and np.array_equal(buf.observations[-1], a["final_frames"])
    np.testing.assert_array_equal(buf.actions, a["action"])  # the executed actions, not the labels
    assert buf.rewards.dtype == np.float64 and len(buf.rewards) == 4
    assert buf.terminations.tolist() == [False, False, False, True]
    assert not buf.truncations.any(), "an episode that terminated is not also truncated"
    np.testing.assert_array_equal(buf.infos["expert_action"][:-1], a["expert_action"])
    np.testing.assert_allclose(buf.infos["time"], [0.0, 0.02, 0.04, 0.06, 0.08])  # extended by one step
    assert buf.infos["speed"].tolist() == [0, 1, 2, 3, 4]
    assert "privileged" not in buf.infos, "an info without its final_ entry has no value for the last observation"
    with pytest.raises(ValueError, match="episode 3 has no final_frames array"):
        episode_buffer(arrays(final=False), {"episode_id": 3}, 3, dt=0.02)


def test_the_export_reads_back_in_minari_and_leaves_the_environment_as_it_was(tmp_path):
    pytest.importorskip("h5py")
    data = write(tmp_path / "data")
    before = os.environ.get("MINARI_DATASETS_PATH")
    path = export_minari(data, "test/tiny-v0")
    assert path == data / "minari" / "test" / "tiny-v0" and os.environ.get("MINARI_DATASETS_PATH") == before
    m = load_minari("test/tiny-v0", data / "minari")
    assert m.total_episodes == 2 and m.total_steps == 8
    assert [e.truncations[-1] for e in m.iterate_episodes()] == [True, True]
    with pytest.raises(ValueError, match="already exists"):
        export_minari(data, "test/tiny-v0")
    assert export_minari(data, "test/tiny-v0", overwrite=True) == path


def test_the_export_refuses_what_it_cannot_write(tmp_path):
    pytest.importorskip("h5py")
    with pytest.raises(ValueError, match="must look like"):
        export_minari(tmp_path, "no version")
    mixed = write(tmp_path / "mixed", spaces=("continuous", "discrete"))
    with pytest.raises(ValueError, match="does not say its action space"):
        export_minari(mixed, "test/x-v0")
    (tmp_path / "a_file").write_text("")
    with pytest.raises(ValueError, match="is a file"):
        export_minari(write(tmp_path / "ok"), "test/x-v0", datasets_path=tmp_path / "a_file")
    with pytest.raises(ValueError, match="no final_frames"):
        export_minari(write(tmp_path / "old", final=False), "test/x-v0")
    assert len(open_dataset(tmp_path / "old")) == 2 and not (tmp_path / "old" / "minari").exists()


def test_a_failed_export_removes_its_partial_dataset(tmp_path, monkeypatch):
    pytest.importorskip("h5py")
    import minari

    def fail(dataset_id, **kw):
        partial = minari_export.Path(os.environ["MINARI_DATASETS_PATH"]) / dataset_id
        partial.mkdir(parents=True)
        (partial / "half.hdf5").write_bytes(b"")
        raise KeyboardInterrupt

    monkeypatch.setattr(minari, "create_dataset_from_buffers", fail)
    data = write(tmp_path / "data")
    with pytest.raises(KeyboardInterrupt):
        export_minari(data, "test/x-v0")
    assert (data / "minari").is_dir() and not (data / "minari" / "test" / "x-v0").exists()
