"""One behaviour-cloning run: train a DrivingPolicy on recorded demonstrations into one output folder.

One run = one output folder (LeRobot style): ``best.pt`` (lowest validation loss), ``last.pt`` (the
latest state, with optimizer/scheduler/RNG so ``--resume`` continues it), ``metrics.json``, ``args.json``
and the TensorBoard event file. Several policies (``--policy nac,lstm``) or folds (``--folds 5``)
make one sub-folder per run and a comparison table (``comparison.md`` / ``.json``).

Split: by episode (``windows.split_episodes`` / ``windows.kfold_episodes``), never by frame.
Targets: ``expert_action``. Continuous heads regress targets normalised with the training split's
mean/std (stored in the checkpoint), MSE (or Huber) loss; discrete heads use cross-entropy,
optionally weighted by inverse class frequency.
"""
from __future__ import annotations

import json
import math
import random
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from agent.runtime import NO_STRAIGHT_RATIO, keep_freed_memory, mse_ratio, show_progress
from agent.training import distributed
from agent.training.augment import augment, augment_first_person
from agent.training.config import Optimisation, TrainPlan
from agent.training.data import Data, Head, episode_targets
from agent.training.diagnostics import log_nac_internals
from agent.training.distributed import SINGLE, World, data_parallel, device_for, gather, step_seed
from agent.training.recovery import RecoveryViews
from agent.training.starting_policy import build_policy, init_anchor
from agent.training.windows import (
    batch_plan,
    episode_shares,
    gather_segments,
    label_shifts,
    latency_shifts,
    window_queues,
)
from common.files import atomic_write_all, disk_full, write_json
from common.stops import Interrupted, raise_if_stopped, stops_at_safe_points
from policies.precision import Choice
from policies.precision import choose as choose_precision
from policies.frames import frames_to_float
from policies.checkpoint import checkpoint_writer, load_checkpoint, read_checkpoint
from policies.policy import DrivingPolicy


def loss_fn(policy: DrivingPolicy, raw: torch.Tensor, target: torch.Tensor, loss: str,
            class_weight: torch.Tensor | None) -> torch.Tensor:
    """Cross-entropy for discrete heads; ``loss`` (mse | huber) on normalised targets for continuous ones."""
    if policy.config.head == "discrete":
        return F.cross_entropy(raw, target, weight=class_weight)
    z = policy.normalize_target(target)
    return F.smooth_l1_loss(raw, z) if loss == "huber" else F.mse_loss(raw, z)


@torch.no_grad()
def evaluate(policy: DrivingPolicy, data: Data, episodes: list[int], loss: str, cols: slice | None,
             class_weight: torch.Tensor | None = None, chunk: int = 256, world: World = SINGLE,
             latency: tuple[int, int] | str = (0, 0)) -> dict[str, float]:
    """Loss and metrics over *every* window of ``episodes`` (each episode's frames encoded once). Under
    torchrun each rank scores its share of the episodes and every rank reduces all of them in episode order:
    the numbers one process would get. ``latency`` (steps, --latency-steps): hindsight labels, each latency of
    the range in turn over the windows, told to a policy with a latency input."""
    policy.eval()
    W, S = policy.config.window, policy.config.frame_stride
    scored = {}
    for e in world.part(episodes):
        losses, outputs, targets = [], [], []
        n = len(data.frames[e])
        for start in range(0, n, chunk):
            raise_if_stopped()
            segment = [(e, start, min(start + chunk, n))]
            shifts = latency_shifts(segment, latency, recorded=data.latency_steps)
            frames, _, index, times, target = gather_segments(data, segment, W, S, cols,
                                                              shifts=label_shifts(segment, shifts, data.labels_land))
            emb = policy.encode(torch.from_numpy(frames)[None])[0]
            raw = policy.raw_from_embeddings(emb[torch.from_numpy(index).to(emb.device)],
                                             torch.from_numpy(times).to(emb.device),
                                             _latency_seconds(shifts, data, emb.device),
                                             window_queues(data, segment, shifts, policy.config.queue_steps, cols))
            target_t = torch.from_numpy(target).to(emb.device)
            losses.append(loss_fn(policy, raw, target_t, loss, class_weight).item() * len(target))
            outputs.append(policy.postprocess(raw).cpu())
            targets.append(target_t.cpu())
        scored[e] = (losses, outputs, targets)
    if world.active:
        scored = {e: v for part in gather(world, scored) for e, v in part.items()}
    losses = [x for e in episodes for x in scored[e][0]]
    out = torch.cat([x for e in episodes for x in scored[e][1]])
    tgt = torch.cat([x for e in episodes for x in scored[e][2]])
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
        if "steer" in policy.config.action_names:  # the trivial predictors every policy must beat
            i = list(policy.config.action_names).index("steer")
            metrics["val_steer_mse"] = err[:, i].pow(2).mean().item()
            metrics["val_steer_straight_mse"] = tgt[:, i].pow(2).mean().item()
            metrics["val_steer_mean_mse"] = (tgt[:, i] - policy.target_mean[i].cpu()).pow(2).mean().item()
            ratio = mse_ratio(metrics["val_steer_mse"], metrics["val_steer_straight_mse"])
            if ratio is not None:  # else left out, and the epoch line says why
                metrics["val_steer_vs_straight"] = ratio
            ratio = mse_ratio(metrics["val_steer_mse"], metrics["val_steer_mean_mse"])
            if ratio is not None:  # against predicting the training mean (a steady steering bias beats straight)
                metrics["val_steer_vs_mean"] = ratio
    return metrics


def _latency_seconds(shifts: list[np.ndarray] | None, data: Data, device: torch.device) -> torch.Tensor | None:
    """Each window's latency in seconds ``[N]`` from its hindsight shifts in steps (None: no latency)."""
    if shifts is None:
        return None
    return torch.from_numpy(np.concatenate(shifts) * data.frame_period).float().to(device)


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


def make_schedule(optimizer: torch.optim.Optimizer, total_steps: int, warmup: float,
                  schedule: str = "cosine") -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup, then cosine decay to 5% of the peak learning rate (``schedule`` "constant": the peak rate)."""
    warm = max(1, int(warmup * total_steps))

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        if schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warm) / max(1, total_steps - warm))
        return 0.05 + 0.95 * 0.5 * (1.0 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def make_optimizer(policy: DrivingPolicy, o: Optimisation) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices/kernels only (not biases, norms or positions)."""
    trained = [(n, p) for n, p in policy.named_parameters() if p.requires_grad]  # not a frozen encoder's
    decay = [p for n, p in trained if p.dim() >= 2 and not n.endswith("pos")]
    rest = [p for n, p in trained if not (p.dim() >= 2 and not n.endswith("pos"))]
    return torch.optim.AdamW([{"params": decay, "weight_decay": o.weight_decay},
                              {"params": rest, "weight_decay": 0.0}], lr=o.lr)


class WindowsForward(torch.nn.Module):
    """The training forward as one module: a batch's frames -> embeddings -> each window's head output.
    DistributedDataParallel synchronises gradients of what runs through a module's forward(), so under
    torchrun this is what it wraps; a single process calls it as it is."""

    def __init__(self, policy: DrivingPolicy):
        super().__init__()
        self.policy = policy

    def forward(self, x: torch.Tensor, index: torch.Tensor, times: torch.Tensor,
                latency: torch.Tensor | None = None, on_the_way: torch.Tensor | None = None) -> torch.Tensor:
        emb = self.policy.encode(x[None])[0]
        return self.policy.raw_from_embeddings(emb[index], times, latency, on_the_way)


class _NoWriter:
    """TensorBoard for ranks other than 0: they compute the same scalars and write none."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


def train_run(plan: TrainPlan, core_spec: str, data: Data, head: Head, train_eps: list[int], val_eps: list[int],
              run_dir: Path, desc: str = "", world: World = SINGLE, device: torch.device | None = None,
              precision: Choice | None = None) -> dict[str, Any]:
    """Train one policy on one split into ``run_dir``; returns its metrics (also written to metrics.json).
    ``core_spec``: the core as --core names it (``nac`` or ``nac+key=value``; one of ``plan.specs``).

    Under torchrun every rank runs this with the same arguments: each step's segments are shared out among
    the ranks (agent.training.distributed), gradients are averaged by DistributedDataParallel, validation is
    scored by all and reduced in episode order, and rank 0 alone writes checkpoints, TensorBoard and metrics.json."""
    device = device or device_for(plan.run.device, world)
    resumed = open_run_folder(plan.run.resume, plan.run.overwrite, run_dir, world)
    if resumed and resumed["train_state"].get("done"):
        metrics_path = run_dir / "metrics.json"
        if metrics_path.exists():
            if world.main:
                tqdm.write(f"{desc or core_spec}: already finished, reusing {metrics_path}")
            return json.loads(metrics_path.read_text())
    trainer = Trainer(plan, core_spec, data, (train_eps, val_eps), run_dir, desc or core_spec, world, device, head,
                      resumed, precision)
    return trainer.fit()


def open_run_folder(resume: bool, overwrite: bool, run_dir: Path, world: World) -> dict[str, Any] | None:
    """The checkpoint to resume from (--resume), None for a fresh run; refuses to overwrite a run by accident.
    --resume where no last.pt is: a run that saved epochs (best.pt, metrics.json) but lost its last.pt is refused
    (starting it over would replace them); one stopped before its first epoch was saved starts over, saying so."""
    last_path = run_dir / "last.pt"
    if last_path.exists() and resume:
        resumed = read_checkpoint(last_path)
        if "train_state" not in resumed:
            raise ValueError(f"{str(last_path)!r} has no training state to resume from")
        return resumed
    if resume:
        saved = [name for name in ("best.pt", "metrics.json") if (run_dir / name).exists()]
        if saved:
            raise ValueError(f"--resume: {str(last_path)!r} is missing, so the run in {str(run_dir)!r} (which saved "
                             f"{' and '.join(saved)}) cannot be continued; pass --overwrite instead of --resume to "
                             "train it again from epoch 1, or give another --out")
        if world.main and run_dir.exists():  # a core or fold not begun before the stop starts quietly
            tqdm.write(f"--resume: the run in {str(run_dir)!r} stopped before its first epoch was saved (no last.pt): "
                       "training it from epoch 1")
        overwrite = True  # what it logged before the stop goes: a fresh start
    if last_path.exists() and not overwrite:
        raise ValueError(f"{str(run_dir)!r} already holds a run (last.pt); pass --resume to continue it, "
                         f"--overwrite to start again, or another --out")
    if overwrite and world.main:  # a fresh start: old event files would mix two runs in TensorBoard
        for old in run_dir.glob("events.out.tfevents.*"):
            old.unlink()
    return None


def inverse_frequency_weights(targets: np.ndarray, device: torch.device) -> torch.Tensor:
    """--class-weights: cross-entropy weights of the discrete actions, inverse to their frequency."""
    counts = np.bincount(targets, minlength=5).astype(np.float64)
    w = np.where(counts > 0, counts.sum() / np.maximum(counts, 1) / (counts > 0).sum(), 0.0)
    return torch.tensor(w, dtype=torch.float32, device=device)


@dataclass
class TrainState:
    """A run's counters and history: what last.pt keeps (its ``train_state``, with the optimizer, the schedule, the
    RNG and ``done``) so that --resume continues the run where it stopped."""

    epoch: int = 0  # epochs finished
    batch: int = 0  # optimizer steps of the running epoch finished
    global_step: int = 0  # windows trained on so far, all ranks (TensorBoard's x axis)
    best_val_loss: float = math.inf
    best_epoch: int = -1  # 1-based; -1: no epoch finished
    history: list[dict[str, Any]] = field(default_factory=list)  # per finished epoch: its losses and scores
    initial_val: dict[str, float] = field(default_factory=dict)  # the untrained policy's validation scores
    train_time: float = 0.0  # seconds in optimizer steps
    train_samples: int = 0  # windows trained on, all epochs
    epoch_loss_sum: float = 0.0  # the running epoch's training loss, summed over its windows
    epoch_samples: int = 0  # the running epoch's windows

    def saved(self) -> dict[str, Any]:
        """The fields as last.pt's ``train_state`` holds them: one key each."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_saved(cls, train_state: dict[str, Any]) -> TrainState:
        """The state a last.pt saved; a field it lacks (a checkpoint older than the field) keeps its default, and the
        keys that are not counters (optimizer, scheduler, rng, done) are left out."""
        return cls(**{f.name: train_state[f.name] for f in fields(cls) if f.name in train_state})


class Trainer:
    """One run's moving parts (policy, optimizer, schedule, TensorBoard, the resumable ``state``) and its steps:
    ``fit`` = the untrained score, then epochs of optimizer steps, each epoch validated and checkpointed.
    ``core_spec``: the core as --core names it (one of ``plan.specs``); ``precision``: the experiment's choice (None:
    chosen here from --precision, for a Trainer built on its own)."""

    def __init__(self, plan: TrainPlan, core_spec: str, data: Data, split: tuple[list[int], list[int]],
                 run_dir: Path, desc: str, world: World, device: torch.device, head: Head,
                 resumed: dict[str, Any] | None, precision: Choice | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        run, opt = plan.run, plan.optimisation
        self.plan, self.opt, self.core_spec, self.data, self.run_dir, self.desc, self.world, self.device = (
            plan, opt, core_spec, data, run_dir, desc, world, device)
        self.train_eps, self.val_eps = split
        head_kind, names, self.cols = head.kind, head.names, head.cols
        self.resumed = resumed
        self.last_path, self.best_path = run_dir / "last.pt", run_dir / "best.pt"
        seed_everything(run.seed)
        keep_freed_memory()  # every step frees what the next allocates again
        targets = {e: episode_targets(data, e, self.cols) for e in self.train_eps}
        train_targets = np.concatenate(list(targets.values()))
        self.policy = build_policy(plan.model, core_spec, data, head_kind, names, train_targets, resumed,
                                   self.last_path)
        self.precision = precision or choose_precision(run.precision, device)  # what runs and why (metrics.json)
        self.policy.to(device).use_precision(self.precision.precision)
        if opt.freeze_encoder:
            self.policy.encoder.requires_grad_(False)
        self.anchor = init_anchor(plan.model.init, self.policy) if opt.stay_near_init > 0 and plan.model.init else []
        self.class_weight = (inverse_frequency_weights(train_targets, device)
                             if head_kind == "discrete" and opt.class_weights else None)
        r = plan.recovery
        self.recovery = (RecoveryViews(data.geometry, data.crop, data.image_size, r.share, r.offset_m, r.yaw_deg,
                                       r.return_s)
                         if r is not None and data.geometry is not None else None)
        self.lengths = {e: len(data.frames[e]) for e in self.train_eps}
        self.turns = None  # |steering label| per training step, for --oversample-turns
        if plan.windows.oversample_turns > 1:
            j = list(names or []).index("steer")  # the head has a steering column: checked in resolve_head
            self.turns = {e: np.abs(t[:, j]) for e, t in targets.items()}
        self.shares = episode_shares(self.lengths, data.sources, plan.windows.dataset_weight)
        steps_per_epoch = len(batch_plan(self.lengths, plan.windows, 0, self.turns, self.shares))
        self.optimizer = make_optimizer(self.policy, opt)
        self.scheduler = make_schedule(self.optimizer, opt.epochs * steps_per_epoch, opt.warmup, opt.lr_schedule)
        self.state = TrainState()
        if resumed:
            self.restore(resumed["train_state"])
        self.metadata = {"data": plan.data.paths, "policy": core_spec, "train_episodes": self.train_eps,
                         "val_episodes": self.val_eps, "precision": self.policy.precision, "args": plan.record}
        if world.main:
            run_dir.mkdir(parents=True, exist_ok=True)
        # a resumed run hides what a killed process logged after its last checkpoint (TensorBoard's purge_step),
        # so the curves show no step twice
        purge = self.state.global_step + 1 if resumed else None
        self.writer = SummaryWriter(str(run_dir), purge_step=purge) if world.main else _NoWriter()
        if not resumed:
            config = {"args": plan.record, "policy": self.policy.config.to_dict()}
            self.writer.add_text("config", "```\n" + json.dumps(config, indent=2) + "\n```")
        self.forward: torch.nn.Module = WindowsForward(self.policy)
        if world.active:  # also makes every rank start from rank 0's weights
            self.forward = data_parallel(self.forward, device)
        self.batch_rng: dict[str, Any] | None = None  # the RNG as the running batch began (replayed on resume)

    def restore(self, ts: dict[str, Any]) -> None:
        """Continue a run from its last.pt: optimizer, schedule, counters and RNG as they were."""
        self.optimizer.load_state_dict(ts["optimizer"])
        self.scheduler.load_state_dict(ts["scheduler"])
        self.state = TrainState.from_saved(ts)
        set_rng_state(ts["rng"])
        if self.world.main:
            tqdm.write(f"{self.desc}: resuming from {self.last_path} at epoch {self.state.epoch + 1}, batch "
                       f"{self.state.batch}" + (f" on {self.world.size} processes" if self.world.active else ""))

    def save_last(self, done: bool = False, rng: dict[str, Any] | None = None,
                  best: dict[str, Any] | None = None) -> None:
        """last.pt, and with ``best`` (its epoch and scores) best.pt: both or neither, so a full disk leaves the pair
        an earlier epoch wrote, and --resume continues from there."""
        if self.world.main:
            files = [(self.last_path, checkpoint_writer(self.policy, metadata=self.metadata, train_state={
                **self.state.saved(), "done": done, "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "rng": rng or rng_state()}))]
            if best is not None:
                files.append((self.best_path, checkpoint_writer(self.policy, metadata={**self.metadata, **best})))
            atomic_write_all(files)

    def validate(self) -> dict[str, float]:
        return evaluate(self.policy, self.data, self.val_eps, self.opt.loss, self.cols, self.class_weight,
                        world=self.world, latency=self.plan.windows.latency)

    def fit(self) -> dict[str, Any]:
        if not self.resumed:  # the untrained policy's score: the baseline every later epoch is compared with
            with stops_at_safe_points():  # a stop here ends the command with nothing to save
                self.state.initial_val = self.validate()
                self.writer.add_scalar("losses/val", self.state.initial_val["val_loss"], 0)
        try:
            with stops_at_safe_points():  # a stop lands between batches, never inside TensorBoard's writer
                while self.state.epoch < self.opt.epochs:
                    self.train_epoch()
                    self.end_epoch()
        except (KeyboardInterrupt, RuntimeError) as e:
            if isinstance(e, RuntimeError) and not (self.world.active and distributed.is_peer_failure(e)):
                raise
            self.stop(e)
        self.writer.close()
        blend = self.blend_with_init() if self.plan.model.blend_init is not None else None
        return self.final_metrics(blend)

    def blend_with_init(self) -> dict[str, Any]:
        """--blend-init W: best.pt becomes (1 - W) x the --init checkpoint + W x the best trained student (kept as
        best_tuned.pt; a rerun blends from it again, never from a blend), and the blend is validated like an epoch,
        so metrics.json says what it scores. A fine-tune learns the user's line; the blend keeps the start's way
        back to it (agent.training.interpolate)."""
        from agent.training.interpolate import write_mix

        share, tuned = self.plan.model.blend_init, self.run_dir / "best_tuned.pt"
        if self.world.main:
            if not tuned.exists():
                self.best_path.replace(tuned)
            write_mix(str(self.plan.model.init), str(tuned), share, str(self.best_path))
        distributed.barrier(self.world)
        self.policy.load_state_dict(load_checkpoint(self.best_path).state_dict())
        val = self.validate()
        tqdm.write(f"{self.desc}: best.pt is the blend {1 - share:g} x --init + {share:g} x epoch "
                   f"{self.state.best_epoch}: val_loss {val['val_loss']:.4f} (the fine-tuned student's "
                   f"{self.state.best_val_loss:.4f}, kept as {tuned.name})")
        return {"share": share, "init": self.plan.model.init, "tuned": str(tuned), **val}

    def train_epoch(self) -> None:
        """The optimizer steps of the current epoch (from its next batch on, after a resume)."""
        opt, state = self.opt, self.state
        epoch = state.epoch
        plan = batch_plan(self.lengths, self.plan.windows, epoch, self.turns, self.shares)
        self.policy.train()
        if opt.freeze_encoder:  # its dropout off and any running statistics kept: the --init encoder exactly
            self.policy.encoder.eval()
        bar = tqdm(total=len(plan), desc=f"{self.desc} epoch {epoch + 1}/{opt.epochs}", initial=state.batch,
                   leave=False, dynamic_ncols=True,
                   disable=not show_progress(self.plan.run.progress) or not self.world.main)
        window_loss, window_n, t_log, n_log = 0.0, 0, time.perf_counter(), 0
        for segments in plan[state.batch:]:
            raise_if_stopped()
            self.batch_rng = rng_state()  # an interrupted batch is replayed from here on resume
            n, step_loss, grad_norm = self.train_step(epoch, segments)
            self.batch_rng = None
            window_loss, window_n, n_log = window_loss + step_loss * n, window_n + n, n_log + 1
            bar.update(1)
            if n_log >= opt.log_every:
                now = time.perf_counter()
                self.log_scalars(window_loss / window_n, grad_norm, window_n / (now - t_log))
                bar.set_postfix(loss=f"{window_loss / window_n:.4f}")
                window_loss, window_n, t_log, n_log = 0.0, 0, now, 0
        bar.close()
        if window_n:
            self.writer.add_scalar("losses/train", window_loss / window_n, state.global_step)

    def train_step(self, epoch: int, segments: list[tuple[int, int, int]]) -> tuple[int, float, float]:
        """One optimizer step on the windows of ``segments``; returns (windows, loss, gradient norm)."""
        opt, world, device, state = self.opt, self.world, self.device, self.state
        t0 = time.perf_counter()
        n = sum(b - s for _, s, b in segments)  # windows in this step, over all ranks
        share = 1.0
        if world.active:  # this rank's share of the step; draws seeded by (seed, epoch, batch, rank)
            torch.manual_seed(step_seed(opt.seed, epoch, state.batch, world.rank))
            mine = world.part(segments)
            share = sum(b - s for _, s, b in mine) / n * world.size  # DDP's mean over ranks -> the step's mean
            segments = mine or segments[:1]  # too few segments for every rank: compute one, weigh it 0
        x, index, times, target, latency, on_the_way = self.batch(segments, epoch)
        raw = self.forward(x, torch.from_numpy(index).to(device), torch.from_numpy(times).to(device), latency,
                           on_the_way)
        loss = loss_fn(self.policy, raw, torch.from_numpy(target).to(device), opt.loss, self.class_weight)
        if world.active:
            loss = loss * share
        self.optimizer.zero_grad(set_to_none=True)
        (loss + opt.stay_near_init * self.distance_from_init() if self.anchor else loss).backward()
        step_loss = distributed.mean(world, loss.detach()).item()  # the whole step's loss, on every rank
        grad_norm = torch.nn.utils.clip_grad_norm_(self.policy.parameters(),
                                                   opt.grad_clip or math.inf).item()  # 0: no clipping
        if not (math.isfinite(step_loss) and math.isfinite(grad_norm)):  # before the step spreads it to the weights
            self.diverged(f"the training loss became {step_loss:g} (gradient norm {grad_norm:g}) at epoch "
                          f"{epoch + 1}, step {state.batch + 1}")
        self.optimizer.step()
        self.scheduler.step()
        state.batch += 1
        state.global_step += n
        state.train_samples += n
        state.train_time += time.perf_counter() - t0
        state.epoch_loss_sum += step_loss * n
        state.epoch_samples += n
        return n, step_loss, grad_norm

    def batch(self, segments: list[tuple[int, int, int]], epoch: int
              ) -> tuple[torch.Tensor, np.ndarray, np.ndarray, np.ndarray, torch.Tensor | None, torch.Tensor | None]:
        """The (augmented) input frames of ``segments``, each window's frame indexes and times, the targets,
        each window's latency in seconds (--latency-steps; its own random stream, so runs without it keep theirs)
        and the actions then on their way (--latency-queue)."""
        aug, w, data, config = self.plan.augmentation, self.plan.windows, self.data, self.policy.config
        rng = np.random.default_rng([w.seed, epoch, self.state.batch, self.world.rank, 31])
        shifts = latency_shifts(segments, w.latency, rng, data.latency_steps)
        latency = _latency_seconds(shifts, data, self.device)
        queues = window_queues(data, segments, shifts, config.queue_steps, self.cols)
        on_the_way = None if queues is None else torch.from_numpy(queues).to(self.device)
        shifts = label_shifts(segments, shifts, data.labels_land)
        if aug.enabled and data.env.first_person:  # picks a camera per segment, adjusts the targets
            return (*augment_first_person(data, segments, aug, w, self.cols, config.color, self.device, self.recovery,
                                          shifts), latency, on_the_way)
        frames, slices, index, times, target = gather_segments(data, segments, w.window, w.frame_stride, self.cols,
                                                               max_gap=w.window_gaps, shifts=shifts)
        if self.recovery is not None:  # --no-augment keeps the recovery views: they are data, not noise
            target = target.copy()
            self.recovery.apply_(frames, target, segments, slices, data.speeds)
        frames = torch.from_numpy(frames)
        x = (augment(frames, slices, config.image_size, self.device, config.color) if aug.enabled
             else frames_to_float(frames, config.image_size, self.device, config.color))
        return x, index, times, target, latency, on_the_way

    def log_scalars(self, loss: float, grad_norm: float, samples_per_sec: float) -> None:
        gs = self.state.global_step
        self.writer.add_scalar("losses/train", loss, gs)
        self.writer.add_scalar("charts/learning_rate", self.scheduler.get_last_lr()[0], gs)
        self.writer.add_scalar("charts/grad_norm", grad_norm, gs)
        self.writer.add_scalar("charts/samples_per_sec", samples_per_sec, gs)
        if self.anchor:
            self.writer.add_scalar("charts/distance_from_init", self.distance_from_init().item(), gs)

    def distance_from_init(self) -> torch.Tensor:
        """--stay-near-init: the squared distance of the weights from the --init checkpoint's, summed (L2-SP)."""
        return sum((((p - start) ** 2).sum() for p, start in self.anchor), torch.zeros((), device=self.device))

    def end_epoch(self) -> None:
        """Validate, log, keep the best checkpoint and save last.pt."""
        state, writer, epoch = self.state, self.writer, self.state.epoch
        train_loss = state.epoch_loss_sum / max(1, state.epoch_samples)
        val = self.validate()
        if not math.isfinite(val["val_loss"]):  # the epoch's last steps made the weights diverge
            self.diverged(f"the validation loss became {val['val_loss']:g} at the end of epoch {epoch + 1}")
        gs = state.global_step
        writer.add_scalar("losses/val", val["val_loss"], gs)
        writer.add_scalar("losses/train_epoch", train_loss, gs)
        for k, v in val.items():
            if k not in ("val_loss", "val_windows"):
                writer.add_scalar(f"metrics/{k}", v, gs)
        if self.world.main:  # attention diagnostics: rank 0's TensorBoard and history alone
            val.update(log_nac_internals(writer, self.policy, self.data, self.val_eps[0], gs, self.cols))
        writer.flush()
        state.history.append({"epoch": epoch + 1, "train_loss": train_loss, **val})
        state.epoch, state.batch, state.epoch_loss_sum, state.epoch_samples = epoch + 1, 0, 0.0, 0
        best = None
        if val["val_loss"] < state.best_val_loss:
            state.best_val_loss, state.best_epoch = val["val_loss"], epoch + 1
            best = {"epoch": epoch + 1, "val": val}
        try:
            self.save_last(done=state.epoch >= self.opt.epochs, best=best)
        except OSError as e:
            if disk_full(e):
                e.add_note(f"epoch {epoch + 1} finished but is not saved; python train.py --resume --out "
                           f"{self.plan.run.out} " + ("continues from the last.pt saved before it"
                                                       if self.last_path.exists() else "starts the run again"))
            raise
        if self.world.main:
            tqdm.write(f"{self.desc} epoch {epoch + 1}/{self.opt.epochs}: train {train_loss:.4f} "
                       + " ".join(f"{k} {v:.4f}" for k, v in val.items() if k != "val_windows")
                       + (f" ({NO_STRAIGHT_RATIO})"
                          if "val_steer_mse" in val and "val_steer_vs_straight" not in val else ""))

    def diverged(self, what: str) -> NoReturn:
        """A loss or gradient that is not finite: the weights diverged (a learning rate too high). The run stops in
        one line, its files as the last finished epoch saved them."""
        self.writer.close()
        kept = (f"last.pt keeps epoch {self.state.epoch}, best.pt epoch {self.state.best_epoch}"
                if self.state.epoch else "no epoch was saved")
        raise ValueError(f"{self.desc}: {what}: the training diverged; lower --lr (it is {self.opt.lr:g}) and start "
                         f"again with --overwrite ({kept})")

    def stop(self, e: BaseException) -> None:
        """Ctrl-C, SIGTERM or a failed peer process: save last.pt and raise Interrupted."""
        self.save_last(rng=self.batch_rng)  # mid-batch: the RNG as that batch began; else the current one
        self.writer.close()
        why = "interrupted" if isinstance(e, KeyboardInterrupt) else "another process of the run stopped"
        saved = f"saved {self.last_path}" if self.world.main else f"rank 0 saves {self.last_path}"
        raise Interrupted(f"{why} at epoch {self.state.epoch + 1}, batch {self.state.batch}; "
                          f"{saved}; continue with --resume --out {self.plan.run.out}") from None

    def final_metrics(self, blend: dict[str, Any] | None = None) -> dict[str, Any]:
        """metrics.json: the best epoch's validation scores, the history, costs and the run's settings (and with
        --blend-init, what best.pt, the blend, scores)."""
        state = self.state
        best = next(h for h in state.history if h["epoch"] == state.best_epoch)
        metrics = {
            "policy": self.core_spec, "run_dir": str(self.run_dir), "best_epoch": state.best_epoch,
            "best": {k: v for k, v in best.items() if k != "epoch"}, "last": state.history[-1],
            "initial": state.initial_val,
            "param_count": self.policy.num_parameters(), "train_time_s": state.train_time,
            "samples_per_sec": state.train_samples / max(state.train_time, 1e-9),
            "train_samples": state.train_samples,  # windows trained on, all epochs (--oversample-turns adds some)
            "train_windows": sum(self.lengths.values()), "val_windows": best["val_windows"], "device": str(self.device),
            "precision": self.policy.precision, "precision_reason": self.precision.reason,
            "threads": torch.get_num_threads(), "processes": self.world.size,
            "data_loading": "lazy" if self.data.lazy else "memory",
            "history": state.history, "args": self.plan.record, "policy_config": self.policy.config.to_dict(),
            "train_episodes": self.train_eps, "val_episodes": self.val_eps,
            **({"time_blocks": [list(p) for p in self.data.pieces]} if self.data.pieces is not None else {}),
            **({"blend": blend} if blend is not None else {}),
        }
        if self.world.main:
            write_json(self.run_dir / "metrics.json", metrics)
        return metrics
