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
        back."""
        config = os.path.join(st.ROOT, "monarch-timeout.conf")
        with open(config, "w") as f:
            # The first tier's image also holds the job map: 100,000 files need more than 4M.
            f.write(st.read(st.CONFIG).replace("start_timeout = 20", "start_timeout = 5")
                    .replace("quota = 4M", "quota = 64M"))
        os.chmod(config, 0o644)
        # 100,000 files: indexing them takes a stager long enough (~0.2 s) for
        # stuck.sh to stop it before it is ready; the batch step's stager has
        # 5 s to be ready, ample even on a loaded machine.
        dataset = os.path.join(st.DATA, "many-files")
        if not os.path.exists(dataset + ".done"):
            for c in range(100):
                os.makedirs(os.path.join(dataset, f"c{c}"), 0o755, exist_ok=True)
                for i in range(1000):
                    open(os.path.join(dataset, f"c{c}", f"f{i}"), "w").close()
            open(dataset + ".done", "w").close()
        with st.plugstack_args(f"config={config}"):
            work = st.workdir(USER, "timeout")
            job = st.sbatch(USER, work, [f"--monarch-dataset={dataset}",
                                         st.job_script("stuck.sh")],
                            extra_env={"JOBS": st.JOBS})
            self.assertEqual(st.wait_job(job), "COMPLETED")
            out = st.read(os.path.join(work, f"slurm-{job}.out"))
            lines = [l for l in out.splitlines() if l.startswith("monarch: disabled")]
            self.assertEqual(lines, ["monarch: disabled for this job: the stager did not answer "
                                     "within 5 s (start_timeout in the configuration); reading "
                                     "from the PFS"], out)
            self.assertEqual(st.read(os.path.join(work, "step.env")), "")
            self.assertEqual(st.read(os.path.join(work, "step.stagers")), "",
                             "the stager that did not answer still runs")
            self.assertNoLeftovers(job)


if __name__ == "__main__":
    st.main()
