"""What collect.py is asked to record (CollectConfig), checked before anything heavy is imported, and the
error it answers bad requests with (CollectError: one line, exit 2)."""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from agent.data.dataset import CARD_NAME
from agent.workers import check_workers
from envs.registry import EnvSpec, SeedRanges, get_spec
from policies.actions import DISCRETE_ACTION_RULES, check_temperature

DEFAULT_SEED = SeedRanges().collect  # 3,000,000
# CarRacing's DART defaults (envs.carracing.SPEC) were measured with the shipped experts (physics-only, 8 tracks 3000000..3000007), mean return / laps:
#   continuous (PPO fine-tuned, f7069f6)  noise 0: 933/8   0.05 hold 5: 932/8   0.07 hold 5: 927/7
#                                         0.1 hold 2: 930/8   0.1 hold 3: 917/5   0.1 hold 5: 873/3
#   discrete   (5ebefee)                  noise 0: 919/8   0.05 hold 3: 902/7
#   (earlier interim experts, 4 tracks: continuous 0.2 hold 5: 864, 1/4 laps; discrete 0.1 hold 1: 694, 0/4)
# i.e. as much perturbation as keeps most laps finished: enough to leave the ideal line and recover, not so
# much that the episodes stop being good driving. Short holds barely move the car (the steering joint
# low-passes the noise). Discrete needs less: any non-gas action cuts the gas, which ramps back at 0.1/frame.
DEFAULT_EPISODES = 25


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

    env: str = "carracing"
    action_space: str | None = None  # default: the env's first
    episodes: int = DEFAULT_EPISODES
    max_steps: int | None = None  # default: the env's
    seed: int | None = None
    noise: float | None = None
    noise_hold: int | None = None
    expert: Path | None = None
    out: Path | None = None
    early_stop: bool = True
    cut_wrong_way: bool = False  # end an episode after 1 s pointing against the course, that stretch cut
    progress: bool = True
    driver: Path | None = None  # DAgger: a policy checkpoint that drives while the expert labels
    beta: float = 0.0  # DAgger: probability per step that the expert's action is executed instead
    driver_actions: str | None = None  # DAgger, discrete students: argmax | sample | dither (policies.actions.DISCRETE_ACTION_RULES); None: the checkpoint's own
    driver_temperature: float | None = None  # DAgger, sample / dither drivers: softmax temperature; None: the checkpoint's own
    renderer: str | None = None  # who draws the frames (the spec's renderers; default: its first, the reference)
    workers: int | None = None  # processes recording episodes (default: agent.workers.default_workers)
    shard: tuple[int, int] | str | None = None  # (I, N) or "I/N": only the I-th of N seed ranges of this run
    recovery_labels: bool = False  # the spec's recovery teacher labels the states it needs (agent.data.recorder)
    recovery_starts: float = 0.0  # probability that an episode starts placed turned and shifted (a recovery start)
    theme: str | None = None  # "a,b": the themes episodes draw from by seed (envs with scenes; default: the train ones)
    condition: str | None = None  # "a,b": the lighting / weather conditions likewise
    allow_held_out: bool = False  # record held-out themes / conditions too (they are kept for evaluation)

    def validate(self) -> None:
        """Check the arguments before anything heavy is imported or any file is touched."""
        try:
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
        if self.seed is not None and self.seed < 0:
            raise CollectError(f"--seed must be >= 0 (first track seed), got {self.seed}")
        if self.noise is not None:
            if not math.isfinite(self.noise) or self.noise < 0:
                raise CollectError(f"--noise must be a finite number >= 0, got {self.noise}")
            if self.action_space == "discrete" and self.noise > 1:
                raise CollectError(f"--noise is a probability for the discrete action space, must be in [0, 1], got {self.noise}")
        self._check_recovery(spec)
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
        if self.driver_actions is not None and self.driver_actions not in DISCRETE_ACTION_RULES:
            raise CollectError(f"--driver-actions must be one of {DISCRETE_ACTION_RULES}, got {self.driver_actions!r}")
        if self.driver_actions is not None and self.driver is None:
            raise CollectError("--driver-actions says how a --driver picks its actions; give --driver CKPT too")
        if self.driver_temperature is not None:
            if self.driver is None:
                raise CollectError("--driver-temperature says how a --driver samples its actions; give --driver CKPT too")
            try:
                check_temperature(self.driver_temperature, self.driver_actions or "sample")
            except ValueError as e:
                raise CollectError(f"--driver-temperature: {e}") from None
        if self.driver is not None and not Path(self.driver).is_file():
            raise CollectError(f"--driver file not found: {str(self.driver)!r} (expected a policy checkpoint from train.py)")
        out = self.out_dir
        if out.exists() and not out.is_dir():
            raise CollectError(f"--out {str(out)!r} is a file; expected a dataset folder (new or from collect.py)")
        if self.expert is not None:
            from common.files import REPO_ROOT

            p = Path(self.expert)
            if not (p.is_file() or (not p.is_absolute() and (REPO_ROOT / p).is_file())):
                raise CollectError(f"--expert file not found: {str(p)!r} (expected an SB3 PPO .zip from python -m agent.experts.ppo)")

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
    """Episodes [a, b) of a run of `episodes` that shard `index` of `count` records: contiguous, disjoint,
    together exactly 0..episodes-1, sizes differing by at most one."""
    return (index - 1) * episodes // count, index * episodes // count
