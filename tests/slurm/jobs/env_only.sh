#!/bin/bash
# Records the environment and stagers of the batch step and of a nested step.
#SBATCH -n1
source "$JOBS/lib.sh"
record batch
srun -n1 bash -c 'source "$JOBS/lib.sh"; record step'
