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
from agent.evaluation.timing import TimingConditions
from envs.registry import neutral_action
from common.stops import raise_if_stopped
from envs.registry import EnvSpec


def run_episode(controller: Any, env: Any, expert: Any, seed: int, action_space: str, *,
                video_path: Path | None = None, saliency: str | None = None,
                bar: tqdm | None = None, on_step: Callable[[], None] | None = None,
                timing: TimingConditions | None = None) -> tuple[dict[str, Any], list[float]]:
    """Drive one episode on track ``seed``; returns its metrics row and per-step latencies (ms).
    ``on_step()`` is called after every step (a worker process reports progress through it). ``timing``
    (agent.evaluation.timing) decides at which steps the controller gets a frame and when its actions reach
    the env; None or all options off: every frame, at once."""
    spec: EnvSpec = expert.spec
    timing = timing or TimingConditions()
    started = time.perf_counter()
    frame, info = env.reset(seed=int(seed))
    controller.reset(seed)
    clock = timing.episode(seed, neutral_action(env.action_space))
    rec = EpisodeRecorder(seed, action_space, spec)
    writer = vid.VideoWriter(video_path, vid.fps_of(spec.dt)) if video_path is not None else None
    visuals: tuple[Any, Any] = (None, None)
    terminated = truncated = False
    try:
        step = 0
        while not (terminated or truncated):
            frame = np.array(frame, dtype=np.uint8, copy=True)
            shadow = None if controller.is_expert else expert.act(info["privileged"])
            decision, latency = None, None  # None: the controller gets no frame, its last action is held
            if clock.sees_frame(step):
                # the frame's time: a replay's recorded timestamp, else steps x the env's dt
                decision, latency = controller.act(frame, info["time"] if "time" in info else step * spec.dt, info,
                                                   shadow, clock.queue)
            if controller.is_expert:  # the expert's own action on this state is what it is compared with
                shadow = decision if decision is not None else expert.act(info["privileged"])
            action = clock.action(decision)
            if writer is not None:
                visuals = vid.step_visuals(controller, frame, saliency) if decision is not None else visuals
                writer.append(_video_frame(controller, spec, frame, visuals, info, rec, step, action, shadow,
                                           action_space, seed))
            frame, reward, terminated, truncated, info = env.step(action)
            raise_if_stopped()
            rec.record(reward=reward, policy_action=action, expert_action=shadow, latency_s=latency, info=info)
            stalled = rec.stalled
            if spec.recover is not None and not truncated and (terminated or not spec.on_road(info) or stalled):
                # an intervention: back on the centre line (a stalled car also back to speed), drive on
                frame, info = spec.recover(env, spec.stall[2]) if stalled else spec.recover(env)
                terminated = False
                rec.intervened(stalled)
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
    if not timing.regular:
        row.update(clock.stats())
    return row, [x * 1e3 for x in rec.latency_s]


def _video_frame(controller: Any, spec: EnvSpec, frame: np.ndarray, visuals: tuple[Any, Any], info: dict[str, Any],
                 rec: EpisodeRecorder, step: int, action: Any, shadow: Any, action_space: str, seed: int) -> np.ndarray:
    """One video frame: the camera frame, the HUD, and the policy's attention panel and saliency (held from
    the last step the policy saw a frame)."""
    expert_shadow = None if controller.is_expert else shadow
    hud = vid.draw_hud(vid.SCALE * frame.shape[1], step=step, speed=float(info["speed"]),
                       ret=rec.episode_return,
                       completion=spec.progress(info),
                       policy_steer=steer_of(action, action_space),
                       expert_steer=None if expert_shadow is None else steer_of(expert_shadow, action_space),
                       steer_limit=spec.steer_limit[action_space],
                       title=f"{controller.name}  seed {seed}{_scene(spec, info)}",
                       expert_label="to path" if spec.builtin_expert is not None else "expert",
                       lateral_error=spec.lateral_error(info) if spec.lateral_error else None,
                       interventions=rec.interventions if spec.recover is not None else None,
                       speed_unit=spec.speed_unit,
                       pedals=pedals_text(spec.action_names[action_space], action_space, action, expert_shadow,
                                          getattr(controller, "filled", ())))
    return vid.compose_frame(frame, hud, *visuals)


def _scene(spec: EnvSpec, info: dict[str, Any]) -> str:
    """'  jungle, dusk': the episode's theme and, where the env has several, its light; '' for envs without scenes."""
    parts = [str(info["theme"])] if info.get("theme") else []
    parts += [str(info["condition"])] if spec.conditions and info.get("condition") else []
    return "  " + ", ".join(parts) if parts else ""


def pedals_text(names: tuple[str, ...], action_space: str, action: Any, expert: Any, filled: Any = ()) -> str:
    """What the driver does besides steering, for the HUD: 'gas +0.80  brake +0.00' (components the student does
    not predict marked as the expert's), or a discrete action's name; the expert's beside it. '' when the action
    is steering alone (a replay, a PI-held speed)."""
    if action_space == "discrete":
        return f"action {names[int(action)]}" + ("" if expert is None else f"   expert: {names[int(expert)]}")
    a = np.asarray(action, dtype=np.float64).reshape(-1)
    cols = [(i, n) for i, n in enumerate(names[:len(a)]) if n != "steer"]
    if not cols:
        return ""
    text = "  ".join(f"{n} {a[i]:+.2f}" + (" (the expert's)" if n in filled else "") for i, n in cols)
    if expert is None:
        return text
    e = np.asarray(expert, dtype=np.float64).reshape(-1)
    return text + "   expert: " + "  ".join(f"{n} {e[i]:+.2f}" for i, n in cols if i < len(e))
