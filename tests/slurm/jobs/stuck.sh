#!/bin/bash
# Makes the next stager of the job hang at start: its own stager killed, and
# every new one stopped (SIGSTOP) the moment it appears, as a stager stuck on
# a dead file system would be. The srun step that follows must give up after
# start_timeout.
#SBATCH -n1
source "$JOBS/lib.sh"
pattern="monarch-stager .*--job job$SLURM_JOB_ID "
pid=$(pgrep -u "$(id -u)" -f -- "$pattern")
kill -KILL $pid
while kill -0 $pid 2>/dev/null && ! grep -q '^State:.*Z' /proc/$pid/status; do sleep 0.1; done
( while :; do pkill -STOP -u "$(id -u)" -f -- "$pattern"; sleep 0.005; done ) &
freezer=$!
srun -n1 bash -c 'source "$JOBS/lib.sh"; record step'
kill $freezer
