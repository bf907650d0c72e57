#!/bin/bash
# The batch step of a job whose stager hangs before it is ready (its reads of
# the configuration never complete, as on a dead file system): the step must
# have given up after start_timeout and run without Monarch.
#SBATCH -n1
source "$JOBS/lib.sh"
record step
