#!/usr/bin/python3
"""The report counts what programs did: real programs through monarch-run,
their own tally (or strace's) against the statistics' counters, within 1%.
  - np.memmap slices: mappings counted apart from reads, never as bytes read;
  - a stdio fread loop (libc's fopen/fread through ctypes): the reads the
    kernel saw, as strace counts them;
  - one file re-read 50 times: its bytes, and no pass over the dataset;
  - every file read in 3 shuffled epochs: 3 passes;
  - a file its user cannot read: the copy's failure named by its errno."""
import json
import os
import random
import re
import shutil
import subprocess
import tempfile
import unittest

from harness import AFTER_INDEX, PY, TEST_USER, Case, conf_file, ensure_user, run, tier

FILES, FILE_BYTES = 40, 256 << 10  # the dataset: 10 MiB
BIG_BYTES = 1 << 20  # big.bin: a tenth of the dataset

MEMMAP = r"""
import json, os, sys
import numpy as np
root, total, maps, mapped = sys.argv[1], 0, 0, 0
for i in range(10):
    p = os.path.join(root, f"f{i:02d}")
    m = np.memmap(p, dtype=np.uint8, mode="r")
    maps += 1
    mapped += m.size
    for start in range(0, m.size, 4096 * 7):  # slices, as a loader takes samples
        total += int(m[start:start + 1024].sum())
    del m
print(json.dumps({"mmaps": maps, "mmap_bytes": mapped, "sum": total}))
"""

FREAD = r"""
import ctypes, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.fopen.restype = ctypes.c_void_p
libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
libc.fread.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p]
libc.fclose.argtypes = [ctypes.c_void_p]
root, chunk = sys.argv[1], int(sys.argv[2])
buf = ctypes.create_string_buffer(chunk)
got = 0
for i in range(10, 20):
    f = libc.fopen(os.path.join(root, f"f{i:02d}").encode(), b"rb")
    while (n := libc.fread(buf, 1, chunk, f)) > 0:
        got += n
    libc.fclose(f)
print(json.dumps({"bytes": got}))
"""

REREAD = r"""
import json, os, sys
p, n = os.path.join(sys.argv[1], "big.bin"), 0
for _ in range(50):
    with open(p, "rb") as f:
        n += len(f.read())
print(json.dumps({"bytes": n}))
"""

EPOCHS = r"""
import json, os, random, sys
root, n = sys.argv[1], 0
names = sorted(os.listdir(root))
for e in range(3):
    random.Random(e).shuffle(names)
    for name in names:
        with open(os.path.join(root, name), "rb") as f:
            n += len(f.read())
print(json.dumps({"bytes": n}))
"""


class Counts(Case):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="monarch-counts-")
        os.chmod(cls.tmp, 0o755)
        cls.root = os.path.join(cls.tmp, "ds")
        os.mkdir(cls.root)
        rng = random.Random(26)
        for i in range(FILES):
            with open(os.path.join(cls.root, f"f{i:02d}"), "wb") as f:
                f.write(rng.randbytes(FILE_BYTES))
        with open(os.path.join(cls.root, "big.bin"), "wb") as f:
            f.write(rng.randbytes(BIG_BYTES))
        cls.size = FILES * FILE_BYTES + BIG_BYTES

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def through_monarch(self, args):
        """Runs `args` through monarch-run once the map is published: its
        stdout's last JSON line, the statistics, monarch-run's summary."""
        t = tier(self)
        conf = conf_file(self, t, quota="100%", copy_fast_dataset="yes")
        report = os.path.join(t, "stats.json")
        p = run(AFTER_INDEX + args,
                monarch=["--dataset", self.root, "--config", conf, "--keep", "--report", report])
        with open(report) as f:
            stats = json.load(f)
        tally = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
        return (tally[-1] if tally else None), stats, p.stderr

    def assertWithin1(self, counted, did, what, summary=""):
        self.assertLessEqual(abs(counted - did), 0.01 * did,
                             f"{what}: the report says {counted}, the program did {did}\n"
                             + summary[-3000:])

    def test_memmap_slices_are_mappings_not_reads(self):
        direct = json.loads(run([PY, "-c", MEMMAP, self.root]).stdout)
        tally, stats, summary = self.through_monarch([PY, "-c", MEMMAP, self.root])
        self.assertEqual(tally["sum"], direct["sum"])
        t = stats["totals"]
        self.assertWithin1(t["mmaps"], tally["mmaps"], "mappings", summary)
        self.assertWithin1(t["mmap_bytes"], tally["mmap_bytes"], "bytes mapped", summary)
        # np.memmap reads nothing itself: no bytes read, no pass, no served share of reads.
        self.assertLess(t["bytes"], 0.01 * tally["mmap_bytes"], summary)
        self.assertFalse([e for e in stats["epochs"] if e["complete"]], summary)
        self.assertIn(f"mappings: {tally['mmaps']} (", summary)
        self.assertNotRegex(summary, r"served from node-local tiers: [0-9.]+% of the bytes")

    def fread_case(self, chunk):
        """A fread loop of `chunk` bytes a call over 10 files: (reads the
        report counts, reads strace saw on those files, bytes of both)."""
        t = tempfile.mkdtemp(prefix="monarch-strace-")
        self.addCleanup(shutil.rmtree, t, True)
        trace = os.path.join(t, "trace")
        tally, stats, summary = self.through_monarch(
            ["strace", "-f", "-y", "-e", "trace=read,pread64,readv,preadv", "-o", trace,
             PY, "-c", FREAD, self.root, str(chunk)])
        self.assertEqual(tally["bytes"], 10 * FILE_BYTES)
        seen = 0
        with open(trace) as f:
            for line in f:
                if re.search(r"read[v64]*\(\d+<[^>]*/f1\d>", line):
                    seen += 1
        t = stats["totals"]
        return t["reads"], seen, t["bytes"], summary

    def test_stdio_fread_loop_counts_the_kernels_reads(self):
        # Freads smaller than stdio's buffer (4 KiB here): one kernel read a
        # buffer, and one that finds the end.
        counted, seen, nbytes, summary = self.fread_case(1000)
        print(f"fread of 1000 bytes: {counted} reads counted, {seen} seen by strace")
        self.assertGreater(seen, 10 * FILE_BYTES // 4096, "strace saw the stream's reads")
        self.assertWithin1(counted, seen, "reads of a 1000-byte fread loop", summary)
        self.assertEqual(nbytes, 10 * FILE_BYTES)
        # Freads of 32 KiB (md5sum's) go to the kernel whole: over-counted,
        # by the fread's size over the buffer's (printed for the README).
        counted, seen, _, _ = self.fread_case(32768)
        print(f"fread of 32 KiB: {counted} reads counted, {seen} seen by strace "
              f"({counted / seen:.2f}x)")
        self.assertGreaterEqual(counted, seen)

    def test_one_file_read_50_times_is_no_pass(self):
        tally, stats, summary = self.through_monarch([PY, "-c", REREAD, self.root])
        t = stats["totals"]
        self.assertEqual(tally["bytes"], 50 * BIG_BYTES)
        self.assertGreater(tally["bytes"], 4 * self.size)  # 4.5 times the dataset's bytes
        self.assertWithin1(t["bytes"], tally["bytes"], "bytes read", summary)
        self.assertEqual(t["opens"], 50)
        self.assertFalse([e for e in stats["epochs"] if e["complete"]], summary)
        self.assertIn(f"passes over the dataset: none: the job read "
                      f"{tally['bytes'] / self.size:.1f}x the dataset's bytes", summary)

    def test_three_epochs_are_three_passes(self):
        tally, stats, summary = self.through_monarch([PY, "-c", EPOCHS, self.root])
        t = stats["totals"]
        self.assertEqual(tally["bytes"], 3 * self.size)
        self.assertWithin1(t["bytes"], tally["bytes"], "bytes read", summary)
        complete = [e for e in stats["epochs"] if e["complete"]]
        self.assertEqual(len(complete), 3, summary)
        for e in complete:
            self.assertWithin1(e["counters"]["bytes"], self.size, "a pass's bytes", summary)

    def test_unreadable_file_named_by_its_errno(self):
        # A user's dataset with two files only root may read: the stager, the
        # user's, cannot copy them (EACCES); the job reads the others.
        ensure_user()
        root = tempfile.mkdtemp(prefix="monarch-denied-")
        self.addCleanup(shutil.rmtree, root, True)
        os.chmod(root, 0o755)
        for i in range(10):
            p = os.path.join(root, f"g{i}")
            with open(p, "wb") as f:
                f.write(os.urandom(64 << 10))
            os.chmod(p, 0 if i < 2 else 0o644)
        t = tier(self)
        conf = os.path.join(t, "monarch.conf")
        with open(conf, "w") as f:
            f.write(f"copy_fast_dataset = yes\n[tier.a]\npath = {t}\nquota = 100%\n")
        os.chmod(conf, 0o644)
        report = os.path.join(t, "stats.json")
        script = (f"import os, time\nfor i in range(2, 10): open({root!r} + f'/g{{i}}', 'rb').read()\n"
                  "time.sleep(1)")
        p = run(AFTER_INDEX + [PY, "-c", script], user=TEST_USER,
                monarch=["--dataset", root, "--config", conf, "--keep", "--report", report])
        with open(report) as f:
            stager = json.load(f)["totals"]["stager"]
        self.assertEqual(stager["copy_denied"], 2, p.stderr[-3000:])
        self.assertEqual(stager["copy_errors"], 2, p.stderr[-3000:])
        self.assertIn("note: 2 copies failed: permission denied (EACCES) reading the PFS file",
                      p.stderr)
        self.assertNotIn("I/O error", p.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
