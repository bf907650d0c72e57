#!/bin/bash
# Reads the dataset $DS for $EPOCHS epochs in the batch step, then in a
# nested `srun -n2` step, recording what each task saw.
#SBATCH -n2
source "$JOBS/lib.sh"
record batch
wait_job_file index # counted from the first read
read_epochs batch "${EPOCHS:-3}"
srun -n2 bash -c 'source "$JOBS/lib.sh"; record step.$SLURM_PROCID; read_epochs step.$SLURM_PROCID "${EPOCHS:-3}"'
echo "$?" >"$OUT/done"
