"""The training data: every episode once, frames prepared for the encoder, in memory or read lazily.

Frames: each episode's frames are prepared once at load time (``policies.frames.prepare_frames``: the
rows ``--crop`` keeps, then an area resize to the encoder input), so memory holds encoder-sized frames;
the colour space (``--color``, YUV for PilotNet) is applied on the float batch, after augmentation.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from tqdm import tqdm

from agent.runtime import show_progress
from agent.training.config import DataOptions, TrainPlan, data_paths, parse_crop, parse_image_size
from agent.training.distributed import SINGLE, World, barrier
from agent.training.recovery import dataset_geometry
from driving_data.dataset import (
    CACHE_DIR,
    DemoDataset,
    dataset_action_spaces,
    expand_pools,
    is_recording,
    open_datasets,
    pool_card,
)
from driving_data.frames import FrameFile, FrameRows
from driving_data.labels import DEFAULT_SMOOTHING_S, centred_average
from envs.registry import EnvSpec, dataset_env
from envs.replay.camera import CameraGeometry
from policies.actions import check_discrete_options
from policies.frames import prepare_frames

# --data-loading auto: lazy when the prepared frames would exceed this share of the free memory
LAZY_MEMORY_FRACTION = 0.4


@dataclass
class Data:
    """Every episode once, its frames already cropped and resized to the encoder's input (so a batch is an
    index gather, and three 160x320 cameras fit in memory), plus what the split needs. The frames are arrays
    in memory, or (``--data-loading lazy``) ``FrameFile``s that read a batch's rows from the prepared cache:
    both answer ``len`` and ``[a:b]``, so nothing downstream tells them apart."""

    frames: list[np.ndarray | FrameFile]  # per episode: uint8 [T, h, w, 3], the main (center) camera
    # "left"/"right" -> per episode, when the dataset has side cameras
    side_frames: dict[str, list[np.ndarray | FrameFile]]
    times: list[np.ndarray]  # per episode: float64 [T] seconds
    targets: list[np.ndarray]  # per episode: the expert's labels
    env: EnvSpec
    action_names: list[str]  # continuous: the names of the target's columns
    action_space: str
    frame_period: float
    image_size: list[int]  # of the frames held here (= the encoder input)
    crop: list[int] | None  # rows of the camera frame kept before the resize
    camera_width: int  # of the recorded frames (the shift augmentation is defined in camera pixels)
    num_episodes: int
    lazy: bool = False  # frames read per batch from the prepared cache (--data-loading)
    pieces: list[tuple[int, int, int]] | None = None  # time blocks: episode k here is (dataset episode, start, stop)
    smoothing_s: float = 0.0  # the targets are the labels averaged over this centred window (--smooth-labels)
    # per episode: a person's real simulator session (not an expert's)
    recorded: list[bool] = field(default_factory=list)
    # per episode: float32 [T] recorded speed, m/s (recovery labels)
    speeds: list[np.ndarray] = field(default_factory=list)
    geometry: CameraGeometry | None = None  # the camera of --recovery-views (envs.replay.spec), when they are on
    latency_steps: list[int] = field(default_factory=list)  # per episode: the latency it was driven under (collect.py)
    # per episode: a latency expert labelled it (no hindsight shift)
    labels_land: list[bool] = field(default_factory=list)
    # per episode: the actions applied, continuous [T, A] (empty: none recorded)
    applied: list[np.ndarray] = field(default_factory=list)
    sources: list[int] = field(default_factory=list)  # per episode: which --data folder it came from (0, 1, ...)
    frame_shape: tuple[int, ...] | None = None  # [H, W, C] of the recorded camera frames (every episode's)


def _side_cameras_present(dataset: DemoDataset, sides: list[str], paths: str | list[str]) -> list[str]:
    """The ``sides`` every episode has (a dataset without side cameras trains on the center one); a side some
    episodes have and others lack (recordings with and without side cameras joined) is a ValueError."""
    if not sides:
        return []
    names = [set(dataset.array_names(i)) for i in range(len(dataset))]
    lacking = {s: sum(f"frames_{s}" not in n for n in names) for s in sides}
    for s, k in lacking.items():
        if 0 < k < len(names):
            raise ValueError(f"--side-correction trains the side cameras, but {k} of {len(names)} episodes of "
                             f"{paths!r} have none: give --side-correction 0, or only datasets with side cameras")
    return [s for s, k in lacking.items() if k == 0]


def load_data(o: DataOptions, world: World = SINGLE, out: Path | None = None,
              dataset: DemoDataset | None = None) -> Data:
    """The dataset's episodes, frames prepared for the encoder, in memory or (lazy) as cache files; under
    torchrun the ranks of a machine prepare the cache together, each a share of the episodes. ``dataset``: the
    opened ``o.paths``, when the caller has it."""
    dataset = dataset or open_datasets(o.paths)
    env = dataset_env(dataset.card, dataset.episodes)
    spaces = dataset_action_spaces(dataset.card, dataset.episodes)
    if len(spaces) > 1:
        raise ValueError(f"dataset {o.paths!r} mixes action spaces {sorted(spaces)}")
    crop = parse_crop(o.crop) if o.crop != "auto" else (list(env.default_crop) if env.default_crop else None)
    camera_shape = camera_frame_shape(dataset, env, o)
    size = parse_image_size(o.image_size) if o.image_size else encoder_size(env, crop, (0, *camera_shape))
    geometry = dataset_geometry(dataset, env, crop) if o.recovery_views else None  # refuses before loading
    sides = [s for s in ("left", "right") if o.side_cameras and env.first_person]
    present = _side_cameras_present(dataset, sides, o.paths)  # in every episode, or a dataset without them
    frames, times, targets, speeds, applied = [], [], [], [], []
    camera_width = 0
    side_frames: dict[str, list[np.ndarray | FrameFile]] = {s: [] for s in present}
    lazy = use_lazy_loading(o.loading, dataset, size, sides, world)
    if lazy:
        cache = lazy_cache(dataset, crop, size, out)
        if world.active:  # the ranks of a machine prepare their share of the cache, then all read all of it
            for i in range(world.local_rank, len(dataset), world.local_size):
                for name in ["frames", *[f"frames_{s}" for s in present]]:
                    cache(i, name)
            barrier(world)
    for i in tqdm(range(len(dataset)), desc="preparing frames" if lazy else "loading episodes", unit="ep",
                  leave=False, disable=len(dataset) < 4 or not show_progress(o.progress) or not world.main):
        if lazy:  # the labels and times only; the frames stay on disk
            names = dataset.array_names(i)
            if "expert_action" not in names:
                raise ValueError(f"dataset {o.paths!r} has no expert labels (expert_action); it has {sorted(names)}")
            arrays = dataset.load(i, keys=["time", "expert_action"] + [k for k in ("speed", "action") if k in names])
            frame_shape = dataset.array_shape(i, "frames")
        else:
            arrays = dataset.load(i)
            if "expert_action" not in arrays:
                raise ValueError(f"dataset {o.paths!r} has no expert labels (expert_action); it has {sorted(arrays)}")
            frame_shape = arrays["frames"].shape
        camera_width = frame_shape[2]
        frames.append(cache(i, "frames") if lazy else prepare_frames(arrays["frames"], crop, size))
        for s in side_frames:
            side_frames[s].append(cache(i, f"frames_{s}") if lazy
                                  else prepare_frames(arrays[f"frames_{s}"], crop, size))
        times.append(arrays["time"].astype(np.float64))
        targets.append(arrays["expert_action"])
        if geometry is not None and "speed" not in arrays:
            raise ValueError(f"--recovery-views labels need the recorded speed; dataset {o.paths!r} has no speed array")
        speeds.append(np.asarray(arrays["speed"] if "speed" in arrays else np.zeros(len(arrays["time"])), np.float32))
        applied.append(np.asarray(arrays["action"], np.float32) if "action" in arrays and arrays["action"].ndim == 2
                       else np.zeros((len(arrays["time"]), 0), np.float32))
    if len(side_frames) == 1:  # one side camera alone would bias the steering: use both or none
        side_frames = {}
    first_target = targets[0]
    action_space = spaces.pop() if spaces else ("discrete" if first_target.ndim == 1 else "continuous")
    diffs = np.concatenate([np.diff(t) for t in times if len(t) > 1] or [np.array([env.dt])])
    frame_period = float(np.median(diffs)) if np.median(diffs) > 0 else env.dt
    names = list(dataset.card.get("action_names") or env.action_names.get(action_space, ()))
    if action_space == "continuous" and first_target.shape[-1] != len(names):
        raise ValueError(f"dataset {o.paths!r}: labels have {first_target.shape[-1]} columns but the env's action has "
                         f"{len(names)} ({names})")
    smoothing = label_smoothing_s(o.smooth_labels, dataset) if action_space == "continuous" else 0.0
    recorded = [is_recording(m) for m in dataset.episodes]
    if smoothing > 0:  # keyboard taps -> what the driver meant (driving_data.labels); auto: a person's sessions only
        targets = [centred_average(t, y, smoothing).astype(np.float32) if r or o.smooth_labels != "auto" else y
                   for t, y, r in zip(times, targets, recorded)]
    return Data(frames, side_frames, times, targets, env, names, action_space, frame_period, list(size), crop,
                camera_width, len(dataset), lazy, smoothing_s=smoothing, recorded=recorded, speeds=speeds,
                geometry=geometry, latency_steps=[int(m.get("latency_steps") or 0) for m in dataset.episodes],
                labels_land=[bool(m.get("labels_land")) for m in dataset.episodes], applied=applied,
                sources=dataset_sources(dataset), frame_shape=camera_shape)


def dataset_sources(dataset: DemoDataset) -> list[int]:
    """Per episode, the index of the dataset folder it lives in (in order of first appearance)."""
    index: dict[Path, int] = {}
    return [index.setdefault(p.parent.parent, len(index)) for p in dataset.paths]


def camera_frame_shape(dataset: DemoDataset, env: EnvSpec, o: DataOptions) -> tuple[int, ...]:
    """The one size [H, W, C] of the dataset's camera frames (a student is trained on one, and drives only that:
    policies.frames.check_frame_shape); ValueError when episodes differ, or when a first-person env's crop (rows
    of its own camera) would cut frames of another size (a 160x320 crop of a 480-row frame is sky)."""
    shapes = sorted({tuple(int(x) for x in dataset.array_shape(i, "frames")[1:]) for i in range(len(dataset))})
    if len(shapes) != 1:
        raise ValueError(f"dataset {o.paths!r} holds camera frames of several sizes {shapes}; a "
                         "policy is trained on one")
    shape = shapes[0]
    if o.crop == "auto" and env.first_person and env.default_crop and shape != tuple(env.frame_shape):
        h, w, c = env.frame_shape
        raise ValueError(f"dataset {o.paths!r}: its frames are {'x'.join(map(str, shape))}, but the {env.name} env's "
                         f"crop (rows {env.default_crop[0]}..{env.default_crop[1]}) is made for "
                         f"its {h}x{w}x{c} camera; "
                         "give --crop TOP:BOTTOM (and --image-size) for these frames")
    return shape


def label_smoothing_s(smooth_labels: str, dataset: DemoDataset) -> float:
    """--smooth-labels in seconds; auto: the centred 0.5 s average for recordings of the real simulator (keyboard
    or mouse steering is a train of taps), none for an expert's labels (already what it meant); with both in one
    run (--data REC SIM), auto averages the recordings' labels only."""
    if smooth_labels != "auto":
        return float(smooth_labels)
    return DEFAULT_SMOOTHING_S if any(is_recording(m) for m in dataset.episodes) else 0.0


def encoder_size(env: EnvSpec, crop: list[int] | None, frame_shape: tuple[int, ...]) -> list[int]:
    """The encoder input [h, w] when --image-size is not given: the env's, else the (cropped) camera frame."""
    h, w = frame_shape[1:3]
    return list(env.default_image_size) if env.default_image_size else [
        (crop[1] if crop else h) - (crop[0] if crop else 0), w]


def available_memory() -> int | None:
    """Bytes of memory the kernel could give without swapping (Linux MemAvailable), None when unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def use_lazy_loading(loading: str, dataset: DemoDataset, size: list[int], sides: list[str], world: World) -> bool:
    """--data-loading: memory and lazy give the same numbers, so auto only weighs memory: lazy when the
    prepared frames would take more than LAZY_MEMORY_FRACTION of the free memory, or when several ranks share
    the machine (each would hold its own copy; lazy reads go through the one shared page cache)."""
    if loading != "auto":
        return loading == "lazy"
    if world.local_size > 1:
        return True
    h, w = size
    names = dataset.array_names(0)
    cameras = 1 + sum(f"frames_{s}" in names for s in sides)
    need = dataset.num_steps * h * w * 3 * cameras
    free = available_memory()
    lazy = free is not None and need > LAZY_MEMORY_FRACTION * free
    if lazy and world.main:
        tqdm.write(f"the prepared frames would take {need / 1e9:.1f} GB of {free / 1e9:.1f} GB "
                   "free memory: reading them "
                   f"per batch from a cache on disk (--data-loading memory to keep them in memory)")
    return lazy


def lazy_cache(dataset: DemoDataset, crop: list[int] | None, size: list[int], out: Path | None):
    """``cache(i, name)`` -> episode i's camera ``name`` as a FrameFile over its prepared cache file (made on
    first use). The cache sits in the dataset folder (DATA/.cache, shared by every run with the same crop and
    size), or in the run folder when the dataset's is read-only."""
    tag = f"prepared_{'crop%d-%d_' % tuple(crop) if crop else ''}{size[0]}x{size[1]}"

    def cache(i: int, name: str) -> FrameFile:
        root = dataset.paths[i].parent.parent
        writable = os.access(root, os.W_OK) and (not (root / CACHE_DIR).exists()
                                                 or os.access(root / CACHE_DIR, os.W_OK))
        cache_root = None if writable or out is None else out / CACHE_DIR
        return dataset.prepared(i, name, tag, lambda f: prepare_frames(f, crop, size), cache_root)

    return cache


def use_recording(data: str | list[str], dataset_weight: str, strict_images: bool, out: Path,
                  made: list[Path] | None = None) -> tuple[str | list[str], str]:
    """``--data`` may name folders as the real Udacity simulator records them (``driving_log.csv`` + ``IMG/``, or
    that CSV): each is imported once into ``OUT/imported_data`` (``imported_data/<k>`` for the k-th of several; JPEG
    bytes kept as recorded) and trained from there, so ``--resume`` and later runs read the same datasets. Data
    named twice is taken once, said in one line. ``made``: the imports made now (import_recordings). A pool stands
    for its recordings, and --dataset-weight auto becomes the pool's rule. Returns (--data, --dataset-weight)."""
    from driving_data.udacity_import import import_recordings, once_each

    pools = [card for p in data_paths(data) if (card := pool_card(p)) is not None]
    if dataset_weight == "auto":
        dataset_weight = pools[0].get("weight", "sqrt") if pools else "frames"
    if pools:
        data = expand_pools(data_paths(data))
    paths = once_each(data_paths(data), tqdm.write)
    targets = ([out / "imported_data"] if isinstance(data, str)
               else [out / "imported_data" / str(k) for k in range(len(paths))])
    imported = import_recordings(paths, targets, strict_images=strict_images, warn=tqdm.write, made=made)
    if imported != data_paths(data):
        data = imported[0] if isinstance(data, str) else imported
    return data, dataset_weight


@dataclass(frozen=True)
class Head:
    """What the policy's head predicts of the dataset's labels (--head and the dataset's action space)."""

    kind: str  # "continuous" | "discrete" (PolicyConfig.head)
    names: list[str] | None  # continuous: the action names predicted; discrete: None
    cols: slice | None  # continuous: the label columns they are; discrete: None (the label is the action's index)


def resolve_head(plan: TrainPlan, data: Data) -> Head:
    """The head for --head and the dataset's action space."""
    m, label, oversample_turns = plan.model, plan.data.paths, plan.windows.oversample_turns
    head = m.head if m.head != "auto" else data.action_space
    if plan.recovery is not None and (head == "discrete" or data.action_space == "discrete"
                                 or data.action_names[:1] != ["steer"]):
        raise ValueError(f"--recovery-views relabels the steering: it needs continuous labels whose first column is "
                         f"'steer'; {label!r} has {data.action_space} actions {data.action_names}")
    if head == "discrete":
        if data.action_space != "discrete":
            raise ValueError(f"--head discrete needs a discrete dataset; {label!r} is {data.action_space}")
        if oversample_turns > 1:
            raise ValueError("--oversample-turns reads the steering labels: a discrete head has none")
        return Head("discrete", None, None)
    if data.action_space == "discrete":
        raise ValueError(f"--head {head} needs continuous actions; {label!r} holds discrete actions")
    check_discrete_options(head, "argmax", m.discrete_actions, m.action_temperature, False,
                           f"the student of {label!r}", ("--discrete-actions", "--action-temperature", ""))
    names = data.action_names
    if oversample_turns > 1 and "steer" not in names[:1]:
        raise ValueError(f"--oversample-turns reads the steering labels; {label!r} has no 'steer' action")
    if head == "steer":
        return Head("continuous", names[:1], slice(0, 1))
    return Head("continuous", names, slice(0, len(names)))


def episode_targets(data: Data, e: int, cols: slice | None) -> np.ndarray:
    t = data.targets[e]
    return t if cols is None else t[:, cols].astype(np.float32)


def take_pieces(data: Data, pieces: list[tuple[int, int, int]]) -> Data:
    """The same data with one episode per ``(episode, start, stop)`` row range: contiguous time blocks of
    the recorded episodes, frames not copied (in memory: array views; lazy: ``FrameRows`` over the files)."""
    def rows(frames: np.ndarray | FrameFile, a: int, b: int) -> np.ndarray | FrameRows:
        return frames[a:b] if isinstance(frames, np.ndarray) else FrameRows(frames, a, b)

    return replace(data, frames=[rows(data.frames[e], a, b) for e, a, b in pieces],
                   side_frames={cam: [rows(eps[e], a, b) for e, a, b in pieces]
                                for cam, eps in data.side_frames.items()},
                   times=[data.times[e][a:b] for e, a, b in pieces],
                   targets=[data.targets[e][a:b] for e, a, b in pieces],
                   speeds=[data.speeds[e][a:b] for e, a, b in pieces] if data.speeds else [],
                   num_episodes=len(pieces), pieces=list(pieces),
                   recorded=[data.recorded[e] for e, _, _ in pieces] if data.recorded else [],
                   latency_steps=[data.latency_steps[e] for e, _, _ in pieces] if data.latency_steps else [],
                   labels_land=[data.labels_land[e] for e, _, _ in pieces] if data.labels_land else [],
                   applied=[data.applied[e][a:b] for e, a, b in pieces] if data.applied else [],
                   sources=[data.sources[e] for e, _, _ in pieces] if data.sources else [])
