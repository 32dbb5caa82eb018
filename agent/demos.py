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
  episodes ordered by track seed; ``merge_datasets`` / ``python -m agent.demos merge A B --out C`` writes that
  join as one dataset with one card that collect.py appends to (DAgger).
* ``DemoDataset.prepared`` keeps an episode's frames, prepared for training, uncompressed in ``DATA/.cache``
  and hands out a ``FrameFile`` that reads rows on demand (``train.py --data-loading lazy``).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import cv2
import numpy as np
import torch
from torch.utils.data import Dataset

CARD_NAME = "dataset.json"
EPISODE_DIR = "episodes"
REQUIRED_ARRAYS = ("frames", "action", "expert_action", "reward", "speed", "privileged", "time")
FINAL_PREFIX = "final_"
JPEG_SUFFIX = "__jpeg"
OFFSETS_SUFFIX = "__jpeg_offsets"
CACHE_DIR = ".cache"  # prepared frames for training (DemoDataset.prepared); hidden: collect.py ignores dot entries
RESERVED_MARK = "__jpeg"  # user arrays may not contain it: it would collide with the stored JPEG members
# Quality for first-person camera frames, three 160x320 cameras per step: 33-37 MB per 1000 steps at a
# mean absolute error of about 1 grey level on envs/udacity frames (lossless npz: 89-116 MB); 55-60 MB
# at 2-2.6 on noisier synthetic road frames (lossless: 85-300 MB). 90 saves a quarter to a third.
RECOMMENDED_JPEG_QUALITY = 95
_DECODE_THREADS = 2  # cv2.imdecode releases the GIL: about 1.6x faster on this 2-core machine
_IMREAD_RGB = getattr(cv2, "IMREAD_COLOR_RGB", None)  # OpenCV >= 4.10 decodes straight to RGB


def episode_path(root: str | Path, episode_id: int) -> Path:
    return Path(root) / EPISODE_DIR / f"episode_{episode_id:05d}.npz"


def atomic_write(path: Path, write) -> None:
    """Write through a temp file in the same folder, then rename: readers never see a half file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)  # mkstemp makes 0600; datasets are meant to be shared and read by others
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def refuse_nonempty(out_dir: Path) -> None:
    """ValueError unless out_dir is absent or an empty folder: a new dataset never lands on old files."""
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ValueError(f"output folder {str(out_dir)!r} exists and is not empty; choose a new folder")


@dataclass
class StagingFolder:
    """Write into a hidden sibling folder, rename it to ``out_dir`` at the end: a failed or interrupted
    run leaves nothing behind, and ``out_dir`` never holds half a result."""

    out_dir: Path
    tmp: Path | None = None

    def __enter__(self) -> Path:
        refuse_nonempty(self.out_dir)
        self.out_dir.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(dir=self.out_dir.parent, prefix=f".{self.out_dir.name}.", suffix=".tmp"))
        os.chmod(self.tmp, 0o755)  # mkdtemp makes 0700; the result is meant to be shared
        return self.tmp

    def __exit__(self, exc_type, exc, tb) -> None:
        assert self.tmp is not None
        try:
            if exc_type is None:
                refuse_nonempty(self.out_dir)  # someone may have written there meanwhile
                if self.out_dir.exists():
                    self.out_dir.rmdir()
                os.replace(self.tmp, self.out_dir)
        finally:
            if self.tmp.exists():
                shutil.rmtree(self.tmp, ignore_errors=True)


def write_json_atomic(path: str | Path, obj: Any) -> None:
    atomic_write(Path(path), lambda f: f.write(json.dumps(obj, indent=2).encode()))


def is_frame_name(name: str) -> bool:
    """Image arrays JPEG storage applies to: ``frames``, ``frames_<camera>`` and their ``final_`` forms."""
    base = name[len(FINAL_PREFIX):] if name.startswith(FINAL_PREFIX) else name
    return base == "frames" or base.startswith("frames_")


def jpeg_shape(data: bytes | memoryview | np.ndarray) -> tuple[int, int, int]:
    """(height, width, channels) read from a JPEG's frame header without decoding it.

    Why: importers check thousands of files for "is a JPEG, right size" at the cost of a header scan."""
    b = memoryview(np.ascontiguousarray(data, dtype=np.uint8)) if isinstance(data, np.ndarray) else memoryview(data)
    n = len(b)
    if n < 4 or b[0] != 0xFF or b[1] != 0xD8:
        raise ValueError("not a JPEG (it does not start with the JPEG start-of-image marker FF D8)")
    i = 2
    while i + 4 <= n:
        if b[i] != 0xFF:
            raise ValueError(f"not a valid JPEG (no marker at byte {i})")
        marker = b[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:  # markers without a length
            i += 2
            continue
        length = (b[i + 2] << 8) | b[i + 3]
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):  # start of frame
            if i + 10 > n:
                break
            return (b[i + 5] << 8) | b[i + 6], (b[i + 7] << 8) | b[i + 8], b[i + 9]
        if marker == 0xDA:  # start of scan before any frame header
            break
        i += 2 + length
    raise ValueError("not a valid JPEG (no frame header before the image data)")


def _encode_jpeg(frame: np.ndarray, quality: int) -> bytes:
    img = frame if frame.shape[-1] == 1 else np.ascontiguousarray(frame[..., ::-1])  # OpenCV encodes BGR
    ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, int(quality)])
    if not ok:
        raise ValueError(f"OpenCV could not JPEG-encode a frame of shape {frame.shape}")
    return buf.tobytes()


def _decode_jpeg(buf: np.ndarray, channels: int) -> np.ndarray | None:
    if channels == 1:
        img = cv2.imdecode(buf, cv2.IMREAD_GRAYSCALE)
        return None if img is None else img[..., None]
    if _IMREAD_RGB is not None:
        return cv2.imdecode(buf, _IMREAD_RGB)
    img = cv2.imdecode(buf, cv2.IMREAD_COLOR)
    return None if img is None else cv2.cvtColor(img, cv2.COLOR_BGR2RGB)


def check_jpeg_quality(quality: Any) -> int:
    """The quality as an int, or a ValueError naming the argument (JPEG qualities are 1..100)."""
    if isinstance(quality, bool) or not isinstance(quality, (int, np.integer)) or not 1 <= quality <= 100:
        raise ValueError(f"jpeg_quality must be an integer in [1, 100], got {quality!r}")
    return int(quality)


@dataclass(frozen=True)
class JpegFrames:
    """``T`` frames kept as JPEG bytes: one concatenated buffer plus ``T + 1`` offsets.

    Why a value type: ``write_episode`` stores it as is, so an importer keeps a recording's original
    JPEG bytes (no second lossy encode), and ``DemoDataset.jpeg_frames`` returns one so an exporter can
    copy the bytes out without decoding."""

    data: np.ndarray  # uint8 [N]
    offsets: np.ndarray  # int64 [T + 1]
    frame_shape: tuple[int, int, int]  # (H, W, C) of every frame
    quality: int | None = None  # None: encoded elsewhere, quality unknown

    def __post_init__(self) -> None:
        data = np.ascontiguousarray(self.data, dtype=np.uint8).reshape(-1)
        offsets = np.asarray(self.offsets, dtype=np.int64).reshape(-1)
        shape = tuple(int(x) for x in self.frame_shape)
        if len(shape) != 3 or shape[2] not in (1, 3) or min(shape) < 1:
            raise ValueError(f"JpegFrames: frame_shape must be (height, width, 1 or 3), got {self.frame_shape}")
        if len(offsets) < 1 or offsets[0] != 0 or offsets[-1] != len(data) or np.any(np.diff(offsets) <= 0):
            raise ValueError(
                f"JpegFrames: offsets must start at 0, strictly increase and end at len(data)={len(data)}; "
                f"got {len(offsets)} offsets from {offsets[:1].tolist()} to {offsets[-1:].tolist()}"
            )
        object.__setattr__(self, "data", data)
        object.__setattr__(self, "offsets", offsets)
        object.__setattr__(self, "frame_shape", shape)

    @classmethod
    def from_bytes(cls, images: Sequence[bytes], frame_shape: Sequence[int] | None = None,
                   quality: int | None = None) -> JpegFrames:
        """Wrap already-encoded JPEG files; the shape defaults to the first image's header and every
        image's header must agree with it (a wrong file is named by its index)."""
        if frame_shape is None:
            if not images:
                raise ValueError("JpegFrames.from_bytes: frame_shape is needed when there are no images")
            frame_shape = jpeg_shape(images[0])
        offsets = np.zeros(len(images) + 1, dtype=np.int64)
        np.cumsum([len(b) for b in images], out=offsets[1:])
        frames = cls(np.frombuffer(b"".join(images), dtype=np.uint8), offsets, tuple(frame_shape), quality)
        frames.check()
        return frames

    @classmethod
    def encode(cls, frames: np.ndarray, quality: int = RECOMMENDED_JPEG_QUALITY) -> JpegFrames:
        """Encode uint8 RGB (or 1-channel) frames ``[T, H, W, C]``."""
        quality = check_jpeg_quality(quality)
        frames = np.asarray(frames)
        if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] not in (1, 3):
            raise ValueError(f"JPEG frames must be uint8 [T, H, W, 1 or 3], got {frames.dtype} {list(frames.shape)}")
        return cls.from_bytes([_encode_jpeg(f, quality) for f in frames], frames.shape[1:], quality)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, t: int) -> bytes:
        """The JPEG file of frame ``t``, byte for byte."""
        return self.data[self.offsets[t]:self.offsets[t + 1]].tobytes()

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self), *self.frame_shape)

    @property
    def codec(self) -> str:
        return f"jpeg{self.quality}" if self.quality is not None else "jpeg"

    def check(self) -> None:
        """Every frame is a JPEG of ``frame_shape`` (header scan only; no decode)."""
        for t in range(len(self)):
            try:
                shape = jpeg_shape(self.data[self.offsets[t]:self.offsets[t + 1]])
            except ValueError as e:
                raise ValueError(f"JpegFrames: frame {t} is {e}") from None
            if shape != self.frame_shape:
                raise ValueError(f"JpegFrames: frame {t} is {shape[0]}x{shape[1]}x{shape[2]}, the others "
                                 f"{self.frame_shape[0]}x{self.frame_shape[1]}x{self.frame_shape[2]} (height x width x channels)")

    def decode(self, indices: Sequence[int] | None = None) -> np.ndarray:
        """uint8 RGB ``[n, H, W, C]`` of the chosen frames (all by default), decoded on 2 threads."""
        idx = np.arange(len(self)) if indices is None else np.asarray(indices, dtype=np.int64).reshape(-1)
        out = np.empty((len(idx), *self.frame_shape), dtype=np.uint8)

        def work(rows: np.ndarray) -> None:
            for j in rows:
                t = idx[j]
                img = _decode_jpeg(self.data[self.offsets[t]:self.offsets[t + 1]], self.frame_shape[2])
                if img is None or img.shape != self.frame_shape:
                    got = "undecodable" if img is None else f"shape {img.shape}"
                    raise ValueError(f"JPEG frame {int(t)} is {got}, expected {self.frame_shape}")
                out[j] = img

        if len(idx) < 64:
            work(np.arange(len(idx)))
        else:
            with ThreadPoolExecutor(_DECODE_THREADS) as pool:
                list(pool.map(work, np.array_split(np.arange(len(idx)), _DECODE_THREADS)))
        return out


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
        raise ValueError(f"write_episode: array names may not contain {RESERVED_MARK!r} (used for stored JPEG data), got {reserved}")
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
                raise ValueError(f"write_episode: {k} must be one step of {base!r} (shape {want}), got shape {_shape(v)}")
    stored: dict[str, np.ndarray] = {}
    codecs: dict[str, str] = {}
    shapes: dict[str, list[int]] = {}
    for k, v in arrays.items():
        if isinstance(v, JpegFrames) or (jpeg_quality is not None and is_frame_name(k)):
            if isinstance(v, JpegFrames):
                v.check()
                jf = v
            else:
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
        atomic_write(path, lambda f: np.savez_compressed(f, meta=np.array(json.dumps(meta)), **stored))
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


def _npy_header(f: Any) -> tuple[tuple[int, ...], np.dtype, int]:
    """(shape, dtype, header length in bytes) of the .npy stream ``f`` (left just past the header)."""
    version = np.lib.format.read_magic(f)
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, fortran, dtype = read(f)
    if fortran:
        raise ValueError("Fortran-ordered .npy arrays are not read here")
    return tuple(int(x) for x in shape), np.dtype(dtype), f.tell()


class FrameFile:
    """A C-ordered ``.npy`` file whose rows are read on demand: ``len``, ``shape``, ``dtype`` and ``[a:b]``
    (also ``[t]``), as an array would answer, but each slice is one ``os.preadv`` into a fresh array.

    Why not ``np.load(mmap_mode="r")``: every page a memory map touches counts in the process's resident
    memory until the kernel needs it back, so over an epoch a mapped dataset looks (and is accounted) as
    large as an in-memory one. Reads into fresh arrays leave the pages in the OS page cache, shared by
    every process on the machine (torchrun's ranks) and never charged to one of them."""

    def __init__(self, path: str | Path):
        self.path = str(path)
        with open(self.path, "rb") as f:
            self.shape, self.dtype, self.offset = _npy_header(f)
        if len(self.shape) < 1:
            raise ValueError(f"{self.path!r} holds a scalar, not rows")
        self.row_bytes = int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize
        expected = self.offset + self.shape[0] * self.row_bytes
        if os.path.getsize(self.path) < expected:
            raise ValueError(f"{self.path!r} is truncated ({os.path.getsize(self.path)} bytes, {expected} expected)")

    def __len__(self) -> int:
        return self.shape[0]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __getitem__(self, key: int | slice) -> np.ndarray:
        if isinstance(key, (int, np.integer)):
            t = int(key) + (len(self) if key < 0 else 0)
            if not 0 <= t < len(self):
                raise IndexError(f"row {int(key)} of {len(self)}")
            return self[t:t + 1][0]
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError(f"FrameFile reads rows a:b (step 1) or one row, got {key!r}")
        start, stop, _ = key.indices(len(self))
        out = np.empty((max(0, stop - start), *self.shape[1:]), dtype=self.dtype)
        if len(out):
            view, done = memoryview(out).cast("B"), 0
            fd = os.open(self.path, os.O_RDONLY)
            try:
                while done < len(view):
                    got = os.preadv(fd, [view[done:]], self.offset + start * self.row_bytes + done)
                    if got <= 0:
                        raise OSError(f"{self.path!r}: short read at row {start} ({done} of {len(view)} bytes)")
                    done += got
            finally:
                os.close(fd)
        return out

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        rows = self[:]
        return rows if dtype is None else rows.astype(dtype)


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
                    n = _npy_header(f)[0][0] - 1
                meta = json.loads(str(np.load(path, allow_pickle=False)["meta"]))
                shape = tuple(int(x) for x in meta["frame_shapes"][name])
                return shape if name.startswith(FINAL_PREFIX) else (n, *shape)
            if name + ".npy" not in members:
                raise ValueError(f"episode file {str(path)!r} has no array {name!r}; it has {_array_names([m[:-4] for m in members])}")
            with zf.open(name + ".npy") as f:
                return tuple(_npy_header(f)[0])

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
        raise FileNotFoundError(f"dataset folder {str(root)!r} does not exist; create one with `python collect.py --out {root}`")
    card_path = root / CARD_NAME
    files = sorted((root / EPISODE_DIR).glob("episode_*.npz"))
    if not files:
        raise FileNotFoundError(
            f"dataset folder {str(root)!r} holds no episodes (expected {EPISODE_DIR}/episode_*.npz); "
            f"is it the --out folder of collect.py?"
        )
    try:
        card = json.loads(card_path.read_text()) if card_path.exists() else {}
    except json.JSONDecodeError as e:
        raise ValueError(f"dataset card {str(card_path)!r} is not valid JSON: {e}") from None
    metas, paths = [], []
    for f in files:
        try:
            metas.append(read_episode_meta(f))
        except Exception as e:  # a foreign or damaged file: say which one
            raise ValueError(f"episode file {str(f)!r} is unreadable ({e}); delete it and collect again") from None
        paths.append(f)
    return DemoDataset(root=root, card=card, episodes=metas, paths=paths)


# ----------------------------------------------------------------------------- several datasets as one
def _identity(ds: DemoDataset) -> dict[str, Any]:
    """What two datasets must share to be one: env, action space, expert (by SHA-256), the arrays of a step."""
    first = ds.episodes[0]
    return {"env": ds.card.get("env") or first.get("env") or "carracing",
            "action space": ds.card.get("action_space") or first.get("action_space"),
            "expert": first.get("expert_sha256"),
            "arrays": sorted(ds.array_names(0))}


def _join(roots: Sequence[str | Path]) -> tuple[list[DemoDataset], list[tuple[DemoDataset, dict, Path]]]:
    """The datasets and their episodes as one list: by track seed when every episode has one (shards are seed
    ranges, so this is the order one collection over all the seeds has), else in the order given."""
    if len({Path(r).resolve() for r in roots}) < len(roots):
        raise ValueError(f"the same dataset folder is named twice in {[str(r) for r in roots]}")
    parts = [open_dataset(r) for r in roots]
    want = _identity(parts[0])
    for ds in parts[1:]:
        have = _identity(ds)
        for key, value in want.items():
            if have[key] != value:
                raise ValueError(f"{str(ds.root)!r} differs from {str(parts[0].root)!r} in its {key} ({have[key]} vs "
                                 f"{value}); datasets of different envs, action spaces or experts are not joined")
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


def open_datasets(roots: str | Path | Sequence[str | Path]) -> DemoDataset:
    """One dataset folder (``open_dataset``), or several read as one without copying anything (``train.py
    --data A B``): the episodes ``merge_datasets`` would write, in the same order, with the first folder's card.
    Several folders must hold one env, action space and expert, and never the same track seed twice."""
    if isinstance(roots, (str, Path)):
        return open_dataset(roots)
    roots = list(roots)
    if not roots:
        raise ValueError("no dataset folder given")
    if len(roots) == 1:
        return open_dataset(roots[0])
    parts, rows = _join(roots)
    return DemoDataset(root=parts[0].root, card=parts[0].card, episodes=[m for _, m, _ in rows],
                       paths=[p for _, _, p in rows])


def _copy_episode(src: Path, dst: Path, meta: dict) -> None:
    """Copy an episode file, atomically; with a new ``meta`` every array member is copied as it is stored
    (deflated, or raw JPEG bytes) and only ``meta`` is written anew."""
    def write(f: Any) -> None:
        if meta == read_episode_meta(src):
            with open(src, "rb") as r:
                shutil.copyfileobj(r, f, 1 << 20)
            return
        with zipfile.ZipFile(src) as zin, zipfile.ZipFile(f, "w", allowZip64=True) as zout:
            for info in zin.infolist():
                member = zipfile.ZipInfo(info.filename, date_time=info.date_time)
                member.compress_type = info.compress_type
                with zout.open(member, "w", force_zip64=True) as w:
                    if info.filename == "meta.npy":
                        np.lib.format.write_array(w, np.array(json.dumps(meta)), allow_pickle=False)
                    else:
                        with zin.open(info) as r:
                            shutil.copyfileobj(r, w, 1 << 20)

    atomic_write(dst, write)


def merge_datasets(roots: Sequence[str | Path], out: str | Path, *, command: str | None = None) -> DemoDataset:
    """Write the episodes of several datasets (collection shards: disjoint track-seed ranges) as one new
    dataset with one card, into ``out`` (new or empty; it appears complete or not at all).

    Episode ids become ``track_seed - lowest seed``, so the collector's rule "episode k is track seed + k"
    holds for the merged folder and ``collect.py --out MERGED`` (a DAgger round, more episodes) appends
    after the highest seed. The card is the collector's, rebuilt from every episode's metadata (counts,
    returns, action histograms are those of one collection over all the seeds); its ``runs`` keep every
    source's runs (with their ``dataset``) and end with this merge. Folders that are not collect.py output
    (no track seeds) are renumbered 0.. in the order given, under a card that sums their counts."""

    roots = list(roots)
    if len(roots) < 2:
        raise ValueError(f"merge needs at least two dataset folders, got {len(roots)}")
    out = Path(out)
    if any(out.resolve() == Path(r).resolve() for r in roots):
        raise ValueError(f"--out {str(out)!r} is one of the datasets to merge; choose a new folder")
    parts, rows = _join(roots)
    seeds = [m.get("track_seed") for _, m, _ in rows]
    base = min(seeds) if all(isinstance(s, int) for s in seeds) else None
    metas = [{**m, "episode_id": (m["track_seed"] - base) if base is not None else k} for k, (_, m, _) in enumerate(rows)]
    with StagingFolder(out) as tmp:
        for (_, _, src), meta in zip(rows, metas):
            _copy_episode(src, episode_path(tmp, meta["episode_id"]), meta)
        write_json_atomic(tmp / CARD_NAME, _merged_card(parts, rows, metas, base, command))
    return open_dataset(out)


def _merged_card(parts: list[DemoDataset], rows: list[tuple[DemoDataset, dict, Path]], metas: list[dict],
                 base: int | None, command: str | None) -> dict[str, Any]:
    import time

    first = rows[0][0].card
    steps = int(sum(m["length"] for m in metas))
    runs = [{**r, "dataset": str(ds.root)} for ds in parts for r in ds.card.get("runs", [])]
    sources = []
    for ds in parts:
        seeds = [m["track_seed"] for m in ds.episodes] if base is not None else []
        sources.append({"dataset": str(ds.root), "episodes": len(ds), "steps": ds.num_steps,
                        "track_seeds": [min(seeds), max(seeds)] if seeds else None})
    runs.append({"command": command or "merge", "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "merged_from": sources,
                 "episodes_added": len(metas), "steps_added": steps, "interrupted": False})
    config = first.get("config")
    if config and base is not None:
        from agent.collector import build_card
        from envs.registry import get_spec

        try:
            return build_card({**config, "seed": base}, first.get("expert") or {}, runs, metas, get_spec(config["env"]))
        except (KeyError, TypeError, ValueError):  # episodes without the collector's metadata: the plain card below
            pass
    dt = first.get("dt")
    counts = {"episodes": len(metas), "steps": steps, **({"hours_of_driving": steps * dt / 3600} if dt else {})}
    return {**first, "counts": counts, "runs": runs,
            "episodes": [{k: m.get(k) for k in ("episode_id", "track_seed", "length")} for m in metas]}


def split_episodes(n_episodes: int, val_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Train/validation split by episode, never by frame (frames of one episode are highly correlated)."""
    if n_episodes < 2:
        raise ValueError(f"need at least 2 episodes to split into train and validation, got {n_episodes}")
    order = np.random.default_rng(seed).permutation(n_episodes)
    n_val = min(n_episodes - 1, max(1, round(val_fraction * n_episodes)))
    return sorted(order[n_val:].tolist()), sorted(order[:n_val].tolist())


def kfold_episodes(n_episodes: int, folds: int, seed: int) -> list[tuple[list[int], list[int]]]:
    """K folds by episode: each episode is in exactly one validation fold."""
    if not 2 <= folds <= n_episodes:
        raise ValueError(f"folds must be in [2, number of episodes={n_episodes}], got {folds}")
    order = np.random.default_rng(seed).permutation(n_episodes)
    parts = np.array_split(order, folds)
    return [
        (sorted(np.concatenate([p for j, p in enumerate(parts) if j != k]).tolist()), sorted(parts[k].tolist()))
        for k in range(folds)
    ]


def window_indices(t: int, window: int, frame_stride: int) -> np.ndarray:
    """Frame indices of the window ending at step ``t``; before the episode start, frame 0 repeats
    (exactly what a fresh streaming policy sees after ``reset``)."""
    return np.maximum(t - frame_stride * np.arange(window - 1, -1, -1), 0)


class WindowDataset(Dataset):
    """Windows of ``window`` frames (every ``frame_stride``-th) ending at each step of the chosen episodes.

    The chosen episodes are decompressed into memory once (a 1000-step episode is ~28 MB of
    frames), so sampling a window is an index gather, not a disk read.
    """

    def __init__(
        self,
        dataset: DemoDataset,
        episode_indices: list[int] | None = None,
        window: int = 8,
        frame_stride: int = 1,
        target: str = "expert_action",
    ):
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        if frame_stride < 1:
            raise ValueError(f"frame_stride must be >= 1, got {frame_stride}")
        episode_indices = list(range(len(dataset))) if episode_indices is None else list(episode_indices)
        if not episode_indices:
            raise ValueError("WindowDataset needs at least one episode")
        self.window, self.frame_stride, self.target = window, frame_stride, target
        self.frames: list[np.ndarray] = []
        self.times: list[np.ndarray] = []
        self.targets: list[np.ndarray] = []
        index = []
        for j, i in enumerate(episode_indices):
            names = dataset.array_names(i)
            if target not in names:
                raise ValueError(f"target {target!r} is not in the dataset; it has {sorted(names)}")
            arrays = dataset.load(i, keys=["frames", "time", target])  # not the other cameras: decoding costs
            self.frames.append(arrays["frames"])
            self.times.append(arrays["time"].astype(np.float64))
            self.targets.append(arrays[target])
            index.append(np.stack([np.full(len(arrays["frames"]), j), np.arange(len(arrays["frames"]))], 1))
        self.index = np.concatenate(index) if index else np.zeros((0, 2), dtype=np.int64)

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, n: int) -> dict[str, torch.Tensor]:
        e, t = self.index[n]
        idx = window_indices(int(t), self.window, self.frame_stride)
        times = self.times[e][idx]
        target = self.targets[e][t]
        return {
            "frames": torch.from_numpy(self.frames[e][idx]),
            "time": torch.from_numpy((times - times[-1]).astype(np.float32)),
            "target": torch.as_tensor(target, dtype=torch.int64 if np.issubdtype(np.asarray(target).dtype, np.integer) else torch.float32),
        }

    def targets_array(self) -> np.ndarray:
        """All targets stacked (for normalisation statistics and class weights)."""
        return np.concatenate(self.targets)


# ----------------------------------------------------------------------------- CLI
def main(argv: Sequence[str] | None = None) -> int:
    """``python -m agent.demos merge A B ... --out C``: one dataset from collection shards."""
    import argparse
    import shlex
    import sys

    class Parser(argparse.ArgumentParser):
        def error(self, message: str) -> Any:  # one line, exit 2, no usage dump
            self.exit(2, f"error: {message} (see python -m agent.demos --help)\n")

    parser = Parser(prog="python -m agent.demos", description="Demonstration datasets (the format: agent/demos.py).")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{merge}")
    m = sub.add_parser("merge", help="several datasets -> one, with one card",
                       description="Write the episodes of several collect.py datasets (e.g. the shards of collect.py "
                                   "--shard I/N, or runs over disjoint --seed ranges) as one new dataset with one card. "
                                   "They must share env, action space and expert, and never repeat a track seed. "
                                   "Episode ids become track seed - lowest seed, so collect.py --out MERGED (DAgger, "
                                   "more episodes) appends to it. train.py --data A B reads several folders as one "
                                   "without this copy.")
    m.add_argument("sources", nargs="+", metavar="DATA", help="dataset folders (collect.py --out)")
    m.add_argument("--out", required=True, metavar="OUT", help="the merged dataset folder (new or empty)")
    args = parser.parse_args(argv)
    try:
        merged = merge_datasets(args.sources, args.out,
                                command="python -m agent.demos " + shlex.join(list(argv if argv is not None else sys.argv[1:])))
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # the staging folder is removed: nothing half-written stays
        print("interrupted", file=sys.stderr)
        return 130
    seeds = [m.get("track_seed") for m in merged.episodes]
    span = f", track seeds {min(seeds)}..{max(seeds)}" if all(isinstance(x, int) for x in seeds) else ""
    print(f"merged {len(args.sources)} datasets into {merged.root}: {len(merged)} episodes, {merged.num_steps} steps{span}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
