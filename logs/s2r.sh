#!/bin/bash
while [ ! -f eval/lead_bikong2_L4_s1.gains.log ] || [ ! -s eval/lead_bikong2_L4_s1.gains.log ]; do sleep 30; done
for R in Abdullahfoysal__car-training-data Ahmed-SNP__Drive-data; do
  .venv/bin/python evaluate.py --data data/rec_$R --checkpoint checkpoints/udacity_sim2real_nac.pt --name sim2real --out eval/s2r_$R/offline --no-progress > eval/s2r_$R.offline.log 2>&1
done
.venv/bin/python evaluate.py --replay data/rec_Abdullahfoysal__car-training-data --checkpoint checkpoints/udacity_sim2real_nac.pt --name sim2real --workers 1 --threads 1 --no-video --no-progress --out eval/s2r_abdullah_replay > eval/s2r_abdullah_replay.log 2>&1
.venv/bin/python -m benchmarks.feedback_gains --data data/rec_Abdullahfoysal__car-training-data --checkpoint checkpoints/udacity_sim2real_nac.pt --span 0:1 > eval/s2r_abdullah_gains.log 2>&1
