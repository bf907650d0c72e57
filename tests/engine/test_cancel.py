#!/usr/bin/python3
"""A thread cancelled (pthread_cancel) while it reads a dataset file through
Monarch: the library is built without exceptions, so the cancellation
unwinds it without its destructors. The thread must still end, and the
descriptor it shared must still read: no lock of Monarch's left taken."""
import os
import subprocess
import tempfile
import unittest

from harness import AFTER_INDEX, SMALL, Case, Pfs, conf_file, dataset, run, tier

# A thread read()s one file over and over (read() on a descriptor Monarch
# tracks holds its lock for the call); main cancels it, joins it, then reads
# the same descriptor. A hang is a failure: alarm() ends the program.
PROGRAM = r"""
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
static int fd;
static atomic_long reads;
static void* reader(void* arg) {
  char buf[65536];
  for (;;) {
    ssize_t r = read(fd, buf, sizeof buf);
    if (r < 0) { perror("read"); exit(2); }
    if (r == 0) lseek(fd, 0, SEEK_SET);
    atomic_fetch_add(&reads, 1);
  }
  return arg;
}
int main(int argc, char** argv) {
  alarm(30);
  fd = open(argv[1], O_RDONLY | O_CLOEXEC);
  if (fd < 0) { perror(argv[1]); return 1; }
  pthread_t t;
  pthread_create(&t, NULL, reader, NULL);
  while (atomic_load(&reads) < 3) usleep(1000);
  long at_cancel = atomic_load(&reads);
  pthread_cancel(t);
  void* result;
  pthread_join(t, &result);
  if (result != PTHREAD_CANCELED) return 3;
  lseek(fd, 0, SEEK_SET);
  char buf[4096];
  ssize_t r = read(fd, buf, sizeof buf);
  printf("cancelled at read %ld, ended after %ld; the descriptor then read %zd bytes\n",
         at_cancel, atomic_load(&reads), r);
  return r == (ssize_t)sizeof buf ? 0 : 4;
}
"""


class Cancel(Case):
    @classmethod
    def setUpClass(cls):
        cls.root = dataset("small", **SMALL)
        cls.tmp = tempfile.mkdtemp(prefix="monarch-cancel-")
        src = os.path.join(cls.tmp, "cancel.c")
        with open(src, "w") as f:
            f.write(PROGRAM)
        cls.exe = os.path.join(cls.tmp, "cancel")
        subprocess.run(["gcc", "-O2", "-pthread", "-o", cls.exe, src], check=True)

    @classmethod
    def tearDownClass(cls):
        subprocess.run(["rm", "-rf", cls.tmp])

    def test_cancelled_reader_leaves_its_descriptor_readable(self):
        # The descriptor is opened as the stager starts copying: each read()
        # then holds its lock while it waits for the copy, reads the part
        # copied, or opens, reads and closes the finished copy (all
        # cancellation points), which is most of the thread's time. The
        # cancellation comes in the middle of one.
        with Pfs(self.root, latency_us=2000) as pfs:
            records = os.path.join(pfs.dataset, "records")
            big = os.path.join(records, sorted(os.listdir(records))[0])
            conf = conf_file(self, tier(self), quota="100%", copy_fast_dataset="yes")
            p = run(AFTER_INDEX + [self.exe, big], check=False,
                    monarch=["--dataset", pfs.dataset, "--config", conf],
                    env={"MONARCH_LOG": "1"})
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr[-3000:])
        self.assertIn("cancelled at read", p.stdout)


if __name__ == "__main__":
    unittest.main(verbosity=2)
