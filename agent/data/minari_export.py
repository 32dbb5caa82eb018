"""Export a collect.py dataset (this project's dataset format) as a Minari dataset.

    python -m agent.data.minari_export data/carracing_continuous carracing/expert-continuous-v0
    python collect.py --episodes 25 --export-minari carracing/expert-continuous-v0   # collect, then export

Mapping (Minari's episode convention: ``T + 1`` observations, ``T`` actions):

    observations  frames + final_frames        uint8 [T+1, 96, 96, 3]
    actions       action (the EXECUTED action, DART noise included, so every transition is one the
                  env really made; the expert's label is in infos)   float32 [T, 3] | int64 [T]
    rewards, terminations, truncations          [T] (only the last step can be terminal/truncated)
    infos         expert_action, speed, privileged, time (and expert_probs for discrete), each [T+1]
                  (entry t belongs to observation t, as in minari.DataCollector)
    seed          the episode's track seed (env.reset(seed=...) rebuilds the same track)

Where it goes: Minari stores datasets under ``$MINARI_DATASETS_PATH`` (default ``~/.minari/datasets``).
To never write into the user's home by surprise, the export sets that variable only for the duration
of the call, to ``--minari-path`` or by default ``DATA/minari``. Load it back with the same path:

    MINARI_DATASETS_PATH=data/carracing_continuous/minari python -c \\
        "import minari; print(minari.load_dataset('carracing/expert-continuous-v0'))"

Frames are stored losslessly by default (``jpeg_encoding=False``); ``--jpeg`` trades exactness for
size. Minari 0.5 writes HDF5 through ``h5py`` (``pip install "minari[hdf5]"``); ``EpisodeBuffer``s are
built directly from the arrays (``DataCollector``/``add_step_data`` would need jax for nothing).
A failed export removes its partial folder (Minari writes in place, not atomically).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import gymnasium as gym
import numpy as np

from common.cli import option, run_command
from driving_data.dataset import FINAL_PREFIX, DemoDataset, open_dataset
from envs.registry import EnvSpec, get_spec

INFO_KEYS = ("expert_action", "speed", "privileged", "time", "expert_probs")


@contextlib.contextmanager
def _datasets_path(path: Path) -> Iterator[None]:
    """Point MINARI_DATASETS_PATH at `path` for the block only, then restore the caller's value."""
    old = os.environ.get("MINARI_DATASETS_PATH")
    os.environ["MINARI_DATASETS_PATH"] = str(path.resolve())
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("MINARI_DATASETS_PATH", None)
        else:
            os.environ["MINARI_DATASETS_PATH"] = old


def _spaces(spec: EnvSpec, action_space: str) -> tuple[gym.Space, gym.Space]:
    """The recorded frame's space and the env's own action space (read off a physics-only env)."""
    probe = spec.make(action_space, render=False, max_episode_steps=1)
    act = probe.action_space
    probe.close()
    return gym.spaces.Box(0, 255, shape=spec.frame_shape, dtype=np.uint8), act


def _main_camera_arrays(data: DemoDataset, i: int) -> list[str]:
    """Every array of episode i but the side cameras (Minari's observation is the main camera)."""
    return [n for n in data.array_names(i) if not n.startswith(("frames_", "final_frames_"))]


def _with_final(arrays: dict[str, np.ndarray], key: str) -> np.ndarray | None:
    """`key` over the T+1 observations: the per-step array plus its final_ entry (None if there is none)."""
    final = arrays.get(FINAL_PREFIX + key)
    if key not in arrays or final is None:
        return None
    return np.concatenate([arrays[key], np.asarray(final, dtype=arrays[key].dtype)[None]])


def episode_buffer(arrays: dict[str, np.ndarray], meta: dict, index: int, dt: float):
    """One dataset episode as a minari EpisodeBuffer (see the module docstring for the mapping)."""
    from minari.data_collector import EpisodeBuffer

    obs = _with_final(arrays, "frames")
    if obs is None:
        raise ValueError(
            f"episode {meta.get('episode_id')} has no final_frames array (written by an older collect.py?); "
            "Minari needs the observation after the last step"
        )
    T = len(arrays["action"])
    terminations = np.zeros(T, dtype=bool)
    truncations = np.zeros(T, dtype=bool)
    terminations[-1] = bool(meta.get("terminated", False))
    truncations[-1] = bool(meta.get("truncated", False)) and not terminations[-1]
    infos = {}
    for key in INFO_KEYS:
        full = _with_final(arrays, key)
        if full is None and key == "time" and "time" in arrays:  # time is regular: extend it by one step
            full = np.append(arrays["time"], arrays["time"][-1] + dt)
        if full is not None:
            infos[key] = full
    seed = meta.get("track_seed")
    return EpisodeBuffer(
        id=index,
        seed=int(seed) if seed is not None else None,
        observations=obs,
        actions=arrays["action"],
        rewards=arrays["reward"].astype(np.float64),
        terminations=terminations,
        truncations=truncations,
        infos=infos,
    )


def export_minari(
    data_dir: str | Path,
    dataset_id: str,
    *,
    datasets_path: str | Path | None = None,
    jpeg: bool = False,
    overwrite: bool = False,
) -> Path:
    """Write `data_dir` as the Minari dataset `dataset_id` under `datasets_path` (default data_dir/minari).

    Returns the dataset's folder. Raises ValueError for a malformed id, an existing dataset without
    `overwrite`, or episodes that cannot be exported; FileNotFoundError for a missing dataset.
    """
    import importlib.util

    import minari

    _check_id(dataset_id)
    data = open_dataset(data_dir)
    if importlib.util.find_spec("h5py") is None:  # after the user's own mistakes, which matter more
        raise ImportError("Minari export needs h5py (Minari's HDF5 storage): pip install 'minari[hdf5]'")
    root = Path(datasets_path) if datasets_path is not None else Path(data_dir) / "minari"
    target = _free_target(root, dataset_id, overwrite)
    action_space = _action_space(data, data_dir)
    env = get_spec(data.card.get("env", "carracing"))
    obs_space, act_space = _spaces(env, action_space)
    env_spec = _gym_env_spec(env, action_space, int(data.card.get("config", {}).get("max_steps",
                                                                                     env.default_max_steps)))
    buffers = [episode_buffer(data.load(i, keys=_main_camera_arrays(data, i)), data.episodes[i], i, env.dt)
               for i in range(len(data))]
    expert = data.card.get("expert", {})
    root.mkdir(parents=True, exist_ok=True)
    with _datasets_path(root), _removed_on_failure(target), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`author_email` is set to None")
        minari.create_dataset_from_buffers(
            dataset_id=dataset_id,
            buffer=buffers,
            env=env_spec,
            eval_env=env_spec,
            algorithm_name=f"PPO expert on privileged state ({expert.get('path', 'unknown')}), DART noise "
                           f"{data.card.get('config', {}).get('noise')}",
            code_permalink="collect.py (this repository)",
            author="nac-drive collect.py",
            observation_space=obs_space,
            action_space=act_space,
            description=(
                f"{env.gym_id} frames (the main camera) recorded while a PPO expert (reading "
                "privileged state) drove; "
                "actions are the executed ones, infos['expert_action'] the expert's labels. "
                f"Exported from {Path(data_dir).resolve()} (card: dataset.json)."
            ),
            data_format="hdf5",
            jpeg_encoding=jpeg,
        )
    return target


def _check_id(dataset_id: str) -> None:
    """Refuse an id Minari cannot store: '[namespace/]name-v<version>'."""
    from minari.dataset.minari_dataset import parse_dataset_id

    try:
        parse_dataset_id(dataset_id)
    except ValueError:
        raise ValueError(
            "Minari dataset id must look like '[namespace/]name-v<version>', e.g. "
            f"'carracing/expert-v0'; got {dataset_id!r}"
        ) from None


def _free_target(root: Path, dataset_id: str, overwrite: bool) -> Path:
    """The folder of `dataset_id` under `root`, emptied with `overwrite`; an existing one is refused without it."""
    if root.exists() and not root.is_dir():
        raise ValueError(f"--minari-path {str(root)!r} is a file; expected a folder for Minari datasets")
    target = root / dataset_id
    if target.exists():
        if not overwrite:
            raise ValueError(f"Minari dataset {dataset_id!r} already exists at {str(target)!r}; pass "
                             "--overwrite or a new -v<version>")
        shutil.rmtree(target)
    return target


def _action_space(data: DemoDataset, data_dir: str | Path) -> str:
    """The dataset's action space: its card's, else the one every episode's meta names."""
    spaces = {data.episodes[i].get("action_space") for i in range(len(data))}
    action_space = data.card.get("action_space") or (spaces.pop() if len(spaces) == 1 else None)
    if action_space not in ("continuous", "discrete"):
        raise ValueError(f"dataset {str(data_dir)!r} does not say its action space (card and episode "
                         "metas disagree or lack it)")
    return action_space


def _gym_env_spec(env: EnvSpec, action_space: str, max_episode_steps: int) -> gym.envs.registration.EnvSpec:
    """The gymnasium spec Minari records: the registered env with the options of `action_space`."""
    spec = gym.spec(env.gym_id)
    return gym.envs.registration.EnvSpec(
        id=spec.id, entry_point=spec.entry_point, reward_threshold=spec.reward_threshold,
        max_episode_steps=max_episode_steps, kwargs={**spec.kwargs, **env.gym_kwargs(action_space)},
    )


@contextlib.contextmanager
def _removed_on_failure(target: Path) -> Iterator[None]:
    """Minari writes in place: a failed (or interrupted) export leaves no partial dataset behind."""
    try:
        yield
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise


def load_minari(dataset_id: str, datasets_path: str | Path):
    """minari.load_dataset with MINARI_DATASETS_PATH pointed at `datasets_path` (for tests and checks)."""
    import minari

    with _datasets_path(Path(datasets_path)):
        return minari.load_dataset(dataset_id)


@dataclass
class MinariExportArgs:
    """`python -m agent.data.minari_export`'s arguments."""

    data_dir: Path = option(help="the --out folder of collect.py", group="input", positional=True,
                            metavar="DATA")
    dataset_id: str = option(help="Minari id '[namespace/]name-v<version>', e.g. carracing/expert-v0", group="output",
                             positional=True, metavar="ID")
    minari_path: Path | None = option(None, "MINARI_DATASETS_PATH to write under (default: DATA/minari)",
                                      group="output")
    jpeg: bool = option(False, "JPEG-encode frames (smaller, lossy); default: lossless", group="output")
    overwrite: bool = option(False, "replace an existing Minari dataset of the same id", group="output")


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(MinariExportArgs, _export, argv, prog="python -m agent.data.minari_export", doc=__doc__,
                       mistakes=(ValueError, FileNotFoundError, ImportError))


def _export(args: MinariExportArgs) -> None:
    path = export_minari(args.data_dir, args.dataset_id, datasets_path=args.minari_path, jpeg=args.jpeg,
                         overwrite=args.overwrite)
    root = path.parents[len(Path(args.dataset_id).parts) - 1]
    print(f"exported Minari dataset {args.dataset_id!r} to {path}")
    print(f"load it with: MINARI_DATASETS_PATH={root} python -c \"import minari; "
          f"print(minari.load_dataset('{args.dataset_id}'))\"")


if __name__ == "__main__":
    raise SystemExit(main())
