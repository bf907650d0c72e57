"""Fixture of the Slurm tests: installs the build (the tests use the
INSTALLED Monarch, as a site would: its packages), makes the test users, the tiers and the
data directories, and starts the cluster with the test configuration:
this host's two nodes and MONARCH_TEST_NODES (default 3) namespaced nodes
in partition "multi", which see mounts made later below ROOT (the emulated
PFS). Usage: setup.py BUILD_DIR"""
import os
import shutil
import subprocess
import sys

import slurmtest as st


def unmount_under(*roots):
    """Leftover mounts of an interrupted run (the cleanup test bind-mounts)."""
    with open("/proc/self/mounts") as f:
        points = [line.split()[1] for line in f]
    for p in sorted(points, key=len, reverse=True):
        if any(p == r or p.startswith(r + "/") for r in roots):
            subprocess.run(["umount", "-l", p], check=False)


def main():
    st.skip_unless_possible()
    build = sys.argv[1]
    # As a site installs it: the packages with apt.
    subprocess.run([os.path.join(st.SRC, "contrib", "package", "install"), build], check=True)
    for path in (st.STAGER, st.PLUGIN, st.LIBRARY):
        if not os.path.exists(path):
            sys.exit(f"setup: {path} is not installed")
    for user in st.USERS:
        st.ensure_user(user)
    # A cluster left running by an interrupted run holds the namespaced
    # nodes' mounts of the tiers and ROOT: it goes first, and so do its
    # nodes' tiers (a fresh node-local disk on each).
    st.cluster("stop")
    shutil.rmtree(os.path.join(st.CLUSTER_DIR, "nodes"), ignore_errors=True)
    # Tiers as a site makes them: root-owned 0755 (see monarch-test.conf).
    unmount_under(st.TIER_ROOT, st.ROOT)
    shutil.rmtree(st.TIER_ROOT, ignore_errors=True)
    for d in [st.TIER_ROOT] + st.TIERS:
        os.mkdir(d, 0o755)
        os.chmod(d, 0o755)
    shutil.rmtree(st.WORK, ignore_errors=True)
    for d in (st.ROOT, st.DATA, st.WORK):
        os.makedirs(d, exist_ok=True)
        os.chmod(d, 0o755)
    os.chmod(st.CONFIG, 0o644)  # the stager reads it as the job's user
    # Users mount FUSE file systems on a compute node (fuse3's udev rule
    # makes /dev/fuse 0666); a machine without udev may leave it 0600, and
    # the tests need a user to be able to (test_hang.py).
    if os.path.exists("/dev/fuse"):
        os.chmod("/dev/fuse", 0o666)
    st.cluster("start", "--plugstack-args", st.DEFAULT_PLUGSTACK_ARGS,
               "--nodes", str(st.NODES_MULTI), "--share", st.ROOT)
    print("setup: cluster ready with", st.DEFAULT_PLUGSTACK_ARGS, "and nodes", *st.MULTI)


if __name__ == "__main__":
    main()
