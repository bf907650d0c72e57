#!/usr/bin/python3
"""A musl program (Alpine's userland; built here with Debian's musl-tools) in
a Monarch job: dynamic, it loads the library, which stays off in it and says
so in one line; static, it never loads it. Either way it runs to the end
with the right output: the bytes of the dataset's files, read from the PFS."""
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "engine"))
from harness import LIBRARY, SMALL, Case, conf_file, dataset, run, tier  # noqa: E402

# Prints each file's size and FNV-1a 64 hash, read with open/read/close.
PROGRAM = r"""
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>
int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    int fd = open(argv[i], O_RDONLY);
    if (fd < 0) { perror(argv[i]); return 1; }
    uint64_t h = 14695981039346656037ull, n = 0;
    unsigned char buf[65536];
    ssize_t r;
    while ((r = read(fd, buf, sizeof buf)) > 0)
      for (ssize_t j = 0; j < r; ++j, ++n) h = (h ^ buf[j]) * 1099511628211ull;
    if (r < 0 || close(fd) != 0) { perror(argv[i]); return 1; }
    printf("%llu %016llx %s\n", (unsigned long long)n, (unsigned long long)h, argv[i]);
  }
  return 0;
}
"""


def expected(paths):
    out = []
    for p in paths:
        h = 14695981039346656037
        with open(p, "rb") as f:
            data = f.read()
        for b in data:
            h = ((h ^ b) * 1099511628211) & (2**64 - 1)
        out.append(f"{len(data)} {h:016x} {p}\n")
    return "".join(out)


class Musl(Case):
    @classmethod
    def setUpClass(cls):
        cls.root = dataset("small", **SMALL)
        cls.files = sorted(os.path.join(cls.root, "images", "class_000", n)
                           for n in os.listdir(os.path.join(cls.root, "images", "class_000")))
        cls.want = expected(cls.files)
        cls.tmp = tempfile.mkdtemp(prefix="monarch-musl-")
        src = os.path.join(cls.tmp, "fnv.c")
        with open(src, "w") as f:
            f.write(PROGRAM)
        cls.programs = {}
        for kind, flags in (("dynamic", []), ("static", ["-static"])):
            exe = os.path.join(cls.tmp, f"fnv-{kind}")
            subprocess.run(["musl-gcc", "-O2", *flags, "-o", exe, src], check=True)
            cls.programs[kind] = exe
        # Not vacuous: the dynamic one is a musl program, that loads what it is given.
        interp = subprocess.run(["readelf", "-l", cls.programs["dynamic"]], capture_output=True,
                                text=True, check=True).stdout
        assert "ld-musl" in interp, interp

    @classmethod
    def tearDownClass(cls):
        subprocess.run(["rm", "-rf", cls.tmp])

    def test_library_preloaded_only(self):
        for kind, exe in self.programs.items():
            p = subprocess.run([exe] + self.files, capture_output=True, text=True, timeout=60,
                               env={**os.environ, "LD_PRELOAD": LIBRARY})
            self.assertEqual((p.returncode, p.stderr), (0, ""), kind)
            self.assertEqual(p.stdout, self.want, kind)

    def test_in_a_job(self):
        conf = conf_file(self, tier(self), quota="100%", copy_fast_dataset="yes")
        for kind, exe in self.programs.items():
            p = run([exe] + self.files, monarch=["--dataset", self.root, "--config", conf])
            self.assertEqual(p.stdout, self.want, kind)
            said = [line for line in p.stderr.splitlines() if "does not use glibc" in line]
            if kind == "dynamic":
                self.assertEqual(len(said), 1, p.stderr[-2000:])
                self.assertIn(exe, said[0])
            else:  # a static program never loads the library: nothing can say so
                self.assertEqual(said, [], p.stderr[-2000:])
            self.assertNotIn("Error relocating", p.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
