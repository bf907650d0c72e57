#!/bin/bash
# A hostile user's job: reads the dataset, tells the harness it runs, then,
# when asked, puts symbolic links where the job's end reads and writes:
# the report directory ($REPORTS) becomes a link to $ELSEWHERE, and the
# statistics file a link to $BAIT, in a job directory the stager can no
# longer write (so that its last statistics cannot replace the link).
#SBATCH -n1
source "$JOBS/lib.sh"
record batch
read_epochs batch 1
touch "$OUT/started"
wait_file go 60
if [[ -n ${REPORTS-} ]]; then
  mv "$REPORTS" "$REPORTS.moved"
  ln -s "$ELSEWHERE" "$REPORTS"
fi
if [[ -n ${BAIT-} ]]; then
  ln -sfn "$BAIT" "$MONARCH_JOB_DIR/stats.json"
  chmod 500 "$MONARCH_JOB_DIR"
fi
touch "$OUT/linked"
