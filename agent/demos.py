"""Demonstration datasets: the on-disk format and windowed loading for behaviour cloning.

Why this format
---------------
One compressed ``.npz`` per episode (``DATA_DIR/episodes/episode_00000.npz``) keeps an
episode self-contained: it is written to a temporary file and renamed into place, so an
interrupted collection leaves every finished episode readable and never a half file.
A card (``DATA_DIR/dataset.json``) summarises the whole dataset and is rewritten the same
way after every episode.

Arrays of an episode (``T`` steps; step ``t`` = the frame seen *before* acting at ``t``)::

    frames         uint8   [T, 96, 96, 3]   camera frame the student sees
    action         float32 [T, 3] | int64 [T]   action executed in the env (may carry DART noise)
    expert_action  same as action               the expert's label for that frame
    expert_probs   float32 [T, 5]               discrete only: the expert's action probabilities
    reward         float32 [T]
    speed          float32 [T]                  units/s
    privileged     float32 [T, F]               the expert's observation (envs.carracing.FEATURE_NAMES)
    time           float64 [T]                  seconds since the episode start (t * 0.02)
    meta           str                          JSON: episode_id, track_seed, env, action_space,
                                                return, length, terminated, truncated, noise
                                                (collect.py adds more: lap_complete, tiles, stats, ...)

Optional ``final_<name>`` arrays hold ``<name>`` at the observation reached *after* the last step
(``final_frames`` uint8 [96, 96, 3], ``final_privileged``, ``final_expert_action``, ...): shape of one
step of ``<name>``, no leading ``T``. They let exporters that want ``T + 1`` observations (Minari)
rebuild the episode exactly; the windowed loaders ignore them.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

CARD_NAME = "dataset.json"
EPISODE_DIR = "episodes"
REQUIRED_ARRAYS = ("frames", "action", "expert_action", "reward", "speed", "privileged", "time")
FINAL_PREFIX = "final_"


def episode_path(root: str | Path, episode_id: int) -> Path:
    return Path(root) / EPISODE_DIR / f"episode_{episode_id:05d}.npz"


def atomic_write(path: Path, write) -> None:
    """Write through a temp file in the same folder, then rename: readers never see a half file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)  # mkstemp makes 0600; datasets are meant to be shared and read by others
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_json_atomic(path: str | Path, obj: Any) -> None:
    atomic_write(Path(path), lambda f: f.write(json.dumps(obj, indent=2).encode()))


def write_episode(root: str | Path, episode_id: int, arrays: dict[str, np.ndarray], meta: dict) -> Path:
    """Save one episode atomically; refuses arrays that disagree on the episode length."""
    missing = [k for k in REQUIRED_ARRAYS if k not in arrays]
    if missing:
        raise ValueError(f"write_episode: arrays is missing {missing}; expected at least {list(REQUIRED_ARRAYS)}")
    steps = {k: v for k, v in arrays.items() if not k.startswith(FINAL_PREFIX)}
    lengths = {k: len(v) for k, v in steps.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"write_episode: arrays have different lengths {lengths}")
    for k, v in arrays.items():
        if k.startswith(FINAL_PREFIX):
            base = k[len(FINAL_PREFIX):]
            if base not in steps or np.shape(v) != np.shape(steps[base])[1:]:
                want = np.shape(steps[base])[1:] if base in steps else f"a per-step array named {base!r}"
                raise ValueError(f"write_episode: {k} must be one step of {base!r} (shape {want}), got shape {np.shape(v)}")
    path = episode_path(root, episode_id)
    meta = {**meta, "episode_id": int(episode_id), "length": int(lengths["frames"])}
    atomic_write(path, lambda f: np.savez_compressed(f, meta=np.array(json.dumps(meta)), **arrays))
    return path


@dataclass
class DemoDataset:
    """A dataset folder: its card and the metadata of every complete episode file."""

    root: Path
    card: dict
    episodes: list[dict]
    paths: list[Path]

    def __len__(self) -> int:
        return len(self.episodes)

    @property
    def num_steps(self) -> int:
        return sum(int(m["length"]) for m in self.episodes)

    def load(self, i: int) -> dict[str, np.ndarray]:
        """All arrays of episode ``i`` (position in ``episodes``), decompressed."""
        with np.load(self.paths[i], allow_pickle=False) as z:
            return {k: z[k] for k in z.files if k != "meta"}


def temp_files(root: str | Path) -> list[Path]:
    """Leftovers of writes that were killed mid-way (SIGKILL skips the cleanup in ``atomic_write``).
    They are never read as data (their names do not match ``episode_*.npz``); collect.py removes them."""
    root = Path(root)
    return sorted([*root.glob(".*.tmp"), *(root / EPISODE_DIR).glob(".*.tmp")])


def read_episode_meta(path: Path) -> dict:
    with np.load(path, allow_pickle=False) as z:
        return json.loads(str(z["meta"]))


def open_dataset(root: str | Path) -> DemoDataset:
    """Open a dataset folder written by ``collect.py``; clear errors for a wrong or empty folder."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"dataset folder {str(root)!r} does not exist; create one with `python collect.py --out {root}`")
    card_path = root / CARD_NAME
    files = sorted((root / EPISODE_DIR).glob("episode_*.npz"))
    if not files:
        raise FileNotFoundError(
            f"dataset folder {str(root)!r} holds no episodes (expected {EPISODE_DIR}/episode_*.npz); "
            f"is it the --out folder of collect.py?"
        )
    try:
        card = json.loads(card_path.read_text()) if card_path.exists() else {}
    except json.JSONDecodeError as e:
        raise ValueError(f"dataset card {str(card_path)!r} is not valid JSON: {e}") from None
    metas, paths = [], []
    for f in files:
        try:
            metas.append(read_episode_meta(f))
        except Exception as e:  # a foreign or damaged file: say which one
            raise ValueError(f"episode file {str(f)!r} is unreadable ({e}); delete it and collect again") from None
        paths.append(f)
    return DemoDataset(root=root, card=card, episodes=metas, paths=paths)


def split_episodes(n_episodes: int, val_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Train/validation split by episode, never by frame (frames of one episode are highly correlated)."""
    if n_episodes < 2:
        raise ValueError(f"need at least 2 episodes to split into train and validation, got {n_episodes}")
    order = np.random.default_rng(seed).permutation(n_episodes)
    n_val = min(n_episodes - 1, max(1, round(val_fraction * n_episodes)))
    return sorted(order[n_val:].tolist()), sorted(order[:n_val].tolist())


def kfold_episodes(n_episodes: int, folds: int, seed: int) -> list[tuple[list[int], list[int]]]:
    """K folds by episode: each episode is in exactly one validation fold."""
    if not 2 <= folds <= n_episodes:
        raise ValueError(f"folds must be in [2, number of episodes={n_episodes}], got {folds}")
    order = np.random.default_rng(seed).permutation(n_episodes)
    parts = np.array_split(order, folds)
    return [
        (sorted(np.concatenate([p for j, p in enumerate(parts) if j != k]).tolist()), sorted(parts[k].tolist()))
        for k in range(folds)
    ]


def window_indices(t: int, window: int, frame_stride: int) -> np.ndarray:
    """Frame indices of the window ending at step ``t``; before the episode start, frame 0 repeats
    (exactly what a fresh streaming policy sees after ``reset``)."""
    return np.maximum(t - frame_stride * np.arange(window - 1, -1, -1), 0)


class WindowDataset(Dataset):
    """Windows of ``window`` frames (every ``frame_stride``-th) ending at each step of the chosen episodes.

    The chosen episodes are decompressed into memory once (a 1000-step episode is ~28 MB of
    frames), so sampling a window is an index gather, not a disk read.
    """

    def __init__(
        self,
        dataset: DemoDataset,
        episode_indices: list[int] | None = None,
        window: int = 8,
        frame_stride: int = 1,
        target: str = "expert_action",
    ):
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        if frame_stride < 1:
            raise ValueError(f"frame_stride must be >= 1, got {frame_stride}")
        episode_indices = list(range(len(dataset))) if episode_indices is None else list(episode_indices)
        if not episode_indices:
            raise ValueError("WindowDataset needs at least one episode")
        self.window, self.frame_stride, self.target = window, frame_stride, target
        self.frames: list[np.ndarray] = []
        self.times: list[np.ndarray] = []
        self.targets: list[np.ndarray] = []
        index = []
        for j, i in enumerate(episode_indices):
            arrays = dataset.load(i)
            if target not in arrays:
                raise ValueError(f"target {target!r} is not in the dataset; it has {sorted(arrays)}")
            self.frames.append(arrays["frames"])
            self.times.append(arrays["time"].astype(np.float64))
            self.targets.append(arrays[target])
            index.append(np.stack([np.full(len(arrays["frames"]), j), np.arange(len(arrays["frames"]))], 1))
        self.index = np.concatenate(index) if index else np.zeros((0, 2), dtype=np.int64)

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, n: int) -> dict[str, torch.Tensor]:
        e, t = self.index[n]
        idx = window_indices(int(t), self.window, self.frame_stride)
        times = self.times[e][idx]
        target = self.targets[e][t]
        return {
            "frames": torch.from_numpy(self.frames[e][idx]),
            "time": torch.from_numpy((times - times[-1]).astype(np.float32)),
            "target": torch.as_tensor(target, dtype=torch.int64 if np.issubdtype(np.asarray(target).dtype, np.integer) else torch.float32),
        }

    def targets_array(self) -> np.ndarray:
        """All targets stacked (for normalisation statistics and class weights)."""
        return np.concatenate(self.targets)
