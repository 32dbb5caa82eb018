"""How far a student's training label alone takes the car off the recorded driver's line: the replay driven open
loop (no frames, no feedback) by the recorded steering's centred 0.5 s average (what train.py teaches on a person's
recording), by the same average played early or late, and by always-straight.

A keyboard driver steers in taps: the recorded line turns a few degrees at every tap, and the averaged label turns
as much, spread over half a second. How often that difference alone reaches the replay's 1 m says how much a
student's feedback must absorb; the late and early rows say how much a student acting late (a person's reaction
time copied with the labels) or early costs in the same figure.

    python -m benchmarks.label_drift REC_OR_DATASET [--span 0.8:1] [--shift-steps 2 4]
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from benchmarks.feedback_gains import _span
from common.cli import option, run_command
from envs.replay.options import REFERENCES

PROG = "python -m benchmarks.label_drift"


def shifted(values: np.ndarray, steps: int) -> np.ndarray:
    """``values`` played ``steps`` rows late (negative: early), the ends held."""
    idx = np.clip(np.arange(len(values)) - steps, 0, len(values) - 1)
    return values[idx]


def label_drivers(steer: np.ndarray, times: np.ndarray, shifts: list[int]) -> dict[str, np.ndarray]:
    """The open-loop drivers of one whole session, by name: each a steering per row."""
    from driving_data.labels import DEFAULT_SMOOTHING_S, centred_average

    label = centred_average(times, steer, DEFAULT_SMOOTHING_S)
    drivers = {"recorded steering": steer, "the label (centred 0.5 s average)": label}
    for d in shifts:
        drivers[f"the label {d} rows late"] = shifted(label, d)
        drivers[f"the label {d} rows early"] = shifted(label, -d)
    drivers["always straight"] = np.zeros_like(steer)
    return drivers


def drift_table(dataset, span: tuple[float, float], shifts: list[int]) -> tuple[dict[tuple[str, str], int], float]:
    """Interventions of every open-loop driver on the span of every session, under both references, and the
    seconds replayed."""
    from envs.replay.env import step_seconds
    from envs.replay.road import part_middle
    from envs.replay.spec import geometry_of, replay_parts
    from envs.replay.vehicle import DEFAULT_MAX_OFFSET_M, DEFAULT_MAX_YAW_RAD, PathVehicle, count_interventions

    geometry = geometry_of(dataset)
    vehicle = PathVehicle.of(geometry)
    counts: dict[tuple[str, str], int] = {}
    seconds = 0.0
    for part in replay_parts(dataset, span):
        arrays = dataset.load(part.episode, keys=["action", "speed", "time"])
        times = np.asarray(arrays["time"], np.float64)
        steer = np.asarray(arrays["action"], np.float64).reshape(len(times), -1)[:, 0]
        rows = slice(part.start, part.stop)
        speed, dt = np.asarray(arrays["speed"], np.float64)[rows], step_seconds(times[rows])  # as the env steps
        seconds += float(dt.sum())
        drivers = label_drivers(steer, times, shifts)
        for ref in REFERENCES:
            middle = part_middle(dataset, part.episode, rows, geometry) if ref == "driver-or-middle" else None
            for name, driver in drivers.items():
                counts[(ref, name)] = counts.get((ref, name), 0) + count_interventions(
                    vehicle, driver[rows], steer[rows], speed, dt, DEFAULT_MAX_OFFSET_M, DEFAULT_MAX_YAW_RAD, middle)
    return counts, seconds


@dataclass
class LabelDriftArgs:
    data: str = option(help="a recording (driving_log.csv + IMG/) or a udacity dataset", group="input",
                       metavar="REC_OR_DATASET", positional=True)
    span: tuple[float, float] = option((0.8, 1.0), "part A:B of every session replayed (default: 0.8:1, the "
                                       "held-out part)", group="evaluation conditions", metavar="A:B", parse=_span)
    shift_steps: list[int] = option([2, 4], "rows the label is also played late and early",
                                    group="evaluation conditions", metavar="N")
    out: str = option("eval/label_drift", "output folder: a raw recording is imported into it", group="output",
                      former=("--work",))


def main(argv: list[str] | None = None) -> int:
    return run_command(LabelDriftArgs, _benchmark, argv, prog=PROG, doc=__doc__, mistakes=(ValueError, OSError))


def _benchmark(a: LabelDriftArgs) -> None:
    from pathlib import Path

    from driving_data.dataset import open_dataset
    from driving_data.udacity_import import import_recordings

    if any(d <= 0 for d in a.shift_steps):
        raise ValueError(f"--shift-steps takes whole rows >= 1, got {a.shift_steps}")
    [folder] = import_recordings([a.data], [Path(a.out) / "imported_data"])
    counts, seconds = drift_table(open_dataset(folder), a.span, a.shift_steps)
    print(f"{a.data}: {seconds:.0f} s replayed; interventions per 100 s (count) of each open-loop driver")
    print("| driver | against the driver's line | against the driver's line or the road's middle |")
    print("|---|---|---|")
    for name in dict.fromkeys(n for _, n in counts):
        cells = [f"{100 * counts[(r, name)] / seconds:.1f} ({counts[(r, name)]})" for r in REFERENCES]
        print(f"| {name} | {' | '.join(cells)} |")


if __name__ == "__main__":
    raise SystemExit(main())
