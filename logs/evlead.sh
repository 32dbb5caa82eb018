#!/bin/bash
# evlead.sh REC RUN OUT: wait for RUN/metrics.json, then replay both references and offline
REC=$1; RUN=$2; OUT=$3
while [ ! -f $RUN/metrics.json ]; do sleep 20; done
for ref in driver driver-or-middle; do
  .venv/bin/python evaluate.py --replay $REC --replay-span 0.8:1 --replay-reference $ref --checkpoint $RUN/best.pt --name lead --workers 1 --threads 1 --no-video --no-progress --out $OUT/replay_$ref > $OUT.replay_$ref.log 2>&1
done
.venv/bin/python evaluate.py --data $REC --data-span 0.8:1 --checkpoint $RUN/best.pt --name lead --out $OUT/offline --no-progress > $OUT.offline.log 2>&1
.venv/bin/python -m benchmarks.feedback_gains --data $REC --checkpoint $RUN/best.pt > $OUT.gains.log 2>&1
