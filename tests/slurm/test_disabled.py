"""When the stager cannot start (here: the dataset is gone when the job
starts), the job runs without Monarch: rank 0 of each step prints one line
to the job's stderr, the tasks' environment is left as it was, and the
epilog still cleans up."""
import os
import shutil
import subprocess

import slurmtest as st

USER = "monarchtest"


class Disabled(st.SlurmTest):
    def test_stager_error_disables_the_job(self):
        dataset = os.path.join(st.DATA, "vanishing")
        shutil.rmtree(dataset, ignore_errors=True)
        os.mkdir(dataset, 0o755)
        work = st.workdir(USER, "disabled")
        job = st.sbatch(USER, work, ["--hold", "-n2", f"--monarch-dataset={dataset}",
                                     "--wrap", "srun -n2 true; env | grep -E '^(LD_PRELOAD|MONARCH)' > batch.env; true"])
        os.rmdir(dataset)
        subprocess.run(["scontrol", "release", str(job)], check=True)
        self.assertEqual(st.wait_job(job), "COMPLETED")
        out = st.read(os.path.join(work, f"slurm-{job}.out"))
        lines = [l for l in out.splitlines() if l.startswith("monarch: disabled for this job: ")]
        # The batch step and the srun step: one line each, from rank 0 only.
        self.assertEqual(len(lines), 2, out)
        for line in lines:
            self.assertIn(dataset, line)
            self.assertTrue(line.endswith("; reading from the PFS"), line)
        self.assertEqual(st.read(os.path.join(work, "batch.env")), "")
        self.assertNoLeftovers(job)

    def test_start_timeout(self):
        """A stager that does not answer within start_timeout is stopped,
        and the step runs without Monarch, its inherited environment taken
        back. The stager hangs on its configuration file, on a file system
        whose reads by the stager never complete (slurmstepd reads it)."""
        if not os.path.exists(st.PFSEMU):
            self.skipTest("no monarch-pfsemu in the build tree")
        os.makedirs(st.DATA, exist_ok=True)
        with open(os.path.join(st.DATA, "monarch-timeout.conf"), "w") as f:
            f.write(st.read(st.CONFIG).replace("start_timeout = 20", "start_timeout = 2"))
        os.chmod(os.path.join(st.DATA, "monarch-timeout.conf"), 0o644)
        pfs = st.Pfs(stall_comm="monarch-stager")
        self.addCleanup(pfs.close)
        dataset = st.make_dataset("job")
        with st.plugstack_args(f"config={pfs.dataset('monarch-timeout.conf')}"):
            work = st.workdir(USER, "timeout")
            job = st.sbatch(USER, work, [f"--monarch-dataset={dataset}",
                                         st.job_script("stuck.sh")],
                            extra_env={"JOBS": st.JOBS})
            self.assertEqual(st.wait_job(job), "COMPLETED")
            out = st.read(os.path.join(work, f"slurm-{job}.out"))
            lines = [l for l in out.splitlines() if l.startswith("monarch: disabled")]
            self.assertEqual(lines, ["monarch: disabled for this job: the stager did not answer "
                                     "within 2 s (start_timeout in the configuration); reading "
                                     "from the PFS"], out)
            self.assertEqual(st.read(os.path.join(work, "step.env")), "")
            # The stager waits in a read the file system never answers: the
            # kernel lets it die only when the request ends. It has SIGKILL
            # pending, and goes once the file system answers (here: unmounted).
            for stager in st.stagers(job):
                pid = stager["pid"]
                with open(f"/proc/{pid}/status") as f:
                    pending = dict(l.split(":", 1) for l in f.read().splitlines())["ShdPnd"]
                self.assertTrue(int(pending, 16) & (1 << (9 - 1)), f"stager {pid}: no SIGKILL")
            pfs.close()
            self.assertNoLeftovers(job)


if __name__ == "__main__":
    st.main()
