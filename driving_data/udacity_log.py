"""The Udacity self-driving-car simulator's recording format, read and checked row by row: which rows of a
recording a dataset can be made of (driving_data.udacity_import makes it).

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

What a row claims is checked against what the simulator can record, and a recording that cannot be true is refused
in one line naming the CSV line and the rule: a speed below 0 or above ``MAX_SPEED_MPH``, a car that never moves,
throttle or brake outside [0, 1], one image logged with two sets of values or two images with one time, frames of
another size than ``FRAME_SHAPE``, a CSV in UTF-16. What can be repaired safely is, with one warning, counted in
the card: a row that repeats an earlier one is dropped, a center image that is missing, empty or broken skips its
row, and a side image (left or right) that is missing leaves its row with its center frame, the whole recording
then imported center-only (a dataset's episode holds a camera for all its frames or not at all; training on real
recordings reads the center camera alone unless asked for --side-correction).
"""
from __future__ import annotations

import csv
import json
import os
import re
import sys
import tempfile
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path, PureWindowsPath
from typing import Callable

import cv2
import numpy as np
from tqdm import tqdm

from driving_data.frames import jpeg_shape

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
# the simulator's cameras, height x width x RGB: what a student's crop and the replay are made for
FRAME_SHAPE = (160, 320, 3)
# Beside an exported driving_log.csv: what its replay needs and the format cannot say (the env, its camera and car,
# what the steering column holds, the DART noise it was collected with); the importer keeps it in the card
EXPORT_CARD = "exported_dataset.json"
IMPORT_COMMAND = "python -m agent.udacity.recordings import"  # the command line that imports a recording
CONVERT_HINT = f"convert other image formats with {IMPORT_COMMAND} --jpeg-quality Q"
PROGRESS_ROWS = 2000  # recordings this long show a bar while their images are checked (on a terminal)
# How libjpeg's warnings of damaged image data begin (other warnings, an unknown JFIF version say, are harmless)
LIBJPEG_CORRUPT = ("Corrupt JPEG data", "Premature end of JPEG file")
STOP_MPH = 1.0  # slower than this the car stands (a recording that never moves faster is refused)


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
    images: tuple[Path, Path | None, Path | None]  # center, left, right, resolved inside IMG/ (sides: None if not
    # logged or missing)
    steering: float
    throttle: float
    brake: float
    speed_mph: float
    stamp: datetime | None  # from the center image's name
    missing_sides: tuple[tuple[str, str], ...] = ()  # (column, file name) of each side image it logs that is not in
    # IMG/: the row is kept, center-only


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
    undated: list[tuple[int, str]] = field(default_factory=list)  # (CSV line, center image): no time in a dated log

    @property
    def cameras(self) -> list[tuple[str, str]]:
        """(file prefix, array) of the cameras every row has: all three, or the center one alone (a recording
        of one camera, such as the bridge's --record, or with side images not logged or missing in some rows)."""
        return list(CAMERAS) if all(r.images[1] and r.images[2] for r in self.rows) else [CAMERAS[0]]

    @property
    def missing_sides(self) -> list[LogRow]:
        """The rows that log a side image whose file is missing: kept, with their center frame."""
        return [r for r in self.rows if r.missing_sides]


def read_log(csv_path: Path, img_dir: Path, *, strict_images: bool = False) -> Log:
    """Parse and validate every row; errors name the CSV line. Image paths are resolved by file name
    inside ``img_dir``, whatever folder, drive letter or separator the recording machine wrote. A row whose
    center image file is missing (a user deleted bad frames) is skipped and counted, one whose side image is
    missing is kept without it (``LogRow.missing_sides``), both refused with ``strict_images``; empty left/right
    columns mean a center-only recording."""
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
                if not log.rows and not log.skipped and is_header(fields):
                    continue  # the header row of some published sets
                if len(fields) != len(COLUMNS):
                    raise ValueError(f"{where} line {n}: expected {len(COLUMNS)} columns "
                                     f"({','.join(COLUMNS)}), got {len(fields)}")
                images, missing, sides = _row_images(fields, where, n, files, lower, img_dir, strict_images)
                values = _row_values(fields, where, n)
                if missing is not None:
                    log.skipped.append((n, missing, "missing"))
                    continue
                steering, throttle, brake, speed = values
                log.rows.append(LogRow(n, images, steering, throttle, brake, speed, parse_stamp(images[0].name),
                                       sides))
        except csv.Error as e:
            raise ValueError(f"{where} line {reader.line_num}: {e}") from None
    if not log.rows:
        what = (f"; all {len(log.skipped)} name images missing from {str(img_dir)!r}" if log.skipped
                else " (an empty recording?)")
        raise ValueError(f"{str(csv_path)!r} holds no usable rows{what}")
    return log


def is_header(fields: list[str]) -> bool:
    """The header row some published logs start with (center,left,right,steering,...)."""
    return [x.strip().lower() for x in fields] == list(COLUMNS)


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
                img_dir: Path, strict: bool
                ) -> tuple[tuple[Path, Path | None, Path | None], str | None, tuple[tuple[str, str], ...]]:
    """The row's image files (left/right None when not logged or missing), the name of its center image when that
    is missing (None: found), and (column, name) of each side image it logs that is missing."""
    images: list[Path | None] = []
    sides: list[tuple[str, str]] = []
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
            if col == "center":
                return (Path(name), None, None), name, ()
            sides.append((col, name))  # the row keeps its center frame
        images.append(found)
    return (images[0], images[1], images[2]), None, tuple(sides)  # type: ignore[return-value]


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
    bar = tqdm(log.rows, desc="checking images", unit="row", leave=False,
               disable=True if len(log.rows) < PROGRESS_ROWS else None)  # None: drawn on a terminal only
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


def decode_noting_warnings(data: bytes) -> tuple[np.ndarray | None, str]:
    """cv2.imdecode of ``data`` (BGR, or None) and the first warning of corrupt data libjpeg wrote while decoding
    it ('' if none).

    libjpeg decodes a JPEG whose image data is scrambled behind intact markers, warning on stderr ("Corrupt JPEG
    data: premature end of data segment") without saying which file, and OpenCV returns a full-size image: the
    warning is the only sign. It is read by pointing file descriptor 2 at a temporary file for the decode. Damage
    that libjpeg does not notice (a few bytes changed inside the data) cannot be told from a real frame."""
    with tempfile.TemporaryFile() as caught:
        sys.stderr.flush()
        saved = os.dup(2)
        try:
            os.dup2(caught.fileno(), 2)
            img = cv2.imdecode(np.frombuffer(data, dtype=np.uint8), cv2.IMREAD_COLOR)
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        caught.seek(0)
        said = caught.read(4096).decode(errors="replace")
    corrupt = [line.strip() for line in said.splitlines() if line.startswith(LIBJPEG_CORRUPT)]
    return img, corrupt[0] if corrupt else ""


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
    img, warned = decode_noting_warnings(b)
    if img is None:  # no image in any format OpenCV reads (NUL or random bytes): a broken frame, its row skipped
        return path.name, "cannot be decoded" + ("" if b[:2] == b"\xff\xd8" else " (no image in any format)")
    if b[:2] != b"\xff\xd8" and jpeg:  # another format: the whole recording needs converting, not one row skipped
        raise ValueError(f"{where} line {row.line}: image {path.name!r} is not a JPEG (it does not start with the "
                         f"JPEG start-of-image marker FF D8); {CONVERT_HINT}")
    if warned and b[:2] == b"\xff\xd8":  # scrambled data behind intact markers: decoded, greyed or smeared
        return path.name, f"is a corrupt JPEG (libjpeg: {warned})"
    if img.shape[:2] != FRAME_SHAPE[:2]:  # another camera than the simulator's: the whole recording, not one row
        h, w, c = FRAME_SHAPE
        raise ValueError(f"{where} line {row.line}: image {path.name!r} is {img.shape[0]}x{img.shape[1]} (height x "
                         f"width); the simulator records {h}x{w}x{c} frames, the size a "
                         "student's crop and the replay's "
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


def usable_rows(csv_path: Path, img_dir: Path, jpeg_quality: int | None, strict_images: bool,
                say: Callable[[str], None]) -> tuple[Log, list[LogRow], list[tuple[str, str]]]:
    """The log, its rows whose images exist and decode, in time order (one warning for each repair), and the
    cameras every logged row has."""
    log = read_log(csv_path, img_dir, strict_images=strict_images)
    drop_repeated_rows(log, csv_path.name)
    if log.repeated:
        line, earlier = log.repeated[0]
        say(f"warning: dropped {len(log.repeated)} rows of {csv_path} that repeat an earlier row (the same center "
            f"image and values; first: line {line}, as line {earlier}): a frame counts once")
    drop_undated_rows(log)
    if log.undated:
        line, name = log.undated[0]
        say(f"warning: {len(log.undated)} of the {len(log.rows) + len(log.undated)} image names of {csv_path} carry "
            f"no time (first: line {line}, {name!r}): their rows are dropped, the other {len(log.rows)} keep the "
            "times in their names")
    cameras = log.cameras
    if log.missing_sides:
        first = log.missing_sides[0]
        say(f"warning: {len(log.missing_sides)} of {len(log.rows)} rows of {csv_path} name side images missing from "
            f"{img_dir} (first: line {first.line}, {first.missing_sides[0][1]!r}): every row "
            "keeps its center frame and "
            "the recording is imported center-only (no left/right views for --side-correction); --strict-images "
            "refuses such a recording")
    drop_bad_images(log, cameras, jpeg_quality is None, strict_images, csv_path.name)
    if log.skipped:
        line, name, problem = log.skipped[0]
        say(f"warning: skipped {len(log.skipped)} of {len(log.rows) + len(log.skipped)} rows of "
            f"{csv_path} whose images "
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
        elif (seen.steering, seen.throttle, seen.brake, seen.speed_mph) == (r.steering, r.throttle, r.brake,
                                                                            r.speed_mph):
            log.repeated.append((r.line, seen.line))
        else:
            raise ValueError(f"{where} lines {seen.line} and {r.line} name the same center image {r.images[0].name!r} "
                             "with other steering, throttle, brake or speed: a recording logs each frame once, and "
                             "which row is right cannot be told")
    log.rows = kept


def drop_undated_rows(log: Log) -> None:
    """Move the rows whose center image name carries no time to ``log.undated`` when most names carry one (a file
    renamed by hand in a real recording): the others keep their times. Re-timing every row at a fixed period
    instead would stretch or squeeze the whole recording. When most carry none, the rows stay (and the import
    times them by their index)."""
    undated = [r for r in log.rows if r.stamp is None]
    if not undated or 2 * len(undated) >= len(log.rows):
        return
    log.undated = [(r.line, r.images[0].name) for r in undated]
    log.rows = [r for r in log.rows if r.stamp is not None]


def check_distinct_times(rows: list[LogRow], where: str) -> None:
    """ValueError naming both lines when two rows (in time order) are dated to the same millisecond: two frames
    are never recorded at once, and a step of 0 s would reach a time-aware core as a frame without time."""
    for a, b in zip(rows, rows[1:]):
        if a.stamp is not None and a.stamp == b.stamp:
            raise ValueError(f"{where} lines {a.line} and {b.line} are both dated {a.stamp:%Y-%m-%d %H:%M:%S}."
                             f"{a.stamp.microsecond // 1000:03d} ({a.images[0].name!r}, {b.images[0].name!r}): two "
                             "frames are never recorded at the same time")
