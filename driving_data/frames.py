"""Camera frames on disk: JPEG-encoded frame buffers (``JpegFrames``, how first-person cameras are stored)
and uncompressed ``.npy`` frame files read row by row on demand (``FrameFile``, ``train.py --data-loading lazy``)."""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence, cast

import cv2
import numpy as np

from common.checks import is_int

JPEG_SUFFIX = "__jpeg"
OFFSETS_SUFFIX = "__jpeg_offsets"
# Quality for first-person camera frames, three 160x320 cameras per step: 33-37 MB per 1000 steps at a
# mean absolute error of about 1 grey level on envs/udacity frames (lossless npz: 89-116 MB); 55-60 MB
# at 2-2.6 on noisier synthetic road frames (lossless: 85-300 MB). 90 saves a quarter to a third.
RECOMMENDED_JPEG_QUALITY = 95
_DECODE_THREADS = 2  # cv2.imdecode releases the GIL: about 1.6x faster on this 2-core machine
_IMREAD_RGB = getattr(cv2, "IMREAD_COLOR_RGB", None)  # OpenCV >= 4.10 decodes straight to RGB


def jpeg_shape(data: bytes | memoryview | np.ndarray) -> tuple[int, int, int]:
    """(height, width, channels) read from a JPEG's frame header without decoding it.

    Why: importers check thousands of files for "is a JPEG, right size" at the cost of a header scan."""
    # numpy's stubs give ndarray its buffer protocol (__buffer__) only for Python >= 3.12
    b = (memoryview(np.ascontiguousarray(data, dtype=np.uint8))  # type: ignore[arg-type]
         if isinstance(data, np.ndarray) else memoryview(data))
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


def encode_jpeg(frame: np.ndarray, quality: int) -> bytes:
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
    if not is_int(quality, 1, 100):
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
        shape = cast(tuple[int, int, int], tuple(frame_shape))  # check() refuses any other length
        frames = cls(np.frombuffer(b"".join(images), dtype=np.uint8), offsets, shape, quality)
        frames.check()
        return frames

    @classmethod
    def encode(cls, frames: np.ndarray, quality: int = RECOMMENDED_JPEG_QUALITY) -> JpegFrames:
        """Encode uint8 RGB (or 1-channel) frames ``[T, H, W, C]``."""
        quality = check_jpeg_quality(quality)
        frames = np.asarray(frames)
        if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] not in (1, 3):
            raise ValueError(f"JPEG frames must be uint8 [T, H, W, 1 or 3], got {frames.dtype} {list(frames.shape)}")
        return cls.from_bytes([encode_jpeg(f, quality) for f in frames], frames.shape[1:], quality)

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
                                 f"{self.frame_shape[0]}x{self.frame_shape[1]}x{self.frame_shape[2]} "
                                 "(height x width x channels)")

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


def npy_header(f: Any) -> tuple[tuple[int, ...], np.dtype, int]:
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
            self.shape, self.dtype, self.offset = npy_header(f)
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
            view, done = memoryview(out).cast("B"), 0  # type: ignore[arg-type]  # as in jpeg_shape
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


class FrameRows:
    """Rows ``start .. stop-1`` of a frame array or ``FrameFile``, answering ``len`` and ``[a:b]`` like them: a
    part of an episode (a time block held out for validation) without copying or reading its frames."""

    def __init__(self, frames: np.ndarray | FrameFile | FrameRows, start: int, stop: int):
        if not 0 <= start <= stop <= len(frames):
            raise ValueError(f"rows {start}..{stop} are not within 0..{len(frames)}")
        self.frames, self.start, self.stop = frames, start, stop

    def __len__(self) -> int:
        return self.stop - self.start

    def __getitem__(self, key: slice) -> np.ndarray:
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError(f"FrameRows reads rows a:b (step 1), got {key!r}")
        a, b, _ = key.indices(len(self))
        return self.frames[self.start + a:self.start + max(a, b)]
