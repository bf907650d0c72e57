#!/bin/bash
# An example Slurm batch job that reads its dataset through Monarch.
#
# The only Monarch-specific line is --monarch-dataset: the training program
# itself is unchanged. Monarch copies the dataset to the nodes' local storage
# while the job runs, and every process of the job (this script, srun steps,
# DataLoader workers) reads the local copy once it is there, and the shared
# file system before that. At the end of the job the report
# monarch-job<ID>.txt/.json/.svg lands in the working directory (or in
# --monarch-report=DIR); the local copies are deleted.
#
#   sbatch --monarch-dataset=/scratch/$USER/imagenet-subset contrib/slurm/example-job.sh
#
# or, with the path written into the script, uncomment the #SBATCH line below
# (#SBATCH lines cannot expand variables: write the path out).
#
#SBATCH --job-name=monarch-example
#SBATCH --nodes=1
#SBATCH --ntasks=2
#SBATCH --time=00:10:00
# To use: remove one '#' and put your dataset's absolute path.
##SBATCH --monarch-dataset=/scratch/USER/imagenet-subset
# Each of Monarch's decisions on the tasks' stderr:
##SBATCH --monarch-verbose
set -euo pipefail

# Monarch tells the job's processes the dataset it stages; a program would
# simply open its usual paths. A job that runs without Monarch (the
# 'monarch: disabled ...' line above says why) gives the path as argument 1.
DATASET=${MONARCH_DATASET:-${1:-}}
if [[ -z $DATASET ]]; then
  echo "example-job: usage: sbatch --monarch-dataset=DIR $0 [DIR]" >&2
  exit 2
fi

# Three "epochs" over the whole dataset, as a training loop would: the first
# is served partly from the shared file system, the others from local storage.
for epoch in 1 2 3; do
  start=$(date +%s.%N)
  bytes=$(find "$DATASET" -type f -print0 | xargs -0 cat | wc -c)
  end=$(date +%s.%N)
  echo "epoch $epoch: $bytes bytes in $(echo "$end - $start" | bc) s"
done

# A nested step: two tasks reading at once, as data-parallel ranks would.
srun --ntasks=2 bash -c 'find "$0" -type f -print0 | sort -z | xargs -0 md5sum | md5sum |
  sed "s/^/rank $SLURM_PROCID: checksum of the dataset /"' "$DATASET"
