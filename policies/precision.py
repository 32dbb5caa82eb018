"""The numeric precision a policy runs at: fp32, or bfloat16 autocast where the hardware runs it natively.

One rule, in one place (``resolve``): ``auto`` is bf16 on a CPU with AMX or AVX-512-BF16 and on a CUDA GPU
with native bf16, fp32 anywhere else; ``bf16`` asks for it on any CPU (emulated, and slower, where the CPU
lacks it) and on a GPU that has it; ``fp32`` is the plain float32 path, untouched.

What runs in bf16 is the frame encoder alone (``DrivingPolicy.encode``), with its frames channels-last (the
layout oneDNN's bf16 convolutions are fastest on), and only for a call of at least ``BF16_MIN_FRAMES``
frames. Everything after it stays fp32, measured on this project's CPU (AMX), 1 thread, docs/benchmarks.md:

* the sequence core and the head: a nac-focus core's forward + backward on a training batch (64 windows of
  8) takes as long under bf16 autocast as in fp32 (25.4 ms both), mha's and nac-exact's longer (8.3 ->
  12.7 ms, 16.2 -> 18.5 ms; NAC's native selection and gather kernels read float32 only), and nac-focus's
  output moves by 2.2 % (relative L2; its logit scale multiplies the logits' rounding), so bf16 buys nothing
  there and costs accuracy;
* the loss, the target normalisation and the optimizer (its state and the master weights): fp32, as
  autocast leaves them;
* one frame per call (a closed-loop step): the casts cost more than the convolutions save (the CarRacing
  CNN: 0.8 ms fp32, 1.0-1.1 ms bf16 for 1 to 4 frames; faster from 8 frames on), so a stream steps in fp32
  and drives exactly as it does in fp32.
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    import torch

PRECISIONS = ("auto", "fp32", "bf16")  # torch is imported where it is used: the CLIs name these before importing it
BF16_MIN_FRAMES = 8  # fewer frames per encoder call run fp32 (see the module docstring)
NATIVE_CPU_FLAGS = ("amx_bf16", "avx512_bf16")  # /proc/cpuinfo flags of CPUs that compute bf16 natively


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> set[str]:
    """The CPU's feature flags from ``cpuinfo`` (Linux); empty where there is no such file."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return set()
    return {flag for line in text.splitlines() if line.startswith("flags") for flag in line.split(":", 1)[1].split()}


def cpu_native_bf16() -> bool:
    """Whether this CPU computes bf16 natively (AMX or AVX-512-BF16): torch's own probes where it has them,
    the CPU's flags otherwise."""
    import torch

    probes = [getattr(torch.cpu, name, None) for name in ("_is_amx_tile_supported", "_is_avx512_bf16_supported")]
    if all(callable(p) for p in probes):
        return any(p() for p in probes)
    return bool(cpu_flags() & set(NATIVE_CPU_FLAGS))


def native_bf16(device: torch.device | str) -> bool:
    """Whether ``device`` runs bf16 natively: a CPU by cpu_native_bf16, a CUDA GPU without emulation."""
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return device.type == "cpu" and cpu_native_bf16()
    if not torch.cuda.is_available():
        return False
    try:
        return torch.cuda.is_bf16_supported(including_emulation=False)
    except TypeError:  # torch before 2.4 has no emulation to tell apart
        return torch.cuda.is_bf16_supported()


def check(precision: str, flag: str = "--precision") -> str:
    if precision not in PRECISIONS:
        raise ValueError(f"{flag} must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    return precision


def resolve(precision: str, device: torch.device | str, flag: str = "--precision") -> str:
    """``auto`` | ``fp32`` | ``bf16`` on ``device`` -> the precision a run uses, fp32 or bf16."""
    import torch

    device = torch.device(device)
    if check(precision, flag) == "auto":
        return "bf16" if native_bf16(device) else "fp32"
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ValueError(f"{flag} bf16: this GPU ({torch.cuda.get_device_name(device)}) does not run bfloat16; "
                         "use auto or fp32")
    return precision


def runs_bf16(precision: str, frames: int) -> bool:
    """Whether an encoder call on ``frames`` frames runs in bf16 (precision bf16, at least BF16_MIN_FRAMES)."""
    return precision == "bf16" and frames >= BF16_MIN_FRAMES


@contextlib.contextmanager
def bf16_autocast(device: torch.device | str) -> Iterator[None]:
    """bfloat16 autocast on ``device``'s kind (cpu or cuda): matrix products and convolutions in bf16."""
    import torch

    with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
        yield
