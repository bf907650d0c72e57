#!/bin/bash
# A job whose tasks enter containers the way enroot does, as the user (a user
# namespace; tests/containers/enroot_start.py) with the hook the packages
# installed: $ROOT (Debian 12) reads the dataset, bound at /data, for 3
# epochs; $UNSERVED (a static program and no C library the hook can tell)
# reads a few of its files.
#SBATCH -n1
source "$JOBS/lib.sh"
wait_job_file index # counted from the first read
inside=/usr/local/lib/monarch
enter() {
  unshare --user --map-root-user --mount --pid --fork --propagation private \
    /usr/bin/python3 "$CONTAINERS/enroot_start.py" "$1" /etc/enroot/hooks.d/90-monarch.sh \
    --mount "$DS:/data:ro" --mount "$READER:$inside/reader.py:ro" \
    --mount "$COUNTS:$inside/pfs-counts:ro" -- "${@:2}"
}
export -f enter
export inside
srun -n1 bash -c 'enter "$ROOT" /usr/bin/python3 $inside/reader.py /data --mode read --epochs 3 \
  --stat --counts $inside/pfs-counts' >"$OUT/served.out" 2>"$OUT/served.err"
echo "$?" >"$OUT/served.rc"
srun -n1 bash -c 'enter "$UNSERVED" /bin/fnv $FILES' >"$OUT/unserved.out" 2>"$OUT/unserved.err"
echo "$?" >"$OUT/unserved.rc"
