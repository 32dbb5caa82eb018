"""Runtime and peak memory of the NAC layer against RNN and attention baselines.

The paper's protocol (appendix D.4): batch 1, T=1024 steps, 64 features, 4 heads, 10 timed
passes after a warm-up; here on the CPU, reporting the *median*:

* table 1, at ``--seq-len``: forward ms (under ``torch.no_grad``), forward+backward ms (loss = mean of
  squared outputs), and peak memory of one forward and of one forward+backward, for NAC exact / euler /
  steady (top-K 8), full-pairwise NAC (NAC-PW, topk = T), ``nn.MultiheadAttention`` (self-attention,
  ``need_weights=False``: its fastest path), ``nn.LSTM``, ``nn.GRU``, ``ncps.torch.CfC`` and ``LTC``
  (64 units each, the same input);
* table 2, a sweep over T (default 256, 1024, 4096, 16384) of forward time and peak memory for NAC
  (exact mode, ``selection="auto"``: exact top-K up to T=1024, block selection above) and MHA.

Peak memory, honestly measured: every (model, T) runs in a fresh spawned process that builds the model
and input, resets the kernel's peak-RSS mark (``/proc/self/clear_refs``), reads its resident set size
(VmRSS), runs one pass, and reads the kernel's peak RSS (VmHWM); the table shows the growth, peak minus
before (MB = 2^20 bytes). This counts every page the pass touches (tensors, allocator slack, library
buffers), not only tensors, and misses no short-lived peak (the kernel tracks it, nothing polls).

``--vs-mha`` prints only the head-to-head the speed target is stated in: NAC exact (``selection="auto"``,
top-K 8) against ``nn.MultiheadAttention`` at ``--seq-len``, forward and forward+backward, for each thread
count in ``--vs-mha-threads`` (default 1 and 2), medians over ``--repeats`` passes in which the two models
alternate (so load from other jobs hits both alike), and the ratios NAC / MHA. Other benchmarks can call
``nac_vs_mha(seq_len, threads, ...)`` for the same figures as a dict.

A measurement whose estimated time exceeds ``--budget`` seconds is skipped with a note (estimated from a
pass on a max(64, T/8)-step prefix, scaled by T for RNNs and NAC, T^2 for MHA and NAC-PW); slow models get fewer
repeats so one measurement stays within the budget (a pass over half the budget is reported alone);
the "runs" column says how many passes the median is over.

    python -m benchmarks.nac_runtime                 # full run, a few minutes on 2 cores
    python -m benchmarks.nac_runtime --quick         # fewer repeats, sweep up to 4096
    python -m benchmarks.nac_runtime --models nac-exact,mha --sweep 1024,16384 --no-memory
    python -m benchmarks.nac_runtime --vs-mha        # NAC exact vs MHA, T=1024, 1 and 2 threads (~1 min)
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Callable

import torch
import torch.nn as nn
from tqdm import tqdm

from common.cli import option, run_command

NAC_MODELS = ("nac-exact", "nac-euler", "nac-steady", "nac-pw")
BASELINES = ("mha", "lstm", "gru", "cfc", "ltc")
ALL_MODELS = NAC_MODELS + BASELINES
SWEEP_MODELS = ("nac", "mha")  # "nac" = exact mode, auto selection
PROG = "python -m benchmarks.nac_runtime"
PROBE_STEPS = 64  # shortest prefix used to estimate a pass before running it (T/8 when longer)


@dataclass
class NacRuntimeArgs:
    seq_len: int = option(1024, "sequence length T of table 1", group="model")
    features: int = option(64, "input features = model width (d_model, LSTM/GRU/CfC/LTC units)", group="model")
    heads: int = option(4, "attention heads (NAC, MHA)", group="model")
    batch: int = option(1, "batch size", group="model")
    topk: int = option(8, "NAC top-K (the NAC-PW row always uses topk = T)", group="model")
    repeats: int = option(10, "timed passes per measurement (median reported)", group="runtime")
    warmup: int = option(2, "untimed passes before timing", group="runtime")
    models: str = option(",".join(ALL_MODELS), f"comma list for table 1, from {', '.join(ALL_MODELS)}; empty to "
                         "skip the table", group="model")
    sweep: str = option("256,1024,4096,16384", "comma list of sequence lengths for table 2; empty to skip the sweep",
                        group="model")
    sweep_models: str = option(",".join(SWEEP_MODELS), "comma list for table 2, from "
                               f"{', '.join(SWEEP_MODELS + ALL_MODELS)}", group="model")
    budget: float = option(20.0, "seconds allowed per measurement; longer ones are skipped, slow ones get fewer "
                           "repeats", group="runtime")
    threads: int = option(2, "torch CPU threads", group="runtime")
    clock: str = option("wall", "wall = elapsed time; cpu = the process's CPU time (with --threads 1 it equals "
                        "elapsed time on an idle machine and is far less disturbed by other jobs on a loaded one)",
                        group="runtime", choices=("wall", "cpu"))
    memory: bool = option(True, "measure peak memory in spawned processes (--no-memory to skip)", group="runtime")
    quick: bool = option(False, "3 repeats, 1 warm-up, sweep 256..4096, 10 s budget", group="runtime")
    vs_mha: bool = option(False, "print only NAC exact vs nn.MultiheadAttention at --seq-len (forward, "
                          "forward+backward, ratios), the two measured alternately, for each of --vs-mha-threads",
                          group="runtime")
    vs_mha_threads: str = option("1,2", "comma list of torch thread counts for --vs-mha", group="runtime")
    seed: int = option(0, "seed for inputs and weights", group="runtime")
    out: str = option("", "also write all results as JSON to this path (atomically)", group="output")


def resolve(args: NacRuntimeArgs) -> NacRuntimeArgs:
    """``args`` with --quick's settings applied, checked (ValueError: one line)."""
    if args.quick:
        args.repeats, args.warmup, args.budget = 3, 1, 10.0
        if args.sweep == NacRuntimeArgs.sweep:
            args.sweep = "256,1024,4096"
    validate(args)
    return args


def _names(text: str, allowed: tuple[str, ...], flag: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in allowed]
    if unknown:
        raise ValueError(f"--{flag} got unknown {', '.join(unknown)}; expected names from {', '.join(allowed)}")
    return names


def sweep_lengths(args: NacRuntimeArgs) -> list[int]:
    try:
        lengths = [int(s) for s in args.sweep.split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"--sweep must be a comma list of integers; got {args.sweep!r}") from None
    if any(t < 1 for t in lengths):
        raise ValueError(f"--sweep lengths must be >= 1; got {args.sweep!r}")
    return lengths


def thread_counts(args: NacRuntimeArgs) -> list[int]:
    try:
        counts = [int(s) for s in args.vs_mha_threads.split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"--vs-mha-threads must be a comma list of integers; got {args.vs_mha_threads!r}") from None
    if not counts or any(n < 1 for n in counts):
        raise ValueError(f"--vs-mha-threads needs thread counts >= 1; got {args.vs_mha_threads!r}")
    return counts


def validate(args: NacRuntimeArgs) -> None:
    for name in ("seq_len", "features", "heads", "batch", "topk", "repeats", "threads"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1; got {getattr(args, name)}")
    if args.clock not in ("wall", "cpu"):
        raise ValueError(f"--clock must be wall or cpu; got {args.clock!r}")
    if args.warmup < 0 or args.budget <= 0:
        raise ValueError(f"--warmup must be >= 0 and --budget > 0; got {args.warmup}, {args.budget}")
    if args.features % args.heads:
        raise ValueError(f"--heads must divide --features; got features={args.features}, heads={args.heads}")
    _names(args.models, ALL_MODELS, "models")
    _names(args.sweep_models, SWEEP_MODELS + ALL_MODELS, "sweep-models")
    sweep_lengths(args)
    thread_counts(args)


# ----------------------------------------------------------------------------- models
def build(name: str, T: int, args: NacRuntimeArgs) -> tuple[nn.Module, Callable[[torch.Tensor], torch.Tensor]]:
    """A model and a call mapping x [B, T, F] to a tensor (the sequence output)."""
    from ncps.torch import LTC, CfC

    from policies.nac import NAC

    torch.manual_seed(args.seed)
    F_, H = args.features, args.heads
    if name in ("nac", "nac-exact", "nac-euler", "nac-steady", "nac-pw"):
        mode = "exact" if name in ("nac", "nac-pw") else name.split("-")[1]
        topk = T if name == "nac-pw" else args.topk
        model: nn.Module = NAC(F_, F_, H, mode=mode, topk=topk, seed=args.seed)
        return model, model
    if name == "mha":
        mha = nn.MultiheadAttention(F_, H, batch_first=True)
        return mha, lambda x: mha(x, x, x, need_weights=False)[0]
    if name in ("lstm", "gru"):
        rnn = (nn.LSTM if name == "lstm" else nn.GRU)(F_, F_, batch_first=True)
        return rnn, lambda x: rnn(x)[0]
    ct = CfC(F_, F_) if name == "cfc" else LTC(F_, F_)
    return ct, lambda x: ct(x)[0]


def _input(T: int, args: NacRuntimeArgs) -> torch.Tensor:
    return torch.randn(args.batch, T, args.features, generator=torch.Generator().manual_seed(args.seed))


def _step(call: Callable, x: torch.Tensor, model: nn.Module, backward: bool) -> None:
    if backward:
        call(x).pow(2).mean().backward()
        model.zero_grad(set_to_none=True)
    else:
        with torch.no_grad():
            call(x)


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
QUADRATIC = ("mha", "nac-pw")  # cost grows with T^2: estimated accordingly


def _seconds(fn: Callable[[], None], clock: str = "wall") -> float:
    now = CLOCKS[clock]
    start = now()
    fn()
    return now() - start


def timed(name: str, T: int, args: NacRuntimeArgs, backward: bool) -> dict:
    """Median ms over up to ``args.repeats`` passes, or a skip note when over budget."""
    model, call = build(name, T, args)
    probe_T = min(T, max(PROBE_STEPS, T // 8))  # long enough that fixed per-call costs do not dominate
    probe = _seconds(lambda: _step(call, _input(probe_T, args), model, backward))
    estimate = probe * (T / probe_T) ** (2 if name in QUADRATIC else 1)
    if estimate > args.budget:
        return {"skipped": f"estimated {estimate:.0f} s per pass > --budget {args.budget:g} s"}
    x = _input(T, args)
    params = sum(p.numel() for p in model.parameters())
    first = _seconds(lambda: _step(call, x, model, backward), args.clock)
    if first > args.budget / 2:  # too slow to repeat within the budget: report the one pass made
        return {"ms": 1e3 * first, "runs": 1, "params": params}
    runs = max(1, min(args.repeats, int(args.budget / first) - args.warmup))
    for _ in range(args.warmup if runs > 1 else 0):
        _step(call, x, model, backward)
    times = [_seconds(lambda: _step(call, x, model, backward), args.clock) for _ in range(runs)]
    return {"ms": 1e3 * statistics.median(times), "runs": runs, "params": params}


def nac_vs_mha(seq_len: int = 1024, threads: int = 1, *, batch: int = 1, features: int = 64, heads: int = 4,
               topk: int = 8, repeats: int = 15, warmup: int = 2, clock: str = "wall", seed: int = 0) -> dict:
    """NAC exact vs ``nn.MultiheadAttention`` on the same input, measured alternately in one process.

    Each repeat times, in turn, a NAC forward (``torch.no_grad``), an MHA forward, a NAC forward+backward
    and an MHA forward+backward (loss = mean of squared outputs), so the two models share whatever load
    other jobs put on the machine. Runs with ``threads`` torch threads (restored afterwards). Returns
    ``{"seq_len", "threads", "repeats", "clock", "native_topk", "nac": {"fwd", "fwd_bwd"}, "mha": {...},
    "ratio": {"fwd", "fwd_bwd"}}``: medians in ms, ratios NAC / MHA of the medians. ``native_topk`` says
    whether the selection ran on the native kernel (``policies.nac_native``) or on ``torch.topk``.
    """
    from policies import nac_native

    args = NacRuntimeArgs(seq_len=seq_len, features=features, heads=heads, batch=batch, topk=topk, seed=seed)
    validate(args)
    if clock not in CLOCKS:
        raise ValueError(f"clock must be wall or cpu; got {clock!r}")
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        models = {name: build(name, seq_len, args) for name in ("nac", "mha")}
        x = _input(seq_len, args)
        steps = [(name, backward) for backward in (False, True) for name in models]
        times: dict = {step: [] for step in steps}
        for i in range(warmup + repeats):
            for name, backward in steps:
                model, call = models[name]
                ms = 1e3 * _seconds(lambda: _step(call, x, model, backward), clock)
                if i >= warmup:
                    times[(name, backward)].append(ms)
    finally:
        torch.set_num_threads(before)
    medians = {name: {"fwd": statistics.median(times[(name, False)]),
                      "fwd_bwd": statistics.median(times[(name, True)])} for name in models}
    return {"seq_len": seq_len, "threads": threads, "repeats": repeats, "clock": clock,
            "native_topk": nac_native.available(), **medians,
            "ratio": {k: medians["nac"][k] / medians["mha"][k] for k in ("fwd", "fwd_bwd")}}


def render_vs_mha(rows: list[dict], args: NacRuntimeArgs) -> str:
    first = rows[0]
    lines = [f"### NAC exact (top-K {args.topk}) vs nn.MultiheadAttention: B={args.batch}, T={args.seq_len}, "
             f"{args.features} features, {args.heads} heads, {first['clock']} clock, medians of {first['repeats']} "
             f"alternating passes, torch {torch.__version__}", "",
             "| threads | NAC fwd ms | MHA fwd ms | fwd NAC/MHA | NAC fwd+bwd ms | MHA fwd+bwd ms | fwd+bwd NAC/MHA |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['threads']} | {r['nac']['fwd']:.1f} | {r['mha']['fwd']:.1f} | {r['ratio']['fwd']:.2f}x "
                     f"| {r['nac']['fwd_bwd']:.1f} | {r['mha']['fwd_bwd']:.1f} | {r['ratio']['fwd_bwd']:.2f}x |")
    lines += ["", "Top-K selection: " + ("native kernel (policies/nac_native.py)." if first["native_topk"] else
                                         "torch.topk (the native kernel could not be built here).")]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- memory (spawned process)
def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024  # the kernel reports kB
    raise OSError(f"{field} missing from /proc/self/status")


def _memory_child(name: str, T: int, args: NacRuntimeArgs, backward: bool, queue) -> None:
    try:
        torch.set_num_threads(args.threads)
        model, call = build(name, T, args)
        x = _input(T, args)
        try:  # reset the kernel's peak-RSS mark (VmHWM) to the current RSS (Linux >= 4.0)
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            note = ""
        except OSError:
            note = "VmHWM could not be reset: includes start-up peak"
        before = _status_bytes("VmRSS")
        _step(call, x, model, backward)
        queue.put({"mb": (_status_bytes("VmHWM") - before) / 2**20, "note": note})
    except Exception as err:  # reported as a note in the table, never a hang
        queue.put({"skipped": f"{type(err).__name__}: {err}"})


def peak_memory(name: str, T: int, args: NacRuntimeArgs, backward: bool, timeout: float) -> dict:
    if not os.path.exists("/proc/self/status"):
        return {"skipped": "needs Linux /proc for RSS"}
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_memory_child, args=(name, T, args, backward, queue))
    proc.start()
    try:
        result = queue.get(timeout=timeout)
    except Exception:
        result = {"skipped": f"no result within {timeout:.0f} s"}
    proc.join(5)
    if proc.is_alive():
        proc.kill()
    return result


# ----------------------------------------------------------------------------- tables
def _fmt(cell: dict, key: str, digits: int = 1) -> str:
    return f"{cell[key]:.{digits}f}" if key in cell else "skipped"


def run(args: NacRuntimeArgs) -> dict:
    torch.set_num_threads(args.threads)
    models = _names(args.models, ALL_MODELS, "models")
    sweep_models = _names(args.sweep_models, SWEEP_MODELS + ALL_MODELS, "sweep-models")
    lengths = sweep_lengths(args)
    jobs = [("table", m, args.seq_len) for m in models] + [("sweep", m, T) for T in lengths for m in sweep_models]
    results: dict = {"args": asdict(args), "table": {}, "sweep": {}, "torch": torch.__version__,
                     "threads": torch.get_num_threads()}
    for kind, name, T in tqdm(jobs, desc="measuring", file=sys.stderr):
        cell: dict = {"fwd": timed(name, T, args, backward=False)}
        if kind == "table":
            cell["fwd_bwd"] = timed(name, T, args, backward=True)
        if args.memory:
            budget = 3 * args.budget + 60
            fwd_ok = "skipped" not in cell["fwd"]
            cell["mem_fwd"] = peak_memory(name, T, args, False, budget) if fwd_ok else {"skipped": "time skipped"}
            if kind == "table":
                ok = "skipped" not in cell["fwd_bwd"]
                cell["mem_fwd_bwd"] = (peak_memory(name, T, args, True, budget) if ok
                                       else {"skipped": "time skipped"})
        results[kind][f"{name}@{T}"] = cell
    return results


def render(results: dict, args: NacRuntimeArgs) -> str:
    lines: list[str] = []
    notes: list[str] = []

    def note(label: str, cell: dict) -> None:
        if "skipped" in cell:
            notes.append(f"- {label}: skipped, {cell['skipped']}")

    table = results["table"]
    if table:
        ref_f = table.get(f"mha@{args.seq_len}", {}).get("fwd", {}).get("ms")
        ref_b = table.get(f"cfc@{args.seq_len}", {}).get("fwd_bwd", {}).get("ms")
        lines += [f"### B={args.batch}, T={args.seq_len}, {args.features} features, {args.heads} heads, "
                  f"top-K {args.topk}, {results['threads']} thread(s), {args.clock} clock, "
                  f"torch {results['torch']}", "",
                  "| model | params | forward ms | fwd / MHA | forward+backward ms | fwd+bwd / CfC "
                  "| peak MB fwd | peak MB fwd+bwd | runs |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for key, cell in table.items():
            name = key.split("@")[0]
            f, b = cell["fwd"], cell["fwd_bwd"]
            ratio_f = f"{f['ms'] / ref_f:.2f}x" if ref_f and "ms" in f else "-"
            ratio_b = f"{b['ms'] / ref_b:.2f}x" if ref_b and "ms" in b else "-"
            mf, mb = cell.get("mem_fwd", {}), cell.get("mem_fwd_bwd", {})
            params = f.get("params", b.get("params", "-"))
            lines.append(f"| {name} | {params} | {_fmt(f, 'ms')} | {ratio_f} | {_fmt(b, 'ms')} | {ratio_b} "
                         f"| {_fmt(mf, 'mb') if mf else '-'} | {_fmt(mb, 'mb') if mb else '-'} "
                         f"| {f.get('runs', '-')}/{b.get('runs', '-')} |")
            for label, c in (("forward", f), ("forward+backward", b), ("memory fwd", mf), ("memory fwd+bwd", mb)):
                note(f"{name} {label}", c)
        lines.append("")
    sweep = results["sweep"]
    if sweep:
        lines += ["### Sequence-length sweep (forward only)", "",
                  "| model | T | selection | forward ms | peak MB fwd | runs |", "|---|---:|---|---:|---:|---:|"]
        from policies.nac import AUTO_BLOCK_THRESHOLD

        for key, cell in sweep.items():
            name, T = key.split("@")
            sel = ("-" if not name.startswith("nac") else "pairwise" if name == "nac-pw" or args.topk >= int(T)
                   else "blocks" if int(T) > AUTO_BLOCK_THRESHOLD else "exact")
            f, m = cell["fwd"], cell.get("mem_fwd", {})
            lines.append(f"| {name} | {T} | {sel} | {_fmt(f, 'ms')} | {_fmt(m, 'mb') if m else '-'} "
                         f"| {f.get('runs', '-')} |")
            note(f"{name} T={T} forward", f)
            if m:
                note(f"{name} T={T} memory", m)
        lines.append("")
    if notes:
        lines += ["Notes:"] + notes + [""]
    lines.append("Peak MB: growth of the process's peak RSS during one pass, in a fresh process (see --help).")
    return "\n".join(lines)


def write_json(path: str, results: dict) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(results, f, indent=2)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    return run_command(NacRuntimeArgs, _benchmark, argv, prog=PROG, doc=__doc__, mistakes=(ValueError, OSError))


def _benchmark(args: NacRuntimeArgs) -> int:
    args = resolve(args)
    if args.vs_mha:
        rows = [nac_vs_mha(args.seq_len, n, batch=args.batch, features=args.features, heads=args.heads,
                           topk=args.topk, repeats=args.repeats, warmup=args.warmup, clock=args.clock, seed=args.seed)
                for n in tqdm(thread_counts(args), desc="threads", file=sys.stderr)]
        print(render_vs_mha(rows, args))
        if args.out:
            write_json(args.out, {"args": asdict(args), "vs_mha": rows})
        return 0
    results = run(args)
    print(render(results, args))
    if args.out:
        write_json(args.out, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
