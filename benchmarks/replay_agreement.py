"""Does the replay rank drivers the way true closed loop does? (this project's simulators, where both exist)

The expert drives N tracks of ENV (no noise); those drives are the recording. Students of graded quality (the
shipped one, one-minute students of several cores and epochs, an always-straight checkpoint) then drive the
same tracks twice: in the real simulator (true closed loop, `evaluate.py --env ENV`) and in the replay of the
expert's drives (`evaluate.py --replay`). Printed: each student's autonomy and interventions per 100 s in both,
and the Spearman rank correlation between the two over the students. Every step is one of the project's CLIs,
so the table is reproduced by the same commands; finished steps are skipped on a re-run, stopped ones run again (a
training from its last.pt). A second replay counts interventions at the true env's lane margin instead of NVIDIA's
1 m from the driver's line (`--lane-offset`).

    python -m benchmarks.replay_agreement --env udacity --out runs/replay_agreement/udacity
    python -m benchmarks.replay_agreement --env udacity-hard --out runs/replay_agreement/udacity-hard
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from agent.training.experiment import finished, resume_args
from common.cli import option, run_command
from driving_data.dataset import episodes_held

# (name, core, epochs) of the one-minute students, trained on STUDENT_EPISODES short expert episodes with DART noise
STUDENTS = (("nac_e1", "nac", 1), ("nac_e3", "nac", 3), ("nac_e6", "nac", 6), ("gru_e3", "gru", 3),
            ("gru_e6", "gru", 6), ("lstm_e2", "lstm", 2), ("mlp_e1", "mlp", 1), ("mha_e2", "mha", 2))
STUDENT_EPISODES, STUDENT_STEPS = 4, 400
DRIVE_SEED, STUDENT_SEED = 3_000_000, 3_000_100  # collection seeds (>= 3,000,000): unseen by every shipped model


def run(cmd: list[str], done: Path | None = None) -> None:
    """One CLI step, skipped when ``done``, the file it writes last, exists (an evaluation's ``comparison.json`` is
    not written by a run that was stopped)."""
    if done is not None and done.exists():
        return
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def collect(cmd: list[str], out: Path, episodes: int) -> None:
    """A collect.py step, skipped when ``out`` holds its episodes. A stopped one keeps the episodes it finished, and
    collect.py adds to a dataset: it is started over instead, so every re-run holds the same drives."""
    if episodes_held(out) >= episodes:
        return
    shutil.rmtree(out, ignore_errors=True)
    run([*cmd, "--out", str(out)])


def train(cmd: list[str], out: Path) -> Path:
    """A train.py step; a stopped one goes on from its last.pt, a finished one is reused."""
    if not finished(out):
        run([*cmd, *resume_args(out)])
    return out / "best.pt"


def straight_checkpoint(source: Path, out: Path) -> Path:
    """A checkpoint of `source`'s architecture whose head always steers 0 and gives every other component its
    training mean (a throttle of 0 would park the car): the always-straight driver as a policy, for true closed loop."""
    from policies.checkpoint import load_checkpoint, save_checkpoint

    if not out.exists():
        policy = load_checkpoint(source)
        with torch.no_grad():
            policy.head.weight.zero_()
            policy.head.bias.zero_()  # the normalised training mean of every component
            col = list(policy.config.action_names).index("steer")
            policy.head.bias[col] = -policy.target_mean[col] / policy.target_std[col]
        save_checkpoint(out, policy)
    return out


def spearman(a: list[float], b: list[float]) -> float:
    """Rank correlation (average ranks for ties)."""
    def ranks(x: list[float]) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        order = np.argsort(x, kind="stable")
        r = np.empty(len(x))
        r[order] = np.arange(len(x), dtype=np.float64)
        for v in np.unique(x):
            r[x == v] = r[x == v].mean()
        return r
    ra, rb = ranks(a), ranks(b)
    return float(np.corrcoef(ra, rb)[0, 1]) if ra.std() > 0 and rb.std() > 0 else float("nan")


@dataclass
class ReplayAgreementArgs:
    env: str = option("udacity", "the simulator driven and replayed", group="what drives",
                      choices=("udacity", "udacity-hard"))
    episodes: int = option(4, "tracks driven", group="evaluation conditions")
    max_steps: int = option(400, "steps per track (default: 400 = 40 s)", group="evaluation conditions")
    lane_offset: float = option(2.6, "a second replay with this intervention distance (m): the true env's lane "
                                "margin, half the narrowest road (7 m) less half the car",
                                group="evaluation conditions")
    out: Path | None = option(None, "the run folder (default: runs/replay_agreement/ENV)", group="output")
    workers: int = option(2, "collection and evaluation processes", group="runtime")


def main(argv: list[str] | None = None) -> int:
    return run_command(ReplayAgreementArgs, _benchmark, argv, prog="python -m benchmarks.replay_agreement", doc=__doc__,
                       mistakes=(ValueError, OSError))


def _benchmark(a: ReplayAgreementArgs) -> int:
    from envs.registry import get_spec

    spec = get_spec(a.env)
    out = a.out or Path("runs/replay_agreement") / a.env
    py = sys.executable
    scene = (["--theme", ",".join(spec.train_themes), "--condition", ",".join(spec.train_conditions)]
             if spec.themes else [])
    collect([py, "collect.py", "--env", a.env, "--episodes", str(a.episodes), "--max-steps", str(a.max_steps),
             "--noise", "0", "--seed", str(DRIVE_SEED), "--workers", str(a.workers)], out / "drives", a.episodes)
    collect([py, "collect.py", "--env", a.env, "--episodes", str(STUDENT_EPISODES), "--max-steps", str(STUDENT_STEPS),
             "--seed", str(STUDENT_SEED), "--workers", str(a.workers)], out / "student_data", STUDENT_EPISODES)
    names, paths = [f"shipped_{a.env}_nac"], [Path(f"checkpoints/{a.env}_nac.pt")]
    for name, core, epochs in STUDENTS:
        names.append(name)
        paths.append(train([py, "train.py", "--data", str(out / "student_data"), "--core", core, "--epochs",
                            str(epochs), "--no-progress"], out / "students" / name))
    names.append("always_straight")
    paths.append(straight_checkpoint(out / "students" / "nac_e1" / "best.pt", out / "students" / "straight.pt"))
    common = ["--checkpoint", *map(str, paths), "--name", *names, "--video-episodes", "0", "--workers", str(a.workers),
              "--no-progress"]
    run([py, "evaluate.py", "--env", a.env, "--seed", str(DRIVE_SEED), "--episodes", str(a.episodes), "--max-steps",
         str(a.max_steps), *scene, "--out", str(out / "true"), *common], out / "true" / "comparison.json")
    run([py, "evaluate.py", "--replay", str(out / "drives"), "--out", str(out / "replay"), *common],
        out / "replay" / "comparison.json")
    lane = f"replay_{a.lane_offset:g}m"
    run([py, "evaluate.py", "--replay", str(out / "drives"), "--replay-max-offset", str(a.lane_offset),
         "--out", str(out / lane), *common], out / lane / "comparison.json")
    true = json.loads((out / "true" / "comparison.json").read_text())
    replay = json.loads((out / "replay" / "comparison.json").read_text())
    wide = json.loads((out / lane / "comparison.json").read_text())
    lines = [f"| student | true autonomy % | replay (1 m) | replay ({a.lane_offset:g} m) | true per 100 s "
             f"| replay (1 m) per 100 s | replay ({a.lane_offset:g} m) per 100 s |", "|---|---|---|---|---|---|---|"]
    for n in names:
        t, r, w = true[n], replay[n], wide[n]
        lines.append(f"| {n} | {t['autonomy']:.1f} | {r['autonomy']:.1f} | {w['autonomy']:.1f} "
                     f"| {t['interventions_per_100s']:.1f} | {r['interventions_per_100s']:.1f} "
                     f"| {w['interventions_per_100s']:.1f} |")
    # ranked by interventions per 100 s (fewer is better): autonomy is clamped at 0, so it would tie the students
    # that leave the line most; on the same tracks and time the two rank alike where autonomy is above 0
    truth = [-true[n]["interventions_per_100s"] for n in names]
    drivable = [k for k, n in enumerate(names) if true[n]["autonomy"] > 0]
    for label, runs in (("1 m", replay), (f"{a.lane_offset:g} m", wide)):
        got = [-runs[n]["interventions_per_100s"] for n in names]
        lines.append(f"\nReplay ({label}) against true closed loop over {len(names)} students, by interventions "
                     f"per 100 s: Spearman "
                     f"{spearman(truth, got):.3f}, Pearson {np.corrcoef(truth, got)[0, 1]:.3f}; "
                     f"over the {len(drivable)} "
                     f"with a positive true autonomy: Spearman "
                     f"{spearman([truth[k] for k in drivable], [got[k] for k in drivable]):.3f}. Always-straight on "
                     f"the same frames: {runs[names[0]]['straight_autonomy']:.1f} % "
                     f"({runs[names[0]]['straight_interventions_per_100s']:.1f} per 100 s).")
    text = (f"# Replay against true closed loop: {a.env}, {a.episodes} tracks x {a.max_steps} steps\n\n"
            + "\n".join(lines))
    (out / "agreement.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
