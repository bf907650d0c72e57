"""The report at a job's end, written as the user (issue 8, findings 8 and
9). In a report directory every user can write (mode 1777), another user
who made files under the job's report names beforehand (a regular file, a
link to a file of theirs) neither keeps the report from being written nor
gets any of their files changed; the report takes the user's umask (077
here: mode 0600). And the report is written with the job's groups, not
with what the group database says at the job's end: a user removed from a
group during the job still gets the report into a directory only that
group can write."""
import glob
import grp
import json
import os
import pwd
import shutil
import subprocess

import slurmtest as st

USER, OTHER = "monarchtest", "monarchtest2"
GROUP_USER, GROUP = "monarchtest3", "monarchrep"


def as_user(user, path):
    pw = pwd.getpwnam(user)
    os.chown(path, pw.pw_uid, pw.pw_gid, follow_symlinks=False)


class Reports(st.SlurmTest):
    def test_shared_report_dir(self):
        dataset = st.make_dataset("job")
        reports = os.path.join(st.ROOT, "reports-shared")
        shutil.rmtree(reports, ignore_errors=True)
        os.mkdir(reports)
        os.chmod(reports, 0o1777)
        config = st.config_variant("shared-reports", general={"report_dir": reports})
        with st.plugstack_args(f"config={config}"):
            work = st.workdir(USER, "shared-reports")
            r = st.run_as(USER, ["bash", "-c", "umask 077; exec sbatch --parsable --hold "
                                 f"--monarch-dataset={dataset} {st.job_script('env_only.sh')}"],
                          cwd=work, extra_env={"JOBS": st.JOBS})
            self.assertEqual(r.returncode, 0, r.stderr)
            job = int(r.stdout.strip())
            # The other user squats every name the report could take.
            bait = os.path.join(reports, "bait")
            planted = {}
            with open(bait, "w") as f:
                f.write("the other user's\n")
            as_user(OTHER, bait)
            for base in (f"monarch-job{job}", f"monarch-job{job}-{st.HOST}"):
                for ext in (".json", ".svg"):
                    p = os.path.join(reports, base + ext)
                    with open(p, "w") as f:
                        f.write("squatted\n")
                    as_user(OTHER, p)
                    planted[p] = "squatted\n"
                link = os.path.join(reports, base + ".txt")
                os.symlink(bait, link)
                as_user(OTHER, link)
            subprocess.run(["scontrol", "release", str(job)], check=True)
            self.assertEqual(st.wait_job(job), "COMPLETED")
        for p, text in planted.items():
            self.assertEqual(st.read(p), text, f"{p} was changed")
            self.assertEqual(os.stat(p).st_uid, pwd.getpwnam(OTHER).pw_uid)
        self.assertEqual(st.read(bait), "the other user's\n", "the link was followed")
        for base in (f"monarch-job{job}", f"monarch-job{job}-{st.HOST}"):
            self.assertEqual(os.readlink(os.path.join(reports, base + ".txt")), bait)
        uid = pwd.getpwnam(USER).pw_uid
        mine = sorted(p for p in glob.glob(os.path.join(reports, f"monarch-job{job}*"))
                      if os.lstat(p).st_uid == uid)
        print("the report went to", mine)
        self.assertEqual([os.path.splitext(p)[1] for p in mine], [".json", ".svg", ".txt"], mine)
        for p in mine:
            self.assertEqual(os.lstat(p).st_mode & 0o7777, 0o600, f"{p}: not the user's umask")
        with open(mine[0]) as f:
            report = json.load(f)
        self.assertEqual(report.get("stats", report)["job"], f"job{job}")
        self.assertNoLeftovers(job)

    def test_groups_of_the_job(self):
        dataset = st.make_dataset("job")
        try:
            grp.getgrnam(GROUP)
        except KeyError:
            subprocess.run(["groupadd", GROUP], check=True)
        st.ensure_user(GROUP_USER)
        subprocess.run(["gpasswd", "-a", GROUP_USER, GROUP], check=True, capture_output=True)
        reports = os.path.join(st.ROOT, "reports-group")
        shutil.rmtree(reports, ignore_errors=True)
        os.mkdir(reports)
        os.chown(reports, 0, grp.getgrnam(GROUP).gr_gid)
        os.chmod(reports, 0o770)
        config = st.config_variant("group-reports", general={"report_dir": reports})
        try:
            with st.plugstack_args(f"config={config}"):
                work = st.workdir(GROUP_USER, "group-reports")
                job = st.sbatch(GROUP_USER, work,
                                [f"--monarch-dataset={dataset}", st.job_script("wait_go.sh")],
                                extra_env={"DS": dataset, "JOBS": st.JOBS})
                st.wait_for(lambda: os.path.exists(os.path.join(work, "started")), 60, "the job")
                # The group database changes while the job runs.
                subprocess.run(["gpasswd", "-d", GROUP_USER, GROUP], check=True,
                               capture_output=True)
                open(os.path.join(work, "go"), "w").close()
                self.assertEqual(st.wait_job(job), "COMPLETED")
        finally:
            subprocess.run(["gpasswd", "-d", GROUP_USER, GROUP], capture_output=True)
        self.assertTrue(os.path.exists(os.path.join(reports, f"monarch-job{job}.json")),
                        "no report: written without the job's groups")
        self.assertNoLeftovers(job)


if __name__ == "__main__":
    st.main()
