"""NAC against nn.MultiheadAttention and nn.LSTM on a CUDA GPU: forward and forward+backward milliseconds.

The CPU comparison (`benchmarks.nac_runtime --vs-mha`) times the paper's setting on the machines this project is
built on; this is its GPU counterpart, for a user who has one: 64 features, 4 heads, NAC exact with top-K 8,
batch 1 and 64, T = 1024 by default. Each figure is the median of `--repeats` passes after 3 warm-ups, the GPU
synchronised around every pass (kernels run asynchronously, so an unsynchronised clock would time the launch).
Forward runs under `torch.no_grad`; forward+backward takes the loss as the mean of squared outputs.

    python -m benchmarks.cuda_cores                     # T=1024, batch 1 and 64, 20 passes each
    python -m benchmarks.cuda_cores --seq-len 4096 --batches 1
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn

from common.cli import option, run_command

PROG = "python -m benchmarks.cuda_cores"


def median_ms(fn: Callable[[], object], repeats: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def cores(features: int, heads: int, topk: int) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    """Each core as a call from x [B, T, F] to its sequence output, on the GPU."""
    from policies.nac import NAC

    torch.manual_seed(0)
    nac = NAC(features, features, heads, mode="exact", topk=topk, seed=0).cuda()
    mha = nn.MultiheadAttention(features, heads, batch_first=True).cuda()
    lstm = nn.LSTM(features, features, batch_first=True).cuda()
    return {"nac": nac, "mha": lambda x: mha(x, x, x, need_weights=False)[0], "lstm": lambda x: lstm(x)[0]}


def _batch_sizes(text: str) -> tuple[int, ...]:
    """'1,64' -> (1, 64): the batch sizes timed, each at least 1."""
    try:
        sizes = tuple(int(b) for b in text.split(","))
    except ValueError:
        raise ValueError(f"--batches takes comma-separated integers, not {text!r}") from None
    if min(sizes) < 1:
        raise ValueError(f"every batch size must be at least 1, got {text!r}")
    return sizes


@dataclass
class CudaCoresArgs:
    seq_len: int = option(1024, "sequence length T", group="model")
    batches: tuple[int, ...] = option((1, 64), "comma-separated batch sizes (default: 1,64)", group="model",
                                      metavar="B,B", parse=_batch_sizes)
    repeats: int = option(20, "timed passes per figure", group="runtime")
    topk: int = option(8, "NAC's top-K", group="model")


def main(argv: list[str] | None = None) -> int:
    return run_command(CudaCoresArgs, _benchmark, argv, prog=PROG, doc=__doc__, mistakes=(ValueError, OSError))


def _benchmark(args: CudaCoresArgs) -> int:
    if not torch.cuda.is_available():
        raise ValueError("no CUDA GPU is visible to torch; the CPU figures are `python -m benchmarks.nac_runtime`")
    if args.seq_len < 1 or args.repeats < 1:
        raise ValueError("--seq-len and --repeats must be at least 1")
    calls = cores(64, 4, args.topk)
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, T={args.seq_len}, "
          f"median of {args.repeats} passes (ms)\n")
    print("| batch | core | forward | forward+backward |\n| --- | --- | --- | --- |")
    for batch in args.batches:
        x = torch.randn(batch, args.seq_len, 64, device="cuda")
        for name, call in calls.items():
            with torch.no_grad():
                fwd = median_ms(lambda: call(x), args.repeats)
            both = median_ms(lambda: call(x).pow(2).mean().backward(), args.repeats)
            print(f"| {batch} | {name} | {fwd:.2f} | {both:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
