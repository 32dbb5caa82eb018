"""What collect.py is asked to record (CollectConfig), checked before anything heavy is imported, and the
error it answers bad requests with (CollectError: one line, exit 2)."""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.workers import MAX_WORKERS, check_workers
from common.cli import check_choices, option
from driving_data.dataset import CARD_NAME, REPLAY_PREFIX
from envs.registry import ENV_NAMES, EnvSpec, SeedRanges, get_spec
from envs.replay.options import check_replay_options, parse_span, replay_span_option
from policies.actions import DISCRETE_ACTION_RULES, check_temperature

DEFAULT_SEED = SeedRanges().collect  # 3,000,000
# CarRacing's DART defaults (envs.carracing.SPEC) are as much perturbation as keeps most of the shipped experts'
# laps finished: enough to leave the ideal line and recover, not so much that the episodes stop being good driving.
# Short holds barely move the car (the steering joint low-passes the noise). Discrete needs less: any non-gas action
# cuts the gas, which ramps back at 0.1/frame.
DEFAULT_EPISODES = 25


def _per_env_defaults(what: str, attribute: str, meaning: str = "") -> str:
    """Help text naming each env's default for a per-env collection setting."""
    per_env = "; ".join(f"{e}: " + ", ".join(f"{v} {k}" for k, v in getattr(get_spec(e), attribute).items())
                        for e in ENV_NAMES)
    return f"{what} (default: the existing dataset's, else {per_env})" + (f": {meaning}" if meaning else "")


def existing_action_space(out: str | Path | None) -> str | None:
    """The action space named by the card of an existing --out dataset (None when there is none), so that a
    DAgger round appended to a discrete dataset needs no --action-space."""
    card = Path(out) / CARD_NAME if out is not None else None
    if card is None or not card.is_file():
        return None
    try:
        return json.loads(card.read_text()).get("action_space")
    except (OSError, ValueError):
        return None  # a broken card is reported later, with the rest of the dataset checks


class CollectError(ValueError):
    """A request collect.py refuses (bad argument, incompatible existing dataset); exit code 2."""


@dataclass
class CollectConfig:
    """Everything that decides what gets recorded. None means: the existing dataset's value, else the default."""

    env: str = option("carracing", f"environment: {' | '.join(ENV_NAMES)} | replay:FOLDER (a dataset's recording "
                      "replayed in closed loop, each state labelled by its path controller: DAgger data from a "
                      "recording)", group="where it drives")
    action_space: str | None = option(None, "continuous | discrete (discrete: carracing only) (default: the existing "
                                      "dataset's, else the env's first, continuous)", group="where it drives")
    episodes: int = option(DEFAULT_EPISODES, "episodes to ADD in this run", group="where it drives")
    max_steps: int | None = option(None, "steps per episode before truncation (default: the env's, carracing 1000)",
                                   group="where it drives")
    seed: int | None = option(None, f"first track seed (default: the existing dataset's, else {DEFAULT_SEED})",
                              group="where it drives")
    noise: float | None = option(None, "", group="data", help_from=lambda: _per_env_defaults(
        "DART noise on the executed action", "default_noise",
        "continuous = std of Gaussian noise on steer and throttle; discrete = probability of a random other action"))
    noise_hold: int | None = option(None, "", group="data", help_from=lambda: _per_env_defaults(
        "frames each noise sample is held", "default_noise_hold"))
    expert: Path | None = option(None, "SB3 PPO .zip (default: the env's shipped expert in checkpoints/)",
                                 group="what drives")
    out: Path | None = option(None, "dataset folder (default: data/carracing_<action-space> or data/udacity); an "
                              "existing one is appended to", group="output")
    early_stop: bool = option(True, "end an episode once the car is stuck (stopped 1 s) or off road for 5 s "
                              "(--no-early-stop records full episodes)", group="data")
    cut_wrong_way: bool = option(False, "end an episode once the car has pointed against the course for 1 s and "
                                 "drop that stretch: after a DAgger student's spin the expert, which never learnt "
                                 "those states, steers or brakes where the camera shows what looks like a road "
                                 "driven forwards", group="data")
    progress: bool = option(True, "a progress bar on stderr when it is a terminal (none in a log file)",
                            group="runtime")
    driver: Path | None = option(None, "DAgger: this trained policy (train.py checkpoint) drives and the expert "
                                 "labels every frame it sees; append the episodes to the dataset and retrain on all "
                                 "of it (default: the expert drives)", group="what drives", metavar="CKPT")
    beta: float = option(0.0, "DAgger mixture: probability per step that the expert's action is executed instead "
                         "of the --driver's", group="what drives")
    driver_actions: str | None = option(
        None, "how a discrete --driver picks its action: argmax (the likeliest) | sample (from its softmax, seeded "
        "by the track seed) | dither (each action as often as its probability over consecutive steps, "
        "deterministic), as evaluate.py --discrete-actions (default: the rule the checkpoint was trained to drive "
        "with, train.py --discrete-actions; argmax if it names none)", group="what drives",
        choices=DISCRETE_ACTION_RULES)
    driver_temperature: float | None = option(
        None, "sample / dither drivers: draw from the softmax raised to 1/T (T > 1 flatter, T < 1 greedier), as "
        "evaluate.py --action-temperature (default: the checkpoint's own, train.py --action-temperature, when it "
        "drives by its own rule; 1 when --driver-actions names another)", group="what drives", metavar="T")
    renderer: str | None = option(None, "", group="where it drives", help_from=lambda: (
        "who draws the camera frames: " + "; ".join(f"{e}: {' | '.join(get_spec(e).renderers)}" for e in ENV_NAMES)
        + " (default: the first, the reference). carracing fast = OpenCV, about 12x gymnasium's pygame, frames "
        "within a fraction of a grey level; recorded per episode"))
    workers: int | None = option(None, "episodes recorded at the same time, one process each; the dataset is the "
                                 "one a single process records (default: one per CPU core, at most "
                                 f"{MAX_WORKERS} and at most --episodes; 1 = everything in this process)",
                                 group="runtime")
    shard: tuple[int, int] | str | None = option(
        None, "collect only the I-th of N contiguous, disjoint parts of this run's seeds (--seed, --episodes are the "
        "whole run's) into OUT-shard-I-of-N, e.g. one part per machine; the N parts together are exactly the run, "
        "merged with python -m agent.data.merge. A re-run completes the shard (default: the whole run)",
        group="runtime", metavar="I/N", parse=lambda text: parse_shard(text))
    recovery_labels: bool = option(
        False, "in the states the expert never learnt (carracing: pointing against the course, or the car's centre "
        "more than 2 half-widths off the centerline) the env's recovery teacher labels instead, turning the car "
        "round / back to the road; each step records who labelled it (label_source: 0 expert, 1 recovery) and the "
        "card the counts. For DAgger rounds whose students spin", group="data")
    recovery_starts: float = option(
        0.0, "probability that an episode starts with the car placed off its usual start, drawn from the track "
        "seed: carracing: standing anywhere on the lap, turned by any heading, shifted up to the road's edge; "
        "udacity: off-centre in its lane, turned up to 0.3 rad, at 0 to the target speed", group="data", metavar="P")
    theme: str | None = option(None, "envs with scenes (udacity-hard): comma-separated themes the episodes draw "
                               "from by seed (default: the training themes, lake,jungle; mountain is held out for "
                               "evaluation)", group="where it drives", metavar="NAMES")
    condition: str | None = option(None, "envs with scenes: comma-separated lighting/weather conditions (default: "
                                   "the training ones, clear,overcast,dusk; fog is held out)", group="where it drives",
                                   metavar="NAMES")
    replay_span: str | None = replay_span_option()  # 0:0.8 keeps DAgger rounds off the part train.py holds out
    latency_steps: int = option(0, "every executed action reaches the env D steps after it was chosen (the env's "
                                "neutral action until the first arrives): DAgger under latency, the --driver told "
                                "D; train on the result with train.py --latency-steps", group="where it drives",
                                metavar="D")
    allow_held_out: bool = option(False, "record held-out themes or conditions too (default: refused, so that "
                                  "evaluation on them measures generalisation to scenes never trained on)",
                                  group="where it drives")

    def validate(self) -> None:
        """Check the arguments before anything heavy is imported or any file is touched."""
        try:
            check_choices(self)
            spec = get_spec(self.env)
        except ValueError as e:
            raise CollectError(str(e)) from None
        if self.action_space is None:  # appending: the dataset's own action space, else the env's first
            self.action_space = existing_action_space(self.out) or spec.action_spaces[0]
        if self.action_space not in spec.action_spaces:
            raise CollectError(f"--action-space must be one of {list(spec.action_spaces)} for {self.env}, "
                               f"got {self.action_space!r}")
        if self.max_steps is None:
            self.max_steps = spec.default_max_steps
        try:
            self.renderer = spec.check_renderer(self.renderer)
            if self.workers is not None:
                check_workers(self.workers)
            if isinstance(self.shard, str):
                self.shard = parse_shard(self.shard)
        except ValueError as e:
            raise CollectError(str(e)) from None
        self._check_counts()
        self._check_recovery(spec)
        self._check_replay_span()
        try:
            spec.scene(self.theme, self.condition, collect=True, allow_held_out=self.allow_held_out)
        except ValueError as e:
            raise CollectError(str(e)) from None
        if self.noise_hold is not None and self.noise_hold < 1:
            raise CollectError(f"--noise-hold must be >= 1 frame, got {self.noise_hold}")
        if not (math.isfinite(self.beta) and 0.0 <= self.beta <= 1.0):
            raise CollectError(f"--beta is a probability, must be in [0, 1], got {self.beta}")
        if self.beta > 0 and self.driver is None:
            raise CollectError("--beta mixes the expert into a --driver's driving; give --driver CKPT too")
        if self.cut_wrong_way and spec.wrong_way is None:
            raise CollectError(f"--cut-wrong-way needs an env that knows the course's direction; {self.env} does not")
        if self.cut_wrong_way and self.recovery_labels:
            raise CollectError("--cut-wrong-way drops the states --recovery-labels labels (pointing against the "
                               "course); choose one")
        self._check_driver()
        out = self.out_dir
        if out.exists() and not out.is_dir():
            raise CollectError(f"--out {str(out)!r} is a file; expected a dataset folder (new or from collect.py)")
        if self.expert is not None:
            from common.files import REPO_ROOT

            p = Path(self.expert)
            if not (p.is_file() or (not p.is_absolute() and (REPO_ROOT / p).is_file())):
                raise CollectError(f"--expert file not found: {str(p)!r} (expected an SB3 PPO .zip from "
                                   "python -m agent.experts.ppo)")

    def _check_counts(self) -> None:
        """Shards, episodes, steps, latency, seed and noise: numbers in their ranges."""
        if self.shard is not None:
            i, n = self.shard
            if not (1 <= i <= n):
                raise CollectError(f"--shard I/N needs 1 <= I <= N, got {i}/{n}")
            if self.episodes < n:
                raise CollectError(f"--shard {i}/{n} splits the run's --episodes {self.episodes} into {n} parts; "
                                   f"give --episodes >= {n}")
        if self.episodes < 1:
            raise CollectError(f"--episodes must be >= 1 (episodes to add), got {self.episodes}")
        if self.max_steps < 1:
            raise CollectError(f"--max-steps must be >= 1, got {self.max_steps}")
        if not 0 <= self.latency_steps < self.max_steps:
            raise CollectError(f"--latency-steps must be in [0, --max-steps {self.max_steps}), "
                               f"got {self.latency_steps}")
        if self.seed is not None and self.seed < 0:
            raise CollectError(f"--seed must be >= 0 (first track seed), got {self.seed}")
        if self.noise is not None:
            if not math.isfinite(self.noise) or self.noise < 0:
                raise CollectError(f"--noise must be a finite number >= 0, got {self.noise}")
            if self.action_space == "discrete" and self.noise > 1:
                raise CollectError("--noise is a probability for the discrete action space, must be in "
                                   f"[0, 1], got {self.noise}")

    def _check_replay_span(self) -> None:
        if self.replay_span is None:
            return
        if not self.env.startswith(REPLAY_PREFIX):
            raise CollectError(f"--replay-span is the driven part of a recording; --env {self.env} is not a replay "
                               "(--env replay:FOLDER)")
        try:
            check_replay_options(self.replay_span)
        except ValueError as e:
            raise CollectError(str(e)) from None

    def _check_driver(self) -> None:
        """The DAgger options: each needs --driver, and the driver's file must exist."""
        if self.driver_actions is not None and self.driver is None:
            raise CollectError("--driver-actions says how a --driver picks its actions; give --driver CKPT too")
        if self.driver_temperature is not None:
            if self.driver is None:
                raise CollectError("--driver-temperature says how a --driver samples its "
                                   "actions; give --driver CKPT too")
            try:
                check_temperature(self.driver_temperature, self.driver_actions or "sample")
            except ValueError as e:
                raise CollectError(f"--driver-temperature: {e}") from None
        if self.driver is not None and not Path(self.driver).is_file():
            raise CollectError(f"--driver file not found: {str(self.driver)!r} (expected a policy "
                               "checkpoint from train.py)")

    def _check_recovery(self, spec: EnvSpec) -> None:
        if self.recovery_labels and spec.recovery_teacher is None:
            raise CollectError(f"--recovery-labels needs an env with a recovery teacher; {self.env} has none "
                               "(EnvSpec.recovery_teacher)")
        if not (math.isfinite(self.recovery_starts) and 0.0 <= self.recovery_starts <= 1.0):
            raise CollectError(f"--recovery-starts is a probability, must be in [0, 1], got {self.recovery_starts}")
        if self.recovery_starts > 0 and spec.recovery_start is None:
            raise CollectError(f"--recovery-starts needs an env that can place its car; {self.env} cannot "
                               "(EnvSpec.recovery_start)")

    @property
    def spec(self) -> EnvSpec:
        return get_spec(self.env)

    @property
    def out_dir(self) -> Path:
        """--out (default: the env's data folder); a shard writes into OUT-shard-I-of-N, so that the N shards of
        one command line never collide and can be copied side by side and merged."""
        out = Path(self.out) if self.out is not None else self.spec.default_out(self.action_space or
                                                                                self.spec.action_spaces[0])
        if self.shard is not None and not isinstance(self.shard, str):
            out = Path(f"{out}-shard-{self.shard[0]}-of-{self.shard[1]}")
        return out


@dataclass(frozen=True)
class Drives:
    """What drives: the expert that labels every frame (None: the env's shipped one) and, for DAgger, the student
    that drives instead, the expert's action executed with probability ``beta``."""

    expert: Path | None
    driver: Path | None
    beta: float
    driver_actions: str | None  # None: the checkpoint's own rule
    driver_temperature: float | None  # None: the checkpoint's own


@dataclass(frozen=True)
class Tracks:
    """Where it drives: the env and action space, the tracks (first seed asked for, episodes to add, this shard's
    part), the steps per episode, the renderer, the scenes and the latency of every action."""

    env: str
    action_space: str
    seed: int | None  # None: the dataset's rule when appending, else the env's collection seeds
    episodes: int
    shard: tuple[int, int] | None
    max_steps: int
    renderer: str
    scene: dict[str, Any]  # make()'s themes and conditions, and a replay's span (EnvSpec.scene)
    latency_steps: int

    @property
    def spec(self) -> EnvSpec:
        return get_spec(self.env)


@dataclass(frozen=True)
class Recorded:
    """How the episodes are recorded: DART noise (None: the dataset's when appending, else the env's default),
    when an episode ends early, and the recovery labels and starts."""

    noise: float | None
    noise_hold: int | None
    early_stop: bool
    cut_wrong_way: bool
    recovery_labels: bool
    recovery_starts: float


@dataclass(frozen=True)
class CollectPlan:
    """A checked CollectConfig, resolved once: nothing after ``resolve`` reads the arguments."""

    drives: Drives
    where: Tracks
    recorded: Recorded
    out: Path  # the dataset folder (a shard's OUT-shard-I-of-N)
    workers: int | None  # None: one per CPU core, at most the episodes
    progress: bool


def resolve(cfg: CollectConfig) -> CollectPlan:
    """The arguments checked (CollectError, one line) and turned into the run's plan, every default the dataset
    does not decide filled in."""
    cfg.validate()
    spec = cfg.spec
    scene = {**spec.scene(cfg.theme, cfg.condition, collect=True, allow_held_out=cfg.allow_held_out),
             **({"span": parse_span(cfg.replay_span)} if cfg.replay_span is not None else {})}  # a replay's part
    return CollectPlan(
        Drives(cfg.expert, cfg.driver, cfg.beta, cfg.driver_actions, cfg.driver_temperature),
        Tracks(cfg.env, cfg.action_space, cfg.seed, cfg.episodes, cfg.shard, cfg.max_steps, cfg.renderer, scene,
               cfg.latency_steps),
        Recorded(cfg.noise, cfg.noise_hold, cfg.early_stop, cfg.cut_wrong_way, cfg.recovery_labels,
                 cfg.recovery_starts),
        cfg.out_dir, cfg.workers, cfg.progress)


def parse_shard(text: str) -> tuple[int, int]:
    """"I/N" -> (I, N): the I-th (1-based) of N disjoint seed ranges (collect.py --shard)."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(text))
    if not m:
        raise ValueError(f"--shard must look like I/N (the I-th of N seed ranges, e.g. 2/4), got {text!r}")
    i, n = int(m[1]), int(m[2])
    if not (1 <= i <= n):
        raise ValueError(f"--shard I/N needs 1 <= I <= N, got {text!r}")
    return i, n


def shard_range(episodes: int, index: int, count: int) -> tuple[int, int]:
    """Tracks [a, b) of a run of `episodes` that shard `index` of `count` records: contiguous, disjoint,
    together exactly 0..episodes-1, sizes differing by at most one."""
    return (index - 1) * episodes // count, index * episodes // count
