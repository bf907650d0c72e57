#!/bin/bash
# One of two jobs of two users at once: read, then wait for the harness.
#SBATCH -n1
source "$JOBS/lib.sh"
record batch
read_epochs batch 1
touch "$OUT/read"
wait_file go 60
read_epochs batch.after 1
