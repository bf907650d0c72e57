#!/usr/bin/python3
"""The benchmark's training jobs, timed per epoch. Each epoch's line is
written to stdout, then the reader waits for a line on stdin (the runner
snapshots the emulated PFS's counters in between).

  reader.py tf  ROOT [--threads 4] [--compute-ms MS] [--cache DIR --cache-quota B] [--local DIR]
  reader.py img ROOT [--workers 4] [--compute-ms MS] [--cache DIR --cache-quota B] [--local DIR]

tf:  TFRecord-like: threads read whole files in 256 KiB preads, shuffled
     file order, several files at once; a consumer computes per 8 MiB batch.
img: ImageFolder-like: a torch DataLoader with fork workers reads whole
     files, 64 per batch; the main process computes per batch.
--compute-ms: time per batch standing for the model's work (0: I/O-bound).
--cache DIR: the naive copy-on-first-read baseline (the seed's chapter 3, as
     TensorFlow's cache stage): a file read from the PFS is written to DIR
     as it is read, while room is left; later epochs read DIR's copy.
--local DIR: files present in DIR (a partial manual copy) are read there."""
import argparse
import json
import os
import queue
import random
import sys
import threading
import time

CHUNK = 256 << 10
BATCH_BYTES = 8 << 20


class Cache:
    """Copy-on-first-read into DIR while under the quota. Each epoch starts
    from what DIR holds; DataLoader workers (processes) split what is left."""

    def __init__(self, d, quota):
        self.dir, self.quota, self.used, self.lock = d, quota, 0, threading.Lock()

    def new_epoch(self, shares):
        held = sum(os.path.getsize(os.path.join(p, n)) for p, _, ns in os.walk(self.dir) for n in ns)
        self.used = self.quota - max(0, self.quota - held) // shares

    def path(self, root, p):
        return os.path.join(self.dir, os.path.relpath(p, root))

    def reserve(self, n):
        with self.lock:
            if self.used + n > self.quota:
                return False
            self.used += n
            return True


def source(root, p, cache, local):
    """Where to read p from this epoch, and where to write a cached copy."""
    if local and os.path.exists(os.path.join(local, os.path.relpath(p, root))):
        return os.path.join(local, os.path.relpath(p, root)), None
    if cache:
        c = cache.path(root, p)
        if os.path.exists(c):
            return c, None
        if cache.reserve(os.path.getsize(p)):
            os.makedirs(os.path.dirname(c), exist_ok=True)
            return p, c
    return p, None


def read_file(root, p, cache, local, sink=None):
    src, copy = source(root, p, cache, local)
    fd = os.open(src, os.O_RDONLY)
    out = open(copy + ".part", "wb") if copy else None
    total, off = 0, 0
    while b := os.pread(fd, CHUNK, off):
        off += len(b)
        if out:
            out.write(b)
        if sink:
            sink(len(b))
    os.close(fd)
    if out:
        out.close()
        os.rename(copy + ".part", copy)
    return off


def epoch_tf(root, files, a, cache):
    order = files[:]
    random.shuffle(order)
    it, lock = iter(order), threading.Lock()
    q = queue.Queue(maxsize=64)

    def produce():
        while True:
            with lock:
                p = next(it, None)
            if p is None:
                q.put(None)
                return
            read_file(root, p, cache, a.local, q.put)

    ts = [threading.Thread(target=produce, daemon=True) for _ in range(a.threads)]
    for t in ts:
        t.start()
    done, batch = 0, 0
    while done < len(ts):
        n = q.get()
        if n is None:
            done += 1
            continue
        batch += n
        if batch >= BATCH_BYTES:
            batch -= BATCH_BYTES
            time.sleep(a.compute_ms / 1000)
    if batch:
        time.sleep(a.compute_ms / 1000)


def epoch_img(root, files, a, cache, epoch):
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Files(Dataset):
        def __len__(self):
            return len(files)

        def __getitem__(self, i):
            return read_file(root, files[i], cache, a.local)

    g = torch.Generator()
    g.manual_seed(epoch)
    loader = DataLoader(Files(), batch_size=64, shuffle=True, num_workers=a.workers,
                        multiprocessing_context="fork", generator=g)
    for _ in loader:
        time.sleep(a.compute_ms / 1000)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kind", choices=["tf", "img"])
    ap.add_argument("root")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--compute-ms", type=float, default=0)
    ap.add_argument("--cache")
    ap.add_argument("--cache-quota", type=int, default=0)
    ap.add_argument("--local")
    a = ap.parse_args()
    files = sorted(os.path.join(d, n) for d, _, ns in os.walk(a.root) for n in ns)
    cache = Cache(a.cache, a.cache_quota) if a.cache else None
    random.seed(1)
    for e in range(1, a.epochs + 1):
        start = time.time()
        if cache:
            cache.new_epoch(a.workers if a.kind == "img" else 1)
        if a.kind == "tf":
            epoch_tf(a.root, files, a, cache)
        else:
            epoch_img(a.root, files, a, cache, e)
        print(json.dumps({"epoch": e, "seconds": time.time() - start}), flush=True)
        sys.stdin.readline()  # the runner snapshots the PFS's counters


if __name__ == "__main__":
    main()
