#!/bin/bash
# evlin.sh REC RUN OUT: replay (both references), offline and gains of a lineage's rounds
REC=$1; RUN=$2; OUT=$3; shift 3
R=${ROUNDS:-"0 1 2 3"}
CK=""; NM=""; for r in $R; do CK="$CK $RUN/r$r/best.pt"; NM="$NM r$r"; done
for ref in driver driver-or-middle; do
  .venv/bin/python evaluate.py --replay $REC --replay-span 0.8:1 --replay-reference $ref --checkpoint $CK --name $NM --workers 1 --threads 1 --no-video --no-progress --out $OUT/replay_$ref > $OUT.replay_$ref.log 2>&1
done
.venv/bin/python evaluate.py --data $REC --data-span 0.8:1 --checkpoint $CK --name $NM --out $OUT/offline --no-progress > $OUT.offline.log 2>&1
.venv/bin/python -m benchmarks.feedback_gains --data $REC --checkpoint $RUN/r0/best.pt $RUN/r3/best.pt > $OUT.gains.log 2>&1
