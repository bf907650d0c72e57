"""Two users' jobs at once, with different datasets (the second user's
private to that user): separate tier directories, each private to its
user, neither user can read the other's, one stager per job running as its
own user, each job reads its own bytes, each report belongs to its user."""
import os
import pwd
import shutil

import slurmtest as st

A, B = "monarchtest", "monarchtest2"


class TwoUsers(st.SlurmTest):
    def test_two_users_at_once(self):
        data = {A: st.make_dataset("pair-a", seed=11), B: st.make_dataset("pair-b", seed=22)}
        # B's dataset is B's alone: only a stager running as B can read it.
        pb = pwd.getpwnam(B)
        private = os.path.join(st.DATA, "pair-b-private")
        if not os.path.exists(private):
            shutil.copytree(data[B], private)
            for d, _, names in os.walk(private):
                os.chown(d, pb.pw_uid, pb.pw_gid)
                for n in names:
                    os.chown(os.path.join(d, n), pb.pw_uid, pb.pw_gid)
        os.chmod(private, 0o700)
        data[B] = private
        work, job, watch = {}, {}, {}
        for user in (A, B):
            work[user] = st.workdir(user, "pair")
            job[user] = st.sbatch(user, work[user],
                                  [f"--monarch-dataset={data[user]}", st.job_script("pair.sh")],
                                  extra_env={"DS": data[user], "JOBS": st.JOBS})
            watch[user] = st.StagerWatch(job[user])
            watch[user].start()
        try:
            for user in (A, B):
                st.wait_for(lambda u=user: os.path.exists(os.path.join(work[u], "read")), 60,
                            f"{user}'s job to read")
            # Both run now. Separate directories, each private to its user.
            for user, other in ((A, B), (B, A)):
                pw = pwd.getpwnam(user)
                dirs = st.job_dirs(job[user])
                self.assertEqual(len(dirs), len(st.TIERS))
                for d in dirs:
                    s = os.lstat(d)
                    self.assertEqual((s.st_uid, s.st_mode & 0o7777), (pw.pw_uid, 0o700), d)
                for d in st.job_dirs(job[other]):
                    for argv in (["ls", d], ["cat", os.path.join(d, "index")]):
                        r = st.run_as(user, argv)
                        self.assertNotEqual(r.returncode, 0, f"{user} could {argv}")
                        self.assertIn("Permission denied", r.stderr)
                running = st.stagers(job[user])
                self.assertEqual(len(running), 1)
                self.assertEqual(running[0]["uids"], [pw.pw_uid] * 4)
            for user in (A, B):
                open(os.path.join(work[user], "go"), "w").close()
            for user in (A, B):
                self.assertEqual(st.wait_job(job[user]), "COMPLETED")
        finally:
            for w in watch.values():
                w.stop()
        for user in (A, B):
            pw = pwd.getpwnam(user)
            reference = st.reference_md5(data[user])
            for name in ("batch.epoch1.md5", "batch.after.epoch1.md5"):
                self.assertEqual(st.read(os.path.join(work[user], name)), reference,
                                 f"{user}: {name}")
            self.assertEqual(watch[user].max_count, 1)
            report = os.path.join(work[user], f"monarch-job{job[user]}.json")
            self.assertEqual(os.stat(report).st_uid, pw.pw_uid)
            stats = st.report_json(work[user], job[user])
            self.assertEqual(stats["user"], user)
            self.assertEqual(stats["dataset"], data[user])
            self.assertGreater(st.stager_counter(stats, "copies"), 0)
            self.assertNoLeftovers(job[user])


if __name__ == "__main__":
    st.main()
