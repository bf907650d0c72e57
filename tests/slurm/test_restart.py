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
        self.assertEqual(watch.max_count, 1)
        # Each step saw one stager: the first step the one killed, the second
        # a new one (the watch samples every 50 ms and may miss a stager that
        # lives only through a short step).
        pids = {}
        for step in ("step0", "step1"):
            self.assertEqual(st.read(os.path.join(work, f"{step}.epoch1.md5")), reference)
            lines = st.read(os.path.join(work, f"{step}.stagers")).splitlines()
            self.assertEqual(len(lines), 1, f"{step} saw stagers {lines}")
            pids[step] = int(lines[0].split()[8])
        self.assertEqual(pids["step0"], killed)
        self.assertNotEqual(pids["step1"], killed, "the second step ran without a new stager")
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
