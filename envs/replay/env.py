"""A recording as a closed-loop environment: the car drives the recorded path with its own steering.

One episode replays one part of one recorded session (``ReplayEnv.reset(seed=k)``: the k-th part, see
``ReplayData``). At every recorded frame the observation is the center image reprojected (``camera.Reprojector``)
to the car's pose relative to the recorded path (``vehicle.PathVehicle``); the car moves at the recorded speed
over the recorded time steps. When it is more than ``max_offset`` m from the recorded path (or points more than
``max_yaw`` off its direction) ``info["lane_departure"]`` is set, and evaluation puts it back on the path
(``recenter``: an intervention). The limit is measured from the recorded driver's line (``reference="driver"``),
or from that line and from the road's middle that road.py measures on the recorded frames, the car off only when
beyond the limit of both (``reference="driver-or-middle"``: a student that keeps the middle behind a driver who
kept to one side is not counted off; the intervention still puts it back on the driver's line).

``info`` holds what evaluation reads: ``privileged`` = [offset, yaw, recorded steering, speed] (what the path
controller steers by), ``speed`` (m/s), ``cte`` / ``heading_error`` (the pose), ``time`` (the recorded timestamp,
s from the part's start), ``progress`` (fraction of the part driven); the last step adds ``elapsed_s`` and the
always-straight driver's interventions on the same part (``straight_interventions``), how many of the car's own
interventions came after it drifted left of the driver's line (``interventions_left``: a
driver who kept to one side of the road while the student keeps nearer its middle shows as drifts to one side),
with ``reference="driver-or-middle"`` how many came where the middle was not measured (``interventions_unmeasured``:
there the rule is the driver's line alone), and
``path_trace``
(per-step time, offset, yaw, recorded steering, speed, the car's steering, and the interventions; the part's
session and first row) for the path plot and table.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from envs.replay.camera import CameraGeometry, Reprojector
from envs.replay.road import UNMEASURED, check_reference, part_middle
from envs.replay.vehicle import (DEFAULT_MAX_OFFSET_M, DEFAULT_MAX_YAW_RAD, PathController, PathPose, PathVehicle,
                                 count_interventions)

FEATURE_NAMES = ("offset_m", "yaw_rad", "recorded_steer", "speed_mps")
MAX_STEP_S = 0.5  # a recorded step longer than this (a pause in the log) is integrated as this long


def step_seconds(times: np.ndarray) -> np.ndarray:
    """How long each recorded step of a part is driven: the time to the next frame (the last: the median step),
    a pause in the log counted as ``MAX_STEP_S``."""
    dt = np.diff(times)
    last = float(np.median(dt)) if len(dt) else 0.1
    return np.clip(np.append(dt, last), 0.0, MAX_STEP_S)


@dataclass
class ReplayPart:
    """One replayed stretch: rows [start, stop) of a dataset episode."""

    episode: int
    start: int
    stop: int

    @property
    def length(self) -> int:
        return self.stop - self.start


class ReplayEnv(gym.Env):
    """See the module docstring. ``dataset``: an open driving_data.dataset.DemoDataset; ``parts``: what each
    seed replays; ``geometry``: the recorded camera and car."""

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, dataset: Any, parts: list[ReplayPart], geometry: CameraGeometry, *,
                 max_offset: float = DEFAULT_MAX_OFFSET_M, max_yaw: float = DEFAULT_MAX_YAW_RAD,
                 max_episode_steps: int | None = None, render_mode: str | None = None,
                 reference: str = "driver") -> None:
        self.dataset, self.parts, self.geometry = dataset, parts, geometry
        self.reference = check_reference(reference)
        self.max_offset, self.max_yaw = float(max_offset), float(max_yaw)
        self.max_steps = max_episode_steps
        self.render_mode = render_mode
        self.reprojector = Reprojector(geometry)
        self.vehicle = PathVehicle.of(geometry)
        h, w = geometry.height, geometry.width
        self.observation_space = gym.spaces.Box(0, 255, (h, w, 3), np.uint8)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self._frame: np.ndarray | None = None

    # -- episode data -------------------------------------------------------------------------------------------
    def _load(self, seed: int) -> None:
        if not 0 <= seed < len(self.parts):
            raise ValueError(f"replay seed {seed} is outside the recording's parts 0..{len(self.parts) - 1}")
        part = self.parts[seed]
        arrays = self.dataset.load(part.episode, keys=["action", "speed", "time"])
        rows = slice(part.start, part.stop)
        self._steer = np.asarray(arrays["action"], np.float64).reshape(len(arrays["time"]), -1)[rows, 0]
        self._speed = np.asarray(arrays["speed"], np.float64)[rows]
        t = np.asarray(arrays["time"], np.float64)[rows]
        self._dt = step_seconds(t)
        self._time = t - t[0]
        self._jpeg = self.dataset.jpeg_frames(part.episode, "frames")
        self._raw = None if self._jpeg is not None else self.dataset.load(part.episode, keys="frames")["frames"]
        self._start, self._episode = part.start, part.episode
        self._length = part.length  # progress is of the whole part: a drive cut by max_steps stays below 1
        self._limit = part.length if self.max_steps is None else min(part.length, self.max_steps)
        # the road's middle per frame, m right of the driver's line (driver-or-middle only)
        self._middle = (part_middle(self.dataset, part.episode, slice(part.start, part.stop), self.geometry)
                        if self.reference == "driver-or-middle" else None)
        straight = np.zeros(self._limit)
        self._straight = count_interventions(self.vehicle, straight, self._steer[:self._limit],
                                             self._speed[:self._limit],
                                             self._dt[:self._limit], self.max_offset, self.max_yaw,
                                             None if self._middle is None else self._middle[:self._limit])

    def recorded_frame(self, k: int) -> np.ndarray:
        """The recorded center frame of step k of the current part (uint8 RGB)."""
        if self._jpeg is not None:
            return self._jpeg.decode([self._start + k])[0]
        assert self._raw is not None  # the raw frames when they are not JPEG
        return np.asarray(self._raw[self._start + k])

    # -- gym interface ------------------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self._load(int(seed or 0))
        self._k, self._pose, self._distance = 0, PathPose(), 0.0
        self._interventions: list[int] = []
        self._left = 0  # interventions after a drift left of the driver's line
        self._unmeasured = 0  # driver-or-middle: interventions where the middle was not measured
        self._trace: list[tuple[float, float, float, float, float, float]] = []
        return self._observe(), self._info()

    def step(self, action: Any):
        steer = float(np.asarray(action, dtype=np.float64).reshape(-1)[0])
        k = self._k
        self._trace.append((self._time[k], self._pose.offset, self._pose.yaw, self._steer[k], self._speed[k], steer))
        self._pose = self.vehicle.step(self._pose, steer, self._steer[k], self._speed[k], self._dt[k])
        # metres driven: the return is info["distance"]
        reward = float(self._speed[k] * self._dt[k] * self.vehicle.distance_scale)
        self._distance += reward
        self._k = k + 1
        truncated = self._k >= self._limit
        if truncated:
            self._k = self._limit - 1  # the last frame stays on view
        return self._observe(), reward, False, truncated, self._info(final=truncated)

    def recenter(self) -> tuple[np.ndarray, dict[str, Any]]:
        """An intervention: the car is put back on the recorded path, aligned with it."""
        self._interventions.append(self._k)
        self._left += int(self._pose.offset < 0)  # + offset: right of the path
        if self._middle is not None:
            self._unmeasured += int(self._middle[self._k] == UNMEASURED)
        self._pose = self._pose.back_on_path()
        return self._observe(), self._info()

    def render(self) -> np.ndarray | None:
        return self._frame

    # -- what the car sees and what evaluation reads ------------------------------------------------------------
    def _observe(self) -> np.ndarray:
        self._frame = self.reprojector.warp(self.recorded_frame(self._k), self._pose.offset, self._pose.yaw)
        return self._frame

    def _info(self, final: bool = False) -> dict[str, Any]:
        p, k = self._pose, self._k
        info: dict[str, Any] = {
            "privileged": np.array([p.offset, p.yaw, self._steer[k], self._speed[k]], np.float32),
            "speed": float(self._speed[k]), "cte": float(p.offset), "heading_error": float(p.yaw),
            "recorded_steer": float(self._steer[k]), "time": float(self._time[k]),
            "progress": (k + 1) / self._length if final else k / self._length, "distance": self._distance,
            "lane_departure": p.off_path(self.max_offset, self.max_yaw,
                                         None if self._middle is None else float(self._middle[k])),
        }
        if final:
            info["elapsed_s"] = float(np.sum(self._dt[:self._limit]))
            info["straight_interventions"] = self._straight
            info["interventions_left"] = self._left
            if self._middle is not None:
                info["interventions_unmeasured"] = self._unmeasured
            info["path_trace"] = {"trace": np.asarray(self._trace, np.float32),
                                  "interventions": list(self._interventions),
                                  "dt": self._dt[:self._limit].astype(np.float32),
                                  "episode": self._episode, "start": self._start}
        return info


class PathExpert:
    """The replay's privileged expert (agent.experts.expert.Expert's interface): ``PathController`` on
    ``info["privileged"]``."""

    def __init__(self, spec: Any, geometry: CameraGeometry) -> None:
        self.spec, self.action_space, self.path = spec, "continuous", None
        self.card = {"driver": "pure pursuit onto the recorded path plus the recorded steering (envs.replay)"}
        self.controller = PathController(PathVehicle.of(geometry))

    def act(self, privileged: np.ndarray) -> np.ndarray:
        offset, yaw, steer_rec, speed = (float(x) for x in np.asarray(privileged).reshape(-1)[:4])
        return np.array([self.controller.steer(offset, yaw, steer_rec, speed)], np.float32)
