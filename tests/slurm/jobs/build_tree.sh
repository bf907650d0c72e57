#!/bin/bash
# Builds, in the job's directory on the second tier, a chain of $DEPTH
# directories with 255-character names and a flat directory of $ENTRIES
# entries, then ends: the epilog must clean up in bounded time and memory.
#SBATCH -n1
source "$JOBS/lib.sh"
python3 "$JOBS/build_tree.py" "$SECOND_TIER/monarch-job$SLURM_JOB_ID/tree" "$DEPTH" "$ENTRIES" \
  >"$OUT/built" 2>&1
