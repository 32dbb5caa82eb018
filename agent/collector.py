"""Record a privileged PPO expert driving a rendered env (CarRacing, udacity) as a behaviour-cloning dataset.

Everything env-specific (how to make it, action names, step time, what to record besides the frame, DART
defaults, seed ranges) comes from the env's `envs.registry.EnvSpec`; this module holds no env names.

What makes this good BC data (and why each piece is here):

* **Labels on the visited state.** Every step stores the frame the car actually saw and the expert's
  action *for that state* (``expert_action``), whatever was executed. A student trained on these labels
  learns what to do in the states it will reach, not only on the expert's ideal line.
* **DART noise** (``noise``): the *executed* action is perturbed, the label is not, so the data shows the
  car drifting off the line and the expert's corrections — the recoveries a pure-expert dataset lacks.
  - continuous: Gaussian noise N(0, noise^2) on steer (env units, [-1, 1]; CarRacing's wheel saturates at
    ±0.4) and, for [steer, gas, brake] actions, on the throttle axis gas − brake, then clipped; gas =
    max(throttle, 0), brake = max(−throttle, 0) so gas and brake are never pressed together (the expert never
    does that either). Steering-only actions (udacity) get the steering noise alone.
  - discrete: with probability ``noise`` a uniformly random *other* action is executed.
  One noise sample is held for ``noise_hold`` frames: at 50 Hz the steering joint slews at most
  0.06 rad/frame, so independent per-frame noise mostly averages out and never moves the car off line.
  The noise generator is seeded from the track seed, so an episode is reproducible. Defaults per env and
  action space are the spec's `default_noise` / `default_noise_hold` (CarRacing measured below).
* **DAgger** (``driver``, ``beta``): a trained student policy drives and the expert labels every frame it
  sees (Ross et al. 2011). BC alone trains on the expert's states; in closed loop the student drifts into
  states it never saw (late for a corner, off the line) and its errors compound. DAgger rounds -- collect
  with the current student, append to the dataset, retrain on everything -- put exactly those states and
  the expert's answers to them in the data. With probability ``beta`` per step the expert's action is
  executed instead of the student's (the mixture policy of the paper), which keeps the car on the track
  longer in early rounds. DART noise still applies to whatever is executed.
* **Track seeds**: episode ``k`` uses track ``seed + k``. The default ``seed`` (the spec's
  ``seeds.collect``, 3,000,000) keeps collection tracks disjoint from the expert's training draws
  [100,000, 2,000,000), its validation tracks 90,000–90,019, its card evaluation tracks 1000–1019 and
  evaluate.py's default tracks 1000.. . Every seed below 100,000 is reserved for evaluation; collecting
  there prints a warning.
* Each episode records what the spec's ``episode_meta`` reads from the last step (lap finished, tiles or
  laps, ...) and the fraction of perturbed steps, so a dataset can be filtered by quality. The spec's
  ``recorded_info`` adds per-step arrays (udacity: the left/right camera frames, throttle, cross-track
  error, heading error), and its ``jpeg_quality`` stores camera frames as JPEG (the three 160x320 cameras
  would take ~460 KB a step raw).

* **Renderer** (``renderer``): who draws the frames, one of the spec's ``renderers`` (CarRacing: gymnasium's
  ``pygame``, the default and the reference, or the ``fast`` OpenCV one of envs/carracing_render.py). Each
  episode's meta and the card's counts record it; one dataset may hold both.

Speed: ``workers`` > 1 records episodes in that many processes (agent.parallel), each with its own env, expert
and student. An episode depends only on its track seed, so the files are byte for byte those of one process;
each worker writes its episode files, this process writes the card (episodes in id order). ``workers`` = 1 is
the plain loop in this process. ``shard`` = (I, N) records only the I-th of N contiguous parts of the run's
seeds (``shard_range``) into ``OUT-shard-I-of-N``, e.g. one part per machine, to be merged afterwards.

Robustness: each episode file and the card are written atomically (agent.demos); Ctrl-C or SIGTERM stops
after discarding the unfinished episode(s); a SIGKILL can leave only a hidden ``.tmp`` that is never read and
is removed by the next run (worker processes notice their collector died and quit). Re-running with the same
``out`` appends (episode ids and track seeds continue) if env, action space and expert (by SHA-256) match
the dataset, and refuses otherwise; it first fills any hole among the ids (an episode an interrupted
parallel run had not finished, or a damaged file someone deleted), so a resumed run ends up with the
episodes of an uninterrupted one. A shard's re-run completes the shard. A lock file stops two collectors
writing into one folder.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from agent import demos
from agent.parallel import check_workers, default_workers, raise_if_stopped, sigterm_as_interrupt, warm_up
from envs.registry import EnvSpec, SeedRanges, get_spec

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
STUCK_SPEED, STUCK_SECONDS = 1.0, 1.0  # env speed units, seconds: a stopped car
OFF_ROAD_SECONDS = 5.0  # with the car off the road (short excursions and their recoveries are kept)
NOISE_STREAM = 0xDA27  # mixed into the track seed for the DART generator
MIX_STREAM = 0xDA66  # mixed into the track seed for the DAgger expert/student coin
FORMAT_VERSION = 1


def existing_action_space(out: str | Path | None) -> str | None:
    """The action space named by the card of an existing --out dataset (None when there is none), so that a
    DAgger round appended to a discrete dataset needs no --action-space."""
    card = Path(out) / demos.CARD_NAME if out is not None else None
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
    progress: bool = True
    driver: Path | None = None  # DAgger: a policy checkpoint that drives while the expert labels
    beta: float = 0.0  # DAgger: probability per step that the expert's action is executed instead
    renderer: str | None = None  # who draws the frames (the spec's renderers; default: its first, the reference)
    workers: int | None = None  # processes recording episodes (default: agent.parallel.default_workers)
    shard: tuple[int, int] | str | None = None  # (I, N) or "I/N": only the I-th of N seed ranges of this run

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
        if self.noise_hold is not None and self.noise_hold < 1:
            raise CollectError(f"--noise-hold must be >= 1 frame, got {self.noise_hold}")
        if not (math.isfinite(self.beta) and 0.0 <= self.beta <= 1.0):
            raise CollectError(f"--beta is a probability, must be in [0, 1], got {self.beta}")
        if self.beta > 0 and self.driver is None:
            raise CollectError("--beta mixes the expert into a --driver's driving; give --driver CKPT too")
        if self.driver is not None and not Path(self.driver).is_file():
            raise CollectError(f"--driver file not found: {str(self.driver)!r} (expected a policy checkpoint from train.py)")
        out = self.out_dir
        if out.exists() and not out.is_dir():
            raise CollectError(f"--out {str(out)!r} is a file; expected a dataset folder (new or from collect.py)")
        if self.expert is not None:
            from agent.expert import REPO_ROOT  # Expert.load also tries relative paths from the repo root

            p = Path(self.expert)
            if not (p.is_file() or (not p.is_absolute() and (REPO_ROOT / p).is_file())):
                raise CollectError(f"--expert file not found: {str(p)!r} (expected an SB3 PPO .zip from agent.expert)")

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


# ----------------------------------------------------------------------------------------------- noise
class DartNoise:
    """Perturbs the executed action around the expert's label (see the module docstring)."""

    def __init__(self, action_space: str, sigma: float, hold: int, seed: int, n_actions: int = 5) -> None:
        self.action_space, self.sigma, self.hold, self.n_actions = action_space, float(sigma), int(hold), n_actions
        self.rng = np.random.default_rng([seed, NOISE_STREAM])
        self._eps = np.zeros(2)
        self._other: int | None = None

    def __call__(self, t: int, label: np.ndarray | int) -> np.ndarray | int:
        if self.sigma == 0:
            return label
        new_block = t % self.hold == 0
        if self.action_space == "discrete":
            if new_block:
                # An offset 1..n-1 added mod n picks a uniformly random action other than the label.
                n = self.n_actions
                self._other = int(self.rng.integers(1, n)) if self.rng.random() < self.sigma else None
            return int(label) if self._other is None else (int(label) + self._other) % self.n_actions
        if new_block:
            self._eps = self.rng.normal(0.0, self.sigma, 2)
        steer = float(np.clip(label[0] + self._eps[0], -1.0, 1.0))
        if len(label) == 1:  # steering-only action
            return np.array([steer], dtype=np.float32)
        throttle = float(np.clip(label[1] - label[2] + self._eps[1], -1.0, 1.0))
        return np.array([steer, max(throttle, 0.0), max(-throttle, 0.0)], dtype=np.float32)


# ----------------------------------------------------------------------------------------------- episodes
def steer_bins(steer_limit: float) -> np.ndarray:
    """Edges of the card's steering histogram: 16 bins over the env's useful steering range."""
    return np.linspace(-steer_limit, steer_limit, 17)


def action_stats(action_space: str, executed: np.ndarray, label: np.ndarray, action_names: tuple[str, ...],
                 steer_limit: float) -> dict[str, Any]:
    """Small per-episode histograms (kept in the episode meta, summed into the card)."""
    if action_space == "discrete":
        n = len(action_names)
        return {
            "executed_counts": np.bincount(executed, minlength=n).tolist(),
            "label_counts": np.bincount(label, minlength=n).tolist(),
        }
    out: dict[str, Any] = {}
    for name, a in (("executed", executed), ("label", label)):
        steer = np.clip(a[:, 0].astype(np.float64), -steer_limit, steer_limit)
        out[f"{name}_steer_counts"] = np.histogram(steer, steer_bins(steer_limit))[0].tolist()
        for col, pedal in enumerate(action_names):
            if pedal in ("gas", "brake"):
                out[f"{name}_{pedal}_steps"] = int((a[:, col] > 0).sum())
                out[f"{name}_{pedal}_sum"] = float(a[:, col].sum())
    return out


class EarlyStop:
    """Ends an episode the expert cannot recover: the car stopped (speed < STUCK_SPEED for STUCK_SECONDS) or
    off the road (the spec's on_road) for OFF_ROAD_SECONDS. Why: after a noise-induced spin the BC-trained
    CarRacing expert can sit on the grass braking for the rest of the 1000 steps (seen on track 3000016) —
    hundreds of near-identical frames labelled "brake while stopped" that would teach the student to stop.
    The stuck stretch itself is cut off; the spin and the failed recovery before it stay, and the episode is
    flagged in its meta."""

    def __init__(self, spec: EnvSpec, enabled: bool = True) -> None:
        self.spec, self.enabled = spec, enabled
        self.stuck_steps = round(STUCK_SECONDS / spec.dt)
        self.off_road_steps = round(OFF_ROAD_SECONDS / spec.dt)
        self.slow = self.off = 0

    def __call__(self, info: dict) -> tuple[str | None, int]:
        """(reason or None, how many of the latest states belong to the stuck stretch)."""
        if not self.enabled:
            return None, 0
        self.slow = self.slow + 1 if info["speed"] < STUCK_SPEED else 0
        self.off = self.off + 1 if not self.spec.on_road(info) else 0
        if self.slow >= self.stuck_steps:
            return "stuck", self.slow
        if self.off >= self.off_road_steps:
            return "off_road", self.off
        return None, 0


def record_episode(
    env: Any,
    expert: Any,
    track_seed: int,
    noise: DartNoise,
    *,
    on_step: Callable[[], None] | None = None,
    early_stop: bool = True,
    driver: Any = None,
    beta: float = 0.0,
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Drive one episode on track `track_seed`; returns the agent.demos arrays and meta.

    Without `driver` the expert drives. With one (an ``agent.driver.PolicyController``) the student
    drives, except on steps where a coin with probability `beta` picks the expert; the label is always
    the expert's action for the recorded state. Besides the frame, the arrays hold every
    ``spec.recorded_info`` entry of ``info`` per step (side cameras, telemetry)."""
    spec: EnvSpec = expert.spec
    discrete = expert.action_space == "discrete"
    dt = spec.dt
    frames, actions, labels, probs, rewards, speeds, priv = [], [], [], [], [], [], []
    extras: dict[str, list] = {name: [] for name in spec.recorded_info}
    obs, info = env.reset(seed=int(track_seed))
    terminated = truncated = False
    stop, stopped = EarlyStop(spec, early_stop), None
    t0 = time.perf_counter()
    t = 0
    coin = np.random.default_rng([track_seed, MIX_STREAM])
    by_expert: list[bool] = []
    if driver is not None:
        driver.reset()
    while not (terminated or truncated or stopped):
        label = expert.act(info["privileged"])
        chosen, expert_turn = label, True
        if driver is not None:
            student, _ = driver.act(obs, t * dt, info, label)  # steps the stream on every frame
            expert_turn = bool(coin.random() < beta)
            chosen = label if expert_turn else student
        executed = noise(t, chosen)
        by_expert.append(expert_turn)
        frames.append(obs)
        priv.append(info["privileged"])
        speeds.append(info["speed"])
        for name, key in spec.recorded_info.items():
            extras[name].append(info[key])
        labels.append(label)
        actions.append(executed)
        if discrete:
            probs.append(expert.action_probs(info["privileged"]))
        obs, reward, terminated, truncated, info = env.step(executed)
        raise_if_stopped()
        rewards.append(reward)
        t += 1
        if on_step is not None:
            on_step()
        stopped, run = stop(info)
    if stopped:
        # States t+1-run .. t are the stuck stretch; keep the steps before it and end at its first state,
        # whose frame/features/label were recorded as step `cut` (so final_* stay exact).
        cut = max(1, t + 1 - run)
        if cut < t:
            obs, info = frames[cut], {**info, "privileged": priv[cut], "speed": speeds[cut]}
            for buf in (frames, actions, labels, probs, rewards, speeds, priv, by_expert, *extras.values()):
                del buf[cut:]
            t = cut
        truncated = True
    adtype = np.int64 if discrete else np.float32
    arrays: dict[str, np.ndarray] = {
        "frames": np.stack(frames).astype(np.uint8),
        "action": np.asarray(actions, dtype=adtype),
        "expert_action": np.asarray(labels, dtype=adtype),
        "reward": np.asarray(rewards, dtype=np.float32),
        "speed": np.asarray(speeds, dtype=np.float32),
        "privileged": np.stack(priv).astype(np.float32),
        "time": np.arange(t, dtype=np.float64) * dt,
        # The state after the last step: exporters that want T+1 observations (Minari) need it.
        "final_frames": np.asarray(obs, dtype=np.uint8),
        "final_privileged": np.asarray(info["privileged"], dtype=np.float32),
        "final_speed": np.float32(info["speed"]),
        "final_time": np.float64(t * dt),
        "final_expert_action": np.asarray(expert.act(info["privileged"]), dtype=adtype),
    }
    for name, values in extras.items():
        arrays[name] = np.stack(values) if name.startswith("frames") else np.asarray(values, dtype=np.float32)
    if discrete:
        arrays["expert_probs"] = np.stack(probs).astype(np.float32)
        arrays["final_expert_probs"] = np.asarray(expert.action_probs(info["privileged"]), dtype=np.float32)
    env_meta = spec.episode_meta(info)
    a, lab = arrays["action"], arrays["expert_action"]
    perturbed = (a != lab) if discrete else np.any(np.abs(a - lab) > 1e-6, axis=1)
    meta = {
        "track_seed": int(track_seed),
        "env": spec.name,
        "gym_id": spec.gym_id,
        "action_space": expert.action_space,
        "return": float(np.sum(arrays["reward"], dtype=np.float64)),
        "terminated": bool(terminated),
        "truncated": bool(truncated),
        **env_meta,
        "env_meta_keys": list(env_meta),  # which keys above the env added (the card lists them per episode)
        "noise": noise.sigma,
        "noise_hold": noise.hold,
        "beta": beta if driver is not None else None,
        "expert_driven_fraction": float(np.mean(by_expert)),
        "perturbed_fraction": float(perturbed.mean()),
        "mean_abs_noise": None if discrete else np.abs(a.astype(np.float64) - lab).mean(0).round(5).tolist(),
        "mean_speed": float(arrays["speed"].mean()),
        "stats": action_stats(expert.action_space, a, lab, spec.action_names[expert.action_space],
                              spec.steer_limit[expert.action_space]),
        "stopped_early": stopped,  # None | "stuck" | "off_road" (see EarlyStop); such episodes end truncated
        "wall_s": time.perf_counter() - t0,
    }
    return arrays, meta


# ----------------------------------------------------------------------------------------------- the card
def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def expert_summary(expert: Any) -> dict[str, Any]:
    """What the dataset card keeps about the expert: identity and its own card's headline numbers."""
    card = expert.card or {}
    ev = card.get("evaluation", {})
    return {
        "path": str(expert.path),
        "sha256": file_sha256(Path(expert.path)),
        "action_space": expert.action_space,
        "algorithm": card.get("algorithm"),
        "train_seeds": card.get("train_seeds"),
        "selection_seeds": card.get("selection", {}).get("seeds"),
        "evaluation": {k: ev.get(k) for k in ("seeds", "mean_return", "std_return", "laps_finished", "episodes")} if ev else None,
    }


def _mean_std(x: list[float]) -> dict[str, float | None]:
    if not x:
        return {"mean": None, "std": None, "min": None, "max": None}
    a = np.asarray(x, dtype=np.float64)
    return {"mean": float(a.mean()), "std": float(a.std()), "min": float(a.min()), "max": float(a.max())}


def _weighted_noise(metas: list[dict]) -> list[float] | None:
    rows = [(m["mean_abs_noise"], m["length"]) for m in metas if m.get("mean_abs_noise") is not None]
    if not rows:
        return None
    return (np.average([r for r, _ in rows], axis=0, weights=[n for _, n in rows])).round(5).tolist()


def _counts(values: Iterable[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return out


def _episode_meta_keys(metas: list[dict]) -> list[str]:
    """The env's own per-episode keys (spec.episode_meta), in first-seen order."""
    known = {"episode_id", "track_seed", "return", "length", "terminated", "truncated", "stopped_early", "noise",
             "perturbed_fraction", "driver", "beta", "renderer"}
    keys: dict[str, None] = {}
    for m in metas:
        keys.update({k: None for k in m.get("env_meta_keys", ()) if k not in known})
    return list(keys)


def build_card(config: dict, expert: dict, runs: list[dict], metas: list[dict], spec: EnvSpec) -> dict[str, Any]:
    """The dataset card, derived from the episode metas (so it is right even after a crash between an
    episode file and its card update)."""
    space = config["action_space"]
    names = spec.action_names[space]
    dt = spec.dt
    returns = [m["return"] for m in metas]
    stats = [m.get("stats", {}) for m in metas]

    def total(key: str) -> Any:
        vals = [s[key] for s in stats if key in s]
        if not vals:
            return None
        return np.sum(np.asarray(vals), axis=0).tolist()

    if space == "discrete":
        hist = {
            "names": list(names),
            "executed": total("executed_counts"),
            "label": total("label_counts"),
        }
    else:
        steps = max(1, sum(m["length"] for m in metas))
        hist = {"steer_bin_edges": steer_bins(spec.steer_limit[space]).round(3).tolist()}
        for name in ("executed", "label"):
            hist[name] = {"steer_counts": total(f"{name}_steer_counts")}
            for pedal in ("gas", "brake"):
                if pedal in names:
                    hist[name][f"{pedal}_fraction"] = (total(f"{name}_{pedal}_steps") or 0) / steps
                    hist[name][f"mean_{pedal}"] = (total(f"{name}_{pedal}_sum") or 0.0) / steps
    seeds = [m["track_seed"] for m in metas]
    steps_total = int(sum(m["length"] for m in metas))
    return {
        "format": f"agent.demos v{FORMAT_VERSION} (see the agent/demos.py docstring)",
        "env": config["env"],
        "gym_id": spec.gym_id,
        "action_space": space,
        "frame_shape": list(spec.frame_shape),
        "cameras": ["frames", *[k for k in spec.recorded_info if k.startswith("frames")]],
        "action_names": list(names),
        "dt": dt,
        "config": config,
        "seeds": {
            "rule": "episode k uses track seed config.seed + k",
            "first": min(seeds) if seeds else None,
            "last": max(seeds) if seeds else None,
            "why": "disjoint from the expert's training draws [100000, 2000000), its validation 90000.. and card "
                   "evaluation 1000.. tracks, and evaluate.py's default 1000..; seeds < 100000 are for evaluation",
        },
        "expert": expert,
        "counts": {
            "episodes": len(metas),
            "steps": steps_total,
            "hours_of_driving": steps_total * dt / 3600,
            "laps_finished": int(sum(m.get("lap_complete", False) for m in metas)),
            "terminated": int(sum(m["terminated"] for m in metas)),
            "truncated": int(sum(m["truncated"] for m in metas)),
            "stopped_early": int(sum(bool(m.get("stopped_early")) for m in metas)),
            # discrete: steps whose executed action is not the label; continuous: mean |executed - label| per
            # action dimension (every continuous step is perturbed a little, so a count would say nothing)
            "perturbed_steps": int(sum(round(m.get("perturbed_fraction", 0) * m["length"]) for m in metas))
            if space == "discrete" else None,
            "mean_abs_noise": None if space == "discrete" else _weighted_noise(metas),
            # DAgger: episodes a student drove (collect.py --driver); their returns are the student's
            "driven_by": {"expert": sum(m.get("driver") is None for m in metas),
                          "student": sum(m.get("driver") is not None for m in metas)},
            # who drew the frames (collect.py --renderer); episodes from before the option had the default
            "renderers": _counts(m.get("renderer", spec.renderers[0]) for m in metas),
        },
        "returns": _mean_std(returns),
        "expert_driven_returns": _mean_std([m["return"] for m in metas if m.get("driver") is None]),
        "action_histogram": hist,
        "feature_names": list(spec.feature_names),
        "episodes": [
            {k: m.get(k) for k in ("episode_id", "track_seed", "return", "length", *_episode_meta_keys(metas),
                                   "terminated", "truncated", "stopped_early", "noise", "perturbed_fraction",
                                   "driver", "beta", "renderer")}
            for m in metas
        ],
        "runs": runs,
    }


# ----------------------------------------------------------------------------------------------- resume
@dataclass
class Existing:
    """What an --out folder already holds."""

    metas: list[dict] = field(default_factory=list)
    card: dict = field(default_factory=dict)

    @property
    def next_id(self) -> int:
        return max((m["episode_id"] for m in self.metas), default=-1) + 1

    def ids_to_collect(self, n: int) -> list[int]:
        """The next `n` episode ids: first the holes below the highest id (episodes an interrupted parallel run
        had not finished, or a damaged file someone deleted), then new ids after it. So a resumed run ends up
        with exactly the episodes of an uninterrupted one."""
        have = {m["episode_id"] for m in self.metas}
        holes = [i for i in range(self.next_id) if i not in have]
        return (holes + list(range(self.next_id, self.next_id + n)))[:n]


def inspect_out(out: Path) -> Existing:
    """Read an existing dataset folder (or nothing); refuse folders that are not datasets."""
    if not out.exists():
        return Existing()
    entries = {p.name for p in out.iterdir() if not p.name.startswith(".")}
    known = {demos.EPISODE_DIR, demos.CARD_NAME, "minari"}
    files = sorted((out / demos.EPISODE_DIR).glob("episode_*.npz"))
    if entries - known:
        raise CollectError(
            f"--out {str(out)!r} is a folder that is not a collect.py dataset (it holds {sorted(entries - known)[:5]}); "
            "choose an empty or new folder"
        )
    if not files:
        return Existing()
    try:
        ds = demos.open_dataset(out)
    except ValueError as e:
        raise CollectError(str(e)) from None
    return Existing(metas=ds.episodes, card=ds.card)


def check_compatible(existing: Existing, cfg: CollectConfig, expert_sha: str, expert_path: str,
                     seed: int | None = None) -> dict:
    """The settings this run inherits from the dataset; CollectError if it may not append to it. `seed`: the
    first track seed this run asks for (cfg.seed, or where cfg.shard's range starts), None to inherit it."""
    first = existing.metas[0]
    old_cfg = existing.card.get("config", {})
    out = cfg.out_dir
    for key, want in (("env", cfg.env), ("action_space", cfg.action_space)):
        have = first.get(key)
        if have != want:
            raise CollectError(
                f"--out {str(out)!r} holds a dataset with {key}={have!r}, this run asks for {key}={want!r}; "
                "use another --out (datasets never mix)"
            )
    have_sha = first.get("expert_sha256")
    if have_sha and have_sha != expert_sha:
        raise CollectError(
            f"--out {str(out)!r} was recorded with a different expert ({existing.card.get('expert', {}).get('path', '?')}, "
            f"sha256 {have_sha[:12]}), this run uses {expert_path} (sha256 {expert_sha[:12]}); use another --out"
        )
    base = int(first["track_seed"]) - int(first["episode_id"])
    if seed is not None and seed != base:
        if cfg.shard:
            raise CollectError(
                f"--out {str(out)!r} uses track seeds {base}+episode id, but shard {cfg.shard[0]}/{cfg.shard[1]} of "
                f"this run starts at seed {seed}; give the --seed and --episodes of the first run, or use another --out")
        raise CollectError(
            f"--out {str(out)!r} uses track seeds {base}+episode id; --seed {seed} would break that rule. "
            "Leave --seed out to continue, or use another --out"
        )
    return {
        "seed": base,
        "noise": old_cfg.get("noise", first.get("noise", cfg.spec.default_noise[cfg.action_space])),
        "noise_hold": old_cfg.get("noise_hold", first.get("noise_hold", cfg.spec.default_noise_hold[cfg.action_space])),
    }


@contextlib.contextmanager
def folder_lock(out: Path) -> Iterator[None]:
    """An flock on OUT/.lock: a second collector into the same folder fails fast; the OS drops the lock
    when the process dies, so a killed run never leaves a stale lock."""
    out.mkdir(parents=True, exist_ok=True)
    fd = os.open(out / ".lock", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CollectError(f"another collect.py is writing into {str(out)!r}; wait for it or use another --out") from None
        yield
    finally:
        os.close(fd)


# ----------------------------------------------------------------------------------------------- the run
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
        ret = f", mean return {self.mean_return_added:.1f}, laps {self.laps_added}/{self.episodes_added}" if self.episodes_added else ""
        return (
            f"{what}saved {self.episodes_added} new episode(s) ({self.steps_added} steps{seeds}{ret}) at "
            f"{self.steps_per_s:.0f} steps/s{f' ({self.workers} workers)' if self.workers > 1 else ''}; "
            f"{self.out} now holds {self.episodes_total} episodes, {self.steps_total} steps{dropped}"
        )


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
    cfg.validate()
    from tqdm import tqdm

    from agent.expert import Expert

    spec = cfg.spec
    out = cfg.out_dir
    if (cfg.workers or default_workers(cfg.episodes)) > 1:
        warm_up(_preload(spec))
    try:
        expert = Expert.load(cfg.expert, cfg.action_space, cfg.env)
    except (FileNotFoundError, ValueError) as e:
        hint = ""
        if "expert, but action_space" in str(e):
            other = "discrete" if cfg.action_space == "continuous" else "continuous"
            hint = f" (pass --action-space {other} or an expert for {cfg.action_space})"
        raise CollectError(f"{e}{hint}") from None
    exp = expert_summary(expert)
    driver, driver_info = None, {"driver": None}
    if cfg.driver is not None:
        try:
            driver = load_driver(cfg.driver, cfg.env, cfg.action_space)
        except (FileNotFoundError, ValueError) as e:
            raise CollectError(f"--driver: {e}") from None
        driver_info = {"driver": str(cfg.driver), "driver_sha256": file_sha256(Path(cfg.driver))}
    renderer = spec.check_renderer(cfg.renderer)
    shard = shard_range(cfg.episodes, *cfg.shard) if cfg.shard else None
    inspect_out(out)  # refuse a folder that is not a dataset before putting a lock file into it
    with folder_lock(out):
        for tmp in demos.temp_files(out):  # leftovers of a SIGKILLed write; never data
            tmp.unlink(missing_ok=True)
        existing = inspect_out(out)
        want_seed = cfg.seed if shard is None else (cfg.seed if cfg.seed is not None else spec.seeds.collect) + shard[0]
        if existing.metas:
            inherited = check_compatible(existing, cfg, exp["sha256"], exp["path"], seed=want_seed)
            seed = inherited["seed"]
            noise = cfg.noise if cfg.noise is not None else inherited["noise"]
            hold = cfg.noise_hold if cfg.noise_hold is not None else inherited["noise_hold"]
            config = existing.card.get("config") or {}
        else:
            seed = want_seed if want_seed is not None else spec.seeds.collect
            noise = cfg.noise if cfg.noise is not None else spec.default_noise[cfg.action_space]
            hold = cfg.noise_hold if cfg.noise_hold is not None else spec.default_noise_hold[cfg.action_space]
            config = {}
        if cfg.action_space == "discrete" and noise > 1:
            raise CollectError(f"--noise is a probability for the discrete action space, must be in [0, 1], got {noise}")
        # a shard is a fixed seed range: a re-run completes it; otherwise --episodes says how many to add
        wanted = cfg.episodes if shard is None else max(0, shard[1] - shard[0] - len(existing.metas))
        ids = existing.ids_to_collect(wanted)
        if not ids:
            log(f"{out} already holds the {len(existing.metas)} episodes of shard {cfg.shard[0]}/{cfg.shard[1]}; "
                "nothing to collect")
            return CollectResult(out, 0, 0, len(existing.metas), int(sum(m["length"] for m in existing.metas)),
                                 None, 0, 0.0, False, None, None)
        seeds = [seed + i for i in ids]
        low = spec.seeds.reserved_below
        reserved = set(seeds) & (set(range(low)) | set(spec.seeds.card) | set(spec.seeds.validation))
        if reserved:
            log(f"warning: track seeds {min(reserved)}..{max(reserved)} are evaluation/validation seeds "
                f"(< {low}); a student trained on them would be tested on tracks it has seen")
        config = {
            **config,
            "env": cfg.env,
            "action_space": cfg.action_space,
            "seed": seed,
            "noise": config.get("noise", noise),
            "noise_hold": config.get("noise_hold", hold),
            "max_steps": config.get("max_steps", cfg.max_steps),
            "noise_model": (
                "continuous: N(0, noise^2) added to steer (and to throttle=gas-brake where the action has them), "
                "clipped, held noise_hold frames"
                if cfg.action_space == "continuous"
                else "discrete: with probability noise a uniformly random other action, decided every noise_hold frames"
            ),
            "render": True,
            "early_stop": (
                f"stuck (speed < {STUCK_SPEED} for {STUCK_SECONDS} s) or off road for {OFF_ROAD_SECONDS} s; stuck stretch cut"
                if cfg.early_stop else None
            ),
        }
        workers = cfg.workers if cfg.workers is not None else default_workers(len(ids))
        workers = min(workers, len(ids))
        runs = list(existing.card.get("runs", []))
        run = {
            "command": command,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "first_episode_id": ids[0],
            "episodes_requested": len(ids),
            **({"filled_episode_ids": [i for i in ids if i < existing.next_id]} if ids[0] < existing.next_id else {}),
            **({"shard": f"{cfg.shard[0]}/{cfg.shard[1]}: episodes {shard[0]}..{shard[1] - 1} of {cfg.episodes} "
                         f"from seed {seed - shard[0]}"} if shard else {}),
            "noise": noise,
            "noise_hold": hold,
            "max_steps": cfg.max_steps,
            "early_stop": cfg.early_stop,
            "renderer": renderer,
            "workers": workers,
            "driver": str(cfg.driver) if cfg.driver is not None else None,
            "beta": cfg.beta if cfg.driver is not None else None,
            "episodes_added": 0,
            "steps_added": 0,
            "interrupted": False,
        }
        runs.append(run)
        metas = list(existing.metas)
        settings = EpisodeSettings(
            env=cfg.env, action_space=cfg.action_space, expert=None if cfg.expert is None else str(cfg.expert),
            driver=None if cfg.driver is None else str(cfg.driver), max_steps=cfg.max_steps, renderer=renderer,
            noise=noise, noise_hold=hold, early_stop=cfg.early_stop, beta=cfg.beta, out=str(out),
            meta={"expert_sha256": exp["sha256"], **driver_info})
        added: list[dict] = []
        steps = 0
        t_start = time.perf_counter()
        bar = tqdm(total=len(ids), unit="ep", desc=f"collect {out.name}", disable=not cfg.progress, dynamic_ncols=True)

        def postfix() -> None:
            rate = steps / max(time.perf_counter() - t_start, 1e-9)
            rets = [m["return"] for m in added]
            bar.set_postfix(steps_s=f"{rate:.0f}", mean_return=f"{np.mean(rets):.1f}" if rets else "-",
                            laps=sum(m["lap_complete"] for m in added), refresh=False)

        def on_steps(n: int = 1) -> None:
            nonlocal steps
            before, steps = steps, steps + n
            if steps // 50 != before // 50:
                postfix()
                bar.refresh()

        def saved(meta: dict) -> None:
            """An episode file is on disk: count it and rewrite the card (episodes in id order)."""
            metas.append(meta)
            metas.sort(key=lambda m: m["episode_id"])
            added.append(meta)
            run.update(episodes_added=len(added), steps_added=int(sum(m["length"] for m in added)),
                       steps_per_s=round(steps / max(time.perf_counter() - t_start, 1e-9), 1))
            demos.write_json_atomic(out / demos.CARD_NAME, build_card(config, exp, runs, metas, spec))
            postfix()
            bar.update(1)
            if after_episode is not None:
                after_episode(meta["episode_id"])

        interrupted = False
        try:
            with sigterm_as_interrupt():
                if workers == 1:
                    _collect_serial(settings, spec, expert, driver, list(zip(ids, seeds)), on_steps, saved)
                else:
                    _collect_parallel(settings, spec, workers, list(zip(ids, seeds)), on_steps, saved)
        except KeyboardInterrupt:
            interrupted = True
        finally:
            bar.close()
        if interrupted:
            # The card (and `added`) may lag by an episode whose write was interrupted: trust the files.
            for tmp in demos.temp_files(out):  # a worker killed mid-write (after STOP_TIMEOUT_S) leaves one
                tmp.unlink(missing_ok=True)
            metas = inspect_out(out).metas
            wanted_ids = set(ids)
            added = [m for m in metas if m["episode_id"] in wanted_ids]
            run.update(interrupted=True, episodes_added=len(added), steps_added=int(sum(m["length"] for m in added)))
            if metas:
                demos.write_json_atomic(out / demos.CARD_NAME, build_card(config, exp, runs, metas, spec))
        elapsed = time.perf_counter() - t_start
        steps_added = int(sum(m["length"] for m in added))
        added.sort(key=lambda m: m["episode_id"])
        return CollectResult(
            out=out,
            episodes_added=len(added),
            steps_added=steps_added,
            episodes_total=len(metas),
            steps_total=int(sum(m["length"] for m in metas)),
            mean_return_added=float(np.mean([m["return"] for m in added])) if added else None,
            laps_added=int(sum(m["lap_complete"] for m in added)),
            steps_per_s=steps / max(elapsed, 1e-9),
            interrupted=interrupted,
            first_seed=added[0]["track_seed"] if added else None,
            last_seed=added[-1]["track_seed"] if added else None,
            workers=workers,
        )


# ----------------------------------------------------------------------------------------------- one episode
@dataclass(frozen=True)
class EpisodeSettings:
    """What every episode of one run is recorded with. Plain values only: worker processes receive it as is."""

    env: str
    action_space: str
    expert: str | None  # as given (None: the env's shipped one)
    driver: str | None  # DAgger: the student's checkpoint
    max_steps: int
    renderer: str
    noise: float
    noise_hold: int
    early_stop: bool
    beta: float
    out: str
    meta: dict = field(default_factory=dict)  # added to every episode's meta (expert and driver identity)

    def make_env(self) -> Any:
        spec = get_spec(self.env)
        side_cameras = any(name.startswith("frames_") for name in spec.recorded_info)
        return spec.make(self.action_space, render=True, max_episode_steps=self.max_steps, side_cameras=side_cameras,
                         renderer=self.renderer)


def load_driver(path: str | Path, env: str, action_space: str) -> Any:
    """A DAgger student as a driver (agent.driver.PolicyController on the CPU)."""
    from agent.driver import PolicyController, load_policy

    policy = load_policy(path, env, action_space, "cpu")
    return PolicyController(policy.eval(), name=Path(path).stem)


def record_and_write(s: EpisodeSettings, env: Any, expert: Any, driver: Any, episode_id: int, track_seed: int,
                     on_step: Callable[[], None] | None) -> dict:
    """Record episode `episode_id` on track `track_seed` and write its file atomically; returns its meta."""
    spec = get_spec(s.env)
    noise = DartNoise(s.action_space, s.noise, s.noise_hold, track_seed, len(spec.action_names[s.action_space]))
    arrays, meta = record_episode(env, expert, track_seed, noise, on_step=on_step, early_stop=s.early_stop,
                                  driver=driver, beta=s.beta)
    meta.update(max_steps=s.max_steps, expert_sha256=s.meta.get("expert_sha256"),
                collected_at=time.strftime("%Y-%m-%dT%H:%M:%S"), renderer=s.renderer)
    meta.update({k: v for k, v in s.meta.items() if k != "expert_sha256"})
    demos.write_episode(Path(s.out), episode_id, arrays, meta,
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
    from agent.expert import Expert

    expert = Expert.load(s.expert, s.action_space, s.env)
    driver = load_driver(s.driver, s.env, s.action_space) if s.driver is not None else None
    return s, s.make_env(), expert, driver


def _worker_episode(state: tuple, task: tuple[int, int], on_step: Callable[[], None]) -> dict:
    s, env, expert, driver = state
    return record_and_write(s, env, expert, driver, *task, on_step)


def _preload(spec: EnvSpec) -> list[str]:
    """What a worker imports: done once in the fork server, not in every worker."""
    return [__name__, "agent.expert", "stable_baselines3", "agent.driver", spec.make.__module__]


def _collect_parallel(s: EpisodeSettings, spec: EnvSpec, workers: int, tasks: list[tuple[int, int]],
                      on_steps: Callable[..., None], saved: Callable[[dict], None]) -> None:
    """`workers` processes, each recording whole episodes and writing their files; the card is written here.
    Episode files depend only on their seed, so the dataset is the serial run's (see agent.parallel)."""
    from agent.parallel import EpisodePool

    with EpisodePool(workers, _worker_setup, (s,), _worker_episode, threads=1, preload=_preload(spec)) as pool:
        for _, meta in pool.run([(task, task) for task in tasks], on_steps=on_steps):
            saved(meta)
