"""A collect.py run: record a privileged PPO expert driving a rendered env (CarRacing, udacity) as a
behaviour-cloning dataset, episode after episode, into one folder.

Everything env-specific (how to make it, action names, step time, what to record besides the frame, DART
defaults, seed ranges) comes from the env's `envs.spec.EnvSpec`; this module holds no env names. What one
episode records and why is in agent/data/recorder.py; the arguments and their checks in agent/data/config.py;
what may be appended to an existing folder in agent/data/out_folder.py; the card in agent/data/card.py.

Speed: ``workers`` > 1 records episodes in that many processes (agent.workers), each with its own env, expert
and student. An episode depends only on its track seed, so the files are byte for byte those of one process;
each worker writes its episode files, this process writes the card (episodes in id order). ``workers`` = 1 is
the plain loop in this process. ``shard`` = (I, N) records only the I-th of N contiguous parts of the run's
seeds (``shard_range``) into ``OUT-shard-I-of-N``, e.g. one part per machine, to be merged afterwards.

Robustness: each episode file and the card are written atomically (common.files); Ctrl-C or SIGTERM stops
after discarding the unfinished episode(s); a SIGKILL can leave only a hidden ``.tmp`` that is never read and
is removed by the next run (worker processes notice their collector died and quit). Re-running with the same
``out`` appends (episode ids and track seeds continue) if env, action space and expert (by SHA-256) match
the dataset, and refuses otherwise; it first fills any hole among the ids (an episode an interrupted
parallel run had not finished, or a damaged file someone deleted), so a resumed run ends up with the
episodes of an uninterrupted one. A shard's re-run completes the shard. A lock file stops two collectors
writing into one folder.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from agent.controllers import load_driver
from agent.data.card import build_card, expert_summary
from agent.data.config import CollectConfig, CollectError, CollectPlan, Drives, Recorded, Tracks, resolve, shard_range
from agent.data.out_folder import Existing, check_compatible, inspect_out
from agent.data.recorder import (
    OFF_ROAD_SECONDS,
    STUCK_SECONDS,
    STUCK_SPEED,
    DartNoise,
    record_episode,
    recovery_start,
)
from agent.runtime import show_progress
from agent.workers import default_workers, warm_up
from common.files import file_sha256, folder_lock, write_json
from common.stops import sigterm_as_interrupt
from driving_data.dataset import CARD_NAME, temp_files, write_episode
from envs.registry import EnvSpec, get_spec


@dataclass
class CollectResult:
    out: Path
    episodes_added: int
    steps_added: int
    episodes_total: int
    steps_total: int
    mean_return_added: float | None
    laps_added: int
    steps_per_s: float
    interrupted: bool
    first_seed: int | None
    last_seed: int | None
    workers: int = 1

    def summary(self) -> str:
        what = "interrupted: " if self.interrupted else ""
        dropped = ("; the unfinished episode was dropped" if self.workers == 1 else
                   "; unfinished episodes were dropped (a re-run collects them first)") if self.interrupted else ""
        seeds = f", track seeds {self.first_seed}..{self.last_seed}" if self.episodes_added else ""
        ret = (f", mean return {self.mean_return_added:.1f}, laps {self.laps_added}/{self.episodes_added}"
               if self.episodes_added else "")
        return (
            f"{what}saved {self.episodes_added} new episode(s) ({self.steps_added} steps{seeds}{ret}) at "
            f"{self.steps_per_s:.0f} steps/s{f' ({self.workers} workers)' if self.workers > 1 else ''}; "
            f"{self.out} now holds {self.episodes_total} episodes, {self.steps_total} steps{dropped}"
        )


@dataclass(frozen=True)
class EpisodeSettings:
    """What every episode of one run is recorded with. Plain values only: worker processes receive it as is."""

    env: str
    action_space: str
    expert: str | None  # as given (None: the env's shipped one)
    driver: str | None  # DAgger: the student's checkpoint
    # how a discrete student picks its action (DISCRETE_ACTION_RULES; None: its checkpoint's)
    driver_actions: str | None
    driver_temperature: float | None  # its softmax temperature (sample / dither; None: its checkpoint's)
    max_steps: int
    renderer: str
    noise: float
    noise_hold: int
    early_stop: bool
    cut_wrong_way: bool  # end the episode after 1 s pointing against the course (agent.data.recorder.EarlyStop)
    beta: float
    out: str
    meta: dict = field(default_factory=dict)  # added to every episode's meta (expert and driver identity)
    recovery_labels: bool = False  # the spec's recovery teacher labels the states it needs
    recovery_starts: float = 0.0  # probability of a recovery start (drawn from the track seed)
    scene: dict = field(default_factory=dict)  # make()'s themes / conditions (envs with scenes; EnvSpec.scene)
    latency_steps: int = 0  # every executed action reaches the env this many steps after it was chosen

    def make_env(self) -> Any:
        spec = get_spec(self.env)
        side_cameras = any(name.startswith("frames_") for name in spec.recorded_info)
        return spec.make(self.action_space, render=True, max_episode_steps=self.max_steps, side_cameras=side_cameras,
                         renderer=self.renderer, **self.scene)


def record_and_write(s: EpisodeSettings, env: Any, expert: Any, driver: Any, episode_id: int, track_seed: int,
                     on_step: Callable[[], None] | None) -> dict:
    """Record episode `episode_id` on track `track_seed` and write its file atomically; returns its meta."""
    spec = get_spec(s.env)
    noise = DartNoise(s.action_space, s.noise, s.noise_hold, track_seed, len(spec.action_names[s.action_space]))
    recovery = spec.recovery_teacher() if s.recovery_labels else None
    start = recovery_start(spec, track_seed, s.recovery_starts)
    arrays, meta = record_episode(env, expert, track_seed, noise, on_step=on_step, early_stop=s.early_stop,
                                  cut_wrong_way=s.cut_wrong_way, driver=driver, beta=s.beta, recovery=recovery,
                                  start=start, latency_steps=s.latency_steps)
    meta.update(max_steps=s.max_steps, expert_sha256=s.meta.get("expert_sha256"),
                collected_at=time.strftime("%Y-%m-%dT%H:%M:%S"), renderer=s.renderer)
    meta.update({k: v for k, v in s.meta.items() if k != "expert_sha256"})
    write_episode(Path(s.out), episode_id, arrays, meta,
                        **({"jpeg_quality": spec.jpeg_quality} if spec.jpeg_quality else {}))
    return {**meta, "episode_id": episode_id, "length": len(arrays["action"])}


def _collect_serial(s: EpisodeSettings, spec: EnvSpec, expert: Any, driver: Any, tasks: list[tuple[int, int]],
                    on_steps: Callable[..., None], saved: Callable[[dict], None]) -> None:
    """One process: the episodes one after the other in this process (--workers 1)."""
    env = s.make_env()
    threads = None
    if driver is not None:  # one frame per step: 1 thread is fastest and leaves the other core to the env
        import torch

        threads = torch.get_num_threads()
        torch.set_num_threads(1)
    try:
        for episode_id, track_seed in tasks:
            saved(record_and_write(s, env, expert, driver, episode_id, track_seed, on_steps))
    finally:
        env.close()
        if threads is not None:
            torch.set_num_threads(threads)


def _worker_setup(s: EpisodeSettings) -> tuple:
    """In a worker process: its own env, expert and DAgger student."""
    from agent.experts.expert import Expert

    expert = Expert.load(s.expert, s.action_space, s.env)
    driver = load_driver(s.driver, s.env, s.action_space, s.driver_actions, s.driver_temperature,
                         s.latency_steps * get_spec(s.env).dt) if s.driver is not None else None
    return s, s.make_env(), expert, driver


def _worker_episode(state: tuple, task: tuple[int, int], on_step: Callable[[], None]) -> dict:
    s, env, expert, driver = state
    return record_and_write(s, env, expert, driver, *task, on_step)


def _preload(spec: EnvSpec) -> list[str]:
    """What a worker imports: done once in the fork server, not in every worker."""
    return [__name__, "agent.experts.expert", "stable_baselines3", "agent.controllers", spec.make.__module__]


def _collect_parallel(s: EpisodeSettings, spec: EnvSpec, workers: int, tasks: list[tuple[int, int]],
                      on_steps: Callable[..., None], saved: Callable[[dict], None]) -> None:
    """`workers` processes, each recording whole episodes and writing their files; the card is written here.
    Episode files depend only on their seed, so the dataset is the serial run's (see agent.workers)."""
    from agent.workers import EpisodePool

    with EpisodePool(workers, _worker_setup, (s,), _worker_episode, threads=1, preload=_preload(spec)) as pool:
        for _, meta in pool.run([(task, task) for task in tasks], on_steps=on_steps):
            saved(meta)


def collect(
    cfg: CollectConfig,
    *,
    command: str | None = None,
    log: Callable[[str], None] = print,
    after_episode: Callable[[int], None] | None = None,
) -> CollectResult:
    """Collect `cfg.episodes` new episodes into `cfg.out_dir` (with `cfg.shard`: this shard's missing
    episodes). Ctrl-C/SIGTERM end it cleanly (result.interrupted); `after_episode(episode_id)` is a hook for
    tests and callers, called as each episode is saved."""
    p = resolve(cfg)
    where, out = p.where, p.out
    spec = where.spec
    if (p.workers or default_workers(where.episodes)) > 1:
        warm_up(_preload(spec))
    expert = _load_expert(p.drives.expert, where.env, where.action_space, where.latency_steps)
    exp = expert_summary(expert)
    driver, driver_info = _load_student(p.drives, where.env, where.action_space, where.latency_steps)
    inspect_out(out)  # refuse a folder that is not a dataset before putting a lock file into it
    with folder_lock(out):
        for tmp in temp_files(out):  # leftovers of a SIGKILLed write; never data
            tmp.unlink(missing_ok=True)
        existing = inspect_out(out)
        plan = plan_run(p, existing, exp, driver_info, command, log)
        if plan is None:
            return CollectResult(out, 0, 0, len(existing.metas), int(sum(m["length"] for m in existing.metas)),
                                 None, 0, 0.0, False, None, None)
        recording = Recording(plan, list(existing.metas), exp, spec, out, p.progress, after_episode)
        interrupted = False
        try:
            with sigterm_as_interrupt():
                if plan.workers == 1:
                    _collect_serial(plan.settings, spec, expert, driver, plan.tasks, recording.on_steps,
                                    recording.saved)
                else:
                    _collect_parallel(plan.settings, spec, plan.workers, plan.tasks, recording.on_steps,
                                      recording.saved)
        except KeyboardInterrupt:
            interrupted = True
        finally:
            recording.bar.close()
        if interrupted:
            recording.reread_after_interrupt()
        return recording.result(interrupted)


def _load_expert(path: Path | None, env: str, action_space: str, latency_steps: int) -> Any:
    from agent.experts.expert import Expert

    try:
        expert = Expert.load(path, action_space, env)
    except (FileNotFoundError, ValueError) as e:
        hint = ""
        if "expert, but action_space" in str(e):
            other = "discrete" if action_space == "continuous" else "continuous"
            hint = f" (pass --action-space {other} or an expert for {action_space})"
        raise CollectError(f"{e}{hint}") from None
    if getattr(expert, "max_latency", 0) and latency_steps > expert.max_latency:
        raise CollectError(f"--latency-steps {latency_steps}: the latency expert {str(path)!r} was trained "
                           f"for up to {expert.max_latency} steps")
    return expert


def _load_student(d: Drives, env: str, action_space: str, latency_steps: int) -> tuple[Any, dict[str, Any]]:
    """DAgger: the --driver policy and what every episode's meta says about it."""
    if d.driver is None:
        return None, {"driver": None}
    try:
        driver = load_driver(d.driver, env, action_space, d.driver_actions, d.driver_temperature,
                             latency_steps * get_spec(env).dt)
    except (FileNotFoundError, ValueError) as e:
        raise CollectError(f"--driver: {e}") from None
    return driver, {"driver": str(d.driver), "driver_sha256": file_sha256(Path(d.driver)),
                    **({"driver_actions": driver.actions} if driver.actions != "argmax" else {}),
                    **({"driver_temperature": driver.temperature} if driver.temperature != 1 else {})}


@dataclass
class RunPlan:
    """What this run records: the dataset's config, the episode ids and their track seeds, the run's entry in
    the card, and the settings every episode is recorded with."""

    config: dict[str, Any]
    runs: list[dict[str, Any]]  # the card's runs, this one last
    ids: list[int]
    seeds: list[int]
    workers: int
    settings: EpisodeSettings

    @property
    def run(self) -> dict[str, Any]:
        return self.runs[-1]

    @property
    def tasks(self) -> list[tuple[int, int]]:
        return list(zip(self.ids, self.seeds))


def plan_run(p: CollectPlan, existing: Existing, exp: dict[str, Any], driver_info: dict[str, Any],
             command: str | None, log: Callable[[str], None]) -> RunPlan | None:
    """Settings, ids and seeds of this run (inherited from the dataset it appends to); None if a shard's
    re-run finds nothing left to collect."""
    w, d, r, out = p.where, p.drives, p.recorded, p.out
    spec, renderer, scene = w.spec, w.renderer, w.scene
    shard = shard_range(w.episodes, *w.shard) if w.shard else None
    want_seed = w.seed if shard is None else (w.seed if w.seed is not None else spec.seeds.collect) + shard[0]
    seed, noise, hold, config = _inherited(w, r, out, existing, exp, want_seed)
    # a shard is a fixed seed range: a re-run completes it; otherwise --episodes says how many to add
    wanted = w.episodes if shard is None else max(0, shard[1] - shard[0] - len(existing.metas))
    ids = existing.ids_to_collect(wanted)
    if not ids:
        log(f"{out} already holds the {len(existing.metas)} episodes of shard {w.shard[0]}/{w.shard[1]}; "
            "nothing to collect")
        return None
    seeds = [seed + i for i in ids]
    low = spec.seeds.reserved_below
    reserved = set(seeds) & (set(range(low)) | set(spec.seeds.card) | set(spec.seeds.validation))
    if reserved:
        log(f"warning: track seeds {min(reserved)}..{max(reserved)} are evaluation/validation seeds "
            f"(< {low}); a student trained on them would be tested on tracks it has seen")
    config = _dataset_config(w.env, w.action_space, w.max_steps, r.early_stop, config, seed, noise, hold)
    workers = min(p.workers if p.workers is not None else default_workers(len(ids)), len(ids))
    run = {
        "command": command,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "first_episode_id": ids[0],
        "episodes_requested": len(ids),
        **({"filled_episode_ids": [i for i in ids if i < existing.next_id]} if ids[0] < existing.next_id else {}),
        **({"shard": f"{w.shard[0]}/{w.shard[1]}: episodes {shard[0]}..{shard[1] - 1} of {w.episodes} "
                     f"from seed {seed - shard[0]}"} if shard else {}),
        "noise": noise,
        "noise_hold": hold,
        "max_steps": w.max_steps,
        "early_stop": r.early_stop,
        **({"cut_wrong_way": True} if r.cut_wrong_way else {}),
        "renderer": renderer,
        "workers": workers,
        "driver": str(d.driver) if d.driver is not None else None,
        "beta": d.beta if d.driver is not None else None,
        **{k: driver_info[k] for k in ("driver_actions", "driver_temperature") if k in driver_info},
        **({"recovery_labels": True} if r.recovery_labels else {}),
        **({"recovery_starts": r.recovery_starts} if r.recovery_starts else {}),
        **{k: list(v) for k, v in scene.items()},
        "episodes_added": 0,
        "steps_added": 0,
        "interrupted": False,
    }
    settings = EpisodeSettings(
        env=w.env, action_space=w.action_space, expert=None if d.expert is None else str(d.expert),
        driver=None if d.driver is None else str(d.driver), driver_actions=d.driver_actions,
        driver_temperature=d.driver_temperature,
        max_steps=w.max_steps, renderer=renderer,
        noise=noise, noise_hold=hold, early_stop=r.early_stop, beta=d.beta, out=str(out),
        cut_wrong_way=r.cut_wrong_way,
        meta={"expert_sha256": exp["sha256"], **driver_info,
              **({"expert_base_sha256": exp["init_sha256"]} if exp.get("init_sha256") else {})},
        recovery_labels=r.recovery_labels,
        recovery_starts=r.recovery_starts, scene=scene, latency_steps=w.latency_steps)
    return RunPlan(config, [*existing.card.get("runs", []), run], ids, seeds, workers, settings)


def _inherited(w: Tracks, r: Recorded, out: Path, existing: Existing, exp: dict[str, Any],
               want_seed: int | None) -> tuple[int, float, int, dict[str, Any]]:
    """(first track seed, noise, noise hold, dataset config): the dataset's when appending, else the defaults."""
    spec = w.spec
    if existing.metas:
        inherited = check_compatible(existing, w, out, exp["sha256"], exp["path"], seed=want_seed)
        seed = inherited["seed"]
        noise = r.noise if r.noise is not None else inherited["noise"]
        hold = r.noise_hold if r.noise_hold is not None else inherited["noise_hold"]
        config = existing.card.get("config") or {}
    else:
        seed = want_seed if want_seed is not None else spec.seeds.collect
        noise = r.noise if r.noise is not None else spec.default_noise[w.action_space]
        hold = r.noise_hold if r.noise_hold is not None else spec.default_noise_hold[w.action_space]
        config = {}
    if w.action_space == "discrete" and noise > 1:
        raise CollectError(f"--noise is a probability for the discrete action space, must be in [0, 1], got {noise}")
    return seed, noise, hold, config


def _dataset_config(env: str, action_space: str, max_steps: int, early_stop: bool, config: dict[str, Any],
                    seed: int, noise: float, hold: int) -> dict[str, Any]:
    """The card's config: how the dataset was recorded (an appended run keeps the first run's noise)."""
    return {
        **config,
        "env": env,
        "action_space": action_space,
        "seed": seed,
        "noise": config.get("noise", noise),
        "noise_hold": config.get("noise_hold", hold),
        "max_steps": config.get("max_steps", max_steps),
        "noise_model": (
            "continuous: N(0, noise^2) added to steer (and to throttle=gas-brake where the action has them), "
            "clipped, held noise_hold frames"
            if action_space == "continuous"
            else "discrete: with probability noise a uniformly random other action, decided every noise_hold frames"
        ),
        "render": True,
        "early_stop": (
            f"stuck (speed < {STUCK_SPEED} for {STUCK_SECONDS} s) or off road for "
            f"{OFF_ROAD_SECONDS} s; stuck stretch cut"
            if early_stop else None
        ),
    }


class Recording:
    """The run as episodes come in: the progress bar, and the card rewritten after every saved episode."""

    def __init__(self, plan: RunPlan, metas: list[dict], exp: dict[str, Any], spec: EnvSpec, out: Path,
                 progress: bool, after_episode: Callable[[int], None] | None) -> None:
        from tqdm import tqdm

        self.plan, self.metas, self.exp, self.spec, self.out, self.after_episode = (
            plan, metas, exp, spec, out, after_episode)
        self.added: list[dict] = []
        self.steps = 0
        self.t_start = time.perf_counter()
        self.bar = tqdm(total=len(plan.ids), unit="ep", desc=f"collect {out.name}", dynamic_ncols=True,
                        disable=not show_progress(progress))  # a bar redrawn into a log file leaves debris there

    def postfix(self) -> None:
        rate = self.steps / max(time.perf_counter() - self.t_start, 1e-9)
        rets = [m["return"] for m in self.added]
        self.bar.set_postfix(steps_s=f"{rate:.0f}", mean_return=f"{np.mean(rets):.1f}" if rets else "-",
                             laps=sum(m["lap_complete"] for m in self.added), refresh=False)

    def on_steps(self, n: int = 1) -> None:
        before, self.steps = self.steps, self.steps + n
        if self.steps // 50 != before // 50:
            self.postfix()
            self.bar.refresh()

    def write_card(self) -> None:
        write_json(self.out / CARD_NAME, build_card(self.plan.config, self.exp, self.plan.runs, self.metas,
                                                           self.spec))

    def saved(self, meta: dict) -> None:
        """An episode file is on disk: count it and rewrite the card (episodes in id order)."""
        self.metas.append(meta)
        self.metas.sort(key=lambda m: m["episode_id"])
        self.added.append(meta)
        self.plan.run.update(episodes_added=len(self.added), steps_added=int(sum(m["length"] for m in self.added)),
                             steps_per_s=round(self.steps / max(time.perf_counter() - self.t_start, 1e-9), 1))
        self.write_card()
        self.postfix()
        self.bar.update(1)
        if self.after_episode is not None:
            self.after_episode(meta["episode_id"])

    def reread_after_interrupt(self) -> None:
        """The card (and `added`) may lag by an episode whose write was interrupted: trust the files."""
        for tmp in temp_files(self.out):  # a worker killed mid-write (after STOP_TIMEOUT_S) leaves one
            tmp.unlink(missing_ok=True)
        self.metas = inspect_out(self.out).metas
        wanted_ids = set(self.plan.ids)
        self.added = [m for m in self.metas if m["episode_id"] in wanted_ids]
        self.plan.run.update(interrupted=True, episodes_added=len(self.added),
                             steps_added=int(sum(m["length"] for m in self.added)))
        if self.metas:
            self.write_card()

    def result(self, interrupted: bool) -> CollectResult:
        elapsed = time.perf_counter() - self.t_start
        added = sorted(self.added, key=lambda m: m["episode_id"])
        return CollectResult(
            out=self.out,
            episodes_added=len(added),
            steps_added=int(sum(m["length"] for m in added)),
            episodes_total=len(self.metas),
            steps_total=int(sum(m["length"] for m in self.metas)),
            mean_return_added=float(np.mean([m["return"] for m in added])) if added else None,
            laps_added=int(sum(m["lap_complete"] for m in added)),
            steps_per_s=self.steps / max(elapsed, 1e-9),
            interrupted=interrupted,
            first_seed=added[0]["track_seed"] if added else None,
            last_seed=added[-1]["track_seed"] if added else None,
            workers=self.plan.workers,
        )
