#!/usr/bin/python3
"""Faults: whatever goes wrong in Monarch, readers get the bytes and errors
they would get without it."""
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import unittest

from harness import (Case, LIBRARY, MONARCH_RUN, PY, READER, SMALL, STAGER, TEST_USER, dataset,
                     dataset_bytes, ensure_user, md5_file, parse_epochs, read_dataset, reference,
                     run, stager_pids, tier)


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
        wait_for(lambda: any(os.listdir(os.path.join(t, d, "data")) for d in os.listdir(t)),
                 what="first copies")
        for pid in stager_pids(t):
            os.kill(pid, signal.SIGKILL)
        out, err = p.communicate(timeout=600)
        self.assertEqual(p.returncode, 0, err)
        self.assertSameBytes(parse_epochs(out), self.ref)
        self.assertIn("incomplete", err)  # the summary says the statistics are partial

    def test_no_stager_at_all(self):
        env = {"LD_PRELOAD": LIBRARY, "MONARCH_DATASET": self.root,
               "MONARCH_JOB_DIR": "/nonexistent/monarch-job"}
        epochs, _ = read_dataset(self.root, "read", env=env)
        self.assertSameBytes(epochs, self.ref)

    def test_tier_runs_out_of_space(self):
        mnt = tempfile.mkdtemp(prefix="monarch-tmpfs-")
        self.addCleanup(os.rmdir, mnt)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m,mode=1777", "tmpfs", mnt],
                       check=True)
        self.addCleanup(subprocess.run, ["umount", "-l", mnt])
        # Another job fills the file system while this one copies.
        filler = subprocess.Popen(["sh", "-c", f"sleep 0.3; dd if=/dev/zero of={mnt}/filler "
                                   "bs=1M 2>/dev/null; true"])
        epochs, p = read_dataset(self.root, "read", monarch=["--dataset", self.root, "--tier",
                                                             f"{mnt}:10G", "--keep"])
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
        env = dict(os.environ, LD_PRELOAD=LIBRARY, MONARCH_DATASET=root,
                   MONARCH_JOB_DIR=os.path.join(t, "monarch-" + job))
        victim = sorted(k for k in self.ref if k.startswith("images/"))[0]
        path = os.path.join(root, victim)

        def start():
            s = subprocess.Popen([STAGER, "--dataset", root, "--job", job, "--tier", t])
            wait_for(lambda: os.path.exists(os.path.join(t, "monarch-" + job, "ctl.sock")),
                     what="stager ready")
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
            f.write(f"consistency = open\nsmall_file_max = 64K\n[tier.a]\npath = {t}\nquota = 1G\n")
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
while not cached({small!r}) or not cached({large!r}):
    md5({large!r}); time.sleep(0.05)
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


if __name__ == "__main__":
    unittest.main(verbosity=2)
