"""Closed-loop evaluation: drive a rendered env (CarRacing-v3, udacity) with a policy, shadowed by the expert.

``evaluate(EvalArgs(...))`` is what ``evaluate.py`` calls. For each policy (checkpoints and/or the
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

One episode's loop is agent/evaluation/episode.py, the metrics agent/evaluation/metrics.py, the drivers
agent/controllers.py.

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
step time, progress, on-road, HUD scale) comes from the env's ``envs.registry.EnvSpec``.

Speed: ``workers`` > 1 drives the (policy, seed) episodes in that many processes (agent.workers), each with
its own env, expert and policies; ``renderer`` picks who draws the frames (CarRacing: gymnasium's ``pygame``,
the reference, or ``fast``). An episode depends only on its seed, so rows and videos are those of one process;
each policy's files are written, in seed order, once its last episode is in. Only the timings differ
(latency is measured in whichever process drove). ``workers`` = 1 is the plain loop in this process.

Ctrl-C stops after the current step: the finished episodes are written (``"interrupted": true``) and
``Interrupted`` is raised so the CLI can exit with 130.
"""
from __future__ import annotations

import math
import shlex
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from tqdm import tqdm

from agent.controllers import RECORDING_STUDENT, ExpertController, PolicyController, load_policy, shipped_checkpoint
from agent.data.dataset import dataset_env, is_recording
from agent.evaluation import video as vid
from agent.evaluation.episode import run_episode
from agent.evaluation.metrics import aggregate, comparison_markdown, group_lines, write_run
from agent.evaluation.timing import TimingConditions, parse_jitter, timing_summary
from agent.runtime import show_progress, tensorboard_command
from agent.workers import MAX_WORKERS, EpisodePool, check_workers, default_workers, warm_up
from common.checks import is_int
from common.cli import option
from common.files import atomic_write_text, write_json
from common.stops import Interrupted, stop_handled
from envs.registry import ENV_NAMES, REPLAY_PREFIX, SeedRanges, get_spec
from policies.actions import (DISCRETE_ACTION_RULES, DISCRETE_ACTIONS, check_discrete_options, check_temperature,
                              spared_ids)
from policies.policy import WINDOW_CLOCKS
from policies.precision import PRECISIONS
from policies.precision import check as check_precision
from policies.precision import resolve as resolve_precision

DEFAULT_SEED = SeedRanges().evaluate  # 1000


@dataclass
class EvalArgs:
    """Closed-loop evaluation arguments: one evaluate.py flag per field (common.cli builds the parser)."""

    env: str = option("carracing",
        f"environment: {' | '.join(ENV_NAMES)}", group="where it drives", choices=ENV_NAMES)
    checkpoint: list[str] = option([],
        "policy checkpoint(s) (.pt from train.py) that drive; several -> one sub-folder each + comparison.md "
        "(default: the env's shipped student, checkpoints/<env>_nac.pt; --data on a real simulator recording: "
        "checkpoints/udacity_sim2real_nac.pt, the one made for its frames)", group="what drives", metavar="CKPT")
    name: list[str] = option([],
        "display names of the --checkpoint policies, in order, in comparison.md and as folder names (default:"
        " the file stems)", group="what drives", metavar="NAME")
    expert_drives: bool = option(False, "the PPO expert drives instead of a policy checkpoint: the baseline",
                                 group="what drives")
    action_space: str | None = option(None,
        "continuous | discrete (carracing); must match the checkpoint (default: the checkpoint's; expert: "
        "continuous)", group="what drives", choices=("continuous", "discrete"))
    episodes: int | None = option(None,
        "episodes (= consecutive track seeds) per policy (default: 5; --replay: every session)", group="where it drives")
    seed: int | None = option(None,
        "first track seed: episodes run on seeds SEED..SEED+EPISODES-1 (default: 1000, unseen by training; "
        "--replay: 0, its first session)", group="where it drives")
    max_steps: int | None = option(None,
        "env steps per episode (default: the env's limit, carracing 1000)", group="where it drives")
    video: bool = option(True, help="record mp4 videos (OUT/videos/seed_K.mp4)", group="output")
    video_episodes: int = option(1, help="record the first N episodes of each policy", group="output")
    saliency: bool = option(False, help="overlay a CNN saliency map on the videos", group="output")
    saliency_method: str = option("gradcam",
        "gradcam (paper fig. 6) | visualbackprop", group="output", choices=("gradcam", "visualbackprop"))
    with_expert: bool = option(False,
        "also evaluate the expert on the same seeds (a row of comparison.md)", group="what drives")
    expert: str | None = option(None,
        "expert .zip that shadows the policy (steering MAE) and drives with --expert-drives (default: the "
        "env's shipped one in checkpoints/)", group="what drives")
    out: str | None = option(None,
        "output folder (default: eval/<name>, or eval/compare for several)", group="output")
    device: str = option("auto", help="auto (cuda if available) | cpu | cuda | cuda:N", group="runtime")
    threads: int = option(1, help="torch threads (single-frame latency: 1 is fastest on a 2-core CPU)", group="runtime")
    precision: str = option("auto",
        "the encoder's arithmetic when --data is scored (every recorded frame, in batches): auto (bf16 where the "
        "hardware runs it natively: a CPU with AMX or AVX-512-BF16, a CUDA GPU with bf16; else fp32) | bf16 | "
        "fp32; a drive encodes one frame per step, which runs fp32 under every precision (bf16 is slower on "
        "one frame: policies/precision.py)", group="runtime", choices=PRECISIONS)
    tensorboard: bool = option(True, help="write TensorBoard scalars to OUT/tb", group="output")
    progress: bool = option(True,
        "progress bars on stderr when it is a terminal (else one line per episode)", group="runtime")
    renderer: str | None = option(None,
        "who draws the camera frames: carracing pygame (gymnasium's, the reference the shipped students were "
        "trained on) | fast (OpenCV, about 12x faster); udacity: native (default: the env's first)", group="where it drives")
    workers: int | None = option(None,
        "episodes driven at the same time, one process each; metrics and videos are those of a single process "
        f"(default: one per CPU core / --threads, at most {MAX_WORKERS} and at most the episodes; 1 = everything in "
        "this process)", group="runtime")
    data: list[str] = option([],
        "score the checkpoints offline on recorded driving instead of driving: a real simulator recording "
        "(driving_log.csv + IMG/) or a dataset; steering MSE/MAE against the recorded values and their 0.5 s "
        "average, beside always-straight and the training mean, per session, with a PNG of predicted vs "
        "recorded steering (writes OUT/offline.md, offline.json, steering_<k>.png; default OUT: "
        "eval/offline). A discrete student is scored on the recorded (expert's) action ids: agreement of its "
        "likeliest action beside always the commonest, and the mean probability of each action at its "
        "sampling temperature", group="data", metavar="DATA")
    drop_prob: float = option(0.0,
        "timing: probability P in [0, 1) that the policy gets no new frame at a step; its stream is not "
        "stepped and its last action is held (the first frame of an episode always arrives)", group="evaluation conditions", metavar="P")
    jitter: str | None = option(None,
        "timing: K1:K2, the policy gets a frame every k env steps, k drawn from K1..K2 at each frame; the env"
        " keeps its own dt and the action is held in between (default: every step)", group="evaluation conditions", metavar="K1:K2")
    latency_steps: int = option(0,
        "timing: each action reaches the env this many env steps after the policy decided it; the first ones "
        "apply the neutral action (zeros: no steering, no gas)", group="evaluation conditions", metavar="D")
    told_latency_steps: int | None = option(
        None, "what a latency-aware student (train.py --latency-input) is told its latency is, in env steps: set it "
        "away from --latency-steps to measure a wrong belief (default: --latency-steps, the truth)",
        group="evaluation conditions", metavar="D")
    window_clock: str = option("time",
        "how a policy picks its window from the frames it got: steps (the last frames received, every "
        "frame_stride-th) | time (the newest frames at or before the trained offsets in seconds, so under "
        "dropped or irregular frames the window spans the time it was trained on; identical under regular "
        "timing)", group="evaluation conditions", choices=WINDOW_CLOCKS)
    discrete_actions: str | None = option(None,
        "discrete students: argmax (the likeliest action) | sample (drawn from the policy's softmax, seeded "
        "by the track seed; the discrete expert pulses gas and steering, which argmax turns into gas wherever"
        " the next pulse is not visible) | dither (error diffusion: over consecutive steps each action is "
        "taken as often as its probability says, deterministically) (default: the rule the checkpoint was "
        "trained to drive with, train.py --discrete-actions; argmax if it names none)", group="what drives", choices=DISCRETE_ACTION_RULES)
    action_temperature: float | None = option(None,
        "discrete students that sample or dither: the softmax temperature T (probabilities raised to 1/T): "
        "above 1 the less likely actions (brake, the other steering pulse) come more often and the student "
        "drives more cautiously (default: the checkpoint's, 1 unless it names one or --discrete-actions "
        "overrides its rule)", group="what drives", metavar="T")
    temperature_spares: str | None = option(None,
        "discrete students that sample or dither: comma-separated actions (e.g. brake) that keep their "
        "probability at temperature 1 while the others share the rest at --action-temperature; with brake "
        "spared a student at 1.5 drives as fast as at 1 and spins as often (measured in docs/results.md: the "
        "readier brake is what prevents the spins)", group="what drives", metavar="ACTIONS")
    theme: str | None = option(None,
        "envs with scenes (udacity-hard): comma-separated themes the episodes draw from by seed, each "
        "reported apart in metrics.json (by_theme) (default: all, lake,jungle,mountain; mountain is never "
        "trained on)", group="where it drives")
    condition: str | None = option(None,
        "envs with scenes: comma-separated lighting/weather conditions, reported apart (by_condition) "
        "(default: all, clear,overcast,dusk,fog; fog is never trained on)", group="where it drives")
    pi_speed: bool = option(False,
        "udacity-hard: the env's PI controller holds the speed limit and the policy steers only (for students"
        " trained with train.py --head steer)", group="what drives")
    replay: str | None = option(None,
        "drive the checkpoints in closed loop through a recording: REC is a real simulator recording "
        "(driving_log.csv + IMG/) or a dataset of the udacity envs. Each recorded center frame is reprojected"
        " to the car's pose off the recorded path, a bicycle model at the recorded speed integrates the "
        "policy's steering, and more than 1 m (or 30 degrees) off the recorded driver's line is an "
        "intervention. Seeds are the recording's sessions (--seed, --episodes pick some); --expert-drives "
        "replays the recorded steering; metrics.json gives autonomy and interventions per 100 s beside "
        "always-straight's, paths/part_K.png the driven path (default OUT: eval/replay)", group="where it drives", metavar="REC")
    replay_span: str | None = option(None,
        "with --replay: A:B, the part of every session that is replayed, as fractions (0.8:1 = its last 20 %,"
        " what train.py holds out of a recording) (default: 0:1)", group="where it drives", metavar="A:B")
    data_span: str | None = option(None,
        "with --data: A:B, the part of every session whose steering is scored, as fractions (0.8:1 = what "
        "train.py --split blocks holds out); the policy still streams through the whole session (default: 0:1)",
        group="where it drives", metavar="A:B")
    replay_max_offset: float = option(1.0,
        "with --replay: metres from the recorded driver's line beyond which the car is put back (an "
        "intervention; NVIDIA's rule is 1 m)", group="where it drives", metavar="M")
    replay_reference: str = option("driver",
        "with --replay: where the car may be: driver (within --replay-max-offset of the recorded driver's line) or "
        "driver-or-middle (within it of that line or of the road's or lane's middle, measured on the recorded "
        "frames by envs/replay/road.py: a student keeping the middle behind a driver who kept to one side is not "
        "counted off; docs/udacity.md)", group="where it drives", metavar="driver|driver-or-middle")

    def validate(self) -> "EvalArgs":
        """Check and resolve every flag. With --replay before the recording is imported (replay_env), only the
        replay's own flags: the rest needs the env that the import makes."""
        if self.replay is not None and not self.env.startswith(REPLAY_PREFIX):
            return self._check_replay_flags()
        if self.replay is None and (self.replay_span is not None or self.replay_max_offset != EvalArgs.replay_max_offset
                                    or self.replay_reference != EvalArgs.replay_reference):
            raise ValueError("--replay-span, --replay-max-offset and --replay-reference are options of a --replay "
                             "recording; give --replay REC")
        if self.data_span is not None:
            if not self.data:
                raise ValueError("--data-span is the scored part of recorded sessions; give --data REC")
            from envs.replay.spec import parse_span

            parse_span(self.data_span, "--data-span")
        spec = get_spec(self.env)  # ValueError naming the valid envs
        if self.max_steps is None:
            self.max_steps = spec.default_max_steps
        self._resolve_seeds(spec)
        if self.action_space is not None and self.action_space not in spec.action_spaces:
            raise ValueError(f"--action-space must be one of {spec.action_spaces} for {self.env}, got {self.action_space!r}")
        if self.expert_drives and self.checkpoint:
            raise ValueError("give either --checkpoint or --expert-drives, not both (use --with-expert to compare)")
        if self.data and (self.expert_drives or self.with_expert):
            raise ValueError("--data scores policy checkpoints against recorded driving; the expert needs an env "
                             "(drop --expert-drives / --with-expert)")
        if self.expert_drives and self.saliency:
            raise ValueError("--saliency needs a policy with a CNN; the expert reads privileged state, not frames")
        for name, low in (("episodes", 1), ("max_steps", 1), ("video_episodes", 0), ("threads", 1), ("seed", 0)):
            value = getattr(self, name)
            if not is_int(value, low):
                raise ValueError(f"--{name.replace('_', '-')} must be an integer >= {low}, got {value!r}")
        if self.saliency_method not in vid.SALIENCY_METHODS:
            raise ValueError(f"--saliency-method must be one of {vid.SALIENCY_METHODS}, got {self.saliency_method!r}")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"--device must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        if self.device == "auto":
            self.device = "cuda" if torch.cuda.is_available() else "cpu"
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"--device {self.device} was requested but CUDA is not available")
        check_precision(self.precision)
        if self.name and len(self.name) != len(self.checkpoint or [None]):
            raise ValueError(f"--name needs one name per --checkpoint ({len(self.checkpoint or [None])}), got {len(self.name)}")
        if len(set(self.name)) != len(self.name):
            raise ValueError(f"--name lists a name twice: {self.name}")
        if len(set(self.checkpoint)) != len(self.checkpoint):
            raise ValueError(f"--checkpoint lists a file twice: {self.checkpoint}")
        self.renderer = spec.check_renderer(self.renderer)
        if self.workers is None:
            policies = 1 if self.expert_drives else max(1, len(self.checkpoint)) + bool(self.with_expert)
            self.workers = default_workers(self.episodes * policies, self.threads)
        check_workers(self.workers)
        if self.window_clock not in WINDOW_CLOCKS:
            raise ValueError(f"--window-clock must be one of {WINDOW_CLOCKS}, got {self.window_clock!r}")
        if self.discrete_actions is not None and self.discrete_actions not in DISCRETE_ACTION_RULES:
            raise ValueError(f"--discrete-actions must be one of {DISCRETE_ACTION_RULES}, got {self.discrete_actions!r}")
        if self.action_temperature is not None:
            try:
                check_temperature(self.action_temperature, self.discrete_actions or "sample")
            except ValueError as e:
                raise ValueError(f"--action-temperature: {e}") from None
        self.spared  # ValueError on unknown action names
        spec.scene(self.theme, self.condition)  # ValueError on unknown names or an env without scenes
        if self.pi_speed and not spec.pi_speed:
            raise ValueError(f"--pi-speed is for envs whose drivers control the speed; {self.env}'s speed is always "
                             "held by its PI controller")
        if self.pi_speed and (self.expert_drives or self.with_expert):
            raise ValueError("--pi-speed drives steering-only students; the expert drives with throttle (drop "
                             "--expert-drives / --with-expert, or --pi-speed)")
        if self.told_latency_steps is not None and not is_int(self.told_latency_steps, 0, 10_000):
            raise ValueError(f"--told-latency-steps must be an integer in [0, 10000], got {self.told_latency_steps!r}")
        timing = self.timing.check(self.max_steps)
        if self.data and not timing.regular:
            raise ValueError("--drop-prob, --jitter and --latency-steps are conditions of driving in closed loop; "
                             "--data scores recorded frames offline (drop one or the other)")
        return self

    def _check_replay_flags(self) -> "EvalArgs":
        if self.env != EvalArgs.env:
            raise ValueError(f"--replay builds its env from the recording; drop --env {self.env}")
        if self.data:
            raise ValueError("--data scores offline, --replay drives in closed loop: give one of them")
        if not Path(self.replay).exists():
            raise FileNotFoundError(f"--replay {self.replay!r} does not exist (a folder with driving_log.csv and IMG/, "
                                    "or a dataset of the udacity envs)")
        if not self.checkpoint and not self.expert_drives:
            if not is_person_recording(self.replay):
                raise ValueError("--replay drives the students you name: pass --checkpoint CKPT [CKPT ...] (e.g. the "
                                 "best.pt that train.py --data REC made), or --expert-drives to replay the recorded "
                                 "steering")
            self.checkpoint = [str(RECORDING_STUDENT)]  # a person's recording: the student made for real frames
        from envs.replay.spec import parse_span

        parse_span(self.replay_span)
        if isinstance(self.replay_max_offset, bool) or not self.replay_max_offset > 0:
            raise ValueError(f"--replay-max-offset must be a distance > 0 in metres, got {self.replay_max_offset!r}")
        from envs.replay.road import check_reference

        check_reference(self.replay_reference, "--replay-reference")
        return self

    def _resolve_seeds(self, spec: Any) -> None:
        """--seed and --episodes: the env's first evaluation seed and 5 episodes, or every part of a replay."""
        if self.data and self.replay:
            raise ValueError("--data scores offline, --replay drives in closed loop: give one of them")
        if self.seed is None:
            self.seed = spec.seeds.evaluate
        if spec.parts is None:
            self.episodes = 5 if self.episodes is None else self.episodes
            return
        parts = spec.parts(self.replay_span)
        if parts == 0:
            from envs.replay.spec import MIN_PART_FRAMES

            raise ValueError(f"--replay {self.replay!r} has no session of at least {MIN_PART_FRAMES} frames in the span "
                             f"{self.replay_span or '0:1'} in which the car moves")
        if is_int(self.seed) and self.episodes is None:
            self.episodes = max(parts - self.seed, 0)
        if isinstance(self.episodes, int) and isinstance(self.seed, int) and self.seed + self.episodes > parts:
            raise ValueError(f"--replay {self.replay!r} has {parts} part(s) (seeds 0..{parts - 1}); --seed {self.seed} "
                             f"--episodes {self.episodes} asks for more")

    @property
    def timing(self) -> TimingConditions:
        """The timing conditions of the run (ValueError on a malformed --jitter)."""
        return TimingConditions(self.drop_prob, parse_jitter(self.jitter), self.latency_steps)

    @property
    def told_latency_s(self) -> float:
        """Seconds a latency-aware policy is told its actions take to land (--told-latency-steps, else the true
        --latency-steps, times the env's step)."""
        steps = self.latency_steps if self.told_latency_steps is None else self.told_latency_steps
        return steps * get_spec(self.env).dt

    @property
    def make_kwargs(self) -> dict[str, Any]:
        """The env options of the run beyond the spec's defaults: its scenes and the PI speed control."""
        return {**get_spec(self.env).scene(self.theme, self.condition), **({"pi_speed": True} if self.pi_speed else {}),
                **({"span": self.replay_span, "max_offset": self.replay_max_offset,
                    "reference": self.replay_reference} if self.replay else {})}

    @property
    def spared(self) -> tuple[int, ...]:
        """The ids of --temperature-spares (ValueError on names that are no discrete actions)."""
        try:
            return spared_ids(self.temperature_spares)
        except ValueError as e:
            raise ValueError(f"--temperature-spares: {e}") from None

    @property
    def seeds(self) -> list[int]:
        return list(range(self.seed, self.seed + self.episodes))


def is_person_recording(path: str | Path) -> bool:
    """Whether ``path`` is a person's recording of the real simulator: as recorded (driving_log.csv, or the folder
    holding it), or its import."""
    from agent.data.dataset import CARD_NAME, open_dataset
    from agent.udacity.recordings import CSV_NAME, is_raw_recording

    path = Path(path).parent if Path(path).name == CSV_NAME else Path(path)
    if is_raw_recording(path):
        return True
    return (path / CARD_NAME).is_file() and any(is_recording(m) for m in open_dataset(path).episodes)


def safe_name(text: str) -> str:
    """A display name usable as a folder name: runs of anything but letters, digits, '-', '.' become '_'."""
    import re

    return re.sub(r"[^A-Za-z0-9.\-]+", "_", text.strip()).strip("_") or "policy"


def run_names(paths: Sequence[str]) -> list[str]:
    """Short unique names for checkpoints: the file stem, with parent folders added until unique."""
    parts = [Path(p).with_suffix("").parts for p in paths]
    depth = 1
    while True:
        names = ["_".join(pp[-depth:]) for pp in parts]
        if len(set(names)) == len(names) or depth >= max(len(pp) for pp in parts):
            return names
        depth += 1


def evaluate_controller(controller: Any, args: EvalArgs, action_space: str, expert: Any, out_dir: Path,
                        meta: dict[str, Any]) -> dict[str, Any]:
    """All episodes of one policy in this process; writes out_dir/{metrics.json, episodes.csv, tb/, videos/}."""
    env = expert.spec.make(action_space, render=True, max_episode_steps=args.max_steps, renderer=args.renderer,
                           **args.make_kwargs)
    rows: list[dict[str, Any]] = []
    latencies: list[float] = []
    interrupted = False
    bars = show_progress(args.progress)
    episodes = tqdm(args.seeds, desc=controller.name, unit="ep", disable=not bars, file=sys.stderr)
    try:
        for i, seed in enumerate(episodes):
            with tqdm(total=args.max_steps, desc=f"seed {seed}", unit="step", leave=False,
                      disable=not bars, file=sys.stderr) as bar:
                row, lat = run_episode(controller, env, expert, seed, action_space, bar=bar,
                                       **_episode_outputs(args, controller.is_expert, out_dir, i, seed))
            rows.append(row)
            latencies.extend(lat)
            episodes.set_postfix(ret=f"{row['return']:.0f}", completion=f"{row['completion']:.2f}")
            if args.progress and not bars:  # stderr is a file or pipe: a plain line instead of the bars
                print(f"{controller.name}: episode {i + 1}/{len(args.seeds)} (seed {seed}) return {row['return']:.0f}, "
                      f"completion {row['completion']:.2f}", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        stop_handled()
        interrupted = True
    finally:
        episodes.close()
        env.close()
    return _write_policy(rows, latencies, args, out_dir, meta, interrupted)


def _episode_outputs(args: EvalArgs, is_expert: bool, out_dir: Path, i: int, seed: int) -> dict[str, Any]:
    """run_episode's video_path and saliency for episode i (seed) of a policy."""
    record = args.video and i < args.video_episodes
    return {"video_path": out_dir / "videos" / f"seed_{seed}.mp4" if record else None,
            "saliency": args.saliency_method if args.saliency and not is_expert else None,
            "timing": args.timing}


def _write_policy(rows: list[dict[str, Any]], latencies: list[float], args: EvalArgs, out_dir: Path,
                  meta: dict[str, Any], interrupted: bool) -> dict[str, Any]:
    """metrics.json etc. of one policy from its finished episodes (in seed order); Interrupted if it was. The
    scores first, then a replay's path plots and tables: a disk that fills up keeps what matters most."""
    traces = [(row["seed"], row.pop("path_trace")) for row in rows if "path_trace" in row]  # a plot and a table per part
    summary = aggregate(rows, latencies, **meta, interrupted=interrupted,
                        seeds=[r["seed"] for r in rows], requested_seeds=args.seeds,
                        timing=timing_summary(args.timing, meta["dt"], rows))
    write_run(out_dir, summary, tensorboard=args.tensorboard)
    for seed, trace in traces:
        from agent.evaluation.plots import plot_replay_path, write_replay_table

        plot_replay_path(trace, out_dir / "paths" / f"part_{seed}.png", f"{meta['name']}, part {seed}",
                         get_spec(args.env).geometry)
        write_replay_table(trace, out_dir / "paths" / f"part_{seed}.csv")
    if interrupted:
        raise Interrupted(f"interrupted: wrote {len(rows)} finished episode(s) of {meta['name']} to {out_dir}")
    return summary


def env_action_names(env: str, pi_speed: bool) -> list[str] | None:
    """The components of the env's action a student fills: [steer] under a PI speed controller and in a replay
    (which drives at the recorded speed); None: the student's own env's action."""
    if pi_speed:
        return ["steer"]
    spec = get_spec(env)
    return list(spec.action_names["continuous"]) if spec.feeds else None


@dataclass
class Driver:
    """One policy (or the expert) that drives: its display name, its controller and what its metrics.json records
    about it (``meta["source"]``: the checkpoint it was loaded from)."""

    name: str
    controller: Any
    meta: dict[str, Any]


@dataclass(frozen=True)
class WorkerSetup:
    """What every worker process builds its env, expert and controllers from (agent.workers.EpisodePool):
    ``drivers`` as (name, checkpoint), None for the expert."""

    env: str
    action_space: str
    expert_path: str | None
    device: str
    max_steps: int
    renderer: str
    drivers: list[tuple[str, str | None]]
    window_clock: str
    make_kwargs: dict[str, Any]
    discrete_actions: str | None
    action_temperature: float | None
    spared: tuple[int, ...]
    told_latency_s: float

    @classmethod
    def of(cls, args: EvalArgs, action_space: str, drivers: list[Driver]) -> "WorkerSetup":
        return cls(args.env, action_space, args.expert, args.device, args.max_steps, args.renderer,
                   [(d.name, None if d.controller.is_expert else d.meta["source"]) for d in drivers],
                   args.window_clock, args.make_kwargs, args.discrete_actions, args.action_temperature, args.spared,
                   args.told_latency_s)


@dataclass
class WorkerState:
    """A worker's own env, expert and controllers, built once by _worker_setup."""

    sim: Any
    expert: Any
    action_space: str
    controllers: list[Any]


@dataclass(frozen=True)
class EpisodeTask:
    """One episode for a worker: which driver, on which track seed, with which outputs (video, saliency)."""

    driver: int
    seed: int
    outputs: dict[str, Any]


def _worker_setup(s: WorkerSetup) -> WorkerState:
    """In a worker process: its own env, expert and controllers."""
    from agent.experts.expert import Expert

    expert = Expert.load(s.expert_path, s.action_space, s.env)
    filled = env_action_names(s.env, s.make_kwargs.get("pi_speed", False))
    controllers = [ExpertController(expert) if path is None else
                   PolicyController(load_policy(path, s.env, s.action_space, s.device), name, s.device,
                                    s.window_clock, filled, s.discrete_actions, s.action_temperature, s.spared,
                                    s.told_latency_s)
                   for name, path in s.drivers]
    sim = expert.spec.make(s.action_space, render=True, max_episode_steps=s.max_steps, renderer=s.renderer,
                           **s.make_kwargs)
    return WorkerState(sim, expert, s.action_space, controllers)


def _worker_episode(state: WorkerState, task: EpisodeTask,
                    on_step: Callable[[], None]) -> tuple[dict[str, Any], list[float]]:
    return run_episode(state.controllers[task.driver], state.sim, state.expert, task.seed, state.action_space,
                       on_step=on_step, **task.outputs)


def _evaluate_parallel(drivers: list[Driver], args: EvalArgs, action_space: str, out_dirs: list[Path],
                       results: dict[str, dict[str, Any]]) -> None:
    """Every (policy, seed) episode in args.workers processes. Each episode depends only on its seed, so the
    rows (and videos) are the serial run's; each policy's files are written, in seed order, once its last
    episode is in. Ctrl-C: every policy with finished episodes gets its files, marked interrupted."""
    n = len(args.seeds)
    rows: list[dict[int, tuple[dict[str, Any], list[float]]]] = [{} for _ in drivers]
    tasks = [((t, i), EpisodeTask(t, seed, _episode_outputs(args, d.controller.is_expert, out_dirs[t], i, seed)))
             for t, d in enumerate(drivers) for i, seed in enumerate(args.seeds)]
    bars = show_progress(args.progress)
    bar = tqdm(total=len(tasks) * args.max_steps, unit="step", desc=f"{len(drivers)} x {n} episodes",
               disable=not bars, file=sys.stderr)
    written = 0

    def write(t: int, interrupted: bool = False) -> dict[str, Any]:
        done = [rows[t][i] for i in sorted(rows[t])]
        return _write_policy([r for r, _ in done], [x for _, lat in done for x in lat], args, out_dirs[t],
                             drivers[t].meta, interrupted)

    try:
        with EpisodePool(min(args.workers, len(tasks)), _worker_setup, (WorkerSetup.of(args, action_space, drivers),),
                         _worker_episode, threads=args.threads, preload=_preload(args.env)) as pool:
            for (t, i), (row, lat) in pool.run(tasks, on_steps=bar.update):
                rows[t][i] = (row, lat)
                if args.progress and not bars:
                    print(f"{drivers[t].name}: episode {i + 1}/{n} (seed {args.seeds[i]}) return {row['return']:.0f}, "
                          f"completion {row['completion']:.2f}", file=sys.stderr, flush=True)
                while written < len(drivers) and len(rows[written]) == n:
                    name = drivers[written].name
                    results[name] = write(written)
                    tqdm.write(summary_line(name, results[name]))
                    written += 1
    except KeyboardInterrupt:
        stop_handled()
        partial = [t for t in range(written, len(drivers)) if rows[t]]
        for t in partial:
            try:
                write(t, interrupted=True)
            except Interrupted:
                pass
        kept = sum(len(rows[t]) for t in partial)
        raise Interrupted(f"interrupted: wrote {kept} finished episode(s) of "
                          f"{', '.join(drivers[t].name for t in partial) or 'no policy'} "
                          f"to {out_dirs[partial[0]] if len(partial) == 1 else out_dirs[0].parent}") from None
    finally:
        bar.close()


def _preload(env: str) -> list[str]:
    """What a worker imports: done once in the fork server, not in every worker."""
    return [__name__, "agent.experts.expert", "stable_baselines3", "policies.policy", get_spec(env).make.__module__]


def replay_env(args: EvalArgs, made: list[Path] | None = None) -> None:
    """--replay REC: a raw simulator recording is imported once into OUT/imported_data (a dataset is used as it
    is), and the run's env becomes the replay of that dataset (envs/replay). ``made``: the import made now."""
    from agent.udacity.recordings import import_recordings

    if args.replay is None or args.env.startswith(REPLAY_PREFIX):
        return
    args._check_replay_flags()
    root = Path(args.out) if args.out else Path("eval") / "replay"
    [folder] = import_recordings([args.replay], [root / "imported_data"], warn=tqdm.write, made=made)
    args.env = REPLAY_PREFIX + str(Path(folder).resolve())


def evaluate(args: EvalArgs, *, command: str | None = None) -> dict[str, dict[str, Any]]:
    """Evaluate every requested policy on the same seeds; returns {name: metrics.json summary}. A recording
    imported for it is removed again when the run is refused (a bad checkpoint, frames of another size)."""
    from agent.udacity.recordings import removed_if_refused

    made: list[Path] = []
    with removed_if_refused(made):
        replay_env(args, made)
        args.validate()
        previous = torch.get_num_threads()
        torch.set_num_threads(args.threads)  # intra-op threads; single-frame inference is fastest with 1
        try:
            return _evaluate_recorded(args, made) if args.data else _evaluate(args, command)
        finally:
            torch.set_num_threads(previous)  # a library call should not leave the process single-threaded


def _evaluate(args: EvalArgs, command: str | None) -> dict[str, dict[str, Any]]:
    from agent.experts.expert import Expert

    if args.workers > 1:
        warm_up(_preload(args.env))  # the workers' imports run while this process loads the policies
    # 1. what to drive (load everything first, so a bad checkpoint fails before any driving)
    drivers, action_space = _policy_drivers(args)
    expert = Expert.load(args.expert, action_space, args.env)
    if expert.spec.collection_noise:  # a replay of a collect.py dataset: its reference path is the noised drive's
        tqdm.write(f"note: {args.replay} was collected with DART noise {expert.spec.collection_noise:g}: the recorded "
                   "path it is judged against wobbles with it (collect.py --noise 0 records a drive for replays)")
    expert_meta = _expert_meta(expert)
    if args.expert_drives or args.with_expert:
        drivers.append(Driver("expert", ExpertController(expert), dict(expert_meta)))
    # 2. where
    default_name = drivers[0].name if len(drivers) == 1 else "compare"
    root = Path(args.out) if args.out else Path("eval") / ("replay" if args.replay else default_name)
    single = len(drivers) == 1
    common = _common_meta(args, expert, action_space, expert_meta["source"], command)
    # 3. drive
    results: dict[str, dict[str, Any]] = {}
    drivers = [Driver(d.name, d.controller, {"name": d.name, **d.meta, **common}) for d in drivers]
    out_dirs = [root if single else root / d.name for d in drivers]
    try:
        if args.workers > 1 and len(drivers) * args.episodes > 1:
            _evaluate_parallel(drivers, args, action_space, out_dirs, results)
        else:  # one process: the policies one after the other, their episodes in order
            for d, out_dir in zip(drivers, out_dirs):
                results[d.name] = evaluate_controller(d.controller, args, action_space, expert, out_dir, d.meta)
                tqdm.write(summary_line(d.name, results[d.name]))
    finally:
        if not single and results:
            _write_comparison(root, args, action_space, results)
    videos = sorted(root.glob("videos/*.mp4" if single else "*/videos/*.mp4"))
    paths = sorted(root.glob("paths/*.png" if single else "*/paths/*.png"))
    tqdm.write(f"outputs in {root}/: " + ("metrics.json, episodes.csv" if single else "comparison.md, <policy>/metrics.json")
               + (f", {len(videos)} video(s) ({videos[0].relative_to(root)}, ...)" if videos else "")
               + (f", the driven path of each part ({paths[0].relative_to(root)} and .csv, ...)" if paths else "")
               + (f"; TensorBoard: {tensorboard_command(root)}" if args.tensorboard else ""))
    return results


def _policy_drivers(args: EvalArgs) -> tuple[list[Driver], str]:
    """The checkpoints that drive, and their common action space."""
    if args.expert_drives:
        return [], args.action_space or get_spec(args.env).action_spaces[0]
    paths = list(args.checkpoint) or [str(shipped_checkpoint(args.env))]
    policies = [load_policy(p, args.env, args.action_space, args.device) for p in paths]
    spaces = {p.config.action_space for p in policies}
    if len(spaces) > 1:
        raise ValueError(f"--checkpoint files mix action spaces {sorted(spaces)}; compare one action space "
                         f"at a time (the expert that shadows them differs)")
    for path, policy in zip(paths, policies):
        _check_actions(args, path, policy.config)
    names = [safe_name(n) for n in args.name] if args.name else run_names(paths)
    drivers = []
    for path, name, policy in zip(paths, names, policies):
        controller = PolicyController(policy, name, args.device, args.window_clock,
                                      env_action_names(args.env, args.pi_speed), args.discrete_actions,
                                      args.action_temperature, args.spared, args.told_latency_s)
        drivers.append(Driver(name, controller, {
            "source": str(path), "policy_config": policy.config.to_dict(),
            "num_parameters": int(sum(p.numel() for p in policy.parameters())),
            "filled_from_expert": controller.filled, "window_clock": args.window_clock,
            **({"latency_input": policy.config.latency_input, "told_latency_s": args.told_latency_s}
               if policy.config.latency_input != "none" else {}),
            **({"discrete_actions": controller.actions, "action_temperature": controller.temperature,
                **({"temperature_spares": [DISCRETE_ACTIONS[i] for i in args.spared]} if args.spared else {})}
               if policy.config.head == "discrete" else {}),
        }))
    return drivers, spaces.pop()


def _check_actions(args: EvalArgs, path: str, cfg: Any) -> None:
    """A continuous checkpoint must predict the actions the env takes: [steer] with --pi-speed, else the spec's;
    --discrete-actions sample needs a discrete one."""
    _check_discrete_options(args, path, cfg)
    spec = get_spec(args.env)
    if cfg.head != "continuous" or not spec.pi_speed:
        return
    names, wanted = tuple(cfg.action_names), ("steer",) if args.pi_speed else tuple(spec.action_names[cfg.action_space])
    if names == wanted:
        return
    if names == ("steer",):
        raise ValueError(f"checkpoint {path!r} predicts steering only, but {args.env} is driven with {list(wanted)}; "
                         "pass --pi-speed to let the env's PI controller hold the speed")
    raise ValueError(f"checkpoint {path!r} predicts {list(names)}, but {args.env} "
                     f"{'with --pi-speed ' if args.pi_speed else ''}is driven with {list(wanted)}")


def _check_discrete_options(args: EvalArgs, path: str, cfg: Any) -> None:
    """--discrete-actions other than argmax, --action-temperature and --temperature-spares need a discrete student,
    and the last two a rule that samples (policies.actions.check_discrete_options, named by the flags)."""
    check_discrete_options(cfg.head, cfg.discrete_actions, args.discrete_actions, args.action_temperature,
                           args.temperature_spares is not None, f"checkpoint {path!r}",
                           ("--discrete-actions", "--action-temperature", "--temperature-spares"))


def _expert_meta(expert: Any) -> dict[str, Any]:
    """The expert's file and the headline of its own card (the baseline row of comparison.md)."""
    card = expert.card.get("evaluation") or {}
    meta = {"source": str(expert.path), "expert_card_evaluation": {
        k: card[k] for k in ("mean_return", "std_return", "laps_finished", "episodes") if k in card}}
    if card.get("seeds"):
        meta["expert_card_evaluation"]["seeds"] = f"{min(card['seeds'])}..{max(card['seeds'])}"
    return meta


def _common_meta(args: EvalArgs, expert: Any, action_space: str, expert_source: str,
                 command: str | None) -> dict[str, Any]:
    """What every policy's metrics.json records about the run: env, units, how latency was timed, versions."""
    spec = expert.spec
    return {
        "env": args.env, "env_id": spec.gym_id, "action_space": action_space, "dt": spec.dt,
        **({"intervention_cost_s": spec.intervention_cost_s,
            "interventions": "the car left its lane (spec.on_road false) or the road"
                             + (f", or stalled (below {spec.stall[0]} m/s for {spec.stall[1]} s; restarted at "
                                f"{spec.stall[2]} m/s, counted in stalls)" if spec.stall else "")
                             + "; it was put back on the centre line and drove on; "
                               "autonomy = 100 * (1 - interventions * cost / elapsed s)"}
           if spec.recover is not None and spec.parts is None else {}),
        "max_steps": args.max_steps, "device": args.device, "torch_threads": torch.get_num_threads(),
        "precision": "fp32",  # one frame per step: fp32 under every --precision (policies/precision.py)
        "expert": expert_source,
        "steer_units": (f"env steer command (action[0]); full scale ±{spec.steer_limit[action_space]}"
                        if action_space == "continuous"
                        else "discrete: RIGHT=+1, LEFT=-1, other actions 0"),
        "latency": "time.perf_counter() around policy stream.step (expert: around Expert.act), per step, ms",
        "command": command or " ".join(shlex.quote(a) for a in sys.argv),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "torch_version": torch.__version__,
        "renderer": args.renderer, "workers": args.workers,
        **{k: list(v) if isinstance(v, tuple) else v for k, v in args.make_kwargs.items()},
        **({"replay": _replay_meta(args, spec)} if spec.parts is not None else {}),
    }


def _replay_meta(args: EvalArgs, spec: Any) -> dict[str, Any]:
    """What a replay's figures rest on: the recording, its parts, the camera and car, the intervention rule."""
    from envs.replay.vehicle import DEFAULT_MAX_YAW_RAD

    return {"recording": args.replay, "dataset": spec.name[len(REPLAY_PREFIX):], "span": args.replay_span or "0:1",
            "geometry": spec.geometry.to_dict(), "dart_noise": spec.collection_noise,
            "intervention": f"more than {args.replay_max_offset:g} m from the recorded path or more than "
                            f"{math.degrees(DEFAULT_MAX_YAW_RAD):.0f} degrees off its direction (measured from the "
                            + ("recorded driver's line, not the road's edges" if args.replay_reference == "driver" else
                               "recorded driver's line and from the road's middle measured on the recorded frames, "
                               "envs/replay/road.py: off when beyond both")
                            + "); the car is put back on the path",
            "straight": "straight_*: the always-straight driver on the same parts (the trivial reference)"}


def _write_comparison(root: Path, args: EvalArgs, action_space: str, results: dict[str, dict[str, Any]]) -> None:
    rows = list(results.items())
    root.mkdir(parents=True, exist_ok=True)
    title = (f"# Closed-loop evaluation: {args.env} ({action_space}), seeds {args.seeds[0]}..{args.seeds[-1]}, "
             f"max {args.max_steps} steps" + ("" if args.timing.regular else f", {args.timing.label()}") + "\n\n")
    atomic_write_text(root / "comparison.md", title + cut_short_note(args) + comparison_markdown(rows))
    write_json(root / "comparison.json", {n: {k: v for k, v in s.items() if k != "episodes"} for n, s in rows})


def cut_short_note(args: EvalArgs) -> str:
    """A paragraph for comparison.md when --max-steps ends the episodes before the env does: its returns and laps are
    then below the full episodes' of a model card (and the README's headline figures); '' otherwise."""
    spec = get_spec(args.env)
    if spec.parts is not None or args.max_steps >= spec.default_max_steps:
        return ""
    return (f"Episodes end at {args.max_steps} steps ({args.max_steps * spec.dt:g} s), before {args.env}'s own "
            f"{spec.default_max_steps}: return, completion and laps count only that far, so they fall short of the "
            f"full-episode figures of the shipped models' cards and the README ({len(args.seeds)} episode(s) here).\n\n")


def _evaluate_recorded(args: EvalArgs, made: list[Path] | None = None) -> dict[str, dict[str, Any]]:
    """--data: score every checkpoint on recorded driving (agent.evaluation.offline): steering, or a discrete
    student's actions at the temperature it samples at (its own, or --action-temperature)."""
    from agent.evaluation.offline import (camera_students, evaluate_recorded, offline_markdown, recorded_data,
                                          recorded_frame_shape, vs_straight)
    from envs.replay.spec import parse_span

    root = Path(args.out) if args.out else Path("eval") / "offline"
    data = recorded_data(args.data, root, made=made)
    env = dataset_env(data.card, data.episodes)
    # a person's recording of the real simulator: the student made for its frames
    real = any(is_recording(m) for m in data.episodes)
    paths = list(args.checkpoint) or [str(RECORDING_STUDENT if real else shipped_checkpoint(env.name))]
    precision = resolve_precision(args.precision, args.device)
    policies = [load_policy(p, env.name, None, args.device, camera_students(data), recorded_frame_shape(data),
                            recorded=True).use_precision(precision)
                for p in paths]
    names = [safe_name(n) for n in args.name] if args.name else run_names(paths)
    for path, policy in zip(paths, policies):
        _check_discrete_options(args, path, policy.config)
    results = {}
    for name, policy in zip(names, policies):
        temperature = (args.action_temperature if args.action_temperature is not None
                       else policy.config.temperature_for(args.discrete_actions))
        results[name] = evaluate_recorded(policy, data, root if len(paths) == 1 else root / name, name,
                                          progress=show_progress(args.progress), temperature=temperature,
                                          spared=args.spared, span=parse_span(args.data_span, "--data-span"))
        p = results[name]["pooled"]
        if "accuracy" in p:
            tqdm.write(f"{name}: agrees with the recorded action on {p['accuracy']:.3f} of {p['frames']} frames "
                       f"(always {p['commonest_label']}: {p['commonest_label_accuracy']:.3f}); mean probabilities at "
                       f"temperature {temperature:g}: " + ", ".join(
                           f"{a} {x:.3f}" for a, x in zip(p["action_names"], p["mean_probs"])))
        else:
            tqdm.write(f"{name}: steering MSE {p['policy_avg']['mse']:.4f} vs the 0.5 s average "
                       f"{vs_straight(p)}, "
                       f"{p['policy_raw']['mse']:.4f} vs the recorded values ({p['straight_raw']['mse']:.4f} straight), "
                       f"{p['frames']} frames")
    discrete = "accuracy" in next(iter(results.values()))["pooled"]
    table = offline_markdown(results)
    atomic_write_text(root / "offline.md", f"# Offline {'action' if discrete else 'steering'} scores on "
                                           f"{', '.join(args.data)}\n\n{table}")
    tqdm.write(f"outputs in {root}/: offline.md, offline.json" + ("" if discrete else ", steering_<session>.png"))
    return results


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
            f"{s['straight_autonomy']:.1f} %, {s['straight_interventions']} ({s['straight_interventions_per_100s']:.1f} "
            "per 100 s)")


def _timing_note(timing: dict[str, Any] | None) -> str:
    """'; the driver saw 80.1 % of the frames (...)' under timing conditions; '' under regular timing."""
    if not timing or timing["regular"]:
        return ""
    return (f"; the driver saw {100 * timing['frames_seen_fraction']:.1f} % of the frames "
            f"(drop {timing['drop_prob']:g}, jitter {timing['jitter'] or 'off'}, latency {timing['latency_steps']} steps)")
