#!/bin/bash
# Stacks FUSE mounts in the job's own directory, as a hostile user would,
# then stops every daemon (SIGSTOP). Each covers the way to the one before:
# Z on d/e/f, X on d/e, Y on d (Z is now reached only through Y and X),
# T on the job's directory itself. Each daemon serves a directory of
# $OUT/src with a marker file. allow_other (the harness allows it in
# /etc/fuse.conf, as many sites do): root's lookups reach the daemons too.
# Their pids go to $OUT/fuse.pids.
#SBATCH -n1
source "$JOBS/lib.sh"
set -e
dir=$MONARCH_JOB_DIR
mkdir -p "$dir/d/e/f"
mount_fuse() {  # mount_fuse SOURCE POINT
  "$PFSEMU" --source "$1" --mount "$2" --latency-us 0 --open-latency-us 0 --bandwidth-mbs 0 \
    --allow-other
  pgrep -u "$(id -u)" -f -- "monarch-pfsemu --source $1 --mount $2 " >>"$OUT/fuse.pids"
}
mount_fuse "$OUT/src/z" "$dir/d/e/f"
mount_fuse "$OUT/src/x" "$dir/d/e"
mount_fuse "$OUT/src/y" "$dir/d"
mount_fuse "$OUT/src/t" "$dir"
kill -STOP $(cat "$OUT/fuse.pids")
touch "$OUT/stacked"
