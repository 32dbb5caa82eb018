"""The small configs evaluation runs on, made once from the checked arguments by ``resolve``: what drives
(Drivers), where and on which tracks (Where), under which conditions (Conditions), what is written (Outputs) and
how it runs (Runtime). Nothing after ``resolve`` reads EvalArgs."""
from __future__ import annotations

import shutil
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from agent.controllers import shipped_checkpoint
from agent.evaluation.args import EvalArgs, check_args, default_out, run_names, safe_name, spared, timing_of
from agent.evaluation.timing import TimingConditions
from agent.workers import default_workers
from common.checks import is_int
from common.files import run_folder
from envs.registry import REPLAY_PREFIX, get_spec
from envs.replay.options import parse_span
from policies.checkpoint import RECORDING_STUDENT


@dataclass(frozen=True)
class Drivers:
    """What drives: the checkpoints and their display names, the expert, and how a student picks its actions."""

    checkpoints: tuple[str, ...]  # closed loop: the default student when none is given; --data: as given
    names: tuple[str, ...]  # --name, folder-safe; (): made from the checkpoints' paths
    expert: str | None  # the expert's .zip; None: the env's shipped one
    expert_drives: bool
    with_expert: bool
    action_space: str | None  # None: the checkpoints'
    discrete_actions: str | None  # None: each checkpoint's own rule
    action_temperature: float | None
    spared: tuple[int, ...]  # the actions --temperature-spares keeps at temperature 1
    spares_given: bool
    pi_speed: bool

    def names_of(self, paths: list[str]) -> list[str]:
        return list(self.names) or run_names(paths)


@dataclass(frozen=True)
class Where:
    """Where it drives: the env (a replay's once its recording is imported) with its options, and the track seeds;
    or, offline, the recordings scored."""

    env: str
    seeds: tuple[int, ...]
    max_steps: int
    renderer: str
    make_kwargs: dict[str, Any]  # the env's options beyond its spec's defaults: scenes, PI speed, a replay's span,
    # max_offset and reference (its --replay-* flags)
    replay: str | None  # the recording as given
    data: tuple[str, ...]  # --data: scored offline
    data_span: tuple[float, float]


@dataclass(frozen=True)
class Conditions:
    """Under which conditions the policies drive: the timing, the window's clock, the latency a student is told."""

    timing: TimingConditions
    window_clock: str
    told_latency_s: float


@dataclass(frozen=True)
class Outputs:
    """What is written, and where."""

    out: Path
    imported: tuple[Path, ...]  # the --replay import made for this run: removed again when the run is refused
    video_episodes: int  # the first N episodes of each policy are recorded (0: none)
    saliency: str | None  # the saliency method overlaid on the students' videos; None: off
    tensorboard: bool
    progress: bool


@dataclass(frozen=True)
class Runtime:
    device: str
    threads: int
    workers: int
    precision: str  # the encoder's arithmetic when --data is scored


@dataclass(frozen=True)
class EvalPlan:
    drivers: Drivers
    track: Where
    conditions: Conditions
    outputs: Outputs
    runtime: Runtime


def resolve(a: EvalArgs, *, claim: ExitStack | None = None) -> EvalPlan:
    """The checked arguments turned into the run's configs: a --replay recording imported once into
    OUT/imported_data and its env made the run's, every default filled. An import made now is removed again when
    the arguments are refused after it (and, by evaluate, when the run is). ``claim``: evaluate.py's; OUT is
    claimed on it (writable, locked, the last run's results cleared) before anything is written into it."""
    check_args(a)  # a bad flag is the likelier mistake: say that before anything about the folder
    students = [] if a.expert_drives or a.data or a.replay else a.checkpoint or [str(shipped_checkpoint(a.env))]
    out = Path(a.out) if a.out else default_out(students, a.name, expert=a.expert_drives or a.with_expert,
                                                    data=bool(a.data), replay=bool(a.replay))
    if claim is not None:
        claim.enter_context(run_folder(out, "evaluate.py"))
        clear_results(out)  # a re-run's results replace the last's
    from driving_data.udacity_import import import_recordings, removed_if_refused

    made: list[Path] = []
    with removed_if_refused(made):
        if a.replay is not None and not a.env.startswith(REPLAY_PREFIX):
            student = [] if a.checkpoint or a.expert_drives else [str(RECORDING_STUDENT)]  # made for real frames
            [folder] = import_recordings([a.replay], [out / "imported_data"], warn=tqdm.write, made=made)
            a = replace(a, env=REPLAY_PREFIX + str(Path(folder).resolve()), checkpoint=a.checkpoint or student)
            check_args(a)
        spec = get_spec(a.env)
        seed, episodes = _seeds(a.seed, a.episodes, spec, a.replay, a.replay_span)
        checkpoints = a.checkpoint if a.expert_drives or a.data else a.checkpoint or [str(shipped_checkpoint(a.env))]
        policies = 1 if a.expert_drives else max(1, len(a.checkpoint)) + bool(a.with_expert)
        threads = a.threads
        told = a.latency_steps if a.told_latency_steps is None else a.told_latency_steps
        return EvalPlan(
            Drivers(tuple(checkpoints), tuple(safe_name(n) for n in a.name), a.expert, a.expert_drives, a.with_expert,
                    a.action_space, a.discrete_actions, a.action_temperature, spared(a.temperature_spares),
                    a.temperature_spares is not None, a.pi_speed),
            Where(a.env, tuple(range(seed, seed + episodes)), a.max_steps or spec.default_max_steps,
                  spec.check_renderer(a.renderer),
                  {**spec.scene(a.theme, a.condition), **({"pi_speed": True} if a.pi_speed else {}),
                   **({"span": a.replay_span, "max_offset": a.replay_max_offset, "reference": a.replay_reference}
                      if spec.parts is not None else {})},  # a replay env's options, its --replay-* flags
                  a.replay, tuple(a.data),
                  parse_span(a.data_span, "--data-span")),
            Conditions(timing_of(a.drop_prob, a.jitter, a.latency_steps), a.window_clock, told * spec.dt),
            Outputs(out, tuple(made), a.video_episodes if a.video else 0,
                    a.saliency_method if a.saliency else None, a.tensorboard, a.progress),
            Runtime(("cuda" if torch.cuda.is_available() else "cpu") if a.device == "auto" else a.device, threads,
                    # processes that run: no more than the episodes (what metrics.json records)
                    default_workers(episodes * policies, threads) if a.workers is None
                    else min(a.workers, episodes * policies), a.precision))


def _seeds(seed: int | None, episodes: int | None, spec: Any, replay: str | None,
           span: str | None) -> tuple[int, int]:
    """(first seed, episodes): the env's first evaluation seed and 5 episodes, or every part of a replay."""
    seed = spec.seeds.evaluate if seed is None else seed
    if spec.parts is None:
        return seed, 5 if episodes is None else episodes
    parts = spec.parts(span)
    if parts == 0:
        from envs.replay.spec import MIN_PART_FRAMES

        raise ValueError(f"--replay {replay!r} has no session of at least {MIN_PART_FRAMES} frames in the span "
                         f"{span or '0:1'} in which the car moves")
    episodes = max(parts - seed, 0) if episodes is None else episodes
    if seed + episodes > parts:
        raise ValueError(f"--replay {replay!r} has {parts} part(s) (seeds 0..{parts - 1}); --seed {seed} "
                         f"--episodes {episodes} asks for more")
    if not is_int(episodes, 1):
        raise ValueError(f"--episodes must be an integer >= 1, got {episodes!r}")
    return seed, episodes


RESULT_FOLDERS = ("videos", "tb", "paths")  # evaluate.py's outputs that a re-run would otherwise add to, not replace
RESULT_FILES = "steering_*.png"
RESULT_MARKS = ("metrics.json", "episodes.csv", "comparison.json", "offline.json")  # a folder evaluate.py wrote


def clear_results(out: Path) -> None:
    """Before evaluate.py writes into ``out``: remove the last run's videos, TensorBoard events and steering plots
    (in ``out`` and its per-policy sub-folders), which this run might not all overwrite; its other files are
    rewritten, and imported recordings are kept for reuse. Only folders that hold evaluate.py's results are touched."""
    for folder in [out, *(p for p in out.iterdir() if p.is_dir() and p.name != "imported_data")]:
        if not any((folder / mark).is_file() for mark in RESULT_MARKS):
            continue
        for name in RESULT_FOLDERS:
            if (folder / name).is_dir() and not (folder / name).is_symlink():
                shutil.rmtree(folder / name)
        for f in folder.glob(RESULT_FILES):
            f.unlink()
