"""The Udacity self-driving-car simulator's recording format, both ways: export a dataset to it, import one.

    python -m agent.udacity.recordings export data/udacity --out out/udacity_log     # dataset -> IMG/ + driving_log.csv
    python -m agent.udacity.recordings import ~/recordings/track1 --out data/track1  # recording -> dataset

Why: behaviour-cloning code written for the simulator (PilotNet notebooks and the like) reads this
format, and the recordings people published with it are free training data for the udacity env.

The format (what "Training Mode" + "Record" writes)::

    IMG/center_2016_12_01_13_30_48_287.jpg   one JPEG per camera per frame, 320x160 RGB,
    IMG/left_2016_12_01_13_30_48_287.jpg     named camera_YYYY_MM_DD_HH_MM_SS_mmm.jpg (local time)
    IMG/right_2016_12_01_13_30_48_287.jpg
    driving_log.csv                          no header; one row per frame:
        center_path, left_path, right_path, steering, throttle, brake, speed

Paths are absolute on the recording machine (often ``C:\\Users\\...\\IMG\\center_....jpg``, with a
space after each comma); steering is in [-1, 1] (negative = left, 1 = 25 degrees of wheel), throttle
and brake in [0, 1], speed in mph. Some published sets start with a header row
``center,left,right,steering,throttle,brake,speed``; the importer accepts it.

Mapping to the dataset arrays (agent.data.dataset) (one episode = one recording session)::

    frames, frames_left, frames_right   the three cameras, stored as JPEG (the recording's own bytes)
    action, expert_action   [T, 1]      the logged steering (the human or expert who drove)
    throttle, brake         [T]         as logged
    speed                   [T]         m/s (mph / 2.23694)
    reward                  [T]         zeros (a recording has no reward)
    privileged              [T, 0]      nothing: a recording has no privileged state
    time                    [T]         seconds since the episode's first frame, from the file names

Stretches where the driver reversed (turning round, backing off a wall) are cut and the session split there
(``reversing_spans``): not lane keeping, and the log's unsigned speed would drive the replay forwards through them.

What a row claims is checked against what the simulator can record, and a recording that cannot be true is refused
in one line naming the CSV line and the rule: a speed below 0 or above ``MAX_SPEED_MPH``, a car that never moves,
throttle or brake outside [0, 1], one image logged with two sets of values or two images with one time, frames of
another size than ``FRAME_SHAPE``, a CSV in UTF-16. What can be repaired safely is, with one warning, counted in
the card: a row that repeats an earlier one is dropped, an image that is missing, empty or broken skips its row.
"""
from __future__ import annotations

import contextlib
import csv
import hashlib
import json
import os
import re
import shutil
import sys
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path, PureWindowsPath
from typing import Callable, Iterator, Sequence

import cv2
import numpy as np

from agent.data.dataset import CARD_NAME, FORMAT, DemoDataset, dataset_env, open_dataset, write_episode
from agent.data.frames import RECOMMENDED_JPEG_QUALITY, JpegFrames, check_jpeg_quality, jpeg_shape
from agent.data.out_folder import check_room
from common.cli import option, run_command
from common.files import StagingFolder, refuse_nonempty, write_json

CSV_NAME = "driving_log.csv"
IMG_DIR = "IMG"
COLUMNS = ("center", "left", "right", "steering", "throttle", "brake", "speed")
CAMERAS = (("center", "frames"), ("left", "frames_left"), ("right", "frames_right"))  # file prefix, array
MPH_PER_MS = 2.23694
STEER_TOLERANCE = 1e-3  # logged steering a hair outside [-1, 1] (float printing) is clipped, not refused
# What the simulator can log: a speed's size (never below 0) up to its top speed, about 30 mph (30.2-30.6 in public
# recordings); a faster row is a broken log, with 10 mph of room for a fork that tunes the car. Throttle and brake are
# pedal positions in [0, 1] (STEER_TOLERANCE of float printing clipped).
MAX_SPEED_MPH = 40.0
FRAME_SHAPE = (160, 320, 3)  # the simulator's cameras, height x width x RGB: what a student's crop and the replay are made for
DEFAULT_FRAME_PERIOD_S = 0.1  # published recordings log about 10 rows per second
EXPORT_START = datetime(2020, 1, 1, 12, 0, 0)  # fake recording date of exported file names
EXPORT_EPISODE_GAP_S = 10.0  # exported episodes are this far apart, far above the importer's 1 s split
LABELS = ("action", "expert_action")
# Beside an exported driving_log.csv: what its replay needs and the format cannot say (the env, its camera and car,
# what the steering column holds, the DART noise it was collected with); the importer keeps it in the card
EXPORT_CARD = "exported_dataset.json"
CONVERT_HINT = "convert other image formats with python -m agent.udacity.recordings import --jpeg-quality Q"
PROGRESS_ROWS = 2000  # recordings this long show a bar while their images are checked (on a terminal)
# Where a driver stopped and reversed (turning round, backing off a wall): cut, the session split there.
STOP_MPH = 1.0  # slower than this the car stands
REVERSE_FROM_MPH, REVERSE_MIN_ROWS, REVERSE_MIN_RISE_MPH = 5.0, 3, 1.0  # the brake held while the speed rises from
# below 5 mph, 3 rows and 1 mph or more: reversing (braking downhill at walking pace gains a fraction of a mph over a
# row or two)
REVERSING_MERGE_S = 10.0  # stops and reversing this close belong to one manoeuvre
REVERSING_MARGIN_S = 5.0  # cut this much before and after it too: a three-point turn starts with a swing at full
# lock before its first stop, and ends pulling away
MIN_PIECE_S = 1.0  # what is left of a session between cuts, if shorter, goes with them
REVERSING_RULE = (f"cut: reversing (the brake held while the speed rises from < {REVERSE_FROM_MPH:g} mph, "
                  f">= {REVERSE_MIN_ROWS} rows, >= {REVERSE_MIN_RISE_MPH:g} mph) with stops (< {STOP_MPH:g} mph) within "
                  f"{REVERSING_MERGE_S:g} s, +- {REVERSING_MARGIN_S:g} s; pieces under {MIN_PIECE_S:g} s")




_STAMP = re.compile(r"^(?:center|left|right)_(\d{4})_(\d{2})_(\d{2})_(\d{2})_(\d{2})_(\d{2})_(\d{3})\.\w+$", re.I)


def parse_stamp(file_name: str) -> datetime | None:
    """The recording time in a simulator file name (``center_2016_12_01_13_30_48_287.jpg``), or None."""
    m = _STAMP.match(file_name)
    if not m:
        return None
    y, mo, d, h, mi, s, ms = (int(g) for g in m.groups())
    try:
        return datetime(y, mo, d, h, mi, s, ms * 1000)
    except ValueError:  # month 13 and the like: not a timestamp after all
        return None


def format_stamp(ms: int) -> str:
    """``YYYY_MM_DD_HH_MM_SS_mmm`` of ``EXPORT_START + ms`` milliseconds."""
    t = EXPORT_START + timedelta(milliseconds=int(ms))
    return f"{t:%Y_%m_%d_%H_%M_%S}_{t.microsecond // 1000:03d}"


def _number(x: float) -> str:
    """Shortest text that reads back as the same float32 (``0.3``, not ``0.30000001192092896``)."""
    return np.format_float_positional(np.float32(x), trim="-")


def _dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def export_udacity(data_dir: str | Path, out_dir: str | Path, *, label: str = "action",
                   jpeg_quality: int = RECOMMENDED_JPEG_QUALITY) -> Path:
    """Write every step of every episode as a simulator recording; returns the path of driving_log.csv.

    The steering column is the executed action by default, as the simulator logs the steering that moved the
    car: the frames show where it went, so a replay of the export follows the same path as the dataset's own
    (DART noise included). ``label="expert_action"`` writes the expert's label instead (what behaviour cloning
    code reading this format should learn; such an export cannot be replayed). Steering is column 0,
    clipped to [-1, 1]; brake is the dataset's ``brake`` array or 0; speed is in mph. ``EXPORT_CARD`` beside the
    CSV names the env, its camera and car, the steering column and the DART noise, for the importer and the
    replay. File names carry ``EXPORT_START`` + the episode's offset + the step's ``time`` (milliseconds,
    bumped by 1 ms where two steps would share a name), episodes ``EXPORT_EPISODE_GAP_S`` apart, so the
    names sort in recording order and the importer splits the episodes back. Frames stored as JPEG are
    copied byte for byte; raw frames are encoded at ``jpeg_quality``. CSV paths are absolute, as the
    simulator writes them.
    """
    if label not in LABELS:
        raise ValueError(f"label must be one of {list(LABELS)}, got {label!r}")
    jpeg_quality = check_jpeg_quality(jpeg_quality)
    ds = open_dataset(data_dir)
    out_dir = Path(out_dir)
    names = [set(ds.array_names(i)) for i in range(len(ds))]
    for i, have in enumerate(names):
        need = [k for _, k in CAMERAS] + [label, "throttle", "speed", "time"]
        missing = [k for k in need if k not in have]
        if missing:
            what = "left/right cameras" if {"frames_left", "frames_right"} & set(missing) else "arrays"
            raise ValueError(f"episode file {str(ds.paths[i])!r} lacks {what} {missing}; a Udacity log needs "
                             f"three cameras (frames, frames_left, frames_right), {label}, throttle, speed and time")
    final = out_dir.resolve() / IMG_DIR
    with StagingFolder(out_dir) as tmp:
        (tmp / IMG_DIR).mkdir()
        start_ms = 0
        with open(tmp / CSV_NAME, "w", newline="") as f:
            writer = csv.writer(f, lineterminator="\n")
            for i in range(len(ds)):
                keys = [label, "throttle", "speed", "time"] + (["brake"] if "brake" in names[i] else [])
                a = ds.load(i, keys=keys)
                steer = np.clip(np.asarray(a[label], dtype=np.float32).reshape(len(a["time"]), -1)[:, 0], -1, 1)
                brake = a.get("brake", np.zeros(len(steer), dtype=np.float32))
                ms = np.round(np.asarray(a["time"], dtype=np.float64) * 1000).astype(np.int64) + start_ms
                for t in range(1, len(ms)):  # names must be unique and increasing
                    ms[t] = max(ms[t], ms[t - 1] + 1)
                stamps = [format_stamp(m) for m in ms]
                paths = {}
                for prefix, key in CAMERAS:
                    jf = ds.jpeg_frames(i, key)
                    if jf is None:  # stored raw: encode once
                        jf = JpegFrames.encode(ds.load(i, keys=[key])[key], jpeg_quality)
                    paths[prefix] = []
                    for t, stamp in enumerate(stamps):
                        name = f"{prefix}_{stamp}.jpg"
                        (tmp / IMG_DIR / name).write_bytes(jf[t])
                        paths[prefix].append(str(final / name))
                for t in range(len(ms)):
                    writer.writerow([paths["center"][t], paths["left"][t], paths["right"][t], _number(steer[t]),
                                     _number(a["throttle"][t]), _number(brake[t]), _number(a["speed"][t] * MPH_PER_MS)])
                if len(ms):
                    start_ms = int(ms[-1]) + int(EXPORT_EPISODE_GAP_S * 1000)
        write_json(tmp / EXPORT_CARD, export_card(ds, label))
    return out_dir / CSV_NAME


def export_card(ds: DemoDataset, label: str) -> dict[str, object]:
    """What an export's replay needs (``EXPORT_CARD``): the env, its camera and car, the steering column, the noise."""
    from envs.replay.spec import collection_noise, geometry_of

    return {"exported_by": f"{PROG} export", "env": dataset_env(ds.card, ds.episodes).name, "steering": label,
            "steering_moved_the_car": label == "action", "dart_noise": collection_noise(ds),
            "geometry": geometry_of(ds).to_dict()}


def read_export_card(csv_path: Path) -> dict | None:
    """The ``EXPORT_CARD`` beside a recording's CSV (an export of this project's), or None (the simulator's own)."""
    path = csv_path.parent / EXPORT_CARD
    if not path.is_file():
        return None
    try:
        card = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{str(path)!r} is not the JSON the exporter writes ({e}); delete it to import the "
                         "recording as the simulator's own") from None
    if not isinstance(card, dict):
        raise ValueError(f"{str(path)!r} is not the JSON object the exporter writes")
    return card


@dataclass
class LogRow:
    """One validated row of driving_log.csv."""

    line: int  # line number in the CSV (1-based), for messages and the episode's row range
    images: tuple[Path, Path | None, Path | None]  # center, left, right, resolved inside IMG/ (sides: None if not logged)
    steering: float
    throttle: float
    brake: float
    speed_mph: float
    stamp: datetime | None  # from the center image's name


def locate_log(log_dir: str | Path) -> tuple[Path, Path]:
    """(driving_log.csv, IMG folder) of a recording folder or of the CSV path itself."""
    path = Path(log_dir)
    if not path.exists():
        raise FileNotFoundError(f"recording {str(path)!r} does not exist")
    csv_path = path / CSV_NAME if path.is_dir() else path
    if not csv_path.is_file():
        raise FileNotFoundError(f"recording folder {str(path)!r} has no {CSV_NAME}; point at the folder the "
                                f"simulator recorded into (it holds {CSV_NAME} and {IMG_DIR}/)")
    img_dir = csv_path.parent / IMG_DIR
    if not img_dir.is_dir():
        raise FileNotFoundError(f"{str(csv_path)!r} has no {IMG_DIR}/ folder beside it ({str(img_dir)!r})")
    return csv_path, img_dir


@dataclass
class Log:
    """The usable rows of a driving_log.csv, and the rows skipped because an image they name is missing or bad."""

    rows: list[LogRow]
    skipped: list[tuple[int, str, str]]  # (CSV line, the image's file name, what is wrong with it)
    repeated: list[tuple[int, int]] = field(default_factory=list)  # (CSV line, the earlier line it repeats): dropped

    @property
    def cameras(self) -> list[tuple[str, str]]:
        """(file prefix, array) of the cameras every row has: all three, or the center one alone (a recording
        of one camera, such as the bridge's --record, or with side images missing in some rows)."""
        return list(CAMERAS) if all(r.images[1] and r.images[2] for r in self.rows) else [CAMERAS[0]]


def read_log(csv_path: Path, img_dir: Path, *, strict_images: bool = False) -> Log:
    """Parse and validate every row; errors name the CSV line. Image paths are resolved by file name
    inside ``img_dir``, whatever folder, drive letter or separator the recording machine wrote. A row whose
    image file is missing (a user deleted bad frames) is skipped and counted, or refused with
    ``strict_images``; empty left/right columns mean a center-only recording."""
    files = {f.name: f for f in img_dir.iterdir()}
    lower = {name.lower(): f for name, f in files.items()}  # logs recorded on Windows ignore case
    log = Log([], [])
    where = csv_path.name
    check_encoding(csv_path)
    with open(csv_path, newline="", encoding="utf-8-sig", errors="surrogateescape") as f:
        reader = csv.reader(f, skipinitialspace=True)
        try:
            for fields in reader:
                n = reader.line_num
                fields = [x.strip() for x in fields]
                if not any(fields):
                    continue  # blank line
                if not log.rows and not log.skipped and [x.lower() for x in fields] == list(COLUMNS):
                    continue  # the header row of some published sets
                if len(fields) != len(COLUMNS):
                    raise ValueError(f"{where} line {n}: expected {len(COLUMNS)} columns ({','.join(COLUMNS)}), got {len(fields)}")
                images, missing = _row_images(fields, where, n, files, lower, img_dir, strict_images)
                values = _row_values(fields, where, n)
                if missing is not None:
                    log.skipped.append((n, missing, "missing"))
                    continue
                steering, throttle, brake, speed = values
                log.rows.append(LogRow(n, images, steering, throttle, brake, speed, parse_stamp(images[0].name)))
        except csv.Error as e:
            raise ValueError(f"{where} line {reader.line_num}: {e}") from None
    if not log.rows:
        what = f"; all {len(log.skipped)} name images missing from {str(img_dir)!r}" if log.skipped else " (an empty recording?)"
        raise ValueError(f"{str(csv_path)!r} holds no usable rows{what}")
    return log


def check_encoding(csv_path: Path) -> None:
    """ValueError (one line) for a CSV in UTF-16 or UTF-32 (a spreadsheet's "Unicode text"): the simulator writes
    UTF-8 (plain ASCII), and read as such the other encodings come out as garbled columns. Bytes that are not UTF-8
    otherwise (a Windows user name in a path) pass: images are found by file name."""
    with open(csv_path, "rb") as f:
        head = f.read(4096)
    boms = ((b"\xff\xfe\x00\x00", "UTF-32"), (b"\x00\x00\xfe\xff", "UTF-32"), (b"\xff\xfe", "UTF-16"),
            (b"\xfe\xff", "UTF-16"))
    found = next((name for bom, name in boms if head.startswith(bom)), "UTF-16 or UTF-32" if b"\x00" in head else None)
    if found:
        raise ValueError(f"{str(csv_path)!r} is encoded in {found}, which the importer does not support; save it as "
                         "UTF-8, as the simulator writes it")


def _row_images(fields: list[str], where: str, n: int, files: dict[str, Path], lower: dict[str, Path],
                img_dir: Path, strict: bool) -> tuple[tuple[Path, Path | None, Path | None], str | None]:
    """The row's image files (left/right None when not logged), and the name of a missing one (None: all found)."""
    images: list[Path | None] = []
    for col, logged in zip(COLUMNS[:3], fields[:3]):
        name = PureWindowsPath(logged).name  # splits on both \ and /
        if not name:
            if col == "center":
                raise ValueError(f"{where} line {n}: the center image path is empty")
            images.append(None)  # a center-only recording
            continue
        found = files.get(name) or lower.get(name.lower())
        if found is None:
            if strict:
                raise FileNotFoundError(f"{where} line {n}: {col} image {name!r} (logged as {logged!r}) "
                                        f"is not in {str(img_dir)!r}")
            return (Path(name), None, None), name
        images.append(found)
    return (images[0], images[1], images[2]), None  # type: ignore[return-value]


def _row_values(fields: list[str], where: str, n: int) -> tuple[float, float, float, float]:
    """steering (clipped to [-1, 1] when a hair outside), throttle, brake, speed in mph; errors name the line."""
    values = []
    for col, text in zip(COLUMNS[3:], fields[3:]):
        try:
            v = float(text)
        except ValueError:
            raise ValueError(f"{where} line {n}: {col} {text!r} is not a number") from None
        if not np.isfinite(v):
            raise ValueError(f"{where} line {n}: {col} {text!r} is not a finite number")
        values.append(v)
    steering, throttle, brake, speed = values
    if abs(steering) > 1 + STEER_TOLERANCE:
        raise ValueError(f"{where} line {n}: steering {steering} is outside [-1, 1]")
    for col, v in (("throttle", throttle), ("brake", brake)):
        if not -STEER_TOLERANCE <= v <= 1 + STEER_TOLERANCE:
            raise ValueError(f"{where} line {n}: {col} {v:g} is outside [0, 1] (a pedal position, as the simulator "
                             "logs it)")
    if speed < 0:
        raise ValueError(f"{where} line {n}: speed {speed:g} mph is below 0; the simulator logs the speed's size, "
                         "never below 0")
    if speed > MAX_SPEED_MPH:
        raise ValueError(f"{where} line {n}: speed {speed:g} mph is beyond what the simulator can reach (its top "
                         f"speed is about 30 mph; rows above {MAX_SPEED_MPH:g} mph are refused)")
    return float(np.clip(steering, -1, 1)), float(np.clip(throttle, 0, 1)), float(np.clip(brake, 0, 1)), speed


def drop_bad_images(log: Log, cameras: list[tuple[str, str]], jpeg: bool, strict: bool, where: str) -> None:
    """Decode every image the import will store: a row with one that cannot be read or decoded (a truncated
    JPEG, which keeps its header, included) moves to ``log.skipped``, or is refused with ``strict``. ``jpeg``: the
    files are stored byte for byte, so each must be a JPEG (other formats are refused, with how to convert them)."""
    from tqdm import tqdm

    from agent.runtime import show_progress

    bar = tqdm(log.rows, desc="checking images", unit="row", leave=False,
               disable=len(log.rows) < PROGRESS_ROWS or not show_progress(True))
    good = []
    for r in bar:
        problem = next((p for c in range(len(cameras)) if (p := _image_problem(r, c, jpeg, where))), None)
        if problem is None:
            good.append(r)
            continue
        name, text = problem
        if strict:
            raise ValueError(f"{where} line {r.line}: image {name!r} {text} (without --strict-images such rows are "
                             "skipped and counted)")
        log.skipped.append((r.line, name, text))
    log.rows = good
    log.skipped.sort()


def _image_problem(row: LogRow, cam: int, jpeg: bool, where: str) -> tuple[str, str] | None:
    """(file name, what is wrong) when camera ``cam``'s image of ``row`` cannot be read or decoded, else None."""
    path = row.images[cam]
    assert path is not None
    try:
        b = path.read_bytes()
    except OSError as e:  # a dangling link, a folder, no permission
        return path.name, f"cannot be read ({e.strerror or e})"
    if not b:  # a write that never happened: a broken frame like a cut-off one, whatever the format asked for
        return path.name, "is empty (0 bytes)"
    if b[:2] == b"\xff\xd8":  # a JPEG, maybe a broken one
        if b"\xff\xd9" not in b[-16:]:  # libjpeg decodes a cut-off file, greying the rest
            return path.name, f"is cut off (a JPEG of {len(b)} bytes without its end marker)"
        try:
            jpeg_shape(b)
        except ValueError as e:
            return path.name, f"is a broken JPEG ({e})"
    elif jpeg:  # another format: the whole recording needs converting, not one row skipped
        try:
            jpeg_shape(b)
        except ValueError as e:
            raise ValueError(f"{where} line {row.line}: image {path.name!r} is {e}; {CONVERT_HINT}") from None
    img = cv2.imdecode(np.frombuffer(b, dtype=np.uint8), cv2.IMREAD_COLOR)
    if img is None:
        return path.name, "cannot be decoded"
    if img.shape[:2] != FRAME_SHAPE[:2]:  # another camera than the simulator's: the whole recording, not one row
        h, w, c = FRAME_SHAPE
        raise ValueError(f"{where} line {row.line}: image {path.name!r} is {img.shape[0]}x{img.shape[1]} (height x "
                         f"width); the simulator records {h}x{w}x{c} frames, the size a student's crop and the replay's "
                         "camera are made for")
    return None


def in_time_order(rows: list[LogRow], where: str, say: Callable[[str], None]) -> list[LogRow]:
    """The rows sorted by the time in their file names when the CSV lists some out of order (logs edited or
    merged by hand), said in one line; as they are otherwise, or when names carry no time. Left unsorted, each
    step back in time would start a new episode."""
    if any(r.stamp is None for r in rows):
        return rows
    back = [k for k in range(1, len(rows)) if rows[k].stamp < rows[k - 1].stamp]  # type: ignore[operator]
    if not back:
        return rows
    first = rows[back[0]]
    say(f"warning: {len(back)} rows of {where} are dated before the row above them (first: line {first.line}, "
        f"{first.images[0].name!r}); importing the rows in the order of the times in their file names")
    return sorted(rows, key=lambda r: r.stamp)  # type: ignore[arg-type, return-value]


def split_sessions(times: np.ndarray, gap_s: float) -> list[tuple[int, int]]:
    """[start, stop) row ranges: a new episode starts where time jumps forward by more than ``gap_s``
    (the simulator appends every recording session to the same log) or goes backwards."""
    d = np.diff(times)
    cuts = (np.flatnonzero((d > gap_s) | (d < 0)) + 1).tolist()
    bounds = [0, *cuts, len(times)]
    return list(zip(bounds[:-1], bounds[1:]))


def reversing_spans(speed_mph: np.ndarray, brake: np.ndarray, times: np.ndarray) -> list[tuple[int, int]]:
    """[start, stop) rows of one session where the driver drove backwards (a turnaround, backing off a wall after a
    crash), with the stops around it and a margin either side: not lane keeping, and a steering label means the
    opposite turn in reverse. The log's speed has no sign; reversing shows as the brake held while the speed rises
    from near standstill (a car braking forward slows down). Stops alone (a hairpin at walking pace) are kept."""
    speed_mph, times = np.asarray(speed_mph, float), np.asarray(times, float)
    stopped = speed_mph < STOP_MPH
    rising = (np.asarray(brake) > 0.5) & np.r_[False, np.diff(speed_mph) > 0.05]
    reversing = np.zeros(len(speed_mph), bool)
    edges = np.flatnonzero(np.diff(np.r_[0, rising.astype(int), 0]))
    for i, j in zip(edges[0::2], edges[1::2]):  # runs [i, j) of rising speed under the brake
        from_mph = speed_mph[i - 1]  # i >= 1: the first row never rises
        reversing[i:j] = (j - i >= REVERSE_MIN_ROWS and from_mph < REVERSE_FROM_MPH
                          and speed_mph[j - 1] - from_mph >= REVERSE_MIN_RISE_MPH)
    events = np.flatnonzero(stopped | reversing)
    spans: list[tuple[int, int]] = []
    groups = np.split(events, np.flatnonzero(np.diff(times[events]) > REVERSING_MERGE_S) + 1) if len(events) else []
    for g in groups:
        if not reversing[g].any():
            continue
        a = int(np.searchsorted(times, times[g[0]] - REVERSING_MARGIN_S - 1e-6))  # 1e-6: times printed in ms
        b = int(np.searchsorted(times, times[g[-1]] + REVERSING_MARGIN_S + 1e-6, side="right"))
        if spans and a <= spans[-1][1]:
            a = spans.pop()[0]
        spans.append((a, b))
    return spans


def _cut_reversing(rows: list[LogRow], times: np.ndarray, sessions: list[tuple[int, int]], csv_path: Path,
                   say: Callable[[str], None]) -> tuple[list[tuple[int, int]], list[dict[str, object]]]:
    """The sessions less every ``reversing_spans`` stretch (and the pieces under ``MIN_PIECE_S`` between them),
    and what was cut, by CSV line, said in one line."""
    kept, cut = [], []
    for a, b in sessions:
        speed = np.array([r.speed_mph for r in rows[a:b]])
        brake = np.array([r.brake for r in rows[a:b]])
        spans = [(a + x, a + y) for x, y in reversing_spans(speed, brake, times[a:b])]
        bounds = [a, *[k for span in spans for k in span], b]
        for x, y in zip(bounds[0::2], bounds[1::2]):
            if y > x and (not spans or times[y - 1] - times[x] >= MIN_PIECE_S):
                kept.append((x, y))
            elif y > x:
                spans.append((x, y))
        cut += [{"csv_lines": [rows[x].line, rows[y - 1].line], "frames": y - x,
                 "seconds": round(float(times[y - 1] - times[x]), 2)} for x, y in sorted(spans)]
    if not kept:
        raise ValueError(f"{csv_path} holds nothing but stops and reversing: nothing to import "
                         "(--keep-reversing imports it as it is)")
    if cut:
        say(f"cut {len(cut)} stretch(es) of {csv_path.name} where the car stopped and reversed "
            f"({sum(c['frames'] for c in cut)} frames, {sum(c['seconds'] for c in cut):.0f} s; first: lines "
            f"{cut[0]['csv_lines'][0]}-{cut[0]['csv_lines'][1]}): not lane keeping (--keep-reversing keeps them)")
    return kept, cut


def _read_images(rows: list[LogRow], cam: int, where: str, frame_shape: list, quality: int | None) -> JpegFrames:
    """One camera of an episode: the files' own bytes (quality None) or decoded and re-encoded."""
    data = []
    for r in rows:
        path = r.images[cam]
        b = path.read_bytes()
        if quality is None:
            try:
                shape = jpeg_shape(b)
            except ValueError as e:
                raise ValueError(f"{where} line {r.line}: image {path.name!r} is {e}; {CONVERT_HINT}") from None
        else:
            img = cv2.imdecode(np.frombuffer(b, dtype=np.uint8), cv2.IMREAD_COLOR)
            if img is None:
                raise ValueError(f"{where} line {r.line}: image {path.name!r} cannot be decoded")
            b = img[..., ::-1]  # BGR -> RGB
            shape = b.shape
        if shape[2] != 3:
            raise ValueError(f"{where} line {r.line}: image {path.name!r} has {shape[2]} channel(s), expected RGB (3)")
        if not frame_shape:
            frame_shape.extend(shape)
        if list(shape) != frame_shape:
            raise ValueError(f"{where} line {r.line}: image {path.name!r} is {shape[0]}x{shape[1]}x{shape[2]} "
                             f"(height x width x channels), expected {frame_shape[0]}x{frame_shape[1]}x3 like the first image")
        data.append(b)
    if quality is None:
        return JpegFrames.from_bytes(data, frame_shape)
    return JpegFrames.encode(np.stack(data) if data else np.zeros((0, *frame_shape), np.uint8), quality)


def _session_arrays(part: list[LogRow], times: np.ndarray, where: str, frame_shape: list,
                    jpeg_quality: int | None, cameras: list[tuple[str, str]]) -> dict[str, object]:
    """One recording session as a dataset episode's arrays: the cameras, the logged steering as both the
    executed action and the label, speed in m/s, throttle and brake, time from the session's start."""
    T = len(part)
    steer = np.array([r.steering for r in part], dtype=np.float32)[:, None]
    arrays: dict[str, object] = {key: _read_images(part, c, where, frame_shape, jpeg_quality)
                                 for c, (_, key) in enumerate(cameras)}
    arrays.update(
        action=steer,
        expert_action=steer.copy(),
        reward=np.zeros(T, dtype=np.float32),
        speed=(np.array([r.speed_mph for r in part]) / MPH_PER_MS).astype(np.float32),
        throttle=np.array([r.throttle for r in part], dtype=np.float32),
        brake=np.array([r.brake for r in part], dtype=np.float32),
        privileged=np.zeros((T, 0), dtype=np.float32),
        time=np.asarray(times, dtype=np.float64),
    )
    return arrays


def import_udacity(log_dir: str | Path, out_dir: str | Path, *, jpeg_quality: int | None = None,
                   episode_gap_s: float = 1.0, frame_period: float | None = None, strict_images: bool = False,
                   keep_reversing: bool = False, warn: Callable[[str], None] | None = None,
                   source: dict | None = None) -> Path:
    """Turn a simulator recording into a dataset (agent.data.dataset) in ``out_dir`` (new or empty); returns it.

    ``log_dir`` is the recording folder or its CSV. ``jpeg_quality`` None (default) stores the
    recording's JPEG files byte for byte (no second lossy encode); a number decodes and re-encodes them
    (smaller, or to accept non-JPEG images). ``time`` comes from the timestamps in the file names; when
    a name has none, every row gets ``row index * frame_period`` (default ``DEFAULT_FRAME_PERIOD_S`` =
    0.1 s) and the log is one episode. With timestamps, consecutive rows more than ``episode_gap_s``
    apart (or going back in time) start a new episode. Rows whose images are missing are skipped, counted
    in the card and reported once through ``warn`` (default: stderr), or refused with ``strict_images``.
    Stretches where the driver stopped and reversed are cut and their session split there (``reversing_spans``;
    listed in the card), unless ``keep_reversing``. The whole CSV is validated before anything is written (what
    each row claims against what the simulator can record: the module docstring); a failed import leaves no
    ``out_dir`` behind.
    The card records ``recording_fingerprint`` (or ``source``, taken by the caller) under import.source.
    """
    if jpeg_quality is not None:
        jpeg_quality = check_jpeg_quality(jpeg_quality)
    if not episode_gap_s > 0:
        raise ValueError(f"episode_gap_s must be > 0, got {episode_gap_s}")
    if frame_period is not None and not frame_period > 0:
        raise ValueError(f"frame_period must be > 0, got {frame_period}")
    period = DEFAULT_FRAME_PERIOD_S if frame_period is None else float(frame_period)
    csv_path, img_dir = locate_log(log_dir)
    source = source or recording_fingerprint(log_dir)
    out_dir = Path(out_dir)
    refuse_nonempty(out_dir)
    check_room(out_dir, int(source.get("images_bytes", 0)), "the import of " + str(csv_path.parent))
    say = warn or (lambda m: print(m, file=sys.stderr))
    log, rows, cameras = _usable_rows(csv_path, img_dir, jpeg_quality, strict_images, say)
    exported = read_export_card(csv_path)  # an export of this project's: what its replay needs
    times, sessions, time_from = _row_times(rows, period, episode_gap_s)
    undated = next((r for r in rows if r.stamp is None), None)
    if undated is not None:
        say(f"warning: the image names of {csv_path} carry no time (line {undated.line}: {undated.images[0].name!r}): "
            f"its rows are taken {period:g} s apart, as one episode ({PROG} import --frame-period S sets the "
            "seconds per row)")
    sessions, cut = (sessions, []) if keep_reversing else _cut_reversing(rows, times, sessions, csv_path, say)
    singles = [a for a, b in sessions if b - a == 1]
    if singles:
        say(f"warning: {len(singles)} of the {len(sessions)} sessions of {csv_path.name} are a single frame, more than "
            f"{episode_gap_s:g} s from the rows around it (first: line {rows[singles[0]].line}); each is an episode")
    frame_shape: list[int] = []
    episodes = []
    with StagingFolder(out_dir) as tmp:
        for e, (a, b) in enumerate(sessions):
            part = rows[a:b]
            arrays = _session_arrays(part, times[a:b] - times[a], csv_path.name, frame_shape, jpeg_quality, cameras)
            meta = {
                "env": "udacity", "source": "udacity-recording", "action_space": "continuous",
                "csv": str(csv_path.resolve()), "csv_lines": [part[0].line, part[-1].line],
                "start_time": part[0].stamp.isoformat(timespec="milliseconds") if part[0].stamp else None,
                "track_seed": None, "theme": None, "return": 0.0, "terminated": False, "truncated": False,
            }
            write_episode(tmp, e, arrays, meta)
            episodes.append({"episode_id": e, "length": len(part), "csv_lines": meta["csv_lines"],
                             "start_time": meta["start_time"], "duration_s": float(times[b - 1] - times[a])})
        steps = sum(b - a for a, b in sessions)
        diffs = np.concatenate([np.diff(times[a:b]) for a, b in sessions])
        dt = round(float(np.median(diffs)), 6) if len(diffs) else period  # seconds per row, as the collector's card
        write_json(tmp / CARD_NAME, {
            "format": FORMAT,
            "env": "udacity",
            "source": "udacity-recording",
            "action_space": "continuous",
            "action_names": ["steer"],
            "frame_shape": frame_shape,
            "cameras": {k: p for p, k in cameras},
            "frame_codec": f"jpeg{jpeg_quality}" if jpeg_quality else "jpeg (the recording's files, byte for byte)",
            "dt": dt,
            "counts": {"episodes": len(episodes), "steps": steps, "hours_of_driving": steps * dt / 3600},
            "import": {"csv": str(csv_path.resolve()), "images": str(img_dir.resolve()), "source": source,
                       "time_from": time_from,
                       "episode_gap_s": episode_gap_s, "jpeg_quality": jpeg_quality,
                       "reversing": {"rule": "kept" if keep_reversing else REVERSING_RULE, "cut": cut},
                       "speed": "logged in mph, stored in m/s (mph / 2.23694)",
                       "skipped_rows": len(log.skipped),
                       "repeated_rows_dropped": len(log.repeated),
                       "skipped_examples": [{"line": n, "image": name, "problem": problem}
                                            for n, name, problem in log.skipped[:5]],
                       **({"exported": exported} if exported else {})},
            "episodes": episodes,
        })
    return out_dir


def _usable_rows(csv_path: Path, img_dir: Path, jpeg_quality: int | None, strict_images: bool,
                 say: Callable[[str], None]) -> tuple[Log, list[LogRow], list[tuple[str, str]]]:
    """The log, its rows whose images exist and decode, in time order (one warning for each repair), and the
    cameras every logged row has."""
    log = read_log(csv_path, img_dir, strict_images=strict_images)
    drop_repeated_rows(log, csv_path.name)
    if log.repeated:
        line, earlier = log.repeated[0]
        say(f"warning: dropped {len(log.repeated)} rows of {csv_path} that repeat an earlier row (the same center "
            f"image and values; first: line {line}, as line {earlier}): a frame counts once")
    cameras = log.cameras
    drop_bad_images(log, cameras, jpeg_quality is None, strict_images, csv_path.name)
    if log.skipped:
        line, name, problem = log.skipped[0]
        say(f"warning: skipped {len(log.skipped)} of {len(log.rows) + len(log.skipped)} rows of {csv_path} whose images "
            f"are missing from {img_dir} or cannot be decoded (first: line {line}, {name!r}, {problem}); "
            "--strict-images refuses such a recording")
    if not log.rows:
        raise ValueError(f"{str(csv_path)!r} holds no usable rows: every row names a missing or broken image")
    rows = in_time_order(log.rows, csv_path.name, say)
    check_distinct_times(rows, csv_path.name)
    if all(r.speed_mph < STOP_MPH for r in rows):
        raise ValueError(f"{str(csv_path)!r}: the car never moves (under {STOP_MPH:g} mph in all {len(rows)} rows); "
                         "nothing to learn or replay lane keeping from")
    return log, rows, cameras


def drop_repeated_rows(log: Log, where: str) -> None:
    """Move the rows that repeat an earlier row (the same center image, the same values: a log written twice, or
    joined with itself) to ``log.repeated``: each frame counts once, and no two steps are 0 s apart. Two rows naming
    one image with other values: ValueError, as which of them is right cannot be told."""
    first: dict[Path, LogRow] = {}
    kept = []
    for r in log.rows:
        seen = first.setdefault(r.images[0], r)
        if seen is r:
            kept.append(r)
        elif (seen.steering, seen.throttle, seen.brake, seen.speed_mph) == (r.steering, r.throttle, r.brake, r.speed_mph):
            log.repeated.append((r.line, seen.line))
        else:
            raise ValueError(f"{where} lines {seen.line} and {r.line} name the same center image {r.images[0].name!r} "
                             "with other steering, throttle, brake or speed: a recording logs each frame once, and "
                             "which row is right cannot be told")
    log.rows = kept


def check_distinct_times(rows: list[LogRow], where: str) -> None:
    """ValueError naming both lines when two rows (in time order) are dated to the same millisecond: two frames
    are never recorded at once, and a step of 0 s would reach a time-aware core as a frame without time."""
    for a, b in zip(rows, rows[1:]):
        if a.stamp is not None and a.stamp == b.stamp:
            raise ValueError(f"{where} lines {a.line} and {b.line} are both dated {a.stamp:%Y-%m-%d %H:%M:%S}."
                             f"{a.stamp.microsecond // 1000:03d} ({a.images[0].name!r}, {b.images[0].name!r}): two "
                             "frames are never recorded at the same time")


def recording_fingerprint(log_dir: str | Path) -> dict[str, object]:
    """What an import was made from: the CSV's path, size and modification time, and a hash over the name, size and
    modification time of every file in IMG/. A later run compares it to tell a changed or another recording from
    the one it imported (stat only: cheap for tens of thousands of images)."""
    csv_path, img_dir = locate_log(log_dir)
    digest = hashlib.sha256()
    total = 0
    with os.scandir(img_dir) as entries:
        for name, st in sorted((e.name, _stat(e.path)) for e in entries):
            digest.update(f"{name}\0{st[0]}\0{st[1]}\n".encode(errors="surrogateescape"))
            total += st[0]
    size, mtime = _stat(csv_path)
    exported = csv_path.parent / EXPORT_CARD
    return {"csv": str(csv_path.resolve()), "csv_size": size, "csv_mtime_ns": mtime,
            "images": str(img_dir.resolve()), "images_sha256": digest.hexdigest(), "images_bytes": total,
            **({"export_card": list(_stat(exported))} if exported.is_file() else {})}


def _stat(path: str | Path) -> tuple[int, int]:
    try:
        st = os.stat(path)
    except OSError:  # a dangling symlink: its own stat
        st = os.lstat(path)
    return st.st_size, st.st_mtime_ns


def recording_folder(path: str | Path) -> str:
    """``path``, or the folder of the driving_log.csv it names: a recording is its folder, however it is given."""
    p = Path(path)
    return str(p.parent) if p.name.lower() == CSV_NAME and p.is_file() else str(path)


def is_raw_recording(path: str | Path) -> bool:
    """A simulator recording as the simulator wrote it (driving_log.csv, no dataset card): data to import. The
    folder, or its driving_log.csv."""
    folder = Path(recording_folder(path))
    return (folder / CSV_NAME).is_file() and not (folder / CARD_NAME).is_file()


def imported_from(path: str | Path) -> str:
    """The recording a data folder stands for, resolved: a raw recording's own folder, the recording an import was
    made from (its card's import.csv), else the folder itself."""
    folder = Path(recording_folder(path))
    try:
        source = (json.loads((folder / CARD_NAME).read_text()).get("import") or {}).get("csv")
    except (OSError, ValueError, AttributeError):
        source = None
    return str(Path(source).parent.resolve() if source else folder.resolve())


def once_each(paths: Sequence[str | Path], say: Callable[[str], None]) -> list[str]:
    """``paths`` (recordings as their folders) with each recording or dataset once, in order, and one line naming
    what was given twice: the same frames twice would train twice as often, and sit on both sides of a split."""
    seen: dict[Path, str] = {}
    out = []
    for path in paths:
        folder = recording_folder(path)
        key = Path(folder).resolve()
        if key in seen:
            say(f"{path} names the same data as {seen[key]}, given before it: taken once")
            continue
        seen[key] = str(path)
        out.append(folder)
    return out


def import_recordings(paths: Sequence[str | Path], targets: Sequence[Path], *, strict_images: bool = False,
                      warn: Callable[[str], None] | None = None, made: list[Path] | None = None) -> list[str]:
    """Each path as a dataset folder: a raw simulator recording (driving_log.csv + IMG/, no dataset card; or its
    CSV) is imported into its target and the target stands in for it; datasets pass through as they are. A target
    is reused only while it holds an import of this very recording, unchanged (``recording_fingerprint``); an
    import of another or a changed recording is replaced, with one line saying so. ``made`` collects the targets
    imported now (``removed_if_refused``)."""
    say = warn or print
    out = []
    for path, target in zip(paths, targets):
        path = recording_folder(path)
        if is_raw_recording(path):
            source = recording_fingerprint(path)
            if (target / CARD_NAME).is_file():
                done = (json.loads((target / CARD_NAME).read_text()).get("import") or {})
                if done.get("source") == source and (done.get("reversing") or {}).get("rule") == REVERSING_RULE:
                    out.append(str(target))
                    continue
                if "csv" not in done:
                    raise ValueError(f"{str(target)!r} holds a dataset that is not an import of a recording; "
                                     f"move it away to import {str(path)!r} there")
                what = ("is another recording than" if done["csv"] != source["csv"] else "has changed since"
                        if done.get("source") != source else "is cut by another rule (stops and reversing) than")
                say(f"{path} {what} the import in {target} (of {done['csv']}): importing it again")
                shutil.rmtree(target)
            else:
                say(f"{path} is a Udacity simulator recording: importing it into {target}")
            import_udacity(path, target, strict_images=strict_images, warn=warn, source=source)
            if made is not None:
                made.append(Path(target))
            out.append(str(target))
        else:
            out.append(str(path))
    return out


@contextlib.contextmanager
def removed_if_refused(made: list[Path]) -> Iterator[None]:
    """The imports in ``made`` are removed when the block is refused (ValueError, FileNotFoundError): a command
    refused after importing leaves no import behind. Callers empty ``made`` once their run has begun with them
    (from then on they are the run's data), and imports reused from an earlier run are never in it."""
    try:
        yield
    except (ValueError, FileNotFoundError):
        for target in made:
            shutil.rmtree(target, ignore_errors=True)
            if target.parent.name == "imported_data":
                with contextlib.suppress(OSError):
                    target.parent.rmdir()  # only while empty
        made.clear()
        raise


def _row_times(rows: list[LogRow], period: float, episode_gap_s: float
               ) -> tuple[np.ndarray, list[tuple[int, int]], str]:
    """Seconds of every row from the first, the sessions ([start, stop) rows), and where the times came from."""
    undated = next((r for r in rows if r.stamp is None), None)
    if undated is None:
        t0 = rows[0].stamp
        times = np.array([(r.stamp - t0).total_seconds() for r in rows])  # type: ignore[operator]
        return times, split_sessions(times, episode_gap_s), "timestamps in the image file names"
    return (np.arange(len(rows)) * period, [(0, len(rows))],
            f"row index x {period} s (line {undated.line}: {undated.images[0].name!r} has no timestamp); one episode")


PROG = "python -m agent.udacity.recordings"


@dataclass
class ExportArgs:
    data_dir: Path = option(help="the dataset folder (collect.py --out)", group="input", metavar="DATA",
                            positional=True)
    out_dir: Path = option(help="where IMG/ and driving_log.csv go (new or empty)", group="output", flag="--out",
                           metavar="OUT", required=True)
    label: str = option("action", "steering column: the executed action, what moved the car, as the simulator logs "
                        "it (default; the export replays as the dataset does), or the expert's label (what behaviour "
                        "cloning should learn; such an export cannot be replayed)", group="data", choices=LABELS)
    jpeg_quality: int = option(RECOMMENDED_JPEG_QUALITY, "quality for frames stored raw; JPEG frames are copied",
                               group="output", metavar="Q")


@dataclass
class ImportArgs:
    log_dir: Path = option(help="recording folder (or its driving_log.csv)", group="input", metavar="REC",
                           positional=True)
    out_dir: Path = option(help="dataset folder to create (new or empty)", group="output", flag="--out",
                           metavar="OUT", required=True)
    jpeg_quality: int | None = option(None, "re-encode the images at this quality (default: keep the recording's "
                                      "JPEG files byte for byte)", group="output", metavar="Q")
    episode_gap_s: float = option(1.0, "seconds between rows that start a new episode", group="data",
                                  flag="--episode-gap", metavar="S")
    frame_period: float | None = option(None, "seconds per row when file names carry no timestamp (default: "
                                        f"{DEFAULT_FRAME_PERIOD_S})", group="data", metavar="S")
    strict_images: bool = option(False, "refuse a recording in which a row names a missing image (default: skip "
                                 "such rows, say how many)", group="input")
    keep_reversing: bool = option(False, "keep the stretches where the car stopped and reversed (default: cut them, "
                                  "and split the session there: turning round or backing off a wall is not lane "
                                  "keeping)", group="data")


COMMANDS = {
    "export": (ExportArgs, "Write a dataset with three cameras (frames, frames_left, frames_right) as IMG/ +\n"
                           f"{CSV_NAME}, one row per step of every episode: the steering that moved the car, speed\n"
                           f"in mph, stored JPEG frames copied byte for byte; {EXPORT_CARD} beside it says\n"
                           "what its replay needs (the env's camera and car, the DART noise)."),
    "import": (ImportArgs, "Read a simulator recording (a folder with driving_log.csv and IMG/, or the CSV itself)\n"
                           "into a dataset: images are found by file name in IMG/ whatever path the CSV names; time\n"
                           "comes from the timestamps in the names; a jump of more than --episode-gap seconds starts\n"
                           "a new episode; stretches where the car reversed are cut (--keep-reversing keeps them)."),
}


def _export(args: ExportArgs) -> None:
    csv_path = export_udacity(args.data_dir, args.out_dir, label=args.label, jpeg_quality=args.jpeg_quality)
    ds = open_dataset(args.data_dir)
    images = sum(1 for _ in (args.out_dir / IMG_DIR).iterdir())
    print(f"exported {len(ds)} episodes, {ds.num_steps} steps ({images} images, "
          f"{_dir_size(args.out_dir) / 1e6:.1f} MB) to {csv_path}")


def _import(args: ImportArgs) -> None:
    out = import_udacity(args.log_dir, args.out_dir, jpeg_quality=args.jpeg_quality, episode_gap_s=args.episode_gap_s,
                         frame_period=args.frame_period, strict_images=args.strict_images,
                         keep_reversing=args.keep_reversing)
    ds = open_dataset(out)
    cams = ", ".join(ds.card["cameras"]) if isinstance(ds.card.get("cameras"), dict) else ""
    print(f"imported {len(ds)} episodes, {ds.num_steps} steps ({cams}; {_dir_size(out) / 1e6:.1f} MB) into {out}")


def main(argv: Sequence[str] | None = None) -> int:
    # a mistake, a full disk or Ctrl-C: the staging folder is already removed, nothing half-written stays
    return run_command(COMMANDS, lambda args: _export(args) if isinstance(args, ExportArgs) else _import(args), argv,
                       prog=PROG, doc=__doc__, mistakes=(ValueError, OSError))


if __name__ == "__main__":
    raise SystemExit(main())
