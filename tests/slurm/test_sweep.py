"""Leftovers are swept (issue 8, finding 5). The node crashes during a job
(slurmd and every process of the job killed at once, the node set DOWN)
and slurmd starts again clean (slurmd -c, as after a reboot: it knows of
no job), so the job's epilog never runs; its tier directories stay, and
Slurm requeues the job. When slurmd starts, Monarch sweeps what the job
left (the job no longer runs on the node); the job's next run starts from
nothing, without adopting the first run's files. Meanwhile another user
runs the installed stager as `monarch-stager --job job<ID>` (issue 23,
item 6): it neither keeps the job's leftovers from the sweep nor is stopped
by the sweep or the job's epilog."""
import fcntl
import os
import pwd
import signal
import subprocess

import slurmtest as st

USER = "monarchtest"
OTHER = "monarchtest2"


def start_impostor(job):
    """The installed stager run by OTHER for `job`, blocked opening its
    configuration (a FIFO nobody writes). Returns its pid."""
    pw = pwd.getpwnam(OTHER)
    fifo = os.path.join(st.ROOT, "impostor.fifo")
    if os.path.lexists(fifo):
        os.unlink(fifo)
    os.mkfifo(fifo, 0o600)
    os.chown(fifo, pw.pw_uid, pw.pw_gid)
    subprocess.Popen([st.RUNUSER, "-u", OTHER, "--", st.STAGER, "--job", f"job{job}", "--dataset",
                      "/nonexistent", "--config", fifo], cwd="/", env=st.user_env(OTHER),
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL)
    found = st.wait_for(lambda: [s for s in st.stagers(job) if s["uids"][0] == pw.pw_uid], 10,
                        "the other user's stager to start")
    return found[0]["pid"]


def running(pid):
    """Alive, neither a zombie nor stopped."""
    try:
        state = st.read(f"/proc/{pid}/status").split("\nState:\t")[1][0]
    except (OSError, IndexError):
        return False
    return state not in "ZTt"


def kill_job_processes(job, uid):
    """Everything of the job: its slurmstepd (root's) and the user's processes."""
    for pid, _, status, argv in st.processes():
        owner = int(status.split("\nUid:\t")[1].split()[0])
        if owner == uid or argv[0].startswith(f"slurmstepd: [{job}.".encode()):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class Sweep(st.SlurmTest):
    def test_crash_then_requeue(self):
        dataset = st.make_dataset("job")
        work = st.workdir(USER, "sweep")
        job = st.sbatch(USER, work, ["--requeue", f"--monarch-dataset={dataset}",
                                     st.job_script("requeue.sh")],
                        extra_env={"JOBS": st.JOBS, "SECOND_TIER": st.TIERS[1]})
        st.wait_for(lambda: os.path.exists(os.path.join(work, "run0")), 60, "the first run")
        impostor = start_impostor(job)
        try:
            self.crash_then_requeue(job, work, impostor)
        finally:
            try:
                os.kill(impostor, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def crash_then_requeue(self, job, work, impostor):
        # The crash: slurmd and the job die at once; no epilog runs.
        os.kill(int(st.read(st.SLURMD_PID)), signal.SIGKILL)
        kill_job_processes(job, pwd.getpwnam(USER).pw_uid)
        subprocess.run(["scontrol", "update", f"NodeName={st.HOST}", "State=DOWN",
                        "Reason=monarch-crash-test"], check=True)
        st.wait_for(lambda: st.job_state(job) == "PENDING", 60, "the job to be requeued")
        self.assertTrue(st.job_dirs(job), "the crash left nothing to sweep")
        # slurmd starts again: the sweep runs before any job.
        subprocess.run(["slurmd", "-c"], check=True, env=dict(os.environ, SLURM_CONF=st.SLURM_CONF))
        st.wait_for(lambda: f"monarch: job{job}: swept from tier fast" in st.slurmd_log(), 30,
                    "the sweep at slurmd start")
        self.assertTrue(running(impostor), "the sweep stopped another user's process")
        # Back in service (ReturnToService=2 may have done it already).
        subprocess.run(["scontrol", "update", f"NodeName={st.HOST}", "State=RESUME"],
                       capture_output=True)
        # A requeued job waits 120 s before it may start again: not here.
        subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=True)
        self.assertEqual(st.wait_job(job, timeout=120), "COMPLETED")
        self.assertEqual(st.read(os.path.join(work, "run1.adopted")).strip(), "no",
                         "the requeued run found the first run's files")
        self.assertIn(f"monarch: job{job}: swept from tier slow", st.slurmd_log())
        self.assertTrue(running(impostor), "the epilog stopped another user's process")
        os.kill(impostor, signal.SIGKILL)  # a stager of the job to the check below
        self.assertNoLeftovers(job)

    def test_a_step_holds_its_record(self):
        """Each step's slurmstepd holds the job's record on every tier (a
        shared lock) while it lives: a sweep by another job's end keeps the
        job even before the step's process title names it (under Slurm 24.11
        such a sweep removed the space of a step starting on the node)."""
        dataset = st.make_dataset("job")
        work = st.workdir(USER, "sweep-held")
        job = st.sbatch(USER, work, [f"--monarch-dataset={dataset}", st.job_script("wait_go.sh")],
                        extra_env={"DS": dataset, "JOBS": st.JOBS})
        try:
            st.wait_for(lambda: os.path.exists(os.path.join(work, "started")), 60, "the job")
            for tier in st.TIERS:
                with open(os.path.join(tier, ".monarch", "jobs", f"job{job}")) as f:
                    with self.assertRaises(BlockingIOError, msg=f"{tier}: the record is not held"):
                        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            open(os.path.join(work, "go"), "w").close()
        self.assertEqual(st.wait_job(job), "COMPLETED")
        self.assertNoLeftovers(job)


if __name__ == "__main__":
    st.main()
