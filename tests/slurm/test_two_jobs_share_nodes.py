"""Two multi-node jobs of two users at once on the same 3 namespaced nodes,
each one cache: a node runs a stager of each job, and the configuration
leaves the stagers two ports (peer_ports), so that the jobs' first choices
of port collide on some node and a job's nodes must find each other on the
other port. For both jobs: one node walked the dataset and the others
received the index, no node cached on its own, every rank read right bytes
in every epoch (test_jobwide.py's job and checks)."""
import os

import slurmtest as st
from test_jobwide import JobWideCase

USERS = ("monarchtest", "monarchtest2")


class TwoJobs(JobWideCase):
    def test_two_jobs_share_nodes_and_are_one_cache_each(self):
        conf = st.config_variant("two-ports", general={"peer_ports": "7400-7401"})
        pfs = st.Pfs()
        self.addCleanup(pfs.close)
        before = pfs.counts()
        with st.plugstack_args(f"config={conf}"):
            runs = [self.submit_job(pfs, "two-jobs", user) for user in USERS]
            # One core a task, two cores a node: both jobs run on every node at once.
            for job, _ in runs:
                st.wait_running(job)
            self.assertTrue(all(st.job_state(job) == "RUNNING" for job, _ in runs),
                            "the two jobs did not run at once")
            for job, work in runs:
                self.check_job(job, work)
        read = pfs.counts()["bytes"] - before["bytes"]
        print(f"PFS: {read / self.size:.3f}x the dataset for the two jobs")
        # What readers read from the PFS themselves: reads that found their
        # copy stalled, which the reports count (test_jobwide's readers read
        # only copies otherwise).
        fallback = 0
        for (job, work), user in zip(runs, USERS):
            stats = self.reports(job, work)
            job_fallback = sum(s["totals"]["pfs_bytes"] for s in stats.values())
            self.assertTrue(job_fallback <= 0.02 * self.size or
                            sum(s["totals"]["fb_wait"] for s in stats.values()) > 0,
                            f"job {job}: readers read {job_fallback} bytes from the PFS, no "
                            "fallback said")
            fallback += job_fallback
            for host, s in sorted(stats.items()):
                self.assertEqual(s["totals"]["stager"]["alone"], 0, f"job {job}: {host}")
            walkers = [h for h, s in stats.items() if not s["totals"]["stager"]["index_received"]]
            self.assertEqual(walkers, [st.MULTI[0]], f"job {job}: the nodes that walked")
            self.assertGreater(sum(s["totals"]["stager"]["peer_bytes"] for s in stats.values()), 0,
                               f"job {job}: nodes read files homed elsewhere from their home")
            self.assertIn("on 3 nodes", self.job_summary(job, work, user))
        self.assertLessEqual(read - fallback, 2 * 1.02 * self.size,
                             "a file left the PFS more than once a job")


if __name__ == "__main__":
    st.main()
