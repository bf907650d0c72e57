#!/bin/bash
# Probes the job's stager from inside the job: its pid, the task's own file
# limit, and whether a task of the same user can ptrace it (strace -p).
#SBATCH -n1
source "$JOBS/lib.sh"
ulimit -Sn >"$OUT/task.nofile"
pid=$(pgrep -u "$(id -u)" -f -- "monarch-stager .*--job job$SLURM_JOB_ID ")
echo "$pid" >"$OUT/stager.pid"
timeout 5 strace -p "$pid" -e trace=none -o /dev/null 2>"$OUT/strace.err"
echo $? >"$OUT/strace.rc"
touch "$OUT/probed"
wait_file go 60
