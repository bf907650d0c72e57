"""The tier quota holds (issue 8, finding 4): a job that writes straight
into its own tier directory, past the tier's quota, is stopped by the quota
(ENOSPC in the job), while a second job of another user on the same node,
reading its dataset through Monarch at the same time, gets its bytes and
its copies. The job's space is an image of the quota's size
(job_space = image, the default)."""
import os

import slurmtest as st

QUOTA_MB = 256  # [tier.slow] quota in monarch-test.conf
FILL_MB = QUOTA_MB + 144


class Quota(st.SlurmTest):
    def test_writing_past_the_quota(self):
        dataset = st.make_dataset("pair-b", seed=22)
        work_b = st.workdir("monarchtest2", "quota-reader")
        job_b = st.sbatch("monarchtest2", work_b,
                          [f"--monarch-dataset={dataset}", st.job_script("pair.sh")],
                          extra_env={"DS": dataset, "JOBS": st.JOBS})
        work_a = st.workdir("monarchtest", "quota-filler")
        job_a = st.sbatch("monarchtest", work_a,
                          [f"--monarch-dataset={dataset}", st.job_script("fill.sh")],
                          extra_env={"JOBS": st.JOBS, "SECOND_TIER": st.TIERS[1],
                                     "FILL_MB": str(FILL_MB)})
        st.wait_for(lambda: os.path.exists(os.path.join(work_b, "read")), 60, "the reader")
        st.wait_for(lambda: os.path.exists(os.path.join(work_a, "ready")), 60, "the filler")
        open(os.path.join(work_a, "go"), "w").close()
        st.wait_for(lambda: os.path.exists(os.path.join(work_a, "fill.size")), 120, "the fill")
        open(os.path.join(work_b, "go"), "w").close()
        self.assertEqual(st.wait_job(job_a), "COMPLETED")
        self.assertEqual(st.wait_job(job_b), "COMPLETED")

        rc = int(st.read(os.path.join(work_a, "dd.rc")))
        err = st.read(os.path.join(work_a, "dd.err"))
        size = int(st.read(os.path.join(work_a, "fill.size")))
        print(f"filler: dd exit {rc}, wrote {size >> 20} MiB of {FILL_MB}: {err.splitlines()[:1]}")
        self.assertNotEqual(rc, 0, "writing past the quota succeeded")
        self.assertRegex(err, "No space left on device|Disk quota exceeded")
        self.assertLessEqual(size, QUOTA_MB << 20)

        reference = st.reference_md5(dataset)
        for name in ("batch.epoch1.md5", "batch.after.epoch1.md5"):
            self.assertEqual(st.read(os.path.join(work_b, name)), reference, name)
        stats = st.report_json(work_b, job_b)
        self.assertGreater(st.stager_counter(stats, "copies"), 0)
        self.assertEqual(stats["cached"]["files"], stats["index"]["files"])
        self.assertNoLeftovers(job_a)
        self.assertNoLeftovers(job_b)


if __name__ == "__main__":
    st.main()
