#!/bin/bash
# Makes the next stager of the job hang at start: its own stager killed, its
# log replaced by a FIFO that nobody reads (opening it for writing blocks).
# The srun step that follows must give up after start_timeout.
#SBATCH -n1
source "$JOBS/lib.sh"
pid=$(pgrep -u "$(id -u)" -f -- "monarch-stager .*--job job$SLURM_JOB_ID ")
kill -KILL $pid
while kill -0 $pid 2>/dev/null && ! grep -q '^State:.*Z' /proc/$pid/status; do sleep 0.1; done
rm -f "$MONARCH_JOB_DIR/stager.log"
mkfifo "$MONARCH_JOB_DIR/stager.log"
srun -n1 bash -c 'source "$JOBS/lib.sh"; record step'
