#!/bin/bash
# queue.sh WAITPID NAME... : after WAITPID exits, the default command on each data/rec_NAME in turn
W=$1; shift
while kill -0 $W 2>/dev/null; do sleep 10; done
for n in "$@"; do
  .venv/bin/python train.py --data data/rec_$n --out runs/recipe/$n --threads 1 --no-progress > logs/recipe_$n.log 2>&1
done
