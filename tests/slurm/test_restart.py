"""A stager that dies during the job (here: killed by its own user between
two steps) is started again by the next step; the new one keeps the copies
the first one made. Never two at once."""
import os

import slurmtest as st

USER = "monarchtest"


class Restart(st.SlurmTest):
    def test_next_step_restarts_the_stager(self):
        dataset = st.make_dataset("job")
        reference = st.reference_md5(dataset)
        work = st.workdir(USER, "restart")
        job = st.sbatch(USER, work, [f"--monarch-dataset={dataset}", st.job_script("restart.sh")],
                        extra_env={"DS": dataset, "JOBS": st.JOBS})
        watch = st.StagerWatch(job)
        watch.start()
        try:
            self.assertEqual(st.wait_job(job), "COMPLETED")
        finally:
            watch.stop()
        out = st.read(os.path.join(work, f"slurm-{job}.out"))
        self.assertNotIn("monarch: disabled", out)
        killed = int(st.read(os.path.join(work, "killed.pid")))
        self.assertIn(killed, watch.seen)
        self.assertEqual(len(watch.seen), 2, f"stagers: {list(watch.seen.values())}")
        self.assertEqual(watch.max_count, 1)
        for step in ("step0", "step1"):
            self.assertEqual(st.read(os.path.join(work, f"{step}.epoch1.md5")), reference)
            self.assertEqual(len(st.read(os.path.join(work, f"{step}.stagers")).splitlines()), 1)
        stats = st.report_json(work, job)
        self.assertTrue(stats["complete"])
        self.assertGreater(st.stager_counter(stats, "adopted"), 0,
                           "the second stager did not keep the first one's copies")
        self.assertNoLeftovers(job)

    def test_stager_crash_before_the_end(self):
        """Killed and not restarted: the epilog finds no stager, still writes
        the report from the last statistics (not complete) and cleans up."""
        dataset = st.make_dataset("job")
        work = st.workdir(USER, "crash")
        job = st.sbatch(USER, work, [f"--monarch-dataset={dataset}", st.job_script("crash.sh")],
                        extra_env={"DS": dataset, "JOBS": st.JOBS})
        self.assertEqual(st.wait_job(job), "COMPLETED")
        self.assertTrue(st.read(os.path.join(work, "killed.pid")).strip())
        stats = st.report_json(work, job)
        self.assertFalse(stats["complete"])
        self.assertNoLeftovers(job)
        self.assertNotIn(f"monarch: job{job}: stopped", st.slurmd_log())


if __name__ == "__main__":
    st.main()
