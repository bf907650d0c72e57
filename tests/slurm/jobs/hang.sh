#!/bin/bash
# Covers the job's own directory with a FUSE mount whose daemon then stops
# answering (SIGSTOP), as a broken or hostile one would, then starts a step:
# neither the step's start nor the job's end may wait on it.
#SBATCH -n1
source "$JOBS/lib.sh"
"$PFSEMU" --source "$DS" --mount "$MONARCH_JOB_DIR" --latency-us 0 --open-latency-us 0 \
  --bandwidth-mbs 0
pid=$(pgrep -u "$(id -u)" -f -- "monarch-pfsemu .*--mount $MONARCH_JOB_DIR")
echo "$pid" >"$OUT/fuse.pid"
kill -STOP "$pid"
sleep 1.5  # the kernel's cached attributes of the mount expire after 1 s
start=$(date +%s.%N)
srun -n1 bash -c 'source "$JOBS/lib.sh"; record step'
echo "$start $(date +%s.%N)" >"$OUT/step.times"
