"""Closed-loop evaluation: drive a rendered env (CarRacing-v3, udacity) with a policy, shadowed by the expert.

``evaluate(resolve(EvalArgs(...)))`` is what ``evaluate.py`` calls: agent.evaluation.config.resolve turns the
arguments into the run's small configs once. For each policy (checkpoints and/or the
shipped expert) and each track seed ``seed, seed+1, ...``:

* the policy drives through its streaming interface -- ``stream.reset()`` at the episode start,
  ``stream.step(frame, t)`` on every frame (t = step x the env's dt), ``policy.to_env_action(output)`` --
  and only ``stream.step`` is timed (the policy's inference latency);
* the expert *shadows* it: on every visited state it computes ``Expert.act(info["privileged"])``
  without executing it, which gives the steering error on the policy's own state distribution;
* lane-keeping envs (the spec has ``recover``, udacity): when the car leaves its lane it is put back on
  the centre line and drives on; each such intervention costs 6 s in NVIDIA's autonomy measure;
* timing conditions (``drop_prob``, ``jitter``, ``latency_steps``; agent/evaluation/timing.py): the policy
  may get no frame at a step (its stream is not stepped, its last action is held) and its actions may reach
  the env late; the expert drives under the same conditions with ``--expert-drives`` / ``--with-expert``
  (a baseline for what held and late actions cost); ``metrics.json`` records them in its ``timing`` block;
* the first ``video_episodes`` episodes are recorded (``agent.evaluation.video``: HUD, NAC attention
  panel, optional saliency).

One episode's loop is agent/evaluation/episode.py, the metrics agent/evaluation/metrics.py, the controllers
agent/controllers.py; in agent/evaluation/: the arguments args.py, the configs config.py, who drives drivers.py,
the worker processes parallel.py, what is written report.py, the offline scores offline.py.

Output folder (LeRobot style, one per policy): ``metrics.json`` (summary + per-episode rows),
``episodes.csv``, ``tb/`` (TensorBoard ``eval/...`` scalars) and ``videos/seed_<K>.mp4``. Several
policies (``--checkpoint a.pt b.pt``, ``--with-expert``) get ``OUT/<name>/`` each and a
``OUT/comparison.md`` (+ ``comparison.json``) on the same seeds; a single one writes into ``OUT``.

Seeds: the default first seed is 1000 (seeds 1000, 1001, ...): the expert's card reports seeds
1000..1019, its training draws seeds >= 100000, its checkpoint selection 90000..90019, and demos are
collected on seeds >= 3000000 (collect.py refuses seeds < 100000) -- so evaluation tracks are unseen
by the expert's training and by the student's data, and the expert baseline row is directly
comparable with the expert's card.

Policies whose head predicts only some of the env's action components (e.g. a steering-only head on
CarRacing's [steer, gas, brake]) drive with the expert's values for the missing components;
``metrics.json`` records this as ``"filled_from_expert"``. Everything env-specific (how to make the env,
step time, progress, on-road, HUD scale) comes from the env's ``envs.spec.EnvSpec``.

Speed: ``workers`` > 1 drives the (policy, seed) episodes in that many processes (agent.workers), each with
its own env, expert and policies; ``renderer`` picks who draws the frames (CarRacing: gymnasium's ``pygame``,
the reference, or ``fast``). An episode depends only on its seed, so rows and videos are those of one process;
each policy's files are written, in seed order, once its last episode is in. Only the timings differ
(latency is measured in whichever process drove). ``workers`` = 1 is the plain loop in this process.

Ctrl-C stops after the current step: the finished episodes are written (``"interrupted": true``) and
``Interrupted`` is raised so the CLI can exit with 130.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from agent.controllers import ExpertController
from agent.evaluation.config import EvalPlan
from agent.evaluation.drivers import Driver, expert_meta, policy_drivers
from agent.evaluation.episode import run_episode
from agent.evaluation.parallel import episode_outputs, evaluate_parallel, preload
from agent.evaluation.report import common_meta, summary_line, write_comparison, write_policy
from agent.runtime import show_progress, tensorboard_command
from agent.workers import warm_up
from common.stops import stop_handled


def evaluate(plan: EvalPlan, *, command: str | None = None) -> dict[str, dict[str, Any]]:
    """Evaluate every requested policy on the same seeds; returns {name: metrics.json summary}. A recording
    imported for it is removed again when the run is refused (a bad checkpoint, frames of another size)."""
    from driving_data.udacity_import import removed_if_refused

    made = list(plan.outputs.imported)
    with removed_if_refused(made):
        previous = torch.get_num_threads()
        torch.set_num_threads(plan.runtime.threads)  # intra-op threads; single-frame inference is fastest with 1
        try:
            if plan.track.data:
                from agent.evaluation.offline import evaluate_offline

                return evaluate_offline(plan, made)
            return _drive(plan, command)
        finally:
            torch.set_num_threads(previous)  # a library call should not leave the process single-threaded


def _drive(plan: EvalPlan, command: str | None) -> dict[str, dict[str, Any]]:
    from agent.experts.expert import Expert

    if plan.runtime.workers > 1:
        warm_up(preload(plan.track.env))  # the workers' imports run while this process loads the policies
    # 1. what to drive (load everything first, so a bad checkpoint fails before any driving)
    drivers, action_space = policy_drivers(plan.drivers, plan.conditions, plan.track.env, plan.runtime.device)
    expert = Expert.load(plan.drivers.expert, action_space, plan.track.env)
    if expert.spec.collection_noise:  # a replay of a collect.py dataset: its reference path is the noised drive's
        tqdm.write(f"note: {plan.track.replay} was collected with DART noise {expert.spec.collection_noise:g}: the "
                   "recorded path it is judged against wobbles with it (collect.py --noise 0 records a drive for "
                   "replays)")
    expert_info = expert_meta(expert)
    if plan.drivers.expert_drives or plan.drivers.with_expert:
        drivers.append(Driver("expert", ExpertController(expert), dict(expert_info)))
    # 2. where
    root = plan.outputs.out
    single = len(drivers) == 1
    common = common_meta(plan, expert, action_space, expert_info["source"], command)
    # 3. drive
    results: dict[str, dict[str, Any]] = {}
    drivers = [Driver(d.name, d.controller, {"name": d.name, **d.meta, **common}) for d in drivers]
    out_dirs = [root if single else root / d.name for d in drivers]
    try:
        if plan.runtime.workers > 1 and len(drivers) * len(plan.track.seeds) > 1:
            evaluate_parallel(drivers, plan, action_space, out_dirs, results)
        else:  # one process: the policies one after the other, their episodes in order
            for d, out_dir in zip(drivers, out_dirs):
                results[d.name] = evaluate_controller(d.controller, plan, action_space, expert, out_dir, d.meta)
                tqdm.write(summary_line(d.name, results[d.name]))
    finally:
        if not single and results:
            write_comparison(root, plan, action_space, results)
    videos = sorted(root.glob("videos/*.mp4" if single else "*/videos/*.mp4"))
    paths = sorted(root.glob("paths/*.png" if single else "*/paths/*.png"))
    tqdm.write(f"outputs in {root}/: "
               + ("metrics.json, episodes.csv" if single else "comparison.md, <policy>/metrics.json")
               + (f", {len(videos)} video(s) ({videos[0].relative_to(root)}, ...)" if videos else "")
               + (f", the driven path of each part ({paths[0].relative_to(root)} and .csv, ...)" if paths else "")
               + (f"; TensorBoard: {tensorboard_command(root)}" if plan.outputs.tensorboard else ""))
    return results


def evaluate_controller(controller: Any, plan: EvalPlan, action_space: str, expert: Any, out_dir: Path,
                        meta: dict[str, Any]) -> dict[str, Any]:
    """All episodes of one policy in this process; writes out_dir/{metrics.json, episodes.csv, tb/, videos/}."""
    track, progress = plan.track, plan.outputs.progress
    env = expert.spec.make(action_space, render=True, max_episode_steps=track.max_steps, renderer=track.renderer,
                           **track.make_kwargs)
    rows: list[dict[str, Any]] = []
    latencies: list[float] = []
    interrupted = False
    bars = show_progress(progress)
    episodes = tqdm(track.seeds, desc=controller.name, unit="ep", disable=not bars, file=sys.stderr)
    try:
        for i, seed in enumerate(episodes):
            with tqdm(total=track.max_steps, desc=f"seed {seed}", unit="step", leave=False,
                      disable=not bars, file=sys.stderr) as bar:
                row, lat = run_episode(controller, env, expert, seed, action_space, bar=bar,
                                       **episode_outputs(plan, controller.is_expert, out_dir, i, seed))
            rows.append(row)
            latencies.extend(lat)
            episodes.set_postfix(ret=f"{row['return']:.0f}", completion=f"{row['completion']:.2f}")
            if progress and not bars:  # stderr is a file or pipe: a plain line instead of the bars
                print(f"{controller.name}: episode {i + 1}/{len(track.seeds)} (seed {seed}) "
                      f"return {row['return']:.0f}, "
                      f"completion {row['completion']:.2f}", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        stop_handled()
        interrupted = True
    finally:
        episodes.close()
        env.close()
    return write_policy(rows, latencies, plan, out_dir, meta, interrupted)
