#!/usr/bin/python3
"""Bytes identical, real readers: every common way a DL job reads files gives,
through monarch-run for 3 shuffled epochs, the bytes of a direct read."""
import json
import os
import re
import subprocess
import tempfile
import unittest

from harness import (AFTER_INDEX, Case, FIO_FILE, FIO_VERIFY, FULL, LIBRARY, PY, READER,
                     conf_file, dataset, preload, read_dataset, reference, run, tier)


class Readers(Case):
    @classmethod
    def setUpClass(cls):
        cls.root = dataset("full", **FULL)
        cls.ref = reference(cls.root)

    def monarch(self, report=None):
        # The dataset is on a local disk: copy_fast_dataset keeps the stager
        # copying, so that the readers read copies (the fast-file-system
        # check would send them to the dataset itself).
        conf = conf_file(self, tier(self), quota="100%", copy_fast_dataset="yes")
        opts = ["--dataset", self.root, "--config", conf]
        if report:
            opts += ["--report", report]
        return opts

    def check_mode(self, mode, subset=None, extra=()):
        epochs, p = read_dataset(self.root, mode, monarch=self.monarch(), extra=extra,
                                 prefix=AFTER_INDEX)
        self.assertSameBytes(epochs, self.ref, subset)
        # Not vacuous: Monarch served reads from the tier (monarch-run's
        # summary), or mapped copies (mappings are counted apart from reads).
        share = re.search(r"served from node-local tiers: ([0-9.]+)% of the bytes read"
                          if mode != "mmap" else r"mapped \(([0-9.]+)% of it local\)", p.stderr)
        self.assertTrue(share, p.stderr[-2000:])
        self.assertGreater(float(share.group(1)), 0, p.stderr[-2000:])
        return p

    def test_python_read(self):
        self.check_mode("read")

    def test_python_chunked_stream(self):
        self.check_mode("chunks", "images/class_001")

    def test_python_mmap(self):
        self.check_mode("mmap")

    def test_md5sum_fopen_fread(self):
        self.check_mode("md5sum", "images/", extra=["--subdir", "images"])

    def test_cat(self):
        self.check_mode("cat", "images/class_000", extra=["--subdir", "images/class_000"])

    def test_torch_dataloader_fork_workers(self):
        self.check_mode("loader", "images/", extra=["--subdir", "images"])

    def test_large_files_pread_threads(self):
        self.check_mode("threads", "records/", extra=["--subdir", "records", "--threads", "6"])

    def test_c_programs_only(self):
        # A job without Python or a shell (the job a ThreadSanitizer build
        # runs: its runtime cannot be preloaded into either, contrib/sanitize):
        # xargs starting 4 md5sum at a time, over every image file 3 times.
        files = sorted(k for k in self.ref if k.startswith("images/"))
        with tempfile.NamedTemporaryFile("w", prefix="monarch-files-") as listing:
            listing.writelines(os.path.join(self.root, k) + "\n" for k in files * 3)
            listing.flush()
            p = run(["xargs", "-a", listing.name, "-d", "\\n", "-P", "4", "-n", "64", "md5sum"],
                    monarch=self.monarch())
        sums = [line.split("  ", 1) for line in p.stdout.splitlines()]
        self.assertEqual(len(sums), 3 * len(files))
        bad = [path for s, path in sums if s != self.ref[os.path.relpath(path, self.root)]]
        self.assertEqual(bad, [], "files with wrong bytes")
        share = re.search(r"served from node-local tiers: ([0-9.]+)% of the bytes read", p.stderr)
        self.assertTrue(share, p.stderr[-2000:])
        self.assertGreater(float(share.group(1)), 0, p.stderr[-2000:])

    def test_fio_verify(self):
        f = FIO_FILE.format(root=self.root)
        p = run(["fio", "--name=check", "--filename=" + f, "--loops=3"] + FIO_VERIFY,
                monarch=self.monarch())
        self.assertIn("err= 0", p.stdout)
        # A corrupted byte is what fio's verification would catch.
        self.assertNotIn("verify failed", p.stdout + p.stderr)

    def test_stat_answers_equal_the_pfs(self):
        names = sorted(self.ref)[::97]
        script = ("import json, os, sys\n"
                  "fields = ('st_mode', 'st_ino', 'st_dev', 'st_nlink', 'st_uid', 'st_gid',"
                  " 'st_size', 'st_mtime_ns', 'st_ctime_ns', 'st_blocks', 'st_blksize')\n"
                  "out = {}\n"
                  "for n in sys.argv[2:]:\n"
                  "    p = os.path.join(sys.argv[1], n)\n"
                  "    with open(p, 'rb') as f:\n"
                  "        s, l, fs = os.stat(p), os.lstat(p), os.fstat(f.fileno())\n"
                  "    out[n] = [[getattr(x, k) for k in fields] for x in (s, l, fs)]\n"
                  "print(json.dumps(out))\n")
        args = [PY, "-c", script, self.root] + names
        direct = json.loads(run(args).stdout)
        through = json.loads(run(args, monarch=self.monarch()).stdout)
        self.assertEqual(through, direct)

    def test_preload_keeps_users_entries(self):
        # The library is appended to LD_PRELOAD; the user's own entries stay first.
        p = run([PY, "-c", "import os; print(os.environ['LD_PRELOAD'])"],
                monarch=self.monarch(), env={"LD_PRELOAD": preload("/lib/x86_64-linux-gnu/libm.so.6")})
        self.assertEqual(p.stdout.strip(), preload("/lib/x86_64-linux-gnu/libm.so.6",
                                                   os.path.realpath(LIBRARY)))


if __name__ == "__main__":
    unittest.main(verbosity=2)
