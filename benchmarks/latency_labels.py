"""How much a latency expert's labels depend on the actions on their way, which a student does not see.

A latency expert (agent.experts.latency) chooses each action for the state it will meet, given the actions already
on their way. For states of a dataset it labelled (collect.py --expert LATENCY_EXPERT --latency-steps D), its
label is recomputed with the actions on their way at another step of the same episode: the mean square change,
as a share of each label's variance, is how much of a label the in-flight actions set.

    python -m benchmarks.latency_labels DATASET [DATASET ...] --expert LATENCY_EXPERT.zip [--states 20]
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from agent.experts.expert import Expert
from common.cli import option, run_command
from driving_data.dataset import open_dataset, queued_actions


def queue_dependence(expert: Any, dataset: Any, states: int = 20, every: int = 3, seed: int = 0) -> dict[str, float]:
    """Per action component: the mean square change of the label when the actions on their way are another step's,
    divided by the labels' variance (over ``states`` random states of every ``every``-th episode)."""
    latency = int(dataset.episodes[0].get("latency_steps") or 0)
    if not dataset.episodes[0].get("labels_land") or not latency:
        raise ValueError(f"{str(dataset.root)!r} was not labelled by a latency expert under latency "
                         "(collect.py --expert LATENCY_EXPERT --latency-steps D)")
    rng = np.random.default_rng(seed)
    own, swapped = [], []
    for i in range(0, len(dataset), every):
        arrays = dataset.load(i, keys=["action", "privileged"])
        n = len(arrays["action"]) - latency  # steps whose actions on their way were all recorded
        if n < states:
            continue
        for t in rng.choice(n, states, replace=False):
            u = int(rng.integers(n))
            queues = queued_actions(arrays["action"], np.array([t, u]), np.array([latency, latency]), latency)
            own.append(expert.act(arrays["privileged"][t], latency, list(queues[0])))
            swapped.append(expert.act(arrays["privileged"][t], latency, list(queues[1])))
    if not own:
        raise ValueError(f"{str(dataset.root)!r}: no episode longer than {states + latency} steps")
    own_a, swapped_a = np.asarray(own), np.asarray(swapped)
    names = expert.spec.action_names[expert.action_space]
    return {name: float(((own_a[:, k] - swapped_a[:, k]) ** 2).mean() / max(own_a[:, k].var(), 1e-12))
            for k, name in enumerate(names)}


@dataclass
class LatencyLabelsArgs:
    dataset: list[str] = option(help="datasets a latency expert labelled", group="input", positional=True,
                                metavar="DATASET")
    expert: str | None = option(None, "the latency expert (.zip with its card)", group="input", required=True)
    states: int = option(20, "states drawn per episode (every third episode)", group="runtime")


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(LatencyLabelsArgs, _benchmark, argv, prog="python -m benchmarks.latency_labels", doc=__doc__,
                       mistakes=(ValueError, OSError))


def _benchmark(a: LatencyLabelsArgs) -> None:
    expert = Expert.load(a.expert)
    if not expert.max_latency:
        raise ValueError(f"--expert {a.expert!r} is not a latency expert (its card names no latency range)")
    for folder in a.dataset:
        shares = queue_dependence(expert, open_dataset(folder), a.states)
        print(f"{folder}: a label's mean square change with another step's actions on their way, as a share of "
              "its variance: " + ", ".join(f"{k} {v:.2f}" for k, v in shares.items()), flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
