"""A hostile user against root (issue 23). The plugin runs as root on
every node; the user controls the job's environment, its working and report
directories and everything in the job's own directory. None of it makes
root write or run anything for the user:
- a job whose HOME, USER, SLURM_JOB_USER, SLURM_UMASK, SLURM_RLIMIT_*,
  LD_PRELOAD and MONARCH_* carry newlines, '=', the record's own names,
  control characters and paths through symbolic links runs, its record
  holds only what root derived, and every file its end writes is the
  user's;
- a report directory or statistics file replaced by a symbolic link
  during the job: nothing is written or read through the link;
- --monarch-report naming a symbolic link is refused at submission.
Every test ends with the node idle and clean (SlurmTest.tearDown)."""
import os
import pwd
import shutil
import subprocess

import slurmtest as st

USER = "monarchtest"
RECORD_NAMES = ["version", "key", "space", "uid", "gid", "groups", "umask", "boot", "restarts",
                "mount_id"]
# What the attack of issue 23 put in HOME: a record's lines after a newline.
INJECTED = "\nuid=0\ngid=0\ngroups=0\numask=0000\nkey=job1\nspace=directory\nversion=2\n"


def record_lines(job):
    """The job's record on the first tier, as name -> [values]."""
    path = os.path.join(st.TIERS[0], ".monarch", "jobs", f"job{job}")
    out = {}
    for line in st.read(path).splitlines():
        if line.startswith("#"):
            continue
        name, _, value = line.partition("=")
        out.setdefault(name, []).append(value)
    return out


def owned_by_root_below(*roots):
    found = []
    for root in roots:
        for d, dirs, files in os.walk(root):
            for n in dirs + files:
                p = os.path.join(d, n)
                if os.lstat(p).st_uid == 0:
                    found.append(p)
    return found


class HostileUser(st.SlurmTest):
    def test_hostile_environment(self):
        dataset = st.make_dataset("job")
        work = st.workdir(USER, "hostile-env")
        pw = pwd.getpwnam(USER)
        # A path through a symbolic link to root's home.
        link_to_root = os.path.join(work, "root-home")
        os.symlink("/root", link_to_root)
        before = sorted(os.listdir("/etc/profile.d")) + sorted(os.listdir("/root"))
        evil = {
            "HOME": link_to_root + INJECTED,
            "USER": "root" + INJECTED,
            "LOGNAME": "root" + INJECTED,
            "SLURM_JOB_USER": "root" + INJECTED,
            "SLURM_UMASK": "0000" + INJECTED,
            "SLURM_RLIMIT_NOFILE": "U1" + INJECTED,
            "SLURM_RLIMIT_FSIZE": "=\x1b[2J",
            "LD_PRELOAD": "uid=0\tgid=0",  # no newline: the task's env file keeps one line
            "MONARCH_DATASET": "/root" + INJECTED,
            "MONARCH_JOB_DIR": link_to_root,
            "MONARCH_JOB_KEY": "0" * 32,
            "MONARCH_LOG": "1" + INJECTED,
            "JOBS": st.JOBS,
        }
        job = st.sbatch(USER, work, [f"--monarch-dataset={dataset}", st.job_script("wait_go.sh")],
                        extra_env=evil)
        try:
            st.wait_for(lambda: os.path.exists(os.path.join(work, "started")), 60,
                        "the job to read its dataset")
            record = record_lines(job)
            self.assertEqual(sorted(record), sorted(RECORD_NAMES), record)
            self.assertTrue(all(len(v) == 1 for v in record.values()), record)
            self.assertEqual(record["uid"], [str(pw.pw_uid)])
            self.assertEqual(record["gid"], [str(pw.pw_gid)])
            self.assertNotIn("0", record["groups"][0].split(","), record)
            self.assertEqual(record["key"], [f"job{job}"])
        finally:
            open(os.path.join(work, "go"), "w").close()
        self.assertEqual(st.wait_job(job), "COMPLETED")
        # The job ran with Monarch: the plugin's own values, not the user's.
        env = st.read_env(os.path.join(work, "batch.env"))
        self.assertEqual(env["MONARCH_DATASET"], dataset)
        self.assertIn(st.LIBRARY, env["LD_PRELOAD"])
        stagers = st.read(os.path.join(work, "batch.stagers")).split()
        self.assertEqual(stagers[:8], [str(pw.pw_uid)] * 4 + [str(pw.pw_gid)] * 4,
                         "the stager does not run as the user")
        # Its end wrote the report as the user, where the user asked, and
        # nothing as root anywhere the user named.
        st.wait_for(lambda: os.path.exists(os.path.join(work, f"monarch-job{job}.txt")), 30,
                    "the report")
        made_here = {link_to_root, os.path.join(work, "go")}  # by this test, as root
        self.assertEqual([p for p in owned_by_root_below(work) if p not in made_here], [])
        for name in os.listdir(work):
            if name.startswith(f"monarch-job{job}"):
                self.assertEqual(os.lstat(os.path.join(work, name)).st_uid, pw.pw_uid, name)
        self.assertEqual(sorted(os.listdir("/etc/profile.d")) + sorted(os.listdir("/root")),
                         before)
        text = st.read(os.path.join(work, f"monarch-job{job}.txt"))
        self.assertNotIn("\nuid=0", text)
        self.assertNoLeftovers(job)

    def links_during_job(self, with_report, with_stats):
        dataset = st.make_dataset("job")
        work = st.workdir(USER, "hostile-links")
        pw = pwd.getpwnam(USER)
        reports, elsewhere = os.path.join(work, "reports"), os.path.join(work, "elsewhere")
        for d in (reports, elsewhere):
            os.mkdir(d, 0o755)
            os.chown(d, pw.pw_uid, pw.pw_gid)
        bait = os.path.join(work, "bait.json")
        with open(bait, "w") as f:  # statistics of the user's making
            f.write('{"schema": "monarch-stats/1", "job": "job1", "dataset": "/x\\nuid=0"}\n')
        os.chown(bait, pw.pw_uid, pw.pw_gid)
        env = {"JOBS": st.JOBS}
        if with_report:
            env.update(REPORTS=reports, ELSEWHERE=elsewhere)
        if with_stats:
            env.update(BAIT=bait)
        job = st.sbatch(USER, work, [f"--monarch-dataset={dataset}", f"--monarch-report={reports}",
                                     st.job_script("hostile.sh")], extra_env=env)
        st.wait_for(lambda: os.path.exists(os.path.join(work, "started")), 60, "the job")
        open(os.path.join(work, "go"), "w").close()
        self.assertEqual(st.wait_job(job), "COMPLETED")
        self.assertTrue(os.path.exists(os.path.join(work, "linked")))
        self.assertNoLeftovers(job)
        return job, work, reports, elsewhere

    def test_report_dir_replaced_by_link(self):
        job, work, reports, elsewhere = self.links_during_job(True, False)
        self.assertTrue(os.path.islink(reports))
        self.assertEqual(os.listdir(elsewhere), [], "a report was written through the link")
        self.assertEqual(os.listdir(reports + ".moved"), [])
        self.assertIn(f"job{job}: the report to {reports} failed", st.slurmd_log())
        self.assertIn("it is a symbolic link", st.slurmd_log())

    def test_statistics_replaced_by_link(self):
        job, work, reports, elsewhere = self.links_during_job(False, True)
        # In place of the report, the note that says why.
        names = sorted(os.listdir(reports))
        self.assertEqual(names, [f"monarch-job{job}.txt"], names)
        note = st.read(os.path.join(reports, names[0]))
        self.assertIn("a symbolic link, not the statistics the stager wrote", note)
        self.assertEqual(os.lstat(os.path.join(reports, names[0])).st_uid,
                         pwd.getpwnam(USER).pw_uid)

    def test_report_option_naming_a_link_refused(self):
        dataset = st.make_dataset("job")
        work = st.workdir(USER, "hostile-option")
        link = os.path.join(work, "link")
        os.symlink(work, link)
        r = st.run_as(USER, ["sbatch", "--parsable", f"--monarch-dataset={dataset}",
                             f"--monarch-report={link}", st.job_script("env_only.sh")],
                      cwd=work, extra_env={"JOBS": st.JOBS})
        self.assertNotEqual(r.returncode, 0, r.stdout)
        self.assertIn(f"--monarch-report={link}: a symbolic link", r.stderr)


if __name__ == "__main__":
    st.main()
