"""Evaluation episodes in several processes (agent.workers.EpisodePool): each worker builds its own env, expert and
controllers once; every (policy, seed) episode is a task. An episode depends only on its seed, so the rows and
videos are those of one process; only the timings differ (latency is measured in whichever process drove)."""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from tqdm import tqdm

from agent.controllers import ExpertController, PolicyController, load_policy
from agent.evaluation.config import EvalPlan, Outputs
from agent.evaluation.drivers import Driver, env_action_names
from agent.evaluation.episode import run_episode
from agent.evaluation.report import summary_line, write_policy
from common.stops import Interrupted
from agent.runtime import show_progress
from agent.workers import EpisodePool
from common.stops import stop_handled
from envs.registry import get_spec


@dataclass(frozen=True)
class WorkerSetup:
    """What every worker process builds its env, expert and controllers from (agent.workers.EpisodePool):
    ``drivers`` as (name, checkpoint), None for the expert."""

    env: str
    action_space: str
    expert_path: str | None
    device: str
    max_steps: int
    renderer: str
    drivers: list[tuple[str, str | None]]
    window_clock: str
    make_kwargs: dict[str, Any]
    discrete_actions: str | None
    action_temperature: float | None
    spared: tuple[int, ...]
    told_latency_s: float

    @classmethod
    def of(cls, plan: EvalPlan, action_space: str, drivers: list[Driver]) -> "WorkerSetup":
        d, t, c = plan.drivers, plan.track, plan.conditions
        return cls(t.env, action_space, d.expert, plan.runtime.device, t.max_steps, t.renderer,
                   [(x.name, None if x.controller.is_expert else x.meta["source"]) for x in drivers],
                   c.window_clock, t.make_kwargs, d.discrete_actions, d.action_temperature, d.spared,
                   c.told_latency_s)


@dataclass
class WorkerState:
    """A worker's own env, expert and controllers, built once by _worker_setup."""

    sim: Any
    expert: Any
    action_space: str
    controllers: list[Any]


@dataclass(frozen=True)
class EpisodeTask:
    """One episode for a worker: which driver, on which track seed, with which outputs (video, saliency)."""

    driver: int
    seed: int
    outputs: dict[str, Any]


def episode_outputs(plan: EvalPlan, is_expert: bool, out_dir: Path, i: int, seed: int) -> dict[str, Any]:
    """run_episode's video_path, saliency and timing for episode i (seed) of a policy."""
    o: Outputs = plan.outputs
    return {"video_path": out_dir / "videos" / f"seed_{seed}.mp4" if i < o.video_episodes else None,
            "saliency": None if is_expert else o.saliency, "timing": plan.conditions.timing}


def _worker_setup(s: WorkerSetup) -> WorkerState:
    """In a worker process: its own env, expert and controllers."""
    from agent.experts.expert import Expert

    expert = Expert.load(s.expert_path, s.action_space, s.env)
    filled = env_action_names(s.env, s.make_kwargs.get("pi_speed", False))
    controllers = [ExpertController(expert) if path is None else
                   PolicyController(load_policy(path, s.env, s.action_space, s.device), name, s.device,
                                    s.window_clock, filled, s.discrete_actions, s.action_temperature, s.spared,
                                    s.told_latency_s)
                   for name, path in s.drivers]
    sim = expert.spec.make(s.action_space, render=True, max_episode_steps=s.max_steps, renderer=s.renderer,
                           **s.make_kwargs)
    return WorkerState(sim, expert, s.action_space, controllers)


def _worker_episode(state: WorkerState, task: EpisodeTask,
                    on_step: Callable[[], None]) -> tuple[dict[str, Any], list[float]]:
    return run_episode(state.controllers[task.driver], state.sim, state.expert, task.seed, state.action_space,
                       on_step=on_step, **task.outputs)


def evaluate_parallel(drivers: list[Driver], plan: EvalPlan, action_space: str, out_dirs: list[Path],
                      results: dict[str, dict[str, Any]]) -> None:
    """Every (policy, seed) episode in the plan's worker processes. Each policy's files are written, in seed order,
    once its last episode is in. Ctrl-C: every policy with finished episodes gets its files, marked interrupted."""
    seeds, progress = plan.track.seeds, plan.outputs.progress
    n = len(seeds)
    rows: list[dict[int, tuple[dict[str, Any], list[float]]]] = [{} for _ in drivers]
    tasks = [((t, i), EpisodeTask(t, seed, episode_outputs(plan, d.controller.is_expert, out_dirs[t], i, seed)))
             for t, d in enumerate(drivers) for i, seed in enumerate(seeds)]
    bars = show_progress(progress)
    bar = tqdm(total=len(tasks) * plan.track.max_steps, unit="step", desc=f"{len(drivers)} x {n} episodes",
               disable=not bars, file=sys.stderr)
    written = 0

    def write(t: int, interrupted: bool = False) -> dict[str, Any]:
        done = [rows[t][i] for i in sorted(rows[t])]
        return write_policy([r for r, _ in done], [x for _, lat in done for x in lat], plan, out_dirs[t],
                            drivers[t].meta, interrupted)

    try:
        with EpisodePool(min(plan.runtime.workers, len(tasks)), _worker_setup,
                         (WorkerSetup.of(plan, action_space, drivers),), _worker_episode,
                         threads=plan.runtime.threads, preload=preload(plan.track.env)) as pool:
            for (t, i), (row, lat) in pool.run(tasks, on_steps=bar.update):
                rows[t][i] = (row, lat)
                if progress and not bars:
                    print(f"{drivers[t].name}: episode {i + 1}/{n} (seed {seeds[i]}) return {row['return']:.0f}, "
                          f"completion {row['completion']:.2f}", file=sys.stderr, flush=True)
                while written < len(drivers) and len(rows[written]) == n:
                    name = drivers[written].name
                    results[name] = write(written)
                    tqdm.write(summary_line(name, results[name]))
                    written += 1
    except KeyboardInterrupt:
        stop_handled()
        partial = [t for t in range(written, len(drivers)) if rows[t]]
        for t in partial:
            try:
                write(t, interrupted=True)
            except Interrupted:
                pass
        kept = sum(len(rows[t]) for t in partial)
        raise Interrupted(f"interrupted: wrote {kept} finished episode(s) of "
                          f"{', '.join(drivers[t].name for t in partial) or 'no policy'} "
                          f"to {out_dirs[partial[0]] if len(partial) == 1 else out_dirs[0].parent}") from None
    finally:
        bar.close()


def preload(env: str) -> list[str]:
    """What a worker imports: done once in the fork server, not in every worker."""
    return [__name__, "agent.experts.expert", "stable_baselines3", "policies.checkpoint", get_spec(env).make.__module__]
