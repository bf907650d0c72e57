"""A long test (label "long", never in `ctest -L slurm` or CI; issue 25): a
3-node job over 1,300,000 files of 512 B (million_dataset.py, made once) is
one cache. Copies are on (the tests' configuration forces them on), nodes
wait up to start_timeout = 300 s for the index, and each rank reads 20,000
random files once its node's map is published.

The dataset is read directly, not through the counting FUSE PFS (Pfs): Pfs
holds a descriptor for each inode the kernel remembers and fails with EMFILE
past its 20,000 (measured: a walk stopped at 19,970 files), and with
--inode-paths a walk through it measured 7,700 files a second against
140,000 directly (about 3 minutes a walk here, every node's walk at once in
a job that caches per node): the test would be about FUSE. The PFS traffic
of a job-wide cache is slurm.jobwide's.

While the job runs, each node's stager's VmRSS and VmHWM are sampled from
/proc every second (its node found by its UTS namespace); a stager past
6 GiB gets the job cancelled (the machine is shared). The same job over a
tiny dataset, first, gives each node's stager's own peak.

Asserts: one walk for the job (node 0); nodes 1 and 2 received the index
(index_received = 1, alone = 0); the ranks read the right bytes; each
stager's peak at most 110 bytes a file above its own on the tiny dataset
(its peak: its statistic peak_memory where it has one, else the highest
VmHWM sampled). Prints each node's time to its index (index_ms) and map, its
index's source and bytes, and its peak memory; saves the samples (memory.csv)
and a summary (summary.json) in the job's working directory."""
import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import threading
import time
from datetime import datetime

import million_dataset
import slurmtest as st

USER = "monarchtest"
SAMPLE = 20_000  # files each rank reads
BYTES_PER_FILE = 110  # the most a stager may grow a file of the dataset
ABORT_RSS = 6 << 30
SEED = 7

READ = r"""import hashlib, sys
root = sys.argv[1]
for rel in open(sys.argv[2]).read().split():
    with open(root + "/" + rel, "rb") as f:
        print(hashlib.md5(f.read()).hexdigest(), rel)
"""

# Each rank records when it started and when its node's map appeared, reads
# its sample, and keeps its node's stager log (the job directory goes at
# the job's end).
STEP = r"""#!/bin/bash
source "$JOBS/lib.sh"
R=$SLURM_PROCID
hostname >"$OUT/host$R"
date +%s.%N >"$OUT/start$R"
wait_path "$MONARCH_JOB_DIR/index" 900 || exit 1
date +%s.%N >"$OUT/mapped$R"
python3 "$OUT/read.py" "$DS" "$OUT/sample$R" >"$OUT/rank$R.md5" 2>"$OUT/rank$R.err"
rc=$?
cp "$MONARCH_JOB_DIR/stager.log" "$OUT/stager-$(hostname).log"
exit $rc
"""

BATCH = """#!/bin/bash
#SBATCH -p multi -N 3 -n 3
srun -N 3 -n 3 "$OUT/step.sh"
echo "$?" >"$OUT/done"
"""


def kib(status, key):
    m = re.search(rf"^{key}:\s+(\d+) kB", status, re.M)
    return int(m.group(1)) * 1024 if m else 0


class MemoryWatch(threading.Thread):
    """Samples the job's stagers every second: (seconds since start, node,
    pid, VmRSS, VmHWM, RssAnon, RssFile). Past ABORT_RSS it keeps the stagers' logs (in
    `work`) and cancels the job."""

    def __init__(self, job, work):
        super().__init__(daemon=True)
        self.job, self.work = job, work
        self.samples = []
        self.peak = {}  # node -> the highest VmHWM seen
        self.aborted = None
        self._stop_event = threading.Event()
        self.uts = {}
        for node in st.MULTI:
            pid = st.read(os.path.join(st.CLUSTER_DIR, "run", f"node-{node}.pid")).strip()
            self.uts[os.readlink(f"/proc/{pid}/ns/uts")] = node

    def run(self):
        start = time.monotonic()
        while not self._stop_event.is_set():
            t = time.monotonic() - start
            for s in st.stagers(self.job):
                try:
                    node = self.uts.get(os.readlink(f"/proc/{s['pid']}/ns/uts"), "?")
                    status = st.read(f"/proc/{s['pid']}/status")
                except OSError:
                    continue
                rss, hwm = kib(status, "VmRSS"), kib(status, "VmHWM")
                if not hwm:
                    continue  # exited between the listing and the read
                self.samples.append((round(t, 1), node, s["pid"], rss, hwm,
                                     kib(status, "RssAnon"), kib(status, "RssFile")))
                self.peak[node] = max(self.peak.get(node, 0), hwm)
                if rss > ABORT_RSS and not self.aborted:
                    self.aborted = f"{node}'s stager at {rss >> 20} MiB after {t:.0f} s"
                    self.keep_logs()
                    subprocess.run(["scancel", str(self.job)], check=False)
            self._stop_event.wait(max(0.0, 1 - (time.monotonic() - start - t)))

    def keep_logs(self):
        """The stagers' logs, from the nodes' tiers as this namespace sees them."""
        for node in st.MULTI:
            log = os.path.join(st.node_tiers(node)[0], f"monarch-job{self.job}", "stager.log")
            try:
                shutil.copy(log, os.path.join(self.work, f"stager-{node}.log"))
            except OSError:
                pass

    def stop(self):
        self._stop_event.set()
        self.join()

    def save(self, path):
        with open(path, "w") as f:
            f.write("seconds,node,pid,vmrss,vmhwm,rssanon,rssfile\n")
            f.writelines(",".join(map(str, s)) + "\n" for s in self.samples)


def log_time(line):
    return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S.%f").timestamp()


def index_times(log):
    """From a stager log: seconds from its first line to its map ("indexed
    ..."), and the lines that say how it got its index."""
    lines = log.splitlines()
    if not lines:
        return None, []
    first = log_time(lines[0])
    at = next((log_time(x) - first for x in lines if ": indexed " in x), None)
    how = [x[24:] for x in lines if "walking" in x or "alone" in x or "indexed" in x]
    return at, how


class JobWideMillion(st.SlurmTest):
    @classmethod
    def setUpClass(cls):
        t = time.monotonic()
        cls.big = million_dataset.dataset()
        print(f"dataset {cls.big} ready in {time.monotonic() - t:.1f} s")
        cls.big_files = million_dataset.FOLDERS * million_dataset.PER_FOLDER
        cls.tiny = st.make_dataset("jobwide", seed=9, classes=6, per_class=24, large=6)

    def setUp(self):
        super().setUp()
        if len(st.MULTI) < 3:
            self.skipTest("needs 3 namespaced nodes (MONARCH_TEST_NODES)")

    def tearDown(self):
        # The epilog's purge of the job's copies (about 32,000 entries a node
        # here) runs at the lowest I/O priority: measured 100-107 s with the
        # three nodes' purges at once. Awaited within a bound that leaves it
        # room, before the common check and its 2 minutes.
        try:
            st.wait_for(lambda: not any(exe == st.PURGE for _, exe in st.monarch_processes()),
                        1200, "the tiers' purges to end", interval=1)
        finally:
            super().tearDown()

    def config(self):
        """The tests' configuration with start_timeout = 300, plain directories
        for the job's space, room on the first tier for the map (82 bytes a
        file), the index's file (81) and the room kept for a restarted
        stager's map, no stage-ahead (1.3 M copies would keep this machine's
        2 cores busy for minutes, and the epilog's purge, at 300 entries a
        second, for an hour; copies on read stay on), and no debug log (a
        line per request)."""
        conf = st.config_variant("million", general={
            "start_timeout": 300, "log_level": "info", "stage_ahead": "no",
            "job_space": "directory"})
        text = st.read(conf).replace("quota = 9M", "quota = 1G")
        with open(conf, "w") as f:
            f.write(text)
        return conf

    def run_job(self, name, root, files, per_rank):
        """Runs the job over `root`, each rank reading `per_rank` of `files`
        (relative paths); returns its facts."""
        work = st.workdir(USER, name)
        rnd = random.Random(SEED)
        samples = [rnd.sample(files, min(per_rank, len(files))) for _ in range(3)]
        for r, sample in enumerate(samples):
            with open(os.path.join(work, f"sample{r}"), "w") as f:
                f.write("\n".join(sample) + "\n")
        for fname, text in (("read.py", READ), ("step.sh", STEP), ("job.sh", BATCH)):
            with open(os.path.join(work, fname), "w") as f:
                f.write(text)
            os.chmod(os.path.join(work, fname), 0o755)
        t = time.monotonic()
        job = st.sbatch(USER, work, [f"--monarch-dataset={root}", os.path.join(work, "job.sh")],
                        extra_env={"DS": root, "OUT": work, "JOBS": st.JOBS})
        watch = MemoryWatch(job, work)
        watch.start()
        try:
            st.wait_running(job, timeout=120)
            st.wait_job(job, timeout=1500)
        finally:
            watch.stop()
            watch.save(os.path.join(work, "memory.csv"))
        took = time.monotonic() - t
        out = st.read(os.path.join(work, f"slurm-{job}.out"))
        reports = st.node_reports(work, job)
        facts = {"job": job, "work": work, "seconds": round(took, 1), "aborted": watch.aborted,
                 "state": st.job_state(job), "peak": {}, "nodes": {}}
        host_of = {}
        for r in range(3):
            p = os.path.join(work, f"host{r}")
            if os.path.exists(p):
                host_of[r] = st.read(p).strip()
        for node in st.MULTI:
            log_path = os.path.join(work, f"stager-{node}.log")
            at, how = index_times(st.read(log_path)) if os.path.exists(log_path) else (None, [])
            stager = reports.get(node, {}).get("totals", {}).get("stager", {})
            rank = next((r for r, h in host_of.items() if h == node), None)
            waited = None
            if rank is not None and os.path.exists(os.path.join(work, f"mapped{rank}")):
                waited = round(float(st.read(os.path.join(work, f"mapped{rank}")))
                               - float(st.read(os.path.join(work, f"start{rank}"))), 1)
            # The stager's own peak (its statistic peak_memory) where it has
            # one; else the highest VmHWM sampled.
            peak = stager.get("peak_memory") or watch.peak.get(node, 0)
            facts["peak"][node] = peak
            facts["nodes"][node] = {
                "peak_mib": round(peak / 2**20, 1),
                "sampled_peak_mib": round(watch.peak.get(node, 0) / 2**20, 1),
                "index_ms": stager.get("index_ms"),
                "index_source": stager.get("index_source"),
                "index_bytes_in": stager.get("index_bytes_in"),
                "index_bytes_out": stager.get("index_bytes_out"),
                "map_after_s": None if at is None else round(at, 1),
                "rank_waited_s": waited,
                "index_received": stager.get("index_received"),
                "alone": stager.get("alone"),
                "log": how}
        wrong, read = [], 0
        for r, sample in enumerate(samples):
            p = os.path.join(work, f"rank{r}.md5")
            got = dict(line.split()[::-1] for line in st.read(p).splitlines()) \
                if os.path.exists(p) else {}
            read += len(got)
            for rel in sample:
                with open(os.path.join(root, rel), "rb") as f:
                    if got.get(rel) != hashlib.md5(f.read()).hexdigest():
                        wrong.append(rel)
        facts.update(files_read=read, wrong=len(wrong), done=(
            st.read(os.path.join(work, "done")).strip()
            if os.path.exists(os.path.join(work, "done")) else None))
        with open(os.path.join(work, "summary.json"), "w") as f:
            json.dump(facts, f, indent=1)
        print(f"== {name}: job {job}, {took:.0f} s, {facts['state']}, ranks read {read} files "
              f"({len(wrong)} wrong or unread){', ABORTED: ' + watch.aborted if watch.aborted else ''}")
        for node, n in facts["nodes"].items():
            source = n["index_source"]  # the source's place in the job's nodes, plus 1
            source = st.MULTI[source - 1] if source and n["index_received"] else "its walk"
            print(f"  {node}: peak {n['peak_mib']} MiB (sampled VmHWM {n['sampled_peak_mib']} "
                  f"MiB), map {n['map_after_s']} s after the stager's start (rank waited "
                  f"{n['rank_waited_s']} s), index_received {n['index_received']}, alone "
                  f"{n['alone']}, index_ms {n['index_ms']} from {source} (index bytes in "
                  f"{n['index_bytes_in']}, out {n['index_bytes_out']})")
            for line in n["log"]:
                print(f"    {line}")
        if os.path.exists(os.path.join(work, f"slurm-{job}.out")) and out.strip():
            print(out[-2000:])
        return facts

    def test_one_walk_for_a_million_files(self):
        tiny_files = sorted(os.path.relpath(p, self.tiny) for p in st.dataset_files(self.tiny))
        big_files = [million_dataset.path(i) for i in range(self.big_files)]
        with st.plugstack_args(f"config={self.config()}"):
            tiny = self.run_job("million-tiny", self.tiny, tiny_files, len(tiny_files))
            big = self.run_job("million", self.big, big_files, SAMPLE)
        bound = BYTES_PER_FILE * self.big_files
        for node in st.MULTI:
            above = big["peak"].get(node, 0) - tiny["peak"].get(node, 0)
            print(f"{node}: peak {above / 2**20:.0f} MiB above the tiny job's "
                  f"({above / self.big_files:.0f} bytes a file; at most {BYTES_PER_FILE})")
        self.assertIsNone(big["aborted"], "a stager's memory")
        self.assertEqual((tiny["state"], tiny["done"], tiny["wrong"]), ("COMPLETED", "0", 0),
                         f"the tiny job: see {tiny['work']}")
        self.assertEqual((big["state"], big["done"]), ("COMPLETED", "0"), f"see {big['work']}")
        self.assertEqual(big["wrong"], 0, "files read with wrong bytes, or unread")
        walkers = [n for n, f in big["nodes"].items() if f["index_received"] != 1]
        self.assertEqual(walkers, [st.MULTI[0]], "the nodes that walked the dataset")
        for node in st.MULTI[1:]:
            self.assertEqual(big["nodes"][node]["alone"], 0, f"{node} cached alone")
        for node in st.MULTI:
            self.assertLessEqual(big["peak"].get(node, 0) - tiny["peak"].get(node, 0), bound,
                                 f"{node}'s stager's peak memory above its own on a tiny dataset")


if __name__ == "__main__":
    st.main()
