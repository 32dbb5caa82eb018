"""One episode of demonstrations: the expert (or a DAgger student) drives, every step is recorded.

What makes this good BC data (and why each piece is here):

* **Labels on the visited state.** Every step stores the frame the car actually saw and the expert's
  action *for that state* (``expert_action``), whatever was executed. A student trained on these labels
  learns what to do in the states it will reach, not only on the expert's ideal line.
* **DART noise** (``noise``): the *executed* action is perturbed, the label is not, so the data shows the
  car drifting off the line and the expert's corrections — the recoveries a pure-expert dataset lacks.
  - continuous: Gaussian noise N(0, noise^2) on steer (env units, [-1, 1]; CarRacing's wheel saturates at
    ±0.4) and, for [steer, gas, brake] actions, on the throttle axis gas − brake, then clipped; gas =
    max(throttle, 0), brake = max(−throttle, 0) so gas and brake are never pressed together (the expert never
    does that either). Steering-only actions (udacity) get the steering noise alone; [steer, throttle]
    actions (udacity-hard, throttle < 0 brakes) get it on both, clipped to [-1, 1].
  - discrete: with probability ``noise`` a uniformly random *other* action is executed.
  One noise sample is held for ``noise_hold`` frames: at 50 Hz the steering joint slews at most
  0.06 rad/frame, so independent per-frame noise mostly averages out and never moves the car off line.
  The noise generator is seeded from the track seed, so an episode is reproducible. Defaults per env and
  action space are the spec's `default_noise` / `default_noise_hold` (CarRacing's: agent.data.config says why).
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

* **Recovery labels** (``recovery``, collect.py --recovery-labels): after a spin a student may point against the
  course, or end up far off the road: states the PPO expert never visited and labels badly (the discrete one, on
  CarRacing, steers at full lock and never gasses, so a standing car never turns round). In the states the
  spec's ``recovery_teacher`` ``needs()`` (CarRacing: the spec's ``wrong_way``, or the car's centre more than
  2 half-widths from the centerline) that teacher labels instead (discrete: its action's one-hot is the
  probability row), and the expert's turns of the mixture execute it. ``label_source`` (uint8 per step,
  ``LABEL_SOURCES``) says who labelled each step; the array exists only in such episodes.
* **Recovery starts** (``start``, collect.py --recovery-starts): reset options that place the car turned and
  shifted somewhere on the lap (the spec's ``recovery_start``), so the turning round is in expert data too.

* **Renderer** (``renderer``): who draws the frames, one of the spec's ``renderers`` (CarRacing: gymnasium's
  ``pygame``, the default and the reference, or the ``fast`` OpenCV one of envs/carracing_render.py). Each
  episode's meta and the card's counts record it; one dataset may hold both.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from agent.experts.latency import ActionDelay
from common.stops import raise_if_stopped
from envs.registry import EnvSpec, neutral_action

STUCK_SPEED, STUCK_SECONDS = 1.0, 1.0  # env speed units, seconds: a stopped car
OFF_ROAD_SECONDS = 5.0  # with the car off the road (short excursions and their recoveries are kept)
WRONG_WAY_SECONDS = 1.0  # pointing against the course (spec.wrong_way), with cut_wrong_way
NOISE_STREAM = 0xDA27  # mixed into the track seed for the DART generator
MIX_STREAM = 0xDA66  # mixed into the track seed for the DAgger expert/student coin
START_STREAM = 0x5747  # mixed into the track seed for the recovery start draw
LABEL_SOURCES = ("expert", "recovery")  # label_source values: who labelled a step


class Labeller:
    """Who labels a state: the expert, or in the states the recovery teacher needs() (when given) that teacher.
    Returns (label, discrete probabilities or None, LABEL_SOURCES index)."""

    def __init__(self, expert: Any, recovery: Any = None) -> None:
        self.expert, self.recovery = expert, recovery
        self.discrete = expert.action_space == "discrete"
        # a latency expert (agent.experts.latency) is also shown the latency and the actions on their way
        self.latency_aware = getattr(expert, "max_latency", 0) > 0

    def __call__(self, privileged: np.ndarray, latency: int = 0, on_the_way: Any = ()
                 ) -> tuple[Any, np.ndarray | None, int]:
        """``latency``, ``on_the_way``: what a latency expert is shown (see Expert.act)."""
        if self.recovery is not None and self.recovery.needs(privileged):
            label = self.recovery.env_action(privileged, self.expert.action_space)
            probs = np.eye(len(self.expert.spec.action_names["discrete"]), dtype=np.float32)[label] \
                if self.discrete else None
            return label, probs, 1
        probs = self.expert.action_probs(privileged) if self.discrete else None
        if self.latency_aware:
            return self.expert.act(privileged, latency, on_the_way), probs, 0
        return self.expert.act(privileged), probs, 0


def recovery_start(spec: EnvSpec, track_seed: int, probability: float) -> dict | None:
    """The reset options of a recovery start on this track (None: the usual start), drawn from the track seed so
    collection stays reproducible."""
    rng = np.random.default_rng([track_seed, START_STREAM])
    return spec.recovery_start(rng) if probability > 0 and rng.random() < probability else None


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
        if len(label) == 2:  # [steer, throttle] with throttle < 0 braking (udacity-hard)
            return np.array([steer, float(np.clip(label[1] + self._eps[1], -1.0, 1.0))], dtype=np.float32)
        throttle = float(np.clip(label[1] - label[2] + self._eps[1], -1.0, 1.0))
        return np.array([steer, max(throttle, 0.0), max(-throttle, 0.0)], dtype=np.float32)


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
    flagged in its meta. ``wrong_way`` (collect.py --cut-wrong-way) also ends a DAgger episode once the car has
    pointed against the course for WRONG_WAY_SECONDS, cutting that stretch: the expert never learnt those states
    (it steers at full lock or brakes there, never gasses), and from the camera they look like driving forwards,
    so their labels contradict the forward ones."""

    def __init__(self, spec: EnvSpec, enabled: bool = True, wrong_way: bool = False) -> None:
        self.spec, self.enabled = spec, enabled
        self.stuck_steps = round(STUCK_SECONDS / spec.dt)
        self.off_road_steps = round(OFF_ROAD_SECONDS / spec.dt)
        self.wrong_way_steps = round(WRONG_WAY_SECONDS / spec.dt) if wrong_way and spec.wrong_way else 0
        self.slow = self.off = self.backwards = 0

    def __call__(self, info: dict) -> tuple[str | None, int]:
        """(reason or None, how many of the latest states belong to the stuck stretch)."""
        if self.wrong_way_steps:
            self.backwards = self.backwards + 1 if self.spec.wrong_way(info) else 0
            if self.backwards >= self.wrong_way_steps:
                return "wrong_way", self.backwards
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
    cut_wrong_way: bool = False,
    driver: Any = None,
    beta: float = 0.0,
    recovery: Any = None,
    start: dict | None = None,
    latency_steps: int = 0,
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Drive one episode on track `track_seed`; returns the episode's arrays and meta (driving_data.dataset).

    Without `driver` the expert drives. With one (an ``agent.controllers.PolicyController``) the student
    drives, except on steps where a coin with probability `beta` picks the expert; the label is always
    the expert's action for the recorded state. Besides the frame, the arrays hold every
    ``spec.recorded_info`` entry of ``info`` per step (side cameras, telemetry). `recovery`: the spec's
    recovery teacher labels the states it needs (see the module docstring); `start`: the env's reset options;
    `latency_steps`: every chosen action reaches the env that many steps later (the env's neutral action until
    the first arrives); the recorded action is the one applied, the label the expert's for the recorded state."""
    t0 = time.perf_counter()
    labeller = Labeller(expert, recovery)
    # a replay drives at the recorded speed along a recorded path: it neither stalls nor ends off the road, the car
    # is put back (an intervention, as evaluate.py counts them) and the episode goes on
    stop = EarlyStop(expert.spec, early_stop and expert.spec.parts is None, cut_wrong_way)
    steps = _drive(env, labeller, track_seed, noise, on_step, stop, driver, beta, start, latency_steps)
    arrays = _episode_arrays(steps, labeller)
    meta = {"track_seed": int(track_seed), **_episode_meta(arrays, steps, expert, noise, driver, beta),
            "wall_s": time.perf_counter() - t0}
    if latency_steps:
        meta["latency_steps"] = int(latency_steps)
    if labeller.latency_aware:  # a latency expert's labels are already for when the action lands
        meta["labels_land"] = True
    if expert.spec.parts is not None:
        meta["interventions"] = steps.interventions
    if recovery is not None or start is not None:
        meta.update(recovery_labels=recovery is not None, recovery_label_steps=int(sum(steps.sources)), start=start)
    return arrays, meta


@dataclass
class _Steps:
    """What one episode recorded, step by step, and how it ended (the state after the last step)."""

    frames: list = field(default_factory=list)
    actions: list = field(default_factory=list)  # executed
    labels: list = field(default_factory=list)  # the expert's
    probs: list = field(default_factory=list)  # discrete: the expert's action probabilities
    rewards: list = field(default_factory=list)
    speeds: list = field(default_factory=list)
    priv: list = field(default_factory=list)
    by_expert: list = field(default_factory=list)  # DAgger: whose action was executed
    sources: list = field(default_factory=list)  # who labelled the step (LABEL_SOURCES index)
    extras: dict = field(default_factory=dict)  # spec.recorded_info
    t: int = 0
    obs: Any = None
    info: dict = field(default_factory=dict)
    terminated: bool = False
    truncated: bool = False
    stopped: str | None = None  # EarlyStop's reason
    interventions: int = 0  # a replay's: times the car was put back on the recorded path

    def cut(self, cut: int) -> None:
        """Keep steps 0 .. cut-1 and end at the state recorded as step ``cut`` (so final_* stay exact)."""
        self.obs, self.info = self.frames[cut], {**self.info, "privileged": self.priv[cut], "speed": self.speeds[cut]}
        for buf in (self.frames, self.actions, self.labels, self.probs, self.rewards, self.speeds, self.priv,
                    self.by_expert, self.sources, *self.extras.values()):
            del buf[cut:]
        self.t = cut


def _drive(env: Any, labeller: Labeller, track_seed: int, noise: DartNoise, on_step: Callable[[], None] | None,
           stop: EarlyStop, driver: Any, beta: float, start: dict | None, latency_steps: int = 0) -> _Steps:
    """The episode's loop: label every state (the expert, or the recovery teacher), execute the label (or the
    student's action) with DART noise, until the env ends it or EarlyStop does (then the stuck stretch is cut)."""
    spec: EnvSpec = labeller.expert.spec
    s = _Steps(extras={name: [] for name in spec.recorded_info})
    s.obs, s.info = env.reset(seed=int(track_seed), **({"options": start} if start is not None else {}))
    coin = np.random.default_rng([track_seed, MIX_STREAM])
    delay = ActionDelay(latency_steps, neutral_action(env.action_space) if latency_steps else None)
    late = delay.pending  # chosen, not yet applied
    if driver is not None:
        driver.reset(track_seed)
    run = 0
    while not (s.terminated or s.truncated or s.stopped):
        label, probs, source = labeller(s.info["privileged"], latency_steps, late)
        chosen, expert_turn = label, True
        if driver is not None:
            student, _ = driver.act(s.obs, s.t * spec.dt, s.info, label, late)  # steps the stream on every frame
            expert_turn = bool(coin.random() < beta)
            chosen = label if expert_turn else student
        executed = delay(noise(s.t, chosen))
        s.by_expert.append(expert_turn)
        s.frames.append(s.obs)
        s.priv.append(s.info["privileged"])
        s.speeds.append(s.info["speed"])
        for name, key in spec.recorded_info.items():
            s.extras[name].append(s.info[key])
        s.labels.append(label)
        s.sources.append(source)
        s.actions.append(executed)
        if probs is not None:
            s.probs.append(probs)
        s.obs, reward, s.terminated, s.truncated, s.info = env.step(executed)
        raise_if_stopped()
        s.rewards.append(reward)
        if spec.parts is not None and not (s.terminated or s.truncated) and not spec.on_road(s.info):
            s.obs, s.info = spec.recover(env)  # a replay: back on the recorded path, and on
            s.interventions += 1
        s.t += 1
        if on_step is not None:
            on_step()
        s.stopped, run = stop(s.info)
    if s.stopped:
        # States t+1-run .. t are the stuck stretch; keep the steps before it and end at its first state,
        # whose frame/features/label were recorded as step `cut`.
        cut = max(1, s.t + 1 - run)
        if cut < s.t:
            s.cut(cut)
        s.truncated = True
    return s


def _episode_arrays(s: _Steps, labeller: Labeller) -> dict[str, np.ndarray]:
    """The recorded steps as the dataset's arrays, plus the state after the last step (final_*)."""
    expert = labeller.expert
    discrete = expert.action_space == "discrete"
    final_label, final_probs, _ = labeller(s.info["privileged"])
    adtype = np.int64 if discrete else np.float32
    dt = expert.spec.dt
    arrays: dict[str, np.ndarray] = {
        "frames": np.stack(s.frames).astype(np.uint8),
        "action": np.asarray(s.actions, dtype=adtype),
        "expert_action": np.asarray(s.labels, dtype=adtype),
        "reward": np.asarray(s.rewards, dtype=np.float32),
        "speed": np.asarray(s.speeds, dtype=np.float32),
        "privileged": np.stack(s.priv).astype(np.float32),
        "time": np.arange(s.t, dtype=np.float64) * dt,
        # The state after the last step: exporters that want T+1 observations (Minari) need it.
        "final_frames": np.asarray(s.obs, dtype=np.uint8),
        "final_privileged": np.asarray(s.info["privileged"], dtype=np.float32),
        "final_speed": np.float32(s.info["speed"]),
        "final_time": np.float64(s.t * dt),
        "final_expert_action": np.asarray(final_label, dtype=adtype),
    }
    for name, values in s.extras.items():
        arrays[name] = np.stack(values) if name.startswith("frames") else np.asarray(values, dtype=np.float32)
    if discrete:
        arrays["expert_probs"] = np.stack(s.probs).astype(np.float32)
        arrays["final_expert_probs"] = np.asarray(final_probs, dtype=np.float32)
    if labeller.recovery is not None:
        arrays["label_source"] = np.asarray(s.sources, dtype=np.uint8)
    return arrays


def _episode_meta(arrays: dict[str, np.ndarray], s: _Steps, expert: Any, noise: DartNoise, driver: Any,
                  beta: float) -> dict[str, Any]:
    """How the episode went and how it was recorded (the card sums these)."""
    spec: EnvSpec = expert.spec
    discrete = expert.action_space == "discrete"
    env_meta = spec.episode_meta(s.info)
    a, lab = arrays["action"], arrays["expert_action"]
    perturbed = (a != lab) if discrete else np.any(np.abs(a - lab) > 1e-6, axis=1)
    return {
        "env": spec.name,
        "gym_id": spec.gym_id,
        "action_space": expert.action_space,
        "return": float(np.sum(arrays["reward"], dtype=np.float64)),
        "terminated": bool(s.terminated),
        "truncated": bool(s.truncated),
        **env_meta,
        "env_meta_keys": list(env_meta),  # which keys above the env added (the card lists them per episode)
        "noise": noise.sigma,
        "noise_hold": noise.hold,
        "beta": beta if driver is not None else None,
        "expert_driven_fraction": float(np.mean(s.by_expert)),
        "perturbed_fraction": float(perturbed.mean()),
        "mean_abs_noise": None if discrete else np.abs(a.astype(np.float64) - lab).mean(0).round(5).tolist(),
        "mean_speed": float(arrays["speed"].mean()),
        "stats": action_stats(expert.action_space, a, lab, spec.action_names[expert.action_space],
                              spec.steer_limit[expert.action_space]),
        # None | "stuck" | "off_road" | "wrong_way" (see EarlyStop); such episodes end truncated
        "stopped_early": s.stopped,
    }
