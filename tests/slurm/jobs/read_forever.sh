#!/bin/bash
# Reads the dataset slowly, epoch after epoch, until it is cancelled.
#SBATCH -n1
source "$JOBS/lib.sh"
record batch
for ((e = 1; ; e++)); do
  read_epochs "batch.e$e" 1 0.05
  touch "$OUT/epoch$e.done"
done
