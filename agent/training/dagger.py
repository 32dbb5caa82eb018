"""A DAgger lineage in one command: expert episodes and a first student, then rounds in which the previous
round's student drives (the expert labelling every frame it sees) and the next student fine-tunes it on all the
data so far. Each step is the same call as ``collect.py`` / ``train.py`` would make; a re-run picks up where an
interrupted one stopped (finished rounds are kept, a collection is topped up, a training resumes from last.pt, or
starts over where it was stopped before its first epoch was saved).

    python -m agent.training.dagger --core nac-focus --seed 2 --recipe long --renderer fast
    python -m agent.training.dagger --core lstm --seed 1 --recipe short --data data/dl1_lstm --out runs/dl1/lstm
    python -m agent.training.dagger --replay RECORDING_DIR --seed 1      # DAgger in the replay of a recording
    python -m agent.training.dagger --replay RECORDING_DIR --init checkpoints/udacity_real_nac.pt --recipe fine-tune
    python -m agent.training.dagger --replay RECORDING_DIR --init CKPT --recipe fine-tune --rehearsal OTHER_DATA ...

The recipes are the ones measured in docs/results.md: ``short`` the like-for-like table's (3 collections, 8
epochs, argmax drivers), ``long`` the shipped discrete student's (8 collections, 47 epochs, sampling drivers),
``replay`` (the one for ``--replay``) the real recordings' DAgger: round 0 is the default train.py student of the
recording (its last 20 % of every session held out), each round after it drives the replay of the part it trained
on, the path controller labelling what it sees, and fine-tunes on the recording plus every round's episodes;
``fine-tune`` (with ``--replay`` and ``--init``) makes a given student a user's: round 0 is the README's fine-tune of
it (5 epochs at lr 5e-4, best.pt blended half and half with the start), then one DAgger round in the replay,
blended half and half with the student that drove it.
"""
from __future__ import annotations

import math
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from common.checks import is_int
from common.cli import check_choices, flag_of, option, run_command
from common.files import write_json
from common.stops import Interrupted
from envs.registry import get_spec
from policies.options import precision_option


@dataclass(frozen=True)
class Round:
    """One DAgger round: the previous student drives (the expert's action executed instead with probability
    ``beta``), then the student fine-tunes for ``epochs`` at peak learning rate ``lr``."""

    beta: float
    epochs: int
    lr: float
    blend: float | None = None  # train.py --blend-init: best.pt mixed with the student the round started from


@dataclass(frozen=True)
class Recipe:
    expert_episodes: int  # round 0: the expert drives
    epochs: int  # round 0's epochs (train.py's default learning rate)
    episodes: int  # episodes each DAgger round adds
    rounds: tuple[Round, ...]
    driver_actions: str  # how the students drive, in the rounds and afterwards (train.py --discrete-actions)
    action_space: str = "discrete"
    val_fraction: float = 0.1
    split: str = "auto"  # train.py --split
    lr: float | None = None  # round 0's peak learning rate (None: train.py's default)
    blend: float | None = None  # round 0's --blend-init with --init; a recipe that has one fine-tunes an --init

    @property
    def first_round(self) -> Round:
        from agent.training.config import TrainArgs

        return Round(1.0, self.epochs, TrainArgs.lr if self.lr is None else self.lr, self.blend)


# Rounds in the replay of a recording: no expert episodes (round 0 trains on the recording), one episode per
# recorded session each round (``episodes`` 0 = as many as the recording's sessions).
REPLAY_RECIPE = Recipe(0, 15, 0, (Round(0.0, 4, 5e-4),) * 3, "argmax", action_space="continuous", val_fraction=0.2,
                       split="blocks")


# A user's recording makes a given student (--init) theirs: round 0 the fine-tune blended with its start, then one
# round in the replay teaches the way back on the user's own road, blended half and half with the round's start
# (chosen on four development recordings by a rule fixed before measuring: docs/results.md).
FINE_TUNE_RECIPE = replace(REPLAY_RECIPE, epochs=5, lr=5e-4, blend=0.5, rounds=(Round(0.0, 4, 5e-4, blend=0.5),))

NOISE_HOLD = 3  # frames a replay's --noise sample is held: 0.3 s at a recording's 10 Hz moves the car off its line

RECIPES = {
    "short": Recipe(20, 4, 20, (Round(0.5, 2, 5e-4), Round(0.0, 2, 5e-4)), "argmax"),
    "long": Recipe(25, 15, 20, (Round(0.5, 6, 5e-4), Round(0.2, 6, 5e-4), Round(0.0, 4, 5e-4), Round(0.0, 4, 5e-4),
                                Round(0.0, 3, 2e-4), Round(0.0, 3, 2e-4), Round(0.0, 3, 2e-4)), "sample"),
    "replay": REPLAY_RECIPE,
    "fine-tune": FINE_TUNE_RECIPE,
}


@dataclass
class Lineage:
    """One lineage: a core, a training seed (also the split seed) and a recipe, in its data and run folders."""

    core: str = option("nac-focus", "the student's sequence core, as train.py --core", group="model")
    init: str | None = option(None, "round 0 fine-tunes this checkpoint instead of training a --core from scratch "
                              "(e.g. the simulator student checkpoints/udacity_sim2real_nac.pt on a short recording)",
                              group="model", metavar="CKPT")
    seed: int = option(1, "training seed (weights, batches, the split) of every round; not a track seed (the rounds "
                       "collect on collect.py's tracks)", group="optimisation")
    recipe: str | None = option(None, "short: 20 expert episodes, 4 epochs, 2 rounds of 20 (argmax drivers); long: "
                                "25 expert episodes, 15 epochs, 7 rounds of 20 with sampling drivers; replay: a "
                                "recording's default student, then 3 rounds of 4 epochs at lr 5e-4 in its replay "
                                "(default: replay with --replay, else long); fine-tune (with --replay and --init): "
                                "the README's fine-tune of --init blended half and half with it, then one round of 4 "
                                "epochs in the replay, blended half and half with its start", group="optimisation",
                                choices=tuple(RECIPES))
    rounds: int | None = option(None, "DAgger rounds after round 0 (default: the recipe's); more than the recipe's "
                                "repeat its last round, so a finished lineage goes on where it stopped",
                                group="optimisation", metavar="N")
    round_epochs: int | None = option(None, "epochs of each round after round 0 (default: the recipe's)",
                                      group="optimisation", metavar="N")
    round_blend: float | None = option(None, "each round after round 0 blends its best.pt with the student it "
                                       "started from, as train.py --blend-init W; 1: no blend (default: the "
                                       "recipe's: fine-tune 0.5, the others none)",
                                       group="optimisation", metavar="W")
    recording: str | None = option(None, "DAgger in the replay of this recording (a real simulator recording or "
                                   "its imported dataset folder, or a pool of them: python -m agent.udacity.pool "
                                   "import), as evaluate.py --replay drives it, instead of carracing with its PPO "
                                   "expert", group="data", metavar="REC", flag="--replay", former=("--recording",))
    rehearsal: list[str] = option([], "with --replay: other dataset folders (other drivers' recordings, or the "
                                  "simulator's: collect.py --env udacity-real) trained beside the recording in every "
                                  "round, each frame one turn, so the student rehearses what it knew; the rounds "
                                  "drive only the recording's replay", group="data", metavar="DIR")
    data: str | None = option(None, "dataset folder (default: data/dagger/<name>; with --replay each round's "
                              "episodes in DATA/rK)", group="data")
    out: str | None = option(None, "run folder, round K in OUT/rK (default: runs/dagger/<name>; the name is "
                             "<recipe>_<core>_s<seed>, or <recording>_<core>_s<seed>)", group="output")
    env: str = "carracing"
    renderer: str | None = option(None, "who draws the frames, as collect.py --renderer", group="data")
    workers: int | None = option(None, "collection processes (default: collect.py's)", group="runtime")
    threads: int = option(0, "torch threads of the training (default: train.py's)", group="runtime")
    precision: str = precision_option()  # the trainings', as train.py --precision
    max_steps: int | None = option(None, "steps per episode (default: the env's)", group="data")
    noise: float | None = option(None, "DART noise on what the rounds' students execute (not on round 0's expert), "
                                 "as collect.py --noise: with --replay the std of the steering noise, held 3 "
                                 "frames, so that a student that drives well still reaches states off the path "
                                 "for the path controller to label (default: the env's; the replay's 0)",
                                 group="data", metavar="STD")
    progress: bool = option(True, "progress bars", group="runtime")
    train_options: dict[str, Any] = field(default_factory=dict)  # further TrainArgs fields (tests: tiny models)

    @property
    def recipe_name(self) -> str:
        return self.recipe or ("replay" if self.recording else "long")

    @property
    def name(self) -> str:
        first = Path(self.recording).resolve().name if self.recording else self.recipe_name
        if self.recording and self.recipe_name != "replay":
            first += f"_{self.recipe_name}"
        student = f"from-{Path(self.init).stem}" if self.init else self.core
        return f"{first}_{student}_s{self.seed}"

    @property
    def data_dir(self) -> Path:
        return Path(self.data or f"data/dagger/{self.name}")

    @property
    def out_dir(self) -> Path:
        return Path(self.out or f"runs/dagger/{self.name}")

    def validate(self, recipes: dict[str, Recipe] = RECIPES) -> Recipe:
        check_choices(self, skip=("recipe",))  # --recipe: one of ``recipes``, the ones this lineage may run
        if self.recipe_name not in recipes:
            raise ValueError(f"--recipe must be one of {', '.join(recipes)}, got {self.recipe!r}")
        recipe = recipes[self.recipe_name]
        if bool(self.recording) != (recipe.expert_episodes == 0):
            raise ValueError(f"--recipe {self.recipe_name} is a recipe for carracing's expert; give --recipe replay "
                             "with --replay" if self.recording else f"--recipe {self.recipe_name} runs in the "
                             "replay of a recording: give --replay REC")
        if self.recording and not Path(self.recording).is_dir():
            raise ValueError(f"--replay {self.recording!r} is not a folder (a simulator recording with "
                             "driving_log.csv, or its imported dataset)")
        if not is_int(self.seed, 0):
            raise ValueError(f"--seed must be an integer >= 0, got {self.seed!r}")
        if self.noise is not None and not (math.isfinite(self.noise) and self.noise >= 0):
            raise ValueError(f"--noise must be a number >= 0, got {self.noise!r}")
        if self.rounds is not None and not is_int(self.rounds, 1):
            raise ValueError(f"--rounds must be an integer >= 1, got {self.rounds!r}")
        if self.round_epochs is not None and not is_int(self.round_epochs, 1):
            raise ValueError(f"--round-epochs must be an integer >= 1, got {self.round_epochs!r}")
        if self.round_blend is not None and not (math.isfinite(self.round_blend) and 0 < self.round_blend <= 1):
            raise ValueError(f"--round-blend must be a share in (0, 1], got {self.round_blend!r}")
        if recipe.blend is not None and not self.init:
            raise ValueError(f"--recipe {self.recipe_name} fine-tunes a student to the recording: give --init CKPT "
                             "(e.g. checkpoints/udacity_real_nac.pt)")
        from driving_data.dataset import CARD_NAME
        from policies.cores import parse_core_name

        parse_core_name(self.core)  # a mistyped core fails now, not after round 0's collection
        if self.init is not None and not Path(self.init).is_file():
            raise ValueError(f"--init {self.init!r} is not a file (a train.py checkpoint)")
        if self.rehearsal and not self.recording:
            raise ValueError("--rehearsal trains beside a recording: give --replay REC")
        for folder in self.rehearsal:
            if not Path(folder, CARD_NAME).is_file():
                raise ValueError(f"--rehearsal {folder!r} is not a dataset folder (no dataset.json: an imported "
                                 "recording, python -m agent.udacity.pool import, or collect.py's output)")
        if not self.recording:
            get_spec(self.env).check_renderer(self.renderer)
        return recipe


def _command(tool: str, config: Any) -> str:
    """The CLI line that does what ``config`` (a CollectConfig or TrainArgs) asks: a flag for every field away
    from its default (each field's own flag, as common.cli gives it), progress and resume left out."""
    words = [f"python {tool}"]
    for f in fields(config):
        value = getattr(config, f.name)
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        if f.name in ("progress", "resume") or value == default:
            continue
        flag = flag_of(f)
        values = value if isinstance(value, list) else [value]
        words.append(flag if value is True else f"--no-{flag[2:]}" if value is False
                     else " ".join([flag, *(shlex.quote(str(v)) for v in values)]))
    return " ".join(words)


@dataclass
class RoundPlan:
    """What round k does: each of ``collects`` until its folder holds its ``wanted`` episodes, then train."""

    run_dir: Path
    collects: list[tuple[Any, int]]  # (CollectConfig, episodes its folder must hold); empty: round 0 of a recording
    train: Any  # TrainArgs


def _recording_datasets(lin: Lineage, log: Callable[[str], None]) -> tuple[str, list[str]]:
    """(what trains: the recording as a dataset folder, or the pool; the datasets whose replays the rounds drive). A
    raw simulator recording is imported once into OUT/recording; a pool (python -m agent.udacity.pool import) is
    driven in the replay of each of its recordings."""
    from driving_data.dataset import expand_pools, pool_card
    from driving_data.udacity_import import import_recordings

    if pool_card(lin.recording) is not None:
        return str(Path(lin.recording).resolve()), [str(Path(m).resolve()) for m in expand_pools([lin.recording])]
    one = str(Path(import_recordings([lin.recording], [lin.out_dir / "recording"], warn=log)[0]).resolve())
    return one, [one]


def plan_rounds(lin: Lineage, recipe: Recipe, log: Callable[[str], None]) -> list[RoundPlan]:
    """Every round's collections and training, as collect.py / train.py configs."""
    from agent.data.config import CollectConfig
    from agent.training.config import TrainArgs

    recording, replays = _recording_datasets(lin, log) if lin.recording else (None, [])
    span = f"0:{1 - recipe.val_fraction:g}"  # the part of every session train.py --split blocks trains on
    later = list(recipe.rounds[:lin.rounds])
    later += [recipe.rounds[-1]] * ((lin.rounds or 0) - len(later))  # --rounds beyond the recipe's: its last again
    if lin.round_epochs is not None:
        later = [replace(r, epochs=lin.round_epochs) for r in later]
    if lin.round_blend is not None:
        later = [replace(r, blend=lin.round_blend) for r in later]
    rounds = [recipe.first_round, *later]  # round 0: the expert drives, or the recording trains
    plans, data_sets, wanted = [], [recording] if recording else [], 0
    for k, rnd in enumerate(rounds):
        run_dir, driver = lin.out_dir / f"r{k}", None if k == 0 else lin.out_dir / f"r{k - 1}" / "best.pt"
        collects = []
        if recording and k:  # each round's episodes in a folder of their own (one per recording of a pool)
            for replay in replays:
                data = lin.data_dir / f"r{k}" / (Path(replay).name if len(replays) > 1 else "")
                episodes = recipe.episodes or get_spec(f"replay:{replay}").parts(span)
                collects.append((CollectConfig(env=f"replay:{replay}", episodes=episodes, max_steps=lin.max_steps,
                                               out=data, progress=lin.progress, driver=driver, beta=rnd.beta,
                                               workers=lin.workers, seed=0, replay_span=span,
                                               **({"noise": lin.noise, "noise_hold": NOISE_HOLD} if lin.noise else {})),
                                 episodes))
                data_sets.append(str(data))  # the recording and every round's episodes so far
        elif not recording:
            wanted += recipe.expert_episodes if k == 0 else recipe.episodes
            collects.append((CollectConfig(env=lin.env, action_space=recipe.action_space if k == 0 else None,
                                           episodes=recipe.expert_episodes if k == 0 else recipe.episodes,
                                           max_steps=lin.max_steps, out=lin.data_dir, progress=lin.progress,
                                           driver=driver, beta=rnd.beta if k else 0.0, renderer=lin.renderer,
                                           workers=lin.workers, **({"noise": lin.noise} if k and lin.noise else {})),
                             wanted))
        trained = [*data_sets, *(str(Path(r).resolve()) for r in lin.rehearsal)]
        train_data = (trained if len(trained) > 1 else trained[0]) if recording else str(lin.data_dir)
        args = TrainArgs(data=train_data, out=str(run_dir),
                         epochs=rnd.epochs, seed=lin.seed, split_seed=lin.seed, val_fraction=recipe.val_fraction,
                         split=recipe.split, threads=lin.threads, precision=lin.precision, progress=lin.progress,
                         resume=(run_dir / "args.json").exists(), **lin.train_options,  # a killed round: on
                         # from its last.pt, or over again where it saved no epoch (train.py --resume does either)
                         **(({"init": lin.init} if lin.init else {"policy": lin.core}) if k == 0
                            else {"init": str(driver)}), lr=rnd.lr,
                         **({"blend_init": rnd.blend} if rnd.blend is not None else {}),
                         **({"discrete_actions": recipe.driver_actions} if recipe.action_space == "discrete" else {}))
        plans.append(RoundPlan(run_dir, collects, args))
    return plans


def _collect_round(lin: Lineage, k: int, rounds: int, config: Any, wanted: int, collect: Callable[..., Any],
                   log: Callable[[str], None]) -> None:
    """Top ``config.out`` up to ``wanted`` episodes (an interrupted round goes on where it stopped)."""
    from driving_data.dataset import episodes_held

    held = episodes_held(config.out)
    if held > wanted:
        raise ValueError(f"{config.out} holds {held} episodes, more than the {wanted} round {k} of this recipe needs: "
                         "it belongs to another lineage (give another --data)")
    if held == wanted:
        return
    log(f"{lin.name} round {k}/{rounds - 1}: {config.driver or 'the expert'} drives {wanted - held} episode(s) into "
        f"{config.out}")
    top_up = replace(config, episodes=wanted - held, **({"seed": config.seed + held} if lin.recording else {}))
    result = collect(top_up, command=_command("collect.py", top_up), log=log)
    if result.interrupted:
        raise Interrupted(f"interrupted in round {k}'s collection: {result.summary()}; run the same command again "
                          "to go on")


def run_lineage(lin: Lineage, recipes: dict[str, Recipe] = RECIPES,
                log: Callable[[str], None] = lambda m: print(m, file=sys.stderr)) -> dict[str, Any]:
    """Run (or finish) every round of ``lin``; returns lineage.json's content. Interrupted (Ctrl-C/SIGTERM) with
    what was kept; a re-run goes on from there."""
    from agent.data.collection import collect
    from agent.training.config import resolve
    from agent.training.experiment import finished, run as train

    recipe = lin.validate(recipes)
    plans = plan_rounds(lin, recipe, log)
    steps: list[dict[str, Any]] = []
    for k, plan in enumerate(plans):
        collects = " && ".join(_command("collect.py", c) for c, _ in plan.collects)
        steps.append({"round": k, "episodes": sum(w for _, w in plan.collects),
                      "train": _command("train.py", plan.train), **({"collect": collects} if plan.collects else {})})
        if finished(plan.run_dir):
            continue  # a finished round of an earlier run
        for config, wanted in plan.collects:
            _collect_round(lin, k, len(plans), config, wanted, collect, log)
        log(f"{lin.name} round {k}/{len(plans) - 1}: training {plan.run_dir} ({plan.train.epochs} epochs)")
        train(resolve(plan.train))
    final = str(plans[-1].run_dir / "best.pt")
    summary = {"lineage": lin.name, "core": lin.core, "seed": lin.seed, "recipe": lin.recipe_name,
               "data": str(lin.data_dir), "final": final, "rounds": steps}
    if lin.recording:
        names = [f"r{k}" for k in range(len(plans))]
        first = plans[0].train.data  # the recording, then any --rehearsal folders
        recorded = first[0] if isinstance(first, list) else first
        summary["evaluate"] = (f"python evaluate.py --replay {shlex.quote(recorded)} --replay-span "
                               f"{1 - recipe.val_fraction:g}:1 --checkpoint "
                               + " ".join(str(p.run_dir / "best.pt") for p in plans) + " --name " + " ".join(names))
    write_json(lin.out_dir / "lineage.json", summary)
    log(f"{lin.name}: {len(plans)} rounds done; the student: {final} (lineage.json in {lin.out_dir})"
        + (f"; judge every round on the held-out part: {summary['evaluate']}" if lin.recording else ""))
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    # training installs its own stop-signal handling (agent.training.distributed)
    return run_command(Lineage, run_lineage, argv, prog="python -m agent.training.dagger", doc=__doc__,
                       stop_signals=False)


if __name__ == "__main__":
    sys.exit(main())
