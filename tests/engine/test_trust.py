#!/usr/bin/python3
"""Trust (issue 13): every case the issue lists, run by the same program once
directly and once through Monarch (stage_ahead = no, as the issue reproduced
them), on two identical trees; the outputs must be equal. Afterwards every copy
Monarch made must hold the bytes of the very file it copies: no sequence of
calls may put another file's bytes into the cache."""
import hashlib
import os
import random
import shutil
import subprocess
import tempfile
import unittest

from harness import AFTER_INDEX, Case, LIBRARY, MONARCH_RUN, PY, conf_file, run, tier

HERE = os.path.dirname(os.path.abspath(__file__))
PROBE = os.path.join(HERE, "trust_probe.py")

FILES = {  # dataset files and their sizes; look-alikes have the same sizes, other bytes
    "a.bin": 10000, "b.bin": 20000, "big.bin": 3 << 20, "sub/c.bin": 5000,
    "sub/deeper/d.bin": 3000, "w.bin": 10000, "v.bin": 9000, "u.bin": 100, "h1.bin": 4000,
}
OUTSIDE = {"out/a.bin": 10000, "out/b.bin": 20000, "out/dir/a.bin": 10000,
           "out/other.bin": 12345, "work/a.bin": 10000}


def content(name, size, salt):
    r = random.Random(f"{salt}:{name}")
    return r.randbytes(size)


def make_tree(parent):
    t = tempfile.mkdtemp(prefix="tree-", dir=parent)
    os.chmod(t, 0o755)
    for name, size in list(FILES.items()):
        p = os.path.join(t, "ds", name)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(content(name, size, "dataset"))
    for name, size in OUTSIDE.items():
        p = os.path.join(t, name)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(content(name, size, "look-alike"))
    os.symlink("../out/dir", os.path.join(t, "ds", "linkdir"))
    os.symlink("sub", os.path.join(t, "ds", "sublink"))
    os.link(os.path.join(t, "ds", "h1.bin"), os.path.join(t, "ds", "h2.bin"))
    return t


class Trust(Case):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="monarch-trust-")
        os.chmod(self.tmp, 0o755)
        self.addCleanup(shutil.rmtree, self.tmp, True)

    def compare(self, case, consistency="job"):
        direct_tree, monarch_tree = make_tree(self.tmp), make_tree(self.tmp)
        direct = subprocess.run([PY, PROBE, case, direct_tree], capture_output=True, text=True,
                                timeout=300)
        t = tier(self)
        conf = conf_file(self, t, quota="1G", stage_ahead="no", small_file_max="64K",
                         consistency=consistency)
        through = run(AFTER_INDEX + [PY, PROBE, case, monarch_tree], check=False, timeout=300,
                      monarch=["--dataset", os.path.join(monarch_tree, "ds"), "--config", conf,
                               "--keep", "-q"], env={"MONARCH_LOG": "1"})
        self.assertNotEqual(direct.stdout.strip(), "", direct.stderr)
        self.assertEqual((through.returncode, through.stdout.splitlines()),
                         (direct.returncode, direct.stdout.splitlines()),
                         f"{case}: through Monarch vs directly\n{through.stderr[-3000:]}")
        self.assertIn("using the job map", through.stderr, "Monarch did not run")
        self.assert_copies_faithful(t)
        return direct.stdout

    def assert_copies_faithful(self, t):
        """Every copy holds the bytes of the file it copies (its original version)."""
        copies = 0
        for job in os.listdir(t):
            data = os.path.join(t, job, "data")
            for d, _, names in os.walk(data):
                for n in names:
                    rel = os.path.relpath(os.path.join(d, n), data)
                    with open(os.path.join(d, n), "rb") as f:
                        got = f.read()
                    name = "h1.bin" if rel == "h2.bin" else rel  # one file, two names
                    self.assertIn(name, FILES, f"a copy of a file that is not in the dataset: {rel}")
                    self.assertEqual(hashlib.md5(got).hexdigest(),
                                     hashlib.md5(content(name, FILES[name], "dataset")).hexdigest(),
                                     f"the copy of {rel} holds other bytes: the cache is poisoned")
                    copies += 1
        return copies

    def test_vfork_subprocess_cwd_and_close_fds(self):
        self.compare("vfork_cwd")

    def test_dot_and_dotdot_resolved_as_the_kernel_does(self):
        self.compare("dotdot")

    def test_descriptors_closed_behind_monarchs_back(self):
        self.compare("recycled")

    def test_dup_and_fork_share_offsets(self):
        self.compare("dup_offsets")

    def test_descriptor_identity(self):
        self.compare("identity")

    def test_rlimits_as_without_monarch(self):
        self.compare("limits")

    def test_pread_negative_offset(self):
        self.compare("pread_negative")

    def test_missing_paths_errno_consistency_open(self):
        out = self.compare("missing", consistency="open")
        self.assertIn("ENOENT", out)

    def test_magic_names_of_a_copy_reach_the_file(self):
        self.compare("magic_names")

    def test_hard_links_in_the_dataset(self):
        self.compare("hard_links")

    def test_dataset_directory_moved(self):
        self.compare("moved_root")

    def test_writes_seen_by_every_later_call(self):
        self.compare("writes")

    def test_fork_while_a_thread_stats(self):
        out = self.compare("fork_during_stat")
        self.assertIn('["children done", 500]', out)


if __name__ == "__main__":
    unittest.main(verbosity=2)
