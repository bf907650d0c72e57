#!/usr/bin/python3
"""Reads a dataset the way DL frameworks do, for several epochs in a shuffled
order, and prints one JSON line per epoch: the md5 of every file read and,
with --counts, a snapshot of the emulated PFS's counters taken after the
epoch. Used by the engine tests with and without Monarch underneath.

Modes (how each file is read):
  read      Python open().read()               (PyTorch ImageFolder, PIL)
  chunks    open() + read(64 KiB) until EOF    (buffered stream readers)
  mmap      mmap.mmap over the whole file       (numpy.memmap, DALI)
  pread     os.pread in 256 KiB chunks          (TensorFlow TFRecord)
  threads   one file at a time, read in 256 KiB preads by --threads threads
  tfrecord  --threads threads each read whole files in 256 KiB preads
            (TensorFlow's TFRecord pattern: several files interleaved)
  cat       the `cat` program, one process per file
  md5sum    the `md5sum` program on all files of a directory (fopen/fread)
  loader    torch DataLoader, 4 fork workers, DatasetFolder-like tree
  ddp       data-parallel training's pattern (DistributedSampler): rank r of
            n (SLURM_PROCID, SLURM_NTASKS) reads items r, r+n, r+2n... of each
            epoch's permutation (the same on every rank), with 4 fork
            workers; files up to 1 MiB read whole, larger ones in 256 KiB
            preads. With --barrier DIR (shared by the ranks) every rank
            waits for the others at the end of each epoch, so that the
            counts after an epoch are the whole job's.
"""
import argparse
import hashlib
import json
import mmap
import os
import random
import subprocess
import sys
import threading
import time

CHUNK = 256 << 10


def files_of(root):
    out = []
    for d, _, names in os.walk(root):
        out += [os.path.join(d, n) for n in names]
    return sorted(out)


def md5_read(p):
    with open(p, "rb") as f:
        return hashlib.md5(f.read()).hexdigest()


def md5_chunks(p):
    h = hashlib.md5()
    with open(p, "rb") as f:
        while b := f.read(64 << 10):
            h.update(b)
    return h.hexdigest()


def md5_mmap(p):
    with open(p, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return hashlib.md5(b"").hexdigest()
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return hashlib.md5(m).hexdigest()


def md5_pread(p):
    h = hashlib.md5()
    fd = os.open(p, os.O_RDONLY)
    try:
        off = 0
        while b := os.pread(fd, CHUNK, off):
            h.update(b)
            off += len(b)
    finally:
        os.close(fd)
    return h.hexdigest()


def md5_cat(p):
    return hashlib.md5(subprocess.run(["cat", p], check=True, capture_output=True).stdout).hexdigest()


def epoch_threads(paths, nthreads):
    """One file at a time, its 256 KiB chunks read with pread by several
    threads sharing the descriptor (chunk i goes to thread i mod n)."""
    sums = {}
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        size = os.fstat(fd).st_size
        parts = [None] * ((size + CHUNK - 1) // CHUNK)

        def run(first):
            for k in range(first, len(parts), nthreads):
                parts[k] = os.pread(fd, CHUNK, k * CHUNK)

        ts = [threading.Thread(target=run, args=(i,)) for i in range(nthreads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        os.close(fd)
        data = b"".join(parts)
        assert len(data) == size, f"{p}: {len(data)} bytes read, {size} expected"
        sums[p] = hashlib.md5(data).hexdigest()
    return sums


def epoch_tfrecord(paths, nthreads):
    """The TensorFlow pattern: each thread takes the next file and reads it
    sequentially in 256 KiB preads; several files are read at once."""
    sums = {}
    it = iter(paths)
    lock = threading.Lock()

    def run():
        while True:
            with lock:
                p = next(it, None)
            if p is None:
                return
            sums[p] = md5_pread(p)

    ts = [threading.Thread(target=run) for _ in range(nthreads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sums


def epoch_loader(root, seed):
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Files(Dataset):  # DatasetFolder: (path, class) pairs, loader opens and reads
        def __init__(self, root):
            classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
            self.samples = [(p, i) for i, c in enumerate(classes)
                            for p in files_of(os.path.join(root, c))]

        def __len__(self):
            return len(self.samples)

        def __getitem__(self, i):
            path, target = self.samples[i]
            with open(path, "rb") as f:
                data = f.read()
            return path, hashlib.md5(data).hexdigest(), len(data), target

    g = torch.Generator()
    g.manual_seed(seed)
    dl = DataLoader(Files(root), batch_size=16, shuffle=True, num_workers=4, generator=g,
                    multiprocessing_context="fork", collate_fn=lambda b: b)
    sums = {}
    for batch in dl:
        for path, digest, n, target in batch:
            sums[path] = digest
    return sums


def md5_ddp(p):
    if os.path.getsize(p) <= 1 << 20:
        return md5_read(p)
    return md5_pread(p)


def epoch_ddp(order, rank, world):
    import multiprocessing
    mine = order[rank::world]
    with multiprocessing.get_context("fork").Pool(4) as pool:
        return dict(zip(mine, pool.map(md5_ddp, mine, chunksize=8)))


def barrier(directory, name, rank, world, timeout=600):
    open(os.path.join(directory, f"{name}-r{rank}"), "w").close()
    deadline = time.monotonic() + timeout
    while not all(os.path.exists(os.path.join(directory, f"{name}-r{r}")) for r in range(world)):
        if time.monotonic() > deadline:
            sys.exit(f"reader.py: rank {rank}: the other ranks never reached barrier {name}")
        time.sleep(0.02)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--mode", default="read")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--counts", help="emulated PFS counts file to snapshot after each epoch")
    ap.add_argument("--subdir", default="", help="read only this subdirectory of root")
    ap.add_argument("--stat", action="store_true", help="os.stat each file before reading it")
    ap.add_argument("--barrier", help="ddp: a directory shared by the ranks, for epoch barriers")
    ap.add_argument("--list", help="the files to read, relative to root, one a line (no walk)")
    ap.add_argument("--pause", type=float, default=0,
                    help="seconds of no reads after each epoch (its end stands apart in counters)")
    a = ap.parse_args()
    rank, world = int(os.environ.get("SLURM_PROCID", 0)), int(os.environ.get("SLURM_NTASKS", 1))
    top = os.path.join(a.root, a.subdir) if a.subdir else a.root
    if a.list:
        with open(a.list) as f:
            paths = [os.path.join(a.root, line.strip()) for line in f if line.strip()]
    else:
        paths = files_of(top)
    readers = {"read": md5_read, "chunks": md5_chunks, "mmap": md5_mmap, "pread": md5_pread,
               "cat": md5_cat}
    for e in range(a.epochs):
        counts = None
        rnd = random.Random(a.seed * 1000 + e)
        order = paths[:]
        rnd.shuffle(order)
        if a.stat:
            for p in order:
                os.stat(p)
        if a.mode in readers:
            sums = {p: readers[a.mode](p) for p in order}
        elif a.mode == "threads":
            sums = epoch_threads(order, a.threads)
        elif a.mode == "tfrecord":
            sums = epoch_tfrecord(order, a.threads)
        elif a.mode == "md5sum":
            out = subprocess.run(["md5sum"] + order, check=True, capture_output=True, text=True)
            sums = {l[34:]: l[:32] for l in out.stdout.splitlines()}
        elif a.mode == "loader":
            sums = epoch_loader(top, a.seed * 1000 + e)
        elif a.mode == "ddp":
            sums = epoch_ddp(order, rank, world)
            if a.barrier:  # the counts after an epoch: the whole job's, taken by rank 0
                barrier(a.barrier, f"{e + 1}", rank, world)
                if rank == 0 and a.counts:
                    with open(a.counts) as f:
                        counts = json.load(f)
                barrier(a.barrier, f"{e + 1}-counted", rank, world)
        else:
            sys.exit(f"reader.py: unknown --mode {a.mode}")
        rel = {os.path.relpath(p, a.root): s for p, s in sums.items()}
        if a.counts and not (a.mode == "ddp" and a.barrier):
            with open(a.counts) as f:
                counts = json.load(f)
        print(json.dumps({"epoch": e + 1, "files": rel, "pfs": counts, "time": time.time()}),
              flush=True)
        time.sleep(a.pause)


if __name__ == "__main__":
    main()
