#!/usr/bin/python3
"""CTest fixture: the root file systems the container tests enter, made with
debootstrap from the Debian archive this machine installs from, once: cached
outside the build tree (MONARCH_ROOTFS_CACHE, default
/var/cache/monarch-tests/rootfs) and reused by every later run and build.
A root is complete when its stamp (written last) holds the arguments it was
made with; a missing, incomplete or differently made one is made again.
Usage: rootfs.py [SUITE...]   (default: every suite of SUITES)"""
import fcntl
import os
import re
import shutil
import subprocess
import sys
import time

# Debian 11 (glibc 2.31) and 12 (glibc 2.36): an older glibc than the build's, and the same.
SUITES = ("bullseye", "bookworm")
INCLUDE = "python3"
CACHE = os.environ.get("MONARCH_ROOTFS_CACHE", "/var/cache/monarch-tests/rootfs")
# Where apt here finds its mirror: Debian 12's deb822 file, or the one-line
# list debootstrap writes (a Debian 13 root made by contrib/check-slurm-24.11).
SOURCES = ("/etc/apt/sources.list.d/debian.sources", "/etc/apt/sources.list")


def path(suite):
    return os.path.join(CACHE, suite)


def mirror():
    """The first Debian mirror apt uses here."""
    for name in SOURCES:
        try:
            with open(name) as f:
                text = f.read()
        except FileNotFoundError:
            continue
        m = re.search(r"^URIs:\s*(\S+)|^deb\s+(?:\[[^]]*\]\s+)?(\S+)", text, re.M)
        if m:
            return m.group(1) or m.group(2)
    sys.exit(f"rootfs: no mirror in {' or '.join(SOURCES)}: cannot tell which Debian mirror to use")


def make(suite):
    root, stamp = path(suite), path(suite) + ".stamp"
    args = ["debootstrap", "--variant=minbase", f"--include={INCLUDE}", suite, root, mirror()]
    want = " ".join(args) + "\n"
    os.makedirs(CACHE, exist_ok=True)
    with open(path(suite) + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another run (another build tree) may be making it
        if os.path.isdir(root) and os.path.exists(stamp) and open(stamp).read() == want:
            print(f"rootfs: {suite}: cached at {root}")
            return
        if os.path.exists(stamp):
            os.unlink(stamp)
        shutil.rmtree(root, ignore_errors=True)
        start = time.monotonic()
        p = subprocess.run(args, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"rootfs: {' '.join(args)} exited {p.returncode}:\n{p.stdout[-3000:]}"
                     f"{p.stderr[-3000:]}")
        with open(stamp + ".new", "w") as f:
            f.write(want)
        os.rename(stamp + ".new", stamp)
        du = subprocess.run(["du", "-sm", root], capture_output=True, text=True).stdout.split()[0]
        print(f"rootfs: {suite}: made in {time.monotonic() - start:.0f} s ({du} MiB) at {root}")


def mount(*args):
    subprocess.run(["mount", *args], check=True)


def create(path, is_file):
    """An empty directory or file at `path` to mount on (enroot's x-create)."""
    if is_file:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if not os.path.exists(path):
            open(path, "w").close()
    else:
        os.makedirs(path, exist_ok=True)


def overlay_root(root_image, prefix):
    """A writable copy of the cached root (an overlay on a tmpfs, so that
    nothing lands in the cache) with /proc new and /sys, /dev bound, as the
    runtimes set it up; in the caller's mount namespace. Returns (work, root)."""
    import tempfile
    work = tempfile.mkdtemp(prefix=prefix)
    mount("-t", "tmpfs", "tmpfs", work)
    for d in ("upper", "work", "root"):
        os.mkdir(os.path.join(work, d))
    root = os.path.join(work, "root")
    mount("-t", "overlay", "overlay", "-o",
          f"lowerdir={root_image},upperdir={work}/upper,workdir={work}/work", root)
    mount("-t", "proc", "proc", root + "/proc")
    mount("--rbind", "/sys", root + "/sys")
    mount("--rbind", "/dev", root + "/dev")
    return work, root


def test_main(suites):
    """A container test's main: the cached roots first (ctest makes them)."""
    import unittest
    for s in suites:
        if not os.path.exists(path(s) + ".stamp"):
            sys.exit(f"no root file system for {s}: run tests/containers/rootfs.py "
                     f"(ctest runs it as containers.rootfs)")
    unittest.main(verbosity=2, module="__main__")


if __name__ == "__main__":
    for s in sys.argv[1:] or SUITES:
        make(s)
