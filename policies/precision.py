"""The numeric precision a policy runs at: fp32, or bfloat16 autocast where bf16 trains faster.

One rule, in one place (``choose``, and ``resolve`` for the precision alone): ``auto`` is bf16 on a CPU with AMX
(the ``amx_bf16`` flag) and on a CUDA GPU with native bf16, and fp32 anywhere else: a CPU with AVX-512-BF16 but no
AMX, or with neither (where bf16 is emulated), trains slower in bf16, and a default is never slower than the option
it replaces (the figures per CPU: docs/benchmarks.md, "Where users wait"). It reads the CPU's flags, no timing
probe: a probe's answer depends on the model, the batch and the machine's load, costs seconds at every start or a
cache that can go stale, and the flags already part the CPUs measured. ``choose`` also says why, in words train.py
prints and records (args.json, metrics.json). ``bf16`` asks for it on any CPU (emulated, and slower, where the CPU
lacks it) and on a GPU that has it; ``fp32`` is the plain float32 path, untouched.

What runs in bf16 is the frame encoder alone (``DrivingPolicy.encode``), with its frames channels-last (the
layout oneDNN's bf16 convolutions are fastest on), and only for a call of at least ``BF16_MIN_FRAMES``
frames. Everything after it stays fp32 (the timings: docs/benchmarks.md, "What stays fp32, and why"):

* the sequence core and the head: bf16 autocast makes them no faster (NAC's native selection and gather kernels
  read float32 only) and moves nac-focus's output (its logit scale multiplies the logits' rounding);
* the loss, the target normalisation and the optimizer (its state and the master weights): fp32, as
  autocast leaves them;
* one frame per call (a closed-loop step): the casts cost more than the convolutions save, so a stream steps in
  fp32 and drives exactly as it does in fp32.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator

if TYPE_CHECKING:
    import torch

PRECISIONS = ("auto", "fp32", "bf16")  # torch is imported where it is used: the CLIs name these before importing it
BF16_MIN_FRAMES = 8  # fewer frames per encoder call run fp32 (see the module docstring)
AMX_FLAG = "amx_bf16"  # /proc/cpuinfo's flag of a CPU whose AMX tiles compute bf16: auto picks bf16 there
AVX512_BF16_FLAG = "avx512_bf16"  # bf16 dot products in AVX-512 registers, without AMX: bf16 trains slower there


@dataclass(frozen=True)
class Choice:
    """The precision a run uses (fp32 | bf16) and why, as train.py prints it and args.json / metrics.json keep it."""

    precision: str
    reason: str

    def line(self) -> str:
        return f"precision: {self.precision} ({self.reason})"

    def record(self) -> dict[str, str]:
        return {"precision": self.precision, "reason": self.reason}


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> set[str]:
    """The CPU's feature flags from ``cpuinfo`` (Linux); empty where there is no such file."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return set()
    return {flag for line in text.splitlines() if line.startswith("flags") for flag in line.split(":", 1)[1].split()}


def cpu_bf16_flags() -> set[str]:
    """Which of AMX_FLAG and AVX512_BF16_FLAG this CPU has: torch's probes where it has them (its AMX probe also
    asks the OS whether the tiles may be used), the CPU's flags otherwise (empty where neither can tell)."""
    import torch

    amx, avx512 = (getattr(torch.cpu, name, None) for name in ("_is_amx_tile_supported", "_is_avx512_bf16_supported"))
    if callable(amx) and callable(avx512):
        return {f for f, has in ((AMX_FLAG, amx()), (AVX512_BF16_FLAG, avx512())) if has}
    return cpu_flags() & {AMX_FLAG, AVX512_BF16_FLAG}


def cpu_auto(flags: Iterable[str]) -> Choice:
    """``auto`` on a CPU with these /proc/cpuinfo ``flags``: bf16 with AMX only (see the module docstring)."""
    flags = set(flags)
    if AMX_FLAG in flags:
        return Choice("bf16", f"auto: this CPU has AMX ({AMX_FLAG}); bf16 trained 1.71x as fast as fp32 on one")
    if AVX512_BF16_FLAG in flags:
        return Choice("fp32", f"auto: this CPU has {AVX512_BF16_FLAG} but no AMX; bf16 measured slower there "
                              "(0.63x fp32's training speed)")
    return Choice("fp32", f"auto: this CPU has neither AMX nor {AVX512_BF16_FLAG}, so bf16 would be emulated; "
                          "measured slower there (0.22x fp32's training speed on an AVX2 AMD EPYC)")


def gpu_bf16(device: torch.device) -> bool:
    """Whether the CUDA ``device`` runs bf16 natively (not emulated)."""
    import torch

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


def choose(precision: str, device: torch.device | str, flag: str = "--precision", *,
           flags: Iterable[str] | None = None, native_gpu_bf16: bool | None = None) -> Choice:
    """``auto`` | ``fp32`` | ``bf16`` on ``device`` -> the precision a run uses, fp32 or bf16, and why. ``flags``:
    the CPU's bf16 flags (default: cpu_bf16_flags()); ``native_gpu_bf16``: whether the GPU runs bf16 natively
    (default: gpu_bf16); both given by tests, to decide for a machine this is not."""
    import torch

    device = torch.device(device)
    check(precision, flag)
    if device.type == "cuda":
        native = gpu_bf16(device) if native_gpu_bf16 is None else native_gpu_bf16
        name = torch.cuda.get_device_name(device) if torch.cuda.is_available() else str(device)
        if precision == "auto":
            return (Choice("bf16", f"auto: this GPU ({name}) runs bf16 natively") if native
                    else Choice("fp32", f"auto: this GPU ({name}) has no native bf16"))
        runs = (torch.cuda.is_available() and torch.cuda.is_bf16_supported()) if native_gpu_bf16 is None else native
        if precision == "bf16" and not runs:  # asked for, emulated bf16 is allowed; auto wants it native
            raise ValueError(f"{flag} bf16: this GPU ({name}) does not run bfloat16; use auto or fp32")
    elif precision == "auto":
        if device.type != "cpu":
            return Choice("fp32", f"auto: bf16 is picked only on a CPU with AMX and a CUDA GPU with native bf16, "
                                  f"not on {device.type}")
        return cpu_auto(cpu_bf16_flags() if flags is None else flags)
    return Choice(precision, f"asked for: {flag} {precision}")


def resolve(precision: str, device: torch.device | str, flag: str = "--precision") -> str:
    """``auto`` | ``fp32`` | ``bf16`` on ``device`` -> the precision a run uses, fp32 or bf16 (choose's)."""
    return choose(precision, device, flag).precision


def runs_bf16(precision: str, frames: int) -> bool:
    """Whether an encoder call on ``frames`` frames runs in bf16 (precision bf16, at least BF16_MIN_FRAMES)."""
    return precision == "bf16" and frames >= BF16_MIN_FRAMES


@contextlib.contextmanager
def bf16_autocast(device: torch.device | str) -> Iterator[None]:
    """bfloat16 autocast on ``device``'s kind (cpu or cuda): matrix products and convolutions in bf16."""
    import torch

    with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
        yield
