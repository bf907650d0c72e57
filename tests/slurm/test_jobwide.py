"""Multi-node jobs as one cache (issue 9), on the 3 namespaced nodes of the
test cluster, over the counting FUSE PFS (Pfs): a data-parallel reader (one
task per node, rank r reads items r, r+3, ... of each epoch's permutation,
4 fork workers, small files whole and large ones in 256 KiB preads, a
barrier after each epoch) reads 3 epochs. The PFS itself counts what the
job cost it: each file read from it once per job, nothing in epochs 2-3,
the dataset's directories listed once. A node whose stager is killed in
epoch 2 costs no wrong byte and no stuck reader; job_wide = no keeps each
node on its own."""
import hashlib
import json
import os
import signal
import subprocess

import slurmtest as st

USER = "monarchtest"
READER = os.path.join(st.SRC, "tests", "engine", "reader.py")

# Each rank starts reading once its node's map is published (reads before
# it go to the PFS unseen, README, Limitations), and keeps its node's stager
# log in the work directory (the job directory goes at the epilog).
STEP = r"""source "$JOBS/lib.sh"; wait_job_file index
python3 "$READER" "$DS" --mode ddp --epochs 3 --seed 7 --list "$OUT/list" \
  --barrier "$OUT/barrier" --counts "$COUNTS" >"$OUT/rank$SLURM_PROCID.out" 2>"$OUT/rank$SLURM_PROCID.err"
rc=$?; cp "$MONARCH_JOB_DIR/stager.log" "$OUT/stager-$(hostname).log" 2>/dev/null; exit $rc
"""

BATCH = """#!/bin/bash
#SBATCH -p multi -N 3 -n 3
srun -N 3 -n 3 bash -c '{step}'
echo "$?" >"$OUT/done"
"""


class JobWideCase(st.SlurmTest):
    """The dataset, the job and its checks, for every test of multi-node jobs
    (test_two_jobs_share_nodes.py too)."""

    @classmethod
    def setUpClass(cls):
        cls.source = st.make_dataset("jobwide", seed=9, classes=6, per_class=24, large=6)
        cls.files = sorted(os.path.relpath(p, cls.source) for p in st.dataset_files(cls.source))
        cls.size = sum(os.path.getsize(os.path.join(cls.source, f)) for f in cls.files)
        cls.dirs = sum(1 for _ in os.walk(cls.source))  # the root included
        cls.reference = {}
        for f in cls.files:
            with open(os.path.join(cls.source, f), "rb") as h:
                cls.reference[f] = hashlib.md5(h.read()).hexdigest()

    def setUp(self):
        super().setUp()
        if len(st.MULTI) < 3:
            self.skipTest("needs 3 namespaced nodes (MONARCH_TEST_NODES)")

    def submit_job(self, pfs, name, user=USER):
        """Submits the 3-epoch job on the PFS as `user`; returns (job id,
        work dir)."""
        dataset = pfs.dataset("jobwide")
        work = st.workdir(user, name)
        with open(os.path.join(work, "list"), "w") as f:
            f.write("\n".join(self.files) + "\n")
        os.makedirs(os.path.join(work, "barrier"))
        os.chmod(os.path.join(work, "barrier"), 0o777)
        script = os.path.join(work, "job.sh")
        with open(script, "w") as f:
            f.write(BATCH.format(step=STEP.replace("'", "'\\''")))
        os.chmod(script, 0o755)
        job = st.sbatch(user, work, [f"--monarch-dataset={dataset}", script],
                        extra_env={"DS": dataset, "OUT": work, "READER": READER, "JOBS": st.JOBS,
                                   "COUNTS": os.path.join(pfs.mount, ".pfsemu-counts")})
        return job, work

    def check_job(self, job, work):
        """Waits for the job; checks it completed, every rank read right
        bytes in every epoch and the epilog left nothing. Returns the epochs
        {epoch: {"files": all ranks' files, "pfs": rank 0's counts}}."""
        st.wait_job(job, timeout=180)
        out = st.read(os.path.join(work, f"slurm-{job}.out"))
        errors = "".join(st.read(os.path.join(work, f"rank{r}.err")) for r in range(3)
                         if os.path.exists(os.path.join(work, f"rank{r}.err")))
        self.assertEqual(st.job_state(job), "COMPLETED", out + errors)
        self.assertEqual(st.read(os.path.join(work, "done")).strip(), "0", out + errors)
        epochs = {}
        for r in range(3):
            for line in st.read(os.path.join(work, f"rank{r}.out")).splitlines():
                e = json.loads(line)
                got = epochs.setdefault(e["epoch"], {"files": {}, "pfs": None})
                self.assertFalse(set(got["files"]) & set(e["files"]), "a file read by two ranks")
                got["files"].update(e["files"])
                got["pfs"] = got["pfs"] or e["pfs"]
        self.assertEqual(sorted(epochs), [1, 2, 3], "epochs completed")
        for e, got in epochs.items():
            wrong = [f for f in self.files if got["files"].get(f) != self.reference[f]]
            self.assertEqual(wrong, [], f"epoch {e}: files with wrong bytes (or unread)")
        self.assertNoLeftovers(job)
        return epochs

    def run_job(self, name, during=None):
        """Runs the 3-epoch job on the PFS; returns (epochs, pfs counts at
        submission, job id, work dir). during(job, work): called once the
        job runs."""
        pfs = st.Pfs()
        self.addCleanup(pfs.close)
        before = pfs.counts()
        job, work = self.submit_job(pfs, name)
        st.wait_running(job)
        if during:
            during(job, work)
        return self.check_job(job, work), before, job, work

    def reports(self, job, work):
        """Each node's statistics, by host."""
        out = st.node_reports(work, job)
        self.assertEqual(sorted(out), sorted(st.MULTI), f"reports in {work}")
        keys = ("copies", "peer_copies", "peer_fallbacks", "served_bytes", "peers_failed",
                "index_received", "copy_errors", "noroom", "alone")
        for host, stats in sorted(out.items()):
            t = stats["totals"]
            print(host, {k: t["stager"][k] for k in keys}, "readers: pfs_bytes", t["pfs_bytes"],
                  "pfs_opens", t["pfs_opens"], "fb_wait", t["fb_wait"], "fb_no_stager",
                  t["fb_no_stager"])
        return out

    def job_summary(self, job, work, user=USER):
        r = st.run_as(user, [st.REPORT, str(job)], cwd=work)
        self.assertEqual(r.returncode, 0, r.stderr)
        print(r.stdout.split("\n\n")[0])
        return r.stdout.split("\n\n")[0]


class JobWide(JobWideCase):
    def test_one_cache_for_the_job(self):
        epochs, before, job, work = self.run_job("jobwide")
        counts = [before] + [epochs[e]["pfs"] for e in (1, 2, 3)]
        delta = [{k: counts[i + 1][k] - counts[i][k] for k in counts[0]} for i in range(3)]
        stats = self.reports(job, work)  # printed first: what each node did
        total = sum(d["bytes"] for d in delta)
        print(f"PFS per epoch: {[d['bytes'] for d in delta]} bytes, dataset {self.size} bytes; "
              f"directory listings {sum(d['readdirs'] for d in delta)} for {self.dirs} directories")
        self.assertGreaterEqual(total, self.size, "the dataset came from the PFS")
        self.assertLessEqual(total, 1.02 * self.size, "a file left the PFS more than once")
        # Epochs 2-3 read nothing from the PFS. (A file a node has not copied
        # yet when a reader opens it is opened on the PFS, and read from a
        # copy: an open, no read.)
        for e in (1, 2):
            self.assertEqual((delta[e]["reads"], delta[e]["bytes"]), (0, 0), f"epoch {e + 1}")
        # One walk for the job: a listing takes 2 readdir requests a directory.
        self.assertLessEqual(sum(d["readdirs"] for d in delta), 2 * self.dirs + 2,
                             "the dataset was walked more than once")
        walkers = [h for h, s in stats.items() if not s["totals"]["stager"]["index_received"]]
        self.assertEqual(walkers, [st.MULTI[0]], "the nodes that walked the dataset")
        served = sum(s["totals"]["stager"]["served_bytes"] for s in stats.values())
        fetched = sum(s["totals"]["stager"]["peer_bytes"] for s in stats.values())
        # A node that stops waiting for an answer (its short calls time out
        # on a loaded machine) asks again: the sender counted both answers.
        self.assertGreaterEqual(served, fetched, "bytes sent by nodes and received by others")
        self.assertLessEqual(served, 1.1 * fetched, "answers sent that no node took")
        self.assertGreater(fetched, self.size, "nodes read files homed elsewhere from their home")
        for host, s in stats.items():
            self.assertEqual(s["totals"]["stager"]["peers_failed"], 0, host)
        # monarch-report JOBID: the job first, from every node's report.
        summary = self.job_summary(job, work)
        self.assertIn("on 3 nodes", summary)
        self.assertRegex(summary, r"PFS traffic of the whole job: .* \(1\.0[0-2]x the dataset")
        self.assertNotIn("did not finish", summary)

    def test_a_stager_killed_in_epoch_2(self):
        killed = []

        def kill_in_epoch_2(job, work):
            st.wait_for(lambda: os.path.exists(os.path.join(work, "barrier", "1-counted-r0")),
                        120, "epoch 1 to end")
            # The second node's stager: found by its job and its tier, as the
            # root namespace sees the node's processes.
            for s in st.stagers(job):
                if subprocess.run(["nsenter", "-t", str(s["pid"]), "-u", "hostname"],
                                  capture_output=True, text=True).stdout.strip() == st.MULTI[1]:
                    os.kill(s["pid"], signal.SIGKILL)
                    killed.append(s["pid"])
            self.assertEqual(len(killed), 1, "the stager of the second node")

        epochs, before, job, work = self.run_job("jobwide-kill", during=kill_in_epoch_2)
        stats = self.reports(job, work)
        failed = {h: s["totals"]["stager"]["peers_failed"] for h, s in stats.items()
                  if h != st.MULTI[1]}
        print(f"killed {killed}; nodes given up on, by node: {failed}")
        # The killed node's report says its stager did not finish; the others'
        # are complete (they gave the node up if they still needed it).
        for host, s in stats.items():
            self.assertEqual(s["complete"], host != st.MULTI[1], host)
        summary = self.job_summary(job, work)
        self.assertRegex(summary, rf"stagers that did not finish .*: {st.MULTI[1]}$")

    def test_each_node_holds_40_percent(self):
        """Tiers of 40% of the dataset a node: the job's nodes hold it all
        between them (homes a third each), quotas hold, bytes are right."""
        # The first tier (9M) holds the job map and the statistics' reserve,
        # and little room besides: the second holds the node's 40%. Plain
        # directories: a file system image that small would lose a share of
        # its quota to its own metadata.
        lines = ["job_space = directory"]
        for line in st.read(st.CONFIG).splitlines():
            if line.strip() == "quota = 256M":
                line = f"quota = {int(0.4 * self.size)}"
            lines.append(line)
        conf = os.path.join(st.ROOT, "forty.conf")
        with open(conf, "w") as f:
            f.write("\n".join(lines) + "\n")
        os.chmod(conf, 0o644)
        with st.plugstack_args(f"config={conf}"):
            epochs, before, job, work = self.run_job("forty")
        stats = self.reports(job, work)
        counts = [before] + [epochs[e]["pfs"] for e in (1, 2, 3)]
        per_epoch = [counts[i + 1]["bytes"] - counts[i]["bytes"] for i in range(3)]
        print(f"40% a node: PFS per epoch {[round(b / self.size, 3) for b in per_epoch]} "
              f"of the dataset")
        for host, s in stats.items():
            self.assertLessEqual(s["tiers"][1]["used"], s["tiers"][1]["quota"], host)
        self.assertGreaterEqual(sum(s["cached"]["bytes"] for s in stats.values()), self.size,
                                "the nodes hold the dataset between them")
        # What no node had room for came from the node that had it.
        self.assertLessEqual(sum(per_epoch), 1.02 * self.size, "a file left the PFS twice")
        self.assertGreater(sum(s["totals"]["peer_served_bytes"] for s in stats.values()), 0)

    def test_block_size_at_its_maximum(self):
        """Tiers with block_size = 1G, the largest the configuration takes:
        every copy of a file homed elsewhere still comes from its home (a
        peer answers in pieces, whatever the block), and a copy thread's
        buffer, a 1 GiB mapping, holds in memory only what its reads fill."""
        lines = []
        for line in st.read(st.CONFIG).splitlines():
            lines.append(line)
            if line.startswith("quota ="):
                lines.append("block_size = 1G")
        conf = os.path.join(st.ROOT, "block-1g.conf")
        with open(conf, "w") as f:
            f.write("\n".join(lines) + "\n")
        os.chmod(conf, 0o644)
        watch = {}

        def watch_stagers(job, work):
            watch["w"] = st.StagerWatch(job)
            watch["w"].start()

        with st.plugstack_args(f"config={conf}"):
            try:
                epochs, before, job, work = self.run_job("block-1g", during=watch_stagers)
            finally:
                if "w" in watch:
                    watch["w"].stop()
        stats = self.reports(job, work)
        hwm = sorted(watch["w"].hwm_kb.values())
        pfs = epochs[3]["pfs"]["bytes"] - before["bytes"]
        print(f"block_size 1G: stagers' VmHWM {[k // 1024 for k in hwm]} MiB; "
              f"PFS {pfs / self.size:.3f}x the dataset")
        self.assertEqual(len(hwm), 3, "a stager a node, seen")
        # copy_threads = 2 and 4 peer threads a stager: a buffer filled whole
        # would be 1 GiB; half of one is far above any stager's own memory.
        for kb in hwm:
            self.assertLess(kb, 512 * 1024, "a copy buffer held in memory whole")
        self.assertLessEqual(pfs, 1.02 * self.size, "a file left the PFS more than once")
        self.assertGreater(sum(s["totals"]["stager"]["peer_copies"] for s in stats.values()), 0)
        for host, s in stats.items():
            self.assertEqual(s["totals"]["stager"]["peer_fallbacks"], 0, host)

    def test_job_wide_no_keeps_each_node_on_its_own(self):
        conf = st.config_variant("per-node", general={"job_wide": "no"})
        with st.plugstack_args(f"config={conf}"):
            epochs, before, job, work = self.run_job("per-node")
        stats = self.reports(job, work)
        for host, s in stats.items():
            self.assertEqual(s["totals"]["stager"]["index_received"], 0, host)
            self.assertEqual(s["totals"]["stager"]["peer_bytes"], 0, host)
        counts = epochs[3]["pfs"]
        self.assertGreater(counts["readdirs"] - before["readdirs"], 2 * self.dirs + 2,
                           "each node walked the dataset")


if __name__ == "__main__":
    st.main()
