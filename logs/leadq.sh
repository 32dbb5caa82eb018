#!/bin/bash
# leadq.sh "REC:NAME:SEED ..." : train --latency-steps 4 then evaluate, one after another
for job in $1; do
  IFS=: read REC NAME S <<< "$job"
  RUN=runs/lead/${NAME}_L4_s$S
  [ -f $RUN/metrics.json ] || .venv/bin/python train.py --data data/rec_$REC --latency-steps 4 --seed $S --out $RUN --threads 1 --no-progress > logs/lead_${NAME}_L4_s$S.log 2>&1
  logs/evlead.sh data/rec_$REC $RUN eval/lead_${NAME}_L4_s$S
done
