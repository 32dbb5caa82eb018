"""Demonstration datasets: the on-disk format and windowed loading for behaviour cloning.

Why this format
---------------
One compressed ``.npz`` per episode (``DATA_DIR/episodes/episode_00000.npz``) keeps an
episode self-contained: it is written to a temporary file and renamed into place, so an
interrupted collection leaves every finished episode readable and never a half file.
A card (``DATA_DIR/dataset.json``) summarises the whole dataset and is rewritten the same
way after every episode.

Arrays of an episode (``T`` steps; step ``t`` = the frame seen *before* acting at ``t``)::

    frames         uint8   [T, 96, 96, 3]   camera frame the student sees
    action         float32 [T, 3] | int64 [T]   action executed in the env (may carry DART noise)
    expert_action  same as action               the expert's label for that frame
    expert_probs   float32 [T, 5]               discrete only: the expert's action probabilities
    label_source   uint8   [T]                  collect.py --recovery-labels only: who labelled the step
                                                (0 the expert, 1 the env's recovery teacher: its one-hot probs)
    reward         float32 [T]
    speed          float32 [T]                  units/s
    privileged     float32 [T, F]               the expert's observation (envs.carracing.FEATURE_NAMES)
    time           float64 [T]                  seconds since the episode start (t * 0.02)
    meta           str                          JSON: episode_id, track_seed, env, action_space,
                                                return, length, terminated, truncated, noise
                                                (collect.py adds more: lap_complete, tiles, stats, ...)

Optional ``final_<name>`` arrays hold ``<name>`` at the observation reached *after* the last step
(``final_frames`` uint8 [96, 96, 3], ``final_privileged``, ``final_expert_action``, ...): shape of one
step of ``<name>``, no leading ``T``. They let exporters that want ``T + 1`` observations (Minari)
rebuild the episode exactly; the windowed loaders ignore them.

JPEG frames (``write_episode(..., jpeg_quality=Q)`` or a ``JpegFrames`` value): a first-person camera
of 160x320 is 150 KB per frame raw and three of them do not compress well losslessly, so image arrays
(``frames``, ``frames_<camera>``, ``final_frames*``) can be stored as JPEG instead::

    <name>__jpeg          uint8 [N]     every frame's JPEG bytes, concatenated
    <name>__jpeg_offsets  int64 [T+1]   frame t is bytes [offsets[t], offsets[t+1])
    meta                  "frame_codec": {"<name>": "jpeg95" | "jpeg" (pre-encoded, quality unknown)},
                          "frame_shapes": {"<name>": [H, W, C]}

``DemoDataset.load`` decodes them back to uint8 RGB ``[T, H, W, C]``, so readers see the same arrays
either way; ``DemoDataset.jpeg_frames`` hands out the stored bytes (exporters copy them, no re-encode).

Beyond one folder and one machine's memory:
* ``open_datasets([A, B])`` reads several datasets (collection shards over disjoint track-seed ranges) as one,
  episodes ordered by track seed; ``merge_datasets`` / ``python -m agent.data.merge A B --out C`` writes that
  join as one dataset with one card that collect.py appends to (DAgger).
* ``DemoDataset.prepared`` keeps an episode's frames, prepared for training, uncompressed in ``DATA/.cache``
  and hands out a ``FrameFile`` that reads rows on demand (``train.py --data-loading lazy``).
"""
from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from common.files import atomic_write
from driving_data.frames import JPEG_SUFFIX, OFFSETS_SUFFIX, FrameFile, JpegFrames, check_jpeg_quality, npy_header

FORMAT = "nac-drive dataset v1 (see the driving_data/dataset.py docstring)"  # the card's "format"
# the same layout under the names cards written by earlier versions carry
READABLE_FORMATS = (FORMAT, "nac-drive dataset v1 (see the agent/data/dataset.py docstring)",
                    "agent.demos v1 (see the agent/data/dataset.py docstring)")
CARD_NAME = "dataset.json"
EPISODE_DIR = "episodes"
REQUIRED_ARRAYS = ("frames", "action", "expert_action", "reward", "speed", "privileged", "time")
FINAL_PREFIX = "final_"
POOL_NAME = "pool.json"  # a folder of datasets that trains as one (agent.udacity.pool)
CACHE_DIR = ".cache"  # prepared frames for training (DemoDataset.prepared); hidden: collect.py ignores dot entries
REPLAY_PREFIX = "replay:"  # an env named "replay:FOLDER" replays the dataset in FOLDER (envs/replay)
RESERVED_MARK = "__jpeg"  # user arrays may not contain it: it would collide with the stored JPEG members


def episode_path(root: str | Path, episode_id: int) -> Path:
    return Path(root) / EPISODE_DIR / f"episode_{episode_id:05d}.npz"


def is_frame_name(name: str) -> bool:
    """Image arrays JPEG storage applies to: ``frames``, ``frames_<camera>`` and their ``final_`` forms."""
    base = name[len(FINAL_PREFIX):] if name.startswith(FINAL_PREFIX) else name
    return base == "frames" or base.startswith("frames_")


def _one_step_shape(name: str, v: Any) -> tuple:
    if isinstance(v, JpegFrames):
        if len(v) != 1:
            raise ValueError(f"write_episode: {name} must be one step, got JpegFrames of {len(v)} frames")
        return v.frame_shape
    return np.shape(v)


def _as_jpeg(name: str, v: Any, quality: int) -> JpegFrames:
    """Encode an image array for JPEG storage (a ``final_`` array is one frame, stored as a 1-frame buffer)."""
    v = np.asarray(v)
    final = name.startswith(FINAL_PREFIX)
    ndim = 3 if final else 4
    if v.dtype != np.uint8 or v.ndim != ndim or v.shape[-1] not in (1, 3):
        want = "[H, W, 1 or 3]" if final else "[T, H, W, 1 or 3]"
        raise ValueError(f"write_episode: jpeg_quality applies to image arrays, so {name} must be uint8 {want}, "
                         f"got {v.dtype} {list(v.shape)}")
    return JpegFrames.encode(v[None] if final else v, quality)


def _write_npz(f, arrays: dict[str, np.ndarray]) -> None:
    """np.savez_compressed, except JPEG buffers are stored uncompressed: deflate cannot shrink JPEG
    data and would only cost CPU on every write and read."""
    with zipfile.ZipFile(f, mode="w", compression=zipfile.ZIP_DEFLATED, allowZip64=True) as zf:
        for name, val in arrays.items():
            info = zipfile.ZipInfo(name + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_STORED if name.endswith(JPEG_SUFFIX) else zipfile.ZIP_DEFLATED
            with zf.open(info, "w", force_zip64=True) as out:
                np.lib.format.write_array(out, np.asanyarray(val), allow_pickle=False)


def write_episode(root: str | Path, episode_id: int, arrays: dict[str, Any], meta: dict, *,
                  jpeg_quality: int | None = None) -> Path:
    """Save one episode atomically; refuses arrays that disagree on the episode length.

    ``jpeg_quality`` (1-100) stores every image array (``frames``, ``frames_*``, ``final_frames*``) as
    JPEG instead of lossless: first-person cameras are too big to keep raw. A ``JpegFrames`` value is
    stored byte for byte whatever ``jpeg_quality`` is (pre-encoded frames are never re-encoded)."""
    if jpeg_quality is not None:
        jpeg_quality = check_jpeg_quality(jpeg_quality)
    reserved = [k for k in arrays if RESERVED_MARK in k]
    if reserved:
        raise ValueError(f"write_episode: array names may not contain {RESERVED_MARK!r} (used for stored "
                         f"JPEG data), got {reserved}")
    missing = [k for k in REQUIRED_ARRAYS if k not in arrays]
    if missing:
        raise ValueError(f"write_episode: arrays is missing {missing}; expected at least {list(REQUIRED_ARRAYS)}")
    steps = {k: v for k, v in arrays.items() if not k.startswith(FINAL_PREFIX)}
    lengths = {k: len(v) for k, v in steps.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"write_episode: arrays have different lengths {lengths}")
    for k, v in arrays.items():
        if k.startswith(FINAL_PREFIX):
            base = k[len(FINAL_PREFIX):]
            step_shape = tuple(_shape(steps[base])[1:]) if base in steps else None
            if step_shape is None or tuple(_one_step_shape(k, v)) != step_shape:
                want = step_shape if base in steps else f"a per-step array named {base!r}"
                raise ValueError(f"write_episode: {k} must be one step of {base!r} (shape "
                                 f"{want}), got shape {_shape(v)}")
    stored: dict[str, np.ndarray] = {}
    codecs: dict[str, str] = {}
    shapes: dict[str, list[int]] = {}
    for k, v in arrays.items():
        if isinstance(v, JpegFrames) or (jpeg_quality is not None and is_frame_name(k)):
            if isinstance(v, JpegFrames):
                v.check()
                jf = v
            else:
                assert jpeg_quality is not None  # the condition above
                jf = _as_jpeg(k, v, jpeg_quality)
            stored[k + JPEG_SUFFIX], stored[k + OFFSETS_SUFFIX] = jf.data, jf.offsets
            codecs[k], shapes[k] = jf.codec, list(jf.frame_shape)
        else:
            stored[k] = v
    path = episode_path(root, episode_id)
    meta = {**meta, "episode_id": int(episode_id), "length": int(lengths["frames"])}
    if codecs:
        meta.update(frame_codec=codecs, frame_shapes=shapes)
        atomic_write(path, lambda f: _write_npz(f, {"meta": np.array(json.dumps(meta)), **stored}))
    else:  # the lossless path is exactly what it always was
        # numpy's stub lets **kwds fill allow_pickle (bool); these are arrays named by the episode's keys
        atomic_write(path, lambda f: np.savez_compressed(f, meta=np.array(json.dumps(meta)),
                                                         **stored))  # type: ignore[arg-type]
    return path


def _shape(v: Any) -> tuple:
    return v.shape if isinstance(v, JpegFrames) else np.shape(v)


def _array_names(files: Sequence[str]) -> list[str]:
    """Names as readers see them: ``frames__jpeg`` + ``frames__jpeg_offsets`` are ``frames``."""
    names = []
    for f in files:
        if f == "meta" or f.endswith(OFFSETS_SUFFIX):
            continue
        names.append(f[:-len(JPEG_SUFFIX)] if f.endswith(JPEG_SUFFIX) else f)
    return names


@dataclass
class DemoDataset:
    """A dataset folder: its card and the metadata of every complete episode file."""

    root: Path
    card: dict
    episodes: list[dict]
    paths: list[Path]

    def __len__(self) -> int:
        return len(self.episodes)

    @property
    def num_steps(self) -> int:
        return sum(int(m["length"]) for m in self.episodes)

    def array_names(self, i: int) -> list[str]:
        """Names of episode ``i``'s arrays (what ``load`` returns), without reading any of them."""
        with np.load(self.paths[i], allow_pickle=False) as z:
            return _array_names(z.files)

    def array_shape(self, i: int, name: str = "frames") -> tuple[int, ...]:
        """Shape of episode ``i``'s array ``name`` as ``load`` returns it, read from the file's headers alone
        (no decompression, no JPEG decoding): a trainer sizes its frames before reading any."""
        path = self.paths[i]
        with zipfile.ZipFile(path) as zf:
            members = set(zf.namelist())
            if name + JPEG_SUFFIX + ".npy" in members:
                with zf.open(name + OFFSETS_SUFFIX + ".npy") as f:
                    n = npy_header(f)[0][0] - 1
                meta = json.loads(str(np.load(path, allow_pickle=False)["meta"]))
                shape = tuple(int(x) for x in meta["frame_shapes"][name])
                return shape if name.startswith(FINAL_PREFIX) else (n, *shape)
            if name + ".npy" not in members:
                raise ValueError(f"episode file {str(path)!r} has no array {name!r}; it has "
                                 f"{_array_names([m[:-4] for m in members])}")
            with zf.open(name + ".npy") as f:
                return tuple(npy_header(f)[0])

    def prepared(self, i: int, name: str, tag: str, prepare: Callable[[np.ndarray], np.ndarray],
                 cache_root: str | Path | None = None) -> FrameFile:
        """Episode ``i``'s array ``name`` after ``prepare`` (crop + resize for training), kept uncompressed in a
        cache file and handed out as a ``FrameFile`` that reads rows on demand.

        Why: a dataset larger than memory can still be trained on; each batch reads just its frames. The
        cache lives in ``DATA/.cache/<tag>/`` (hidden, so collect.py still appends to the folder) unless
        ``cache_root`` is given; ``tag`` names the preparation, and the file name carries the episode file's
        size and modification time, so a re-collected episode is prepared again (its old cache file goes)."""
        src = self.paths[i]
        st = src.stat()
        if cache_root is None:
            folder = src.parent.parent / CACHE_DIR / tag
        else:  # one cache folder for episodes of several datasets: keep them apart by their folder
            import hashlib

            folder = Path(cache_root) / tag / hashlib.sha1(str(src.parent.resolve()).encode()).hexdigest()[:12]
        path = folder / f"{src.stem}.{name}.{st.st_size}-{st.st_mtime_ns}.npy"
        if not path.exists():
            frames = np.ascontiguousarray(prepare(self.load(i, keys=name)[name]))
            atomic_write(path, lambda f: np.save(f, frames, allow_pickle=False))
            for old in folder.glob(f"{src.stem}.{name}.*.npy"):
                if old != path:
                    old.unlink(missing_ok=True)
        return FrameFile(path)

    def load(self, i: int, keys: Sequence[str] | str | None = None) -> dict[str, np.ndarray]:
        """Arrays of episode ``i`` (position in ``episodes``), decompressed; JPEG frames decoded to uint8 RGB.

        ``keys`` reads only those arrays: decoding three cameras of 1000 frames takes seconds, and a
        reader of the center camera should not pay for the other two."""
        path = self.paths[i]
        with np.load(path, allow_pickle=False) as z:
            names = _array_names(z.files)
            want = names if keys is None else [keys] if isinstance(keys, str) else list(keys)
            missing = [k for k in want if k not in names]
            if missing:
                raise ValueError(f"episode file {str(path)!r} has no array {missing}; it has {names}")
            out = {}
            for k in want:
                if k + JPEG_SUFFIX in z.files:
                    try:
                        frames = self._jpeg(z, k).decode()
                    except ValueError as e:
                        raise ValueError(f"episode file {str(path)!r}, array {k!r}: {e}") from None
                    out[k] = frames[0] if k.startswith(FINAL_PREFIX) else frames
                else:
                    out[k] = z[k]
            return out

    def jpeg_frames(self, i: int, name: str = "frames") -> JpegFrames | None:
        """The stored JPEG bytes of image array ``name`` of episode ``i`` (no decode), or None when it is
        stored raw. Exporters copy these bytes instead of decoding and re-encoding (a second loss)."""
        path = self.paths[i]
        with np.load(path, allow_pickle=False) as z:
            names = _array_names(z.files)
            if name not in names:
                raise ValueError(f"episode file {str(path)!r} has no array {name!r}; it has {names}")
            return self._jpeg(z, name) if name + JPEG_SUFFIX in z.files else None

    @staticmethod
    def _jpeg(z: Any, name: str) -> JpegFrames:
        meta = json.loads(str(z["meta"]))
        codec = meta.get("frame_codec", {}).get(name, "jpeg")
        quality = int(codec[4:]) if codec[4:].isdigit() else None
        return JpegFrames(z[name + JPEG_SUFFIX], z[name + OFFSETS_SUFFIX], tuple(meta["frame_shapes"][name]), quality)


def temp_files(root: str | Path) -> list[Path]:
    """Leftovers of writes that were killed mid-way (SIGKILL skips the cleanup in ``atomic_write``).
    They are never read as data (their names do not match ``episode_*.npz``); collect.py removes them."""
    root = Path(root)
    return sorted([*root.glob(".*.tmp"), *(root / EPISODE_DIR).glob(".*.tmp")])


def read_episode_meta(path: Path) -> dict:
    with np.load(path, allow_pickle=False) as z:
        return json.loads(str(z["meta"]))


def open_dataset(root: str | Path) -> DemoDataset:
    """Open a dataset folder written by ``collect.py``; clear errors for a wrong or empty folder."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"dataset folder {str(root)!r} does not exist; create one with `python "
                                f"collect.py --out {root}`")
    card_path = root / CARD_NAME
    files = sorted((root / EPISODE_DIR).glob("episode_*.npz"))
    if not files:
        inside = sorted(p.parent.name for p in [*root.glob("*/driving_log.csv"), *root.glob(f"*/{CARD_NAME}")])
        hint = (f"; it holds {', '.join(f'{n}/' for n in inside)}: point at that folder (a dataset, or a simulator "
                f"recording with driving_log.csv and IMG/)" if inside else "; is it the --out folder of collect.py?")
        raise FileNotFoundError(f"dataset folder {str(root)!r} holds no episodes (expected "
                                f"{EPISODE_DIR}/episode_*.npz){hint}")
    try:
        card = json.loads(card_path.read_text()) if card_path.exists() else {}
    except json.JSONDecodeError as e:
        raise ValueError(f"dataset card {str(card_path)!r} is not valid JSON: {e}") from None
    if card.get("format") is not None and card["format"] not in READABLE_FORMATS:
        raise ValueError(f"dataset card {str(card_path)!r} names the format {card['format']!r}; this version reads "
                         f"{FORMAT!r}")
    metas, paths = [], []
    for f in files:
        try:
            metas.append(read_episode_meta(f))
        except Exception as e:  # a foreign or damaged file: say which one
            raise ValueError(f"episode file {str(f)!r} is unreadable ({e}); delete it and collect again") from None
        paths.append(f)
    return DemoDataset(root=root, card=card, episodes=metas, paths=paths)


def episodes_held(root: str | Path) -> int:
    """How many finished episodes the dataset folder holds, 0 where none is written yet: a collection that was
    stopped keeps the episodes it finished, and its caller tops it up or starts it over."""
    return len(open_dataset(root).episodes) if (Path(root) / CARD_NAME).is_file() else 0


RECORDING_SOURCE = "udacity-recording"  # the "source" of a real simulator recording (card and episode meta)


def is_recording(meta: dict) -> bool:
    """True for a session a person drove in the real simulator (driving_data.udacity_import imported it)."""
    return meta.get("source") == RECORDING_SOURCE


def trained_env(name: str) -> str:
    """The env a dataset's frames belong to: a replay's (collect.py --env replay:FOLDER, DAgger on a recording) is the
    env of the recording it replays, whose students it trains with."""
    if not name.startswith(REPLAY_PREFIX):
        return name
    card = json.loads((Path(name[len(REPLAY_PREFIX):]) / CARD_NAME).read_text())
    return trained_env(card.get("env") or "udacity")


SIDE_CAMERAS = {"frames_left", "frames_right"}  # optional: training reads them only where every episode has them


def _identity(ds: DemoDataset) -> dict[str, Any]:
    """What two datasets must share to be one: env, action space, expert (by SHA-256; a latency expert counts as the
    expert it was fine-tuned from, whose labels it gives at latency 0), the arrays of a step but the side cameras."""
    first = ds.episodes[0]
    expert = first.get("expert_base_sha256") or first.get("expert_sha256")
    return {"env": trained_env(ds.card.get("env") or first.get("env") or "carracing"),
            "action space": ds.card.get("action_space") or first.get("action_space"),
            "expert": "a person (simulator recording)" if is_recording(first) else expert,
            "arrays": sorted(set(ds.array_names(0)) - SIDE_CAMERAS)}


def _check_joinable(parts: list[DemoDataset]) -> None:
    """Same env and action space always; the same expert and arrays too, unless one side is a person's recording
    and the other simulator data (--data REC SIM: real driving plus the simulator's; every episode file has the
    frames, time and labels training reads)."""
    want = _identity(parts[0])
    for ds in parts[1:]:
        have = _identity(ds)
        mixed = is_recording(ds.episodes[0]) != is_recording(parts[0].episodes[0])
        for key, value in want.items():
            if mixed and key in ("expert", "arrays"):
                continue
            if have[key] != value:
                raise ValueError(f"{str(ds.root)!r} differs from {str(parts[0].root)!r} in its {key} ({have[key]} vs "
                                 f"{value}); datasets of different envs, action spaces or experts are not joined")


def join_datasets(roots: Sequence[str | Path]) -> tuple[list[DemoDataset], list[tuple[DemoDataset, dict, Path]]]:
    """The datasets and their episodes as one list: by track seed when every episode has one (shards are seed
    ranges, so this is the order one collection over all the seeds has), else in the order given."""
    if len({Path(r).resolve() for r in roots}) < len(roots):
        raise ValueError(f"the same dataset folder is named twice in {[str(r) for r in roots]}")
    parts = [open_dataset(r) for r in roots]
    _check_joinable(parts)
    rows = [(ds, m, p) for ds in parts for m, p in zip(ds.episodes, ds.paths)]
    if all(isinstance(m.get("track_seed"), int) for _, m, _ in rows):
        where: dict[int, str] = {}
        for ds, m, _ in rows:
            seed = m["track_seed"]
            if seed in where:
                raise ValueError(f"track seed {seed} is in both {where[seed]} and {str(ds.root)!r} (episode "
                                 f"{m['episode_id']}); shards must cover disjoint seed ranges")
            where[seed] = repr(str(ds.root))
        rows.sort(key=lambda r: r[1]["track_seed"])
    return parts, rows


def pool_card(root: str | Path) -> dict | None:
    """The card of a pool (a folder of datasets written by ``python -m agent.udacity.pool import``), None for any
    other folder."""
    path = Path(root) / POOL_NAME
    return json.loads(path.read_text()) if path.is_file() else None


def expand_pools(roots: Sequence[str | Path]) -> list[str]:
    """The folders with every pool replaced by its member datasets, in the pool's order."""
    out = []
    for root in roots:
        card = pool_card(root)
        out += [str(Path(root) / m["name"]) for m in card["recordings"]] if card is not None else [str(root)]
    return out


def open_datasets(roots: str | Path | Sequence[str | Path]) -> DemoDataset:
    """One dataset folder (``open_dataset``), or several read as one without copying anything (``train.py
    --data A B``): the episodes ``merge_datasets`` would write, in the same order, with the first folder's card.
    Several folders must hold one env, action space and expert (or be a person's recordings joined with simulator
    data), and never the same track seed twice."""
    roots = expand_pools([roots] if isinstance(roots, (str, Path)) else list(roots))
    if not roots:
        raise ValueError("no dataset folder given")
    if len(roots) == 1:
        return open_dataset(roots[0])
    parts, rows = join_datasets(roots)
    return DemoDataset(root=parts[0].root, card=parts[0].card, episodes=[m for _, m, _ in rows],
                       paths=[p for _, _, p in rows])


def dataset_action_spaces(card: dict, episodes: list[dict]) -> set[str]:
    """The action spaces a dataset's card and episode metas name (one for a consistent dataset; empty if none says)."""
    spaces = {card.get("action_space")} | {m.get("action_space") for m in episodes}
    return {s for s in spaces if s is not None}


def dataset_env_name(card: dict, episodes: list[dict]) -> str:
    """The name of the env a dataset was recorded in (card or episode meta; datasets older than the udacity env are
    CarRacing); ``envs.registry.dataset_env`` gives its EnvSpec."""
    names = {trained_env(n) for n in {card.get("env")} | {m.get("env") for m in episodes} if n is not None}
    if len(names) > 1:
        raise ValueError(f"the dataset mixes environments {sorted(names)}")
    return names.pop() if names else "carracing"


def queued_actions(applied: np.ndarray, steps: np.ndarray, latencies: np.ndarray, size: int) -> np.ndarray:
    """The actions on their way ``[N, size, A]`` at ``steps`` of a recorded episode driven under ``latencies``
    (per step): the recorder applies at step t the action chosen at t - D, so the D actions then on their way are
    the ones ``applied`` at t .. t + D - 1 (next to land first); zeros past D, the last applied one past the end."""
    applied = np.asarray(applied, np.float32)
    steps, latencies = np.asarray(steps, np.int64), np.asarray(latencies, np.int64)
    if len(latencies) and latencies.max() > size:
        raise ValueError(f"a latency of {int(latencies.max())} steps has more actions on their way than the {size} "
                         "shown")
    k = np.arange(size)
    index = np.minimum(steps[:, None] + k[None], len(applied) - 1)
    out = applied[index]
    out[k[None] >= latencies[:, None]] = 0.0
    return out
