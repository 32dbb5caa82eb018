"""The Udacity self-driving-car simulator's recording format, both ways: export a dataset to it, import one.

    python -m agent.udacity.recordings export data/udacity --out out/udacity_log     # dataset -> IMG/ + driving_log.csv
    python -m agent.udacity.recordings import ~/recordings/track1 --out data/track1  # recording -> dataset

Why: behaviour-cloning code written for the simulator (PilotNet notebooks and the like) reads this
format, and the recordings people published with it are free training data for the udacity env. The format and
its checks are driving_data.udacity_log's, the import driving_data.udacity_import's; this module writes the
format and is the command line of both.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Sequence

import numpy as np

from common.cli import option, run_command
from common.files import StagingFolder, write_json
from driving_data.dataset import DemoDataset, dataset_env_name, open_dataset
from driving_data.frames import RECOMMENDED_JPEG_QUALITY, JpegFrames, check_jpeg_quality
from driving_data.udacity_import import DEFAULT_FRAME_PERIOD_S, import_udacity
from driving_data.udacity_log import CAMERAS, CSV_NAME, EXPORT_CARD, IMG_DIR, MPH_PER_MS

EXPORT_START = datetime(2020, 1, 1, 12, 0, 0)  # fake recording date of exported file names
EXPORT_EPISODE_GAP_S = 10.0  # exported episodes are this far apart, far above the importer's 1 s split
LABELS = ("action", "expert_action")


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

    return {"exported_by": f"{PROG} export", "env": dataset_env_name(ds.card, ds.episodes), "steering": label,
            "steering_moved_the_car": label == "action", "dart_noise": collection_noise(ds),
            "geometry": geometry_of(ds).to_dict()}


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
