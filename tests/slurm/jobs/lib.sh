# Sourced by the test jobs: what a task records for the harness, in the
# job's working directory ($OUT).
export LC_ALL=C
OUT=${OUT:-$PWD}

# record TAG: this task's Monarch environment, its uid, and the stagers of
# the job as the task sees them (with all their ids).
record() {
  env | grep -E '^(LD_PRELOAD|MONARCH_[A-Z_]*|APPTAINER[A-Z_]*|SINGULARITY[A-Z_]*)=' | sort >"$OUT/$1.env"
  id -u >"$OUT/$1.uid"
  ps -o ruid=,euid=,suid=,fsuid=,rgid=,egid=,sgid=,fsgid=,pid=,args= -C monarch-stager |
    grep -e "--job job$SLURM_JOB_ID " >"$OUT/$1.stagers" || true
}

# read_epochs TAG N [PAUSE]: reads every file of $DS with md5sum, N times.
read_epochs() {
  local e f
  for ((e = 1; e <= $2; e++)); do
    if [[ -n ${3-} ]]; then
      for f in $(find "$DS" -type f | sort); do md5sum "$f"; sleep "$3"; done >"$OUT/$1.epoch$e.md5"
    else
      find "$DS" -type f | sort | xargs md5sum >"$OUT/$1.epoch$e.md5"
    fi
  done
}

# wait_path PATH SECONDS: waits for PATH to exist (every 10 ms).
wait_path() {
  local i
  for ((i = 0; i < $2 * 100; i++)); do
    [[ -e $1 ]] && return 0
    sleep 0.01
  done
  echo "gave up waiting for $1" >&2
  return 1
}

# wait_job_file NAME: waits (60 s at most) for the stager to write NAME in
# the job's directory: "index" (its map: reads before it go to the PFS
# unseen) or "stats.json" (its first statistics).
wait_job_file() { wait_path "$MONARCH_JOB_DIR/$1" 60; }

# wait_file NAME [SECONDS]: waits for the harness to create $OUT/NAME.
wait_file() { wait_path "$OUT/$1" "${2:-60}"; }
