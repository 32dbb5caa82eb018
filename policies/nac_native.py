"""Optional native kernels for the NAC layer: the exact top-K selection (``policies.topk.select_exact``),
fused with the scores where no key is padded, and the gather of the pair inputs (``gather_pairs``, one pass
instead of a gather and a broadcast add, the same bits).

Top-K of score rows (``topk_rows``). ``torch.topk`` on the CPU does a partial sort per row; this kernel reads
each row twice instead. Pass 1 (vectorised) takes the
maxima of the 64 strided groups {j : j % 64 == g}; the smallest of K maxima over disjoint sets of groups, th0,
is a lower bound of the row's K-th largest score (K distinct scores reach it). Pass 2 reads the row in order,
16 scores per vector compare, and looks only at the few scores (~20 of 1024) that reach th0: with AVX-512
they are compressed into a candidate list and each goes straight to its rank (the count of candidates above
it), no branch per score; with AVX2 or plain C they are inserted one by one, the bound rising to the K-th
best found so far. The right version is picked once, when the library is loaded.

Fused scores and top-K (``scores_topk``). With every key visible (no padding; causal or not: query i
then sees keys 0..i, a shorter row) writing the [B, H, T, T] score matrix (16 MB at T=1024) with matmul and
reading it back for the top-K is all the work there is. Instead each thread takes 16 query rows of one head
at a time, scores them into its own buffer (16 x T floats, in L1/L2) and takes their top K there, so the
scores never reach memory. The keys are laid out in blocks of 64, each block transposed (``[d, 64]``,
contiguous, zero-padded at the end), so one block (4 KB at d=16) stays in L1 while the 16 rows read it and
a row's 64 scores of a block are 4 AVX-512 registers accumulated over d with FMA. The dot products are
summed over d in order, so scores can differ from matmul's in the last bits: a near-tie at the K-th place
may then rank the other way (the tests check values within 1e-5 and indices wherever the K-th and (K+1)-th
scores are further apart). Timings: docs/nac.md, "Performance", and docs/benchmarks.md, "NAC runtime".

The top-K result equals ``torch.topk(scores, k)`` (values and indices, sorted) except for the order of *tied*
scores, which here is always the lower index first (torch leaves it unspecified). NaN ranks above every
number, as in torch; -inf (a masked key) is never selected: its slot keeps value -inf and index -1.

The C source, ``nac_native.c`` beside this module (package data in pyproject.toml, so an installed package has
it), is compiled on first use with the system C compiler (``$CC`` or ``cc``) into a per-user cache
(``$XDG_CACHE_HOME/nac-drive``, else ``~/.cache/nac-drive``) and loaded with ctypes (no torch headers, no build
step); the cached library's name hashes the source's text, so an edit of the source builds a new one. On x86-64
with GCC >= 11 (Linux) the scoring and pass 1 are built three times (AVX-512, AVX2 + FMA, baseline;
``target_clones``, chosen by the loader) and pass 2 has hand-written AVX-512 and AVX2 versions, so the cached
library is portable (never ``-march=native``); elsewhere one plain build.
Whenever building or loading is not possible (no compiler, read-only home, not Linux/macOS, or
``NAC_NATIVE=0`` in the environment) ``topk_rows``/``scores_topk``/``gather_pairs`` return None and the
caller uses torch (matmul and ``torch.topk``).
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import torch
import torch.nn.functional as F

MAX_K = 32  # the grouped scan needs K <= half the 64 groups; larger K falls back to torch.topk
KEY_BLOCK = 64  # keys per block of the fused kernel's key layout (SB in the C source)
MIN_PARALLEL_SCORES = 1 << 16  # fewer scores per call run on one thread (a parallel region costs ~10 us)

SOURCE = Path(__file__).with_name("nac_native.c")  # the kernels' C source, read when the library is built

_lock = threading.Lock()
_state: dict = {}  # "lib": the loaded library, or None once building or loading it failed


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "nac-drive"


def _compile_and_load(compiler: str, flags: list[str]) -> ctypes.CDLL:
    """The library for these flags, compiled into the cache unless it is there already (raises on failure,
    a missing source file included). The cache key hashes the source's text, so an edit of it rebuilds."""
    source = SOURCE.read_text()
    digest = hashlib.sha256("\0".join([source, compiler, *flags, sys.platform]).encode()).hexdigest()[:16]
    directory = _cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"nac_topk_{digest}.so"
    if not target.exists():
        with tempfile.TemporaryDirectory(dir=directory) as tmp:
            src, out = Path(tmp) / "nac_topk.c", Path(tmp) / "nac_topk.so"
            src.write_text(source)
            subprocess.run([compiler, *flags, "-o", str(out), str(src), "-lm"], check=True, capture_output=True,
                           timeout=120)
            os.replace(out, target)  # atomic: a concurrent build writes the same bytes
    return ctypes.CDLL(str(target))


def _build() -> ctypes.CDLL | None:
    """Compile (once per source, compiler and flags) and load the kernel; None when that is not possible.

    With OpenMP first: the library then uses the libgomp torch has already loaded (same soname), so it
    shares torch's threads and follows ``torch.set_num_threads``; without it (e.g. a compiler lacking
    OpenMP) the kernel runs on one thread.
    """
    if os.environ.get("NAC_NATIVE", "1") == "0" or not sys.platform.startswith(("linux", "darwin")):
        return None
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        return None
    base = ["-O3", "-std=c99", "-ffp-contract=fast", "-shared", "-fPIC"]  # (contract: FMA in the dot products)
    for flags in (base + ["-fopenmp"], base):
        try:
            lib = _compile_and_load(compiler, flags)
        except (OSError, subprocess.SubprocessError):
            continue
        fn = lib.nac_topk_rows
        fn.restype = None
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                       ctypes.c_void_p, ctypes.c_int64]
        fn = lib.nac_scores_topk
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 6 + [ctypes.c_void_p, ctypes.c_int64] \
            + [ctypes.c_void_p] * 2 + [ctypes.c_int64]
        fn = lib.nac_scan_level
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_int]
        fn = lib.nac_gather_pairs
        fn.restype = None
        fn.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 6 + [ctypes.c_void_p, ctypes.c_int64]
        return lib
    return None


def _library() -> ctypes.CDLL | None:
    if "lib" not in _state:
        with _lock:
            if "lib" not in _state:
                _state["lib"] = _build()
    return _state["lib"]


def available() -> bool:
    """Whether the native kernel is (or can be) built and loaded here."""
    return _library() is not None


def scan_level(level: int = -1) -> int | None:
    """For tests: make the top-K scan use instruction-set level ``level`` (0 plain C, 1 AVX2, 2 AVX-512,
    capped at what this CPU has; -1 the best, the default at load) and return the level now in use; None
    when the kernel is not built. Process-wide: not to be called while another thread runs a kernel."""
    lib = _library()
    return None if lib is None else int(lib.nac_scan_level(level))


def _cpu_float32(*tensors: torch.Tensor) -> bool:
    """Whether every tensor is a float32 CPU tensor: what the kernels read."""
    return all(t.dtype == torch.float32 and t.device.type == "cpu" for t in tensors)


def topk_rows(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``torch.topk(scores, k, dim=-1)`` of a float32 CPU tensor, or None when the kernel does not apply.

    Rows run in parallel on torch's OpenMP threads when there are at least ``MIN_PARALLEL_SCORES`` scores.
    """
    n = scores.shape[-1] if scores.dim() else 0
    if not _cpu_float32(scores) or not 1 <= k <= min(MAX_K, n) or scores.requires_grad:
        return None
    lib = _library()
    if lib is None:
        return None
    scores = scores.contiguous()
    values = torch.empty(*scores.shape[:-1], k, dtype=torch.float32)
    indices = torch.empty(*scores.shape[:-1], k, dtype=torch.int64)
    lib.nac_topk_rows(scores.data_ptr(), scores.numel() // n, n, k, values.data_ptr(), indices.data_ptr(),
                      MIN_PARALLEL_SCORES)
    return values, indices


def scores_topk(q: torch.Tensor, keys: torch.Tensor, lengths: torch.Tensor | None,
                k: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The top ``k`` (sorted) of the score rows ``q . keys`` without the score matrix, or None when the kernel
    does not apply (not float32 CPU tensors, k outside 1..MAX_K, or not built here).

    ``q`` [B, H, Tq, d], ``keys`` [B, H, Tk, d], ``lengths`` [B, Tq] int64 or None: query i of sample b sees
    the keys 0..lengths[b, i]-1 (clamped to 0..Tk; None: all Tk keys). Returns values and indices
    [B, H, Tq, k]; slots beyond a row's length are filler (-inf, -1). The same as
    ``topk_rows(q @ keys^T, k)`` with the invisible keys at -inf, up to the round-off of the dot products
    (summed over d in order, with FMA where the CPU has it): near-ties may rank differently.
    """
    if q.dim() != 4 or keys.dim() != 4 or q.shape[:2] != keys.shape[:2] or q.shape[3] != keys.shape[3]:
        raise ValueError(f"scores_topk: q [B, H, Tq, d] and keys [B, H, Tk, d]; got {tuple(q.shape)}, "
                         f"{tuple(keys.shape)}")
    (B, H, Tq, d), Tk = q.shape, keys.shape[2]
    if not _cpu_float32(q, keys) or not 1 <= k <= MAX_K or d < 1:
        return None
    if lengths is not None and (lengths.dtype != torch.int64 or lengths.device.type != "cpu"
                                or tuple(lengths.shape) != (B, Tq)):
        return None
    lib = _library()
    if lib is None:
        return None
    nb = -(-Tk // KEY_BLOCK)
    # the keys in blocks of KEY_BLOCK, each block transposed ([.., block, feature, key]), zero-padded
    blocked = F.pad(keys.detach(), (0, 0, 0, nb * KEY_BLOCK - Tk)).view(B, H, nb, KEY_BLOCK, d).transpose(-1, -2)
    blocked = blocked.contiguous()
    q = q.detach().contiguous()
    lengths = None if lengths is None else lengths.contiguous()
    values = torch.empty(B, H, Tq, k, dtype=torch.float32)
    indices = torch.empty(B, H, Tq, k, dtype=torch.int64)
    failed = lib.nac_scores_topk(q.data_ptr(), blocked.data_ptr(), B * H, H, Tq, Tk, nb, d,
                                 None if lengths is None else lengths.data_ptr(), k, values.data_ptr(),
                                 indices.data_ptr(), MIN_PARALLEL_SCORES)
    return None if failed else (values, indices)


def gather_pairs(keys: torch.Tensor, query: torch.Tensor, rows: torch.Tensor) -> torch.Tensor | None:
    """``keys.gather(2, rows)`` with ``query`` added to the first ``query.shape[1]`` features, broadcast over
    the K slots: keys [H, F, N], query [H, Fq, M], rows [H, K, M] (int64, into N) -> [H, F, K*M]; None when
    the kernel does not apply (not float32 CPU tensors, or not built here)."""
    if not _cpu_float32(keys, query) or rows.dtype != torch.int64:
        return None
    lib = _library()
    if lib is None:
        return None
    keys, query, rows = keys.contiguous(), query.contiguous(), rows.contiguous()
    (H, F, N), (K, M) = keys.shape, rows.shape[1:]
    out = torch.empty(H, F, K * M, dtype=torch.float32)
    lib.nac_gather_pairs(keys.data_ptr(), query.data_ptr(), rows.data_ptr(), H, F, query.shape[1], N, K, M,
                         out.data_ptr(), MIN_PARALLEL_SCORES)
    return out
