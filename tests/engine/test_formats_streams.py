#!/usr/bin/python3
"""Streams made on a descriptor (fdopen): numpy.fromfile(path) opens the
file, dups the descriptor and reads the dup through fdopen and fread, which
glibc makes with its own internal read(). Through monarch-run the files are
copied, counted and served from the copies in later epochs; the arrays are
the direct run's. What reaches the PFS is counted by the PFS itself."""
import hashlib
import json
import os
import re
import shutil
import tempfile
import unittest

from harness import AFTER_INDEX, PY, Case, Pfs, conf_file, run, tier

# Three epochs of np.fromfile over every shard; prints one JSON line per
# epoch: the arrays' hashes and the PFS's counters at the epoch's end.
PROGRAM = r"""
import hashlib, json, os, sys, time
import numpy as np
root, counts = sys.argv[1], sys.argv[2]
names = sorted(os.listdir(root))
job = os.environ.get("MONARCH_JOB_DIR")
for epoch in range(3):
    # Through Monarch, epochs 2 and 3 start once the copies are there (up to
    # 60 s), as a real epoch is long enough for them: only files the stager
    # was asked to copy are.
    for _ in range(6000 if job and epoch else 0):
        if len(os.listdir(os.path.join(job, "data"))) >= len(names):
            break
        time.sleep(0.01)
    out = {}
    for n in names:
        a = np.fromfile(os.path.join(root, n), dtype=np.uint16)
        out[n] = hashlib.md5(a.tobytes()).hexdigest() + f":{a.size}"
    with open(counts) as f:
        pfs = json.load(f)
    print(json.dumps({"epoch": epoch + 1, "files": out, "pfs": pfs}), flush=True)
"""

SHARDS = 8
SHARD_BYTES = 3 << 20


class Streams(Case):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="monarch-streams-")
        os.chmod(cls.tmp, 0o755)
        cls.root = os.path.join(cls.tmp, "tokens")
        os.makedirs(cls.root)
        for i in range(SHARDS):
            with open(os.path.join(cls.root, f"shard{i:02}.bin"), "wb") as f:
                f.write(os.urandom(SHARD_BYTES + 2 * i))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def epochs(self, p):
        return [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]

    def test_numpy_fromfile_is_copied_counted_and_served(self):
        with Pfs(self.root) as pfs:
            direct = self.epochs(run([PY, "-c", PROGRAM, pfs.dataset, pfs.counts_file]))
            t = tier(self)
            report = os.path.join(t, "report.json")
            conf = conf_file(self, t, copy_fast_dataset="yes")
            before = pfs.counts()
            p = run(AFTER_INDEX + [PY, "-c", PROGRAM, pfs.dataset, pfs.counts_file],
                    monarch=["--dataset", pfs.dataset, "--config", conf, "--keep",
                             "--report", report])
            served = self.epochs(p)
        self.assertEqual([e["files"] for e in served], [e["files"] for e in direct])
        with open(report) as f:
            stats = json.load(f)
        total = SHARDS * SHARD_BYTES + sum(2 * i for i in range(SHARDS))
        self.assertEqual(stats["cached"]["files"], SHARDS, "every shard copied")
        # Epochs 2 and 3 read the copies: what reaches the PFS is at most a
        # tenth of what they read (the counters file's own reads are a few KiB).
        snaps = [before] + [e["pfs"] for e in served]
        late = sum(snaps[i + 1]["bytes"] - snaps[i]["bytes"] for i in (1, 2))
        self.assertLessEqual(late, 0.1 * 2 * total, p.stderr[-3000:])
        # Counted: the job's reads of the shards, three epochs of them (the
        # streams' bytes as the kernel gave them to stdio), within 1%.
        said = re.search(r"the job read ([0-9.]+) MiB in (\d+) opens", p.stderr)
        self.assertTrue(said, p.stderr[-3000:])
        self.assertAlmostEqual(float(said.group(1)) * 2**20, 3 * total, delta=0.01 * 3 * total)
        self.assertEqual(int(said.group(2)), 3 * SHARDS)
        print(f"PFS bytes in epochs 2-3: {late} of {2 * total}; {said.group(0)}")


if __name__ == "__main__":
    unittest.main(verbosity=2)
