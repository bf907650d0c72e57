"""The epilog's cleanup, run as root, cannot be turned against root: a job
plants, inside its own tier directories, symbolic links to a root-owned
directory and file (and to /), and the test (as root) bind-mounts another
root-owned directory onto a directory inside the job's directory. After the
epilog every target is untouched, the mount is still there, and everything
else of the job is gone."""
import os
import pwd
import shutil
import subprocess

import slurmtest as st

USER = "monarchtest"


def mounted(path):
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == path for line in f)


def make_victim(name):
    d = os.path.join(st.ROOT, name)
    if mounted(d):
        subprocess.run(["umount", "-l", d], check=False)
    shutil.rmtree(d, ignore_errors=True)
    os.mkdir(d, 0o755)
    os.mkdir(os.path.join(d, "sub"), 0o755)
    for p in (os.path.join(d, "marker"), os.path.join(d, "sub", "marker")):
        with open(p, "w") as f:
            f.write("root's\n")
    return d


def intact(d):
    return (os.stat(d).st_uid == 0 and sorted(os.listdir(d)) == ["marker", "sub"]
            and st.read(os.path.join(d, "marker")) == "root's\n"
            and st.read(os.path.join(d, "sub", "marker")) == "root's\n")


class CleanupSafety(st.SlurmTest):
    def test_links_and_mounts_survive(self):
        dataset = st.make_dataset("job")
        victim = make_victim("victim")
        victim2 = make_victim("victim-mounted")
        work = st.workdir(USER, "cleanup")
        job = st.sbatch(USER, work, [f"--monarch-dataset={dataset}", st.job_script("plant.sh")],
                        extra_env={"DS": dataset, "JOBS": st.JOBS, "VICTIM": victim,
                                   "SECOND_TIER": st.TIERS[1]})
        st.wait_for(lambda: os.path.exists(os.path.join(work, "planted")), 60,
                    "the job to plant its links")
        job_dir = os.path.join(st.TIERS[0], f"monarch-job{job}")
        mount_point = os.path.join(job_dir, "mnt")
        self.assertEqual(os.readlink(os.path.join(job_dir, "evil-dir")), victim)
        subprocess.run(["mount", "--bind", victim2, mount_point], check=True)
        try:
            self.assertTrue(mounted(mount_point))
            open(os.path.join(work, "go"), "w").close()
            self.assertEqual(st.wait_job(job), "COMPLETED")
            st.wait_for(lambda: not st.stagers(job), 15, "the stager to go")
            st.wait_for(lambda: not os.path.lexists(os.path.join(job_dir, "evil-dir")), 15,
                        "the epilog's cleanup")
            self.assertTrue(intact(victim), f"{victim} was changed by the cleanup")
            self.assertTrue(intact(victim2), f"{victim2} was changed through the mount")
            self.assertTrue(mounted(mount_point), "the mount was removed")
            # Everything else of the job went: on the first tier only the
            # mount point (and the directory holding it) is left.
            self.assertEqual(os.listdir(job_dir), ["mnt"])
            self.assertFalse(os.path.lexists(os.path.join(st.TIERS[1], f"monarch-job{job}")))
            self.assertNotIn("drain", st.node_state())
            log = st.slurmd_log()
            self.assertIn(f"monarch: job{job}: removing {job_dir}:", log)
            self.assertIn("1 mount points left alone", log)
        finally:
            subprocess.run(["umount", mount_point], check=False)
            if not mounted(mount_point):  # never delete through the mount
                shutil.rmtree(job_dir, ignore_errors=True)
        self.assertTrue(intact(victim2))
        self.assertTrue(os.path.exists(os.path.join(work, f"monarch-job{job}.json")))

    def test_foreign_job_dir_is_replaced(self):
        """A monarch-job<ID> that is there before the job and not the user's
        (another user's, holding a link to root's files) is removed safely
        and replaced by the user's own."""
        dataset = st.make_dataset("job")
        victim = make_victim("victim-foreign")
        other = pwd.getpwnam("monarchtest2")
        work = st.workdir(USER, "foreign")
        job = st.sbatch(USER, work, ["--hold", f"--monarch-dataset={dataset}",
                                     st.job_script("env_only.sh")], extra_env={"JOBS": st.JOBS})
        squatted = os.path.join(st.TIERS[0], f"monarch-job{job}")
        os.mkdir(squatted, 0o755)
        os.symlink(victim, os.path.join(squatted, "evil-dir"))
        os.mkdir(os.path.join(squatted, "data"), 0o777)
        for d in (squatted, os.path.join(squatted, "data")):
            os.chown(d, other.pw_uid, other.pw_gid)
        # On the second tier a symbolic link in place of the directory.
        os.symlink(victim, os.path.join(st.TIERS[1], f"monarch-job{job}"))
        subprocess.run(["scontrol", "release", str(job)], check=True)
        self.assertEqual(st.wait_job(job), "COMPLETED")
        out = st.read(os.path.join(work, f"slurm-{job}.out"))
        self.assertNotIn("monarch: disabled", out)
        self.assertIn("MONARCH_JOB_DIR=" + squatted, st.read(os.path.join(work, "batch.env")))
        self.assertTrue(intact(victim), f"{victim} was changed")
        self.assertIn(f"{squatted} was there and not the job user's", st.slurmd_log())
        stats = st.report_json(work, job)
        self.assertGreater(st.stager_counter(stats, "copies"), 0)
        self.assertNoLeftovers(job)


if __name__ == "__main__":
    st.main()
