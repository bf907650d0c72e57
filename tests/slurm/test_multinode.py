"""Multi-node jobs (issue 9) on the namespaced nodes of the test cluster
(partition "multi", st.MULTI): each node has its own hostname, address,
/etc/hosts, PID namespace and node-local tiers, and sees the emulated PFS
mounted after the cluster started. Every node of a job reads correct bytes
from its own tiers, writes its own report, and its epilog cleans that node
(and no other). (How the nodes share one cache: test_jobwide.py.)"""
import ipaddress
import os
import threading
import time

import slurmtest as st

USER = "monarchtest"
USER2 = "monarchtest2"
NET = ipaddress.ip_network("10.77.0.0/24")  # contrib/slurm/cluster's default

# One task per node: who it is, what it resolves, whom it reaches, what it sees.
PROBE = r"""
live() { ps -e -o stat=,comm= | awk -v c="$1" '$1 !~ /^Z/ && $2 == c' | wc -l; }  # zombies: not reaped yet
peers=""
for n in $NODES; do
  if timeout 2 bash -c "exec 3<>/dev/tcp/$n/6818" 2>/dev/null; then peers+="$n,"; fi
done
echo "node=$SLURMD_NODENAME host=$(hostname) addr=$(hostname -I | xargs)" \
     "hosts=$(getent hosts $NODES | awk '{printf "%s:%s,", $2, $1}')" \
     "peers=$peers ctld=$(live slurmctld) stagers=$(live monarch-stager)"
"""

# The nested step of a batch job on every node: records, then reads EPOCHS epochs.
STEP = r"""source "$JOBS/lib.sh"
T=node.$(hostname)
record "$T"
findmnt -n -o SOURCE --target "$TIER" >"$OUT/$T.tier"
wait_file go 60
wait_job_file index # reads before the node's map go to the PFS uncounted
read_epochs "$T" "$EPOCHS"
"""

BATCH = """#!/bin/bash
#SBATCH -p multi -N {n} -n {n} {where}
srun -N {n} -n {n} bash -c '{step}'
echo "$?" >"$OUT/done"
"""


class TierWatch(threading.Thread):
    """Samples every node's tiers (as the root namespace sees them) every 50 ms:
    on which nodes each job had a job directory."""

    def __init__(self, jobs):
        super().__init__(daemon=True)
        self.jobs = jobs
        self.seen = {job: set() for job in jobs}  # job -> nodes ("host" for the host's tiers)
        self._stop_event = threading.Event()

    def run(self):
        places = [("host", t) for t in st.TIERS] + [(n, t) for n in st.MULTI
                                                     for t in st.node_tiers(n)]
        while not self._stop_event.is_set():
            for job in self.jobs:
                for node, tier in places:
                    if os.path.lexists(os.path.join(tier, f"monarch-job{job}")):
                        self.seen[job].add(node)
            time.sleep(0.05)

    def stop(self):
        self._stop_event.set()
        self.join()


class MultiNode(st.SlurmTest):
    def setUp(self):
        super().setUp()
        if len(st.MULTI) < 3:
            self.skipTest("needs 3 namespaced nodes (MONARCH_TEST_NODES)")

    def submit(self, user, work, nodes, where, dataset, epochs=1):
        script = os.path.join(work, "job.sh")
        with open(script, "w") as f:
            f.write(BATCH.format(n=len(nodes), where=where, step=STEP.replace("'", "'\\''")))
        os.chmod(script, 0o755)
        return st.sbatch(user, work, [f"--monarch-dataset={dataset}", script],
                         extra_env={"DS": dataset, "EPOCHS": str(epochs), "JOBS": st.JOBS,
                                    "OUT": work, "TIER": st.TIERS[0]})

    def check_job(self, job, user, work, nodes, reference, files, epochs, watch):
        """What every node of a finished job must show: its bytes, its own
        stager only, its own tier, its own report, its own cleanup."""
        out = st.read(os.path.join(work, f"slurm-{job}.out"))
        self.assertEqual(st.job_state(job), "COMPLETED", out)
        self.assertEqual(st.read(os.path.join(work, "done")).strip(), "0", out)
        for node in nodes:
            tag = f"node.{node}"
            for e in range(1, epochs + 1):
                self.assertEqual(st.read(os.path.join(work, f"{tag}.epoch{e}.md5")), reference,
                                 f"{node} epoch {e} read other bytes")
            env = st.read_env(os.path.join(work, f"{tag}.env"))
            self.assertEqual(env.get("MONARCH_JOB_DIR"),
                             os.path.join(st.TIERS[0], f"monarch-job{job}"), node)
            # Its PID namespace: the task sees its own node's stager, one.
            stagers = st.read(os.path.join(work, f"{tag}.stagers")).splitlines()
            self.assertEqual(len(stagers), 1, f"{node} saw stagers {stagers}")
            # Its tier is its own directory, bind-mounted.
            self.assertIn(f"/nodes/{node}/root{st.TIERS[0]}",
                          st.read(os.path.join(work, f"{tag}.tier")), node)
        # The tiers used were those of the job's nodes, never the host's.
        self.assertEqual(watch.seen[job], set(nodes), f"job {job} had job directories on")
        # One report per node, each from a stager that really copied there.
        reports = st.node_reports(work, job)
        self.assertEqual(sorted(reports), sorted(nodes), f"reports in {work}")
        for node, stats in reports.items():
            self.assertTrue(stats["complete"], node)
            self.assertEqual(stats["user"], user, node)
            # Copies go on in the background until the epilog stops the
            # stager: a one-epoch job may end before the last replicas.
            self.assertGreater(stats["cached"]["files"], 0, node)
            self.assertLessEqual(stats["cached"]["files"], len(files), node)
            self.assertGreater(sum(stats["totals"]["tier_bytes"]), 0, node)
        # Each node's epilog stopped its node's stager (one), and cleaned.
        log = st.slurmd_log()
        self.assertEqual(log.count(f"monarch: job{job}: stopped 1 stager(s)"), len(nodes), log[-3000:])
        self.assertNoLeftovers(job)
        for node in nodes:
            for t in st.node_tiers(node):
                self.assertEqual([n for n in os.listdir(t) if n.startswith("monarch-")], [],
                                 f"{node}: {t}")

    def test_srun_one_task_per_node(self):
        """srun -N 3: one task on each node, with its own hostname and address;
        every node resolves every node's name to that address and reaches it;
        no node sees the host's processes."""
        r = st.run_as(USER, ["srun", "-p", "multi", "-N", "3", "-n", "3", "bash", "-c", PROBE],
                      extra_env={"NODES": " ".join(st.MULTI)}, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = [dict(w.split("=", 1) for w in line.split()) for line in r.stdout.splitlines()]
        self.assertEqual(sorted(t["node"] for t in lines), sorted(st.MULTI), r.stdout)
        addrs = {}
        for t in lines:
            self.assertEqual(t["host"], t["node"], "the task's hostname is not its node's name")
            self.assertIn(ipaddress.ip_address(t["addr"]), NET, t)
            addrs[t["node"]] = t["addr"]
        self.assertEqual(len(set(addrs.values())), 3, f"addresses {addrs}")
        expected = "".join(f"{n}:{addrs[n]}," for n in st.MULTI)
        for t in lines:
            self.assertEqual(t["hosts"], expected, f"{t['node']} resolves")
            self.assertEqual(t["peers"], "".join(f"{n}," for n in st.MULTI),
                             f"{t['node']} reaches")
            self.assertEqual(t["ctld"], "0", f"{t['node']} sees the host's slurmctld")
            self.assertEqual(t["stagers"], "0", t["node"])

    def test_batch_job_on_three_nodes(self):
        """sbatch -N 3 --monarch-dataset on the emulated PFS, mounted after
        the cluster started, with a nested srun -N 3 reading it for 2 epochs."""
        source = st.make_dataset("job")
        files = st.dataset_files(source)
        pfs = st.Pfs()
        self.addCleanup(pfs.close)
        dataset = pfs.dataset("job")
        reference = st.reference_md5(source).replace(source, dataset)
        size = sum(os.path.getsize(p) for p in files)
        before = pfs.counts()
        work = st.workdir(USER, "multinode")
        job = self.submit(USER, work, st.MULTI, "", dataset, epochs=2)
        watch = TierWatch([job])
        watch.start()
        try:
            st.wait_running(job)
            st.wait_for(lambda: all(os.path.exists(os.path.join(work, f"node.{n}.tier"))
                                    for n in st.MULTI), 60, "every node's task to start")
            open(os.path.join(work, "go"), "w").close()
            st.wait_job(job, timeout=120)
        finally:
            watch.stop()
        self.check_job(job, USER, work, st.MULTI, reference, files, 2, watch)
        # Every byte the PFS served is in a node's report: its readers' own
        # reads, and its stager's copies. The copies take each file from the
        # PFS once for the job; readers that open a file before their node
        # has a copy read the PFS (never waiting), which in a job of two
        # 0.1 s epochs right after the cluster started can be most of it.
        served = pfs.counts()["bytes"] - before["bytes"]
        stats = st.node_reports(work, job)
        self.assertEqual(sorted(stats), sorted(st.MULTI), f"reports in {work}")
        readers = sum(s["totals"]["pfs_bytes"] for s in stats.values())
        copies = sum(st.stager_counter(s, "pfs_bytes") for s in stats.values())
        print(f"PFS: {served} bytes served for a dataset of {size} bytes on 3 nodes: "
              f"{copies} to copies, {readers} to readers")
        self.assertEqual(served, readers + copies, "PFS bytes no report accounts for")
        self.assertGreaterEqual(served, size)
        self.assertLessEqual(copies, size * 1.02, "a file copied from the PFS more than once")

    def test_two_jobs_side_by_side(self):
        """A job on 2 of the 3 nodes next to another user's job on the third,
        running at once: both finish, each on its own nodes, each cleaned up."""
        source = st.make_dataset("job")
        files = st.dataset_files(source)
        reference = st.reference_md5(source)
        pair, single = st.MULTI[:2], st.MULTI[2:3]
        work_a = st.workdir(USER, "multinode-pair")
        work_b = st.workdir(USER2, "multinode-single")
        job_a = self.submit(USER, work_a, pair, "-w " + ",".join(pair), source)
        job_b = self.submit(USER2, work_b, single, "-w " + single[0], source)
        watch = TierWatch([job_a, job_b])
        watch.start()
        try:
            for job in (job_a, job_b):
                st.wait_running(job)
            # Both hold their nodes at once before either reads.
            st.wait_for(lambda: all(os.path.exists(os.path.join(w, f"node.{n}.tier"))
                                    for w, ns in ((work_a, pair), (work_b, single)) for n in ns),
                        60, "every task of both jobs to start")
            self.assertEqual((st.job_state(job_a), st.job_state(job_b)), ("RUNNING", "RUNNING"))
            for w in (work_a, work_b):
                open(os.path.join(w, "go"), "w").close()
            for job in (job_a, job_b):
                st.wait_job(job, timeout=120)
        finally:
            watch.stop()
        self.check_job(job_a, USER, work_a, pair, reference, files, 1, watch)
        self.check_job(job_b, USER2, work_b, single, reference, files, 1, watch)


if __name__ == "__main__":
    st.main()
