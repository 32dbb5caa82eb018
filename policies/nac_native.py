"""Optional native kernels for the NAC layer: the exact top-K selection (``policies.nac.select_exact``) and
the gather of the pair inputs (``gather_pairs``, one pass instead of a gather and a broadcast add, the same
bits). Everything below is about the top-K, the one that matters.

Why: at T=1024 (4 heads, K=8) ``torch.topk`` on the CPU took ~14 ms of a ~35 ms forward pass (a partial
sort per row, ~3 ns per score). This kernel reads each score row twice instead: a vectorised pass takes the
maxima of 64 strided groups of the row; the K-th largest group maximum is a lower bound of the row's K-th
largest score, so only the few groups whose maximum reaches it are scanned for the top K (measured ~3x
faster, see docs/nac.md "Performance").

The result equals ``torch.topk(scores, k)`` (values and indices, sorted) except for the order of *tied*
scores, which here is always the lower index first (torch leaves it unspecified). NaN ranks above every
number, as in torch; -inf (a masked key) is never selected: its slot keeps value -inf and index -1.

The C source below is compiled on first use with the system C compiler (``$CC`` or ``cc``) into a per-user
cache (``$XDG_CACHE_HOME/nac-drive``, else ``~/.cache/nac-drive``) and loaded with ctypes (no torch headers,
no build step). Whenever that is not possible (no compiler, read-only home, not Linux/macOS, or
``NAC_NATIVE=0`` in the environment) ``topk_rows`` returns None and the caller uses ``torch.topk``.
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

MAX_K = 32  # the grouped scan needs K <= half the 64 groups; larger K falls back to torch.topk
MIN_PARALLEL_SCORES = 1 << 16  # fewer scores per call run on one thread (a parallel region costs ~10 us)

SOURCE = r"""
#include <stdint.h>
#include <math.h>

/* "a ranks above b": NaN above every number (torch.topk's order), then the larger value, then the lower index */
static inline int above(float a, int64_t ia, float b, int64_t ib) {
    if (isnan(a) || isnan(b)) return isnan(a) && (!isnan(b) || ia < ib);
    return a > b || (a == b && ia < ib);
}

/* insert (x, j) into the sorted list v/ix of length k if it ranks above its last entry; -inf never enters */
static inline void consider(float x, int64_t j, int64_t k, float *v, int64_t *ix) {
    if (x == -INFINITY || !above(x, j, v[k - 1], ix[k - 1])) return;
    int64_t p = k - 1;
    while (p > 0 && above(x, j, v[p - 1], ix[p - 1])) { v[p] = v[p - 1]; ix[p] = ix[p - 1]; --p; }
    v[p] = x; ix[p] = j;
}

/* the same for numbers known not to be NaN */
#define BEFORE(a, ia, b, ib) ((a) > (b) || ((a) == (b) && (ia) < (ib)))
static inline void consider_number(float x, int64_t j, int64_t k, float *v, int64_t *ix) {
    if (x == -INFINITY || !BEFORE(x, j, v[k - 1], ix[k - 1])) return;
    int64_t p = k - 1;
    while (p > 0 && BEFORE(x, j, v[p - 1], ix[p - 1])) { v[p] = v[p - 1]; ix[p] = ix[p - 1]; --p; }
    v[p] = x; ix[p] = j;
}

#define G 64

/* Top k of one row s[0..n) into v/ix (sorted). Pass 1 (vectorised) takes the maxima of the G strided groups
   {j : j % G == g}; the k-th largest group maximum th is a lower bound of the k-th largest score, so pass 2
   reads only the groups whose maximum reaches th. */
static void topk_row(const float *s, int64_t n, int64_t k, float *v, int64_t *ix) {
    const int64_t depth = n / G;  /* the first depth * G scores, viewed [depth, G] */
    for (int64_t p = 0; p < k; ++p) { v[p] = -INFINITY; ix[p] = -1; }
    int64_t tail = 0;
    if (depth >= 4 && k <= G / 2) {
        float gm[G];
        int32_t nan[G], any_nan = 0;
        for (int g = 0; g < G; ++g) { gm[g] = s[g]; nan[g] = s[g] != s[g]; }
        for (int64_t d = 1; d < depth; ++d) {
            const float *x = s + d * G;
            for (int g = 0; g < G; ++g) { gm[g] = x[g] > gm[g] ? x[g] : gm[g]; nan[g] |= x[g] != x[g]; }
        }
        for (int g = 0; g < G; ++g) any_nan |= nan[g];
        if (!any_nan) {  /* (a row with NaN takes the plain scan below) */
            /* th0: the smallest of k maxima over disjoint sets of groups (k distinct scores are >= th0) */
            float th0 = INFINITY;
            for (int64_t c = 0; c < k; ++c) {
                float m = -INFINITY;
                for (int64_t g = c * G / k; g < (c + 1) * G / k; ++g) m = gm[g] > m ? gm[g] : m;
                th0 = m < th0 ? m : th0;
            }
            /* th: the k-th largest group maximum, found among the maxima >= th0 */
            float cand[G], tv[G];
            int64_t cg[G], ti[G], nc = 0;
            for (int g = 0; g < G; ++g) { cand[nc] = gm[g]; cg[nc] = g; nc += gm[g] >= th0; }
            for (int64_t p = 0; p < k; ++p) { tv[p] = -INFINITY; ti[p] = -1; }
            for (int64_t c = 0; c < nc; ++c) consider_number(cand[c], cg[c], k, tv, ti);
            const float th = tv[k - 1];
            for (int g = 0; g < G; ++g) {
                if (gm[g] < th || gm[g] == -INFINITY) continue;
                for (int64_t d = 0; d < depth; ++d)
                    if (s[d * G + g] >= th) consider_number(s[d * G + g], d * G + g, k, v, ix);
            }
            tail = depth * G;
        }
    }
    for (int64_t j = tail; j < n; ++j) consider(s[j], j, k, v, ix);
}

/* Top k (sorted) of every row of scores [rows, n] into values/indices [rows, k]; rows in parallel when built
   with OpenMP (torch's own runtime and thread count, once torch has loaded it) and there is enough work. */
void nac_topk_rows(const float *scores, int64_t rows, int64_t n, int64_t k, float *values, int64_t *indices,
                   int64_t min_parallel) {
    #pragma omp parallel for schedule(static) if (rows * n >= min_parallel)
    for (int64_t r = 0; r < rows; ++r) topk_row(scores + r * n, n, k, values + r * k, indices + r * k);
}

/* The pair inputs of the NAC backbone: out[h, f, s*M + i] = keys[h, f, rows[h, s*M + i]], plus
   query[h, f, i] for the first Fq features (one pass instead of torch's gather, then a broadcast add). */
void nac_gather_pairs(const float *keys, const float *query, const int64_t *rows, int64_t H, int64_t F,
                      int64_t Fq, int64_t N, int64_t K, int64_t M, float *out, int64_t min_parallel) {
    const int64_t P = K * M;
    #pragma omp parallel for schedule(static) if (H * F * P >= min_parallel)
    for (int64_t hf = 0; hf < H * F; ++hf) {
        const int64_t h = hf / F, f = hf % F;
        const float *src = keys + hf * N;
        const int64_t *r = rows + h * P;
        float *dst = out + hf * P;
        if (f < Fq) {
            const float *q = query + (h * Fq + f) * M;
            for (int64_t s = 0; s < K; ++s)
                for (int64_t i = 0; i < M; ++i) dst[s * M + i] = src[r[s * M + i]] + q[i];
        } else {
            for (int64_t p = 0; p < P; ++p) dst[p] = src[r[p]];
        }
    }
}
"""

_lock = threading.Lock()
_state: dict = {}  # "lib": the loaded library, or None once building or loading it failed


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "nac-drive"


def _compile_and_load(compiler: str, flags: list[str]) -> ctypes.CDLL:
    """The library for these flags, compiled into the cache unless it is there already (raises on failure)."""
    digest = hashlib.sha256("\0".join([SOURCE, compiler, *flags, sys.platform]).encode()).hexdigest()[:16]
    directory = _cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"nac_topk_{digest}.so"
    if not target.exists():
        with tempfile.TemporaryDirectory(dir=directory) as tmp:
            src, out = Path(tmp) / "nac_topk.c", Path(tmp) / "nac_topk.so"
            src.write_text(SOURCE)
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
    base = ["-O3", "-std=c99", "-shared", "-fPIC"]
    for flags in (base + ["-fopenmp"], base):
        try:
            lib = _compile_and_load(compiler, flags)
        except (OSError, subprocess.SubprocessError):
            continue
        fn = lib.nac_topk_rows
        fn.restype = None
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                       ctypes.c_void_p, ctypes.c_int64]
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


def topk_rows(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``torch.topk(scores, k, dim=-1)`` of a float32 CPU tensor, or None when the kernel does not apply.

    Rows run in parallel on torch's OpenMP threads when there are at least ``MIN_PARALLEL_SCORES`` scores.
    """
    n = scores.shape[-1] if scores.dim() else 0
    if (scores.dtype != torch.float32 or scores.device.type != "cpu" or not 1 <= k <= min(MAX_K, n)
            or scores.requires_grad):
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


def gather_pairs(keys: torch.Tensor, query: torch.Tensor, rows: torch.Tensor) -> torch.Tensor | None:
    """``keys.gather(2, rows)`` with ``query`` added to the first ``query.shape[1]`` features, broadcast over
    the K slots: keys [H, F, N], query [H, Fq, M], rows [H, K, M] (int64, into N) -> [H, F, K*M]; None when
    the kernel does not apply (not float32 CPU tensors, or not built here)."""
    if keys.dtype != torch.float32 or query.dtype != torch.float32 or keys.device.type != "cpu" \
            or query.device.type != "cpu" or rows.dtype != torch.int64:
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
