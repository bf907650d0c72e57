#!/bin/bash
# Stacks FUSE mounts in the job's own directory, as a hostile user would,
# then stops every daemon (SIGSTOP): X on a directory of the job's
# directory, Y over X's parent (X is reached only through Y now), Z on a
# directory inside Y, T on the job's directory itself. Each daemon serves a
# directory of $OUT/src with a marker file. Their pids go to $OUT/fuse.pids.
#SBATCH -n1
source "$JOBS/lib.sh"
dir=$MONARCH_JOB_DIR
mkdir -p "$dir/d/e"
mount_fuse() {  # mount_fuse SOURCE POINT
  "$PFSEMU" --source "$1" --mount "$2" --latency-us 0 --open-latency-us 0 --bandwidth-mbs 0
  pgrep -u "$(id -u)" -f -- "monarch-pfsemu --source $1 --mount $2 " >>"$OUT/fuse.pids"
}
mount_fuse "$OUT/src/x" "$dir/d/e"
mount_fuse "$OUT/src/y" "$dir/d"
mount_fuse "$OUT/src/z" "$dir/d/sub"
mount_fuse "$OUT/src/t" "$dir"
kill -STOP $(cat "$OUT/fuse.pids")
touch "$OUT/stacked"
