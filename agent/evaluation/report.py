"""What an evaluation writes and prints about its drives: each policy's files (metrics.json, episodes.csv, tb/, a
replay's path plots), the run's common metadata, comparison.md for several policies, and the one-line summaries."""
from __future__ import annotations

import math
import shlex
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from agent.evaluation.config import EvalPlan, Where
from agent.evaluation.metrics import aggregate, autonomy_formula, comparison_markdown, group_lines, write_run
from agent.evaluation.timing import timing_summary
from common.files import atomic_write_text, write_json
from common.stops import Interrupted
from envs.registry import REPLAY_PREFIX, get_spec
from policies.precision import runs_bf16


def write_policy(rows: list[dict[str, Any]], latencies: list[float], plan: EvalPlan, out_dir: Path,
                 meta: dict[str, Any], interrupted: bool) -> dict[str, Any]:
    """metrics.json etc. of one policy from its finished episodes (in seed order); Interrupted if it was. The
    scores first, then a replay's path plots and tables: a disk that fills up keeps what matters most."""
    # a plot and a table per part
    traces = [(row["seed"], row.pop("path_trace")) for row in rows if "path_trace" in row]
    summary = aggregate(rows, latencies, **meta, interrupted=interrupted,
                        seeds=[r["seed"] for r in rows], requested_seeds=list(plan.track.seeds),
                        timing=timing_summary(plan.conditions.timing, meta["dt"], rows))
    write_run(out_dir, summary, tensorboard=plan.outputs.tensorboard)
    for seed, trace in traces:
        from agent.evaluation.plots import plot_replay_path, write_replay_table

        plot_replay_path(trace, out_dir / "paths" / f"part_{seed}.png", f"{meta['name']}, part {seed}",
                         get_spec(plan.track.env).geometry)
        write_replay_table(trace, out_dir / "paths" / f"part_{seed}.csv")
    if interrupted:
        raise Interrupted(f"interrupted: wrote {len(rows)} finished episode(s) of {meta['name']} to {out_dir}")
    return summary


def common_meta(plan: EvalPlan, expert: Any, action_space: str, expert_source: str,
                command: str | None) -> dict[str, Any]:
    """What every policy's metrics.json records about the run: env, units, how latency was timed, versions."""
    spec, track = expert.spec, plan.track
    return {
        "env": track.env, "env_id": spec.gym_id, "action_space": action_space, "dt": spec.dt,
        **({"intervention_cost_s": spec.intervention_cost_s,
            "interventions": "the car left its lane (spec.on_road false) or the road"
                             + (f", or stalled (below {spec.stall[0]} m/s for {spec.stall[1]} s; restarted at "
                                f"{spec.stall[2]} m/s, counted in stalls)" if spec.stall else "")
                             + "; it was put back on the centre line and drove on; "
                             + autonomy_formula(spec.intervention_cost_s)}
           if spec.recover is not None and spec.parts is None else {}),
        "max_steps": track.max_steps, "device": plan.runtime.device, "torch_threads": torch.get_num_threads(),
        "precision": "bf16" if runs_bf16(plan.runtime.precision, frames=1) else "fp32",  # a drive: a frame a step
        "expert": expert_source,
        "steer_units": (f"env steer command (action[0]); full scale ±{spec.steer_limit[action_space]}"
                        if action_space == "continuous"
                        else "discrete: RIGHT=+1, LEFT=-1, other actions 0"),
        "latency": "time.perf_counter() around policy stream.step (expert: around Expert.act), per step, ms",
        "command": command or " ".join(shlex.quote(a) for a in sys.argv),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "torch_version": torch.__version__,
        "renderer": track.renderer, "workers": plan.runtime.workers,
        **{k: list(v) if isinstance(v, tuple) else v for k, v in track.make_kwargs.items()},
        **({"replay": _replay_meta(track, spec)} if spec.parts is not None else {}),
    }


def _replay_meta(track: Where, spec: Any) -> dict[str, Any]:
    """What a replay's figures rest on: the recording, its parts, the camera and car, the intervention rule."""
    from envs.replay.vehicle import DEFAULT_MAX_YAW_RAD

    replay = track.make_kwargs  # the replay's options, as its env is made with them
    return {"recording": track.replay, "dataset": spec.name[len(REPLAY_PREFIX):], "span": replay["span"] or "0:1",
            "geometry": spec.geometry.to_dict(), "dart_noise": spec.collection_noise,
            "intervention": f"more than {replay['max_offset']:g} m from the recorded path or more than "
                            f"{math.degrees(DEFAULT_MAX_YAW_RAD):.0f} degrees off its direction (measured from the "
                            + ("recorded driver's line, not the road's edges" if replay["reference"] == "driver" else
                               "recorded driver's line and from the road's middle measured on the recorded frames, "
                               "envs/replay/road.py: off when beyond both")
                            + "); the car is put back on the path",
            "autonomy": autonomy_formula(spec.intervention_cost_s),
            "straight": "straight_*: the always-straight driver on the same parts (the trivial reference)"}


def write_comparison(root: Path, plan: EvalPlan, action_space: str, results: dict[str, dict[str, Any]]) -> None:
    rows, track, timing = list(results.items()), plan.track, plan.conditions.timing
    root.mkdir(parents=True, exist_ok=True)
    title = (f"# Closed-loop evaluation: {track.env} ({action_space}), seeds {track.seeds[0]}..{track.seeds[-1]}, "
             f"max {track.max_steps} steps" + ("" if timing.regular else f", {timing.label()}") + "\n\n")
    atomic_write_text(root / "comparison.md", title + cut_short_note(track) + comparison_markdown(rows))
    write_json(root / "comparison.json", {n: {k: v for k, v in s.items() if k != "episodes"} for n, s in rows})


def cut_short_note(track: Where) -> str:
    """A paragraph for comparison.md when --max-steps ends the episodes before the env does: its returns and laps are
    then below the full episodes' of a model card (and the README's headline figures); '' otherwise."""
    spec = get_spec(track.env)
    if spec.parts is not None or track.max_steps >= spec.default_max_steps:
        return ""
    return (f"Episodes end at {track.max_steps} steps ({track.max_steps * spec.dt:g} s), before {track.env}'s own "
            f"{spec.default_max_steps}: return, completion and laps count only that far, so they fall short of the "
            "full-episode figures of the shipped models' cards and the README "
            f"({len(track.seeds)} episode(s) here).\n\n")


def summary_line(name: str, s: dict[str, Any]) -> str:
    def f(x: float, fmt: str) -> str:
        return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)

    driven = (f"{s['num_episodes']} recorded part(s), {f(sum(e['distance'] for e in s['episodes']), '.0f')} m driven"
              if "straight_autonomy" in s else  # a replay: the episodes' distance column, summed
              f"return {f(s['mean_return'], '.1f')} ± {f(s['std_return'], '.1f')} over {s['num_episodes']} episodes, "
              f"completion {f(s['mean_completion'], '.3f')}, laps {s['laps_completed']}/{s['num_episodes']}")
    return (f"{name}: {driven}, steer MAE {f(s['mean_steer_mae'], '.3f')}, "
            f"smoothness {f(s['mean_steer_smoothness'], '.3f')}, latency {f(s['latency_median_ms'], '.2f')} / "
            f"{f(s['latency_p95_ms'], '.2f')} ms (median / p95)" + _timing_note(s.get("timing"))
            + _replay_note(s)
            + "".join("\n" + line for line in group_lines(s)))


def _replay_note(s: dict[str, Any]) -> str:
    """A replay's headline: autonomy and interventions per 100 s beside always-straight's on the same frames."""
    if "straight_autonomy" not in s:
        return ""
    return (f"\n  replay: autonomy {s['autonomy']:.1f} %, {s['total_interventions']} interventions "
            f"({s['interventions_per_100s']:.1f} per 100 s) in {s['elapsed_s']:.0f} s; always-straight "
            f"{s['straight_autonomy']:.1f} %, {s['straight_interventions']} "
            f"({s['straight_interventions_per_100s']:.1f} "
            "per 100 s)")


def _timing_note(timing: dict[str, Any] | None) -> str:
    """'; the driver saw 80.1 % of the frames (...)' under timing conditions; '' under regular timing."""
    if not timing or timing["regular"]:
        return ""
    return (f"; the driver saw {100 * timing['frames_seen_fraction']:.1f} % of the frames "
            f"(drop {timing['drop_prob']:g}, jitter {timing['jitter'] or 'off'}, latency "
            f"{timing['latency_steps']} steps)")
