#!/usr/bin/python3
"""Identity as the kernel gives it: for a descriptor Monarch opened on a
local copy, lstat, readlink and islink of /proc/self/fd/N, /dev/fd/N and
/proc/<own pid>/fd/N show what they show for the PFS file, run directly and
through monarch-run."""
import os
import shutil
import tempfile
import unittest

from harness import AFTER_INDEX, PY, Case, conf_file, run, tier

# Reads the file once so that its copy is made, waits for the copy (the job
# directory's data/, when run through Monarch), opens it again, and prints
# what the program can see of the descriptor. "copy" says whether the
# kernel's own answer (a raw readlink system call) names the tier: that the
# descriptor really is a copy, so the comparison is not vacuous.
PROGRAM = r"""
import ctypes, os, stat, sys, time
root, rel = sys.argv[1], sys.argv[2]
path = os.path.join(root, rel)
job = os.environ.get("MONARCH_JOB_DIR")
if job:
    for _ in range(3000):
        with open(path, "rb") as f:
            f.read()
        if os.path.exists(os.path.join(job, "data", rel)):
            break
        time.sleep(0.01)
fd = os.open(path, os.O_RDONLY)
libc = ctypes.CDLL(None, use_errno=True)
buf = ctypes.create_string_buffer(4096)
n = libc.syscall(89, f"/proc/self/fd/{fd}".encode(), buf, 4096)  # SYS_readlink (x86_64)
print("copy", job is not None and n > 0 and buf.raw[:n].decode().startswith(os.path.dirname(job)))
for name in (f"/proc/self/fd/{fd}", f"/dev/fd/{fd}", f"/proc/{os.getpid()}/fd/{fd}"):
    kind = name.split("/")[1] + ("/self" if "self" in name else "")
    st = os.lstat(name)
    print(kind, "lstat", oct(st.st_mode), st.st_size, stat.S_ISLNK(st.st_mode))
    print(kind, "islink", os.path.islink(name))
    print(kind, "readlink", os.readlink(name) == os.path.realpath(path))
    st = os.stat(name)
    ref = os.stat(path)
    print(kind, "stat", oct(st.st_mode), st.st_size, (st.st_dev, st.st_ino) == (ref.st_dev, ref.st_ino))
    print(kind, "os.stat(follow_symlinks=False)",
          oct(os.stat(name, follow_symlinks=False).st_mode))
"""


class Identity(Case):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="monarch-identity-")
        cls.root = os.path.join(cls.tmp, "ds")
        os.makedirs(os.path.join(cls.root, "sub"))
        for i in range(4):
            with open(os.path.join(cls.root, "sub", f"f{i}.bin"), "wb") as f:
                f.write(os.urandom(300_000 + i))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_proc_self_fd_of_a_copy_is_the_pfs_files(self):
        args = [PY, "-c", PROGRAM, self.root, "sub/f1.bin"]
        direct = run(args).stdout.splitlines()
        conf = conf_file(self, tier(self), copy_fast_dataset="yes")
        served = run(AFTER_INDEX + args,
                     monarch=["--dataset", self.root, "--config", conf]).stdout.splitlines()
        self.assertEqual(served[0], "copy True", "the descriptor was not a copy: vacuous")
        self.assertEqual(direct[0], "copy False")
        self.assertEqual(served[1:], direct[1:])
        self.assertIn("proc/self lstat 0o120500 64 True", direct)


if __name__ == "__main__":
    unittest.main(verbosity=2)
