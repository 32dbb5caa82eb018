"""Behaviour cloning CLI: train a driving policy (CNN + NAC/LSTM/GRU/CfC/LTC/MHA/MLP core) on demonstrations.

    python train.py                                   # default NAC core (nac-focus) on data/carracing_continuous
    python train.py --data DATA --core nac --window 8 --frame-stride 3 --epochs 8 --out runs/train/nac
    python train.py --data DATA --core nac,lstm,gru,cfc,mha,mlp --out runs/train/compare   # comparison table
    python train.py --data DATA --core nac --folds 5                                       # paper's 5-fold protocol
    python train.py --out runs/train/nac --resume                                          # continue a run
    python train.py --data shard0 shard1 shard2 --out runs/train/all                       # several datasets as one
    python train.py --preset paper-carracing                                               # the authors' experiments,
    python train.py --preset paper-udacity --data RECORDING_DIR                            # docs/usage.md
    torchrun --nproc-per-node 2 train.py --data DATA --out runs/train/ddp                  # 2 processes, one policy

Under torchrun (--nproc-per-node N, and --nnodes/--rdzv-* across machines) the processes train one policy with
DistributedDataParallel (gloo on CPU, NCCL on GPU): each step's batch is shared out, rank 0 alone writes the
run folder, --resume works the same (with any number of processes); see README "Scaling out".

--core names the sequence core after the CNN. Every flag is a field of agent.training.config.TrainArgs (underscores
become dashes; --core is the field policy).
The training loop lives in agent/training/loop.py; this file only parses arguments and turns bad input into one line.
"""

from __future__ import annotations

import sys

from agent.training.config import TrainArgs, resolve
from agent.training.experiment import run
from common.cli import run_command

PROG = "python train.py"


def main(argv: list[str] | None = None) -> int:
    # the run installs its own stop-signal handling around the training (agent.training.distributed.joined)
    return run_command(TrainArgs, lambda a: run(resolve(a)), argv, prog=PROG, doc=__doc__, stop_signals=False)


if __name__ == "__main__":
    sys.exit(main())
