"""Splits by episode, windows of frames, and the batches of one epoch.

How a batch is made (the CPU budget drives this)
------------------------------------------------
Windows follow ``agent.training.windows.window_indices`` (the same windows ``agent.training.windows.WindowDataset``
yields), but a training batch is a few *segments* of consecutive steps instead of independent windows: the frames
a segment needs are encoded by the CNN once, and every window of the segment gathers its frames'
embeddings. With window 8 and stride 3 a 16-step segment encodes 37 frames for 16 windows instead of
128 -- the CNN, which dominates the cost, runs ~3.5x less. Each step of every training episode is the
last step of exactly one window per epoch (random segment offsets, shuffled segments). Validation
encodes each episode once and scores *every* window -- the same numbers as a per-window forward.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from torch.utils.data import Dataset

from agent.training.config import SplitOptions, Windows
from agent.training.data import Data, episode_targets, take_pieces
from driving_data.dataset import DemoDataset, queued_actions


def make_splits(split: SplitOptions, w: Windows, data: Data) -> tuple[Data, list[tuple[list[int], list[int]]]]:
    """The run's (train, validation) episode lists, and the data they index.

    ``--split episodes`` holds out whole episodes (``--folds K``: K folds of them); ``--split blocks`` holds out
    the last ``--val-fraction`` of every episode in time; ``auto`` is blocks when the data is a single episode
    (a real simulator recording of one session) and episodes otherwise. When a person's recordings are trained
    with simulator data (``--data REC SIM``), only the recordings validate (real driving is what is measured);
    the simulator's episodes always train."""
    longest = max((len(f) for f in data.frames), default=0)
    if window_span(w.window, w.frame_stride) > longest:  # each window would be the first frame repeated
        raise ValueError(f"--window {w.window} at --frame-stride {w.frame_stride} spans "
                         f"{window_span(w.window, w.frame_stride)} steps, more than the longest episode ({longest} "
                         "steps); lower --window or --frame-stride, or record longer episodes")
    seed = split.seed
    held = validation_candidates(data)
    episode_split = (None if split.folds
                     else split_episodes(len(held), split.val_fraction, seed) if len(held) > 1 else None)
    mode = split.mode if split.mode != "auto" else auto_split_mode(data, held, episode_split, split.val_fraction)
    if mode == "blocks":
        if split.folds:
            raise ValueError("--folds holds out whole episodes; "
                             f"{'this dataset has one episode, so ' if len(held) == 1 else ''}"
                             f"drop --folds (one split in time blocks) or use --split episodes")
        # the gap: one window, and at least half the label smoothing, so no training input or label sees validation
        gap = max(window_span(w.window, w.frame_stride), math.ceil(data.smoothing_s / 2 / data.frame_period) + 1)
        train, val = block_pieces([len(f) for f in data.frames], split.val_fraction, gap, held)
        folds = [(list(range(len(train))), list(range(len(train), len(train) + len(val))))]
        return take_pieces(data, train + val), folds
    rest = sorted(set(range(data.num_episodes)) - set(held))
    splits = (kfold_episodes(len(held), split.folds, seed) if split.folds
              else [episode_split or split_episodes(len(held), split.val_fraction, seed)])
    return data, [(sorted(rest + [held[i] for i in t]), [held[i] for i in v]) for t, v in splits]


def auto_split_mode(data: Data, held: list[int], episode_split: tuple[list[int], list[int]] | None,
                    val_fraction: float) -> str:
    """``--split auto``: whole episodes, except time blocks for one episode, and for a person's recordings whose
    held-out sessions would hold less than half of ``val_fraction`` or more than twice it (sessions end where the
    person paused, so their lengths are arbitrary: 93 and 4,608 rows in one public recording, where either session
    held out leaves nothing to learn from or nothing to measure on; two laps, one each way round, where one held
    out leaves half the recording to learn from and measures on the track driven the other way)."""
    if len(held) == 1:
        return "blocks"
    if episode_split is None or not data.recorded or not all(data.recorded[e] for e in held):
        return "episodes"
    lengths = [len(data.frames[e]) for e in held]
    share = sum(lengths[i] for i in episode_split[1]) / sum(lengths)
    return "episodes" if val_fraction / 2 <= share <= 2 * val_fraction else "blocks"


def validation_candidates(data: Data) -> list[int]:
    """The episodes a split may hold out: the recordings when they are mixed with simulator data, else all."""
    recorded = [e for e, r in enumerate(data.recorded) if r]
    return recorded if 0 < len(recorded) < data.num_episodes else list(range(data.num_episodes))


def window_span(window: int, frame_stride: int) -> int:
    """Steps one window covers, from its first frame to its last."""
    return (window - 1) * frame_stride + 1


def block_pieces(lengths: list[int], val_fraction: float, gap: int, held: list[int] | None = None
                 ) -> tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]]:
    """Split every episode (of ``held``, default all) in time: its last ``val_fraction`` of steps validate, its
    steps up to ``gap`` steps before them train, as ``(episode, start, stop)`` pieces. The gap (one window span)
    keeps every training window and its label clear of the validation block, so no validation frame is ever
    trained on; an episode too short for both blocks and the gap, or not in ``held``, trains whole."""
    train, val = [], []
    for e, n in enumerate(lengths):
        n_val = round(val_fraction * n)
        stop = n - n_val - gap
        if n_val < 1 or stop < 1 or (held is not None and e not in held):
            train.append((e, 0, n))
            continue
        train.append((e, 0, stop))
        val.append((e, n - n_val, n))
    if not val:
        raise ValueError(f"no episode is long enough to hold out {val_fraction:.0%} of its steps for validation "
                         f"with a gap of {gap} steps (one window) before them; record longer or lower --window")
    return train, val


def describe_blocks(data: Data, split: tuple[list[int], list[int]], shown: int = 4) -> str:
    """One line saying which steps train and which validate, for a split in time blocks (the first ``shown``
    episodes in full, the rest counted: a pool has hundreds)."""
    assert data.pieces is not None
    train, val = split
    parts = [f"episode {data.pieces[v][0]}: trains on steps {data.pieces[t][1]}..{data.pieces[t][2] - 1}, validates on "
             f"{data.pieces[v][1]}..{data.pieces[v][2] - 1}"
             for v in val for t in train if data.pieces[t][0] == data.pieces[v][0]]
    whole = [str(data.pieces[t][0]) for t in train if not any(data.pieces[v][0] == data.pieces[t][0] for v in val)]
    line = ("split in time blocks (the gap between them is one window or half the label average, so no training "
            "window or label sees a validation frame): " + "; ".join(parts[:shown]))
    if len(parts) > shown:
        line += f"; and so on for {len(parts) - shown} more episodes"
    if whole:
        line += (f"; too short to split, trained whole: {len(whole)} episode(s) ({', '.join(whole[:shown])}"
                 + (", ...)" if len(whole) > shown else ")"))
    return line


def split_episodes(n_episodes: int, val_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Train/validation split by episode, never by frame (frames of one episode are highly correlated)."""
    if n_episodes < 2:
        raise ValueError(f"need at least 2 episodes to split into train and validation by episode, got {n_episodes}; "
                         f"--split blocks holds out the end of every episode in time instead")
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
            names = dataset.array_names(i)
            if target not in names:
                raise ValueError(f"target {target!r} is not in the dataset; it has {sorted(names)}")
            arrays = dataset.load(i, keys=["frames", "time", target])  # not the other cameras: decoding costs
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
            "target": torch.as_tensor(
                target, dtype=torch.int64 if np.issubdtype(np.asarray(target).dtype, np.integer) else torch.float32),
        }

    def targets_array(self) -> np.ndarray:
        """All targets stacked (for normalisation statistics and class weights)."""
        return np.concatenate(self.targets)


def make_segments(lengths: dict[int, int], segment: int, rng: np.random.Generator,
                  turns: dict[int, np.ndarray] | None = None, repeat: int = 1,
                  shares: dict[int, float] | None = None) -> list[tuple[int, int, int]]:
    """Cover every step of every episode once with ``(episode, start, stop)`` segments, random offsets, shuffled.
    With ``turns`` (per episode, |steering label| per step) and ``repeat`` > 1, the tenth of the segments with
    the sharpest turn (the largest label in them; ties in segment order) is there ``repeat`` times. ``shares``
    (per episode, how many times an epoch sees each of its steps on average; ``episode_shares``): an episode's
    segments are drawn that many times, the whole part by copies and the rest at random without repeats."""
    segments = []
    for e, n in lengths.items():
        offset = int(rng.integers(segment))
        own = [(e, max(s, 0), min(s + segment, n)) for s in range(-offset, n, segment)
               if min(s + segment, n) > max(s, 0)]
        if shares is not None and shares.get(e, 1.0) != 1.0:
            whole, part = divmod(shares[e] * len(own), len(own))
            extra = rng.choice(len(own), size=int(round(part)), replace=False) if round(part) else []
            own = own * int(whole) + [own[i] for i in sorted(extra)]
        segments += own
    if repeat > 1 and turns is not None and segments:
        sharpness = np.array([turns[e][a:b].max() for e, a, b in segments])
        sharpest = np.argsort(-sharpness, kind="stable")[: max(1, round(0.1 * len(segments)))]
        segments += [segments[i] for i in sorted(sharpest)] * (repeat - 1)
    order = rng.permutation(len(segments))
    return [segments[i] for i in order]


def episode_shares(lengths: dict[int, int], sources: list[int], weight: str) -> dict[int, float] | None:
    """How many times an epoch sees each step of each training episode, so that the --data folders (``sources``:
    each episode's folder) share it as ``weight`` says: frames (None: every step once), sqrt (a folder's share of
    the epoch in proportion to the square root of its training steps) or equal. The epoch keeps its length."""
    if weight == "frames" or not sources:
        return None
    steps: dict[int, int] = {}
    for e, n in lengths.items():
        steps[sources[e]] = steps.get(sources[e], 0) + n
    mass = {d: (float(np.sqrt(n)) if weight == "sqrt" else 1.0) for d, n in steps.items()}
    total, norm = sum(steps.values()), sum(mass.values())
    return {e: mass[sources[e]] / norm * total / steps[sources[e]] for e in lengths}


def latency_shifts(segments: list[tuple[int, int, int]], latency: tuple[int, int] | str,
                   rng: np.random.Generator | None = None, recorded: list[int] | None = None
                   ) -> list[np.ndarray] | None:
    """Each window's latency in steps for hindsight labels (gather_segments' ``shifts``): one draw from
    ``latency`` (lo..hi) per segment with ``rng`` (training), else lo..hi in turn over the steps (validation:
    every latency, deterministically); "recorded": each episode's own (``recorded``, the latency it was driven
    under). None when the range is 0:0."""
    if latency == "recorded":
        return [np.full(b - a, recorded[e] if recorded else 0) for e, a, b in segments]
    lo, hi = latency
    if hi == 0:
        return None
    if rng is not None:
        return [np.full(b - a, int(rng.integers(lo, hi + 1))) for _, a, b in segments]
    return [lo + np.arange(a, b) % (hi - lo + 1) for _, a, b in segments]


def label_shifts(segments: list[tuple[int, int, int]], shifts: list[np.ndarray] | None,
                 labels_land: list[bool]) -> list[np.ndarray] | None:
    """The hindsight shifts of the labels: ``shifts``, but 0 in the episodes whose labels a latency expert already
    chose for when the action lands (``labels_land``, per episode); the policy is still told ``shifts``."""
    if shifts is None or not any(labels_land):
        return shifts
    return [np.zeros_like(s) if labels_land[e] else s for (e, _, _), s in zip(segments, shifts)]


def window_queues(data: Data, segments: list[tuple[int, int, int]], shifts: list[np.ndarray] | None, size: int,
                  cols: slice | None) -> np.ndarray | None:
    """The actions on their way ``[N, size, A]`` at each window's last step, under the latency it is told
    (``shifts``, steps; driving_data.dataset.queued_actions), for a policy shown ``size`` of them; None when it
    is shown none or told no latency."""
    if not size or shifts is None:
        return None
    out = []
    for (e, a, b), told in zip(segments, shifts):
        applied = data.applied[e] if data.applied else np.zeros((0, 0), np.float32)
        if not applied.shape[-1]:
            raise ValueError("a policy shown its actions on their way trains on the actions applied, which episode "
                             f"{e} of the data did not record")
        out.append(queued_actions(applied if cols is None else applied[:, cols], np.arange(a, b), told, size))
    return np.concatenate(out)


def batch_plan(lengths: dict[int, int], w: Windows, epoch: int, turns: dict[int, np.ndarray] | None = None,
               shares: dict[int, float] | None = None) -> list[list[tuple[int, int, int]]]:
    """The epoch's batches: deterministic in (seed, epoch), so a resumed run replays the same order.
    ``turns``: see make_segments (used when ``w.oversample_turns`` > 1); ``shares``: see episode_shares."""
    rng = np.random.default_rng([w.seed, epoch])
    segments = make_segments(lengths, w.segment, rng, turns, w.oversample_turns, shares)
    per_batch = max(1, w.batch_size // w.segment) if w.segment <= w.batch_size else 1
    if w.epoch_steps and segments:  # a fixed number of batches: passes over the segments, each in a new order
        need, drawn = w.epoch_steps * per_batch, list(segments)
        while len(drawn) < need:
            drawn.extend(segments[i] for i in rng.permutation(len(segments)))
        segments = drawn[:need]
    return [segments[i: i + per_batch] for i in range(0, len(segments), per_batch)]


def gather_segments(data: Data, segments: list[tuple[int, int, int]], window: int, stride: int,
                    cols: slice | None, cameras: list[str] | None = None, max_gap: int = 1,
                    shifts: list[np.ndarray] | None = None
                    ) -> tuple[np.ndarray, list[tuple[int, int]], np.ndarray, np.ndarray, np.ndarray]:
    """Frames of the segments (concatenated), each segment's frame slice, per-window frame index ``[N, W]``
    into the concatenation, window times ``[N, W]`` (seconds, last 0) and targets ``[N, ...]``.
    ``cameras`` picks each segment's camera (center, left, right); default: the center one. ``max_gap`` > 1
    draws every gap between a window's frames as ``stride x k``, k uniform in 1..max_gap (torch's generator):
    windows as a camera that drops or delays frames delivers them, with their true timestamps. ``shifts`` (per
    segment, one int per window): hindsight labels, the window ending at step t labelled with step t + shift's
    (the episode's last step beyond its end): the action for the state met when an action decided at t lands."""
    frames, slices, index, times, targets = [], [], [], [], []
    offset = 0
    span = (window - 1) * stride * max_gap
    for k, (e, a, b) in enumerate(segments):
        lo = max(a - span, 0)
        cam = "center" if cameras is None else cameras[k]
        frames.append((data.frames if cam == "center" else data.side_frames[cam])[e][lo:b])
        slices.append((offset, offset + b - lo))
        ts = data.times[e]
        if max_gap > 1:
            idx = irregular_window_indices(np.arange(a, b), window, stride, max_gap)
            index.extend(idx - lo + offset)
            times.extend(ts[idx] - ts[np.arange(a, b)][:, None])
        else:
            for t in range(a, b):
                idx = window_indices(t, window, stride)
                index.append(idx - lo + offset)
                times.append(ts[idx] - ts[t])
        labels = episode_targets(data, e, cols)
        targets.append(labels[a:b] if shifts is None else
                       labels[np.minimum(np.arange(a, b) + shifts[k], len(labels) - 1)])
        offset += b - lo
    return (np.concatenate(frames), slices, np.stack(index), np.stack(times).astype(np.float32),
            np.concatenate(targets))


def irregular_window_indices(steps: np.ndarray, window: int, stride: int, max_gap: int) -> np.ndarray:
    """``[len(steps), window]`` frame indexes of windows ending at ``steps`` whose gaps are ``stride x k``, k
    drawn uniformly from 1..max_gap per gap (frame 0 repeats before the episode start, as in window_indices)."""
    k = torch.randint(1, max_gap + 1, (len(steps), window - 1)).numpy()
    back = np.concatenate([np.cumsum(k[:, ::-1], axis=1)[:, ::-1], np.zeros((len(steps), 1), np.int64)], axis=1)
    return np.maximum(steps[:, None] - stride * back, 0)
