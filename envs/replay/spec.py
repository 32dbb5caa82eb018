"""A recording (a dataset folder: an imported real-simulator recording, or a collect.py dataset of the udacity
envs) as an environment: ``envs.registry.get_spec("replay:" + folder)`` builds its ``EnvSpec``.

Seeds are the recording's parts (one per recorded session, or per episode of a dataset), in order, from 0; a
part is ``span`` (fractions of each session, default the whole) of its session, so a student is replayed on the
time blocks it never trained on (train.py holds out the end of every session). The privileged expert is the
path controller (``env.PathExpert``): no file to load.
"""
from __future__ import annotations

import functools
from typing import Any

import numpy as np

from driving_data.dataset import REPLAY_PREFIX as PREFIX
from driving_data.dataset import is_recording, open_dataset
from envs.catalog import camera_envs, dataset_env, named_spec
from envs.spec import EnvSpec, SeedRanges
from envs.replay.camera import CameraGeometry
from envs.replay.options import parse_span
from envs.udacity.real_look import (REAL_CAMERA_HEIGHT_M, REAL_CAMERA_PITCH_DEG, REAL_CAMERA_VFOV_DEG, REAL_WHEELBASE_M,
                                    hfov_from_vfov)
from envs.replay.env import FEATURE_NAMES, PathExpert, ReplayEnv, ReplayPart

MIN_PART_FRAMES = 10  # shorter parts (a click of the record button) are not replayed
MOVING_MPS = 0.447  # 1 mph: a part whose car never reaches it stands still, and is not replayed (nothing to steer)

# The cameras and cars the replay knows, by the env a dataset was recorded in.
SIM_V0 = CameraGeometry(cam_height_m=1.5, pitch_deg=6.0, hfov_deg=65.0, side_offset_m=1.0, hood_row=160,
                        wheelbase_m=2.5, max_steer_deg=25.0, steer_tau_s=0.08,
                        source="this project's udacity simulator (envs/udacity/camera.py, vehicle.py)")
SIM_V1 = CameraGeometry(cam_height_m=1.5, pitch_deg=6.0, hfov_deg=65.0, side_offset_m=1.0, hood_row=146,
                        wheelbase_m=2.5, max_steer_deg=25.0, steer_tau_s=0.08,
                        source="this project's udacity-hard simulator (flat-ground model of a "
                               "hilly world; hood 14 rows)")
# The real (Unity) simulator: the camera mounts of its public source (60 degrees vertical field of view at
# 320x160); the distance scale is measured on public recordings by `python -m envs.replay.calibrate` (consecutive
# frames show the car moving 0.8 x speed x dt on four of them; docs/results.md).
REAL_UDACITY = CameraGeometry(cam_height_m=REAL_CAMERA_HEIGHT_M, pitch_deg=REAL_CAMERA_PITCH_DEG,
                              hfov_deg=hfov_from_vfov(REAL_CAMERA_VFOV_DEG), side_offset_m=0.81, hood_row=137,
                              wheelbase_m=REAL_WHEELBASE_M, max_steer_deg=25.0, steer_tau_s=0.0,
                              distance_scale=0.8,
                              source="the Unity simulator's public source; distance scale measured on recordings")
GEOMETRIES = {"UdacityStyle-v0": SIM_V0, "UdacityStyle-v1": SIM_V1, "recording": REAL_UDACITY}


# what the last step's info adds to a replay episode's row (envs.replay.env's docstring says what each is)
EPISODE_META = ("distance", "elapsed_s", "straight_interventions", "interventions_left", "interventions_unmeasured")


def span_slice(span: tuple[float, float], n: int) -> slice:
    """The frames of a session of ``n`` frames that ``span`` (parse_span) covers: what is replayed, or scored
    offline."""
    return slice(int(np.floor(span[0] * n)), int(np.floor(span[1] * n)))


def replay_parts(dataset: Any, span: tuple[float, float]) -> list[ReplayPart]:
    """The parts replayed: ``span`` of every session, those of at least ``MIN_PART_FRAMES`` frames in which the car
    moves (a car that stands all along scores every driver 100 % over a road it never drives)."""
    parts = []
    for i, meta in enumerate(dataset.episodes):
        frames = span_slice(span, int(meta["length"]))
        part = ReplayPart(i, frames.start, frames.stop)
        if part.length >= MIN_PART_FRAMES and _speeds(dataset, i)[frames].max() >= MOVING_MPS:
            parts.append(part)
    return parts


def _speeds(dataset: Any, episode: int) -> np.ndarray:
    return np.asarray(dataset.load(episode, keys=["speed"])["speed"], np.float64)


def check_speeds(dataset: Any, folder: str) -> None:
    """ValueError naming the episode and step where a recorded speed is below zero: the replay moves the car at the
    recorded speed along the recorded path, forwards only (the simulator logs the speed's size)."""
    for i in range(len(dataset)):
        speed = _speeds(dataset, i)
        if (speed < 0).any():
            k = int(np.argmax(speed < 0))
            raise ValueError(f"{folder!r}: episode {i} step {k}: speed {speed[k]:g} m/s is below zero; the replay "
                             "drives the recorded path forwards at the recorded speed")


def exported_from(dataset: Any) -> dict:
    """What the exporter (agent.udacity.recordings) wrote beside a recording made from one of this project's datasets,
    kept by its import: its env, camera and car, steering column and DART noise; {} for anything else."""
    return dict((dataset.card.get("import") or {}).get("exported") or {})


def geometry_of(dataset: Any) -> CameraGeometry:
    """The camera and car of a dataset: this project's simulators by their gym id (an export of one of their datasets
    by what the export says), anything else the real one."""
    exported = exported_from(dataset)
    if exported.get("geometry"):
        return CameraGeometry(**exported["geometry"])
    if any(is_recording(m) for m in dataset.episodes):
        return REAL_UDACITY
    return GEOMETRIES.get(dataset_env(dataset.card, dataset.episodes).gym_id, REAL_UDACITY)


def collection_noise(dataset: Any) -> float:
    """The largest DART noise the dataset's driving was collected with (collect.py --noise; an export's, as it says):
    the recorded path, the replay's reference, wobbles with it. 0 for a person's recording."""
    exported = exported_from(dataset)
    if exported:
        return float(exported.get("dart_noise") or 0.0)
    return max((float(m.get("noise") or 0.0) for m in dataset.episodes), default=0.0)


def check_replayable_steering(dataset: Any, folder: str) -> None:
    """An export whose steering column holds the expert's labels, not what moved the car, cannot be replayed: the
    replay would drive a path its frames do not show (ValueError)."""
    exported = exported_from(dataset)
    if exported and not exported.get("steering_moved_the_car", True):
        raise ValueError(f"{folder!r} is an export whose steering column is the expert's label "
                         f"({exported.get('steering')}),"
                         " not the steering that moved the car: its replay would follow a path its frames do not show; "
                         "replay the dataset itself, or export it with --label action")


@functools.lru_cache(maxsize=8)
def replay_spec(folder: str) -> EnvSpec:
    """The EnvSpec of the dataset in ``folder`` (see the module docstring); ValueError for what cannot be replayed."""
    ds = open_dataset(folder)
    check_replayable_steering(ds, folder)
    shapes = {tuple(ds.array_shape(i, "frames")[1:]) for i in range(len(ds))}
    if len(shapes) != 1 or len(next(iter(shapes))) != 3 or next(iter(shapes))[2] != 3:
        raise ValueError(f"{folder!r}: a replay needs RGB camera frames of one size, got shapes {sorted(shapes)}")
    h, w, c = next(iter(shapes))
    frame_shape = (h, w, c)
    check_speeds(ds, folder)
    geometry = geometry_of(ds)
    if frame_shape[:2] != (geometry.height, geometry.width):
        raise ValueError(f"{folder!r}: frames are {frame_shape[0]}x{frame_shape[1]}; the replay's camera models are "
                         f"{geometry.height}x{geometry.width} (first-person Udacity frames)")
    feeds = camera_envs(frame_shape)
    recipe = named_spec("udacity-hard" if geometry == SIM_V1 else "udacity")  # a student's crop, size and colours
    longest = max((int(m["length"]) for m in ds.episodes), default=1)
    dt = float(ds.card.get("dt") or 0.1)

    def make(action_space: str = "continuous", *, render: bool = True, max_episode_steps: int | None = None,
             render_mode: str | None = None, side_cameras: bool = False, renderer: str = "native",
             span: Any = None, **kwargs: Any) -> ReplayEnv:
        spec.check_action_space(action_space)
        spec.check_renderer(renderer)
        if side_cameras:
            raise ValueError("a replay shows the reprojected center camera only")
        return ReplayEnv(ds, replay_parts(ds, parse_span(span)), geometry, max_episode_steps=max_episode_steps,
                         render_mode=render_mode, **kwargs)

    def unavailable(*_: Any, **__: Any) -> Any:
        raise ValueError("a replay has no physics-only env: its expert is the path controller, nothing to train")

    spec = EnvSpec(
        name=PREFIX + folder,
        gym_id="Replay-v0",
        description=f"closed-loop replay of the recording {folder}: the center frame reprojected to the car's pose "
                    "off the recorded path, a kinematic bicycle at the recorded speed",
        action_spaces=("continuous",),
        dt=dt,
        frame_shape=frame_shape,
        feature_names=FEATURE_NAMES,
        make=make,
        make_expert_env=unavailable,
        make_train_env=unavailable,
        expert_to_env_action=lambda action, space: np.clip(np.asarray(action, np.float32).reshape(-1)[:1], -1, 1),
        teacher=unavailable,
        action_names={"continuous": ("steer",)},
        steer_limit={"continuous": 1.0},
        default_expert={},
        default_noise={"continuous": 0.0},
        default_noise_hold={"continuous": 1},
        default_max_steps=longest,
        default_encoder="pilotnet",
        default_frame_stride=1,
        progress=lambda info: float(info["progress"]),
        lap_complete=lambda info: float(info["progress"]) >= 1.0,
        on_road=lambda info: not info["lane_departure"],
        episode_meta=lambda info: {"lap_complete": float(info["progress"]) >= 1.0,
                                   **{k: info[k] for k in EPISODE_META if k in info}},
        first_person=True,
        default_crop=recipe.default_crop,
        default_image_size=recipe.default_image_size,
        default_color=recipe.default_color,
        default_color_jitter=recipe.default_color_jitter,
        recover=lambda env, speed=None: env.unwrapped.recenter(),
        lateral_error=lambda info: abs(float(info["cte"])),
        seeds=SeedRanges(evaluate=0, reserved_below=0),  # seeds are the recording's parts, not tracks
        builtin_expert=lambda: PathExpert(spec, geometry),
        feeds=feeds,
        parts=lambda span: len(replay_parts(ds, parse_span(span))),
        geometry=geometry,
        collection_noise=collection_noise(ds),
    )
    return spec
