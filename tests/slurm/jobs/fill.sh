#!/bin/bash
# Writes $FILL_MB MiB straight into the job's directory on the second tier,
# past the tier's quota, when the harness says go.
#SBATCH -n1
source "$JOBS/lib.sh"
dir=$SECOND_TIER/monarch-job$SLURM_JOB_ID
touch "$OUT/ready"
wait_file go 60
dd if=/dev/zero of="$dir/fill" bs=1M count="$FILL_MB" 2>"$OUT/dd.err"
echo $? >"$OUT/dd.rc"
stat -c %s "$dir/fill" >"$OUT/fill.size"
