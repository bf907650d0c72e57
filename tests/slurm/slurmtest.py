"""Shared pieces of the Slurm tests: a real cluster (contrib/slurm/cluster:
this host as node HOST, and a second slurmd as node HOST-2 for
heterogeneous jobs) running the INSTALLED Monarch (plugin, stager,
interposer, purge), real users, real jobs. Standard library only; run as
root with Debian's /usr/bin/python3.

Every test ends with the same check (SlurmTest.tearDown, assert_clean):
the nodes are idle, no Monarch process runs, and nothing of a finished job
is left: no job directory, record, image or trash entry on the tiers, no
mount below them, no Monarch cgroup.

Layout on this machine (all made by setup.py):
  /var/tmp/monarch-test-tier/{fast,slow}  the tiers of monarch-test.conf,
                                          root-owned 0755 (see that file)
  /var/tmp/monarch-slurm-test/data/NAME   datasets, standing for the PFS
  /var/tmp/monarch-slurm-test/work/USER/  the jobs' working directories
  /var/tmp/monarch-cluster/nodes/NODE/root/var/tmp/monarch-test-tier/{fast,slow}
                                          a namespaced node's tiers, as the root
                                          namespace sees them (node_tiers)
The namespaced nodes see mounts made later below /var/tmp/monarch-slurm-test
(a shared mount: the cluster's --share), e.g. the emulated PFS of Pfs.
"""
import contextlib
import glob
import grp
import hashlib
import json
import os
import pwd
import random
import shutil
import socket
import subprocess
import sys
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(HERE))
CLUSTER = os.path.join(SRC, "contrib", "slurm", "cluster")
CONFIG = os.path.join(HERE, "monarch-test.conf")
JOBS = os.path.join(HERE, "jobs")
PREFIX = os.environ.get("MONARCH_PREFIX", "/usr/local")
BINDIR = os.environ.get("MONARCH_BINDIR", os.path.join(PREFIX, "bin"))
PKGLIBDIR = os.environ.get("MONARCH_PKGLIBDIR", os.path.join(PREFIX, "lib", "monarch"))
LIBEXECDIR = os.environ.get("MONARCH_LIBEXECDIR", os.path.join(PREFIX, "libexec"))
STAGER = os.path.join(BINDIR, "monarch-stager")
REPORT = os.path.join(BINDIR, "monarch-report")
PURGE = os.path.join(LIBEXECDIR, "monarch", "monarch-purge")
PROGRAMS = (STAGER, REPORT, PURGE)
LIBRARY = os.path.join(PKGLIBDIR, "libmonarch_interpose.so")
PLUGIN = os.path.join(PKGLIBDIR, "spank_monarch.so")
TIER_ROOT = "/var/tmp/monarch-test-tier"
TIERS = [os.path.join(TIER_ROOT, "fast"), os.path.join(TIER_ROOT, "slow")]
ROOT = "/var/tmp/monarch-slurm-test"
DATA = os.path.join(ROOT, "data")
WORK = os.path.join(ROOT, "work")
USERS = ("monarchtest", "monarchtest2", "monarchtest3")
HOST = socket.gethostname().split(".")[0]
HOST2 = HOST + "-2"  # the second node: a second slurmd on this machine
# The namespaced nodes setup.py starts (cluster start --nodes N).
NODES_MULTI = int(os.environ.get("MONARCH_TEST_NODES", "3"))
MULTI = tuple(f"{HOST}-n{i}" for i in range(1, NODES_MULTI + 1))
NODES = (HOST, HOST2) + MULTI
CLUSTER_DIR = "/var/tmp/monarch-cluster"
SLURM_CONF = os.path.join(CLUSTER_DIR, "etc", "slurm.conf")
SLURMD_PID = os.path.join(CLUSTER_DIR, "run", f"slurmd-{HOST}.pid")
CGROUP_ROOT = "/sys/fs/cgroup"
# The counting FUSE file system standing for the PFS: a test tool, from the build tree.
PFSEMU = os.path.join(os.environ.get("MONARCH_BUILD", os.path.join(SRC, "build")),
                      "contrib", "bench", "monarch-pfsemu")
DEFAULT_PLUGSTACK_ARGS = "config=" + CONFIG
SKIP = 77  # CTest SKIP_RETURN_CODE
RUNUSER = shutil.which("runuser", path="/usr/sbin:/sbin:/usr/bin:/bin") or "runuser"


def skip_unless_possible():
    """Exit with the skip code where these tests cannot run at all; under
    contrib/check (MONARCH_STRICT=1), where they always can, that is a failure."""
    code = 1 if os.environ.get("MONARCH_STRICT") == "1" else SKIP
    if os.geteuid() != 0:
        print("skipped: the Slurm tests run as root (daemons, users, mounts)")
        sys.exit(code)
    for tool in ("slurmctld", "slurmd", "munged"):
        if not shutil.which(tool, path="/usr/sbin:/usr/bin:/sbin:/bin"):
            print(f"skipped: {tool} is not installed (Debian: slurmctld slurmd munge)")
            sys.exit(code)


# ---- users, datasets, directories ----

def ensure_user(name):
    try:
        return pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "-m", name], check=True)
        return pwd.getpwnam(name)


def make_dataset(name, seed=1, classes=4, per_class=8, large=2):
    """A small image-folder-like dataset, world-readable: class folders of
    4-96 KiB files and a few 700 KiB ones. Deterministic; made once."""
    root = os.path.join(DATA, name)
    done = root + ".done"
    if os.path.exists(done):
        return root
    shutil.rmtree(root, ignore_errors=True)
    rnd = random.Random(seed)
    for c in range(classes):
        d = os.path.join(root, f"class{c}")
        os.makedirs(d)
        for i in range(per_class):
            with open(os.path.join(d, f"img{i:03d}.bin"), "wb") as f:
                f.write(rnd.randbytes(rnd.randint(4 << 10, 96 << 10)))
    for i in range(large):
        with open(os.path.join(root, f"shard{i}.bin"), "wb") as f:
            f.write(rnd.randbytes(700 << 10))
    for d, dirs, files in os.walk(root):
        os.chmod(d, 0o755)
        for n in files:
            os.chmod(os.path.join(d, n), 0o644)
    os.chmod(DATA, 0o755)
    open(done, "w").close()
    return root


def read(path):
    with open(path, errors="replace") as f:
        return f.read()


def read_env(path):
    """A task's recorded environment (see jobs/lib.sh) as a dict."""
    return dict(line.split("=", 1) for line in read(path).splitlines())


def dataset_files(root):
    out = []
    for d, _, names in os.walk(root):
        out += [os.path.join(d, n) for n in names]
    return sorted(out)


def reference_md5(root):
    """'md5  path' lines as md5sum prints them, read directly (no Monarch)."""
    lines = []
    for p in dataset_files(root):
        with open(p, "rb") as f:
            lines.append(f"{hashlib.md5(f.read()).hexdigest()}  {p}")
    return "\n".join(lines) + "\n"


def workdir(user, test):
    """A fresh working directory for `test`, owned by `user`."""
    pw = pwd.getpwnam(user)
    base = os.path.join(WORK, user)
    os.makedirs(base, exist_ok=True)
    os.chmod(WORK, 0o755)
    os.chown(base, pw.pw_uid, pw.pw_gid)
    d = os.path.join(base, test)
    shutil.rmtree(d, ignore_errors=True)
    os.mkdir(d, 0o755)
    os.chown(d, pw.pw_uid, pw.pw_gid)
    return d


def node_tiers(node):
    """A namespaced node's tiers (the paths of TIERS inside it), as the root
    namespace sees them: the per-node directories the cluster bind-mounts."""
    return [os.path.join(CLUSTER_DIR, "nodes", node, "root") + t for t in TIERS]


def all_tiers():
    """The tiers of every node: the host's (also HOST-2's), then each namespaced node's."""
    return TIERS + [t for n in MULTI for t in node_tiers(n)]


def node_mounts(node):
    """Mount points inside a namespaced node (its PID 1's mount table), or
    [] when the node does not run."""
    try:
        pid = int(read(os.path.join(CLUSTER_DIR, "run", f"node-{node}.pid")))
        with open(f"/proc/{pid}/mountinfo") as f:
            return [line.split()[4].replace("\\040", " ") for line in f]
    except (OSError, ValueError):
        return []


def job_dirs(job):
    """The job's directories that still exist, on any tier of any node."""
    return [p for p in (os.path.join(t, f"monarch-job{job}") for t in all_tiers())
            if os.path.lexists(p)]


def job_state_files(job):
    """Monarch's own files of the job that still exist, on any tier: its
    records and images in <tier>/.monarch."""
    paths = []
    for t in all_tiers():
        paths += [os.path.join(t, ".monarch", "jobs", f"job{job}"),
                  os.path.join(t, ".monarch", "images", f"job{job}.img")]
    return [p for p in paths if os.path.lexists(p)]


class Pfs:
    """A counting FUSE mount of DATA at ROOT/pfs (contrib/bench/pfsemu),
    readable by every user like a PFS: the dataset NAME is mount/NAME, the
    bytes it served are in counts()."""

    def __init__(self, stall_comm=None):
        """stall_comm: reads by threads whose name starts with it never
        complete (a hung PFS, for those threads only)."""
        self.mount = os.path.join(ROOT, "pfs")
        subprocess.run(["fusermount3", "-u", self.mount], capture_output=True)
        os.makedirs(self.mount, exist_ok=True)
        os.chmod(self.mount, 0o755)
        stall = ["--stall-comm", stall_comm] if stall_comm else []
        subprocess.run([PFSEMU, "--source", DATA, "--mount", self.mount, "--latency-us", "0",
                        "--open-latency-us", "0", "--bandwidth-mbs", "0", "--direct-io"] + stall,
                       check=True)

    def dataset(self, name):
        return os.path.join(self.mount, name)

    def counts(self):
        with open(os.path.join(self.mount, ".pfsemu-counts")) as f:
            return json.load(f)

    def close(self):
        """Unmounted by its daemon's SIGTERM, which also ends stalled reads
        (they fail with EIO); fusermount3 for a daemon already gone."""
        subprocess.run(["pkill", "-TERM", "-f", f"^{PFSEMU} .*--mount {self.mount} "], check=False)
        wait_for(lambda: not os.path.ismount(self.mount), 10, "monarch-pfsemu to unmount")
        subprocess.run(["fusermount3", "-u", self.mount], capture_output=True, check=False)


# ---- running as a user ----

def user_env(user, extra=None):
    pw = pwd.getpwnam(user)
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": pw.pw_dir, "USER": user,
           "LOGNAME": user, "SLURM_CONF": SLURM_CONF, "LANG": "C.UTF-8"}
    env.update(extra or {})
    return env


def run_as(user, argv, cwd=None, extra_env=None, timeout=60, check=False):
    return subprocess.run([RUNUSER, "-u", user, "--"] + argv, cwd=cwd or "/",
                          env=user_env(user, extra_env), capture_output=True, text=True,
                          timeout=timeout, check=check)


def sbatch(user, cwd, args, extra_env=None):
    """Submits as `user`; returns the job id. args: sbatch options and script."""
    r = run_as(user, ["sbatch", "--parsable"] + args, cwd=cwd, extra_env=extra_env)
    if r.returncode != 0:
        raise AssertionError(f"sbatch {args} failed: {r.stderr}")
    return int(r.stdout.strip().split(";")[0])


def job_script(name):
    return os.path.join(JOBS, name)


def squeue_has(job):
    r = subprocess.run(["squeue", "-h", "-j", str(job), "-o", "%T"], capture_output=True,
                       text=True)
    return r.returncode == 0 and r.stdout.strip() != ""


def job_state(job):
    r = subprocess.run(["scontrol", "-o", "show", "job", str(job)], capture_output=True,
                       text=True)
    for word in r.stdout.split():
        if word.startswith("JobState="):
            return word.split("=", 1)[1]
    return "UNKNOWN"


def node_state(node=HOST):
    r = subprocess.run(["sinfo", "-h", "-n", node, "-o", "%T"], capture_output=True, text=True)
    return r.stdout.strip()


def node_states():
    """{node: state} for every node."""
    r = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True)
    seen = dict(line.split() for line in r.stdout.splitlines() if len(line.split()) == 2)
    return {n: seen.get(n, "missing") for n in NODES}


def wait_for(predicate, timeout, what, interval=0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def wait_job(job, timeout=90):
    """Waits until the job has left the queue and the nodes have finished
    its epilog; returns the final job state."""
    wait_for(lambda: not squeue_has(job), timeout, f"job {job} to end")
    wait_for(lambda: all("comp" not in v for v in node_states().values()), 60,
             "the nodes to finish the epilog")
    return job_state(job)


def wait_running(job, timeout=30):
    wait_for(lambda: job_state(job) == "RUNNING", timeout, f"job {job} to run")


# ---- what Monarch leaves behind ----

def executable(pid):
    """The program process `pid` runs, without " (deleted)". A process of
    another mount namespace whose root directory is not ours (a namespaced
    node of the cluster inside contrib/check-slurm-24.11's chroot) shows its
    executable by its path from the host's root: an installed Monarch
    program is then named by its path here when it is the same file."""
    exe = os.readlink(f"/proc/{pid}/exe").replace(" (deleted)", "")
    if exe in PROGRAMS:
        return exe
    try:
        running = os.stat(f"/proc/{pid}/exe")
    except OSError:
        return exe
    for program in PROGRAMS:
        try:
            installed = os.stat(program)
        except OSError:
            continue
        if (installed.st_dev, installed.st_ino) == (running.st_dev, running.st_ino):
            return program
    return exe


def processes():
    """Every live (not zombie) process: (pid, exe without " (deleted)",
    status text, argv as bytes)."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            exe = executable(name)
            with open(f"/proc/{name}/status") as f:
                status = f.read()
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if "\nState:\tZ" not in status:
            yield int(name), exe, status, argv


def monarch_processes():
    """Live processes running an installed Monarch program: [(pid, exe)]."""
    return [(pid, exe) for pid, exe, _, _ in processes() if exe in PROGRAMS]


def mounts_below(root):
    """Mount points at or below `root`."""
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4].replace("\\040", " ") for line in f]
    return [p for p in points if p == root or p.startswith(root + "/")]


def monarch_cgroups():
    """Monarch's cgroup leaves ("monarch" below a job's cgroup)."""
    found = []
    for pattern in ("*/*/uid_*/job_*/monarch", "*/*/job_*/monarch", "*/job_*/monarch"):
        found += glob.glob(os.path.join(CGROUP_ROOT, pattern))
    return sorted(set(found))


def leftovers():
    """Everything Monarch left on this node: job directories and Monarch's
    state entries on the tiers, mounts below the tiers, cgroup leaves."""
    left = []
    for t in all_tiers():
        if not os.path.isdir(t):
            continue
        left += [os.path.join(t, n) for n in os.listdir(t) if n.startswith("monarch-")]
        for sub in ("jobs", "images", "trash"):
            d = os.path.join(t, ".monarch", sub)
            if os.path.isdir(d):
                left += [os.path.join(d, n) for n in os.listdir(d)]
    left += [f"mount {p}" for p in mounts_below(TIER_ROOT)]
    for node in MULTI:  # the node's own tiers are mount points: what is below them
        left += [f"mount {p} on {node}" for p in node_mounts(node)
                 if any(p.startswith(t + "/") for t in TIERS)]
    left += [f"cgroup {p}" for p in monarch_cgroups()]
    return left


def queue():
    """Jobs in the queue, as "ID:STATE:USER"."""
    r = subprocess.run(["squeue", "-h", "-o", "%i:%T:%u"], capture_output=True, text=True)
    return r.stdout.split()


def assert_clean(test, timeout=120):
    """The check every test ends with: jobs gone (any left are cancelled:
    their epilog must clean up too), the nodes idle, no Monarch process, and
    nothing of a finished job on the tiers. Fails the test with what is left."""
    if queue():
        for user in USERS:
            subprocess.run(["scancel", "-u", user], check=False)
    deadline = time.monotonic() + timeout
    while True:
        states = node_states()
        procs = monarch_processes()
        left = leftovers()
        jobs = queue()
        if not jobs and all(v == "idle" for v in states.values()) and not procs and not left:
            return
        if time.monotonic() > deadline:
            test.fail(f"not clean after {timeout} s: nodes {states}, jobs {jobs}, "
                      f"Monarch processes {procs}, left {left[:20]}")
        time.sleep(0.2)


# ---- stagers ----

def _status_ids(status, key):
    for line in status.splitlines():
        if line.startswith(key + ":"):
            return [int(x) for x in line.split()[1:]]
    return []


def stagers(job=None):
    """Live monarch-stager processes (of job `job` when given): pid, uids,
    gids, groups, argv, ppid, pgid, sid, and what fds 0-2 are."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as f:
                status = f.read()
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv = [a.decode() for a in f.read().split(b"\0") if a]
            exe = executable(name)
            with open(f"/proc/{name}/stat") as f:
                ppid, pgid, sid = (int(x) for x in f.read().rsplit(")", 1)[1].split()[1:4])
            stdio = [os.readlink(f"/proc/{name}/fd/{fd}") for fd in (0, 1, 2)]
        except (OSError, ValueError):
            continue
        if "\nState:\tZ" in status or exe != STAGER:
            continue
        if job is not None and f"job{job}" not in argv:
            continue
        hwm = [int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")]
        out.append({"pid": int(name), "uids": _status_ids(status, "Uid"),
                    "gids": _status_ids(status, "Gid"),
                    "groups": _status_ids(status, "Groups"), "argv": argv,
                    "ppid": ppid, "pgid": pgid, "sid": sid, "stdio": stdio,
                    "hwm_kb": hwm[0] if hwm else 0})
    return out


class StagerWatch(threading.Thread):
    """Samples the stagers of a job every 50 ms until stopped: how many ran at
    once, at most, with which ids, and each one's peak resident memory
    (hwm_kb: pid -> the last VmHWM seen)."""

    def __init__(self, job):
        super().__init__(daemon=True)
        self.job = job
        self.max_count = 0
        self.samples = 0
        self.seen = {}  # pid -> the process as stagers() describes it
        self.hwm_kb = {}
        self._stop_event = threading.Event()

    def run(self):
        while not self._stop_event.is_set():
            found = stagers(self.job)
            self.samples += 1
            self.max_count = max(self.max_count, len(found))
            for s in found:
                self.seen.setdefault(s["pid"], s)
                self.hwm_kb[s["pid"]] = max(self.hwm_kb.get(s["pid"], 0), s["hwm_kb"])
            time.sleep(0.05)

    def stop(self):
        self._stop_event.set()
        self.join()


# ---- cluster ----

def cluster(*args, check=True, env=None):
    r = subprocess.run([CLUSTER] + list(args), capture_output=True, text=True, timeout=180,
                       env=dict(os.environ, **(env or {})))
    if check and r.returncode != 0:
        raise AssertionError(f"cluster {' '.join(args)} failed: {r.stdout}{r.stderr}")
    return r


@contextlib.contextmanager
def plugstack_args(args, env=None):
    """Restarts the cluster with other plugstack arguments (and cluster
    environment, e.g. MONARCH_CLUSTER_CGROUP=1), and back."""
    cluster("start", "--plugstack-args", args, env=env)
    try:
        yield
    finally:
        cluster("start", "--plugstack-args", DEFAULT_PLUGSTACK_ARGS)


def config_variant(name, general=None, paths=None):
    """A copy of monarch-test.conf as ROOT/NAME.conf (world-readable: the
    stager reads it as the user): general keys set from `general`, tier
    paths replaced as `paths` {old: new} says. Returns its path."""
    lines = read(CONFIG).splitlines()
    general = dict(general or {})
    out = []
    for line in lines:
        key = line.split("=", 1)[0].strip()
        if key in general and "=" in line:
            line = f"{key} = {general.pop(key)}"
        if line.startswith("[tier.") and general:
            out += [f"{k} = {v}" for k, v in general.items()]
            general = {}
        for old, new in (paths or {}).items():
            if line.strip() == f"path = {old}":
                line = f"path = {new}"
        out.append(line)
    path = os.path.join(ROOT, name + ".conf")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")
    os.chmod(path, 0o644)
    return path


def slurmd_log():
    with open("/var/tmp/monarch-cluster/log/slurmd.log", errors="replace") as f:
        return f.read()


# ---- reports ----

def report_json(directory, job):
    """The statistics in the job's report: monarch-report's JSON (the
    statistics at its top level or under "stats"), or stats.json as the
    plugin copies it when monarch-report is not installed."""
    with open(os.path.join(directory, f"monarch-job{job}.json")) as f:
        return _stats_of(json.load(f))


def _stats_of(report):
    return report if "totals" in report else report["stats"]


def node_reports(directory, job):
    """The statistics of every node's report of a multi-node job
    (monarch-job<ID>.json and monarch-job<ID>-<host>.json), by host."""
    out = {}
    for name in os.listdir(directory):
        if name.startswith(f"monarch-job{job}") and name.endswith(".json"):
            with open(os.path.join(directory, name)) as f:
                stats = _stats_of(json.load(f))
            out[stats["host"]] = stats
    return out


def stager_counter(stats, name):
    return stats["totals"]["stager"][name]


class SlurmTest(unittest.TestCase):
    """Base: the nodes are usable before each test, and clean after it
    (assert_clean)."""

    def setUp(self):
        for node, state in node_states().items():
            if "drain" in state or "down" in state:
                subprocess.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"])
        for node, state in node_states().items():
            self.assertNotIn("drain", state, f"node {node} is drained before the test")

    def tearDown(self):
        assert_clean(self)

    def assertNoLeftovers(self, job):
        wait_for(lambda: not job_dirs(job) and not job_state_files(job), 15,
                 f"the epilog to remove job {job}'s directories, record and image")
        wait_for(lambda: not stagers(job), 15, f"job {job}'s stager to go")
        state = node_state()
        self.assertNotIn("drain", state, f"node drained after job {job}")


def main():
    skip_unless_possible()
    unittest.main(verbosity=2)
