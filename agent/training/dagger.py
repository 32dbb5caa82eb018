"""A DAgger lineage in one command: expert episodes and a first student, then rounds in which the previous
round's student drives (the expert labelling every frame it sees) and the next student fine-tunes it on all the
data so far. Each step is the same call as ``collect.py`` / ``train.py`` would make; a re-run picks up where an
interrupted one stopped (finished rounds are kept, a collection is topped up, a training resumes from last.pt).

    python -m agent.training.dagger --core nac-focus --seed 2 --recipe long --renderer fast
    python -m agent.training.dagger --core lstm --seed 1 --recipe short --data data/dl1_lstm --out runs/dl1/lstm

The recipes are the ones measured in docs/results.md: ``short`` the like-for-like table's (3 collections, 8
epochs, argmax drivers), ``long`` the shipped discrete student's (8 collections, 47 epochs, sampling drivers).
"""
from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from agent.runtime import cli_exit_code
from common.cli import flag_of, option, parse
from common.files import write_json


@dataclass(frozen=True)
class Round:
    """One DAgger round: the previous student drives (the expert's action executed instead with probability
    ``beta``), then the student fine-tunes for ``epochs`` at peak learning rate ``lr``."""

    beta: float
    epochs: int
    lr: float


@dataclass(frozen=True)
class Recipe:
    expert_episodes: int  # round 0: the expert drives
    epochs: int  # round 0's epochs (train.py's default learning rate)
    episodes: int  # episodes each DAgger round adds
    rounds: tuple[Round, ...]
    driver_actions: str  # how the students drive, in the rounds and afterwards (train.py --discrete-actions)
    action_space: str = "discrete"
    val_fraction: float = 0.1


RECIPES = {
    "short": Recipe(20, 4, 20, (Round(0.5, 2, 5e-4), Round(0.0, 2, 5e-4)), "argmax"),
    "long": Recipe(25, 15, 20, (Round(0.5, 6, 5e-4), Round(0.2, 6, 5e-4), Round(0.0, 4, 5e-4), Round(0.0, 4, 5e-4),
                                Round(0.0, 3, 2e-4), Round(0.0, 3, 2e-4), Round(0.0, 3, 2e-4)), "sample"),
}


@dataclass
class Lineage:
    """One lineage: a core, a training seed (also the split seed) and a recipe, in its data and run folders."""

    core: str = option("nac-focus", "the student's sequence core, as train.py --core", group="model")
    seed: int = option(1, "training and split seed of every round", group="optimisation")
    recipe: str = option("long", "short: 20 expert episodes, 4 epochs, 2 rounds of 20 (argmax drivers); long: 25 "
                         "expert episodes, 15 epochs, 7 rounds of 20 with sampling drivers", group="optimisation",
                         choices=tuple(RECIPES))
    data: str | None = option(None, "dataset folder (default: data/dagger/<recipe>_<core>_s<seed>)", group="data")
    out: str | None = option(None, "run folder, round K in OUT/rK (default: runs/dagger/<recipe>_<core>_s<seed>)",
                             group="output")
    env: str = "carracing"
    renderer: str | None = option(None, "who draws the frames, as collect.py --renderer (the recipes were measured "
                                  "with fast)", group="data")
    workers: int | None = option(None, "collection processes (default: collect.py's)", group="runtime")
    threads: int = option(0, "torch threads of the training (default: train.py's)", group="runtime")
    max_steps: int | None = option(None, "steps per episode (default: the env's)", group="data")
    progress: bool = option(True, "progress bars", group="runtime")
    train_options: dict[str, Any] = field(default_factory=dict)  # further TrainArgs fields (tests: tiny models)

    @property
    def name(self) -> str:
        return f"{self.recipe}_{self.core}_s{self.seed}"

    @property
    def data_dir(self) -> Path:
        return Path(self.data or f"data/dagger/{self.name}")

    @property
    def out_dir(self) -> Path:
        return Path(self.out or f"runs/dagger/{self.name}")

    def validate(self, recipes: dict[str, Recipe] = RECIPES) -> Recipe:
        if self.recipe not in recipes:
            raise ValueError(f"--recipe must be one of {', '.join(recipes)}, got {self.recipe!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"--seed must be an integer >= 0, got {self.seed!r}")
        from agent.training.config import parse_policy_spec
        from envs.registry import get_spec

        parse_policy_spec(self.core)  # a mistyped core fails now, not after round 0's collection
        get_spec(self.env).check_renderer(self.renderer)
        return recipes[self.recipe]


def _episodes_in(data: Path) -> int:
    from agent.data.dataset import open_dataset

    return len(open_dataset(data).episodes) if (data / "dataset.json").exists() else 0


def _finished(run_dir: Path) -> bool:
    from policies.policy import read_checkpoint

    last = run_dir / "last.pt"
    return last.exists() and bool(read_checkpoint(last).get("train_state", {}).get("done"))


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
        words.append(flag if value is True else f"--no-{flag[2:]}" if value is False
                     else f"{flag} {shlex.quote(str(value))}")
    return " ".join(words)


def run_lineage(lin: Lineage, recipes: dict[str, Recipe] = RECIPES,
                log: Callable[[str], None] = lambda m: print(m, file=sys.stderr)) -> dict[str, Any]:
    """Run (or finish) every round of ``lin``; returns lineage.json's content. Interrupted (Ctrl-C/SIGTERM) with
    what was kept; a re-run goes on from there."""
    from agent.data.collection import collect
    from agent.data.config import CollectConfig
    from agent.training.config import TrainArgs
    from agent.training.experiment import run as train
    from agent.training.loop import Interrupted

    recipe = lin.validate(recipes)
    data, out = lin.data_dir, lin.out_dir
    rounds = [Round(1.0, recipe.epochs, TrainArgs.lr), *recipe.rounds]  # round 0: the expert drives
    steps: list[dict[str, Any]] = []
    wanted = 0
    for k, rnd in enumerate(rounds):
        run_dir, driver = out / f"r{k}", None if k == 0 else out / f"r{k - 1}" / "best.pt"
        wanted += recipe.expert_episodes if k == 0 else recipe.episodes
        collect_cfg = CollectConfig(env=lin.env, action_space=recipe.action_space if k == 0 else None,
                                    episodes=recipe.expert_episodes if k == 0 else recipe.episodes,
                                    max_steps=lin.max_steps, out=data, progress=lin.progress, driver=driver,
                                    beta=rnd.beta if k else 0.0, renderer=lin.renderer, workers=lin.workers)
        args = TrainArgs(data=str(data), out=str(run_dir), epochs=rnd.epochs, seed=lin.seed, split_seed=lin.seed,
                         val_fraction=recipe.val_fraction, threads=lin.threads, progress=lin.progress,
                         resume=(run_dir / "last.pt").exists(), **lin.train_options,
                         **({"policy": lin.core} if k == 0 else {"init": str(driver), "lr": rnd.lr}),
                         **({"discrete_actions": recipe.driver_actions} if recipe.action_space == "discrete" else {}))
        steps.append({"round": k, "episodes": wanted, "collect": _command("collect.py", collect_cfg),
                      "train": _command("train.py", args)})
        if _finished(run_dir):
            continue  # a finished round of an earlier run
        held = _episodes_in(data)
        if held > wanted:
            raise ValueError(f"{data} holds {held} episodes, more than the {wanted} round {k} of this recipe "
                             f"needs before training {run_dir}: it belongs to another lineage (give another --data)")
        if held < wanted:
            log(f"{lin.name} round {k}/{len(rounds) - 1}: {'the expert' if k == 0 else driver} drives "
                f"{wanted - held} episode(s) into {data}")
            top_up = replace(collect_cfg, episodes=wanted - held)
            result = collect(top_up, command=_command("collect.py", top_up), log=log)
            if result.interrupted:
                raise Interrupted(f"interrupted in round {k}'s collection: {result.summary()}; run the same "
                                  "command again to go on")
        log(f"{lin.name} round {k}/{len(rounds) - 1}: training {run_dir} ({rnd.epochs} epochs)")
        train(args)
    summary = {"lineage": lin.name, "core": lin.core, "seed": lin.seed, "recipe": lin.recipe,
               "data": str(data), "final": str(out / f"r{len(rounds) - 1}" / "best.pt"), "rounds": steps}
    write_json(out / "lineage.json", summary)
    log(f"{lin.name}: {len(rounds)} rounds done; the student: {summary['final']} (lineage.json in {out})")
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    from agent.training.loop import Interrupted

    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    lin = parse(Lineage, argv, prog="python -m agent.training.dagger", doc=__doc__)
    return cli_exit_code(lambda: run_lineage(lin), Interrupted, stop_signals=False)


if __name__ == "__main__":
    sys.exit(main())
