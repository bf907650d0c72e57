"""A job without --monarch-dataset: no stager, no tier directory, no
report, and the tasks' LD_PRELOAD (set or not) is exactly the user's."""
import os

import slurmtest as st

USER = "monarchtest"
USER_PRELOAD = "/lib/x86_64-linux-gnu/libm.so.6"


class NoFlag(st.SlurmTest):
    def run_job(self, name, extra_env):
        work = st.workdir(USER, name)
        job = st.sbatch(USER, work, [st.job_script("env_only.sh")],
                        extra_env=dict(JOBS=st.JOBS, **extra_env))
        dirs_seen = []
        watch = st.StagerWatch(job)
        watch.start()
        try:
            st.wait_for(lambda: dirs_seen.extend(st.job_dirs(job)) or not st.squeue_has(job),
                        60, f"job {job}")
            state = st.wait_job(job)
        finally:
            watch.stop()
        self.assertEqual(state, "COMPLETED")
        self.assertEqual(watch.max_count, 0, "a stager ran for a job without the option")
        self.assertEqual(dirs_seen, [], "tier directories appeared")
        self.assertEqual([n for n in os.listdir(work) if n.startswith("monarch-")], [])
        out = st.read(os.path.join(work, f"slurm-{job}.out"))
        self.assertNotIn("monarch", out)
        envs = {}
        for tag in ("batch", "step"):
            envs[tag] = st.read_env(os.path.join(work, f"{tag}.env"))
            self.assertEqual(st.read(os.path.join(work, f"{tag}.stagers")), "")
        return envs

    def test_user_preload_unchanged(self):
        for tag, env in self.run_job("noflag-preload", {"LD_PRELOAD": USER_PRELOAD}).items():
            self.assertEqual(env, {"LD_PRELOAD": USER_PRELOAD}, tag)

    def test_no_preload_stays_unset(self):
        for tag, env in self.run_job("noflag-plain", {}).items():
            self.assertEqual(env, {}, tag)


if __name__ == "__main__":
    st.main()
