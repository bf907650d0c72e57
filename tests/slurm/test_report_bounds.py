"""The report at a job's end is bounded (issue 8, finding 2): a job that
leaves a 1.5 GB statistics file in place of the stager's gets one clear
line where its report would be (monarch-job<ID>.txt), monarch-report never
reads the file, and the epilog ends at once."""
import os
import re

import slurmtest as st

USER = "monarchtest"


class ReportBounds(st.SlurmTest):
    def test_huge_statistics(self):
        dataset = st.make_dataset("job")
        work = st.workdir(USER, "huge-stats")
        job = st.sbatch(USER, work, [f"--monarch-dataset={dataset}", st.job_script("huge_stats.sh")],
                        extra_env={"DS": dataset, "JOBS": st.JOBS})
        self.assertEqual(st.wait_job(job), "COMPLETED")
        note = st.read(os.path.join(work, f"monarch-job{job}.txt"))
        print(note.strip())
        self.assertEqual(len(note.splitlines()), 1, note)
        self.assertRegex(note, r"^monarch-report: .*/stats\.json: 1\.5 GiB of statistics, above the "
                               r"16\.0 MiB a job's statistics can take: not read")
        self.assertFalse(os.path.exists(os.path.join(work, f"monarch-job{job}.json")))
        took = re.search(rf"monarch: job{job}: epilog done in ([0-9.]+) s", st.slurmd_log())
        self.assertTrue(took)
        self.assertLess(float(took.group(1)), 5)
        self.assertNoLeftovers(job)


if __name__ == "__main__":
    st.main()
