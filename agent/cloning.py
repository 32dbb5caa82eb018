"""Behaviour cloning: train a DrivingPolicy on recorded demonstrations (train.py is a thin CLI over this).

One run = one output folder (LeRobot style): ``best.pt`` (lowest validation loss), ``last.pt`` (the
latest state, with optimizer/scheduler/RNG so ``--resume`` continues it), ``metrics.json``, ``args.json``
and the TensorBoard event file. Several policies (``--policy nac,lstm``) or folds (``--folds 5``)
make one sub-folder per run and a comparison table (``comparison.md`` / ``.json``).

How a batch is made (the CPU budget drives this)
------------------------------------------------
Windows follow ``agent.demos.window_indices`` (the same windows ``agent.demos.WindowDataset`` yields), but
a training batch is a few *segments* of consecutive steps instead of independent windows: the frames
a segment needs are encoded by the CNN once, and every window of the segment gathers its frames'
embeddings. With window 8 and stride 3 a 16-step segment encodes 37 frames for 16 windows instead of
128 -- the CNN, which dominates the cost, runs ~3.5x less. Each step of every training episode is the
last step of exactly one window per epoch (random segment offsets, shuffled segments). Validation
encodes each episode once and scores *every* window -- the same numbers as a per-window forward.

Frames: each episode's frames are prepared once at load time (``policies.policy.prepare_frames``: the
rows ``--crop`` keeps, then an area resize to the encoder input), so memory holds encoder-sized frames;
the colour space (``--color``, YUV for PilotNet) is applied on the float batch, after augmentation.

Augmentation (training only; one draw per segment, the same for all its frames, like a camera that
is a little off for a while):
* top-down envs (CarRacing): brightness +-0.1, contrast x[0.8, 1.2], translation up to 4% of the
  image side (edge pixels replicated). No horizontal flips: a mirrored frame would need a mirrored
  steering label and CarRacing's HUD is not symmetric, so flips would teach wrong pairs.
* first-person envs (udacity; ``augment_first_person``), the PilotNet/Udacity recipe, each switchable:
  left/right cameras with a steering correction (``--side-correction``), mirrors with negated steering
  (``--flip``), sideways shifts with a steering shift per pixel (``--shift-steer``), brightness, and
  random shadows (``--shadows``). Validation always scores the center camera, unaugmented.

Split: by episode (``demos.split_episodes`` / ``demos.kfold_episodes``), never by frame.
Targets: ``expert_action``. Continuous heads regress targets normalised with the training split's
mean/std (stored in the checkpoint), MSE (or Huber) loss; discrete heads use cross-entropy,
optionally weighted by inverse class frequency.
"""
from __future__ import annotations

import json
import math
import os
import random
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from agent.demos import (CACHE_DIR, DemoDataset, FrameFile, kfold_episodes, open_datasets, split_episodes, window_indices,
                         write_json_atomic)
from agent import distributed
from agent.distributed import SINGLE, World, barrier, device_for, gather, step_seed
from agent.driver import show_progress
from agent.parallel import raise_if_stopped
from envs.registry import EnvSpec, get_spec
from policies.cores import CORES
from policies.nac import MODES as NAC_MODES
from policies.policy import (DrivingPolicy, PolicyConfig, frames_to_float, policy_from_checkpoint, prepare_frames,
                             read_checkpoint, save_checkpoint, to_color_space)

HEAD_CHOICES = ("auto", "continuous", "discrete", "steer")
LOSSES = ("huber", "mse")
LOADING = ("auto", "memory", "lazy")
LAZY_MEMORY_FRACTION = 0.4  # --data-loading auto: lazy when the prepared frames would exceed this share of the free memory


# ----------------------------------------------------------------------------- arguments
@dataclass
class TrainArgs:
    """Behaviour-cloning arguments (CleanRL style: one typed dataclass, one flag per field)."""

    data: str | list[str] = "data/carracing_continuous"  # dataset folder written by collect.py; several (--data A B C, e.g. collection shards) train as one dataset, the episodes `python -m agent.demos merge` would write
    policy: str = "nac-focus"  # sequence core(s) after the CNN, comma separated; several train one after another on the same data and print a comparison table. Names: CORE[-MODE][+FLAG]..., e.g. nac-focus, nac-exact, nac-steady+prenorm, lstm, gru, cfc, ltc, mha, mlp (docs/nac.md)
    out: str | None = None  # run folder (default: runs/train/<core>, several cores joined by _)
    window: int = 8  # frames per window
    frame_stride: int = 0  # steps between window frames; 0 = the env's own (carracing 3: 8 frames span 0.42 s at 50 Hz)
    epochs: int = 15  # passes over the training episodes
    batch_size: int = 64  # windows per optimizer step (256 gave ~4x fewer steps and a worse policy)
    segment: int = 16  # consecutive steps per segment (frames encoded once per segment)
    lr: float = 1e-3  # peak AdamW learning rate
    weight_decay: float = 1e-4  # AdamW weight decay
    warmup: float = 0.05  # fraction of the optimizer steps spent warming up, then cosine decay to 5%
    grad_clip: float = 1.0  # clip the gradient norm to this
    seed: int = 1  # seed of the weights, batches and augmentations (and of the split, unless --split-seed)
    split_seed: int | None = None  # seed of the split by episode (default: --seed); fix it to compare --seed runs
    resume: bool = False  # continue the run in --out from its last.pt, with the arguments it started with
    init: str | None = None  # start from this checkpoint's weights and architecture (fine-tuning, e.g. a DAgger round from the previous round's best.pt); --core and the architecture flags are then taken from it
    overwrite: bool = False  # allow starting a fresh run in a folder that holds one
    folds: int = 0  # >= 2: k-fold cross-validation by episode (the paper uses 5); 0: one train/val split
    val_fraction: float = 0.2  # fraction of the episodes held out for validation (without --folds)
    head: str = "auto"  # auto (from the dataset) | continuous | discrete | steer (steering only)
    loss: str = "mse"  # continuous loss on normalised targets: mse | huber (huber discounts sharp turns)
    class_weights: bool = False  # discrete: weight cross-entropy by inverse class frequency
    augment: bool = True  # camera augmentations: brightness, contrast, shifts (first-person envs add the Udacity recipe; see agent/cloning.py)
    side_correction: float = 0.2  # first-person: train on left/right cameras too, steering + / - this (0 = center only)
    flip: bool = True  # first-person: mirror half of the segments and negate their steering
    shift_steer: float = 0.002  # first-person: shift up to 50 camera px sideways, steering += this per px (0 = off)
    shadows: bool = True  # first-person: darken a random slanted region of the frame (tree and building shadows)
    crop: str = "auto"  # rows of the camera frame kept, "top:bottom" | none | auto (the env's: udacity 60:135)
    color: str = "auto"  # rgb | yuv | auto (the env's: udacity yuv, carracing rgb)
    encoder: str = "auto"  # auto (the env's own) | carracing (paper CNN) | pilotnet
    image_size: str | None = None  # encoder input "HxW"; default: the env's (udacity 66x200), else the (cropped) frame
    feature_dim: int = 64  # per-frame CNN embedding size
    d_model: int = 64  # nac / mha width
    heads: int = 16  # nac heads (mha uses 4)
    topk: int = 8  # nac: keys each query attends to (top-k)
    sparsity: float = 0.5  # nac: fraction of the wiring's connections removed (AutoNCP)
    nac_mode: str = "exact"  # exact | euler | steady (for plain "nac")
    hidden: int = 64  # lstm / gru / cfc / mlp width (ltc: half, its ODE solver is 6x costlier)
    device: str = "auto"  # auto (cuda if available) | cpu | cuda
    threads: int = 0  # torch CPU threads (per process under torchrun); 0 = auto: 2, or 1 when the machine is already busy (under torchrun: the machine's cores shared among its processes)
    data_loading: str = "auto"  # where the prepared frames live: memory | lazy (prepared once into an uncompressed cache, DATA/.cache, and read per batch: memory stays bounded, results are identical) | auto (lazy when they would take over 40% of the free memory, or when torchrun runs several processes on the machine)
    log_every: int = 10  # optimizer steps between TensorBoard scalars
    progress: bool = True  # progress bars on stderr when it is a terminal (log files get the per-epoch lines only)


def parse_policy_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """A policy name -> (core, the options the name sets); the grammar lives in policies.cores.parse_core_name."""
    from policies.cores import parse_core_name

    return parse_core_name(spec)


def check_args(a: TrainArgs) -> list[str]:
    """Validate at the boundary; returns the list of policy specs."""
    specs = [s.strip() for s in a.policy.split(",") if s.strip()]
    if not specs:
        raise ValueError(f"--core needs at least one name, got {a.policy!r}")
    if len(set(specs)) != len(specs):
        raise ValueError(f"--core lists a name twice: {a.policy!r}")
    for s in specs:
        parse_policy_spec(s)
    for name in ("window", "frame_stride", "epochs", "batch_size", "segment", "feature_dim", "d_model",
                 "heads", "topk", "hidden", "threads", "log_every"):
        if getattr(a, name) < (0 if name in ("threads", "frame_stride") else 1):
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    if a.folds == 1 or a.folds < 0:
        raise ValueError(f"--folds must be 0 (one split) or >= 2, got {a.folds}")
    if not 0.0 < a.val_fraction < 1.0:
        raise ValueError(f"--val-fraction must be in (0, 1), got {a.val_fraction}")
    if not (a.lr > 0 and a.weight_decay >= 0 and 0 <= a.warmup < 1 and a.grad_clip > 0):
        raise ValueError("--lr and --grad-clip must be > 0, --weight-decay >= 0, --warmup in [0, 1)")
    if a.head not in HEAD_CHOICES:
        raise ValueError(f"--head must be one of {', '.join(HEAD_CHOICES)}, got {a.head!r}")
    if a.loss not in LOSSES:
        raise ValueError(f"--loss must be one of {', '.join(LOSSES)}, got {a.loss!r}")
    if a.nac_mode not in NAC_MODES:
        raise ValueError(f"--nac-mode must be one of {', '.join(NAC_MODES)}, got {a.nac_mode!r}")
    if a.init is not None:
        if len(specs) > 1 or a.folds:
            raise ValueError("--init fine-tunes one checkpoint: it takes one --core and no --folds")
        read_checkpoint(a.init)  # a missing or foreign file is refused here, before any data is read
    if a.data_loading not in LOADING:
        raise ValueError(f"--data-loading must be one of {', '.join(LOADING)}, got {a.data_loading!r}")
    if not data_paths(a.data):
        raise ValueError("--data needs at least one dataset folder")
    if a.device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"--device must be auto, cpu or cuda, got {a.device!r}")
    if a.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for but CUDA is not available")
    if a.image_size is not None:
        parse_image_size(a.image_size)
    if a.crop != "auto":
        parse_crop(a.crop)
    if a.color not in ("auto", "rgb", "yuv"):
        raise ValueError(f"--color must be auto, rgb or yuv, got {a.color!r}")
    if not (0 <= a.side_correction <= 1 and 0 <= a.shift_steer <= 0.02):
        raise ValueError("--side-correction must be in [0, 1] and --shift-steer in [0, 0.02] (steering per pixel)")
    return specs


def parse_image_size(text: str) -> list[int]:
    try:
        h, w = (int(v) for v in text.lower().split("x"))
        assert h > 0 and w > 0
    except (ValueError, AssertionError):
        raise ValueError(f"--image-size must look like 96x96 (height x width), got {text!r}") from None
    return [h, w]


def core_options(a: TrainArgs, spec: str) -> tuple[str, dict[str, Any]]:
    """(core, its options) for a policy name: policies.cores.policy_core_options with this run's settings.

    ``--hidden`` overrides the recurrent/MLP width only when it differs from its default; otherwise every
    core is ``--d-model`` wide (an explicit ``--hidden`` equal to the default reads as "not given")."""
    from policies.cores import policy_core_options

    default_hidden = next(f.default for f in fields(TrainArgs) if f.name == "hidden")
    return policy_core_options(spec, d_model=a.d_model, heads=a.heads, topk=a.topk, sparsity=a.sparsity,
                               nac_mode=a.nac_mode, hidden=None if a.hidden == default_hidden else a.hidden,
                               seed=22222 + a.seed)


# ----------------------------------------------------------------------------- data
@dataclass
class Data:
    """Every episode once, its frames already cropped and resized to the encoder's input (so a batch is an
    index gather, and three 160x320 cameras fit in memory), plus what the split needs. The frames are arrays
    in memory, or (``--data-loading lazy``) ``FrameFile``s that read a batch's rows from the prepared cache:
    both answer ``len`` and ``[a:b]``, so nothing downstream tells them apart."""

    frames: list[np.ndarray | FrameFile]  # per episode: uint8 [T, h, w, 3], the main (center) camera
    side_frames: dict[str, list[np.ndarray | FrameFile]]  # "left"/"right" -> per episode, when the dataset has side cameras
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


def load_data(a: TrainArgs, world: World = SINGLE, out: Path | None = None) -> Data:
    """The dataset's episodes, frames prepared for the encoder, in memory or (lazy) as cache files; under
    torchrun the ranks of a machine prepare the cache together, each a share of the episodes."""
    dataset = open_datasets(a.data)
    env = dataset_env(dataset.card, dataset.episodes)
    spaces = {m.get("action_space") for m in dataset.episodes} | ({dataset.card["action_space"]}
                                                                   if "action_space" in dataset.card else set())
    spaces.discard(None)
    if len(spaces) > 1:
        raise ValueError(f"dataset {a.data!r} mixes action spaces {sorted(spaces)}")
    crop = parse_crop(a.crop) if a.crop != "auto" else (list(env.default_crop) if env.default_crop else None)
    size = parse_image_size(a.image_size) if a.image_size else encoder_size(env, crop, dataset.array_shape(0, "frames"))
    sides = [s for s in ("left", "right") if a.side_correction > 0 and env.first_person]
    frames, times, targets = [], [], []
    camera_width = 0
    side_frames: dict[str, list[np.ndarray | FrameFile]] = {s: [] for s in sides}
    lazy = use_lazy_loading(a, dataset, size, sides, world)
    if lazy:
        cache = lazy_cache(dataset, crop, size, out)
        if world.active:  # the ranks of a machine prepare their share of the cache, then all read all of it
            for i in range(world.local_rank, len(dataset), world.local_size):
                for name in ["frames", *[f"frames_{s}" for s in sides if f"frames_{s}" in dataset.array_names(i)]]:
                    cache(i, name)
            barrier(world)
    for i in tqdm(range(len(dataset)), desc="preparing frames" if lazy else "loading episodes", unit="ep",
                  leave=False, disable=len(dataset) < 4 or not show_progress(a.progress) or not world.main):
        if lazy:  # the labels and times only; the frames stay on disk
            names = dataset.array_names(i)
            if "expert_action" not in names:
                raise ValueError(f"dataset {a.data!r} has no expert labels (expert_action); it has {sorted(names)}")
            arrays = dataset.load(i, keys=["time", "expert_action"])
            frame_shape = dataset.array_shape(i, "frames")
        else:
            arrays = dataset.load(i)
            if "expert_action" not in arrays:
                raise ValueError(f"dataset {a.data!r} has no expert labels (expert_action); it has {sorted(arrays)}")
            names, frame_shape = list(arrays), arrays["frames"].shape
        camera_width = frame_shape[2]
        frames.append(cache(i, "frames") if lazy else prepare_frames(arrays["frames"], crop, size))
        for s in list(side_frames):
            if f"frames_{s}" not in names:  # a dataset without side cameras: train on the center one
                side_frames.pop(s)
                continue
            side_frames[s].append(cache(i, f"frames_{s}") if lazy else prepare_frames(arrays[f"frames_{s}"], crop, size))
        times.append(arrays["time"].astype(np.float64))
        targets.append(arrays["expert_action"])
    if len(side_frames) == 1:  # one side camera alone would bias the steering: use both or none
        side_frames = {}
    first_target = targets[0]
    action_space = spaces.pop() if spaces else ("discrete" if first_target.ndim == 1 else "continuous")
    diffs = np.concatenate([np.diff(t) for t in times if len(t) > 1] or [np.array([env.dt])])
    frame_period = float(np.median(diffs)) if np.median(diffs) > 0 else env.dt
    names = list(dataset.card.get("action_names") or env.action_names.get(action_space, ()))
    if action_space == "continuous" and first_target.shape[-1] != len(names):
        raise ValueError(f"dataset {a.data!r}: labels have {first_target.shape[-1]} columns but the env's action has "
                         f"{len(names)} ({names})")
    return Data(frames, side_frames, times, targets, env, names, action_space, frame_period, list(size), crop,
                camera_width, len(dataset), lazy)


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


def use_lazy_loading(a: TrainArgs, dataset: DemoDataset, size: list[int], sides: list[str], world: World) -> bool:
    """--data-loading: memory and lazy give the same numbers, so auto only weighs memory: lazy when the
    prepared frames would take more than LAZY_MEMORY_FRACTION of the free memory, or when several ranks share
    the machine (each would hold its own copy; lazy reads go through the one shared page cache)."""
    if a.data_loading != "auto":
        return a.data_loading == "lazy"
    if world.local_size > 1:
        return True
    h, w = size
    names = dataset.array_names(0)
    cameras = 1 + sum(f"frames_{s}" in names for s in sides)
    need = dataset.num_steps * h * w * 3 * cameras
    free = available_memory()
    lazy = free is not None and need > LAZY_MEMORY_FRACTION * free
    if lazy and world.main:
        tqdm.write(f"the prepared frames would take {need / 1e9:.1f} GB of {free / 1e9:.1f} GB free memory: reading them "
                   f"per batch from a cache on disk (--data-loading memory to keep them in memory)")
    return lazy


def lazy_cache(dataset: DemoDataset, crop: list[int] | None, size: list[int], out: Path | None):
    """``cache(i, name)`` -> episode i's camera ``name`` as a FrameFile over its prepared cache file (made on
    first use). The cache sits in the dataset folder (DATA/.cache, shared by every run with the same crop and
    size), or in the run folder when the dataset's is read-only."""
    tag = f"prepared_{'crop%d-%d_' % tuple(crop) if crop else ''}{size[0]}x{size[1]}"

    def cache(i: int, name: str) -> FrameFile:
        root = dataset.paths[i].parent.parent
        writable = os.access(root, os.W_OK) and (not (root / CACHE_DIR).exists() or os.access(root / CACHE_DIR, os.W_OK))
        cache_root = None if writable or out is None else out / CACHE_DIR
        return dataset.prepared(i, name, tag, lambda f: prepare_frames(f, crop, size), cache_root)

    return cache


def parse_crop(text: str | None) -> list[int] | None:
    """``--crop 60:135`` -> [60, 135] (rows kept); ``none`` -> None."""
    if text is None or text.lower() == "none":
        return None
    try:
        top, bottom = (int(v) for v in text.split(":"))
        assert 0 <= top < bottom
    except (ValueError, AssertionError):
        raise ValueError(f"--crop must look like 60:135 (first and one-past-last row kept), none or auto; got {text!r}") from None
    return [top, bottom]


def dataset_env(card: dict, episodes: list[dict]) -> EnvSpec:
    """The env a dataset was recorded in (card or episode meta; datasets older than the udacity env are CarRacing)."""
    names = {card.get("env")} | {m.get("env") for m in episodes}
    names.discard(None)
    if len(names) > 1:
        raise ValueError(f"the dataset mixes environments {sorted(names)}")
    return get_spec(names.pop() if names else "carracing")


def use_recording(a: TrainArgs, out: Path) -> TrainArgs:
    """``--data`` may be a folder as the real Udacity simulator records it (``driving_log.csv`` + ``IMG/``):
    it is imported once into ``OUT/imported_data`` (JPEG bytes kept as recorded) and trained from there, so
    ``--resume`` and later runs read the same dataset."""
    from agent.udacity_format import CSV_NAME, import_udacity

    if isinstance(a.data, list):
        recordings = [d for d in a.data if (Path(d) / CSV_NAME).is_file() and not (Path(d) / "dataset.json").is_file()]
        if recordings:
            raise ValueError(f"{recordings[0]!r} is a Udacity simulator recording; several --data folders must be "
                             f"datasets: import it first (python -m agent.udacity_format import ...)")
        return a
    data = Path(a.data)
    if not (data / CSV_NAME).is_file() or (data / "dataset.json").is_file():
        return a
    target = out / "imported_data"
    if not (target / "dataset.json").is_file():
        tqdm.write(f"{data} is a Udacity simulator recording: importing it into {target}")
        import_udacity(data, target)
    return replace(a, data=str(target))


def init_architecture(a: TrainArgs) -> TrainArgs:
    """--init: the arguments that shape the policy and its input come from the checkpoint, not the flags."""
    payload = read_checkpoint(a.init)
    c = PolicyConfig.from_dict(payload["config"])
    label = (payload.get("metadata") or {}).get("policy") or c.core
    return replace(a, policy=str(label), window=c.window, frame_stride=c.frame_stride, encoder=c.encoder,
                   feature_dim=c.feature_dim, image_size=f"{c.image_size[0]}x{c.image_size[1]}",
                   crop="none" if c.crop is None else f"{c.crop[0]}:{c.crop[1]}", color=c.color)


def resolve_env_defaults(a: TrainArgs) -> TrainArgs:
    """Fill the arguments whose default depends on the dataset's env (encoder, frame stride)."""
    if a.encoder != "auto" and a.frame_stride:
        return a
    dataset = open_datasets(a.data)
    env = dataset_env(dataset.card, dataset.episodes)
    return replace(a, encoder=env.default_encoder if a.encoder == "auto" else a.encoder,
                   frame_stride=a.frame_stride or env.default_frame_stride)


def resolve_head(a: TrainArgs, data: Data) -> tuple[str, list[str] | None, slice | None]:
    """(head, continuous action names, target columns) for --head and the dataset's action space."""
    head = a.head if a.head != "auto" else data.action_space
    if head == "discrete":
        if data.action_space != "discrete":
            raise ValueError(f"--head discrete needs a discrete dataset; {a.data!r} is {data.action_space}")
        return "discrete", None, None
    if data.action_space == "discrete":
        raise ValueError(f"--head {head} needs continuous actions; {a.data!r} holds discrete actions")
    names = data.action_names
    if head == "steer":
        return "continuous", names[:1], slice(0, 1)
    return "continuous", names, slice(0, len(names))


def initial_policy(path: str, data: Data, head: str, names: list[str] | None) -> DrivingPolicy:
    """--init: the checkpoint's policy, checked to drive this dataset's env and predict its actions (its frame
    size and crop already shaped the data: init_architecture). Its target normalisation is kept: the weights
    were trained against it."""
    policy = policy_from_checkpoint(read_checkpoint(path), f"--init {path!r}")
    c = policy.config
    expected = {"env": data.env.gym_id, "head": head}
    if head == "continuous":
        expected["action_names"] = list(names or [])
    got = {"env": c.env, "head": c.head, "action_names": list(c.action_names)}
    wrong = [f"{k} {got[k]!r} (the data needs {v!r})" for k, v in expected.items() if got[k] != v]
    if wrong:
        raise ValueError(f"--init {path!r} cannot be fine-tuned on this dataset: its " + "; ".join(wrong))
    return policy


def episode_targets(data: Data, e: int, cols: slice | None) -> np.ndarray:
    t = data.targets[e]
    return t if cols is None else t[:, cols].astype(np.float32)


def make_segments(lengths: dict[int, int], segment: int, rng: np.random.Generator) -> list[tuple[int, int, int]]:
    """Cover every step of every episode once with ``(episode, start, stop)`` segments, random offsets, shuffled."""
    segments = []
    for e, n in lengths.items():
        offset = int(rng.integers(segment))
        for s in range(-offset, n, segment):
            a, b = max(s, 0), min(s + segment, n)
            if b > a:
                segments.append((e, a, b))
    order = rng.permutation(len(segments))
    return [segments[i] for i in order]


def batch_plan(lengths: dict[int, int], a: TrainArgs, epoch: int) -> list[list[tuple[int, int, int]]]:
    """The epoch's batches: deterministic in (seed, epoch), so a resumed run replays the same order."""
    rng = np.random.default_rng([a.seed, epoch])
    segments = make_segments(lengths, a.segment, rng)
    per_batch = max(1, a.batch_size // a.segment) if a.segment <= a.batch_size else 1
    return [segments[i: i + per_batch] for i in range(0, len(segments), per_batch)]


def gather_segments(data: Data, segments: list[tuple[int, int, int]], window: int, stride: int,
                    cols: slice | None, cameras: list[str] | None = None
                    ) -> tuple[np.ndarray, list[tuple[int, int]], np.ndarray, np.ndarray, np.ndarray]:
    """Frames of the segments (concatenated), each segment's frame slice, per-window frame index ``[N, W]``
    into the concatenation, window times ``[N, W]`` (seconds, last 0) and targets ``[N, ...]``.
    ``cameras`` picks each segment's camera (center, left, right); default: the center one."""
    frames, slices, index, times, targets = [], [], [], [], []
    offset = 0
    span = (window - 1) * stride
    for k, (e, a, b) in enumerate(segments):
        lo = max(a - span, 0)
        cam = "center" if cameras is None else cameras[k]
        frames.append((data.frames if cam == "center" else data.side_frames[cam])[e][lo:b])
        slices.append((offset, offset + b - lo))
        ts = data.times[e]
        for t in range(a, b):
            idx = window_indices(t, window, stride)
            index.append(idx - lo + offset)
            times.append(ts[idx] - ts[t])
        targets.append(episode_targets(data, e, cols)[a:b])
        offset += b - lo
    return (np.concatenate(frames), slices, np.stack(index), np.stack(times).astype(np.float32),
            np.concatenate(targets))


def shift_(out: torch.Tensor, frames: torch.Tensor, dy: int, dx: int) -> torch.Tensor:
    """Translate uint8 frames ``[n, H, W, 3]`` by (dy, dx) pixels into ``out``, edge rows/columns replicated."""
    H, W = frames.shape[1:3]
    rows = torch.empty_like(frames)
    rows[:, max(dy, 0): H + min(dy, 0)] = frames[:, max(-dy, 0): H - max(dy, 0)]
    if dy > 0:
        rows[:, :dy] = rows[:, dy: dy + 1]
    elif dy < 0:
        rows[:, H + dy:] = rows[:, H + dy - 1: H + dy]
    out[:, :, max(dx, 0): W + min(dx, 0)] = rows[:, :, max(-dx, 0): W - max(dx, 0)]
    if dx > 0:
        out[:, :, :dx] = out[:, :, dx: dx + 1]
    elif dx < 0:
        out[:, :, W + dx:] = out[:, :, W + dx - 1: W + dx]
    return out


def augment(frames: torch.Tensor, slices: list[tuple[int, int]], image_size: list[int],
            device: torch.device, color: str = "rgb") -> torch.Tensor:
    """uint8 frames ``[N, H, W, 3]`` -> augmented float network input ``[N, 3, h, w]``.

    One draw per segment: a translation of up to 4% of the side (edge pixels replicated; done on
    uint8, where it is cheap), then contrast x[0.8, 1.2] around mid-grey and brightness +-0.1
    (not clipped back to [0, 1]: a clamp costs another pass and the CNN does not need it).
    """
    N, H, W = frames.shape[:3]
    max_dy, max_dx = max(1, round(0.04 * H)), max(1, round(0.04 * W))
    r = torch.rand(len(slices), 4)
    shifted = torch.empty_like(frames)
    for (s, e), (_, _, ry, rx) in zip(slices, r.tolist()):
        shift_(shifted[s:e], frames[s:e], round((2 * ry - 1) * max_dy), round((2 * rx - 1) * max_dx))
    lengths = torch.tensor([e - s for s, e in slices])
    contrast = (0.8 + 0.4 * r[:, 0]).repeat_interleave(lengths).view(N, 1, 1, 1).to(device)
    brightness = ((r[:, 1] - 0.5) * 0.2).repeat_interleave(lengths).view(N, 1, 1, 1).to(device)
    x = frames_to_float(shifted, image_size, device)
    return to_color_space(x.mul_(contrast).add_(0.5 - 0.5 * contrast + brightness), color)


def augment_first_person(data: Data, segments: list[tuple[int, int, int]], a: TrainArgs, cols: slice | None,
                         color: str, device: torch.device
                         ) -> tuple[torch.Tensor, np.ndarray, np.ndarray, np.ndarray]:
    """The Udacity/PilotNet recipe, one draw per segment (every window of a segment sees the same camera):
    a random camera of the three (left: steering + side_correction, right: - side_correction), a mirror
    with probability 0.5 (steering negated), a sideways shift of up to 50 camera pixels (steering +=
    shift_steer per pixel; a road shifted right means the car sits left of its line) and up to 5 rows,
    brightness x[0.8, 1.2] and a random slanted shadow darkening one side of the frame to 50-80 %.
    Returns the network input, the window index and times (as gather_segments) and the adjusted targets."""
    cams = ["center", *data.side_frames]
    n_seg = len(segments)
    r = torch.rand(n_seg, 8)
    cameras = [cams[min(int(u * len(cams)), len(cams) - 1)] for u in r[:, 0].tolist()]
    frames, slices, index, times, target = gather_segments(data, segments, a.window, a.frame_stride, cols, cameras)
    target = target.copy()
    frames = torch.from_numpy(frames)
    h, w = frames.shape[1:3]
    px = w / max(data.camera_width, 1)  # encoder pixels per camera pixel
    windows = torch.tensor([b - s for _, s, b in segments])
    steer = target[:, 0]  # the steering column (first of the env's continuous action)
    out = torch.empty_like(frames)
    shadow_side = torch.zeros(n_seg, dtype=torch.bool)
    for k, ((s, e), cam, rr) in enumerate(zip(slices, cameras, r.tolist())):
        delta = 0.0
        if cam != "center":
            delta += a.side_correction if cam == "left" else -a.side_correction
        dx = round((2 * rr[2] - 1) * 50 * px) if a.shift_steer > 0 else 0
        dy = round((2 * rr[3] - 1) * 5 * px) if a.shift_steer > 0 else 0
        delta += a.shift_steer * dx / px
        shift_(out[s:e], frames[s:e], dy, dx)
        flip = a.flip and rr[1] < 0.5
        if flip:
            out[s:e] = out[s:e].flip(2)
        lo = int(windows[:k].sum())
        hi = lo + int(windows[k])
        steer[lo:hi] = np.clip(steer[lo:hi] + delta, -1.0, 1.0) * (-1.0 if flip else 1.0)
        shadow_side[k] = rr[7] < 0.5
    lengths = torch.tensor([e - s for s, e in slices])
    x = frames_to_float(out, data.image_size, device)
    gain = (0.8 + 0.4 * r[:, 4]).repeat_interleave(lengths).view(-1, 1, 1, 1).to(device)
    x.mul_(gain)
    if a.shadows:
        # a line from (x0, top) to (x1, bottom); one side of it is darkened, in half of the segments
        cols_ = torch.arange(w, device=device).view(1, 1, w).float()
        rows_ = torch.linspace(0, 1, h, device=device).view(1, h, 1)
        x0 = (r[:, 5] * w).repeat_interleave(lengths).view(-1, 1, 1).to(device)
        x1 = (r[:, 6] * w).repeat_interleave(lengths).view(-1, 1, 1).to(device)
        left = shadow_side.repeat_interleave(lengths).view(-1, 1, 1).to(device)
        edge = x0 + (x1 - x0) * rows_
        region = torch.where(left, cols_ < edge, cols_ >= edge)
        on = (r[:, 7] < 0.5).repeat_interleave(lengths).view(-1, 1, 1).to(device) & region
        dark = (0.5 + 0.3 * r[:, 3]).repeat_interleave(lengths).view(-1, 1, 1).to(device)
        x.mul_(torch.where(on, dark, torch.ones_like(dark)).unsqueeze(1))
    return to_color_space(x.clamp_(0.0, 1.0), color), index, times, target


# ----------------------------------------------------------------------------- losses and metrics
def loss_fn(policy: DrivingPolicy, raw: torch.Tensor, target: torch.Tensor, a: TrainArgs,
            class_weight: torch.Tensor | None) -> torch.Tensor:
    if policy.config.head == "discrete":
        return F.cross_entropy(raw, target, weight=class_weight)
    z = policy.normalize_target(target)
    return F.smooth_l1_loss(raw, z) if a.loss == "huber" else F.mse_loss(raw, z)


@torch.no_grad()
def evaluate(policy: DrivingPolicy, data: Data, episodes: list[int], a: TrainArgs, cols: slice | None,
             class_weight: torch.Tensor | None = None, chunk: int = 256, world: World = SINGLE) -> dict[str, float]:
    """Loss and metrics over *every* window of ``episodes`` (each episode's frames encoded once). Under
    torchrun each rank scores its share of the episodes and every rank reduces all of them in episode order:
    the numbers one process would get."""
    policy.eval()
    W, S = policy.config.window, policy.config.frame_stride
    scored = {}
    for e in world.part(episodes):
        losses, outputs, targets = [], [], []
        n = len(data.frames[e])
        for start in range(0, n, chunk):
            frames, _, index, times, target = gather_segments(data, [(e, start, min(start + chunk, n))], W, S, cols)
            emb = policy.encode(torch.from_numpy(frames)[None])[0]
            raw = policy.raw_from_embeddings(emb[torch.from_numpy(index).to(emb.device)],
                                             torch.from_numpy(times).to(emb.device))
            target_t = torch.from_numpy(target).to(emb.device)
            losses.append(loss_fn(policy, raw, target_t, a, class_weight).item() * len(target))
            outputs.append(policy.postprocess(raw).cpu())
            targets.append(target_t.cpu())
        scored[e] = (losses, outputs, targets)
    if world.active:
        scored = {e: v for part in gather(world, scored) for e, v in part.items()}
    losses = [x for e in episodes for x in scored[e][0]]
    out, tgt = torch.cat([x for e in episodes for x in scored[e][1]]), torch.cat([x for e in episodes for x in scored[e][2]])
    metrics = {"val_loss": sum(losses) / len(tgt), "val_windows": len(tgt)}
    if policy.config.head == "discrete":
        metrics["val_accuracy"] = (out.argmax(-1) == tgt).float().mean().item()
    else:
        low = torch.tensor(policy.config.action_low)
        high = torch.tensor(policy.config.action_high)
        err = out.clamp(low, high) - tgt  # judged as the env would see it: clipped
        metrics["val_mae"] = err.abs().mean().item()
        metrics["val_mse"] = err.pow(2).mean().item()
        for i, name in enumerate(policy.config.action_names):
            metrics[f"val_{name}_mae"] = err[:, i].abs().mean().item()
    return metrics


def log_nac_internals(writer, policy: DrivingPolicy, data: Data, episode: int, step: int,
                      cols: slice | None) -> dict[str, float]:
    """Attention diagnostics of an attention core (nac, mha) over a validation chunk (its first 128 windows).

    Scalars ``attention/entropy`` (nats), ``attention/entropy_norm`` (entropy / log(valid keys): 1 uniform),
    ``attention/max_weight`` and ``attention/uniform_max_weight`` (what uniform attention would give on the
    same queries), see ``policies.nac.attention_stats``; NAC also histograms of phi and omega (and of its
    logit scales when it has them); an image of one window's causal attention map. Returns
    ``{"attn_entropy", "attn_entropy_norm", "attn_max_weight"}`` (the comparison table's columns; ``{}``
    for cores without attention)."""
    if policy.config.core not in ("nac", "mha"):
        return {}
    policy.eval()
    W, S = policy.config.window, policy.config.frame_stride
    n = len(data.frames[episode])
    with torch.no_grad():
        frames, _, index, times, _ = gather_segments(data, [(episode, 0, min(n, 128))], W, S, cols)
        emb = policy.encode(torch.from_numpy(frames)[None])[0]
        x = emb[torch.from_numpy(index).to(emb.device)]
        internals = policy.core.internals(x, policy.core_time(torch.from_numpy(times).to(emb.device), *x.shape[:2]))
    if not internals or "attn" not in internals:
        return {}
    for key in ("entropy", "entropy_norm", "max_weight", "uniform_max_weight"):
        writer.add_scalar(f"attention/{key}", float(internals[key]), step)
    valid = internals["index"] >= 0
    if "phi" in internals:
        writer.add_histogram("nac/phi", internals["phi"][valid].float().cpu(), step)
        writer.add_histogram("nac/omega", internals["omega"][valid].float().cpu(), step)
    if "logit_scale" in internals:
        writer.add_histogram("nac/logit_scale", internals["logit_scale"].float().cpu(), step)
        writer.add_scalar("attention/logit_scale_mean", float(internals["logit_scale"].mean()), step)
    sample = len(x) - 1  # the last window of the chunk: a full window past the episode start
    attn, idx = internals["attn"][sample], internals["index"][sample].clamp(min=0)  # [H, T, K]
    dense = torch.zeros(*attn.shape[:2], W, device=attn.device).scatter_add_(-1, idx, attn).mean(0)  # [T, T]
    image = (dense / dense.max().clamp(min=1e-8)).cpu()
    image = image.repeat_interleave(16, 0).repeat_interleave(16, 1)[None]  # [1, 16T, 16T], query rows, key cols
    writer.add_image(f"{policy.config.core}/attention", image, step, dataformats="CHW")
    return {f"attn_{key}": float(internals[key]) for key in ("entropy", "entropy_norm", "max_weight")}


# ----------------------------------------------------------------------------- one run
class Interrupted(Exception):
    """Ctrl-C during training; last.pt holds the state at the interruption."""


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state()[1].tolist(),
             "numpy_pos": int(np.random.get_state()[2]), "python": list(random.getstate()[1])}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(("MT19937", np.array(state["numpy"], dtype=np.uint32), state["numpy_pos"], 0, 0.0))
    random.setstate((3, tuple(state["python"]), None))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def make_schedule(optimizer: torch.optim.Optimizer, total_steps: int, warmup: float) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup, then cosine decay to 5% of the peak learning rate."""
    warm = max(1, int(warmup * total_steps))

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        progress = min(1.0, (step - warm) / max(1, total_steps - warm))
        return 0.05 + 0.95 * 0.5 * (1.0 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def make_optimizer(policy: DrivingPolicy, a: TrainArgs) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices/kernels only (not biases, norms or positions)."""
    decay = [p for n, p in policy.named_parameters() if p.dim() >= 2 and not n.endswith("pos")]
    rest = [p for n, p in policy.named_parameters() if not (p.dim() >= 2 and not n.endswith("pos"))]
    return torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                              {"params": rest, "weight_decay": 0.0}], lr=a.lr)


class WindowsForward(torch.nn.Module):
    """The training forward as one module: a batch's frames -> embeddings -> each window's head output.
    DistributedDataParallel synchronises gradients of what runs through a module's forward(), so under
    torchrun this is what it wraps; a single process calls it as it is."""

    def __init__(self, policy: DrivingPolicy):
        super().__init__()
        self.policy = policy

    def forward(self, x: torch.Tensor, index: torch.Tensor, times: torch.Tensor) -> torch.Tensor:
        emb = self.policy.encode(x[None])[0]
        return self.policy.raw_from_embeddings(emb[index], times)


class _NoWriter:
    """TensorBoard for ranks other than 0: they compute the same scalars and write none."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


def train_run(a: TrainArgs, spec: str, data: Data, train_eps: list[int], val_eps: list[int], run_dir: Path,
              desc: str = "", world: World = SINGLE, device: torch.device | None = None) -> dict[str, Any]:
    """Train one policy on one split into ``run_dir``; returns its metrics (also written to metrics.json).

    Under torchrun every rank runs this with the same arguments: each step's segments are shared out among
    the ranks (agent.distributed), gradients are averaged by DistributedDataParallel, validation is scored
    by all and reduced in episode order, and rank 0 alone writes checkpoints, TensorBoard and metrics.json."""
    from torch.utils.tensorboard import SummaryWriter

    device = device or device_for(a.device, world)
    head, names, cols = resolve_head(a, data)
    last_path, best_path = run_dir / "last.pt", run_dir / "best.pt"
    resumed = None
    if last_path.exists() and a.resume:
        resumed = read_checkpoint(last_path)
        if "train_state" not in resumed:
            raise ValueError(f"{str(last_path)!r} has no training state to resume from")
    elif last_path.exists() and not a.overwrite:
        raise ValueError(f"{str(run_dir)!r} already holds a run (last.pt); pass --resume to continue it, "
                         f"--overwrite to start again, or another --out")
    elif a.overwrite and world.main:  # a fresh start: old event files would mix two runs in TensorBoard
        for old in run_dir.glob("events.out.tfevents.*"):
            old.unlink()
    if resumed and resumed["train_state"].get("done"):
        metrics_path = run_dir / "metrics.json"
        if metrics_path.exists():
            if world.main:
                tqdm.write(f"{desc or spec}: already finished, reusing {metrics_path}")
            return json.loads(metrics_path.read_text())

    seed_everything(a.seed)
    train_targets = np.concatenate([episode_targets(data, e, cols) for e in train_eps])
    class_weight = None
    if resumed:
        policy = policy_from_checkpoint(resumed, f"checkpoint {str(last_path)!r}")
    elif a.init is not None:
        policy = initial_policy(a.init, data, head, names)
    else:
        core, options = core_options(a, spec)
        extra: dict[str, Any] = {}
        if head == "continuous":
            extra = {"target_mean": train_targets.mean(0).astype(float).tolist(),
                     "target_std": np.maximum(train_targets.std(0), 1e-2).astype(float).tolist()}
        config = PolicyConfig.for_actions(
            head, names, encoder=a.encoder, feature_dim=a.feature_dim, core=core, core_options=options,
            window=a.window, frame_stride=a.frame_stride, frame_period=data.frame_period,
            image_size=data.image_size, crop=data.crop,
            color=a.color if a.color != "auto" else data.env.default_color,
            action_space=data.action_space, env=data.env.gym_id, **extra)
        policy = DrivingPolicy(config)
    policy.to(device)
    if head == "discrete" and a.class_weights:
        counts = np.bincount(train_targets, minlength=5).astype(np.float64)
        w = np.where(counts > 0, counts.sum() / np.maximum(counts, 1) / (counts > 0).sum(), 0.0)
        class_weight = torch.tensor(w, dtype=torch.float32, device=device)

    lengths = {e: len(data.frames[e]) for e in train_eps}
    steps_per_epoch = len(batch_plan(lengths, a, 0))
    optimizer = make_optimizer(policy, a)
    scheduler = make_schedule(optimizer, a.epochs * steps_per_epoch, a.warmup)
    state = {"epoch": 0, "batch": 0, "global_step": 0, "best_val_loss": math.inf, "best_epoch": -1,
             "history": [], "initial_val": {}, "train_time": 0.0, "train_samples": 0, "epoch_loss_sum": 0.0, "epoch_samples": 0}
    if resumed:
        ts = resumed["train_state"]
        optimizer.load_state_dict(ts["optimizer"])
        scheduler.load_state_dict(ts["scheduler"])
        state.update({k: ts.get(k, state[k]) for k in state})
        set_rng_state(ts["rng"])
        if world.main:
            tqdm.write(f"{desc or spec}: resuming from {last_path} at epoch {state['epoch'] + 1}, batch {state['batch']}"
                       + (f" on {world.size} processes" if world.active else ""))

    metadata = {"data": a.data, "policy": spec, "train_episodes": train_eps, "val_episodes": val_eps,
                "args": asdict(a)}

    def save_last(done: bool = False, rng: dict[str, Any] | None = None) -> None:
        if world.main:
            save_checkpoint(last_path, policy, metadata=metadata, train_state={
                **state, "done": done, "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                "rng": rng or rng_state()})

    if world.main:
        run_dir.mkdir(parents=True, exist_ok=True)
    writer = SummaryWriter(str(run_dir)) if world.main else _NoWriter()
    n_params = policy.num_parameters()
    if not resumed:
        writer.add_text("config", "```\n" + json.dumps({"args": asdict(a), "policy": policy.config.to_dict()},
                                                     indent=2) + "\n```")
    forward: torch.nn.Module = WindowsForward(policy)
    if world.active:  # also makes every rank start from rank 0's weights
        forward = DistributedDataParallel(forward, device_ids=[device.index] if device.type == "cuda" else None,
                                          forward_sync_buffers=False)
    if not resumed:  # the untrained policy's score: the baseline every later epoch is compared with
        state["initial_val"] = evaluate(policy, data, val_eps, a, cols, class_weight, world=world)
        writer.add_scalar("losses/val", state["initial_val"]["val_loss"], 0)
    batch_rng = None
    try:
        while state["epoch"] < a.epochs:
            epoch = state["epoch"]
            plan = batch_plan(lengths, a, epoch)
            policy.train()
            bar = tqdm(total=len(plan), desc=f"{desc or spec} epoch {epoch + 1}/{a.epochs}", initial=state["batch"],
                       leave=False, dynamic_ncols=True, disable=not show_progress(a.progress) or not world.main)
            window_loss, window_n, t_log, n_log = 0.0, 0, time.perf_counter(), 0
            for segments in plan[state["batch"]:]:
                raise_if_stopped()
                batch_rng = rng_state()  # an interrupted batch is replayed from here on resume
                t0 = time.perf_counter()
                n = sum(b - s for _, s, b in segments)  # windows in this step, over all ranks
                if world.active:  # this rank's share of the step; draws seeded by (seed, epoch, batch, rank)
                    torch.manual_seed(step_seed(a.seed, epoch, state["batch"], world.rank))
                    mine = world.part(segments)
                    share = sum(b - s for _, s, b in mine) / n * world.size  # DDP's mean over ranks -> the step's mean
                    segments = mine or segments[:1]  # too few segments for every rank: compute one, weigh it 0
                if a.augment and data.env.first_person:  # picks a camera per segment, adjusts the targets
                    x, index, times, target = augment_first_person(data, segments, a, cols, policy.config.color, device)
                else:
                    frames, slices, index, times, target = gather_segments(data, segments, a.window, a.frame_stride,
                                                                           cols)
                    frames = torch.from_numpy(frames)
                    x = (augment(frames, slices, policy.config.image_size, device, policy.config.color) if a.augment
                         else frames_to_float(frames, policy.config.image_size, device, policy.config.color))
                raw = forward(x, torch.from_numpy(index).to(device), torch.from_numpy(times).to(device))
                loss = loss_fn(policy, raw, torch.from_numpy(target).to(device), a, class_weight)
                if world.active:
                    loss = loss * share
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                step_loss = distributed.mean(world, loss.detach()).item()  # the whole step's loss, on every rank
                grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), a.grad_clip).item()
                optimizer.step()
                scheduler.step()
                state["batch"] += 1
                batch_rng = None
                state["global_step"] += n
                state["train_samples"] += n
                state["train_time"] += time.perf_counter() - t0
                state["epoch_loss_sum"] += step_loss * n
                state["epoch_samples"] += n
                window_loss, window_n, n_log = window_loss + step_loss * n, window_n + n, n_log + 1
                bar.update(1)
                if n_log >= a.log_every:
                    now = time.perf_counter()
                    gs = state["global_step"]
                    writer.add_scalar("losses/train", window_loss / window_n, gs)
                    writer.add_scalar("charts/learning_rate", scheduler.get_last_lr()[0], gs)
                    writer.add_scalar("charts/grad_norm", grad_norm, gs)
                    writer.add_scalar("charts/samples_per_sec", window_n / (now - t_log), gs)
                    bar.set_postfix(loss=f"{window_loss / window_n:.4f}")
                    window_loss, window_n, t_log, n_log = 0.0, 0, now, 0
            bar.close()
            if window_n:
                writer.add_scalar("losses/train", window_loss / window_n, state["global_step"])
            train_loss = state["epoch_loss_sum"] / max(1, state["epoch_samples"])
            val = evaluate(policy, data, val_eps, a, cols, class_weight, world=world)
            gs = state["global_step"]
            writer.add_scalar("losses/val", val["val_loss"], gs)
            writer.add_scalar("losses/train_epoch", train_loss, gs)
            for k, v in val.items():
                if k not in ("val_loss", "val_windows"):
                    writer.add_scalar(f"metrics/{k}", v, gs)
            if world.main:  # attention diagnostics: rank 0's TensorBoard and history alone
                val.update(log_nac_internals(writer, policy, data, val_eps[0], gs, cols))
            writer.flush()
            state["history"].append({"epoch": epoch + 1, "train_loss": train_loss, **val})
            state.update(epoch=epoch + 1, batch=0, epoch_loss_sum=0.0, epoch_samples=0)
            if val["val_loss"] < state["best_val_loss"]:
                state.update(best_val_loss=val["val_loss"], best_epoch=epoch + 1)
                if world.main:
                    save_checkpoint(best_path, policy, metadata={**metadata, "epoch": epoch + 1, "val": val})
            save_last(done=state["epoch"] >= a.epochs)
            if world.main:
                tqdm.write(f"{desc or spec} epoch {epoch + 1}/{a.epochs}: train {train_loss:.4f} "
                           + " ".join(f"{k} {v:.4f}" for k, v in val.items() if k != "val_windows"))
    except (KeyboardInterrupt, RuntimeError) as e:
        if isinstance(e, RuntimeError) and not (world.active and distributed.is_peer_failure(e)):
            raise
        save_last(rng=batch_rng)  # mid-batch: the RNG as that batch began; else the current one
        writer.close()
        why = "interrupted" if isinstance(e, KeyboardInterrupt) else "another process of the run stopped"
        saved = f"saved {last_path}" if world.main else f"rank 0 saves {last_path}"
        raise Interrupted(f"{why} at epoch {state['epoch'] + 1}, batch {state['batch']}; "
                          f"{saved}; continue with --resume --out {a.out}") from None
    writer.close()

    best = next(h for h in state["history"] if h["epoch"] == state["best_epoch"])
    metrics = {
        "policy": spec, "run_dir": str(run_dir), "best_epoch": state["best_epoch"],
        "best": {k: v for k, v in best.items() if k != "epoch"}, "last": state["history"][-1],
        "initial": state["initial_val"],
        "param_count": n_params, "train_time_s": state["train_time"],
        "samples_per_sec": state["train_samples"] / max(state["train_time"], 1e-9),
        "train_windows": sum(lengths.values()), "val_windows": best["val_windows"], "device": str(device),
        "threads": torch.get_num_threads(), "processes": world.size, "data_loading": "lazy" if data.lazy else "memory",
        "history": state["history"], "args": asdict(a), "policy_config": policy.config.to_dict(),
        "train_episodes": train_eps, "val_episodes": val_eps,
    }
    if world.main:
        write_json_atomic(run_dir / "metrics.json", metrics)
    return metrics


# ----------------------------------------------------------------------------- several runs
SUMMARY_KEYS = ("val_loss", "val_accuracy", "val_mae", "val_mse", "val_steer_mae",
                "attn_entropy", "attn_entropy_norm", "attn_max_weight")  # attn_*: log_nac_internals


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean and std (over folds) of the best-epoch validation metrics and the costs."""
    out: dict[str, Any] = {"policy": runs[0]["policy"], "runs": len(runs),
                           "param_count": runs[0]["param_count"]}
    for key in SUMMARY_KEYS + ("train_time_s", "samples_per_sec"):
        values = [r["best"][key] if key in r["best"] else r.get(key) for r in runs]
        if all(v is not None for v in values):
            out[key] = {"mean": float(np.mean(values)), "std": float(np.std(values)), "values": values}
    return out


def fmt(stat: dict[str, Any] | None, digits: int = 4) -> str:
    if stat is None:
        return "-"
    if len(stat["values"]) == 1:
        return f"{stat['mean']:.{digits}f}"
    return f"{stat['mean']:.{digits}f} ± {stat['std']:.{digits}f}"


def comparison_table(summaries: list[dict[str, Any]]) -> str:
    """Markdown table, one row per policy: its block structure (attention cores), the best-epoch validation
    metrics, the attention statistics where the run recorded them, parameters and cost."""
    from policies.cores import block_of

    keys = [k for k in SUMMARY_KEYS if any(k in s for s in summaries)]
    header = ["policy", "block"] + keys + ["params", "train time (s)", "samples/s"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for s in summaries:
        try:
            block = block_of(s["policy"]) or "-"
        except ValueError:  # a name this version no longer parses (an old comparison.json)
            block = "?"
        row = [s["policy"], block] + [fmt(s.get(k), 3 if k.startswith("attn_") else 4) for k in keys] + [
            f"{s['param_count']:,}", fmt(s.get("train_time_s"), 0), fmt(s.get("samples_per_sec"), 0)]
        lines.append("| " + " | ".join(row) + " |")
    if any(k.startswith("attn_") for k in keys):
        lines.append("\nattn_*: attention of the attention cores on 128 validation windows (mean over heads and the "
                     "queries with >= 2 visible keys); uniform attention has attn_entropy_norm 1.000 and "
                     "attn_max_weight = the mean of 1/(visible keys), 0.245 for 8 causal frames.")
    return "\n".join(lines) + "\n"


def auto_threads(processes: int = 1) -> int:
    """2 threads on an idle 2-core machine; 1 when other jobs already load it (measured: with a load
    average of ~5 on 2 cores, 1 thread trains ~1.9x faster than 2, which wait on each other). Under
    torchrun the ``processes`` of a machine share its cores."""
    cores = (os.cpu_count() or 1) // max(1, processes)
    try:
        busy = os.getloadavg()[0] >= cores - 0.5
    except OSError:
        busy = False
    return 1 if busy or cores < 2 else 2


def default_out(a: TrainArgs) -> str:
    return str(Path("runs/train") / a.policy.replace(",", "_"))


def data_paths(data: str | list[str]) -> list[str]:
    return [data] if isinstance(data, str) else list(data)


def data_label(data: str | list[str]) -> str:
    return " + ".join(data_paths(data))


def run(a: TrainArgs) -> dict[str, Any]:
    """The whole command: one or several policies, one split or k folds. Returns the summaries.

    Under torchrun (agent.distributed) every rank runs this: the checks and the data on each, one process
    group around the training runs, the files written by rank 0."""
    specs = check_args(a)
    out = Path(a.out or default_out(a))
    a.out = str(out)
    args_path = out / "args.json"
    if a.resume and a.overwrite:
        raise ValueError("--resume and --overwrite exclude each other")
    if a.resume:
        if not args_path.exists():
            raise FileNotFoundError(f"--resume: {str(out)!r} holds no run to resume (no args.json)")
        saved = json.loads(args_path.read_text())
        keep = {"resume": True, "out": str(out), "device": a.device, "threads": a.threads, "progress": a.progress,
                "data_loading": a.data_loading}
        a = TrainArgs(**{**{f.name: saved[f.name] for f in fields(TrainArgs) if f.name in saved}, **keep})
        specs = check_args(a)
    elif args_path.exists() and not a.overwrite:
        open_datasets(a.data)  # a mistyped --data is the likelier mistake: say that first
        raise ValueError(f"{str(out)!r} already holds a run; pass --resume to continue it, --overwrite to "
                         f"start again, or another --out")
    world = distributed.from_env()
    device = device_for(a.device, world)
    with distributed.joined(world, device) as world:
        barrier(world)  # every rank has read and checked the folder before rank 0 writes into it
        torch.set_num_threads(a.threads or auto_threads(world.local_size))
        if world.main:  # a raw recording is imported once, by rank 0; the others then read the import
            a = use_recording(a, out)
        barrier(world)
        if not world.main:
            a = use_recording(a, out)
        if a.init is not None and not a.resume:
            a = init_architecture(a)
        a = resolve_env_defaults(a)
        data = load_data(a, world, out)
        resolve_head(a, data)  # fail early on a head the data cannot feed
        if a.folds:
            splits = kfold_episodes(data.num_episodes, a.folds, a.seed if a.split_seed is None else a.split_seed)
        else:
            splits = [split_episodes(data.num_episodes, a.val_fraction, a.seed if a.split_seed is None else a.split_seed)]
        if world.main:
            out.mkdir(parents=True, exist_ok=True)
            write_json_atomic(args_path, asdict(a))

        summaries = []
        for spec in specs:
            spec_dir = out / spec if len(specs) > 1 else out
            runs = []
            for k, (train_eps, val_eps) in enumerate(splits):
                run_dir = spec_dir / f"fold_{k}" if a.folds else spec_dir
                desc = f"{spec} fold {k + 1}/{a.folds}" if a.folds else spec
                runs.append(train_run(a, spec, data, train_eps, val_eps, run_dir, desc, world, device))
            summary = summarize(runs)
            summaries.append(summary)
            if a.folds and world.main:
                write_json_atomic(spec_dir / "folds.json", {"summary": summary, "runs": [r["run_dir"] for r in runs]})
            if world.main:
                print(one_line(summary, runs, a))
        if (len(specs) > 1 or a.folds) and world.main:
            table = comparison_table(summaries)
            (out / "comparison.md").write_text(
                f"Behaviour cloning on `{data_label(a.data)}` (seed {a.seed}, window {a.window}, stride {a.frame_stride}, "
                f"{a.epochs} epochs{f', {a.folds} folds' if a.folds else ''}); validation metrics at the best epoch.\n\n"
                + table)
            write_json_atomic(out / "comparison.json", {"args": asdict(a), "summaries": summaries})
            print("\n" + table)
    return {"out": str(out), "summaries": summaries}


def one_line(summary: dict[str, Any], runs: list[dict[str, Any]], a: TrainArgs) -> str:
    metrics = " ".join(f"{k} {fmt(summary[k])}" for k in SUMMARY_KEYS if k in summary)
    where = runs[0]["run_dir"] + "/best.pt" if len(runs) == 1 else f"{len(runs)} folds"
    return (f"{summary['policy']}: {metrics} | {summary['param_count']:,} params | "
            f"{fmt(summary['train_time_s'], 0)} s | {fmt(summary['samples_per_sec'], 0)} samples/s -> {where}")
