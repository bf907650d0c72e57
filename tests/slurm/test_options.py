"""The options: listed by --help of sbatch, salloc and srun; a bad
--monarch-dataset or --monarch-report is refused at submission, in the
user's own context, with a message naming the path and the reason."""
import os
import pwd
import shutil
import subprocess

import slurmtest as st

USER = "monarchtest"


class Options(st.SlurmTest):
    @classmethod
    def setUpClass(cls):
        cls.work = st.workdir(USER, "options")
        cls.dataset = st.make_dataset("options")
        # A directory this user cannot read: another user's, mode 0700.
        other = pwd.getpwnam("monarchtest2")
        cls.private = os.path.join(st.DATA, "private-of-monarchtest2")
        shutil.rmtree(cls.private, ignore_errors=True)
        os.mkdir(cls.private, 0o700)
        os.chown(cls.private, other.pw_uid, other.pw_gid)
        cls.regular = os.path.join(cls.work, "a-file")
        with open(cls.regular, "w") as f:
            f.write("not a directory\n")

    def test_help_lists_the_options(self):
        for tool in ("sbatch", "salloc", "srun"):
            out = st.run_as(USER, [tool, "--help"]).stdout
            for option in ("--monarch-dataset=DIR", "--monarch-report=DIR", "--monarch-verbose"):
                self.assertIn(option, out, f"{tool} --help does not list {option}")
            self.assertIn("node-local storage", out, f"{tool} --help lacks the usage text")
            self.assertIn("MONARCH_LOG=1", out)

    def refused(self, option, value, reason):
        """sbatch, srun and salloc all refuse; nothing is queued."""
        before = subprocess.run(["squeue", "-h", "-u", USER], capture_output=True,
                                text=True).stdout
        for argv in (["sbatch", "--wrap", "true"], ["srun", "-n1", "-t", "1", "true"],
                     ["salloc", "-n1", "-t", "1", "true"]):
            r = st.run_as(USER, [argv[0], f"--{option}={value}"] + argv[1:], cwd=self.work)
            self.assertNotEqual(r.returncode, 0, f"{argv[0]} accepted --{option}={value}")
            self.assertIn(f"monarch: --{option}={value}: {reason}", r.stderr,
                          f"{argv[0]}: message lacks the path or the reason:\n{r.stderr}")
        after = subprocess.run(["squeue", "-h", "-u", USER], capture_output=True, text=True).stdout
        self.assertEqual(before, after, "a refused submission queued a job")

    def test_missing_directory(self):
        self.refused("monarch-dataset", os.path.join(st.DATA, "no-such-dataset"),
                     "no such directory")

    def test_regular_file(self):
        self.refused("monarch-dataset", self.regular, "not a directory")

    def test_relative_path(self):
        self.refused("monarch-dataset", "data/train", "not an absolute path")

    def test_unreadable_directory(self):
        self.refused("monarch-dataset", self.private, "you cannot read it")

    def test_dataset_on_a_tier(self):
        self.refused("monarch-dataset", st.TIERS[1], "overlaps the node-local tier")

    def test_report_dir(self):
        self.refused("monarch-report", "reports", "not an absolute path")
        self.refused("monarch-report", os.path.join(self.work, "no-such-dir"), "no such directory")

    def test_verbose_and_report_dir(self):
        """--monarch-verbose reaches every task; --monarch-report=DIR gets
        the report instead of the working directory."""
        reports = os.path.join(self.work, "reports")
        os.mkdir(reports)
        pw = pwd.getpwnam(USER)
        os.chown(reports, pw.pw_uid, pw.pw_gid)
        job = st.sbatch(USER, self.work, [f"--monarch-dataset={self.dataset}", "--monarch-verbose",
                                          f"--monarch-report={reports}",
                                          st.job_script("env_only.sh")],
                        extra_env={"JOBS": st.JOBS})
        self.assertEqual(st.wait_job(job), "COMPLETED")
        for tag in ("batch", "step"):
            self.assertEqual(st.read_env(os.path.join(self.work, f"{tag}.env")).get("MONARCH_LOG"),
                             "1", tag)
        self.assertTrue(os.path.exists(os.path.join(reports, f"monarch-job{job}.json")))
        self.assertFalse(os.path.exists(os.path.join(self.work, f"monarch-job{job}.json")))
        self.assertNoLeftovers(job)

    def test_good_dataset_is_accepted(self):
        job = st.sbatch(USER, self.work, [f"--monarch-dataset={self.dataset}", "--wrap", "true"])
        self.assertEqual(st.wait_job(job), "COMPLETED")
        self.assertNoLeftovers(job)


if __name__ == "__main__":
    st.main()
