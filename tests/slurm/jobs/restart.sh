#!/bin/bash
# Kills its own stager between two steps: the second step starts a new one,
# which keeps the copies the first one made.
#SBATCH -n1
source "$JOBS/lib.sh"
srun -n1 bash -c 'source "$JOBS/lib.sh"; record step0; read_epochs step0 1'
sleep 1  # the copies are made; stats.json is rewritten every 5 s
pid=$(pgrep -u "$(id -u)" -f -- "monarch-stager .*--job job$SLURM_JOB_ID ")
echo "$pid" >"$OUT/killed.pid"
kill -KILL $pid
while kill -0 $pid 2>/dev/null && ! grep -q '^State:.*Z' /proc/$pid/status; do sleep 0.1; done
srun -n1 bash -c 'source "$JOBS/lib.sh"; record step1; read_epochs step1 1'
