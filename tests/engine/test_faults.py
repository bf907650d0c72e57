#!/usr/bin/python3
"""Faults: whatever goes wrong in Monarch, readers get the bytes and errors
they would get without it."""
import array
import contextlib
import glob
import json
import mmap
import os
import pwd
import random
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
import unittest

from harness import (AFTER_INDEX, BUILD, Case, LIBRARY, MONARCH_RUN, PY, READER, SMALL, STAGER,
                     TEST_USER, Pfs, conf_file, dataset, dataset_bytes, ensure_user, md5_file,
                     parse_epochs, preload, read_dataset, reference, run, stager_pids, tier)


def wait_for(pred, timeout=30, what="condition"):
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def copy_tree(src, test):
    """A private copy of a dataset that a test may change."""
    d = tempfile.mkdtemp(prefix="monarch-ds-")
    os.chmod(d, 0o755)
    test.addCleanup(shutil.rmtree, d, True)
    dst = os.path.join(d, "ds")
    shutil.copytree(src, dst)
    return dst


def rewrite(path, data):
    """Replaces a dataset file from outside the job, like another user of the PFS."""
    tmp = path + ".new"
    with open(tmp, "wb") as f:
        f.write(data)
    os.rename(tmp, path)


class Faults(Case):
    @classmethod
    def setUpClass(cls):
        cls.root = dataset("small", **SMALL)
        cls.ref = reference(cls.root)

    def test_stager_killed_mid_epoch(self):
        t = tier(self)
        p = subprocess.Popen([MONARCH_RUN, "--dataset", self.root, "--tier", t, "--", PY, READER,
                              self.root, "--mode", "read", "--epochs", "3"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_for(lambda: stager_pids(t), what="the stager")
        # First copies, and the first statistics (the summary comes from them).
        wait_for(lambda: any(os.path.isdir(os.path.join(t, d, "data")) and
                             os.listdir(os.path.join(t, d, "data")) and
                             os.path.exists(os.path.join(t, d, "stats.json"))
                             for d in os.listdir(t)), what="first copies")
        for pid in stager_pids(t):
            os.kill(pid, signal.SIGKILL)
        out, err = p.communicate(timeout=600)
        self.assertEqual(p.returncode, 0, err)
        self.assertSameBytes(parse_epochs(out), self.ref)
        self.assertIn("incomplete", err)  # the summary says the statistics are partial

    def test_no_stager_at_all(self):
        job = tempfile.mkdtemp(prefix="monarch-nojob-")
        self.addCleanup(os.rmdir, job)
        env = {"LD_PRELOAD": preload(LIBRARY), "MONARCH_DATASET": self.root, "MONARCH_JOB_DIR": job,
               "MONARCH_LOG": "1"}
        epochs, p = read_dataset(self.root, "read", env=env)
        self.assertSameBytes(epochs, self.ref)
        # Not vacuous: the library ran, found no job map, and said so.
        self.assertIn(f"no job map at {job}/index", p.stderr)
        # A job directory the process cannot see at all (a container that does
        # not mount it): one line, without MONARCH_LOG too.
        env = {"LD_PRELOAD": preload(LIBRARY), "MONARCH_DATASET": self.root,
               "MONARCH_JOB_DIR": "/nonexistent/monarch-job"}
        epochs, p = read_dataset(self.root, "read", env=env)
        self.assertSameBytes(epochs, self.ref)
        said = [line for line in p.stderr.splitlines()
                if line.startswith("monarch: the job directory /nonexistent/monarch-job is not "
                                   "visible")]
        self.assertEqual(len(said), 1, p.stderr)

    def test_tier_runs_out_of_space(self):
        mnt = tempfile.mkdtemp(prefix="monarch-tmpfs-")
        self.addCleanup(os.rmdir, mnt)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m,mode=1777", "tmpfs", mnt],
                       check=True)
        self.addCleanup(subprocess.run, ["umount", "-l", mnt])
        # Another job fills the file system while this one copies (once the
        # first copy is there: 60 s at most).
        filler = subprocess.Popen(["sh", "-c", "i=0; until find " + mnt + " -path '*/data/*' "
                                   "-type f | grep -q .; do [ $i -lt 6000 ] || break; "
                                   "sleep 0.01; i=$((i+1)); done; "
                                   f"dd if=/dev/zero of={mnt}/filler bs=1M 2>/dev/null; true"])
        # The dataset is on a local disk: copy_fast_dataset keeps the stager copying.
        conf = os.path.join(tempfile.mkdtemp(prefix="monarch-conf-"), "monarch.conf")
        self.addCleanup(shutil.rmtree, os.path.dirname(conf), True)
        with open(conf, "w") as f:
            f.write(f"copy_fast_dataset = yes\n[tier.a]\npath = {mnt}\nquota = 10G\n")
        epochs, p = read_dataset(self.root, "read", prefix=AFTER_INDEX,
                                 monarch=["--dataset", self.root, "--config", conf, "--keep"])
        filler.wait()
        self.assertSameBytes(epochs, self.ref)
        # Every published copy is complete.
        jobs = [d for d in os.listdir(mnt) if d.startswith("monarch-")]
        self.assertEqual(len(jobs), 1)
        data = os.path.join(mnt, jobs[0], "data")
        copies = 0
        for d, _, names in os.walk(data):
            for n in names:
                rel = os.path.relpath(os.path.join(d, n), data)
                self.assertEqual(md5_file(os.path.join(d, n)), self.ref[rel], rel)
                copies += 1
        self.assertGreater(copies, 0)
        self.assertLess(copies, len(self.ref), "the tier could not have held everything")
        with open(os.path.join(mnt, jobs[0], "stats.json")) as f:
            stats = json.load(f)
        s = stats["totals"]["stager"]
        self.assertGreater(s["tier_full"] + s["noroom"], 0, "placement noticed the full tier")

    def test_rewritten_file_new_stager_never_serves_old_copy(self):
        root = copy_tree(self.root, self)
        t = tier(self)
        job = "restart"
        env = dict(os.environ, LD_PRELOAD=preload(LIBRARY), MONARCH_DATASET=root,
                   MONARCH_JOB_DIR=os.path.join(t, "monarch-" + job))
        victim = sorted(k for k in self.ref if k.startswith("images/"))[0]
        path = os.path.join(root, victim)

        conf = conf_file(self, t, copy_fast_dataset="yes")  # a local disk: keep copying

        index = os.path.join(t, "monarch-" + job, "index")

        def inode(p):
            with contextlib.suppress(FileNotFoundError):
                return os.stat(p).st_ino

        def start():
            # Ready once its own map is published (by a rename: a new inode;
            # a restarted stager finds the first one's index there): a read
            # before it asks for no copy.
            old = inode(index)
            s = subprocess.Popen([STAGER, "--dataset", root, "--job", job, "--config", conf])
            wait_for(lambda: inode(index) not in (None, old), what="stager ready")
            return s

        def read(p):
            return subprocess.run([PY, "-c", f"import hashlib;print(hashlib.md5(open('{p}','rb')"
                                   ".read()).hexdigest())"], env=env, capture_output=True,
                                  text=True, check=True).stdout.strip()

        s = start()
        self.assertEqual(read(path), self.ref[victim])
        copy = os.path.join(t, "monarch-" + job, "data", victim)
        wait_for(lambda: os.path.exists(copy), what="the copy")
        wait_for(lambda: len(os.listdir(os.path.dirname(copy))) > 3, what="stage-ahead")
        s.terminate()
        s.wait()
        rewrite(path, b"new bytes" * 1000)
        s = start()
        try:
            self.assertEqual(read(path), md5_file(path))
            self.assertNotEqual(read(path), self.ref[victim])
        finally:
            s.terminate()
            s.wait()
        with open(os.path.join(t, "monarch-" + job, "stats.json")) as f:
            stats = json.load(f)["totals"]["stager"]
        self.assertGreaterEqual(stats["discarded"], 1, "the old copy was dropped")
        self.assertGreater(stats["adopted"], 0, "unchanged copies were kept")

    def test_rewritten_file_per_open_check(self):
        root = copy_tree(self.root, self)
        t = tier(self)
        conf = os.path.join(t, "open.conf")
        with open(conf, "w") as f:
            # The dataset is on a local disk: copy_fast_dataset keeps the stager
            # copying (the fast-file-system check stopped it once, and the
            # wait below for both copies never ended).
            f.write(f"consistency = open\nsmall_file_max = 64K\ncopy_fast_dataset = yes\n"
                    f"[tier.a]\npath = {t}\nquota = 1G\n")
        small = sorted(k for k in self.ref if k.startswith("images/"))[0]
        large = sorted(k for k in self.ref if k.startswith("records/"))[0]
        script = f"""
import hashlib, os, subprocess, sys, time
root, t = {root!r}, {t!r}
def md5(p):
    return hashlib.md5(open(os.path.join(root, p), 'rb').read()).hexdigest()
def cached(p):
    return any(os.path.exists(os.path.join(t, d, 'data', p)) for d in os.listdir(t)
               if d.startswith('monarch-'))
def rewrite(p, n):  # n new random bytes, from a process outside Monarch, like another PFS client
    env = {{k: v for k, v in os.environ.items() if k != 'LD_PRELOAD'}}
    subprocess.run([sys.executable, '-c', 'import os,sys; p=sys.argv[1]; '
                    'open(p+".new","wb").write(os.urandom(int(sys.argv[2]))); os.rename(p+".new",p)',
                    os.path.join(root, p), str(n)], env=env, check=True)
out = [md5({small!r})]
deadline = time.time() + 120
# Both files are read again until their copies appear: a read made before
# the stager's map exists (the command starts before the stager) asks for no copy.
while not cached({small!r}) or not cached({large!r}):
    if time.time() > deadline:
        sys.exit("the copies of both files never appeared")
    md5({small!r}); md5({large!r}); time.sleep(0.05)
rewrite({small!r}, 7000)
out.append(md5({small!r}))
# One open across a rewrite: the bytes of that open stay the old file's.
f = open(os.path.join(root, {large!r}), 'rb')
head = f.read(256 << 10)
rewrite({large!r}, 1 << 20)
out.append(hashlib.md5(head + f.read()).hexdigest())
out.append(md5({large!r}))
print(' '.join(out))
"""
        p = run([PY, "-c", script], monarch=["--dataset", root, "--config", conf])
        first, after, one_open, reopened = p.stdout.split()
        self.assertEqual(first, self.ref[small])
        self.assertEqual(after, md5_file(os.path.join(root, small)))
        self.assertEqual(one_open, self.ref[large], "one open saw old and new bytes mixed")
        self.assertEqual(reopened, md5_file(os.path.join(root, large)))

    def test_unreadable_file_same_errno(self):
        ensure_user()
        root = copy_tree(self.root, self)
        names = sorted(self.ref)
        for n in names[:3]:
            os.chmod(os.path.join(root, n), 0)
        script = f"""
import errno, hashlib, os
root = {root!r}
res = []
for n in {names[:20]!r}:
    try:
        res.append(hashlib.md5(open(os.path.join(root, n), 'rb').read()).hexdigest())
    except OSError as e:
        res.append(errno.errorcode[e.errno])
print(' '.join(res))
"""
        direct = run([PY, "-c", script], user=TEST_USER).stdout
        through = run([PY, "-c", script], user=TEST_USER,
                      monarch=["--dataset", root, "--tier", tier(self)]).stdout
        self.assertEqual(direct.split()[:3], ["EACCES"] * 3)
        self.assertEqual(through, direct)

    def test_bad_config_clear_error_and_no_stager(self):
        t = tier(self)
        conf = os.path.join(t, "bad.conf")
        with open(conf, "w") as f:
            f.write(f"copy_threads = 4\n[tier.a]\npath = {t}\nquota = lots\n")
        p = run(["true"], monarch=["--dataset", self.root, "--config", conf], check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn(f"{conf}:4: key 'tier.a.quota', value 'lots'", p.stderr)
        self.assertIn("accepted: a size such as 500G", p.stderr)
        self.assertEqual(stager_pids(t), [])
        self.assertFalse([d for d in os.listdir(t) if d.startswith("monarch-")])

    def test_bad_dataset_clear_error(self):
        p = run(["true"], monarch=["--dataset", "/nonexistent/ds", "--tier", tier(self)],
                check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("/nonexistent/ds", p.stderr)
        self.assertIn("No such file or directory", p.stderr)


FAULT_READER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fault_reader.py")
STALL = 0.2  # the shipped stall_timeout


def mount_tmpfs(test, size):
    mnt = tempfile.mkdtemp(prefix="monarch-tmpfs-")
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=1777", "tmpfs", mnt],
                   check=True)
    test.addCleanup(os.rmdir, mnt)
    test.addCleanup(subprocess.run, ["umount", "-l", mnt])
    return mnt


def job_dirs(t):
    return [d for d in os.listdir(t) if d.startswith("monarch-")]


class Faults12(Case):
    """Issue 12: whatever breaks around Monarch, a job is never killed, stalled
    or confused."""

    @classmethod
    def setUpClass(cls):
        cls.root = dataset("small", **SMALL)
        cls.ref = reference(cls.root)

    def epochs_of(self, stdout):
        return [json.loads(l) for l in stdout.splitlines() if l.startswith("{")]

    def assert_bytes(self, epochs, n):
        self.assertEqual(len(epochs), n)
        for e in epochs:
            self.assertEqual(e["failed"], 0, "a worker died")
            bad = [k for k, v in self.ref.items() if e["files"].get(k) != v]
            self.assertEqual(bad, [], f"epoch {e['epoch']}: wrong bytes")

    def test_no_memory_for_copy_buffers_fails_no_file(self):
        # The copy threads cannot map their buffers for the job's first
        # second (a node short of memory): files go back to be copied later,
        # never failed for good, and readers get the PFS's bytes meanwhile.
        # (A failed map failed the file for the job, and stage-ahead went on
        # opening the rest of the dataset on the PFS for nothing.)
        t = tier(self)
        report = os.path.join(t, "report.json")
        shim = os.path.join(BUILD, "tests", "engine", "libmonarch_test_nomem.so")
        conf = conf_file(self, t, copy_fast_dataset="yes")
        epochs, p = read_dataset(self.root, "read", epochs=3, prefix=AFTER_INDEX,
                                 env={"LD_PRELOAD": preload(shim), "MONARCH_TEST_NOMEM_SECONDS": "1"},
                                 monarch=["--dataset", self.root, "--config", conf, "--keep",
                                          "--report", report])
        self.assertSameBytes(epochs, self.ref)
        with open(report) as f:
            stats = json.load(f)
        s = stats["totals"]["stager"]
        print(f"copies {s['copies']}, copy errors {s['copy_errors']}, waits for a buffer "
              f"{s['no_buffer']}, cached "
              f"{stats['cached']['files']} of {len(self.ref)} files")
        self.assertEqual(s["copy_errors"], 0, p.stderr[-2000:])
        self.assertGreater(s["no_buffer"], 0, "the shim refused no buffer")
        # The stager's log file: its stderr goes to /dev/null once its map is
        # published, which may come before its copy threads first run.
        logs = glob.glob(os.path.join(t, "**", "stager.log"), recursive=True)
        log = ""
        for f in logs:
            with open(f) as lf:
                log += lf.read()
        self.assertEqual(log.count("no memory for a copy buffer"), 1, f"{logs}: {log[-2000:]}")
        self.assertEqual(stats["cached"]["files"], len(self.ref),
                         "every file copied once memory came back")

    def test_full_tier_kills_no_reader(self):
        mnt = mount_tmpfs(self, "64m")
        script = f"""
import os, subprocess, sys
mnt, root = {mnt!r}, {self.root!r}
# Another job fills the tier's file system once the stager is up (its map
# published: AFTER_INDEX).
subprocess.run(['dd', 'if=/dev/zero', 'of=' + mnt + '/filler', 'bs=1M'], stderr=subprocess.DEVNULL)
files = sorted(os.path.join(d, n) for d, _, ns in os.walk(root) for n in ns)
cats = [subprocess.run(['cat', f], stdout=subprocess.DEVNULL).returncode for f in files[:40]]
loader = subprocess.run([sys.executable, {FAULT_READER!r}, root, '--workers', '8',
                         '--epochs', '2'], capture_output=True, text=True)
def cmdline(p):
    try:
        return open('/proc/' + p + '/cmdline', 'rb').read().split(bytes(1))
    except OSError:
        return [b'']
stagers = [p for p in os.listdir('/proc') if p.isdigit() and
           cmdline(p)[0].endswith(b'monarch-stager') and any(mnt.encode() in c for c in cmdline(p))]
print(sum(c != 0 for c in cats), len(stagers), loader.returncode)
sys.stdout.write(loader.stdout)
"""
        p = run(AFTER_INDEX + [PY, "-c", script],
                monarch=["--dataset", self.root, "--tier", f"{mnt}:60M"], timeout=600)
        failed_cats, stagers, loader_rc = map(int, p.stdout.split("\n")[0].split())
        self.assertEqual(failed_cats, 0, "short readers died on a full tier")
        self.assertEqual(loader_rc, 0)
        self.assertEqual(stagers, 1, "the stager died")
        self.assert_bytes(self.epochs_of(p.stdout), 2)

    def test_tier_full_before_start_runs_without_monarch(self):
        mnt = mount_tmpfs(self, "16m")
        subprocess.run(["dd", "if=/dev/zero", f"of={mnt}/filler", "bs=1M"],
                       stderr=subprocess.DEVNULL)
        p = run([PY, FAULT_READER, self.root], monarch=["--dataset", self.root, "--tier", mnt])
        self.assertIn("Monarch is off for this run", p.stderr)
        self.assert_bytes(self.epochs_of(p.stdout), 1)
        self.assertEqual(job_dirs(mnt), [])

    def timed_epoch(self, pfs_args, monarch=None, fault=None, epochs=1, pause_epoch=0):
        """Runs the reader over an emulated PFS; `fault(test_dir)` is called
        once the stager is up, before epoch `pause_epoch`."""
        with Pfs(self.root, latency_us=1000, **pfs_args) as pfs:
            if monarch is None:
                p = run([PY, FAULT_READER, pfs.dataset, "--epochs", str(epochs)], timeout=600)
                return self.epochs_of(p.stdout)
            t = tier(self)
            pause = os.path.join(tempfile.mkdtemp(prefix="monarch-pause-"), "go")
            self.addCleanup(shutil.rmtree, os.path.dirname(pause), True)
            cmd = [MONARCH_RUN, "--dataset", pfs.dataset, "--tier", t] + monarch + [
                "--", PY, FAULT_READER, pfs.dataset, "--epochs", str(epochs),
                "--pause-file", pause, "--pause-epoch", str(pause_epoch)]
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True)
            # Its map published: a fault before it would test the PFS alone.
            wait_for(lambda: stager_pids(t) and job_dirs(t) and
                     os.path.exists(os.path.join(t, job_dirs(t)[0], "index")),
                     what="the stager ready")
            stager = stager_pids(t)[0]
            if fault:
                fault(stager)
            open(pause, "w").close()
            out, err = proc.communicate(timeout=600)
            self.assertEqual(proc.returncode, 0, err)
            return self.epochs_of(out)

    def call_bound(self, direct):
        """The longest a call may take: the stall bound plus 10% (issue 12),
        after which the call is the PFS's own, as long as the longest call
        of the direct run beside it (on a loaded machine, tens of ms)."""
        return STALL * 1.1 + max(e["longest"] for e in direct)

    def test_stalled_copies_cost_one_stall_at_most(self):
        # The PFS hangs every read of the stager's copy threads, as a stuck
        # PFS request would: readers wait at most the stall timeout, once.
        # Copy threads stuck also leave readers' hand-overs unwritten: the
        # second epoch finds every small file claimed and its copy pending.
        direct = self.timed_epoch({}, epochs=2)
        stalled = self.timed_epoch({"stall_comm": "monarch-"}, monarch=[], epochs=2)
        self.assert_bytes(stalled, 2)
        for d, s in zip(direct, stalled):
            print(f"stalled copies: epoch {s['epoch']} {s['seconds']:.2f} s vs direct "
                  f"{d['seconds']:.2f} s; longest call {s['longest'] * 1000:.0f} ms")
            self.assertLessEqual(s["seconds"], 2 * d["seconds"])
            self.assertLessEqual(s["longest"], self.call_bound(direct))

    def test_stager_stopped_or_killed_costs_one_stall_at_most(self):
        for name, fault in (("SIGSTOP", lambda pid: os.kill(pid, signal.SIGSTOP)),
                            ("kill -9", lambda pid: os.kill(pid, signal.SIGKILL))):
            stopped = []

            def inject(pid):
                stopped.append(pid)
                fault(pid)

            try:
                epochs = self.timed_epoch({}, monarch=[], fault=inject, epochs=2)
            finally:
                for pid in stopped:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            self.assert_bytes(epochs, 2)
            longest = max(e["longest"] for e in epochs)
            print(f"{name}: longest call {longest * 1000:.0f} ms")
            self.assertLessEqual(longest, self.call_bound(self.timed_epoch({}, epochs=2)), name)

    def test_one_open_never_mixes_versions(self):
        # 1000 times: a reader's first read starts the copy of a file; the file
        # is replaced on the PFS (written elsewhere, renamed over it) while its
        # copy is under way; a new open reads it whole. Every open must read
        # the version it opened (checked with a raw system call Monarch never
        # sees), never the other one's bytes, never a mix.
        src = tempfile.mkdtemp(prefix="monarch-versions-")
        self.addCleanup(shutil.rmtree, src, True)
        os.chmod(src, 0o755)
        ds = os.path.join(src, "ds")
        os.mkdir(ds)
        nfiles, blocks = 1000, 64  # 256 KiB each, above small_file_max: read as it is copied

        def version(i, v):
            return b"".join(struct.pack("<QQQ", i, v, b) * 170 + bytes(16) for b in range(blocks))

        for i in range(nfiles):
            with open(os.path.join(ds, f"f{i:04d}"), "wb") as f:
                f.write(version(i, 0))
        script = f"""
import ctypes, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
import glob, threading, time
src, root, tier_dir = sys.argv[1], sys.argv[2], sys.argv[3]
raw = ctypes.create_string_buffer(24)

def copying():  # the stager has opened the file and writes its copy
    end = time.monotonic() + 0.05
    while not glob.glob(os.path.join(tier_dir, "monarch-*", "tmp", "*")):
        if time.monotonic() > end:
            return 0
        time.sleep(0.0005)
    return 1

def replace(i, v):  # outside Monarch: raw system calls, as another PFS client
    data = b"".join(struct.pack("<QQQ", i, v, b) * 170 + bytes(16) for b in range({blocks}))
    tmp = os.path.join(src, "tmp").encode()
    fd = libc.syscall(257, -100, tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    libc.syscall(1, fd, data, len(data))
    libc.syscall(3, fd)
    libc.syscall(82, tmp, os.path.join(src, "ds", "f%04d" % i).encode())

def versions(fd):
    libc.syscall(17, fd, raw, 24, 4096 * ({blocks} - 1))  # SYS_pread64: the open's own version
    seen = {{struct.unpack_from('<QQQ', raw.raw)[1]}}
    off = 0
    while b := os.pread(fd, 65536, off):
        for k in range(0, len(b), 4096):
            seen.add(struct.unpack_from('<QQQ', b, k)[1])
        off += len(b)
    return seen

wrong = during = 0
for i in range({nfiles}):
    p = os.path.join(root, "f%04d" % i)
    a = os.open(p, os.O_RDONLY)
    first = threading.Thread(target=os.pread, args=(a, 65536, 0))  # asks for a copy, waits
    first.start()
    during += copying()
    replace(i, 1)                  # while the copy is made
    b = os.open(p, os.O_RDONLY)    # the new version, opened while the old one is copied
    first.join()
    wrong += len(versions(b)) > 1
    wrong += len(versions(a)) > 1  # and the first open keeps its own version
    os.close(a)
    os.close(b)
print(during, wrong)
"""
        with Pfs(ds, latency_us=1000, bandwidth_mbs=20, attr_timeout_ms=0) as pfs:
            t = tier(self)
            conf = conf_file(self, t, small_file_max="64K", stage_ahead="no")
            p = run(AFTER_INDEX + [PY, "-c", script, src, pfs.dataset, t], timeout=600,
                    monarch=["--dataset", pfs.dataset, "--config", conf, "-q"])
        replaced, wrong = map(int, p.stdout.split())
        print(f"versions: {replaced} replacements during copies, {wrong} opens with another version")
        self.assertGreaterEqual(replaced, nfiles * 9 // 10, "replacements during a copy")
        self.assertEqual(wrong, 0, "an open read bytes of another version than the one it opened")

    def test_datagrams_with_many_descriptors(self):
        t = tier(self)
        conf = conf_file(self, t, stage_ahead="no")  # the readers' hand-overs come after the flood
        report = os.path.join(t, "stats.json")
        proc = subprocess.Popen([MONARCH_RUN, "--dataset", self.root, "--config", conf, "--report",
                                 report, "--", PY,
                                 FAULT_READER, self.root, "--epochs", "2", "--pause-file",
                                 os.path.join(t, "go"), "--pause-epoch", "0"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_for(lambda: stager_pids(conf), what="the stager")
        pid = stager_pids(conf)[0]
        wait_for(lambda: job_dirs(t) and os.path.exists(os.path.join(t, job_dirs(t)[0], "ctl.sock")),
                 what="the socket")
        sock_path = os.path.join(t, job_dirs(t)[0], "ctl.sock")
        before = len(os.listdir(f"/proc/{pid}/fd"))
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        null = [os.open("/dev/null", os.O_RDONLY) for _ in range(4)]
        rnd = random.Random(5)
        sent = 0
        for i in range(20000):
            msg = rnd.randbytes(rnd.choice([8, 28, 32, 40]))
            with contextlib.suppress(BlockingIOError, OSError):
                fds = array.array("i", null[:rnd.randint(2, 4)])
                s.sendmsg([msg], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)], 0, sock_path)
                sent += 1
            if i % 500 == 0:
                time.sleep(0.01)
        time.sleep(1)
        after = len(os.listdir(f"/proc/{pid}/fd"))
        open(os.path.join(t, "go"), "w").close()
        out, err = proc.communicate(timeout=600)
        print(f"datagrams: {sent} sent; stager descriptors {before} -> {after}")
        self.assertEqual(proc.returncode, 0, err)
        self.assertLessEqual(after, before + 8, "the stager leaks descriptors")
        self.assert_bytes(self.epochs_of(out), 2)
        with open(report) as f:
            stager = json.load(f)["totals"]["stager"]
        self.assertGreater(stager["handoffs"], 100, "hand-overs still work")
        self.assertEqual(stager["copy_errors"], 0)

    def test_monarch_run_cleans_up_however_it_ends(self):
        cases = [(f"signal {s.name}", s, ["sleep", "60"], 128 + s) for s in
                 (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)]
        cases.append(("command killed", None, ["sh", "-c", "kill -KILL $$"], 137))
        for name, sig, cmd, rc in cases:
            t = tier(self)
            proc = subprocess.Popen([MONARCH_RUN, "--dataset", self.root, "--tier", t, "--"] + cmd,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            if sig:
                wait_for(lambda: stager_pids(t) and [p for p in os.listdir("/proc") if p.isdigit()
                         and os.path.exists(f"/proc/{p}/cmdline") and
                         open(f"/proc/{p}/cmdline", "rb").read() == b"sleep\x0060\x00"],
                         what="the command")
                time.sleep(0.3)
                proc.send_signal(sig)
            out, err = proc.communicate(timeout=60)
            self.assertEqual(proc.returncode, rc, f"{name}: {err}")
            if sig:
                self.assertIn("forwarded", err, name)
            # The run's directory leaves the tier at once; its deletion goes
            # on in the background and ends.
            self.assertEqual(job_dirs(t), [], f"{name}: copies left")
            self.assertEqual(stager_pids(t), [], f"{name}: stager left")
            wait_for(lambda: not os.listdir(t), timeout=30, what=f"{name}: the copies deleted")
        # A closed stderr: monarch-run's own output cannot be written.
        t = tier(self)
        subprocess.run(["sh", "-c", f"{MONARCH_RUN} --dataset {self.root} --tier {t} -- "
                        f"{PY} {READER} {self.root} --mode read --epochs 1 2>&1 | head -c 1"],
                       stdout=subprocess.DEVNULL, timeout=600)
        wait_for(lambda: not job_dirs(t) and not stager_pids(t), timeout=30,
                 what="the copies removed after stderr closed")
        # monarch-run itself killed outright: the stager removes the copies.
        t = tier(self)
        proc = subprocess.Popen([MONARCH_RUN, "--dataset", self.root, "--tier", t, "--",
                                 "sleep", "60"], stderr=subprocess.DEVNULL)
        wait_for(lambda: stager_pids(t), what="the stager")
        time.sleep(0.5)
        proc.kill()
        proc.wait()
        wait_for(lambda: not job_dirs(t) and not stager_pids(t), timeout=30,
                 what="the copies removed after monarch-run was killed")

    def test_a_map_of_another_user_is_never_used(self):
        # In a shared tier (mode 1777) another user may make the job directory
        # first, with a map of theirs: the library reads from the PFS instead.
        t = tier(self)
        job = "planted"
        stager = subprocess.Popen([STAGER, "--dataset", self.root, "--job", job, "--tier", t])
        index = os.path.join(t, "monarch-" + job, "index")
        wait_for(lambda: os.path.exists(index), what="the map")
        stager.terminate()
        stager.wait()
        ensure_user()
        os.chown(index, pwd.getpwnam(TEST_USER).pw_uid, -1)
        victim = sorted(k for k in self.ref if k.startswith("images/"))[0]
        env = dict(os.environ, LD_PRELOAD=preload(LIBRARY), MONARCH_DATASET=self.root,
                   MONARCH_JOB_DIR=os.path.dirname(index), MONARCH_LOG="1")
        p = subprocess.run([PY, "-c", "import hashlib,sys; print(hashlib.md5(open(sys.argv[1], "
                            "'rb').read()).hexdigest())", os.path.join(self.root, victim)],
                           env=env, capture_output=True, text=True, check=True)
        self.assertEqual(p.stdout.strip(), self.ref[victim])
        self.assertIn("is not this user's own file", p.stderr)
        self.assertNotIn("using the job map", p.stderr)

    def test_a_run_that_ends_during_the_walk_stops_at_once(self):
        # A dataset whose walk is paced to 20 s (20,000 files, index_rate
        # 1000): a command that ends after 0.3 s ends the run at once, the
        # walk stopped, its statistics written and saying so (issue 11: the
        # stager took signals only after the walk and was killed at
        # stop_timeout, with no statistics, on 1.28 million files).
        root = tempfile.mkdtemp(prefix="monarch-many-")
        self.addCleanup(shutil.rmtree, root, True)
        for d in range(20):
            os.mkdir(os.path.join(root, f"d{d}"))
            for i in range(1000):
                open(os.path.join(root, f"d{d}", f"f{i}"), "w").close()
        t = tier(self)
        conf = conf_file(self, t, index_rate="1000")
        report = os.path.join(t, "report.json")
        start = time.monotonic()
        p = run(["sleep", "0.3"], monarch=["--dataset", root, "--config", conf, "--report", report])
        took = time.monotonic() - start
        self.assertLess(took, 3, p.stderr)
        self.assertNotIn("did not stop", p.stderr)
        self.assertIn("walk of the dataset stopped by the job's end", p.stderr)
        with open(report) as f:
            index = json.load(f)["index"]
        self.assertEqual(index["stopped"], 1)
        self.assertLess(index["files"], 20000)
        self.assertEqual(stager_pids(t), [])

    def test_scribbled_job_map_kills_nobody(self):
        # A process of the job writes garbage over the map's live fields while
        # the job reads: nobody dies, the bytes stay right.
        t = tier(self)
        proc = subprocess.Popen([MONARCH_RUN, "--dataset", self.root, "--tier", t, "--", PY,
                                 FAULT_READER, self.root, "--epochs", "3"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        index = lambda: [os.path.join(t, d, "index") for d in job_dirs(t)
                         if os.path.exists(os.path.join(t, d, "index"))]
        wait_for(index, what="the job map")
        with open(index()[0], "r+b") as f:
            m = mmap.mmap(f.fileno(), 0)
            h = struct.unpack_from("<8sQQQQIIQQ" + "Q" * 17, m, 0)
            entries_off, count = h[9], h[3]
            rnd = random.Random(7)
            end = time.time() + 4
            while time.time() < end and proc.poll() is None:
                for _ in range(50):  # state words, and the header's counts
                    i = rnd.randrange(count)
                    struct.pack_into("<I", m, entries_off + i * 56 + 8, rnd.getrandbits(32))
                struct.pack_into("<Q", m, 24, rnd.getrandbits(64))
                time.sleep(0.005)
            m.close()
        out, err = proc.communicate(timeout=600)
        self.assertEqual(proc.returncode, 0, err)
        self.assert_bytes(self.epochs_of(out), 3)
        self.assertNotIn("incomplete", err, "the stager died")


if __name__ == "__main__":
    unittest.main(verbosity=2)
