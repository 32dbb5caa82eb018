"""What train.py is asked to do (TrainArgs, one flag per field), its checks, the arguments whose defaults come
from the dataset's env or from a checkpoint (--init: agent.training.init_shape), and the small typed configs the
training modules take once the arguments are resolved (resolve: RunOptions, Model, DataOptions, SplitOptions,
Windows, Augmentation, RecoveryOptions, Optimisation, bundled as a TrainPlan)."""
from __future__ import annotations

import json
from dataclasses import MISSING, asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agent.training.init_shape import CORE_SIZES, SHAPE, checkpoint_shape
from agent.training.latency import check_latency_queue, parse_latency_steps
from agent.training.presets import PRESETS, preset_help, preset_settings
from agent.training.recovery import MAX_OFFSET_M as RECOVERY_MAX_OFFSET_M
from agent.training.recovery import MAX_YAW_DEG as RECOVERY_MAX_YAW_DEG
from common.cli import check_choices, flag_of, given_fields, option
from driving_data.dataset import DemoDataset, is_recording, open_datasets
from envs.registry import dataset_env
from policies.nac import MODES as NAC_MODES
from policies.config import LATENCY_INPUTS, TIME_INPUTS
from policies.checkpoint import read_checkpoint
from policies.cores import parse_core_name
from policies.options import action_temperature_option, check_action_options, discrete_actions_option, precision_option

HEAD_CHOICES = ("auto", "continuous", "discrete", "steer")
LR_SCHEDULES = ("cosine", "constant")  # agent.training.loop.make_schedule
LOSSES = ("huber", "mse")
LOADING = ("auto", "memory", "lazy")
SPLITS = ("auto", "episodes", "blocks")  # agent.training.windows.make_splits
DATASET_WEIGHTS = ("auto", "frames", "sqrt", "equal")  # agent.training.windows.episode_shares
DEVICES = ("auto", "cpu", "cuda")


@dataclass
class TrainArgs:
    """Behaviour-cloning arguments: one typed dataclass, one train.py flag per field (common.cli builds the parser)."""

    preset: str | None = option(None,
        help_from=lambda: preset_help(), group="input", choices=tuple(PRESETS), metavar="PRESET")
    data: str | list[str] = option("data/carracing_continuous",
        "dataset folder written by collect.py; several (--data A B C, e.g. collection shards) train as one "
        "dataset, the episodes `python -m agent.data.merge` would write; a pool (python -m agent.udacity.pool "
        "import) is its recordings", group="data", metavar="DATA")
    dataset_weight: str = option("auto",
        "how the --data folders share an epoch's steps: frames (every step once), sqrt (each folder's share grows "
        "with the square root of its steps, so one long recording does not dominate many short ones), equal (the "
        "same share each); auto: the pool's rule (sqrt) for a pool, frames otherwise", group="data",
        choices=DATASET_WEIGHTS)
    policy: str = option("nac-focus",
        "sequence core(s) after the CNN, comma separated; several train one after another on the same data "
        "and print a comparison table. Names: CORE[-MODE][+FLAG]..., e.g. nac-focus, nac-exact, "
        "nac-steady+prenorm, lstm, gru, cfc, ltc, mha, mlp (docs/nac.md)", group="model", flag="--core",
        metavar="CORE[,CORE...]")
    out: str | None = option(None, "run folder (default: runs/train/<core>, several cores joined by _)", group="output")
    window: int = option(8, "frames per window", group="model")
    frame_stride: int = option(0,
        "steps between window frames; 0 = the env's own (carracing 3: 8 frames span 0.42 s at 50 Hz)", group="model")
    epochs: int = option(15, "passes over the training episodes", group="optimisation")
    batch_size: int = option(64,
        "windows per optimizer step", group="optimisation")
    segment: int = option(16, "consecutive steps per segment (frames encoded once per segment)", group="optimisation")
    oversample_turns: int = option(1,
        "segments among the sharpest tenth of the training turns (by their largest |steering label|) are "
        "drawn this many times per epoch, as PilotNet trains on more curves than roads have (hairpins are ~1 "
        "% of the steps); 1 = every segment once", group="optimisation")
    time_input: str | None = option(None,
        "what the core gets as each frame's time: seconds (true timestamps; the default) | index (window "
        "positions, ignoring the clock: the ablation that isolates NAC's time input); with --init, the "
        "checkpoint's unless given", group="model", choices=TIME_INPUTS)
    window_gaps: int = option(1,
        "training windows with irregular timing: each gap between a window's frames is --frame-stride x k, k "
        "drawn from 1..this (frames late or dropped; the core gets their true timestamps; time-blind cores "
        "the same frames in the same order); 1 = regular. Validation stays regular", group="optimisation")
    latency_steps: str = option(
        "0", "train for actions that land D steps after their frame: each window is labelled with the expert's "
        "action D steps later (hindsight: the state the action meets), and a policy with --latency-input is told D; "
        "A:B draws D per segment from A..B (validation: every D in turn), so one student serves every latency in "
        "the range; recorded: each episode's own, the latency collect.py --latency-steps drove it under",
        group="optimisation", metavar="D|A:B|recorded")
    latency_input: str | None = option(
        None, "how the policy is told its latency: none | clock (nac cores: the query's timestamp is the moment "
        "the action lands) | input (one more input feature; any core); with --init, the checkpoint's unless given "
        "(default: none)", group="model", choices=LATENCY_INPUTS)
    latency_queue: int | None = option(
        None, "also show a policy told its latency as an input up to K of its actions on their way (chosen, not yet "
        "applied; next to land first), read in training from the actions each episode recorded: what a latency "
        "expert's labels depend on; K >= the largest latency trained; with --init, the checkpoint's unless given "
        "(default: 0)", group="model", metavar="K")
    lr: float = option(1e-3, "peak AdamW learning rate", group="optimisation")
    weight_decay: float = option(1e-4, "AdamW weight decay (0: AdamW is Adam)", group="optimisation")
    warmup: float = option(0.05,
        "fraction of the optimizer steps spent warming up, then the --lr-schedule", group="optimisation")
    lr_schedule: str = option("cosine",
        "after the warm-up: cosine (decay to 5% of --lr) | constant (--lr throughout)", group="optimisation",
        choices=LR_SCHEDULES)
    epoch_steps: int = option(0,
        "optimizer steps per epoch: 0 = one pass over the training segments; N = N batches of segments drawn at "
        "random (every segment once before any twice), as a trainer with a fixed steps_per_epoch", group="optimisation")
    grad_clip: float = option(1.0, "clip the gradient norm to this; 0 = no clipping", group="optimisation")
    seed: int = option(1,
        "training seed: the weights, batches and augmentations (and the split, unless --split-seed); not a track seed, "
        "the tracks are the dataset's", group="optimisation")
    split_seed: int | None = option(None,
        "seed of the split by episode (default: --seed); fix it to compare --seed runs", group="data")
    resume: bool = option(False,
        "continue the run in --out from its last.pt, with the arguments it started with", group="output")
    init: str | None = option(None,
        "start from this checkpoint's weights and architecture (fine-tuning, e.g. a DAgger round from the "
        "previous round's best.pt); --core and the architecture flags are then taken from it (a flag given "
        "another value than the checkpoint's is refused)", group="model")
    blend_init: float | None = option(None,
        "with --init, W in (0, 1]: when the run ends, best.pt becomes (1 - W) x the --init checkpoint + W x the "
        "best fine-tuned student, weight by weight (WiSE-FT): the start's way back kept beside the new line; the "
        "fine-tuned one stays as best_tuned.pt; default: no blend", group="model")
    stay_near_init: float = option(0.0,
        "with --init, L2-SP: each step's loss adds this weight x the squared distance of the weights from the --init "
        "checkpoint's (summed), so the fine-tune learns the new line near its start; default 0: no pull", group="model")
    freeze_encoder: bool = option(False, "with --init: train the core and the head only, the per-frame encoder "
                                  "kept as the --init checkpoint's", group="model")
    overwrite: bool = option(False, "allow starting a fresh run in a folder that holds one", group="output")
    folds: int = option(0,
        ">= 2: k-fold cross-validation by episode (the paper uses 5); 0: one train/val split", group="data")
    val_fraction: float = option(0.2,
        "fraction of the episodes held out for validation (without --folds); with --split blocks, of every "
        "episode's steps", group="data")
    strict_images: bool = option(False,
        "a real simulator recording given to --data: refuse it when a row names a missing image (default: "
        "skip such rows and say how many)", group="data")
    split: str = option("auto",
        "episodes (hold out whole episodes) | blocks (hold out the last --val-fraction of every episode in "
        "time, one window's gap before it) | auto (blocks for a single episode, e.g. a one-session simulator "
        "recording; else episodes)", group="data", choices=SPLITS)
    head: str = option("auto", "auto (from the dataset) | continuous | discrete | steer (steering only)", group="model",
                       choices=HEAD_CHOICES)
    smooth_labels: str = option("auto",
        "seconds: train on the labels averaged over this centred window within each episode; auto: 0.5 for "
        "real simulator recordings (keyboard steering is a train of taps), 0 for an expert's labels", group="data")
    loss: str = option("mse",
        "continuous loss on normalised targets: mse | huber (huber discounts sharp turns)", group="optimisation",
        choices=LOSSES)
    class_weights: bool = option(False,
        "discrete: weight cross-entropy by inverse class frequency", group="optimisation")
    discrete_actions: str | None = discrete_actions_option()
    action_temperature: float | None = action_temperature_option()
    augment: bool = option(True,
        "camera augmentations: brightness, contrast, shifts (first-person envs add the Udacity recipe; see "
        "agent/training/augment.py)", group="augmentation")
    side_correction: float | None = option(None,
        "first-person: train on left/right cameras too, steering + / - this (0 = center only); default: 0.2 "
        "for simulator data, 0 for real recordings (docs/udacity.md)", group="augmentation")
    flip: bool | None = option(None,
        "first-person: mirror half of the segments and negate their steering (default: on, except for real "
        "recordings whose steering holds a steady bias, which mirroring would teach both ways)", group="augmentation")
    shift_steer: float | None = option(None,
        "first-person: shift up to 50 camera px sideways, steering += this per px (0 = off); default: 0.002 "
        "for simulator data, 0 for real recordings", group="augmentation")
    shadows: bool = option(True,
        "first-person: darken a random slanted region of the frame (tree and building shadows)", group="augmentation")
    color_jitter: float | None = option(None,
        "first-person, J in [0, 1]: per segment, hues turned by up to +-J*180 degrees, saturation x[1-J, "
        "1+J], a J/2 share in grey (so scenes in colours never seen still read as roads); default: the env's "
        "(udacity-hard 0.5, else 0)", group="augmentation")
    recovery_views: float = option(0.0,
        "first-person, P in [0, 1]: a P share of the training segments is seen from the car moved off the "
        "recorded path (one pose per segment: --recovery-offset, --recovery-yaw; the frames reprojected as "
        "evaluate.py --replay does) and labelled with the steering back onto it (the replay's path controller"
        " at the recorded speed), as PilotNet trains recoveries; 0 = off", group="augmentation")
    recovery_offset: float = option(1.0,
        "--recovery-views: the offset is drawn uniformly within +-this many metres of the recorded path",
        group="augmentation")
    recovery_yaw: float = option(10.0,
        "--recovery-views: the yaw is drawn uniformly within +-this many degrees of the recorded direction",
        group="augmentation")
    recovery_return: float = option(1.0,
        "--recovery-views: seconds ahead (at the recorded speed, at least 4 m) where the label's pure pursuit"
        " rejoins the path; shorter steers back harder", group="augmentation")
    crop: str = option("auto",
        "rows of the camera frame kept, \"top:bottom\" | none | auto (the env's: udacity 60:135)", group="model")
    color: str = option("auto", "rgb | yuv | auto (the env's: udacity yuv, carracing rgb)", group="model",
                        choices=("auto", "rgb", "yuv"))
    encoder: str = option("auto",
        "auto (the env's own) | carracing (paper CNN) | pilotnet | carracing-official | pilotnet-official (the "
        "authors' trainers' conv stacks, their map itself the feature: policies/encoders.py)", group="model")
    image_size: str | None = option(None,
        "encoder input \"HxW\"; default: the env's (udacity 66x200), else the (cropped) frame", group="model")
    feature_dim: int = option(64,
        "per-frame CNN embedding size (not read by the -official encoders: their feature is the conv map)",
        group="model")
    frame_tokens: int = option(0,
        "window 1: cut each frame's features, in order, into this many tokens, the sequence the core attends "
        "over (the authors' Udacity model: its 1x18x64 conv map as 64 tokens of 18); 0 = the window's frames are "
        "the sequence", group="model")
    head_hidden: int = option(0,
        "a hidden ReLU layer of this width between the core and the action layer (the authors' CarRacing model: "
        "64); 0 = one linear layer", group="model")
    d_model: int = option(64, "nac / mha width", group="model")
    heads: int = option(16, "nac heads (mha uses 4)", group="model")
    topk: int = option(8, "nac: keys each query attends to (top-k)", group="model")
    sparsity: float = option(0.5, "nac: fraction of the wiring's connections removed (AutoNCP)", group="model")
    nac_mode: str = option("exact", "exact | euler | steady (for plain \"nac\")", group="model", choices=NAC_MODES)
    hidden: int = option(64, "lstm / gru / cfc / mlp width (ltc: half, its ODE solver is 6x costlier)", group="model")
    steer_gain: float = option(1.0,
        "continuous students: their steering is multiplied by this when they drive (stored in the checkpoint; "
        "the authors' Udacity drive.py: 3); with --init, the checkpoint's unless given", group="model")
    steer_gain_from: float = option(0.0,
        "the --steer-gain acts only where |steering| >= this (their drive.py: 0.01)", group="model")
    fixed_throttle: float | None = option(None,
        "continuous steering students: drive with this throttle whatever they predict (the Udacity bridge, an env "
        "that takes a throttle; their drive.py: 0.05); default: their own, or the driver's rule", group="model")
    device: str = option("auto", "auto (cuda if available) | cpu | cuda", group="runtime", choices=DEVICES)
    precision: str = precision_option()
    threads: int = option(0,
        "torch CPU threads (per process under torchrun); 0 = auto: 2, or 1 when the machine is already busy "
        "(under torchrun: the machine's cores shared among its processes)", group="runtime")
    data_loading: str = option("auto",
        "where the prepared frames live: memory | lazy (prepared once into an uncompressed cache, "
        "DATA/.cache, and read per batch: memory stays bounded, results are identical on the CPU, equal to "
        "float rounding on a GPU) | auto (lazy when they would take over 40% of the free memory, or when "
        "torchrun runs several processes on the machine)", group="runtime", choices=LOADING)
    log_every: int = option(10, "optimizer steps between TensorBoard scalars", group="output")
    progress: bool = option(True,
        "progress bars on stderr when it is a terminal (log files get the per-epoch lines only)", group="runtime")


COUNTS = {"window": 1, "frame_stride": 0, "epochs": 1, "batch_size": 1, "segment": 1, "oversample_turns": 1,
          "window_gaps": 1, "feature_dim": 1, "d_model": 1, "heads": 1, "topk": 1, "hidden": 1, "threads": 0,
          "log_every": 1, "frame_tokens": 0, "head_hidden": 0, "epoch_steps": 0}  # integer flags: their least value


def check_args(a: TrainArgs) -> None:
    """Validate at the boundary: every flag's value, before anything is read or written."""
    check_choices(a)
    specs = _core_specs(a.policy)
    for name, least in COUNTS.items():
        if getattr(a, name) < least:
            raise ValueError(f"--{name.replace('_', '-')} must be >= {least}, got {getattr(a, name)}")
    if a.frame_tokens and a.window != 1:
        raise ValueError(f"--frame-tokens cuts one frame's features into a sequence: needs --window 1, got {a.window}")
    if a.frame_tokens and a.latency_input not in (None, "none"):
        raise ValueError("--frame-tokens: a policy whose sequence is one frame's tokens cannot be told its latency")
    if not (0 < a.steer_gain <= 4 and 0 <= a.steer_gain_from < 1):
        raise ValueError(f"--steer-gain must be in (0, 4] and --steer-gain-from in [0, 1), got {a.steer_gain} and "
                         f"{a.steer_gain_from}")
    if a.fixed_throttle is not None and not -1 <= a.fixed_throttle <= 1:
        raise ValueError(f"--fixed-throttle must be in [-1, 1], got {a.fixed_throttle}")
    if a.blend_init is not None and not (a.init is not None and 0 < a.blend_init <= 1):
        raise ValueError(f"--blend-init mixes the trained student with its --init checkpoint: it needs --init and "
                         f"a share in (0, 1], got {a.blend_init}" + ("" if a.init else " without --init"))
    if not (0 <= a.stay_near_init < float("inf") and (a.init is not None or a.stay_near_init == 0)):
        raise ValueError(f"--stay-near-init pulls the weights toward the --init checkpoint's: it needs --init and a "
                         f"finite weight >= 0, got {a.stay_near_init}" + ("" if a.init else " without --init"))
    if a.freeze_encoder and a.init is None:
        raise ValueError("--freeze-encoder keeps the --init checkpoint's encoder: it needs --init")
    if a.folds == 1 or a.folds < 0:
        raise ValueError(f"--folds must be 0 (one split) or >= 2, got {a.folds}")
    if not 0.0 < a.val_fraction < 1.0:
        raise ValueError(f"--val-fraction must be in (0, 1), got {a.val_fraction}")
    _check_optimiser(a.lr, a.grad_clip, a.weight_decay, a.warmup)
    if a.smooth_labels != "auto":
        try:
            assert 0 <= float(a.smooth_labels) < 60
        except (ValueError, AssertionError):
            raise ValueError(f"--smooth-labels must be auto or seconds in [0, 60), got {a.smooth_labels!r}") from None
    check_action_options(a.discrete_actions, a.action_temperature)
    if a.init is not None:
        if len(specs) > 1 or a.folds:
            raise ValueError("--init fine-tunes one checkpoint: it takes one --core and no --folds")
        read_checkpoint(a.init)  # a missing or foreign file is refused here, before any data is read
    if not data_paths(a.data):
        raise ValueError("--data needs at least one dataset folder")
    if a.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for but CUDA is not available")
    if a.image_size is not None:
        parse_image_size(a.image_size)
    if a.crop != "auto":
        parse_crop(a.crop)
    _check_augmentation(a.side_correction, a.shift_steer, a.color_jitter)
    _check_recovery(a.recovery_views, a.recovery_offset, a.recovery_yaw, a.recovery_return)
    check_latency_queue(a.latency_steps, a.latency_queue, a.latency_input)


def _core_specs(policy: str) -> list[str]:
    """--core's names, each a core the registry builds, none twice."""
    specs = [s.strip() for s in policy.split(",") if s.strip()]
    if not specs:
        raise ValueError(f"--core needs at least one name, got {policy!r}")
    if len(set(specs)) != len(specs):
        raise ValueError(f"--core lists a name twice: {policy!r}")
    for s in specs:
        parse_core_name(s)
    return specs


def _check_optimiser(lr: float, grad_clip: float, weight_decay: float, warmup: float) -> None:
    """The optimiser's numbers in their ranges (NaN in none)."""
    for flag, value, ok, rule in (("--lr", lr, lr > 0, "> 0"), ("--grad-clip", grad_clip, grad_clip >= 0, ">= 0"),
                                  ("--weight-decay", weight_decay, weight_decay >= 0, ">= 0"),
                                  ("--warmup", warmup, 0 <= warmup < 1, "in [0, 1)")):
        if not ok:
            raise ValueError(f"{flag} must be {rule}, got {value}")


def _check_augmentation(side_correction: float | None, shift_steer: float | None, color_jitter: float | None) -> None:
    """The camera augmentations' strengths in their ranges (None: the dataset's default)."""
    if not ((side_correction is None or 0 <= side_correction <= 1)
            and (shift_steer is None or 0 <= shift_steer <= 0.02)):
        raise ValueError("--side-correction must be in [0, 1] and --shift-steer in [0, 0.02] (steering per pixel)")
    if color_jitter is not None and not 0 <= color_jitter <= 1:
        raise ValueError(f"--color-jitter must be in [0, 1], got {color_jitter}")


def _check_recovery(share: float, offset_m: float, yaw_deg: float, return_s: float) -> None:
    """--recovery-views and its pose ranges: within what the flat-ground view synthesis holds for."""
    if not 0 <= share <= 1:
        raise ValueError(f"--recovery-views must be in [0, 1] (a share of the training segments), got {share}")
    if not (0 <= offset_m <= RECOVERY_MAX_OFFSET_M and 0 <= yaw_deg <= RECOVERY_MAX_YAW_DEG):
        raise ValueError(f"--recovery-offset must be in [0, {RECOVERY_MAX_OFFSET_M:g}] m and --recovery-yaw in "
                         f"[0, {RECOVERY_MAX_YAW_DEG:g}] degrees (the flat-ground view synthesis breaks down beyond), "
                         f"got {offset_m} and {yaw_deg}")
    if not 0.2 <= return_s <= 5:
        raise ValueError(f"--recovery-return must be in [0.2, 5] seconds (where the label rejoins the path), "
                         f"got {return_s}")


def parse_image_size(text: str) -> list[int]:
    try:
        h, w = (int(v) for v in text.lower().split("x"))
        assert h > 0 and w > 0
    except (ValueError, AssertionError):
        raise ValueError(f"--image-size must look like 96x96 (height x width), got {text!r}") from None
    return [h, w]


def core_options(m: "Model", spec: str) -> tuple[str, dict[str, Any]]:
    """(core, its options) for a policy name: policies.cores.policy_core_options with this run's settings."""
    from policies.cores import policy_core_options

    return policy_core_options(spec, d_model=m.d_model, heads=m.heads, topk=m.topk, sparsity=m.sparsity,
                               nac_mode=m.nac_mode, hidden=m.hidden, seed=m.core_seed)


def parse_crop(text: str | None) -> list[int] | None:
    """``--crop 60:135`` -> [60, 135] (rows kept); ``none`` -> None."""
    if text is None or text.lower() == "none":
        return None
    try:
        top, bottom = (int(v) for v in text.split(":"))
        assert 0 <= top < bottom
    except (ValueError, AssertionError):
        raise ValueError("--crop must look like 60:135 (first and one-past-last row kept), "
                         f"none or auto; got {text!r}") from None
    return [top, bottom]


SIMULATOR_AUGMENTATION = {"side_correction": 0.2, "shift_steer": 0.002}  # the PilotNet/Udacity recipe's label shifts
RECORDING_AUGMENTATION = {"side_correction": 0.0, "shift_steer": 0.0}  # real recordings: center camera, no shifts


STEADY_BIAS = 0.1  # mean^2 / variance of the recorded steering above which a driver's bias is steady


def steady_steering_bias(dataset: DemoDataset) -> bool:
    """Whether the people's recorded steering holds a steady bias: its mean squared above STEADY_BIAS times its
    variance (measured: 0.16 on a mouse recording with a left bias, where mirrored segments taught the opposite
    bias half the time; at most 0.03 on seven keyboard recordings, which mirroring helps; docs/results.md)."""
    rows = [i for i, m in enumerate(dataset.episodes) if is_recording(m)]
    steer = np.concatenate([dataset.load(i, keys=["expert_action"])["expert_action"][:, 0] for i in rows])
    return bool(steer.mean() ** 2 > STEADY_BIAS * steer.var())


def default_out(policy: str) -> str:
    """runs/train/<core>, several cores joined by _."""
    return str(Path("runs/train") / policy.replace(",", "_"))


def data_paths(data: str | list[str]) -> list[str]:
    return [data] if isinstance(data, str) else list(data)


def data_label(data: str | list[str]) -> str:
    return " + ".join(data_paths(data))


# ----------------------------------------------------------------------------- what the training modules take
@dataclass(frozen=True)
class DataOptions:
    """What agent.training.data.load_data needs: the folders and how their frames and labels are prepared."""

    paths: str | list[str]
    crop: str  # "top:bottom" | none | auto
    image_size: str | None  # "HxW"; None: the env's
    side_cameras: bool | None  # load the left/right cameras (--side-correction > 0); None: the dataset's
    recovery_views: bool  # the camera geometry and recorded speed are needed
    smooth_labels: str  # seconds | auto
    loading: str  # auto | memory | lazy
    progress: bool
    dataset_weight: str = "auto"  # --dataset-weight as given (agent.training.data.use_recording resolves it)
    strict_images: bool = False  # a recording's rows naming a missing image: refused, not skipped


@dataclass(frozen=True)
class SplitOptions:
    """How agent.training.windows.make_splits holds out validation data."""

    mode: str  # auto | episodes | blocks
    val_fraction: float
    folds: int
    seed: int


@dataclass(frozen=True)
class Windows:
    """The windows a policy sees and how an epoch's batches are cut from the episodes (agent.training.windows)."""

    window: int
    frame_stride: int
    window_gaps: int
    segment: int
    batch_size: int
    oversample_turns: int
    seed: int
    latency: tuple[int, int] | str = (0, 0)  # steps from a window's last frame to its label (--latency-steps)
    dataset_weight: str = "frames"  # how the --data folders share an epoch (resolved: never auto)
    epoch_steps: int = 0  # batches per epoch; 0: one pass over the segments (agent.training.windows.batch_plan)


@dataclass(frozen=True)
class Augmentation:
    """The camera augmentations of a training batch (agent.training.augment); None: the dataset's, until
    with_env_defaults fills it in."""

    enabled: bool
    side_correction: float | None
    shift_steer: float | None
    flip: bool | None
    shadows: bool
    color_jitter: float | None


@dataclass(frozen=True)
class RecoveryOptions:
    """--recovery-views: the share of segments seen off the path, the pose ranges and the return horizon."""

    share: float
    offset_m: float
    yaw_deg: float
    return_s: float


@dataclass(frozen=True)
class Optimisation:
    """The optimiser, its schedule and the loss (agent.training.loop)."""

    epochs: int
    lr: float
    weight_decay: float
    warmup: float
    grad_clip: float
    loss: str  # mse | huber (continuous heads)
    class_weights: bool  # discrete heads
    log_every: int
    seed: int
    lr_schedule: str = "cosine"  # after the warm-up: cosine | constant (agent.training.loop.make_schedule)
    stay_near_init: float = 0.0  # L2-SP weight toward the --init checkpoint's weights (0: none)
    freeze_encoder: bool = False  # train the core and the head only (the encoder stays the --init checkpoint's)


@dataclass(frozen=True)
class Model:
    """The policy to train: a new one's shape, inputs and action rule, or the --init checkpoint it starts from
    (agent.training.starting_policy.build_policy)."""

    init: str | None
    head: str  # auto | continuous | discrete | steer
    encoder: str  # auto: the env's, until with_env_defaults
    feature_dim: int
    window: int
    frame_stride: int  # 0: the env's, until with_env_defaults
    time_input: str | None
    color: str  # rgb | yuv | auto (the env's)
    d_model: int
    heads: int
    topk: int
    sparsity: float
    nac_mode: str
    hidden: int | None  # None: --hidden left at its default, every core --d-model wide
    core_seed: int
    discrete_actions: str | None
    action_temperature: float | None
    latency_input: str | None
    latency_queue: int | None
    frame_tokens: int = 0  # a frame's features cut into this many tokens (PolicyConfig.frame_tokens)
    head_hidden: int = 0  # a hidden ReLU layer before the action layer (PolicyConfig.head_hidden)
    steer_gain: float = 1.0  # drive-time steering gain, from this magnitude on (PolicyConfig.steer_gain[_from])
    steer_gain_from: float = 0.0
    fixed_throttle: float | None = None  # PolicyConfig.fixed_throttle
    blend_init: float | None = None  # best.pt = (1 - W) x init + W x the best trained student (--blend-init)


@dataclass(frozen=True)
class RunOptions:
    """Where a run is written and how it runs: its folder, --resume / --overwrite, device, precision, progress,
    CPU threads (0: agent.training.experiment.auto_threads)."""

    out: str
    resume: bool
    overwrite: bool
    device: str
    precision: str
    progress: bool
    seed: int
    folds: int
    threads: int = 0


@dataclass(frozen=True)
class TrainPlan:
    """A run's arguments once resolved (resolve: --resume, the checks, --init; then, once the data is there,
    imported and with_env_defaults) cut into the small configs agent.training.loop and the modules under it are
    given; ``record``: the resolved arguments as args.json, the checkpoints' metadata and comparison.json keep
    them."""

    record: dict[str, Any]
    specs: list[str]  # the cores, in --core's order
    run: RunOptions
    model: Model
    data: DataOptions
    split: SplitOptions
    windows: Windows
    augmentation: Augmentation
    recovery: RecoveryOptions | None
    optimisation: Optimisation


def resolve(a: TrainArgs) -> TrainPlan:
    """The boundary: the arguments resolved once, into the plan every later step reads. --preset's settings where
    no flag was given (agent.training.presets); --out filled in; with
    --resume, the arguments the run in --out started with (only where it runs and how it reports are taken from
    this command); checked (check_args); --init's architecture (checkpoint_shape). What the data decides is
    filled in once it is there: its import (imported), its env's defaults (with_env_defaults)."""
    if a.preset is not None:  # before --out's default, which a preset names
        given = given_fields(a)  # the flags of the command line; for arguments built in code, what is not a default
        a = replace(a, **preset_settings(a.preset, asdict(a), given if given is not None else {
            f.name for f in fields(TrainArgs) if getattr(a, f.name) != _default(f)}, _flags()))
    out = Path(a.out or default_out(a.policy))
    a = replace(a, out=str(out))
    if a.resume and a.overwrite:
        raise ValueError("--resume and --overwrite exclude each other")
    if a.resume:
        if not (out / "args.json").exists():
            raise FileNotFoundError(f"--resume: {str(out)!r} holds no run to resume (no args.json)")
        saved = json.loads((out / "args.json").read_text())
        keep = {"resume": True, "out": str(out), "device": a.device, "precision": a.precision, "threads": a.threads,
                "progress": a.progress, "data_loading": a.data_loading}
        ignored = [f"{flag_of(f)} {_shown(getattr(a, f.name))} (the run's: {_shown(saved[f.name])})"
                   for f in fields(TrainArgs) if f.name not in keep and f.name in saved
                   and getattr(a, f.name) != _default(f) and not _same_value(f.name, getattr(a, f.name), saved[f.name])]
        if ignored:
            raise ValueError(f"--resume continues the run in {str(out)!r} with the arguments it started with, which "
                             f"this command contradicts: {'; '.join(ignored)}; drop them, or start a new run (another "
                             "--out, or --overwrite)")
        a = TrainArgs(**{**{f.name: saved[f.name] for f in fields(TrainArgs) if f.name in saved}, **keep})
    check_args(a)  # a bad flag is the likelier mistake: say that before anything about the folder
    if a.init is not None and not a.resume:  # the run's label is the checkpoint's core, not --core's default
        a = replace(a, **checkpoint_shape(a.init, {name: getattr(a, name) for name in SHAPE + CORE_SIZES},
                                          {f.name: f.default for f in fields(TrainArgs)}, a.time_input,
                                          a.latency_input, a.latency_queue))
    default_hidden = next(f.default for f in fields(TrainArgs) if f.name == "hidden")
    return TrainPlan(
        asdict(a), _core_specs(a.policy),
        RunOptions(str(a.out), a.resume, a.overwrite, a.device, a.precision, a.progress, a.seed, a.folds, a.threads),
        Model(a.init, a.head, a.encoder, a.feature_dim, a.window, a.frame_stride, a.time_input, a.color, a.d_model,
              a.heads, a.topk, a.sparsity, a.nac_mode, None if a.hidden == default_hidden else a.hidden,
              22222 + a.seed, a.discrete_actions, a.action_temperature, a.latency_input, a.latency_queue,
              a.frame_tokens, a.head_hidden, a.steer_gain, a.steer_gain_from, a.fixed_throttle, a.blend_init),
        DataOptions(a.data, a.crop, a.image_size, None if a.side_correction is None else a.side_correction > 0,
                    a.recovery_views > 0, a.smooth_labels, a.data_loading, a.progress, a.dataset_weight,
                    a.strict_images),
        SplitOptions(a.split, a.val_fraction, a.folds, a.seed if a.split_seed is None else a.split_seed),
        Windows(a.window, a.frame_stride, a.window_gaps, a.segment, a.batch_size, a.oversample_turns, a.seed,
                parse_latency_steps(a.latency_steps), "frames" if a.dataset_weight == "auto" else a.dataset_weight,
                a.epoch_steps),
        Augmentation(a.augment, a.side_correction, a.shift_steer, a.flip, a.shadows, a.color_jitter),
        RecoveryOptions(a.recovery_views, a.recovery_offset, a.recovery_yaw, a.recovery_return)
        if a.recovery_views > 0 else None,
        Optimisation(a.epochs, a.lr, a.weight_decay, a.warmup, a.grad_clip, a.loss, a.class_weights, a.log_every,
                     a.seed, a.lr_schedule, a.stay_near_init, a.freeze_encoder))


def _flags() -> dict[str, tuple[str, Any]]:
    """Every TrainArgs field's flag and default."""
    return {f.name: (flag_of(f), _default(f)) for f in fields(TrainArgs)}


def _default(f: Any) -> Any:
    return f.default_factory() if f.default_factory is not MISSING else f.default


def _shown(value: Any) -> str:
    return " ".join(map(str, value)) if isinstance(value, list) else str(value)


def _same_value(name: str, given: Any, saved: Any) -> bool:
    """Whether a flag given with --resume asks for what the run started with: the same value as args.json holds
    (after a JSON round trip), and for --data the same folders, a recording being the run's import of it."""
    if name != "data":
        return json.loads(json.dumps(given)) == saved
    from driving_data.udacity_import import imported_from

    return [imported_from(p) for p in data_paths(given)] == [imported_from(p) for p in data_paths(saved)]


def imported(plan: TrainPlan, data: str | list[str], dataset_weight: str) -> TrainPlan:
    """The plan once --data is what the run trains on (agent.training.data.use_recording: a recording's import,
    a pool's recordings) and --dataset-weight auto is that data's rule."""
    return replace(plan, record={**plan.record, "data": data, "dataset_weight": dataset_weight},
                   data=replace(plan.data, paths=data, dataset_weight=dataset_weight),
                   windows=replace(plan.windows, dataset_weight=dataset_weight))


def with_env_defaults(plan: TrainPlan, dataset: DemoDataset | None = None) -> TrainPlan:
    """The plan with the arguments whose default depends on the dataset filled in (encoder, frame stride, colour
    jitter, the augmentations that shift the steering label: on for simulator data, off when any episode is a
    real simulator's recording; mirroring, off for recordings whose steering holds a steady bias). ``dataset``:
    the opened --data, when the caller has it."""
    m, aug = plan.model, plan.augmentation
    if (m.encoder != "auto" and m.frame_stride and aug.side_correction is not None and aug.shift_steer is not None
            and aug.color_jitter is not None and aug.flip is not None):
        return plan
    dataset = dataset or open_datasets(plan.data.paths)
    env = dataset_env(dataset.card, dataset.episodes)
    recorded = any(is_recording(e) for e in dataset.episodes)
    recipe = {**(RECORDING_AUGMENTATION if recorded else SIMULATOR_AUGMENTATION),
              "flip": not (recorded and steady_steering_bias(dataset))}
    given = {"side_correction": aug.side_correction, "shift_steer": aug.shift_steer, "flip": aug.flip}
    filled = dict(encoder=env.default_encoder if m.encoder == "auto" else m.encoder,
                  frame_stride=m.frame_stride or env.default_frame_stride,
                  color_jitter=env.default_color_jitter if aug.color_jitter is None else aug.color_jitter,
                  **{k: v if given[k] is None else given[k] for k, v in recipe.items()})
    return replace(plan, record={**plan.record, **filled},
                   model=replace(m, encoder=filled["encoder"], frame_stride=filled["frame_stride"]),
                   windows=replace(plan.windows, frame_stride=filled["frame_stride"]),
                   data=replace(plan.data, side_cameras=filled["side_correction"] > 0),
                   augmentation=replace(aug, side_correction=filled["side_correction"],
                                        shift_steer=filled["shift_steer"], flip=filled["flip"],
                                        color_jitter=filled["color_jitter"]))
