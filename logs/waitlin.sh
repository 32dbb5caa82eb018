#!/bin/bash
# waitlin.sh S: wait for the abdullah lineage seed S to finish, then evaluate it
S=$1
while [ ! -f runs/rdagger/abdullah_s$S/r3/metrics.json ]; do sleep 30; done
logs/evlin.sh data/rec_Abdullahfoysal__car-training-data runs/rdagger/abdullah_s$S eval/abdullah_s$S
