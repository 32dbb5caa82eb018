"""Behaviour cloning CLI: train a driving policy (CNN + NAC/LSTM/GRU/CfC/LTC/MHA/MLP core) on demonstrations.

    python train.py                                   # default NAC core (nac-focus) on data/carracing_continuous
    python train.py --data DATA --core nac --window 8 --frame-stride 3 --epochs 8 --out runs/train/nac
    python train.py --data DATA --core nac,lstm,gru,cfc,mha,mlp --out runs/train/compare   # comparison table
    python train.py --data DATA --core nac --folds 5                                       # paper's 5-fold protocol
    python train.py --out runs/train/nac --resume                                          # continue a run
    python train.py --data shard0 shard1 shard2 --out runs/train/all                       # several datasets as one
    torchrun --nproc-per-node 2 train.py --data DATA --out runs/train/ddp                  # 2 processes, one policy

Under torchrun (--nproc-per-node N, and --nnodes/--rdzv-* across machines) the processes train one policy with
DistributedDataParallel (gloo on CPU, NCCL on GPU): each step's batch is shared out, rank 0 alone writes the
run folder, --resume works the same (with any number of processes); see README "Scaling out".

--core names the sequence core after the CNN (it was called --policy, which still works and says so).
Every flag is a field of agent.training.config.TrainArgs (underscores become dashes; --core is the field policy).
The training loop lives in agent/training/loop.py; this file only parses arguments and turns bad input into one line.
"""
from __future__ import annotations

import argparse
import inspect
import os
import re
import sys
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any, NoReturn, get_type_hints

from agent.data.out_folder import run_folder
from agent.runtime import cli_exit_code
from agent.training.config import RENAMED, TrainArgs, check_args, default_out
from agent.training.experiment import run
from agent.training.loop import Interrupted

PROG = "python train.py"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2, no usage dump
        self.exit(2, f"error: {message} (see {PROG} --help)\n")


class _OldSpelling(argparse.Action):
    """A flag's old name: still works, and says on stderr (one line) what it is called now."""

    def __init__(self, option_strings: list[str], dest: str, new: str = "", **kw: Any) -> None:
        super().__init__(option_strings, dest, **kw)
        self.new = new

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        print(f"note: {option_string} is deprecated, use {self.new} (same values)", file=sys.stderr)
        setattr(namespace, self.dest, values)


def with_default(text: str, default: Any) -> str:
    """Help text that names the default once, in words (switches: on/off); text that already says it stays."""
    if "default" in text.lower() or default is None:
        return text
    shown = ("on" if default else "off") if isinstance(default, bool) else default
    return f"{text} (default: {shown})"


def build_parser() -> argparse.ArgumentParser:
    doc = __doc__.split("\n\n", 1)
    parser = _Parser(prog=PROG, description=doc[0], epilog=doc[1],
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    hints = get_type_hints(TrainArgs)
    helps = dict(re.findall(r"^    (\w+): .*?#\s*(.+)$", inspect.getsource(TrainArgs), re.M))
    for f in fields(TrainArgs):
        flag = "--" + RENAMED.get(f.name, f.name).replace("_", "-")
        kind, default = hints[f.name], (f.default if f.default is not MISSING else None)
        text = helps.get(f.name, "") + (" (formerly --policy)" if f.name == "policy" else "")
        text = with_default(text, default).replace("%", "%%")
        if kind is bool:
            action = parser.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=default)
            action.help = text  # set afterwards: Python 3.11's BooleanOptionalAction appends its own "(default: ...)"
        else:
            base = {int: int, float: float, int | None: int, float | None: float}.get(kind, str)
            metavar = {"policy": "CORE[,CORE...]", "data": "DATA"}.get(f.name)
            several = {"nargs": "+"} if f.name == "data" else {}
            parser.add_argument(flag, dest=f.name, type=base, default=default, metavar=metavar, help=text, **several)
    for old, new in RENAMED.items():
        parser.add_argument(f"--{old}", dest=old, action=_OldSpelling, new=f"--{new}", default=argparse.SUPPRESS,
                            help=argparse.SUPPRESS)
    return parser


def parse_args(argv: list[str] | None = None) -> TrainArgs:
    args = vars(build_parser().parse_args(argv))
    if isinstance(args["data"], list) and len(args["data"]) == 1:  # one folder: the plain string it always was
        args["data"] = args["data"][0]
    return TrainArgs(**args)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # the run installs its own stop-signal handling around the training (agent.training.distributed.joined)
    return cli_exit_code(lambda: _run_in_folder(args), Interrupted, stop_signals=False)


def _run_in_folder(args: TrainArgs) -> None:
    """The run, with its --out checked writable and locked first (by torchrun's rank 0 alone: it alone writes)."""
    check_args(args)  # a bad flag is the likelier mistake: say that before anything about the folder
    with run_folder(Path(args.out or default_out(args)), "train.py", lock=int(os.environ.get("RANK", "0")) == 0):
        run(args)


if __name__ == "__main__":
    sys.exit(main())
