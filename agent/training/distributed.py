"""Several processes, one policy: torchrun's environment, the process group and the few collective steps the
behaviour-cloning loop (agent/training/loop.py) needs.

``torchrun --nproc-per-node N train.py ...`` starts N copies of train.py and tells each, through environment
variables, its rank among them (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``) and where to
meet (``MASTER_ADDR``/``MASTER_PORT``, or a rendezvous endpoint across machines). A plain ``python train.py``
sets none of them: its world has one process and nothing here does anything, so its numbers are the ones it
always had.

Why these pieces:
* the backend follows the device: gloo for CPU tensors, NCCL for CUDA ones (each rank takes the GPU of its
  local rank);
* every rank computes the same batch plan and takes its share of each step's segments, so N processes train
  with the single process's batch, learning rate and schedule; DistributedDataParallel averages gradients;
* random draws (dropout, augmentation) come from a generator reseeded from (seed, epoch, batch, rank) at every
  step, so ranks do not repeat each other's draws and a resumed run replays exactly the steps it missed,
  without having to collect every rank's generator state into the checkpoint.
"""
from __future__ import annotations

import contextlib
import datetime
import inspect
import os
from dataclasses import dataclass, replace
from typing import Any, Iterator, Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from common.stops import sigterm_as_interrupt

ENV_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
# long: ranks wait in a barrier while the frames cache of a huge dataset is prepared
TIMEOUT = datetime.timedelta(hours=2)


@dataclass(frozen=True)
class World:
    """This process's place among the training processes (rank 0 of 1 for a plain run)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1
    backend: str | None = None  # set once the process group is up

    @property
    def active(self) -> bool:
        return self.size > 1

    @property
    def main(self) -> bool:
        """Rank 0 writes (checkpoints, TensorBoard, metrics.json, args.json) and prints; the others only compute."""
        return self.rank == 0

    def part(self, items: Sequence[Any]) -> list[Any]:
        """This rank's share of a list every rank holds in the same order (every size-th item from its rank)."""
        return list(items[self.rank::self.size])


SINGLE = World()


def from_env(environ: dict[str, str] | None = None) -> World:
    """The world torchrun describes in the environment; a single process when it describes none."""
    env = os.environ if environ is None else environ
    if "WORLD_SIZE" not in env:
        return SINGLE
    try:
        rank, size = int(env.get("RANK", "0")), int(env["WORLD_SIZE"])
        local_rank = int(env.get("LOCAL_RANK", str(rank)))
        local_size = int(env.get("LOCAL_WORLD_SIZE", str(size)))
    except ValueError:
        raise ValueError("the torchrun variables " + ", ".join(f"{k}={env.get(k)!r}" for k in ENV_VARS)
                         + " are not all integers") from None
    if not (size >= 1 and 0 <= rank < size and 0 <= local_rank < local_size <= size):
        raise ValueError("inconsistent torchrun variables " + ", ".join(f"{k}={env.get(k)!r}" for k in ENV_VARS))
    return World(rank, size, local_rank, local_size)


def device_for(requested: str, world: World) -> torch.device:
    """``--device`` (auto | cpu | cuda) for this rank: with CUDA, rank r of a machine takes its GPU r."""
    use_cuda = requested == "cuda" or (requested == "auto" and torch.cuda.is_available())
    if not use_cuda:
        return torch.device("cpu")
    if world.active:
        if world.local_rank >= torch.cuda.device_count():
            raise ValueError(f"local rank {world.local_rank} has no GPU of its own ({torch.cuda.device_count()} "
                             f"visible): start at most that many processes per machine, or pass --device cpu")
        return torch.device("cuda", world.local_rank)
    return torch.device("cuda")


def data_parallel(module: torch.nn.Module, device: torch.device) -> DistributedDataParallel:
    """DDP over ``module``, its buffers not re-broadcast before every forward (every rank already holds the same:
    seeded wiring, fixed statistics). The switch is ``forward_sync_buffers`` in torch 2.13 and later,
    ``broadcast_buffers`` in earlier versions; the project supports both (pyproject: torch>=2.3)."""
    renamed = "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters
    switch = {"forward_sync_buffers" if renamed else "broadcast_buffers": False}
    return DistributedDataParallel(module, device_ids=[device.index] if device.type == "cuda" else None, **switch)


@contextlib.contextmanager
def joined(world: World, device: torch.device) -> Iterator[World]:
    """The process group for the duration of a command (nothing for a single process): NCCL when the device
    is a GPU, gloo otherwise; torn down however the command ends. SIGTERM (`kill PID`, a batch scheduler, or
    torchrun stopping the other ranks when one fails) stops training like Ctrl-C, so (rank 0) saves last.pt."""
    if not world.active:
        with sigterm_as_interrupt():
            yield world
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, timeout=TIMEOUT)
    try:
        with sigterm_as_interrupt():
            yield replace(world, backend=backend)
        dist.barrier()  # a finished run: every rank is done communicating before any tears its connections down
    finally:
        dist.destroy_process_group()


def barrier(world: World) -> None:
    if world.active:
        dist.barrier()


def gather(world: World, obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order, on every rank (small Python objects: validation outputs, flags)."""
    if not world.active:
        return [obj]
    out: list[Any] = [None] * world.size
    dist.all_gather_object(out, obj)
    return out


def mean(world: World, value: torch.Tensor) -> torch.Tensor:
    """The mean over ranks of a scalar tensor (the value itself for a single process)."""
    if not world.active:
        return value
    value = value.detach().clone()
    dist.all_reduce(value)
    return value / world.size


def step_seed(seed: int, epoch: int, batch: int, rank: int) -> int:
    """The torch seed of one rank's training step: distinct per rank and step, a function of nothing else."""
    return int(np.random.SeedSequence([seed, epoch, batch, rank, 0xDD9]).generate_state(1, np.uint64)[0] >> 1)


def is_peer_failure(error: BaseException) -> bool:
    """A collective that failed because another rank went away (stopped with Ctrl-C, killed, crashed)."""
    kinds = tuple(k for k in (getattr(dist, "DistError", None),) if k is not None)
    text = str(error).lower()
    return (isinstance(error, kinds) or isinstance(error, RuntimeError)) and any(
        s in text for s in ("connection closed", "connection reset", "broken pipe", "gloo", "nccl", "timed out"))
