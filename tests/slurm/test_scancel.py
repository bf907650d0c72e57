"""scancel in the middle of an epoch: the epilog stops the stager (which
still writes its final statistics and the report), removes the job's
directories on every tier, and the node goes back to idle, not drained."""
import os

import slurmtest as st

USER = "monarchtest"


class Scancel(st.SlurmTest):
    def test_scancel_mid_epoch(self):
        dataset = st.make_dataset("job")
        work = st.workdir(USER, "scancel")
        job = st.sbatch(USER, work, [f"--monarch-dataset={dataset}", st.job_script("read_forever.sh")],
                        extra_env={"DS": dataset, "JOBS": st.JOBS})
        st.wait_for(lambda: os.path.exists(os.path.join(work, "epoch1.done")), 60,
                    "the first epoch")
        st.wait_for(lambda: os.path.exists(os.path.join(work, "batch.e2.epoch1.md5")), 10,
                    "the second epoch to start")
        self.assertEqual(len(st.stagers(job)), 1, "no stager while the job reads")
        self.assertTrue(st.job_dirs(job))
        st.run_as(USER, ["scancel", str(job)], check=True)
        self.assertEqual(st.wait_job(job), "CANCELLED")
        self.assertNoLeftovers(job)
        self.assertEqual(st.node_state(), "idle")
        stats = st.report_json(work, job)
        self.assertTrue(stats["complete"], "the stager was killed instead of stopped")
        self.assertGreater(st.stager_counter(stats, "copies"), 0)


if __name__ == "__main__":
    st.main()
