"""Nothing predictable for another user to squat (issue 8, finding 6).
A tier directory that other users can write (mode 1777) is refused for
Slurm jobs: one line on the job's stderr, the job runs without Monarch, and
nothing is made there. A job without --monarch-dataset touches nothing in
the tiers, not even an entry under its own job id. And the plugin acts
only on what its records name: an entry at <tier>/monarch-job<ID> it did
not make is left alone, and Monarch is off for that job."""
import os
import pwd
import shutil
import subprocess

import slurmtest as st

USER = "monarchtest"


def plant(path, owner="monarchtest2"):
    """A directory of `owner` with a file in it, as a squatter would leave."""
    os.mkdir(path, 0o755)
    with open(os.path.join(path, "precious"), "w") as f:
        f.write("theirs\n")
    pw = pwd.getpwnam(owner)
    for p in (path, os.path.join(path, "precious")):
        os.chown(p, pw.pw_uid, pw.pw_gid)


def untouched(path):
    return os.path.isdir(path) and st.read(os.path.join(path, "precious")) == "theirs\n"


def disabled_lines(work, job):
    out = st.read(os.path.join(work, f"slurm-{job}.out"))
    return [l for l in out.splitlines() if l.startswith("monarch: disabled for this job: ")]


class Squat(st.SlurmTest):
    def test_world_writable_tier_refused(self):
        dataset = st.make_dataset("job")
        open_tier = os.path.join(st.TIER_ROOT, "open")
        shutil.rmtree(open_tier, ignore_errors=True)
        os.mkdir(open_tier)
        os.chmod(open_tier, 0o1777)
        config = st.config_variant("open-tier", paths={st.TIERS[0]: open_tier})
        try:
            with st.plugstack_args(f"config={config}"):
                work = st.workdir(USER, "open-tier")
                job = st.sbatch(USER, work, [f"--monarch-dataset={dataset}",
                                             st.job_script("env_only.sh")],
                                extra_env={"JOBS": st.JOBS})
                self.assertEqual(st.wait_job(job), "COMPLETED")
            lines = disabled_lines(work, job)
            self.assertEqual(len(lines), 2, lines)  # the batch step and the srun step
            self.assertIn(f"tier fast ({open_tier}) is world-writable (mode 1777)", lines[0])
            self.assertTrue(lines[0].endswith("; reading from the PFS"), lines[0])
            self.assertEqual(st.read(os.path.join(work, "batch.env")), "")
            self.assertEqual(os.listdir(open_tier), [], "Monarch made something in the tier")
            self.assertNoLeftovers(job)
        finally:
            shutil.rmtree(open_tier, ignore_errors=True)

    def test_no_option_no_action(self):
        work = st.workdir(USER, "squat-noflag")
        job = st.sbatch(USER, work, ["--hold", st.job_script("env_only.sh")],
                        extra_env={"JOBS": st.JOBS})
        planted = [os.path.join(t, f"monarch-job{job}") for t in st.TIERS]
        for p in planted:
            plant(p)
        try:
            subprocess.run(["scontrol", "release", str(job)], check=True)
            self.assertEqual(st.wait_job(job), "COMPLETED")
            for p in planted:
                self.assertTrue(untouched(p), f"{p} was changed by a job without Monarch")
            self.assertNotIn(f"monarch: job{job}:", st.slurmd_log())
        finally:
            for p in planted:
                shutil.rmtree(p, ignore_errors=True)

    def test_unrecorded_entry_left_alone(self):
        dataset = st.make_dataset("job")
        work = st.workdir(USER, "squat-unrecorded")
        job = st.sbatch(USER, work, ["--hold", f"--monarch-dataset={dataset}",
                                     st.job_script("env_only.sh")], extra_env={"JOBS": st.JOBS})
        planted = os.path.join(st.TIERS[0], f"monarch-job{job}")
        plant(planted)
        try:
            subprocess.run(["scontrol", "release", str(job)], check=True)
            self.assertEqual(st.wait_job(job), "COMPLETED")
            lines = disabled_lines(work, job)
            self.assertTrue(lines, "Monarch used a directory it did not make")
            self.assertIn(f"{planted} is there and Monarch has no record of making it", lines[0])
            self.assertTrue(untouched(planted), f"{planted} was changed")
            self.assertEqual(st.read(os.path.join(work, "batch.env")), "")
        finally:
            shutil.rmtree(planted, ignore_errors=True)
        self.assertNoLeftovers(job)


if __name__ == "__main__":
    st.main()
