"""What the rest of the project knows about one environment: an `EnvSpec`, so `agent/` and the CLIs never branch on an
env's name.

Everything the collector, the evaluator, the expert trainer and the video need to know about an env is a field or a
method here: how to make it (rendered or physics-only, for the expert or for recording), its action spaces and their
names, the step time, the camera frame, the seed ranges that keep training and evaluation tracks apart, what to record
per step, and how to read progress, laps and "on the road" from `info`. Each env module defines one (`SPEC`); this
module imports nothing else of `envs/`, so the env modules and the lookups (`envs.catalog`, `envs.registry`) all build
on it without importing each other. (LeRobot's `EnvConfig` registry is the model.)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import gymnasium as gym


@dataclass(frozen=True)
class SeedRanges:
    """Track seeds, kept disjoint so no student or expert is ever evaluated on a track it saw.

    Everything below `reserved_below` is for evaluation and checkpoint selection; the expert trains on
    `[train_low, train_high)`; collect.py records from `collect` upwards."""

    evaluate: int = 1000  # evaluate.py's first seed (and the expert card's evaluation tracks)
    card: tuple[int, ...] = tuple(range(1000, 1020))  # the expert card's evaluation tracks
    validation: tuple[int, ...] = tuple(range(90_000, 90_020))  # the expert's checkpoint selection
    train_low: int = 100_000
    train_high: int = 2_000_000
    collect: int = 3_000_000
    reserved_below: int = 100_000


@dataclass(frozen=True)
class EnvSpec:
    """What the rest of the project knows about one environment (see the module docstring)."""

    name: str  # the --env name
    gym_id: str  # the gymnasium id (PolicyConfig.env of a checkpoint trained on it)
    description: str
    action_spaces: tuple[str, ...]  # the first is the default
    dt: float  # seconds per env step
    frame_shape: tuple[int, int, int]  # the student's camera frame (H, W, 3)
    feature_names: tuple[str, ...]  # the expert's privileged observation, info["privileged"]
    # make(action_space, render=..., max_episode_steps=..., render_mode=None, side_cameras=False, renderer=...) -> env
    # whose obs is the frame and whose info holds "privileged", "speed" and the keys read below
    make: Callable[..., gym.Env]
    # make_expert_env(action_space, render=..., max_episode_steps=...) -> privileged obs, PPO's action space
    make_expert_env: Callable[..., gym.Env]
    # make_train_env(action_space) -> the expert's training env (shaped reward; the caller seeds its training tracks)
    make_train_env: Callable[[str], gym.Env]
    expert_to_env_action: Callable[[Any, str], Any]  # PPO action -> env action
    teacher: Callable[[], Any]  # a scripted privileged driver with .ppo_action(obs, action_space) (BC warm start)
    action_names: dict[str, tuple[str, ...]]  # per action space: names of the env action's components
    steer_limit: dict[str, float]  # per action space: HUD full scale of the steering bar
    default_expert: dict[str, Path]  # per action space: the shipped expert
    default_noise: dict[str, float]  # per action space: DART noise (see agent.data.recorder)
    default_noise_hold: dict[str, int]
    default_max_steps: int
    default_encoder: str  # policies.encoders name for a student of this env
    default_frame_stride: int  # steps between the frames of a student's window
    progress: Callable[[dict], float]  # fraction of the episode's course covered so far (0..1, may pass 1)
    lap_complete: Callable[[dict], bool]
    on_road: Callable[[dict], bool]
    episode_meta: Callable[[dict], dict]  # what the last info says about an episode (lap, tiles, laps, ...)
    first_person: bool = False  # a car-mounted camera: mirrored frames with negated steering are valid samples,
    # and a sideways shift of the image is a lateral offset of the car (the Udacity/PilotNet augmentations)
    default_crop: tuple[int, int] | None = None  # rows of the camera frame a student keeps (sky and bonnet off)
    # train.py --color-jitter for a student of this env (scenes whose colours it never saw)
    default_color_jitter: float = 0.0
    default_image_size: tuple[int, int] | None = None  # a student's encoder input (None: the frame, cropped)
    default_color: str = "rgb"  # rgb | yuv, the colour space a student's encoder sees
    # lane keeping: recover(env, speed=None) -> (obs, info) puts a car that left its lane back on the centre line
    # (an intervention, charged intervention_cost_s in NVIDIA's autonomy; speed: also set the car's speed, m/s);
    # lateral_error(info) -> |offset| in m
    recover: Callable[..., tuple[Any, dict]] | None = None
    # lane keeping with speed control: (m/s, s, m/s): a car below the first speed for the given seconds has stalled
    # (a car that stands still keeps its lane but drives nobody): an intervention that restarts it at the third
    stall: tuple[float, float, float] | None = None
    intervention_cost_s: float = 6.0
    lateral_error: Callable[[dict], float] | None = None
    # wrong_way(info) -> the car points against the course's direction (heading error beyond 90 degrees): after a
    # spin a student may follow the road backwards, which an expert reading only the local road does not correct
    wrong_way: Callable[[dict], bool] | None = None
    # recovery_teacher() -> a privileged driver with .needs(privileged) (the states the expert does not know:
    # pointing the wrong way, far off the road) and .env_action(privileged, action_space), the way back from them
    # (collect.py --recovery-labels; --recovery-starts places the car with make()'s reset options start_turn,
    # start_offset, start_fraction)
    recovery_teacher: Callable[[], Any] | None = None
    recovery_start: Callable[[Any], dict] | None = None  # (numpy Generator) -> make()'s reset options of one start
    recorded_info: dict[str, str] = field(default_factory=dict)  # dataset array name -> info key, per step
    jpeg_quality: int | None = None  # store recorded frames as JPEG of this quality (None: lossless)
    gym_kwargs: Callable[[str], dict] = lambda action_space: {}  # gym.make kwargs that rebuild it (Minari export)
    seeds: SeedRanges = field(default_factory=SeedRanges)
    # who draws the camera frame: make(..., renderer=NAME) takes one of these, the first is the default (the reference
    # the shipped students were trained on). CarRacing: gymnasium's pygame or this project's fast OpenCV one.
    renderers: tuple[str, ...] = ("native",)
    # scenes: make(..., themes=(...), conditions=(...)) draws each episode's theme and condition from these lists by
    # track seed (spread evenly over consecutive seeds). `themes` are all the env knows (--theme accepts them);
    # `train_themes` are collect.py's default, the others are held out for measuring generalisation (collection
    # refuses them unless asked); `conditions` are lighting/weather looks, `train_conditions` collect's default.
    themes: tuple[str, ...] = ()
    train_themes: tuple[str, ...] = ()
    conditions: tuple[str, ...] = ()
    train_conditions: tuple[str, ...] = ()
    # make(pi_speed=True): a PI controller holds the speed and the action is [steer] (steering-only students)
    pi_speed: bool = False
    # an env whose privileged expert is built in (a replay's path controller), not a trained PPO file: () -> expert
    builtin_expert: Callable[[], Any] | None = None
    # gym ids of other envs whose students this env's frames can feed (a replay drives udacity and udacity-hard ones)
    feeds: tuple[str, ...] = ()
    # continuous env action -> PPO's (its inverse, clipped): how a latency expert (agent.experts.latency) sees the
    # actions on their way when it labels a recorded drive; None: this env has no latency expert
    env_to_expert_action: Callable[[Any], Any] | None = None
    # envs with a fixed number of episodes (a replay's parts): parts(span) -> how many; None: any number of seeds
    parts: Callable[[Any], int] | None = None
    shipped_student: Path | None = None  # evaluate.py's default checkpoint (None: checkpoints/<name>_nac.pt)
    # its students are made for a person's recording of the real simulator: evaluate.py --data scores such a
    # recording with this env's shipped student by default (real_frames_env)
    real_frames: bool = False
    geometry: Any = None  # a replay's camera and car (envs.replay.camera.CameraGeometry), recorded in metrics.json
    speed_unit: str = "m/s"  # the unit of info["speed"], shown on the videos' HUD
    collection_noise: float = 0.0  # a replay: the DART noise its recorded path was driven with (a wobbling reference)

    def check_action_space(self, action_space: str) -> str:
        if action_space not in self.action_spaces:
            raise ValueError(f"action_space must be one of {list(self.action_spaces)} for "
                             f"{self.name}, got {action_space!r}")
        return action_space

    def check_renderer(self, renderer: str | None) -> str:
        """The renderer to use (None: the default); ValueError naming the valid ones otherwise."""
        if renderer is None:
            return self.renderers[0]
        if renderer not in self.renderers:
            raise ValueError(f"--renderer must be one of {list(self.renderers)} for {self.name}, got {renderer!r}")
        return renderer

    def check_scene(self, kind: str, names: Any) -> tuple[str, ...]:
        """`names` ("a,b" or a sequence) as a tuple of known themes (kind="theme") or conditions (kind="condition");
        ValueError naming the valid ones otherwise (also for an env that has none)."""
        known = {"theme": self.themes, "condition": self.conditions}[kind]
        items = tuple(n.strip() for n in names.split(",")) if isinstance(names, str) else tuple(names)
        if not known:
            raise ValueError(f"--{kind} is not available for {self.name} (it has no {kind}s)")
        bad = [n for n in items if n not in known]
        if bad or not items or len(set(items)) != len(items):
            raise ValueError(f"--{kind} takes distinct names from {list(known)} for {self.name}, got {names!r}")
        return items

    def scene(self, themes: Any = None, conditions: Any = None, *, collect: bool = False,
              allow_held_out: bool = False) -> dict[str, tuple[str, ...]]:
        """make()'s keyword arguments for --theme / --condition (None: collection draws the train lists, evaluation
        all). Collection refuses held-out names unless `allow_held_out`. ValueError on unknown names, and on
        either option for an env without scenes."""
        if not self.themes:
            if themes or conditions:
                raise ValueError(f"--theme and --condition are not available for {self.name} (it has no scenes)")
            return {}
        t = self.check_scene("theme", themes or (self.train_themes if collect else self.themes))
        c = self.check_scene("condition", conditions or (self.train_conditions if collect else self.conditions))
        held = [x for x in t if x not in self.train_themes] + [x for x in c if x not in self.train_conditions]
        if collect and held and not allow_held_out:
            raise ValueError(f"{', '.join(held)} {'is' if len(held) == 1 else 'are'} held out "
                             f"of {self.name}'s training "
                             "data, kept for measuring generalisation; pass --allow-held-out to record "
                             f"{'it' if len(held) == 1 else 'them'} anyway")
        return {"themes": t, "conditions": c}

    def default_out(self, action_space: str) -> Path:
        """collect.py's default dataset folder."""
        if len(self.action_spaces) == 1:
            return Path(f"data/{self.name}")
        return Path(f"data/{self.name}_{action_space}")
