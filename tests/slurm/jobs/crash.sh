#!/bin/bash
# Reads, then kills its own stager and ends: nothing starts it again.
#SBATCH -n1
source "$JOBS/lib.sh"
read_epochs batch 1
wait_job_file stats.json # the report the epilog writes comes from it
pid=$(pgrep -u "$(id -u)" -f -- "monarch-stager .*--job job$SLURM_JOB_ID ")
echo "$pid" >"$OUT/killed.pid"
kill -KILL $pid
