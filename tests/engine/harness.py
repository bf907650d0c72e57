"""Shared pieces of the engine tests: real datasets, a real counting FUSE
mount standing for the PFS (contrib/bench/pfsemu.cpp), real runs of
monarch-run with the real readers of reader.py. Standard library only; run
with Debian's /usr/bin/python3 (its torch is what the loader mode uses)."""
import contextlib
import hashlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import unittest

SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("MONARCH_BUILD", os.path.join(SRC, "build"))
MONARCH_RUN = os.path.join(BUILD, "stager", "monarch-run")
STAGER = os.path.join(BUILD, "stager", "monarch-stager")
LIBRARY = os.path.join(BUILD, "interpose", "libmonarch_interpose.so")
PFSEMU = os.path.join(BUILD, "contrib", "bench", "monarch-pfsemu")
GEN = os.path.join(SRC, "contrib", "gen-dataset")
READER = os.path.join(SRC, "tests", "engine", "reader.py")
PY = "/usr/bin/python3"
DATA = os.path.join(BUILD, "test-data")
TEST_USER = "monarchtest"

# Libraries a sanitizer build loads before the library (contrib/sanitize:
# the sanitizer's runtime, which must be the first library of a process the
# instrumented library loads into); none otherwise. Every process the tests
# start gets them, so that runs with and without Monarch compare alike;
# monarch-run appends the library behind them, and preload() puts them in
# front of what a test preloads itself. Programs that cannot run under the
# runtime (Chromium) get UNSANITIZED_ENV. What LD_PRELOAD held already stays
# behind them: a test's child program that runs in a job (test_formats_rdwr.py
# child) imports this module too, and the programs it starts must load the
# library monarch-run gave it, or the job's changes go unseen.
PRELOAD_FIRST = [p for p in os.environ.get("MONARCH_TEST_PRELOAD", "").split(":") if p]
SANITIZED = bool(PRELOAD_FIRST)
UNSANITIZED_ENV = dict(os.environ)
if PRELOAD_FIRST:
    os.environ["LD_PRELOAD"] = ":".join(
        PRELOAD_FIRST + [p for p in os.environ.get("LD_PRELOAD", "").split(":")
                         if p and p not in PRELOAD_FIRST])


def preload(*libs):
    """LD_PRELOAD's value that loads `libs` (after the sanitizer's runtime)."""
    return ":".join(PRELOAD_FIRST + list(libs))


FIO_FILE = "{root}/fio/verify.dat"
FIO_VERIFY = ["--rw=randread", "--bs=256k", "--size=32m", "--verify=crc32c"]

# The engine tests' dataset, as the issue describes it: ~2,000 small files of
# 16-256 KiB in class folders and 64 large files of 8-64 MiB.
FULL = dict(small=2000, large=64, large_min_mib=8, large_max_mib=64)
# A smaller one for the tests that run many jobs.
SMALL = dict(small=600, large=8, large_min_mib=8, large_max_mib=24)


def dataset(name, small, large, large_min_mib, large_max_mib, seed=1):
    """A generated dataset under the build tree, made once and reused."""
    root = os.path.join(DATA, name, "src")
    done = os.path.join(DATA, name, "done")
    if not os.path.exists(done):
        shutil.rmtree(os.path.join(DATA, name), ignore_errors=True)
        os.makedirs(os.path.dirname(root))
        subprocess.run([GEN, root, "--small", str(small), "--large", str(large),
                        "--large-min-mib", str(large_min_mib), "--large-max-mib",
                        str(large_max_mib), "--seed", str(seed)], check=True,
                       stdout=subprocess.DEVNULL)
        # A file fio wrote with checksummed blocks, for fio's own verification.
        os.makedirs(os.path.join(root, "fio"))
        subprocess.run(["fio", "--name=prepare", "--filename=" + FIO_FILE.format(root=root),
                        "--rw=write", "--bs=256k", "--size=32m", "--verify=crc32c",
                        "--do_verify=0"], check=True, stdout=subprocess.DEVNULL)
        os.chmod(os.path.join(DATA, name), 0o755)
        open(done, "w").close()
    return root


def md5_file(path):
    h = hashlib.md5()
    with open(path, "rb") as f:
        while b := f.read(1 << 20):
            h.update(b)
    return h.hexdigest()


def reference(root):
    """md5 of every file, read directly (no Monarch), relative to root."""
    cache = os.path.join(os.path.dirname(root), "md5.json")
    if os.path.exists(cache):
        with open(cache) as f:
            return json.load(f)
    sums = {}
    for d, _, names in os.walk(root):
        for n in names:
            p = os.path.join(d, n)
            sums[os.path.relpath(p, root)] = md5_file(p)
    with open(cache, "w") as f:
        json.dump(sums, f)
    return sums


def dataset_bytes(root):
    return sum(os.path.getsize(os.path.join(d, n)) for d, _, ns in os.walk(root) for n in ns)


class Pfs:
    """A counting, read-only FUSE mount of `source`'s parent, standing for the
    PFS. The dataset is mount/<basename of source>; the counters live at
    mount/.pfsemu-counts, outside the dataset."""

    def __init__(self, source, latency_us=0, bandwidth_mbs=0, stall_comm=None,
                 attr_timeout_ms=1000):
        self.tmp = tempfile.mkdtemp(prefix="monarch-pfs-")
        self.mount = os.path.join(self.tmp, "mnt")
        os.mkdir(self.mount)
        os.chmod(self.tmp, 0o755)
        subprocess.run([PFSEMU, "--source", os.path.dirname(source), "--mount", self.mount,
                        "--latency-us", str(latency_us), "--open-latency-us", str(latency_us),
                        "--bandwidth-mbs", str(bandwidth_mbs), "--direct-io"] +
                       (["--stall-comm", stall_comm] if stall_comm else []) +
                       ["--attr-timeout-ms", str(attr_timeout_ms)], check=True)
        self.dataset = os.path.join(self.mount, os.path.basename(source))
        self.counts_file = os.path.join(self.mount, ".pfsemu-counts")

    def counts(self):
        with open(self.counts_file) as f:
            return json.load(f)

    def close(self):
        if subprocess.run(["fusermount3", "-u", self.mount], stderr=subprocess.DEVNULL).returncode:
            # Busy: a process is stuck in a request the emulator hangs on
            # (--stall-comm). Stopping the daemon answers it, then unmounts.
            for pid in daemon_pids("monarch-pfsemu", self.mount):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
            end = time.time() + 10
            while os.path.ismount(self.mount) and time.time() < end:
                time.sleep(0.05)
            subprocess.run(["fusermount3", "-uz", self.mount], stderr=subprocess.DEVNULL)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def tier(test, quota=None, parent=None):
    """A fresh tier directory, removed after the test. Mode 1777 like /tmp so
    that a test user's stager can create its job directory."""
    d = tempfile.mkdtemp(prefix="monarch-tier-", dir=parent)
    os.chmod(d, 0o1777)
    test.addCleanup(shutil.rmtree, d, True)
    return d if quota is None else f"{d}:{quota}"


def conf_file(test, tier_dir, quota="10G", **keys):
    """A monarch.conf with one tier and the given general keys."""
    path = os.path.join(tempfile.mkdtemp(prefix="monarch-conf-"), "monarch.conf")
    test.addCleanup(shutil.rmtree, os.path.dirname(path), True)
    with open(path, "w") as f:
        for k, v in keys.items():
            f.write(f"{k} = {v}\n")
        f.write(f"[tier.a]\npath = {tier_dir}\nquota = {quota}\n")
    return path


def parse_epochs(stdout):
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


# A command prefix, for commands run through monarch-run: waits (60 s at
# most) until the stager has published its map, then runs the command. The
# command starts before the stager's index exists, and its reads until then
# go to the PFS unseen (README, Limitations): a test of what Monarch does
# starts once it can.
AFTER_INDEX = ["sh", "-c", 'i=0; while [ ! -e "$MONARCH_JOB_DIR/index" ] && [ $i -lt 6000 ]; '
               'do sleep 0.01; i=$((i+1)); done; exec "$@"', "sh"]


def run(args, monarch=None, user=None, env=None, timeout=600, check=True):
    """Runs `args`, through monarch-run when `monarch` is a list of its
    options. Returns the CompletedProcess (text)."""
    cmd = ([MONARCH_RUN] + monarch + ["--"] if monarch is not None else []) + args
    if user:
        cmd = ["runuser", "-u", user, "--"] + cmd
    e = dict(os.environ)
    e.update(env or {})
    p = subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {p.returncode}\n{p.stderr[-4000:]}")
    return p


def read_dataset(dataset_path, mode, epochs=3, monarch=None, counts=None, seed=0, extra=(),
                 user=None, env=None, prefix=()):
    args = list(prefix) + [PY, READER, dataset_path, "--mode", mode, "--epochs", str(epochs),
                           "--seed", str(seed)]
    if counts:
        args += ["--counts", counts]
    p = run(args + list(extra), monarch=monarch, user=user, env=env)
    return parse_epochs(p.stdout), p


def ensure_user(name=TEST_USER):
    try:
        return pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "-m", name], check=True)
        return pwd.getpwnam(name)


def stager_pids(marker):
    """Stagers whose command line contains `marker` (a tier path)."""
    return daemon_pids("monarch-stager", marker)


def daemon_pids(program, marker):
    """Processes of `program` whose command line contains `marker`."""
    pids = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
        except OSError:
            continue
        if cmd and cmd[0].endswith(program.encode()) and any(marker.encode() in c for c in cmd):
            pids.append(int(p))
    return pids


class Case(unittest.TestCase):
    maxDiff = 2000

    def assertSameBytes(self, epochs, ref, subset=None, n_epochs=3):
        """Every epoch read every expected file with the reference bytes."""
        self.assertEqual(len(epochs), n_epochs, "epochs completed")
        want = {k: v for k, v in ref.items() if subset is None or k.startswith(subset)}
        self.assertTrue(want, "nothing to compare: the test would be vacuous")
        for e in epochs:
            got = e["files"]
            bad = [k for k in want if got.get(k) != want[k]]
            self.assertEqual(bad, [], f"epoch {e['epoch']}: files with wrong bytes")


class TierWatch:
    """Samples a tier while a job runs: bytes on disk under the job's
    directories (data and tmp), and the set of published copies."""

    def __init__(self, tier_dir, period=0.02):
        import threading
        self.dir = tier_dir
        self.period = period
        self.max_bytes = 0
        self.samples = 0
        self.evicted = []
        self._last = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            # By inode: a copy renamed from tmp/ to data/ during the walk is
            # seen twice but counted once.
            blocks, copies = {}, set()
            for d, _, names in os.walk(self.dir):
                for n in names:
                    p = os.path.join(d, n)
                    try:
                        st = os.lstat(p)
                    except OSError:
                        continue
                    if "/data/" in p or "/tmp/" in p[len(self.dir):]:
                        blocks[st.st_ino] = st.st_blocks * 512
                    if "/data/" in p:
                        copies.add(p)
            self.max_bytes = max(self.max_bytes, sum(blocks.values()))
            self.evicted += sorted(self._last - copies)  # run with --keep: nothing may go
            self._last = copies
            self.samples += 1
            self._stop.wait(self.period)

    def stop(self):
        self._stop.set()
        self._thread.join()


def epoch_deltas(before, epochs):
    """PFS counters of each epoch from the snapshots reader.py took."""
    snaps = [before] + [e["pfs"] for e in epochs]
    return [{k: snaps[i + 1][k] - snaps[i][k] for k in snaps[0]} for i in range(len(epochs))]
