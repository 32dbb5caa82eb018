"""What evaluate.py is asked to do: EvalArgs, one flag per field (common.cli builds the parser), and its checks
(``check_args``: a user's mistake is one ValueError line). agent.evaluation.config turns the checked arguments into the
small configs the rest of evaluation takes."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from driving_data.dataset import is_recording
from agent.controllers import shipped_checkpoint
from agent.evaluation.timing import TimingConditions, parse_jitter
from agent.evaluation.video import SALIENCY_METHODS
from agent.workers import MAX_WORKERS, check_workers
from common.checks import is_int
from common.cli import check_choices, option
from envs.registry import ENV_NAMES, REPLAY_PREFIX, get_spec
from envs.replay.options import (check_replay_options, parse_span, replay_max_offset_option, replay_reference_option,
                                 replay_span_option)
from policies.actions import spared_ids
from policies.checkpoint import RECORDING_STUDENT
from policies.options import action_temperature_option, check_action_options, discrete_actions_option, precision_option
from policies.policy import WINDOW_CLOCKS


@dataclass
class EvalArgs:
    """Closed-loop evaluation arguments: one evaluate.py flag per field (common.cli builds the parser)."""

    env: str = option("carracing",
        f"environment: {' | '.join(ENV_NAMES)}", group="where it drives", choices=ENV_NAMES)
    checkpoint: list[str] = option([],
        "policy checkpoint(s) (.pt from train.py) that drive; several -> one sub-folder each + comparison.md "
        "(default: the env's shipped student, checkpoints/<env>_nac.pt"
        + "".join(f"; {e}: {shipped_checkpoint(e)}" for e in ENV_NAMES
                  if shipped_checkpoint(e) != Path(f"checkpoints/{e}_nac.pt"))
        + f"; --data or --replay on a real simulator recording: {RECORDING_STUDENT}, the one made for its frames)",
        group="what drives", metavar="CKPT")
    name: list[str] = option([],
        "display names of the --checkpoint policies, in order, in comparison.md and as folder names (default:"
        " the file stems)", group="what drives", metavar="NAME")
    expert_drives: bool = option(False, "the PPO expert drives instead of a policy checkpoint: the baseline",
                                 group="what drives")
    action_space: str | None = option(None,
        "continuous | discrete (carracing); must match the checkpoint (default: the checkpoint's; expert: "
        "continuous)", group="what drives", choices=("continuous", "discrete"))
    episodes: int | None = option(None,
        "episodes (= consecutive track seeds) per policy (default: 5; --replay: every session)",
        group="where it drives")
    seed: int | None = option(None,
        "first track seed: episodes run on seeds SEED..SEED+EPISODES-1 (default: 1000, unseen by training; "
        "--replay: 0, its first session)", group="where it drives")
    max_steps: int | None = option(None,
        "env steps per episode (default: the env's limit, carracing 1000)", group="where it drives")
    video: bool = option(True, help="record mp4 videos (OUT/videos/seed_K.mp4)", group="output")
    video_episodes: int = option(1, help="record the first N episodes of each policy", group="output")
    saliency: bool = option(False, help="overlay a CNN saliency map on the videos", group="output")
    saliency_method: str = option("gradcam",
        "gradcam (paper fig. 6) | visualbackprop", group="output", choices=SALIENCY_METHODS)
    with_expert: bool = option(False,
        "also evaluate the expert on the same seeds (a row of comparison.md)", group="what drives")
    expert: str | None = option(None,
        "expert .zip that shadows the policy (steering MAE) and drives with --expert-drives (default: the "
        "env's shipped one in checkpoints/)", group="what drives")
    out: str | None = option(None,
        "output folder (default: eval/<name>, or eval/compare for several)", group="output")
    device: str = option("auto", help="auto (cuda if available) | cpu | cuda | cuda:N", group="runtime")
    threads: int = option(1, help="torch threads per process (a drive encodes one frame per step)", group="runtime")
    precision: str = precision_option()
    tensorboard: bool = option(True, help="write TensorBoard scalars to OUT/tb", group="output")
    progress: bool = option(True,
        "progress bars on stderr when it is a terminal (else one line per episode)", group="runtime")
    renderer: str | None = option(None,
        "who draws the camera frames: carracing pygame (gymnasium's, the reference the shipped students were "
        "trained on) | fast (OpenCV, about 12x faster); udacity: native (default: the env's first)",
        group="where it drives")
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
        "stepped and its last action is held (the first frame of an episode always arrives)",
        group="evaluation conditions", metavar="P")
    jitter: str | None = option(None,
        "timing: K1:K2, the policy gets a frame every k env steps, k drawn from K1..K2 at each frame; the env"
        " keeps its own dt and the action is held in between (default: every step)", group="evaluation conditions",
        metavar="K1:K2")
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
    discrete_actions: str | None = discrete_actions_option()
    action_temperature: float | None = action_temperature_option()
    temperature_spares: str | None = option(None,
        "discrete students that sample or dither: comma-separated actions (e.g. brake) that keep their "
        "probability at temperature 1 while the others share the rest at --action-temperature",
        group="what drives", metavar="ACTIONS")
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
        "always-straight's, paths/part_K.png the driven path (default OUT: eval/replay)", group="where it drives",
        metavar="REC")
    replay_span: str | None = replay_span_option()
    data_span: str | None = option(None,
        "with --data: A:B, the part of every session whose steering is scored, as fractions (0.8:1 = what "
        "train.py --split blocks holds out); the policy still streams through the whole session (default: 0:1)",
        group="where it drives", metavar="A:B")
    replay_max_offset: float = replay_max_offset_option()
    replay_reference: str = replay_reference_option()


def is_person_recording(path: str | Path) -> bool:
    """Whether ``path`` is a person's recording of the real simulator: as recorded (driving_log.csv, or the folder
    holding it), or its import."""
    from driving_data.dataset import CARD_NAME, open_dataset
    from driving_data.udacity_import import is_raw_recording
    from driving_data.udacity_log import CSV_NAME

    path = Path(path).parent if Path(path).name == CSV_NAME else Path(path)
    if is_raw_recording(path):
        return True
    return (path / CARD_NAME).is_file() and any(is_recording(m) for m in open_dataset(path).episodes)



def check_args(a: EvalArgs) -> None:
    """Every flag's value, before anything is read or written (a ValueError, one line, names the flag). With
    --replay before its recording is imported, only the replay's own flags: the rest needs the env the import
    makes (agent.evaluation.config.resolve checks again once it is made)."""
    check_choices(a, skip=("env",))  # --env's choices, and the replay:FOLDER that resolve makes: get_spec's check
    if a.replay is not None and not a.env.startswith(REPLAY_PREFIX):
        _check_replay(a.replay, a.env, bool(a.data), bool(a.checkpoint or a.expert_drives))
        check_replay_options(a.replay_span, a.replay_max_offset)
        return
    if a.replay is None and (a.replay_span is not None or a.replay_max_offset != EvalArgs.replay_max_offset
                             or a.replay_reference != EvalArgs.replay_reference):
        raise ValueError("--replay-span, --replay-max-offset and --replay-reference are options of a --replay "
                         "recording; give --replay REC")
    if a.data_span is not None:
        if not a.data:
            raise ValueError("--data-span is the scored part of recorded sessions; give --data REC")
        parse_span(a.data_span, "--data-span")
    spec = get_spec(a.env)  # ValueError naming the valid envs
    if a.data and a.replay:
        raise ValueError("--data scores offline, --replay drives in closed loop: give one of them")
    if a.action_space is not None and a.action_space not in spec.action_spaces:
        raise ValueError(f"--action-space must be one of {spec.action_spaces} for {a.env}, got {a.action_space!r}")
    _check_drivers(a.checkpoint, a.name, a.expert_drives, a.with_expert, bool(a.data), a.saliency)
    for name, low in (("episodes", 1), ("max_steps", 1), ("video_episodes", 0), ("threads", 1), ("seed", 0)):
        value = getattr(a, name)
        if value is not None and not is_int(value, low):
            raise ValueError(f"--{name.replace('_', '-')} must be an integer >= {low}, got {value!r}")
    if a.device not in ("auto", "cpu", "cuda") and not a.device.startswith("cuda:"):
        raise ValueError(f"--device must be auto, cpu, cuda or cuda:N, got {a.device!r}")
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {a.device} was requested but CUDA is not available")
    spec.check_renderer(a.renderer)
    if a.workers is not None:
        check_workers(a.workers)
    check_action_options(a.discrete_actions, a.action_temperature)
    spared(a.temperature_spares)
    spec.scene(a.theme, a.condition)  # ValueError on unknown names or an env without scenes
    if a.pi_speed and not spec.pi_speed:
        raise ValueError(f"--pi-speed is for envs whose drivers control the speed; {a.env}'s speed is always "
                         "held by its PI controller")
    if a.pi_speed and (a.expert_drives or a.with_expert):
        raise ValueError("--pi-speed drives steering-only students; the expert drives with throttle (drop "
                         "--expert-drives / --with-expert, or --pi-speed)")
    if a.told_latency_steps is not None and not is_int(a.told_latency_steps, 0, 10_000):
        raise ValueError(f"--told-latency-steps must be an integer in [0, 10000], got {a.told_latency_steps!r}")
    timing = timing_of(a.drop_prob, a.jitter, a.latency_steps).check(a.max_steps or spec.default_max_steps)
    if a.data and not timing.regular:
        raise ValueError("--drop-prob, --jitter and --latency-steps are conditions of driving in closed loop; "
                         "--data scores recorded frames offline (drop one or the other)")


def _check_drivers(checkpoints: list[str], names: list[str], expert_drives: bool, with_expert: bool, data: bool,
                   saliency: bool) -> None:
    """Who drives: checkpoints or the expert, their --name, and what each can do."""
    if expert_drives and checkpoints:
        raise ValueError("give either --checkpoint or --expert-drives, not both (use --with-expert to compare)")
    if data and (expert_drives or with_expert):
        raise ValueError("--data scores policy checkpoints against recorded driving; the expert needs an env "
                         "(drop --expert-drives / --with-expert)")
    if expert_drives and saliency:
        raise ValueError("--saliency needs a policy with a CNN; the expert reads privileged state, not frames")
    if names and len(names) != len(checkpoints or [None]):
        raise ValueError(f"--name needs one name per --checkpoint ({len(checkpoints or [None])}), got {len(names)}")
    if len(set(names)) != len(names):
        raise ValueError(f"--name lists a name twice: {names}")
    if len(set(checkpoints)) != len(checkpoints):
        raise ValueError(f"--checkpoint lists a file twice: {checkpoints}")


def _check_replay(replay: str, env: str, data: bool, drivers_named: bool) -> None:
    """What a --replay run can be checked on before its recording is imported (the rest needs its env)."""
    if env != EvalArgs.env:
        raise ValueError(f"--replay builds its env from the recording; drop --env {env}")
    if data:
        raise ValueError("--data scores offline, --replay drives in closed loop: give one of them")
    if not Path(replay).exists():
        raise FileNotFoundError(f"--replay {replay!r} does not exist (a folder with driving_log.csv and IMG/, "
                                "or a dataset of the udacity envs)")
    if not drivers_named and not is_person_recording(replay):
        raise ValueError("--replay drives the students you name: pass --checkpoint CKPT [CKPT ...] (e.g. the "
                         "best.pt that train.py --data REC made), or --expert-drives to replay the recorded "
                         "steering")


def timing_of(drop_prob: float, jitter: str | None, latency_steps: int) -> TimingConditions:
    """The timing conditions of a run (ValueError on a malformed --jitter)."""
    return TimingConditions(drop_prob, parse_jitter(jitter), latency_steps)


def spared(temperature_spares: str | None) -> tuple[int, ...]:
    """The ids of --temperature-spares (ValueError on names that are no discrete actions)."""
    try:
        return spared_ids(temperature_spares)
    except ValueError as e:
        raise ValueError(f"--temperature-spares: {e}") from None


def default_out(students: Sequence[str], names: Sequence[str], *, expert: bool, data: bool, replay: bool) -> Path:
    """eval/offline for --data, eval/replay for --replay; else eval/<name> of the one who drives, eval/compare for
    several. ``students``: the checkpoints that drive (the default one filled in), ``names``: their --name,
    ``expert``: the expert drives too."""
    if data:
        return Path("eval") / "offline"
    if replay:
        return Path("eval") / "replay"
    drivers = ([safe_name(n) for n in names] or run_names(students)) if students else []
    drivers += ["expert"] if expert else []
    return Path("eval") / (drivers[0] if len(drivers) == 1 else "compare")


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
