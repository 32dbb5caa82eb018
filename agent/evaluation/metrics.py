"""Closed-loop driving metrics: per-step recording, per-episode summaries, aggregation and writers.

One ``EpisodeRecorder`` per episode collects what happened at every step (reward, the policy's and the
shadowing expert's steering, speed, on-road flag, wrong-way flag, inference latency); ``finish()`` turns it into a flat
dict of numbers (one row of ``episodes.csv``). What "on the road", "completion" and "lap" mean comes from
the env's spec (``envs.spec.EnvSpec``), whose ``episode_meta`` also adds the env's own columns
(CarRacing: tiles visited; udacity: laps, distance). ``aggregate()`` summarises the rows (``metrics.json``),
``write_tensorboard()`` logs them as ``eval/...`` scalars, ``comparison_markdown()`` puts several runs
side by side. Each figure is declared once, in ``METRICS``: its label and format, whether it is averaged,
whether TensorBoard draws it per episode, and the table columns that show it (``Column``, in the tables of
``TABLES``); every writer and table (here and in ``agent.evaluation.table``) reads that declaration, so a new
metric is one line.

Steering convention (``steer_of``): continuous actions use ``action[0]`` in env units (-1 full left,
+1 full right; the expert stays within the ±0.4 wheel limit); discrete actions map 1 RIGHT -> +1,
2 LEFT -> -1, everything else (noop, gas, brake) -> 0. Steering MAE and smoothness are therefore in
env steer units for continuous policies and in "fraction of steps that disagree / switch" units for
discrete ones -- compare runs only within one action space.
"""
from __future__ import annotations

import csv
import io
import math
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from common.files import atomic_write_text, write_json
from common.stops import stops_at_safe_points

# The per-episode keys, in CSV column order. Every value is a plain int/float/bool/str.
EPISODE_KEYS: tuple[str, ...] = (
    "seed", "return", "length", "completion", "lap_completed", "terminated", "truncated", "off_track_steps",
    "off_track_fraction", "steer_mae", "steer_mse", "steer_jerk", "steer_smoothness", "expert_steer_smoothness",
    "mean_speed", "latency_median_ms", "latency_p95_ms", "wall_seconds", "video",
)


# The tables whose columns the metrics declare (Metric.columns), by name.
TABLES: dict[str, str] = {
    "race": "comparison.md of a racing env (CarRacing)",
    "lane": "comparison.md of a lane-keeping env (udacity)",
    "replay": "comparison.md of a replay (a recording driven in closed loop)",
    "race pairs": "paired differences of racing envs (comparison.md and python -m agent.evaluation.table); "
                  "the first is the headline",
    "lane pairs": "paired differences of lane-keeping envs and replays; the first is the headline",
    "race pool": "python -m agent.evaluation.table, racing envs: each policy's episodes pooled over training seeds",
    "lane pool": "python -m agent.evaluation.table, lane-keeping envs: each policy's episodes pooled (the summary "
                 "also holds `runs`, the number of training seeds)",
}


@dataclass(frozen=True)
class Column:
    """Where a metric is shown: in each of ``tables`` (names of ``TABLES``) at ``place`` (columns run left to right
    by place), with the metric's label and format unless given. A cell shows the summary's ``figure`` (default
    ``mean_<metric>``), as mean ± std with ``spread``; ``show(summary, fmt)`` writes a cell of other figures. The
    paired tables show the metric's key (their header) in the column's format. ``metric`` is filled in by
    ``columns()``."""

    tables: str | tuple[str, ...]
    place: int
    figure: str | None = None
    label: str | None = None
    fmt: str | None = None
    spread: bool = False
    show: Callable[[dict[str, Any], str], str] | None = None
    metric: str = ""

    def __post_init__(self) -> None:
        unknown = [t for t in self.in_tables if t not in TABLES]
        if unknown:
            raise ValueError(f"Column tables must be among {list(TABLES)}, got {unknown}")

    @property
    def in_tables(self) -> tuple[str, ...]:
        return (self.tables,) if isinstance(self.tables, str) else tuple(self.tables)

    @property
    def header(self) -> str:
        return self.label or METRICS[self.metric].label

    @property
    def format(self) -> str:
        return self.fmt or METRICS[self.metric].fmt

    def cell(self, s: dict[str, Any]) -> str:
        if self.show is not None:
            return self.show(s, self.format)
        key = self.figure or f"mean_{self.metric}"
        return _pm(s[key], s[f"std_{self.metric}"], self.format) if self.spread else _num(s.get(key), self.format)


@dataclass(frozen=True)
class Metric:
    """One per-episode figure, declared once: aggregate(), write_tensorboard(), the group summaries and every table
    read it from ``METRICS``.

    key: the episode row's key (an episodes.csv column); label, fmt: its column header and number format in every
    table. mean: aggregate() writes ``mean_<key>`` over the episodes that have it, NaN skipped (metrics.json, and
    TensorBoard ``eval/mean_<key>``); the figures it is not averaged into (return: mean, std, min, max; laps: a count;
    latency: pooled over every step; interventions: a run total and autonomy) are aggregate()'s own. curve: also
    ``eval/<key>`` in TensorBoard, one point per episode. group: kept, as ``mean_<key>``, in the per-theme and
    per-condition summaries. columns: the table columns that show it (``Column``)."""

    key: str
    label: str
    fmt: str
    mean: bool = True
    curve: bool = False
    group: bool = False
    columns: tuple[Column, ...] = ()


def _laps(s: dict[str, Any], fmt: str) -> str:
    return f"{s['laps_completed']}/{s['num_episodes']}"


def _latency(s: dict[str, Any], fmt: str) -> str:
    return " / ".join(_num(s[k], METRICS[k].fmt) for k in ("latency_median_ms", "latency_p95_ms"))


def _wrong_way_episodes(s: dict[str, Any], fmt: str) -> str:
    """In how many episodes the car drove the wrong way at all: a spin that rejoins the road backwards shows here."""
    wrong_way = [e["wrong_way_steps"] for e in s["episodes"] if e.get("wrong_way_steps") is not None]
    return f"{sum(w > 0 for w in wrong_way)}/{len(wrong_way)}" if wrong_way else "n/a"


LANE = ("lane", "replay")  # a replay's comparison.md is the lane-keeping one, without laps


# Declaration order is the order of the mean_<key> figures in metrics.json. Figures of some envs only (wrong_way,
# interventions, stalls, autonomy, cte: spec.wrong_way / recover / stall / lateral_error) are aggregated only where
# the episodes have them.
METRICS: dict[str, Metric] = {m.key: m for m in (
    Metric("return", "return", ".1f", mean=False, curve=True, columns=(
        Column("race", 10, spread=True), Column("race pairs", 10), Column("race pool", 10, label="mean return"))),
    Metric("lap_completed", "laps", "d", mean=False, curve=True,
           columns=(Column(("race", "race pool"), 30, show=_laps), Column("lane", 35, show=_laps))),
    Metric("completion", "completion", ".3f", curve=True, columns=(
        Column("race", 20, spread=True), Column("race pairs", 20), Column("race pool", 20),
        Column("lane", 40, label="mean completion", fmt=".2f"))),
    Metric("length", "steps", ".1f", curve=True),
    Metric("off_track_steps", "off-track steps", ".1f", curve=True,
           columns=(Column("race", 40), Column("race pool", 60))),
    Metric("off_track_fraction", "off-track fraction", ".3f"),
    Metric("steer_mae", "steer MAE", ".3f", curve=True, group=True, columns=(Column("race", 60),)),
    Metric("steer_mse", "steer MSE vs expert", ".4f",
           columns=(Column("lane", 70), Column("replay", 70, label="steer MSE vs path controller"))),
    Metric("steer_jerk", "steer jerk", ".4f", group=True,
           columns=(Column(LANE, 80), Column("lane pairs", 50), Column("lane pool", 30))),
    Metric("steer_smoothness", "steer smoothness", ".3f", curve=True, columns=(Column("race", 70),)),
    Metric("expert_steer_smoothness", "expert steer smoothness", ".3f"),
    Metric("mean_speed", "speed", ".1f", curve=True, group=True, columns=(Column("race", 80),)),
    Metric("wrong_way_steps", "wrong-way steps", ".1f", curve=True, columns=(
        Column("race", 50), Column("race pairs", 30), Column("race pool", 40),
        Column("race pool", 50, label="episodes with wrong-way driving", show=_wrong_way_episodes))),
    Metric("interventions", "interventions", ".1f", columns=(
        Column(LANE, 20, figure="total_interventions", fmt="d"), Column("lane pairs", 20),
        Column("lane pool", 10, label="interventions per run",
               show=lambda s, fmt: f"{s['total_interventions'] / s['runs']:{fmt}}"))),
    Metric("stalls", "stalls", ".1f"),
    Metric("autonomy", "autonomy %", ".1f",
           columns=(Column(LANE, 10, figure="autonomy", fmt=".2f"), Column("lane pairs", 10))),
    Metric("mean_abs_cte", "mean abs CTE (m)", ".3f", group=True,
           columns=(Column(LANE, 50), Column("lane pairs", 40), Column("lane pool", 20))),
    Metric("max_abs_cte", "max abs CTE (m)", ".2f", columns=(Column(LANE, 60, figure="max_abs_cte"),)),
    Metric("interventions_per_100s", "per 100 s", ".1f", mean=False,
           columns=(Column(LANE, 30, figure="interventions_per_100s"), Column("lane pairs", 30))),
    Metric("latency_median_ms", "latency median (ms)", ".2f", mean=False, curve=True,
           columns=(Column(("race", *LANE), 90, label="latency median / p95 (ms)", show=_latency),)),
    Metric("latency_p95_ms", "latency p95 (ms)", ".2f", mean=False),
)}


def columns(table: str) -> tuple[Column, ...]:
    """The columns of ``table`` (a name of ``TABLES``), left to right: every column a metric of ``METRICS`` declares
    there, read when a table is written (a metric added to ``METRICS`` shows in its tables with no other edit)."""
    if table not in TABLES:
        raise ValueError(f"table must be one of {list(TABLES)}, got {table!r}")
    found = [replace(c, metric=m.key) for m in METRICS.values() for c in m.columns if table in c.in_tables]
    return tuple(sorted(found, key=lambda c: c.place))


def steer_of(action: Any, action_space: str) -> float:
    """The steering component of an env action (see the module docstring for the discrete mapping)."""
    if action_space == "discrete":
        return {1: 1.0, 2: -1.0}.get(int(action), 0.0)
    if action_space == "continuous":
        return float(np.asarray(action, dtype=np.float64).reshape(-1)[0])
    raise ValueError(f"action_space must be 'continuous' or 'discrete', got {action_space!r}")


def autonomy(interventions: int, elapsed_s: float, cost_s: float) -> float:
    """NVIDIA's autonomy in percent: 100 * (1 - interventions * cost / elapsed), each intervention charged cost_s,
    clamped at 0 (more interventions than the drive has time for are no less than no autonomy; interventions per
    100 s, ``per_100s``, keeps ranking such drives)."""
    return max(0.0, 100.0 * (1.0 - interventions * cost_s / elapsed_s)) if elapsed_s > 0 else float("nan")


def autonomy_formula(cost_s: float) -> str:
    """How autonomy is computed, in words, for the tables and metrics.json that show it."""
    return (f"autonomy % = max(0, 100 * (1 - interventions * {cost_s:g} s / elapsed s)) (NVIDIA's, clamped at 0); "
            "per 100 s: interventions per 100 s of driving, which keeps ranking drives whose autonomy is 0")


def per_100s(interventions: int, elapsed_s: float) -> float:
    """Interventions per 100 s of driving: unlike autonomy it stays meaningful (never negative) on short drives."""
    return 100.0 * interventions / elapsed_s if elapsed_s > 0 else float("nan")


def _percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else float("nan")


class EpisodeRecorder:
    """Accumulates one episode's per-step signals; ``finish()`` returns its metrics row."""

    def __init__(self, seed: int, action_space: str, spec: Any) -> None:
        self.seed = int(seed)
        self.action_space = action_space
        self.spec = spec
        self.rewards: list[float] = []
        self.policy_steer: list[float] = []
        self.expert_steer: list[float] = []
        self.speed: list[float] = []
        self.on_track: list[bool] = []
        self.latency_s: list[float] = []
        self.completion = 0.0
        self.lap_completed = False
        self.env_meta: dict[str, Any] = {}
        self.lateral_error: list[float] = []  # the spec's lateral_error (udacity: |cross-track error| in m)
        self.wrong_way_steps = 0  # steps pointing against the course (spec.wrong_way)
        self.interventions = 0  # times the car was put back on the road (spec.recover)
        self.stalls = 0  # of them, times it had stalled (spec.stall)
        self._slow_steps = 0  # consecutive steps below spec.stall's speed
        self.terminated = False
        self.truncated = False
        self.path_trace: dict[str, Any] | None = None  # a replay's driven path (info["path_trace"] of its last step)

    @property
    def steps(self) -> int:
        return len(self.rewards)

    @property
    def episode_return(self) -> float:
        return float(np.sum(self.rewards)) if self.rewards else 0.0

    def record(self, *, reward: float, policy_action: Any, expert_action: Any, latency_s: float | None,
               info: dict[str, Any]) -> None:
        """One env step: the action taken, the expert's action on the same state, and the step's ``info``.
        ``latency_s`` None: the policy ran no inference at this step (it got no frame and held its action)."""
        self.rewards.append(float(reward))
        self.policy_steer.append(steer_of(policy_action, self.action_space))
        self.expert_steer.append(steer_of(expert_action, self.action_space))
        if latency_s is not None:
            self.latency_s.append(float(latency_s))
        self.speed.append(float(info["speed"]))
        self.on_track.append(self.spec.on_road(info))
        self.completion = float(self.spec.progress(info))
        self.lap_completed = self.spec.lap_complete(info)
        self.env_meta = self.spec.episode_meta(info)
        if self.spec.lateral_error is not None:
            self.lateral_error.append(float(self.spec.lateral_error(info)))
        if self.spec.wrong_way is not None:
            self.wrong_way_steps += bool(self.spec.wrong_way(info))
        if self.spec.stall is not None:
            self._slow_steps = self._slow_steps + 1 if float(info["speed"]) < self.spec.stall[0] else 0
        if "path_trace" in info:
            self.path_trace = info["path_trace"]

    @property
    def stalled(self) -> bool:
        """The car has stood (below spec.stall's speed) for spec.stall's seconds."""
        return self.spec.stall is not None and self._slow_steps * self.spec.dt >= self.spec.stall[1]

    def intervened(self, stalled: bool = False) -> None:
        """The car left its lane (or stalled) and was put back (NVIDIA's intervention); see ``finish`` for autonomy."""
        self.interventions += 1
        self.stalls += stalled
        self._slow_steps = 0

    def finish(self, *, terminated: bool, truncated: bool, wall_seconds: float = float("nan"),
               video: str = "") -> dict[str, Any]:
        """The episode's metrics row (keys ``EPISODE_KEYS``)."""
        self.terminated, self.truncated = bool(terminated), bool(truncated)
        n = self.steps
        pol, exp = np.asarray(self.policy_steer), np.asarray(self.expert_steer)
        off = int(n - np.sum(self.on_track))
        lat_ms = np.asarray(self.latency_s) * 1e3
        return {
            "seed": self.seed,
            "return": self.episode_return,
            "length": n,
            "completion": self.completion,
            "lap_completed": self.lap_completed,
            "terminated": self.terminated,
            "truncated": self.truncated,
            "off_track_steps": off,
            "off_track_fraction": off / n if n else 0.0,
            "steer_mae": float(np.mean(np.abs(pol - exp))) if n else float("nan"),
            "steer_mse": float(np.mean((pol - exp) ** 2)) if n else float("nan"),
            "steer_jerk": float(np.mean(np.abs(np.diff(pol, 2)))) if n > 2 else 0.0,
            "steer_smoothness": float(np.mean(np.abs(np.diff(pol)))) if n > 1 else 0.0,
            "expert_steer_smoothness": float(np.mean(np.abs(np.diff(exp)))) if n > 1 else 0.0,
            "mean_speed": float(np.mean(self.speed)) if n else 0.0,
            "latency_median_ms": _percentile(lat_ms, 50),
            "latency_p95_ms": _percentile(lat_ms, 95),
            "wall_seconds": float(wall_seconds),
            "video": video,
            **{k: v for k, v in self.env_meta.items() if k != "lap_complete"},
            **({"wrong_way_steps": self.wrong_way_steps} if self.spec.wrong_way is not None else {}),
            **self._lane_keeping(n),
            **({"path_trace": self.path_trace} if self.path_trace is not None else {}),
        }

    def _lane_keeping(self, n: int) -> dict[str, Any]:
        """Interventions and NVIDIA's autonomy (100 * (1 - interventions * cost / elapsed s)), lateral error."""
        out: dict[str, Any] = {}
        if self.spec.recover is not None:
            elapsed = float(self.env_meta.get("elapsed_s", n * self.spec.dt))  # a replay's recorded time
            out["interventions"] = self.interventions
            if self.spec.stall is not None:
                out["stalls"] = self.stalls
            out["autonomy"] = autonomy(self.interventions, elapsed, self.spec.intervention_cost_s)
            out["interventions_per_100s"] = per_100s(self.interventions, elapsed)
            if "straight_interventions" in self.env_meta:  # a replay's trivial reference on the same frames
                out["straight_autonomy"] = autonomy(self.env_meta["straight_interventions"], elapsed,
                                                    self.spec.intervention_cost_s)
                out["straight_interventions_per_100s"] = per_100s(self.env_meta["straight_interventions"], elapsed)
        if self.spec.lateral_error is not None:
            err = np.asarray(self.lateral_error)
            out["mean_abs_cte"] = float(err.mean()) if len(err) else float("nan")
            out["max_abs_cte"] = float(err.max()) if len(err) else float("nan")
        return out


def aggregate(episodes: Sequence[dict[str, Any]], latencies_ms: Sequence[float] = (), *, groups: bool = True,
              **meta: Any) -> dict[str, Any]:
    """Summary over episode rows -> the ``metrics.json`` dict.

    ``latencies_ms``: every step's latency pooled over all episodes (the median/p95 of the run, not a
    mean of per-episode medians). ``meta`` (policy name, seeds, config, ...) is stored as given. Episodes
    that record a theme or a condition (udacity envs) are also summarised per theme and per condition
    (``by_theme``, ``by_condition``: GROUP_KEYS of each group), unless ``groups`` is False.
    """
    returns = np.asarray([e["return"] for e in episodes], dtype=np.float64)
    out: dict[str, Any] = dict(meta)
    out.update(
        num_episodes=len(episodes),
        mean_return=float(returns.mean()) if len(returns) else float("nan"),
        std_return=float(returns.std()) if len(returns) else float("nan"),
        min_return=float(returns.min()) if len(returns) else float("nan"),
        max_return=float(returns.max()) if len(returns) else float("nan"),
        laps_completed=int(sum(bool(e["lap_completed"]) for e in episodes)),
    )
    for key in [k for k, m in METRICS.items() if m.mean]:
        if episodes and key not in episodes[0]:
            continue
        values = [e[key] for e in episodes if not _isnan(e[key])]
        out[f"mean_{key}"] = float(np.mean(values)) if values else float("nan")
    if episodes and "interventions" in episodes[0]:  # over the whole run, as NVIDIA reports it
        out["total_interventions"] = int(sum(e["interventions"] for e in episodes))
        elapsed = sum(float(e.get("elapsed_s", e["length"] * float(meta.get("dt", float("nan"))))) for e in episodes)
        cost = float(meta.get("intervention_cost_s", 6.0))
        out["autonomy"] = autonomy(out["total_interventions"], elapsed, cost)
        out["interventions_per_100s"] = per_100s(out["total_interventions"], elapsed)
        if "straight_interventions" in episodes[0]:
            straight = int(sum(e["straight_interventions"] for e in episodes))
            out.update(straight_interventions=straight, straight_autonomy=autonomy(straight, elapsed, cost),
                       straight_interventions_per_100s=per_100s(straight, elapsed), elapsed_s=elapsed)
        out["max_abs_cte"] = float(max(e["max_abs_cte"] for e in episodes)) if "max_abs_cte" in episodes[0] else None
    out["std_completion"] = float(np.std([e["completion"] for e in episodes])) if episodes else float("nan")
    laps = sum(float(e["completion"]) for e in episodes)
    if "dt" in meta and laps > 0:  # driving time per lap of the course (completion counts laps and their fractions)
        out["seconds_per_lap"] = sum(e["length"] for e in episodes) * float(meta["dt"]) / laps
    for key in ("theme", "condition"):
        if groups and episodes and key in episodes[0]:
            out[f"by_{key}"] = _by(episodes, key, meta)
    lat = list(latencies_ms)
    out["latency_median_ms"] = _percentile(lat, 50)
    out["latency_p95_ms"] = _percentile(lat, 95)
    out["latency_steps"] = len(lat)
    out["episodes"] = list(episodes)
    return out


# a group's own figures (besides the mean_<key> of the metrics declared group=True)
GROUP_KEYS: tuple[str, ...] = (
    "num_episodes", "mean_return", "laps_completed", "autonomy", "total_interventions", "seconds_per_lap",
)


def _by(episodes: Sequence[dict[str, Any]], key: str, meta: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """GROUP_KEYS and the group metrics of the episodes grouped by their `key` (theme or condition), groups in
    first-seen order."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for e in episodes:
        groups.setdefault(str(e[key]), []).append(e)
    units = {k: meta[k] for k in ("dt", "intervention_cost_s") if k in meta}
    kept = {*GROUP_KEYS, *(f"mean_{k}" for k, m in METRICS.items() if m.group)}
    return {name: {k: v for k, v in aggregate(eps, groups=False, **units).items() if k in kept}
            for name, eps in groups.items()}


def group_lines(summary: dict[str, Any]) -> list[str]:
    """One line per theme and per condition of a summary (empty when the episodes record neither)."""
    lines = []
    for key in ("theme", "condition"):
        for name, g in (summary.get(f"by_{key}") or {}).items():
            parts = [f"{g['num_episodes']} ep", f"return {g['mean_return']:.1f}"]
            if "autonomy" in g:
                parts += [f"autonomy {g['autonomy']:.1f} %", f"{g['total_interventions']} interventions",
                          f"|CTE| {g['mean_mean_abs_cte']:.2f} m"]
            if "mean_mean_speed" in g:
                parts.append(f"{g['mean_mean_speed']:.1f} m/s")
            if "seconds_per_lap" in g:
                parts.append(f"{g['seconds_per_lap']:.0f} s/lap")
            lines.append(f"  {key} {name}: " + ", ".join(parts))
    return lines


def _isnan(x: Any) -> bool:
    return isinstance(x, float) and math.isnan(x)


def write_episodes_csv(path: str | Path, episodes: Sequence[dict[str, Any]]) -> Path:
    buf = io.StringIO()
    extra = list(dict.fromkeys(k for e in episodes for k in e if k not in EPISODE_KEYS))  # the env's own columns
    writer = csv.DictWriter(buf, fieldnames=[*EPISODE_KEYS, *extra], extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for e in episodes:
        writer.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in e.items()})
    return atomic_write_text(Path(path), buf.getvalue())


def write_tensorboard(logdir: str | Path, summary: dict[str, Any]) -> Path:
    """``eval/<metric>`` per episode (step = episode index) and ``eval/mean_<metric>`` summaries (step 0).

    A stop signal meanwhile is raised once the writer is closed: raised inside its queue code, it left the
    writer's thread waiting and ``close()`` with it (see ``stops_at_safe_points``)."""
    from torch.utils.tensorboard import SummaryWriter

    logdir = Path(logdir)
    with stops_at_safe_points():
        writer = SummaryWriter(str(logdir))
        try:
            curves = [k for k, m in METRICS.items() if m.curve]
            for i, e in enumerate(summary["episodes"]):
                for key in curves:
                    if key in e and not _isnan(e[key]):
                        writer.add_scalar(f"eval/{key}", float(e[key]), i)
            for key, value in summary.items():
                if (key.startswith(("mean_", "std_", "latency_")) or key == "laps_completed") \
                        and isinstance(value, (int, float)) and not _isnan(float(value)):
                    writer.add_scalar(f"eval/{key}", float(value), 0)
        finally:
            writer.close()
    return logdir


def write_run(out_dir: str | Path, summary: dict[str, Any], *, tensorboard: bool = True) -> None:
    """metrics.json + episodes.csv (+ tb/) for one evaluated policy. When ``out_dir`` can no longer be written (a
    full disk), the two files go to a new temp folder and a one-line ValueError names it: driven episodes are kept."""
    out_dir = Path(out_dir)
    try:
        write_json(out_dir / "metrics.json", summary)
        write_episodes_csv(out_dir / "episodes.csv", summary["episodes"])
    except OSError as e:
        fallback = Path(tempfile.mkdtemp(prefix="evaluate-unsaved-"))
        write_json(fallback / "metrics.json", summary)
        write_episodes_csv(fallback / "episodes.csv", summary["episodes"])
        raise ValueError(f"cannot write the results into {str(out_dir)!r} ({e.strerror or e}); the "
                         f"{len(summary['episodes'])} driven episode(s) are saved in {str(fallback)!r}") from None
    if tensorboard:
        write_tensorboard(out_dir / "tb", summary)


def _pm(mean: float, std: float, fmt: str) -> str:
    return "n/a" if _isnan(mean) else f"{mean:{fmt}} ± {std:{fmt}}"


def _num(x: float, fmt: str) -> str:
    return "n/a" if x is None or _isnan(x) else f"{x:{fmt}}"


def _table(columns: Sequence[Column], rows: Sequence[tuple[str, dict[str, Any]]]) -> list[str]:
    lines = ["| policy | " + " | ".join(c.header for c in columns) + " |", "|" + "---|" * (len(columns) + 1)]
    return lines + [f"| {name} | " + " | ".join(c.cell(s) for c in columns) + " |" for name, s in rows]


def lane_keeping_markdown(rows: Sequence[tuple[str, dict[str, Any]]]) -> str:
    """The lane-keeping table (udacity): autonomy and interventions first, then lateral error and steering. A
    replay's table (its own columns: no laps, as a part of a recording is driven once, to its end; steering compared
    with its path controller) ends with always-straight."""
    replay = bool(rows) and "straight_autonomy" in rows[0][1]
    shown = columns("replay" if replay else "lane")
    lines = _table(shown, rows)
    if replay:  # the trivial reference on the same frames
        s = rows[0][1]
        lines.append(f"| always-straight (reference) | {_num(s['straight_autonomy'], '.2f')} "
                     f"| {s['straight_interventions']} | {_num(s['straight_interventions_per_100s'], '.1f')} "
                     + "| " * (len(shown) - 3) + "|")
    cost = float(rows[0][1].get("intervention_cost_s", 6.0)) if rows else 6.0
    return "\n".join(lines) + f"\n\n{autonomy_formula(cost)}.\n"


def paired_keys(summary: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    """(episode key, format) of the figures compared per pair, the headline first: autonomy for lane-keeping
    summaries, return for racing ones."""
    return tuple((c.metric, c.format) for c in columns("lane pairs" if "autonomy" in summary else "race pairs"))


def paired_differences(base: list[dict[str, Any]], other: list[dict[str, Any]], key: str) -> tuple[float, float, int]:
    """(mean, standard error, n) of other - base per episode, over the seeds both drove: the same track for both
    policies, so a track's own difficulty cancels out of the difference."""
    by_seed = {e["seed"]: e for e in base if e.get(key) is not None}
    d = np.asarray([e[key] - by_seed[e["seed"]][key] for e in other
                    if e["seed"] in by_seed and e.get(key) is not None], dtype=np.float64)
    d = d[~np.isnan(d)]
    if len(d) == 0:
        return float("nan"), float("nan"), 0
    se = float(d.std(ddof=1) / math.sqrt(len(d))) if len(d) > 1 else float("nan")
    return float(d.mean()), se, len(d)


def paired_markdown(rows: Sequence[tuple[str, dict[str, Any]]]) -> str:
    """Each policy minus the first, per episode on the same seeds (all episodes, then each theme when recorded):
    mean (standard error). Empty for fewer than two policies or summaries without their episodes."""
    if len(rows) < 2 or any(not isinstance(s.get("episodes"), list) for _, s in rows):
        return ""
    keys = paired_keys(rows[0][1])
    base_name, base = rows[0][0], rows[0][1]["episodes"]
    groups = ["all"] + list(dict.fromkeys(str(e["theme"]) for e in base if "theme" in e))
    lines = [f"\n## Paired differences: each policy minus {base_name}\n",
             "Per episode on the same seeds, mean (standard error)"
             + ("; autonomy is per episode here.\n" if "autonomy" in dict(keys) else ".\n"),
             "| policy | episodes | n | " + " | ".join(k for k, _ in keys) + " |", "|" + "---|" * (len(keys) + 3)]
    for name, s in rows[1:]:
        for g in groups:
            pick = (lambda e: True) if g == "all" else (lambda e, g=g: str(e.get("theme")) == g)
            b, o = [e for e in base if pick(e)], [e for e in s["episodes"] if pick(e)]
            cells, n = [], 0
            for k, fmt in keys:
                m, se, n_k = paired_differences(b, o, k)
                n = max(n, n_k)
                cells.append("n/a" if n_k == 0 else f"{m:+{fmt}} ({_num(se, fmt)})")
            lines.append(f"| {name} | {g} | {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def comparison_markdown(rows: Sequence[tuple[str, dict[str, Any]]]) -> str:
    """One markdown table, one row per (name, metrics.json summary), all on the same seeds, then the paired
    differences against the first."""
    return _summary_markdown(rows) + paired_markdown(rows)


def _summary_markdown(rows: Sequence[tuple[str, dict[str, Any]]]) -> str:
    if rows and "autonomy" in rows[0][1]:
        return lane_keeping_markdown(rows)
    return "\n".join(_table(columns("race"), rows)) + "\n"
