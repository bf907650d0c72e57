"""The job's end, run as root, cannot be turned against root: a job plants,
inside its own tier directories, symbolic links to a root-owned directory
and file (and to /), and the test (as root) bind-mounts another root-owned
directory onto a directory inside the job's directory. After the epilog
every target is untouched, the mount was detached (not entered), and
everything of the job is gone: in image mode (the job's image detached and
thrown away) and in directory mode (the directory moved to the trash and
deleted there by monarch-purge, which follows no link)."""
import os
import shutil
import subprocess

import slurmtest as st

USER = "monarchtest"


def mounted(path):
    return path in st.mounts_below(path)


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
    def links_and_mounts(self, label):
        dataset = st.make_dataset("job")
        victim = make_victim("victim")
        victim2 = make_victim("victim-mounted")
        work = st.workdir(USER, "cleanup-" + label)
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
            st.wait_for(lambda: not st.job_dirs(job) and not st.job_state_files(job), 30,
                        "the job's directories to go")
            st.wait_for(lambda: not st.monarch_processes(), 60, "the purge to finish")
            self.assertTrue(intact(victim), f"{victim} was changed by the cleanup")
            self.assertTrue(intact(victim2), f"{victim2} was changed through the mount")
            self.assertFalse(mounted(mount_point), "the job's mount is still there")
            self.assertEqual(st.mounts_below(st.TIER_ROOT), [])
            self.assertNotIn("drain", st.node_state())
            self.assertIn(f"monarch: job{job}: tier fast: detached ", st.slurmd_log())
        finally:
            subprocess.run(["umount", "-l", mount_point], check=False, capture_output=True)
        self.assertTrue(intact(victim2))
        self.assertTrue(os.path.exists(os.path.join(work, f"monarch-job{job}.json")))

    def test_image(self):
        self.links_and_mounts("image")

    def test_directory(self):
        config = st.config_variant("directory", general={"job_space": "directory"})
        with st.plugstack_args(f"config={config}"):
            self.links_and_mounts("directory")
            st.assert_clean(self)


if __name__ == "__main__":
    st.main()
