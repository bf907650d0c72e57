"""Root never resolves a path through a mount the user made (issue 23,
item 3): in job_space = directory a job stacks FUSE mounts in its own
directory (on d/e/f, then on d/e and on d, each covering the way to the one
before, then on the job's directory itself) and stops every daemon
(SIGSTOP), so that any lookup inside one waits for good. The mounts allow
other users (user_allow_other, set in /etc/fuse.conf for the test, as many
sites have it): a lookup by root reaches the daemons too.
The epilog ends within its bound and detaches all four, the node stays idle,
nothing is left on the tiers, and what the mounts served is untouched (it
was never deleted through them)."""
import contextlib
import os
import re
import signal

import slurmtest as st

USER = "monarchtest"
EPILOG_LIMIT_S = 5
SOURCES = ("x", "y", "z", "t")


def make_sources(work):
    """$OUT/src/NAME for each daemon, the user's, each with a marker."""
    uid, gid = os.stat(work).st_uid, os.stat(work).st_gid
    for p in [os.path.join(work, "src")] + [os.path.join(work, "src", n) for n in SOURCES]:
        os.mkdir(p, 0o755)
        os.chown(p, uid, gid)
    for n in SOURCES:
        marker = os.path.join(work, "src", n, "marker")
        with open(marker, "w") as f:
            f.write(n + "\n")
        os.chown(marker, uid, gid)


@contextlib.contextmanager
def user_allow_other():
    """/etc/fuse.conf with user_allow_other, then as it was."""
    path = "/etc/fuse.conf"
    before = st.read(path) if os.path.exists(path) else None
    with open(path, "a") as f:
        f.write("\nuser_allow_other\n")
    try:
        yield
    finally:
        if before is None:
            os.unlink(path)
        else:
            with open(path, "w") as f:
                f.write(before)


def sources_intact(work):
    return all(os.listdir(os.path.join(work, "src", n)) == ["marker"] and
               st.read(os.path.join(work, "src", n, "marker")) == n + "\n" for n in SOURCES)


class FuseStack(st.SlurmTest):
    def test_stopped_daemons_in_directory_mode(self):
        config = st.config_variant("directory", general={"job_space": "directory"})
        with st.plugstack_args(f"config={config}"), user_allow_other():
            dataset = st.make_dataset("job")
            work = st.workdir(USER, "fuse-stack")
            make_sources(work)
            job = st.sbatch(USER, work, [f"--monarch-dataset={dataset}", st.job_script("stack.sh")],
                            extra_env={"JOBS": st.JOBS, "PFSEMU": st.PFSEMU})
            pids = []
            try:
                self.assertEqual(st.wait_job(job, timeout=120), "COMPLETED")
                self.assertTrue(os.path.exists(os.path.join(work, "stacked")),
                                st.read(os.path.join(work, f"slurm-{job}.out")))
                pids = [int(p) for p in st.read(os.path.join(work, "fuse.pids")).split()]
                self.assertEqual(len(pids), 4)
                for pid in pids:  # still there and still stopped: nothing answered for them
                    self.assertIn("\nState:\tT", st.read(f"/proc/{pid}/status"))
                log = st.slurmd_log()
                took = re.search(rf"monarch: job{job}: epilog done in ([0-9.]+) s", log)
                self.assertTrue(took, "the epilog did not finish")
                print(f"the epilog took {took.group(1)} s")
                self.assertLess(float(took.group(1)), EPILOG_LIMIT_S)
                self.assertIn(f"monarch: job{job}: tier fast: detached 4 mount(s) the job left",
                              log)
                self.assertIn(f"monarch: job{job}: no report: the job mounted something", log)
                self.assertNoLeftovers(job)
                self.assertEqual(st.mounts_below(st.TIER_ROOT), [])
                self.assertTrue(sources_intact(work), "what the user's mounts served changed")
            finally:
                if not pids and os.path.exists(os.path.join(work, "fuse.pids")):
                    pids = [int(p) for p in st.read(os.path.join(work, "fuse.pids")).split()]
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            st.assert_clean(self)


if __name__ == "__main__":
    st.main()
