#!/usr/bin/python3
"""The preload library in other userlands: in a Debian 11 (glibc 2.31) and a
Debian 12 root file system (rootfs.py), programs with the library preloaded
start and end as without it, and a reader of a dataset gets the right bytes,
its later epochs served from the tier (counted by the PFS itself, a counting
FUSE mount). The root is entered as enroot enters an image: a mount
namespace, tmpfs on /tmp and /run, a new /proc, /dev bound, the job's paths
bound at the same paths, chroot; the library is copied into the root."""
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "engine"))
from harness import (AFTER_INDEX, LIBRARY, READER, SMALL, Case, Pfs, conf_file, dataset,  # noqa
                     epoch_deltas, parse_epochs, reference, run, tier)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rootfs  # noqa: E402

# Where the library is in the root, and the reader.
INSIDE_LIBRARY = "/usr/local/lib/monarch/libmonarch_interpose.so"
INSIDE_READER = "/usr/local/lib/monarch/reader.py"

# Run by sh as root: ROOT, then the binds (a host path to bind at the same
# path, under /tmp, which is the root's own tmpfs here; or HOST:INSIDE),
# then "--", then the command.
# The host's LD_PRELOAD (the build's library, for the host programs that
# start the container) is not the root's: the command gets the root's copy.
ENTER = r"""
set -e
root=$1; shift
mount -t tmpfs -o mode=1777 tmpfs "$root/tmp"
mount -t tmpfs tmpfs "$root/run"
mount -t proc proc "$root/proc"
mount --rbind /dev "$root/dev"
mount -t tmpfs tmpfs "$root/usr/local/lib"
mkdir -p "$root/usr/local/lib/monarch"
cp "$MONARCH_TEST_LIBRARY" "$root%(lib)s"
cp "$MONARCH_TEST_READER" "$root%(reader)s"
while [ "$1" != "--" ]; do
  host=${1%%:*}; inside=${1#*:}
  mkdir -p "$root$inside"
  mount --bind "$host" "$root$inside"
  shift
done
shift
exec env -u LD_PRELOAD chroot "$root" /usr/bin/env LD_PRELOAD=%(lib)s "$@"
""" % {"lib": INSIDE_LIBRARY, "reader": INSIDE_READER}


def enter(suite, command, binds=()):
    """The command line that runs `command` in the root of `suite`, with the
    host paths `binds` (directories under /tmp) at the same paths, or
    "HOST:INSIDE" at INSIDE."""
    for b in binds:
        inside = b.split(":")[-1]
        assert inside.startswith("/tmp/") or ":" in b, b  # nothing lands in the cached root
    return (["env", f"MONARCH_TEST_LIBRARY={LIBRARY}", f"MONARCH_TEST_READER={READER}",
             "unshare", "--mount", "--propagation", "private", "sh", "-c", ENTER, "sh",
             rootfs.path(suite)] + list(binds) + ["--"] + list(command))


class Userland:
    """The tests, for the root of `suite` (subclasses below)."""
    suite = None

    @classmethod
    def setUpClass(cls):
        cls.root = dataset("small", **SMALL)
        cls.ref = reference(cls.root)

    def test_programs_start_and_end_as_without_monarch(self):
        # With the library only, and in a job's environment (a job directory
        # with no stager yet: the library is on and reads from the PFS).
        for env in ({}, {"MONARCH_DATASET": self.root, "MONARCH_JOB_DIR": "/tmp"}):
            for command in (["/bin/true"], ["python3", "-c", "1"]):
                p = subprocess.run(enter(self.suite, command), capture_output=True, text=True,
                                   env={**os.environ, **env}, timeout=120)
                what = f"{' '.join(command)} in {self.suite} with {env or 'the library only'}"
                self.assertEqual((p.returncode, p.stderr), (0, ""), what)

    def test_reader_served_from_the_tier(self):
        # 3 epochs of images/ (600 files), each file stat'ed then read whole,
        # from the emulated PFS; the library, the dataset and the tier are in
        # the root at the host's paths.
        with Pfs(self.root) as pfs:
            t = tier(self)
            images = os.path.join(pfs.dataset, "images")
            conf = conf_file(self, t, quota="100%", copy_fast_dataset="yes")
            before = pfs.counts()
            reader = ["python3", INSIDE_READER, pfs.dataset, "--mode", "read", "--epochs", "3",
                      "--subdir", "images", "--stat", "--counts", pfs.counts_file]
            p = run(AFTER_INDEX + enter(self.suite, reader, binds=[pfs.mount, t]),
                    monarch=["--dataset", images, "--config", conf], timeout=900)
        epochs = parse_epochs(p.stdout)
        self.assertSameBytes(epochs, self.ref, "images/")
        summary = p.stderr[-3000:]
        d = epoch_deltas(before, epochs)
        self.assertGreater(d[0]["opens"], 0, "epoch 1 read the PFS (the test would be vacuous)")
        for e in (1, 2):
            self.assertEqual((d[e]["opens"], d[e]["reads"]), (0, 0),
                             f"epoch {e + 1} in {self.suite} reached the PFS\n{summary}")
        share = re.search(r"served from node-local tiers: ([0-9.]+)% of the bytes read", summary)
        self.assertTrue(share and float(share.group(1)) > 60, summary)
        print(f"{self.suite}: PFS opens, reads, bytes by epoch "
              f"{[(x['opens'], x['reads'], x['bytes']) for x in d]}; "
              f"served from the tier {share.group(1)}% of the bytes read", flush=True)


    def read_in_container(self, binds, dataset_inside, counts_inside, check_share=True):
        """3 epochs of images/ read at `dataset_inside` in the root, with
        `binds` (the PFS's `{mount}`, `{dataset}` and the tier's `{tier}`
        filled in). The job's environment names the host's paths, as pyxis
        and `apptainer exec` pass them. Returns (epochs, PFS deltas, stderr)."""
        with Pfs(self.root) as pfs:
            t = tier(self)
            images = os.path.join(pfs.dataset, "images")
            conf = conf_file(self, t, quota="100%", copy_fast_dataset="yes")
            before = pfs.counts()
            reader = ["python3", INSIDE_READER, dataset_inside, "--mode", "read", "--epochs", "3",
                      "--subdir", "images", "--stat", "--counts", counts_inside]
            filled = [b.format(mount=pfs.mount, dataset=pfs.dataset, tier=t) for b in binds]
            p = run(AFTER_INDEX + enter(self.suite, reader, binds=filled),
                    monarch=["--dataset", images, "--config", conf], timeout=900)
        epochs = parse_epochs(p.stdout)
        self.assertSameBytes(epochs, self.ref, "images/")
        return epochs, epoch_deltas(before, epochs), p.stderr

    def test_dataset_and_job_directory_mounted_elsewhere(self):
        # pyxis --container-mounts=<dataset's parent>:/data and the tier at
        # another path: neither host path exists in the container.
        epochs, d, err = self.read_in_container(
            ["{dataset}:/data", "{mount}:/pfs", "{tier}:/monarch-tier"], "/data",
            "/pfs/.pfsemu-counts")
        self.assertGreater(d[0]["opens"], 0, "epoch 1 read the PFS (the test would be vacuous)")
        for e in (1, 2):
            self.assertEqual((d[e]["opens"], d[e]["reads"]), (0, 0),
                             f"epoch {e + 1} in {self.suite} reached the PFS\n{err[-3000:]}")
        self.assertNotIn("not visible", err, "everything Monarch needs is visible")
        print(f"{self.suite}, dataset at /data, job directory at /monarch-tier: PFS opens, "
              f"reads, bytes by epoch {[(x['opens'], x['reads'], x['bytes']) for x in d]}",
              flush=True)

    def test_a_container_without_the_job_directory_reads_the_pfs_and_says_so(self):
        epochs, d, err = self.read_in_container(["{dataset}:/data", "{mount}:/pfs"], "/data",
                                                "/pfs/.pfsemu-counts")
        said = [line for line in err.splitlines() if line.startswith("monarch: the job directory")]
        self.assertEqual(len(said), 1, err[-3000:])
        self.assertIn("not visible to", said[0])
        files = sum(1 for k in self.ref if k.startswith("images/"))
        self.assertEqual([x["opens"] for x in d[1:]], [files, files], "epochs 2-3 from the PFS")


class Bullseye(Userland, Case):
    suite = "bullseye"  # glibc 2.31: no fstat & co. (only __fxstat), no GLIBC_2.32+


class Bookworm(Userland, Case):
    suite = "bookworm"  # glibc 2.36, as the build's


if __name__ == "__main__":
    rootfs.test_main((Bullseye.suite, Bookworm.suite))
