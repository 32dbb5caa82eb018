"""A Udacity simulator recording (driving_data.udacity_log) as a dataset (driving_data.dataset), and which folders
are recordings to import: ``import_udacity`` makes the dataset, ``import_recordings`` stands a dataset in for each raw
recording it is given (reused while the recording is unchanged).

Mapping to the dataset arrays (one episode = one recording session)::

    frames, frames_left, frames_right   the three cameras, stored as JPEG (the recording's own bytes)
    action, expert_action   [T, 1]      the logged steering (the human or expert who drove)
    throttle, brake         [T]         as logged
    speed                   [T]         m/s (mph / 2.23694)
    reward                  [T]         zeros (a recording has no reward)
    privileged              [T, 0]      nothing: a recording has no privileged state
    time                    [T]         seconds since the episode's first frame, from the file names

Stretches where the driver reversed (turning round, backing off a wall) are cut and the session split there
(``reversing_spans``): not lane keeping, and the log's unsigned speed would drive the replay forwards through them.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import cv2
import numpy as np

from common.files import StagingFolder, check_room, disk_full, refuse_nonempty, write_json
from driving_data.dataset import CARD_NAME, FORMAT, write_episode
from driving_data.frames import JpegFrames, check_jpeg_quality, jpeg_shape
from driving_data.udacity_log import (CONVERT_HINT, CSV_NAME, EXPORT_CARD, IMPORT_COMMAND, MPH_PER_MS, STOP_MPH, LogRow,
                                      locate_log, read_export_card, usable_rows)

DEFAULT_FRAME_PERIOD_S = 0.1  # published recordings log about 10 rows per second
# Where a driver stopped and reversed (turning round, backing off a wall): cut, the session split there.
REVERSE_FROM_MPH, REVERSE_MIN_ROWS, REVERSE_MIN_RISE_MPH = 5.0, 3, 1.0  # the brake held while the speed rises from
# below 5 mph, 3 rows and 1 mph or more: reversing (braking downhill at walking pace gains a fraction of a mph over a
# row or two)
REVERSING_MERGE_S = 10.0  # stops and reversing this close belong to one manoeuvre
REVERSING_MARGIN_S = 5.0  # cut this much before and after it too: a three-point turn starts with a swing at full
# lock before its first stop, and ends pulling away
MIN_PIECE_S = 1.0  # what is left of a session between cuts, if shorter, goes with them
REVERSING_RULE = (f"cut: reversing (the brake held while the speed rises from < {REVERSE_FROM_MPH:g} mph, "
                  f">= {REVERSE_MIN_ROWS} rows, >= {REVERSE_MIN_RISE_MPH:g} mph) with stops (< "
                  f"{STOP_MPH:g} mph) within "
                  f"{REVERSING_MERGE_S:g} s, +- {REVERSING_MARGIN_S:g} s; pieces under {MIN_PIECE_S:g} s")



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
                   say: Callable[[str], None]) -> tuple[list[tuple[int, int]], list[dict[str, Any]]]:
    """The sessions less every ``reversing_spans`` stretch (and the pieces under ``MIN_PIECE_S`` between them),
    and what was cut, by CSV line, said in one line."""
    kept: list[tuple[int, int]] = []
    cut: list[dict[str, Any]] = []
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
    data: list[Any] = []  # bytes (quality None) or decoded frames
    for r in rows:
        path = r.images[cam]
        assert path is not None  # the rows of a camera the episode records
        b: bytes | np.ndarray = path.read_bytes()
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
                             "(height x width x channels), expected "
                             f"{frame_shape[0]}x{frame_shape[1]}x3 like the first image")
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
    """Turn a simulator recording into a dataset (driving_data.dataset) in ``out_dir`` (new or empty); returns it.

    ``log_dir`` is the recording folder or its CSV. ``jpeg_quality`` None (default) stores the
    recording's JPEG files byte for byte (no second lossy encode); a number decodes and re-encodes them
    (smaller, or to accept non-JPEG images). ``time`` comes from the timestamps in the file names; the few rows
    whose name has none in a log where most have one are dropped and counted; when most names have none, every
    row gets ``row index * frame_period`` (default ``DEFAULT_FRAME_PERIOD_S`` = 0.1 s) and the log is one episode.
    With timestamps, consecutive rows more than ``episode_gap_s``
    apart (or going back in time) start a new episode. Rows whose center images are missing are skipped, counted
    in the card and reported once through ``warn`` (default: stderr), or refused with ``strict_images``; rows
    whose side images are missing keep their center frame, the recording imported center-only (counted in the
    card's import.rows_missing_side_images, one warning).
    Stretches where the driver stopped and reversed are cut and their session split there (``reversing_spans``;
    listed in the card), unless ``keep_reversing``. The whole CSV is validated before anything is written (what
    each row claims against what the simulator can record: the module docstring); a failed import leaves no
    ``out_dir`` behind.
    The card records ``recording_fingerprint`` (or ``source``, taken by the caller) under import.source.
    """
    jpeg_quality, period = _checked_options(jpeg_quality, episode_gap_s, frame_period)
    csv_path, img_dir = locate_log(log_dir)
    source = source or recording_fingerprint(log_dir)
    out_dir = Path(out_dir)
    refuse_nonempty(out_dir)
    check_room(out_dir, int(source.get("images_bytes", 0)), "the import of " + str(csv_path.parent))
    say = warn or (lambda m: print(m, file=sys.stderr))
    log, rows, cameras = usable_rows(csv_path, img_dir, jpeg_quality, strict_images, say)
    exported = read_export_card(csv_path)  # an export of this project's: what its replay needs
    times, sessions, time_from = _row_times(rows, period, episode_gap_s)
    _warn_undated(rows, csv_path, period, say)
    sessions, cut = (sessions, []) if keep_reversing else _cut_reversing(rows, times, sessions, csv_path, say)
    _warn_single_frames(rows, sessions, csv_path, episode_gap_s, say)
    frame_shape: list[int] = []
    episodes = []
    with StagingFolder(out_dir) as tmp:
        for e, (a, b) in enumerate(sessions):
            part = rows[a:b]
            arrays = _session_arrays(part, times[a:b] - times[a], csv_path.name, frame_shape, jpeg_quality, cameras)
            meta = _episode_meta(part, csv_path)
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
                       "rows_missing_side_images": missing_sides(rows),
                       "repeated_rows_dropped": len(log.repeated),
                       "undated_rows_dropped": len(log.undated),
                       "skipped_examples": [{"line": n, "image": name, "problem": problem}
                                            for n, name, problem in log.skipped[:5]],
                       **({"exported": exported} if exported else {})},
            "episodes": episodes,
        })
    return out_dir


def _checked_options(jpeg_quality: int | None, episode_gap_s: float, frame_period: float | None
                     ) -> tuple[int | None, float]:
    """import_udacity's numbers checked: the JPEG quality to re-encode at (None: the files as they are) and the
    seconds per row for a log without timestamps."""
    if jpeg_quality is not None:
        jpeg_quality = check_jpeg_quality(jpeg_quality)
    if not episode_gap_s > 0:
        raise ValueError(f"episode_gap_s must be > 0, got {episode_gap_s}")
    if frame_period is not None and not frame_period > 0:
        raise ValueError(f"frame_period must be > 0, got {frame_period}")
    return jpeg_quality, DEFAULT_FRAME_PERIOD_S if frame_period is None else float(frame_period)


def _episode_meta(part: list[LogRow], csv_path: Path) -> dict[str, Any]:
    """One session's episode meta: where in the CSV it came from and when it started (no track seed: a recording)."""
    return {
        "env": "udacity", "source": "udacity-recording", "action_space": "continuous",
        "csv": str(csv_path.resolve()), "csv_lines": [part[0].line, part[-1].line],
        "start_time": part[0].stamp.isoformat(timespec="milliseconds") if part[0].stamp else None,
        "track_seed": None, "theme": None, "return": 0.0, "terminated": False, "truncated": False,
    }


def _warn_undated(rows: list[LogRow], csv_path: Path, period: float, say: Callable[[str], None]) -> None:
    """One warning when rows are timed by their index: their image names carry no time."""
    undated = [r for r in rows if r.stamp is None]  # most or all of them: usable_rows dropped a few
    if undated:
        which = (f"none of the {len(rows)} image names of {csv_path} carry a time" if len(undated) == len(rows) else
                 f"{len(undated)} of the {len(rows)} image names of {csv_path} carry no time")
        say(f"warning: {which} (first: line {undated[0].line}, "
            f"{undated[0].images[0].name!r}): its rows are taken {period:g} s apart, as one episode "
            f"({IMPORT_COMMAND} --frame-period S sets the seconds per row)")


def _warn_single_frames(rows: list[LogRow], sessions: list[tuple[int, int]], csv_path: Path, episode_gap_s: float,
                        say: Callable[[str], None]) -> None:
    """One warning when sessions of a single frame (a row far in time from its neighbours) become episodes."""
    singles = [a for a, b in sessions if b - a == 1]
    if singles:
        say(f"warning: {len(singles)} of the {len(sessions)} sessions of {csv_path.name} are a single frame, more than "
            f"{episode_gap_s:g} s from the rows around it (first: line {rows[singles[0]].line}); each is an episode")


def missing_sides(rows: list[LogRow]) -> dict[str, object]:
    """The card's count of the imported rows that log a side image whose file is missing (imported center-only):
    in all, per side, and the first few by CSV line."""
    lacking = [r for r in rows if r.missing_sides]
    return {"rows": len(lacking),
            **{side: sum(any(c == side for c, _ in r.missing_sides) for r in lacking) for side in ("left", "right")},
            "examples": [{"line": r.line, "images": [name for _, name in r.missing_sides]} for r in lacking[:5]]}


def recording_fingerprint(log_dir: str | Path) -> dict[str, Any]:
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
    """The imports in ``made`` are removed when the block is refused (ValueError, FileNotFoundError) or fills the
    disk (which the removal frees again): a command refused after importing leaves no import behind. Callers empty
    ``made`` once their run has begun with them (from then on they are the run's data), and imports reused from an
    earlier run are never in it."""
    try:
        yield
    except (ValueError, OSError) as e:
        if not isinstance(e, (ValueError, FileNotFoundError)) and not disk_full(e):
            raise
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
