"""One closed-loop episode: a controller drives on track ``seed`` while the expert shadows it (labels every
visited state without acting), lane-keeping envs put a car that left its lane back on the centre line (an
intervention), and the metrics row is built as it goes (agent.evaluation.metrics.EpisodeRecorder)."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
from tqdm import tqdm

from agent.evaluation import video as vid
from agent.evaluation.metrics import EpisodeRecorder, steer_of
from agent.runtime import raise_if_stopped
from envs.registry import EnvSpec


def run_episode(controller: Any, env: Any, expert: Any, seed: int, action_space: str, *,
                video_path: Path | None = None, saliency: str | None = None,
                bar: tqdm | None = None, on_step: Callable[[], None] | None = None
                ) -> tuple[dict[str, Any], list[float]]:
    """Drive one episode on track ``seed``; returns its metrics row and per-step latencies (ms).
    ``on_step()`` is called after every step (a worker process reports progress through it)."""
    spec: EnvSpec = expert.spec
    started = time.perf_counter()
    frame, info = env.reset(seed=int(seed))
    controller.reset()
    rec = EpisodeRecorder(seed, action_space, spec)
    writer = vid.VideoWriter(video_path) if video_path is not None else None
    terminated = truncated = False
    limit = spec.steer_limit[action_space]
    try:
        step = 0
        while not (terminated or truncated):
            frame = np.array(frame, dtype=np.uint8, copy=True)
            shadow = None if controller.is_expert else expert.act(info["privileged"])
            action, latency = controller.act(frame, step * spec.dt, info, shadow)
            if controller.is_expert:
                shadow = action
            if writer is not None:
                panel, sal = vid.step_visuals(controller, frame, saliency)
                hud = vid.draw_hud(vid.SCALE * frame.shape[1], step=step, speed=float(info["speed"]),
                                   ret=rec.episode_return,
                                   completion=spec.progress(info),
                                   policy_steer=steer_of(action, action_space),
                                   expert_steer=None if controller.is_expert else steer_of(shadow, action_space),
                                   steer_limit=limit, title=f"{controller.name}  seed {seed}",
                                   lateral_error=spec.lateral_error(info) if spec.lateral_error else None,
                                   interventions=rec.interventions if spec.recover is not None else None)
                writer.append(vid.compose_frame(frame, hud, panel, sal))
            frame, reward, terminated, truncated, info = env.step(action)
            raise_if_stopped()
            rec.record(reward=reward, policy_action=action, expert_action=shadow, latency_s=latency, info=info)
            if spec.recover is not None and not truncated and (terminated or not spec.on_road(info)):
                frame, info = spec.recover(env)  # an intervention: back on the centre line, drive on
                terminated = False
                rec.intervened()
            step += 1
            if bar is not None:
                bar.update(1)
            if on_step is not None:
                on_step()
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    video = ""
    if writer is not None:
        writer.close()
        video = str(Path("videos") / video_path.name)
    row = rec.finish(terminated=terminated, truncated=truncated,
                     wall_seconds=time.perf_counter() - started, video=video)
    return row, [x * 1e3 for x in rec.latency_s]
