#!/bin/bash
# Tries to turn the epilog's cleanup against root: links in the job's own
# tier directories to things the user does not own, and a directory the
# harness (root) bind-mounts something onto.
#SBATCH -n1
source "$JOBS/lib.sh"
record batch
read_epochs batch 1
dir=$MONARCH_JOB_DIR
ln -s "$VICTIM" "$dir/evil-dir"
ln -s "$VICTIM/marker" "$dir/evil-file"
ln -s "$VICTIM" "$dir/data/evil-dir"
ln -s / "$dir/data/evil-root"
ln -s "$VICTIM" "$SECOND_TIER/monarch-job$SLURM_JOB_ID/evil-dir"
mkdir "$dir/mnt"
touch "$OUT/planted"
wait_file go 60
