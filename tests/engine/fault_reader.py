#!/usr/bin/python3
"""A DataLoader-like reader for the fault tests: WORKERS forked processes read
every file of ROOT once per epoch (small files whole, others in 256 KiB
preads), each worker a different share, and time every single call.

  fault_reader.py ROOT [--epochs N] [--workers N] [--small-max BYTES]
                       [--pause-file PATH]

Prints one JSON line per epoch: seconds, the longest single call (open or
read) in seconds, the files read and the md5 of each. With --pause-file, the
reader waits before epoch --pause-epoch (0-based, default 1) until that file
exists: the test injects a fault meanwhile."""
import argparse
import hashlib
import json
import os
import time

CHUNK = 256 << 10

ap = argparse.ArgumentParser()
ap.add_argument("root")
ap.add_argument("--epochs", type=int, default=1)
ap.add_argument("--workers", type=int, default=4)
ap.add_argument("--small-max", type=int, default=1 << 20)
ap.add_argument("--pause-file")
ap.add_argument("--pause-epoch", type=int, default=1, help="wait for --pause-file before this epoch")
a = ap.parse_args()

files = sorted(os.path.join(d, n) for d, _, ns in os.walk(a.root) for n in ns)


def timed(longest, f, *args):
    t = time.monotonic()
    r = f(*args)
    longest[0] = max(longest[0], time.monotonic() - t)
    return r


def worker(share, out_fd):
    longest, sums = [0.0], {}
    for p in share:
        h = hashlib.md5()
        fd = timed(longest, os.open, p, os.O_RDONLY)
        size = os.fstat(fd).st_size
        if size <= a.small_max:
            h.update(timed(longest, os.read, fd, size + 1))
        else:
            off = 0
            while b := timed(longest, os.pread, fd, CHUNK, off):
                h.update(b)
                off += len(b)
        os.close(fd)
        sums[os.path.relpath(p, a.root)] = h.hexdigest()
    os.write(out_fd, (json.dumps([longest[0], sums]) + "\n").encode())
    os._exit(0)


for epoch in range(a.epochs):
    if epoch == a.pause_epoch and a.pause_file:
        while not os.path.exists(a.pause_file):
            time.sleep(0.02)
    start = time.monotonic()
    r, w = os.pipe()
    pids = []
    for i in range(a.workers):
        pid = os.fork()
        if pid == 0:
            os.close(r)
            worker(files[i::a.workers], w)
        pids.append(pid)
    os.close(w)
    with os.fdopen(r) as f:
        parts = [json.loads(line) for line in f]
    bad = [p for p in pids if os.waitpid(p, 0)[1] != 0]
    sums = {}
    for _, s in parts:
        sums.update(s)
    print(json.dumps({"epoch": epoch + 1, "seconds": time.monotonic() - start,
                      "longest": max(x for x, _ in parts), "failed": len(bad), "files": sums}),
          flush=True)
