#!/usr/bin/python3
"""The dataset recognised through any path that reaches it (issue 26): a
symbolic link outside the dataset, the dataset given through a link and read
by its real path, a bind mount of it elsewhere, paths relative to a current
directory inside the link or above it. Each run reads 3 shuffled epochs
through monarch-run and is compared with the direct read's bytes; the
emulated PFS counts what reached it, and epochs 2-3 read at least 90% of
their bytes from the tier. And a job whose processes loaded the job map but
opened no dataset file through Monarch is told so in one line."""
import os
import shutil
import subprocess
import tempfile
import unittest

from harness import (AFTER_INDEX, PY, READER, SMALL, Case, Pfs, conf_file, dataset, dataset_bytes,
                     epoch_deltas, md5_file, parse_epochs, reference, run, tier)

# sh -c's script that runs the rest of its arguments in directory $0.
IN_DIR = ["sh", "-c", 'cd "$0" && exec "$@"']


class Paths(Case):
    @classmethod
    def setUpClass(cls):
        cls.root = dataset("small", **SMALL)
        cls.ref = reference(cls.root)
        cls.size = dataset_bytes(cls.root)

    def scratch(self):
        d = tempfile.mkdtemp(prefix="monarch-paths-")
        os.chmod(d, 0o755)
        self.addCleanup(shutil.rmtree, d, True)
        return d

    def opts(self, given):
        # The emulator has no latency and a local disk behind it: copies are
        # made whatever its speed (test_traffic.py's copying()).
        conf = conf_file(self, tier(self), quota="100%", copy_fast_dataset="yes")
        return ["--dataset", given, "--config", conf]

    def check_served(self, pfs, given, read_as, cwd=None, prefix=None):
        """Reads the dataset as `read_as` (in `cwd` when given) through
        monarch-run with the dataset given as `given`; the direct read's
        bytes, and epochs 2-3 served from the tier. `prefix`: the reader's
        command up to its root argument (default: python reader.py)."""
        before = pfs.counts()
        args = (AFTER_INDEX + (IN_DIR + [cwd] if cwd else []) + (prefix or [PY, READER]) +
                [read_as, "--mode", "read", "--epochs", "3", "--counts", pfs.counts_file])
        p = run(args, monarch=self.opts(given))
        epochs = parse_epochs(p.stdout)
        self.assertSameBytes(epochs, self.ref)
        d = epoch_deltas(before, epochs)
        for e in (1, 2):
            served = 1 - d[e]["bytes"] / self.size
            print(f"{read_as} (given {given}): epoch {e + 1} served {served:.1%} from the tier",
                  flush=True)
            self.assertGreaterEqual(served, 0.9, f"epoch {e + 1}\n" + p.stderr[-3000:])
        return p

    def test_symbolic_link_outside_the_dataset(self):
        # ~/data -> /scratch/me/ds: the dataset given by its real path, read through the link.
        with Pfs(self.root) as pfs:
            link = os.path.join(self.scratch(), "data")
            os.symlink(pfs.dataset, link)
            self.check_served(pfs, pfs.dataset, link)

    def test_given_through_a_link_read_by_the_real_path(self):
        with Pfs(self.root) as pfs:
            link = os.path.join(self.scratch(), "data")
            os.symlink(pfs.dataset, link)
            self.check_served(pfs, link, pfs.dataset)

    def test_bind_mount_elsewhere(self):
        with Pfs(self.root) as pfs:
            bind = os.path.join(self.scratch(), "bound")
            os.mkdir(bind)
            subprocess.run(["mount", "--bind", pfs.dataset, bind], check=True)
            try:
                self.check_served(pfs, pfs.dataset, bind)
            finally:
                subprocess.run(["umount", bind], check=True)

    def test_bind_mount_made_after_the_process_found_the_dataset(self):
        # The reader lists the dataset as given (its job map loaded, its
        # views found), then binds it elsewhere and reads it there: the
        # mount is not among the views it found.
        with Pfs(self.root) as pfs:
            bind = os.path.join(self.scratch(), "bound")
            os.mkdir(bind)
            script = ("import os, runpy, subprocess, sys\n"
                      "os.listdir(sys.argv[1])\n"
                      "subprocess.run(['mount', '--bind', sys.argv[1], sys.argv[2]], check=True)\n"
                      "sys.argv = sys.argv[3:]\n"
                      "runpy.run_path(sys.argv[0], run_name='__main__')\n")
            try:
                self.check_served(pfs, pfs.dataset, bind,
                                  prefix=[PY, "-c", script, pfs.dataset, bind, READER])
            finally:
                subprocess.run(["umount", bind], stderr=subprocess.DEVNULL)

    def test_relative_paths_current_directory_inside_the_link(self):
        with Pfs(self.root) as pfs:
            link = os.path.join(self.scratch(), "data")
            os.symlink(pfs.dataset, link)
            self.check_served(pfs, pfs.dataset, ".", cwd=link)

    def test_relative_paths_through_the_link(self):
        # The current directory holds the link: "data/class/x" names the file.
        with Pfs(self.root) as pfs:
            top = self.scratch()
            os.symlink(pfs.dataset, os.path.join(top, "data"))
            self.check_served(pfs, pfs.dataset, "data", cwd=top)

    def test_no_dataset_file_opened_through_monarch_is_said_in_one_line(self):
        # The job lists the dataset as given (its processes load the job map)
        # but reads its files through another mount of the same directory,
        # a file system of its own that Monarch cannot tell is the dataset.
        with Pfs(self.root) as pfs:
            name = sorted(self.ref)[0]
            script = f'ls "$0" >/dev/null && md5sum "$1"'
            args = ["sh", "-c", script, self.root, os.path.join(pfs.dataset, name)]
            p = run(AFTER_INDEX + args, monarch=self.opts(self.root))
            self.assertEqual(p.stdout.split()[0], self.ref[name])
            self.assertEqual(p.stdout.split()[0], md5_file(os.path.join(self.root, name)))
            said = [l for l in p.stderr.splitlines() if "opened no dataset file through Monarch" in l]
            self.assertEqual(len(said), 1, p.stderr[-3000:])
            self.assertIn("loaded the job map", said[0])
            self.assertIn("a path Monarch did not recognise", said[0])
            self.assertIn(f"read it through {self.root}", said[0])
            self.assertNotIn("the job read 0 B", p.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
