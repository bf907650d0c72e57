#!/bin/bash
# Run 0 leaves a mark in its tier directories and waits (the harness crashes
# the node meanwhile); the run after the requeue says whether it found it.
#SBATCH -n1
source "$JOBS/lib.sh"
if [[ ${SLURM_RESTART_COUNT:-0} == 0 ]]; then
  touch "$MONARCH_JOB_DIR/left-by-run0" "$SECOND_TIER/monarch-job$SLURM_JOB_ID/left-by-run0"
  touch "$OUT/run0"
  sleep 300
else
  if [[ -e $MONARCH_JOB_DIR/left-by-run0 || -e $SECOND_TIER/monarch-job$SLURM_JOB_ID/left-by-run0 ]]
  then echo yes; else echo no; fi >"$OUT/run1.adopted"
fi
