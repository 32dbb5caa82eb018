"""Behaviour cloning CLI: train a driving policy (CNN + NAC/LSTM/GRU/CfC/LTC/MHA/MLP core) on demonstrations.

    python train.py                                   # default NAC policy on data/carracing_continuous
    python train.py --data DATA --policy nac --window 8 --frame-stride 3 --epochs 8 --out runs/train/nac
    python train.py --data DATA --policy nac,lstm,gru,cfc,mha,mlp --out runs/train/compare   # comparison table
    python train.py --data DATA --policy nac --folds 5                                       # paper's 5-fold protocol
    python train.py --out runs/train/nac --resume                                            # continue a run

Every flag is a field of agent.cloning.TrainArgs (underscores become dashes). The training loop
lives in agent/cloning.py; this file only parses arguments and turns bad input into one line.
"""
from __future__ import annotations

import argparse
import inspect
import re
import sys
from dataclasses import MISSING, fields
from typing import get_type_hints

from agent.cloning import Interrupted, TrainArgs, run


def parse_args(argv: list[str] | None = None) -> TrainArgs:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    hints = get_type_hints(TrainArgs)
    helps = dict(re.findall(r"^    (\w+): .*?#\s*(.+)$", inspect.getsource(TrainArgs), re.M))
    for f in fields(TrainArgs):
        flag = "--" + f.name.replace("_", "-")
        kind = hints[f.name]
        if kind is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default,
                                help=helps.get(f.name, "").replace("%", "%%"))
        else:
            base = {int: int, float: float, int | None: int}.get(kind, str)
            parser.add_argument(flag, type=base, default=f.default if f.default is not MISSING else None,
                                help=helps.get(f.name, "").replace("%", "%%"))
    return TrainArgs(**vars(parser.parse_args(argv)))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        run(args)
    except Interrupted as e:
        print(f"\n{e}", file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
