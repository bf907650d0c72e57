#!/usr/bin/python3
"""Mappings follow the copy (issue 26): a numpy.memmap, or an LMDB
environment, made once before the first epoch, before the files' copies
existed, is served from the copies from then on. Each case runs the same
program (maps_probe.py) directly and through monarch-run on the counting
emulated PFS, compares what it read, and counts what reached the PFS in
epochs 2-3. The PFS is slowed to 16 MB/s so that the program maps the files
while their copies are still being made; the library's log says which
mappings it moved (a case where none was fails: it would prove nothing)."""
import json
import os
import random
import shutil
import tempfile
import unittest

from harness import AFTER_INDEX, BUILD, DATA, PY, Case, Pfs, conf_file, parse_epochs, run, tier

PROBE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "maps_probe.py")
BANDWIDTH_MBS = 16


def npy_dataset():
    """Six 4-MiB files for numpy.memmap, and one of 24 MiB for the mutate case."""
    root = os.path.join(DATA, "maps-npy", "src")
    if not os.path.exists(os.path.join(DATA, "maps-npy", "done")):
        shutil.rmtree(os.path.join(DATA, "maps-npy"), ignore_errors=True)
        os.makedirs(root)
        rng = random.Random(26)
        for i in range(6):
            with open(os.path.join(root, f"f{i}.bin"), "wb") as f:
                f.write(rng.randbytes(4 << 20))
        with open(os.path.join(root, "big.dat"), "wb") as f:
            f.write(rng.randbytes(24 << 20))
        os.chmod(os.path.join(DATA, "maps-npy"), 0o755)
        open(os.path.join(DATA, "maps-npy", "done"), "w").close()
    return root


def lmdb_dataset():
    """An LMDB environment of 4,000 values of 1-8 KiB (about 20 MiB)."""
    import lmdb
    root = os.path.join(DATA, "maps-lmdb", "src")
    if not os.path.exists(os.path.join(DATA, "maps-lmdb", "done")):
        shutil.rmtree(os.path.join(DATA, "maps-lmdb"), ignore_errors=True)
        os.makedirs(root)
        rng = random.Random(26)
        env = lmdb.open(root, map_size=1 << 30)
        with env.begin(write=True) as txn:
            for i in range(4000):
                txn.put(b"k%06d" % i, rng.randbytes(rng.randrange(1024, 8192)))
        env.close()
        os.chmod(os.path.join(DATA, "maps-lmdb"), 0o755)
        open(os.path.join(DATA, "maps-lmdb", "done"), "w").close()
    return root


def moves(log):
    """The mappings the library moved onto a copy, as its log (MONARCH_LOG) says."""
    return sum("moved to its copy" in line for line in log.splitlines())


class Maps(Case):
    def probe(self, root, mode, monarch, extra=()):
        """maps_probe.py on a fresh emulated PFS of `root`: its JSON lines."""
        with Pfs(root, bandwidth_mbs=BANDWIDTH_MBS) as pfs:
            args = [PY, PROBE, mode, pfs.dataset, "--counts", pfs.counts_file, *extra]
            if monarch:
                t = tier(self)
                opts = ["--dataset", pfs.dataset, "--config",
                        conf_file(self, t, copy_fast_dataset="yes")]
                p = run(list(AFTER_INDEX) + args + ["--wait-moved"], monarch=opts,
                        env={"MONARCH_LOG": "1"})
            else:
                p = run(args)
        lines = parse_epochs(p.stdout)
        self.assertTrue(lines, p.stderr[-3000:])
        return lines, p.stderr

    def epochs_case(self, root, mode):
        direct, _ = self.probe(root, mode, monarch=False)
        served, log = self.probe(root, mode, monarch=True)
        epochs = served[1:]
        why = "\n".join(l for l in log.splitlines() if "mapping" in l or "monarch:" in l)[-3000:]
        self.assertEqual([e["digest"] for e in epochs], [e["digest"] for e in direct[1:]],
                         "what the program read through Monarch")
        self.assertGreater(moves(log), 0,
                           "every mapping was made on a finished copy: nothing to move\n" + why)
        for d, e in zip(direct[1:], epochs):
            if e["epoch"] == 1:
                continue
            self.assertEqual(e["on_copy"], e["maps"], f"epoch {e['epoch']}: mappings on copies\n"
                             + why)
            pfs = lambda run, i: run[i]["pfs"]["bytes"] - run[i - 1]["pfs"]["bytes"]
            i = e["epoch"]
            want, got = pfs(direct, i), pfs(served, i)
            print(f"{mode} epoch {i}: PFS bytes direct {want}, through Monarch {got}", flush=True)
            # Paged out between epochs, the direct run reads its pages from the PFS again.
            self.assertGreater(want, 0, "the direct run's epoch read nothing from the PFS")
            self.assertLessEqual(got, 0.1 * want, f"epoch {i}: PFS bytes through Monarch\n" + why)

    def test_numpy_memmap_before_epoch_1(self):
        self.epochs_case(npy_dataset(), "memmap")

    def test_lmdb_opened_once_before_epoch_1(self):
        # readonly=True, lock=False: read-write opens of dataset files (lmdb.open's
        # defaults) are not served until issue 26's read-write part.
        self.epochs_case(lmdb_dataset(), "lmdb")

    def test_moved_mapping_made_writable_and_partly_unmapped(self):
        root = npy_dataset()
        [direct], _ = self.probe(root, "mutate", monarch=False)
        [served], log = self.probe(root, "mutate", monarch=True)
        why = "\n".join(l for l in log.splitlines() if "mapping" in l)[-3000:]
        for key in ("head", "tail", "mprotect", "written", "again"):
            self.assertEqual(served[key], direct[key], key)
        self.assertEqual(moves(log), 2, "both mappings made before the copy, then moved\n" + why)
        self.assertEqual(served["moved_before"], [True, True], "both moved\n" + why)
        size = 24 << 20
        # munmap of pages 4-7: the head and the tail stay, on the copy.
        self.assertEqual(served["shared_after_munmap"],
                         [[0, 4 * 4096, "r--s", True], [8 * 4096, size, "r--s", True]])
        self.assertEqual(direct["shared_after_munmap"],
                         [[0, 4 * 4096, "r--s", False], [8 * 4096, size, "r--s", False]])
        # mprotect(PROT_WRITE): the PFS file is back in place first, as without Monarch.
        self.assertEqual(served["private_after_mprotect"], [[0, size, "rw-p", False]])

    def test_mapping_on_a_copy_sees_the_jobs_write(self):
        # A plain directory as the PFS (the emulated one is read-only): the
        # write goes to the file while the mapping is on its copy.
        outs = []
        for monarch in (False, True):
            d = tempfile.mkdtemp(prefix="monarch-maps-")
            self.addCleanup(shutil.rmtree, d, True)
            shutil.copy(os.path.join(npy_dataset(), "big.dat"), d)
            args = [PY, PROBE, "write", d]
            if monarch:
                opts = ["--dataset", d, "--config", conf_file(self, tier(self))]
                p = run(list(AFTER_INDEX) + args + ["--wait-moved"], monarch=opts)
            else:
                p = run(args)
            outs.append(parse_epochs(p.stdout)[0])
        direct, served = outs
        self.assertEqual(served["read"], direct["read"], "the mapping's bytes after the write")
        self.assertEqual(served["on_copy_before"], [True], "the mapping was on the copy")
        self.assertEqual(served["on_copy_after"], [False], "and back on the file after the write")


if __name__ == "__main__":
    unittest.main(verbosity=2)
