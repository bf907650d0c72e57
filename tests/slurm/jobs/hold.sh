#!/bin/bash
# Writes a file into the job's image on each tier, then waits for the
# harness, which meanwhile holds both images from outside the job.
#SBATCH -n1
source "$JOBS/lib.sh"
head -c 1M /dev/urandom >"$MONARCH_JOB_DIR/held"
head -c 1M /dev/urandom >"$SECOND_TIER/monarch-job$SLURM_JOB_ID/held"
touch "$OUT/started"
wait_file go 60
