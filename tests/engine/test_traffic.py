#!/usr/bin/python3
"""PFS traffic, counted by the PFS itself (a counting FUSE mount), not by
Monarch: what reaches the PFS per epoch when the whole dataset fits, when half
fits, when eight processes read at once, and when no process uses Monarch."""
import json
import os
import shutil
import subprocess
import tempfile
import unittest

from harness import (AFTER_INDEX, BUILD, Case, FULL, PY, READER, SANITIZED, SMALL, Pfs, TierWatch,
                     conf_file, dataset, dataset_bytes, epoch_deltas, read_dataset, reference,
                     run, tier)

MONARCH_REPORT = os.path.join(BUILD, "stager", "monarch-report")


def copying(test, t, quota="10G"):
    """monarch-run's options for tier `t` with copies whatever the dataset's
    speed: the emulator here has no latency and a local disk behind it, as
    fast as a tier, where the fast-file-system check would stop copying
    (FastDataset tests that check)."""
    return ["--config", conf_file(test, t, quota=quota, copy_fast_dataset="yes")]


class Traffic(Case):
    @classmethod
    def setUpClass(cls):
        cls.root = dataset("full", **FULL)
        cls.ref = reference(cls.root)
        cls.size = dataset_bytes(cls.root)

    def run_epochs(self, pfs, quota, mode="read", extra=(), report=None):
        t = tier(self)
        opts = ["--dataset", pfs.dataset, *copying(self, t, quota), "--keep"]
        opts += ["--report", report] if report else []
        watch = TierWatch(t)
        before = pfs.counts()
        try:
            # From the map's publication: what the PFS serves before it is
            # the direct run's (README, Limitations).
            epochs, p = read_dataset(pfs.dataset, mode, monarch=opts, counts=pfs.counts_file,
                                     extra=extra, prefix=AFTER_INDEX)
        finally:
            watch.stop()
        self.assertSameBytes(epochs, self.ref)
        # monarch-run's summary (its fallbacks and why), for a failure's message.
        return epoch_deltas(before, epochs), watch, t, p.stderr[-3000:]

    def test_whole_dataset_fits(self):
        # The reader also stats every file, as loaders that check sizes do.
        report = os.path.join(tempfile.mkdtemp(prefix="monarch-report-"), "stats.json")
        self.addCleanup(shutil.rmtree, os.path.dirname(report), True)
        with Pfs(self.root) as pfs:
            d, watch, _, summary = self.run_epochs(pfs, "100%", extra=["--stat"], report=report)
        with open(report) as f:
            job = json.load(f)["totals"]
        self.assertGreater(d[0]["opens"], 0, "epoch 1 read the PFS")
        # Each byte comes from the PFS once: copied by the stager, or read
        # whole by a reader and handed over. The exception is the README's:
        # a read that finds its copy stalled (no progress for stall_timeout)
        # reads the PFS, and the report counts it (pfs_served_*, fb_wait).
        # What the job read from the PFS besides hand-overs is that.
        fallback = job["pfs_bytes"] - job["handoff_bytes"]
        self.assertTrue(fallback <= 0.02 * self.size or job.get("fb_wait", 0) > 0,
                        f"{fallback} bytes read from the PFS by the job with no fallback said\n"
                        + summary)
        self.assertLessEqual(d[0]["bytes"] - fallback, 1.02 * self.size,
                             f"epoch 1 read {d[0]['bytes'] / self.size:.3f}x the dataset, "
                             f"{fallback / self.size:.3f}x of it the job's fallbacks\n" + summary)
        print(f"epoch 1 read {d[0]['bytes'] / self.size:.3f}x the dataset, "
              f"{fallback / self.size:.3f}x of it reads that found their copy stalled "
              f"({job.get('fb_wait', 0)})", flush=True)
        for e in (1, 2):
            self.assertEqual((d[e]["opens"], d[e]["reads"]), (0, 0), f"epoch {e + 1}")
            # No metadata either: stat comes from the index. Reading the
            # counters file itself costs a lookup and a getattr or two.
            self.assertLessEqual(d[e]["lookups"] + d[e]["getattrs"], 4, f"epoch {e + 1}")
        self.assertGreaterEqual(watch.max_bytes, self.size, "the whole dataset was cached")

    def test_large_files_tfrecord_pattern(self):
        # The TensorFlow pattern: 256 KiB preads, several files read at once.
        # The dataset is records/ alone, so that every PFS read is one the
        # reader's files cause (stage-ahead of other files would run on).
        report = os.path.join(tempfile.mkdtemp(prefix="monarch-report-"), "stats.json")
        self.addCleanup(shutil.rmtree, os.path.dirname(report), True)
        with Pfs(self.root) as pfs:
            t = tier(self)
            records = os.path.join(pfs.dataset, "records")
            size = sum(os.path.getsize(os.path.join(records, n)) for n in os.listdir(records))
            before = pfs.counts()
            epochs, p = read_dataset(pfs.dataset, "tfrecord",
                                     monarch=["--dataset", records, *copying(self, t),
                                              "--report", report],
                                     counts=pfs.counts_file, extra=["--subdir", "records"],
                                     prefix=AFTER_INDEX)
        self.assertSameBytes(epochs, self.ref, "records/")
        with open(report) as f:
            job = json.load(f)["totals"]
        d = epoch_deltas(before, epochs)
        summary = p.stderr[-3000:]
        # Each file is prefetched whole on its first read: each byte once,
        # but for reads that found their copy stalled (as in
        # test_whole_dataset_fits), which the report counts.
        self.assertGreater(d[0]["bytes"], 0)
        fallback = job["pfs_bytes"] - job["handoff_bytes"]
        stalled = job.get("fb_wait", 0) > 0
        self.assertTrue(fallback <= 0.02 * size or stalled,
                        f"{fallback} bytes read from the PFS by the job with no fallback said\n"
                        + summary)
        self.assertLessEqual(sum(x["bytes"] for x in d) - fallback, 1.02 * size, summary)
        print(f"3 epochs read {sum(x['bytes'] for x in d) / size:.3f}x the records, "
              f"{fallback / size:.3f}x of it reads that found their copy stalled "
              f"({job.get('fb_wait', 0)})", flush=True)
        # Later epochs read nothing from the PFS (an open of a file whose copy
        # was still being written goes there, its reads not).
        if not stalled:
            self.assertEqual([x["reads"] for x in d[1:]], [0, 0], summary)

    def test_half_fits(self):
        quota = self.size // 2
        with Pfs(self.root) as pfs:
            d, watch, t, _ = self.run_epochs(pfs, str(quota))
        cached = 0
        for dirpath, _, names in os.walk(t):
            if "/data" in dirpath:
                cached += sum(os.path.getsize(os.path.join(dirpath, n)) for n in names)
        self.assertGreater(watch.samples, 10)
        self.assertLessEqual(watch.max_bytes, quota, "the tier exceeded its quota")
        self.assertEqual(watch.evicted, [], "copies disappeared during the job")
        self.assertGreater(cached, 0.4 * self.size, "the tier should be nearly full")
        for e in (1, 2):
            self.assertLessEqual(d[e]["bytes"], (self.size - cached) * 1.01,
                                 f"epoch {e + 1} read more than the uncached part")
            self.assertGreater(d[e]["bytes"], 0)

    def test_partial_read_costs_that_part_and_the_window(self):
        # A job that reads a part of the dataset, once (a test job, one class
        # folder): the PFS serves that part plus stage-ahead's window, 4% of
        # the dataset by default or a third of what the job read where that is
        # more (stager/src/ahead.h), not the whole dataset. A sixth of it
        # stays near the setting; a third widens the window past it, but not
        # on a tier that cannot hold the dataset (a copy no reader opens would
        # take the room of a file the job reads).
        root = dataset("small", **SMALL)
        size = dataset_bytes(root)
        for step, quota in ((6, "10G"), (3, "10G"), (3, str(size // 2))):
            grows = quota == "10G"
            with Pfs(root) as pfs:
                files = sorted(os.path.join(d, n) for d, _, ns in os.walk(pfs.dataset)
                               for n in ns if not n.startswith("."))
                part = files[::step]
                want = sum(os.path.getsize(p) for p in part)
                script = ("import sys, time\n"
                          "for p in sys.argv[1:]:\n"
                          "    open(p, 'rb').read()\n"
                          "time.sleep(2)\n")  # time for stage-ahead to go as far as it may
                before = pfs.counts()
                # From the map's publication: reads before it are unseen (README,
                # Limitations), and show stage-ahead nothing.
                run(AFTER_INDEX + [PY, "-c", script] + part,
                    monarch=["--dataset", pfs.dataset, *copying(self, tier(self), quota)])
                pfs_bytes = pfs.counts()["bytes"] - before["bytes"]
            window = max(0.04 * size, want / 3 if grows else 0)
            print(f"partial read: read {want / size:.3f} of the dataset, tier quota {quota}; "
                  f"the PFS served {pfs_bytes / size:.3f}; the window {window / size:.3f}")
            self.assertGreaterEqual(pfs_bytes, want)
            self.assertLessEqual(pfs_bytes, want + window + 4 * (4 << 20),
                                 "stage-ahead went further than its window")
            if window > 0.08 * size:  # it grew: stage-ahead fills it while the job sleeps
                self.assertGreater(pfs_bytes, want + 0.06 * size,
                                   "stage-ahead stopped at the setting's window")

    def test_two_tiers_on_one_file_system_count_its_room_once(self):
        # Two tiers on one file system that holds 0.6 of the dataset: each
        # sees all its free space, but together they hold it once, so the
        # window must not grow for a job that reads a third of the dataset.
        # (Counted per tier, their room looked like 1.2 of the dataset.) The
        # same two tiers on file systems of their own hold 1.2: there the
        # window grows, which shows the test can tell.
        root = dataset("small", **SMALL)
        size = dataset_bytes(root)
        for shared in (True, False):
            mounts = []
            for _ in range(1 if shared else 2):
                mnt = tempfile.mkdtemp(prefix="monarch-tmpfs-")
                self.addCleanup(os.rmdir, mnt)
                subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={int(size * 0.6)},mode=1777",
                                "tmpfs", mnt], check=True)
                self.addCleanup(subprocess.run, ["umount", "-l", mnt])
                mounts.append(mnt)
            conf = os.path.join(mounts[0], "monarch.conf")
            with open(conf, "w") as f:
                f.write("copy_fast_dataset = yes\n")
                for name, mnt in (("a", mounts[0]), ("b", mounts[-1])):
                    os.mkdir(os.path.join(mnt, name), 0o1777)
                    f.write(f"[tier.{name}]\npath = {mnt}/{name}\nquota = 10G\n")
            with Pfs(root) as pfs:
                files = sorted(os.path.join(d, n) for d, _, ns in os.walk(pfs.dataset)
                               for n in ns if not n.startswith("."))
                part = files[::3]
                want = sum(os.path.getsize(p) for p in part)
                script = ("import sys, time\n"
                          "for p in sys.argv[1:]:\n"
                          "    open(p, 'rb').read()\n"
                          "time.sleep(2)\n")
                before = pfs.counts()
                run(AFTER_INDEX + [PY, "-c", script] + part,
                    monarch=["--dataset", pfs.dataset, "--config", conf])
                pfs_bytes = pfs.counts()["bytes"] - before["bytes"]
            print(f"two tiers on {'one file system' if shared else 'two file systems'} of 0.6 "
                  f"of the dataset: read {want / size:.3f}, the PFS served {pfs_bytes / size:.3f}")
            self.assertGreaterEqual(pfs_bytes, want)
            if shared:
                self.assertLessEqual(pfs_bytes, want + 0.04 * size + 4 * (4 << 20),
                                     "the window grew: the file system's room was counted twice")
            else:
                self.assertGreater(pfs_bytes, want + 0.06 * size, "the window did not grow")

    def test_streams_seeked_to_their_end_do_not_move_the_window(self):
        # A stream's reads are stdio's own: Monarch knows only its position at
        # fclose, which is no evidence of bytes read. A job that opens the
        # largest file as a stream again and again, seeks to its end (and once
        # far past it) and closes it must not let stage-ahead copy the dataset:
        # the PFS serves that file's copy and the window, no more. (Counted
        # from the position, at most the file each time, 50 closes let
        # stage-ahead copy the whole dataset; counted without the clamp, one
        # stream seeked past its end did.)
        root = dataset("small", **SMALL)
        size = dataset_bytes(root)
        with Pfs(root) as pfs:
            files = sorted(os.path.join(d, n) for d, _, ns in os.walk(pfs.dataset)
                           for n in ns if not n.startswith("."))
            script = ("import ctypes, sys, time\n"
                      "libc = ctypes.CDLL(None)\n"
                      "libc.fopen.restype = ctypes.c_void_p\n"
                      "libc.fseek.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_int]\n"
                      "libc.fclose.argtypes = [ctypes.c_void_p]\n"
                      "for i in range(50):\n"
                      "    f = libc.fopen(sys.argv[1].encode(), b'r')\n"
                      "    assert libc.fseek(f, 1 << 50 if i == 0 else 0, 0 if i == 0 else 2) == 0\n"
                      "    libc.fclose(f)\n"
                      "time.sleep(2)\n")
            before = pfs.counts()
            big = max(files, key=os.path.getsize)
            n = os.path.getsize(big)
            run(AFTER_INDEX + [PY, "-c", script, big],
                monarch=["--dataset", pfs.dataset, *copying(self, tier(self))])
            pfs_bytes = pfs.counts()["bytes"] - before["bytes"]
        print(f"50 streams seeked to their end: the PFS served {pfs_bytes / size:.3f} of the dataset")
        # Its copy, and stage-ahead as far as the file and the window.
        self.assertLessEqual(pfs_bytes, 2 * n + max(0.04 * size, n / 3) + 4 * (4 << 20),
                             "stage-ahead went past its window")


class ManyProcesses(Case):
    def test_eight_readers_one_quota(self):
        root = dataset("small", **SMALL)
        ref = reference(root)
        size = dataset_bytes(root)
        quota = int(size * 0.7)
        t = tier(self)
        report = os.path.join(t, "report.json")
        script = " & ".join(f"{PY} {READER} {root} --mode read --epochs 2 --seed {i} > {t}/out{i}"
                            for i in range(8)) + " & wait"
        watch = TierWatch(t)
        try:
            run(["sh", "-c", script], monarch=["--dataset", root, *copying(self, t, quota),
                                               "--keep", "--report", report])
        finally:
            watch.stop()
        for i in range(8):
            with open(f"{t}/out{i}") as f:
                epochs = [json.loads(l) for l in f]
            self.assertSameBytes(epochs, ref, n_epochs=2)
        self.assertLessEqual(watch.max_bytes, quota)
        self.assertEqual(watch.evicted, [])
        with open(report) as f:
            stats = json.load(f)
        made = stats["totals"]["stager"]["copies"] + stats["totals"]["stager"]["handoffs"]
        self.assertGreater(stats["cached"]["files"], 0)
        self.assertEqual(made, stats["cached"]["files"], "a file was copied more than once")


class NobodyUsesMonarch(Case):
    def test_unused_job_is_reported_and_costs_one_window(self):
        # A job whose program never loads the library (LD_PRELOAD cleared, as
        # `enroot start` or `apptainer --cleanenv` do) reads the whole dataset
        # from the PFS behind Monarch's back, then sleeps: the summary says no
        # process used Monarch, and stage-ahead copied its first window and no
        # more (4% of the dataset, or one file larger than that), as the PFS's
        # own counters show. The same job with the library is the control.
        root = dataset("small", **SMALL)
        size = dataset_bytes(root)
        largest = max(os.path.getsize(os.path.join(d, n)) for d, _, ns in os.walk(root)
                      for n in ns)
        window = 0.04 * size
        for preload in (False, True):
            with Pfs(root) as pfs:
                t = tier(self)
                report = os.path.join(t, "stats.json")
                reader = [PY, READER, pfs.dataset, "--mode", "read", "--epochs", "1"]
                before = pfs.counts()
                p = run(AFTER_INDEX + ([] if preload else ["env", "-u", "LD_PRELOAD"]) + reader +
                        ["--pause", "2"],  # time for stage-ahead to go as far as it may
                        monarch=["--dataset", pfs.dataset, *copying(self, t), "--report", report])
                pfs_bytes = pfs.counts()["bytes"] - before["bytes"]
            with open(report) as f:
                stats = json.load(f)
            copied = stats["totals"]["stager"]["pfs_bytes"]
            print(f"LD_PRELOAD {'kept' if preload else 'removed'}: {stats['attached']}; the "
                  f"stager copied {copied / size:.3f} of the dataset, the PFS served "
                  f"{pfs_bytes / size:.3f}")
            if preload:
                self.assertGreaterEqual(stats["attached"]["processes"], 1)
                self.assertGreater(stats["attached"]["first_pid"], 0)
                self.assertRegex(stats["attached"]["first_command"], r"^(sh|sleep|python3?)$")
                self.assertNotIn("no process of the job used Monarch", p.stderr)
                self.assertIn("the job read ", p.stderr)
                continue
            self.assertEqual(stats["attached"]["processes"], 0)
            self.assertEqual(stats["totals"]["opens"], 0)
            self.assertIn("no process of the job used Monarch: none loaded the job map", p.stderr)
            self.assertIn("clears LD_PRELOAD", p.stderr)
            self.assertNotIn("the job read 0 B", p.stderr)
            self.assertGreater(copied, 0, "stage-ahead's first window")
            self.assertLessEqual(copied, window + largest, p.stderr[-3000:])
            # The PFS served the reader's one pass and the stager's copies, no more.
            self.assertLessEqual(pfs_bytes, size + window + largest + (1 << 20), p.stderr[-3000:])
            report_json = subprocess.run([MONARCH_REPORT, "--json", report], capture_output=True,
                                         text=True, check=True).stdout
            self.assertFalse(json.loads(report_json)["used_monarch"])


class FastDataset(Case):
    @unittest.skipIf(SANITIZED, "judged by the stager's open and read times, which a sanitizer "
                     "slows several times")
    def test_a_dataset_as_fast_as_a_tier_is_not_copied(self):
        # On a local disk (here, in the page cache) a copy gains nothing: the
        # stager's own reads show it, copying stops and readers read it
        # directly. copy_fast_dataset = yes copies it anyway.
        root = dataset("small", **SMALL)
        ref = reference(root)
        files = sum(len(ns) for _, _, ns in os.walk(root))
        cached = {}
        for copy_fast in ("no", "yes"):
            t = tier(self)
            conf = conf_file(self, t, quota="1G", copy_fast_dataset=copy_fast)
            report = os.path.join(t, "report.json")
            epochs, _ = read_dataset(root, "read", epochs=2, prefix=AFTER_INDEX,
                                     monarch=["--dataset", root, "--config", conf, "--keep",
                                              "--report", report])
            self.assertSameBytes(epochs, ref, n_epochs=2)
            with open(report) as f:
                stats = json.load(f)
            self.assertEqual(stats["totals"]["stager"]["copies_off"], copy_fast == "no")
            # The check reads copies' first bytes again from the PFS: counted.
            checked = stats["totals"]["stager"]["check_bytes"]
            if copy_fast == "no":
                self.assertGreater(checked, 0)
            else:
                self.assertEqual(checked, 0)
            cached[copy_fast] = stats["cached"]["files"]
        print(f"files cached of {files}: {cached['no']} (fast dataset), {cached['yes']} "
              f"(copy_fast_dataset = yes)")
        self.assertLess(cached["no"], files)
        self.assertEqual(cached["yes"], files)


if __name__ == "__main__":
    unittest.main(verbosity=2)
