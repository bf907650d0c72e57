#!/bin/bash
# Reads the dataset once, then waits for the harness.
#SBATCH -n1
source "$JOBS/lib.sh"
record batch
read_epochs batch 1
touch "$OUT/started"
wait_file go 60
