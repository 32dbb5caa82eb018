"""Episodes in worker processes: what `collect.py --workers N` and `evaluate.py --workers N` run on.

Why processes: an episode is one env stepping in Python (Box2D physics, a pygame or OpenCV render) plus a small
network per step; it uses one core whatever torch is told, so N independent episodes on N cores run about N
times as fast. Each episode depends only on its track seed (the env, the DART noise and the DAgger coin are
seeded from it), so the episode a worker records is the one a serial run records, whichever worker runs it
and in whatever order they finish; callers put the results back in seed order.

How: `EpisodePool(n, setup, setup_args, work)` starts n processes. Each builds its state once
(``setup(*setup_args)``: its own env, expert, policy) and then runs ``work(state, task, on_step)`` for every
task it takes from a shared queue, in completion order. Processes come from a fork server (``forkserver``:
started once, clean of the caller's threads and CUDA state, with the heavy imports preloaded, so each worker
starts in about a second); where that does not exist, ``spawn``. Every worker runs ``threads`` torch threads
(1 by default: N workers on N cores) and works in the caller's current folder.

Stopping: Ctrl-C or SIGTERM in the caller (a KeyboardInterrupt there) sends SIGINT to the workers; their
unfinished episode is dropped the same way a serial run drops it (no half file, no half video), every
finished one is kept. A worker whose caller was killed (SIGKILL) notices within ``CHECK_EVERY`` steps and
quits the same way. A failing worker stops the run with its traceback (a bad argument or a full disk: its one line).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import queue
import signal
import time
import traceback
from typing import Any, Callable, Iterable, Iterator, Sequence

from common.checks import is_int
from common.files import disk_full
from common.stops import stop_handler

MAX_WORKERS = 8  # the default's cap: past this, the machine's memory and disk, not cores, set the pace
CHECK_EVERY = 25  # steps between a worker's progress reports (and its check that the caller still lives)
STOP_TIMEOUT_S = 20.0  # how long stopped workers get to clean up before they are killed


class WorkerFailed(RuntimeError):
    """A worker process raised or died; the message holds its traceback."""


class _CallerGone(BaseException):
    """Raised inside a worker whose caller died: unwinds like Ctrl-C (temp files removed) and exits quietly."""


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask, not the machine's total)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def default_workers(tasks: int, threads: int = 1, cap: int = MAX_WORKERS) -> int:
    """The --workers default: one per usable core (each running `threads` torch threads), at most `cap`, and
    never more than there are tasks (episodes)."""
    return max(1, min(usable_cores() // max(1, threads), int(tasks), cap))


def check_workers(workers: Any, flag: str = "--workers") -> int:
    if not is_int(workers, 1):
        raise ValueError(f"{flag} must be an integer >= 1 (processes running episodes), got {workers!r}")
    return workers


def _context(preload: Sequence[str]) -> Any:
    if "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["numpy", "torch", *preload])  # only the first pool of a process starts the server
        return ctx
    return mp.get_context("spawn")


def warm_up(preload: Sequence[str] = ()) -> None:
    """Start the fork server now (it imports `preload` in the background), so that its few seconds of imports
    overlap with the caller's own set-up instead of delaying the first episode."""
    if _context(preload).get_start_method() == "forkserver":
        from multiprocessing import forkserver

        forkserver.ensure_running()


def _stop_once(signum, frame) -> None:  # noqa: ARG001
    """A worker's SIGINT handler: the first signal stops it (flagged for raise_if_stopped, like the caller's),
    later ones are ignored. A terminal's Ctrl-C reaches the worker and its caller, and the caller then signals
    the worker again: that second SIGINT must not interrupt the worker's own clean-up."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stop_handler(signum, frame)


def _worker_main(setup: Callable, setup_args: tuple, work: Callable, threads: int, cwd: str,
                 tasks: Any, results: Any) -> None:
    signal.signal(signal.SIGINT, _stop_once)  # the caller stops us with SIGINT
    os.chdir(cwd)  # relative paths mean what they mean to the caller (the fork server may sit elsewhere)
    import torch

    torch.set_num_threads(threads)
    try:
        import cv2

        cv2.setNumThreads(threads)
    except ImportError:
        pass
    caller = mp.parent_process()
    key = None
    try:
        state = setup(*setup_args)
        while True:
            try:
                item = tasks.get(timeout=1.0)
            except queue.Empty:
                if caller is not None and not caller.is_alive():
                    raise _CallerGone from None
                continue
            if item is None:
                signal.signal(signal.SIGINT, signal.SIG_IGN)  # done: a late stop signal is no error
                return
            if caller is not None and not caller.is_alive():
                raise _CallerGone
            key, task = item
            pending = 0

            def on_step() -> None:
                nonlocal pending
                pending += 1
                if pending == CHECK_EVERY:
                    results.put(("steps", key, pending))
                    pending = 0
                    if caller is not None and not caller.is_alive():
                        raise _CallerGone

            result = work(state, task, on_step)
            results.put(("done", key, (pending, result)))
            key = None
    except (KeyboardInterrupt, _CallerGone):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        results.put(("stopped", key, None))
    except BaseException as e:  # noqa: BLE001 - everything goes back to the caller
        tb = traceback.format_exc()
        try:
            pickle.dumps(e)
            err: Any = e
        except Exception:  # noqa: BLE001 - an exception that does not pickle travels as text
            err = None
        results.put(("error", key, (err, tb)))


class EpisodePool:
    """`workers` processes running `work(state, task, on_step)` on tasks; see the module docstring.

    Use as a context manager; `run(tasks)` yields ``(key, result)`` as episodes finish. Leaving the block
    (normally, on an exception or on Ctrl-C) stops and reaps every worker."""

    def __init__(self, workers: int, setup: Callable, setup_args: tuple, work: Callable, *, threads: int = 1,
                 preload: Sequence[str] = ()) -> None:
        self.workers = check_workers(workers)
        ctx = _context(preload)
        self.tasks = ctx.Queue()
        self.results = ctx.Queue()
        self.procs = [ctx.Process(target=_worker_main, daemon=True, name=f"episode-worker-{i}",
                                  args=(setup, setup_args, work, threads, os.getcwd(), self.tasks, self.results))
                      for i in range(self.workers)]
        self._complete = False

    def __enter__(self) -> "EpisodePool":
        try:
            for p in self.procs:
                p.start()
        except BaseException:  # e.g. Ctrl-C while starting: stop the ones already running
            self.stop()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def run(self, tasks: Iterable[tuple[Any, Any]], on_steps: Callable[[int], None] | None = None
            ) -> Iterator[tuple[Any, Any]]:
        """Yield (key, result) for every (key, task) in completion order. Tasks are handed out in the given
        order, a few at a time (the queue stays short, so stopping leaves no backlog)."""
        todo = iter(tasks)
        outstanding = 0
        exhausted = False

        def feed(n: int) -> None:
            nonlocal outstanding, exhausted
            for _ in range(n):
                item = next(todo, None)
                if item is None:
                    exhausted = True
                    for _ in self.procs:
                        self.tasks.put(None)
                    return
                self.tasks.put(item)
                outstanding += 1

        feed(2 * self.workers)
        while outstanding or not exhausted:
            try:
                kind, key, payload = self.results.get(timeout=0.5)
            except queue.Empty:
                self._check_alive()
                continue
            if kind == "steps":
                if on_steps is not None:
                    on_steps(payload)
            elif kind == "done":
                rest, result = payload
                if on_steps is not None and rest:
                    on_steps(rest)
                outstanding -= 1
                if not exhausted:
                    feed(1)
                yield key, result
            elif kind == "stopped":  # a worker got SIGINT on its own (e.g. Ctrl-C reached it first)
                raise KeyboardInterrupt
            else:
                err, tb = payload
                message = f"an episode worker failed on {key!r}:\n{tb}"
                if isinstance(err, (ValueError, FileNotFoundError)) or disk_full(err):  # one-line errors stay one line
                    raise err from WorkerFailed(message)
                raise WorkerFailed(message)
        self._complete = True

    def _check_alive(self) -> None:
        for p in self.procs:
            if p.exitcode not in (None, 0):
                why = " (killed: out of memory?)" if p.exitcode == -signal.SIGKILL else ""
                raise WorkerFailed(f"episode worker {p.name} (pid {p.pid}) died with exit code {p.exitcode}{why}; "
                                   "its error, if any, is printed above")
        if all(p.exitcode == 0 for p in self.procs):
            raise WorkerFailed("every episode worker quit with episodes still to run")

    def stop(self) -> None:
        """SIGINT to every live worker, wait for them to clean up, kill what is left."""
        if self._complete:  # every task done: the workers are quitting on their own, give them a moment
            for p in self.procs:
                if p.pid is not None:
                    p.join(2.0)
        for p in self.procs:
            if p.pid is not None and p.exitcode is None:
                try:
                    os.kill(p.pid, signal.SIGINT)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while any(p.pid is not None and p.exitcode is None for p in self.procs) and time.monotonic() < deadline:
            try:  # keep the results pipe drained, or a worker blocks flushing its last message
                while True:
                    self.results.get_nowait()
            except (queue.Empty, OSError, EOFError):
                pass
            for p in self.procs:
                if p.pid is not None:
                    p.join(0.05)
        for p in self.procs:
            if p.pid is not None and p.exitcode is None:
                p.kill()
                p.join()
        for q in (self.tasks, self.results):
            q.cancel_join_thread()
            q.close()
