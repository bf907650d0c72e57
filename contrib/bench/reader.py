#!/usr/bin/python3
"""The benchmark's training jobs, timed per epoch. Prints {"ready": ...} once
the job has listed its dataset (imports and listing done), then one JSON line
per epoch; after each of these lines it waits for a line on stdin (the runner
snapshots the emulated PFS's counters in between, outside the timed epochs).

  reader.py tf  ROOT [--threads 4] [--compute-ms MS] [--cache DIR --cache-quota B] [--local DIR]
  reader.py img ROOT [--workers 4] [--compute-ms MS] [--cache DIR --cache-quota B] [--local DIR]
  reader.py files ROOT [--procs 4] [--epochs N] [--part F] [--local DIR]
  reader.py first ROOT --file REL [--wait-index]

tf:  TFRecord-like (TensorFlow's TFRecordDataset with interleave): a new
     shuffled file order each epoch, --threads files read at once, each
     sequentially in 256 KiB preads; a consumer computes per 8 MiB batch.
img: ImageFolder-like (PyTorch): a DataLoader with fork workers, shuffled,
     64 files per batch, each file read whole with open().read() as Python
     and PIL do (fstat, read, read at EOF); the main process computes per batch.
files: --procs forked reader processes, forked again each epoch (as a
     DataLoader's workers are), splitting a shuffled order; each file read
     whole with open().read(), no torch (a start of a few tens of ms).
     --part F: only the first files in path order (whole class folders), as
     many as fit in F of the dataset's bytes, read in a shuffled order.
first: a job that wants one file: prints {"first_read": T} (CLOCK_MONOTONIC,
     the clock the runner launched it by) once it has read REL; with
     --wait-index it then waits until the job map exists ($MONARCH_JOB_DIR/index:
     the stager has indexed the whole dataset), reads REL again and prints
     {"index_seen": T, "map_bytes": B}.
--compute-ms: time per batch standing for the model's work (0: I/O-bound).
--cache DIR: the naive copy-on-first-read baseline (the seed's chapter 3,
     TensorFlow's cache stage): a file read from the PFS is written to DIR as
     it is read, while the quota has room; later epochs read DIR's copy.
--local DIR: files present in DIR (a manual copy of part of the dataset) are
     read there, the others from ROOT.
The epoch order is the same in every setup (fixed seeds)."""
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
IMG_BATCH = 64


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
    """Where to read p this epoch, and where to write a cached copy (or None)."""
    if local:
        lp = os.path.join(local, os.path.relpath(p, root))
        if os.path.exists(lp):
            return lp, None
    if cache:
        c = cache.path(root, p)
        if os.path.exists(c):
            return c, None
        if cache.reserve(os.path.getsize(p)):
            os.makedirs(os.path.dirname(c), exist_ok=True)
            return p, c
    return p, None


def read_chunks(root, p, cache, local, sink):
    """TensorFlow's pattern: 256 KiB preads until EOF."""
    src, copy = source(root, p, cache, local)
    fd = os.open(src, os.O_RDONLY)
    out = open(copy + ".part", "wb") if copy else None
    off = 0
    while b := os.pread(fd, CHUNK, off):
        off += len(b)
        if out:
            out.write(b)
        sink(len(b))
    os.close(fd)
    if out:
        out.close()
        os.rename(copy + ".part", copy)
    return off


def read_whole(root, p, cache, local):
    """Python's and PIL's pattern: open, fstat, read to EOF, close."""
    src, copy = source(root, p, cache, local)
    with open(src, "rb") as f:
        data = f.read()
    if copy:
        with open(copy + ".part", "wb") as out:
            out.write(data)
        os.rename(copy + ".part", copy)
    return len(data)


def epoch_tf(root, files, a, cache):
    order = files[:]
    random.shuffle(order)
    it, lock = iter(order), threading.Lock()
    q = queue.Queue(maxsize=64)  # 16 MiB read ahead of the model, like a prefetch buffer

    def produce():
        try:
            while True:
                with lock:
                    p = next(it, None)
                if p is None:
                    return
                read_chunks(root, p, cache, a.local, q.put)
        finally:
            q.put(None)

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
    return len(files)


def epoch_img(root, files, a, cache, epoch):
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Files(Dataset):
        def __len__(self):
            return len(files)

        def __getitem__(self, i):
            return read_whole(root, files[i], cache, a.local)

    g = torch.Generator()
    g.manual_seed(epoch)
    loader = DataLoader(Files(), batch_size=IMG_BATCH, shuffle=True, num_workers=a.workers,
                        multiprocessing_context="fork", generator=g)
    n = 0
    for sizes in loader:
        n += len(sizes)
        time.sleep(a.compute_ms / 1000)
    return n


def epoch_files(files, a, epoch):
    order = files[:]
    random.Random(epoch).shuffle(order)
    pids = []
    for i in range(a.procs):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                for p in order[i::a.procs]:
                    src = p
                    if a.local:
                        lp = os.path.join(a.local, os.path.relpath(p, a.root))
                        if os.path.exists(lp):
                            src = lp
                    with open(src, "rb") as f:
                        f.read()
            except BaseException:
                code = 1
            os._exit(code)
        pids.append(pid)
    for pid in pids:
        if os.waitpid(pid, 0)[1] != 0:
            sys.exit("reader: a forked reader failed")
    return len(order)


def part_of(files, share):
    """The first files in path order, as many as fit in `share` of the bytes."""
    total = sum(os.path.getsize(p) for p in files)
    out, got = [], 0
    for p in files:
        size = os.path.getsize(p)
        if out and got + size > share * total:
            break
        out.append(p)
        got += size
    return out


def first(a):
    path = os.path.join(a.root, a.file)
    with open(path, "rb") as f:
        n = len(f.read())
    print(json.dumps({"first_read": time.monotonic(), "bytes": n}), flush=True)
    if a.wait_index:
        index = os.path.join(os.environ["MONARCH_JOB_DIR"], "index")
        while not os.path.exists(index):
            time.sleep(0.01)
        seen = time.monotonic()
        with open(path, "rb") as f:
            f.read()
        print(json.dumps({"index_seen": seen, "map_bytes": os.path.getsize(index)}), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kind", choices=["tf", "img", "files", "first"])
    ap.add_argument("root")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--compute-ms", type=float, default=0)
    ap.add_argument("--cache")
    ap.add_argument("--cache-quota", type=int, default=0)
    ap.add_argument("--local")
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--part", type=float, default=1.0)
    ap.add_argument("--file")
    ap.add_argument("--wait-index", action="store_true")
    a = ap.parse_args()
    if a.kind == "first":
        return first(a)
    if a.kind == "img":
        import torch  # noqa: F401  (imported before the clock starts, as a training script does)
    files = sorted(os.path.join(d, n) for d, _, ns in os.walk(a.root) for n in ns)
    if a.part < 1:
        files = part_of(files, a.part)
    cache = Cache(a.cache, a.cache_quota) if a.cache else None
    random.seed(1)
    print(json.dumps({"ready": True, "files": len(files)}), flush=True)
    sys.stdin.readline()  # the runner snapshots the PFS's counters: start-up ends here
    for e in range(1, a.epochs + 1):
        if cache:  # the baseline's bookkeeping, outside the timed epoch
            cache.new_epoch(a.workers if a.kind == "img" else 1)
        start = time.monotonic()
        if a.kind == "tf":
            n = epoch_tf(a.root, files, a, cache)
        elif a.kind == "files":
            n = epoch_files(files, a, e)
        else:
            n = epoch_img(a.root, files, a, cache, e)
        print(json.dumps({"epoch": e, "seconds": time.monotonic() - start, "files": n}), flush=True)
        sys.stdin.readline()  # the runner snapshots the PFS's counters


if __name__ == "__main__":
    main()
