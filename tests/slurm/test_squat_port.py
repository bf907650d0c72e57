"""Squatting a job's port degrades one node, not the job (issue 23, item 4),
on the 3 namespaced nodes of partition "multi", over the counting FUSE PFS.
A job of monarchtest2 on the first node holds every port of the configured
peer_ports range there (listening, never answering) while a 3-node Monarch
job of monarchtest runs: the first node's stager cannot listen and caches
alone (one log line, its report says so); the two other nodes give the first
up, the second walks the dataset for them and the third receives the index
from it: one cache of two nodes, bytes right everywhere, every node idle
after."""
import os

import slurmtest as st

USER = "monarchtest"
SQUATTER_USER = "monarchtest2"
PORTS = "7400-7403"  # small, so that a squatter can hold all of it

# Binds every port of the range on all of the node's addresses, listens, and
# never answers, until the harness creates $OUT/stop.
SQUATTER = r"""#!/usr/bin/python3
import os, socket, sys, time
low, high = (int(p) for p in sys.argv[1].split("-"))
held = []
for port in range(low, high + 1):
    s = socket.socket()
    s.bind(("0.0.0.0", port))
    s.listen(64)
    held.append(s)
with open(os.path.join(os.environ["OUT"], "squatting"), "w") as f:
    f.write(socket.gethostname() + "\n")
for _ in range(3000):
    if os.path.exists(os.path.join(os.environ["OUT"], "stop")):
        break
    time.sleep(0.1)
"""

# Each node's task reads every file of $OUT/list (no listing of its own: the
# PFS's directory listings count the walks) once its node's map is there
# (reads before it go to the PFS unseen), two epochs, and keeps the stager's
# log.
STEP = r"""source "$JOBS/lib.sh"
T=node.$(hostname)
wait_job_file index
for e in 1 2; do xargs md5sum <"$OUT/list" >"$OUT/$T.epoch$e.md5"; done
cp "$MONARCH_JOB_DIR/stager.log" "$OUT/$T.log"
"""

BATCH = """#!/bin/bash
#SBATCH -p multi -N 3 -n 3
srun -N 3 -n 3 bash -c '{step}'
echo "$?" >"$OUT/done"
"""


class SquatPort(st.SlurmTest):
    def setUp(self):
        super().setUp()
        if len(st.MULTI) < 3:
            self.skipTest("needs 3 namespaced nodes (MONARCH_TEST_NODES)")

    def squat(self, node):
        """monarchtest2's job holding every port of PORTS on `node`; its id."""
        work = st.workdir(SQUATTER_USER, "squat-port-squatter")
        script = os.path.join(work, "squat.py")
        with open(script, "w") as f:
            f.write(SQUATTER)
        os.chmod(script, 0o755)
        job = st.sbatch(SQUATTER_USER, work, ["-p", "multi", "-N", "1", "-n", "1", "-w", node,
                                              script, PORTS], extra_env={"OUT": work})
        self.addCleanup(lambda: open(os.path.join(work, "stop"), "w").close())
        st.wait_for(lambda: os.path.exists(os.path.join(work, "squatting")), 60,
                    f"job {job} to hold ports {PORTS} on {node}")
        self.assertEqual(st.read(os.path.join(work, "squatting")).strip(), node)
        return job, work

    def test_first_node_squatted(self):
        first, second, third = st.MULTI[:3]
        source = st.make_dataset("squat-port", seed=23)
        files = st.dataset_files(source)
        size = sum(os.path.getsize(p) for p in files)
        dirs = sum(1 for _ in os.walk(source))  # the root included
        pfs = st.Pfs()
        self.addCleanup(pfs.close)
        dataset = pfs.dataset("squat-port")
        reference = st.reference_md5(source).replace(source, dataset)

        conf = st.config_variant("squat-port", general={"peer_ports": PORTS})
        with st.plugstack_args(f"config={conf}"):
            squatter, squatter_work = self.squat(first)
            work = st.workdir(USER, "squat-port")
            with open(os.path.join(work, "list"), "w") as f:
                f.write("".join(p.replace(source, dataset) + "\n" for p in files))
            script = os.path.join(work, "job.sh")
            with open(script, "w") as f:
                f.write(BATCH.format(step=STEP.replace("'", "'\\''")))
            os.chmod(script, 0o755)
            before = pfs.counts()
            job = st.sbatch(USER, work, [f"--monarch-dataset={dataset}", script],
                            extra_env={"DS": dataset, "JOBS": st.JOBS, "OUT": work})
            st.wait_job(job, timeout=180)
            after = pfs.counts()
            open(os.path.join(squatter_work, "stop"), "w").close()
            st.wait_job(squatter, timeout=60)

        out = st.read(os.path.join(work, f"slurm-{job}.out"))
        self.assertEqual(st.job_state(job), "COMPLETED", out)
        self.assertEqual(st.read(os.path.join(work, "done")).strip(), "0", out)
        for node in (first, second, third):
            for e in (1, 2):
                self.assertEqual(st.read(os.path.join(work, f"node.{node}.epoch{e}.md5")),
                                 reference, f"{node} epoch {e} read other bytes")
        logs = {n: st.read(os.path.join(work, f"node.{n}.log")) for n in (first, second, third)}
        stats = st.node_reports(work, job)
        self.assertEqual(sorted(stats), sorted((first, second, third)), f"reports in {work}")
        keys = ("alone", "index_received", "peers_failed", "pfs_bytes", "peer_bytes",
                "served_bytes", "copies", "peer_copies")
        for host, s in sorted(stats.items()):
            print(host, {k: st.stager_counter(s, k) for k in keys})

        def counter(node, name):
            return st.stager_counter(stats[node], name)

        # The first node cached alone: one line says why, and its report.
        alone = [l for l in logs[first].splitlines() if "caching on this node alone" in l]
        self.assertEqual(len(alone), 1, logs[first][-3000:])
        self.assertIn("all 4 of the job's port candidates are taken", alone[0])
        self.assertIn("Address already in use", alone[0])
        self.assertEqual(counter(first, "alone"), 1)
        for name in ("index_received", "peer_bytes", "served_bytes"):
            self.assertEqual(counter(first, name), 0, f"{first}: {name}")

        # The two others are one cache: they gave the first up, the second
        # walked for both, the third received the index from it, and each
        # file came from the PFS once for the two of them.
        for node in (second, third):
            self.assertEqual(counter(node, "alone"), 0, node)
            self.assertEqual(counter(node, "peers_failed"), 1, node)
            self.assertIn(f"node {first} of the job failed", logs[node], node)
        self.assertEqual(counter(second, "index_received"), 0)
        self.assertIn("walking the dataset for the job", logs[second])
        self.assertEqual(counter(third, "index_received"), 1, logs[third][-3000:])
        pair_copies = counter(second, "pfs_bytes") + counter(third, "pfs_bytes")
        self.assertLessEqual(pair_copies, 1.02 * size, "a file left the PFS twice for the pair")
        self.assertLessEqual(counter(first, "pfs_bytes"), 1.02 * size)
        self.assertGreater(counter(second, "served_bytes") + counter(third, "served_bytes"), 0,
                           "no bytes between the pair")
        self.assertGreater(counter(second, "peer_bytes") + counter(third, "peer_bytes"), 0)
        # Two walks for the job (the first node's own, the second's), not
        # three: a listing takes 2 readdir requests a directory.
        readdirs = after["readdirs"] - before["readdirs"]
        print(f"PFS: {after['bytes'] - before['bytes']} bytes for a dataset of {size}, "
              f"{readdirs} readdirs for {dirs} directories")
        self.assertLessEqual(readdirs, 2 * (2 * dirs + 2), "the dataset was walked 3 times")

        # monarch-report JOBID names the node that cached alone.
        r = st.run_as(USER, [st.REPORT, str(job)], cwd=work)
        self.assertEqual(r.returncode, 0, r.stderr)
        summary = r.stdout.split("\n\n")[0]
        print(summary)
        self.assertRegex(summary,
                         rf"(?m)^  nodes that cached on their own, outside the job's cache: {first}$")
        self.assertNoLeftovers(job)


if __name__ == "__main__":
    st.main()
