"""plugstack.conf arguments: with enabled=no the options are still accepted
(scripts keep working) but do nothing at all; an unknown argument is logged
by name, and jobs still run, with Monarch."""
import os

import slurmtest as st

USER = "monarchtest"


class PlugstackArgs(st.SlurmTest):
    def test_enabled_no(self):
        with st.plugstack_args(f"config={st.CONFIG} enabled=no"):
            work = st.workdir(USER, "disabled-plugin")
            # Not even checked: a dataset that does not exist is accepted.
            job = st.sbatch(USER, work, ["--monarch-dataset=/no/such/dataset",
                                         "--monarch-verbose", st.job_script("env_only.sh")],
                            extra_env={"JOBS": st.JOBS})
            watch = st.StagerWatch(job)
            watch.start()
            try:
                self.assertEqual(st.wait_job(job), "COMPLETED")
            finally:
                watch.stop()
            self.assertEqual(watch.max_count, 0)
            for tag in ("batch", "step"):
                self.assertEqual(st.read(os.path.join(work, f"{tag}.env")), "", tag)
            self.assertFalse(st.job_dirs(job))
            self.assertEqual([n for n in os.listdir(work) if n.startswith("monarch-")], [])
            self.assertNotIn("monarch", st.read(os.path.join(work, f"slurm-{job}.out")))
            out = st.run_as(USER, ["sbatch", "--help"]).stdout
            self.assertIn("--monarch-dataset", out)

    def test_unknown_argument(self):
        with st.plugstack_args(f"config={st.CONFIG} colour=blue"):
            dataset = st.make_dataset("job")
            work = st.workdir(USER, "unknown-arg")
            r = st.run_as(USER, ["sbatch", "--parsable", f"--monarch-dataset={dataset}",
                                 st.job_script("env_only.sh")], cwd=work,
                          extra_env={"JOBS": st.JOBS})
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("monarch: unknown plugstack argument 'colour' ignored", r.stderr)
            job = int(r.stdout.strip())
            self.assertEqual(st.wait_job(job), "COMPLETED")
            self.assertIn("monarch: unknown plugstack argument 'colour' ignored", st.slurmd_log())
            env = st.read(os.path.join(work, "batch.env"))
            self.assertIn(f"MONARCH_DATASET={dataset}", env)
            stats = st.report_json(work, job)
            self.assertGreater(st.stager_counter(stats, "copies"), 0)
            self.assertNoLeftovers(job)


if __name__ == "__main__":
    st.main()
