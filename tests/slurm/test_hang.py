"""Root never waits on a mount a user controls (issue 8, finding 7): a job
covers its tier directory with a FUSE mount whose daemon never answers.
The next step starts at once, without Monarch (one line says why); the
epilog ends within seconds, writes no report through the dead mount, and
detaches it; the node stays idle and clean."""
import os
import re
import signal

import slurmtest as st

USER = "monarchtest"


class Hang(st.SlurmTest):
    def test_dead_fuse_mount_on_the_job_directory(self):
        dataset = st.make_dataset("job")
        work = st.workdir(USER, "hang")
        job = st.sbatch(USER, work, [f"--monarch-dataset={dataset}", st.job_script("hang.sh")],
                        extra_env={"DS": dataset, "JOBS": st.JOBS, "PFSEMU": st.PFSEMU})
        try:
            self.assertEqual(st.wait_job(job, timeout=120), "COMPLETED")
        finally:
            pid_file = os.path.join(work, "fuse.pid")
            if os.path.exists(pid_file):
                try:
                    os.kill(int(st.read(pid_file)), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
        start, end = (float(x) for x in st.read(os.path.join(work, "step.times")).split())
        print(f"the step after the mount started and ended in {end - start:.2f} s")
        self.assertLess(end - start, 15)
        out = st.read(os.path.join(work, f"slurm-{job}.out"))
        self.assertIn("is not as Monarch made it (something is mounted on it", out)
        log = st.slurmd_log()
        self.assertIn(f"monarch: job{job}: no report: the job mounted something on its "
                      "directory", log)
        took = re.search(rf"monarch: job{job}: epilog done in ([0-9.]+) s", log)
        self.assertTrue(took)
        self.assertLess(float(took.group(1)), 5)
        self.assertNoLeftovers(job)


if __name__ == "__main__":
    st.main()
