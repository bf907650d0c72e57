#!/usr/bin/python3
"""The formats benchmark's reader (contrib/bench/formats): one access pattern
of a common dataset format, for some epochs, printing one JSON line per
epoch: its wall time, the CPU time of the reader and its workers, and a
digest of what it read (equal across setups, or the setup is wrong).

  formats_reader.py make   DIR           the datasets (SQLite, LMDB, numpy)
  formats_reader.py sqlite DIR --epochs N   random point queries, sqlite3.connect(path)
  formats_reader.py lmdb   DIR --epochs N   random gets in 4 workers, each with an
                                            lmdb.open(path) made once, before epoch 1
                                            (--readonly: readonly=True, lock=False, what
                                            a read-only file system needs)
  formats_reader.py memmap DIR --epochs N   random slices of numpy.memmap made before epoch 1
"""
import argparse
import hashlib
import json
import multiprocessing
import os
import random
import resource
import sqlite3
import time

ROWS = 200_000  # SQLite: rows of ~200 B, an index on the key
QUERIES = 20_000  # per epoch, the count
LMDB_KEYS = 60_000  # LMDB: values of 1-3 KiB
GETS = 20_000  # per epoch, over all workers
WORKERS = 4
ARRAYS, ARRAY_MIB = 4, 64  # numpy: .npy files of float32
SLICES = 4_000  # per epoch, 64 KiB each


DROP = False  # --drop: the page cache is emptied before each epoch but the first


def drop(epoch):
    """A dataset larger than memory, read again: nothing of it is in the page
    cache at an epoch's start (needs root)."""
    if DROP and epoch:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")


def cpu():
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def make(d):
    import lmdb
    import numpy as np
    os.makedirs(d, exist_ok=True)
    rnd = random.Random(7)
    db = sqlite3.connect(os.path.join(d, "table.db"))
    db.execute("create table t (k integer primary key, v blob)")
    db.executemany("insert into t values (?, ?)",
                   ((k, rnd.randbytes(150 + k % 100)) for k in range(ROWS)))
    db.commit()
    db.close()
    env = lmdb.open(os.path.join(d, "env"), map_size=1 << 30)
    with env.begin(write=True) as txn:
        for k in range(LMDB_KEYS):
            txn.put(b"%08d" % k, rnd.randbytes(1024 + k % 2048))
    env.close()
    os.remove(os.path.join(d, "env", "lock.mdb"))  # each reader makes its own
    for i in range(ARRAYS):
        a = np.random.default_rng(i).random(ARRAY_MIB << 18, dtype=np.float32)
        np.save(os.path.join(d, f"array{i}.npy"), a)


def sqlite_epochs(d, epochs):
    rnd = random.Random(1)
    for e in range(epochs):
        drop(e)
        t0, c0, h = time.time(), cpu(), hashlib.md5()
        db = sqlite3.connect(os.path.join(d, "table.db"))  # the default: O_RDWR|O_CREAT
        for _ in range(QUERIES):
            h.update(db.execute("select v from t where k = ?", (rnd.randrange(ROWS),)).fetchone()[0])
        db.close()
        yield time.time() - t0, cpu() - c0, h.hexdigest()


def lmdb_epochs(d, epochs, readonly=False):
    # Workers that open the environment once and then get, epoch after epoch:
    # fork workers kept for the whole run, as persistent DataLoader workers are.
    ctx = multiprocessing.get_context("fork")
    per = GETS // WORKERS
    starts = [[ctx.Event() for _ in range(epochs)] for _ in range(WORKERS)]
    dones = [ctx.Queue() for _ in range(WORKERS)]

    def work(w):
        import lmdb
        env = lmdb.open(os.path.join(d, "env"), **(dict(readonly=True, lock=False) if readonly
                                                    else {}))
        rnd = random.Random(w)
        for e in range(epochs):
            starts[w][e].wait()
            h = hashlib.md5()
            with env.begin() as txn:
                for _ in range(per):
                    h.update(txn.get(b"%08d" % rnd.randrange(LMDB_KEYS)))
            c = resource.getrusage(resource.RUSAGE_SELF)
            dones[w].put((h.hexdigest(), c.ru_utime + c.ru_stime))
    procs = [ctx.Process(target=work, args=(w,)) for w in range(WORKERS)]
    for p in procs:
        p.start()
    spent = [0.0] * WORKERS
    for e in range(epochs):
        drop(e)
        t0, c0 = time.time(), cpu()
        for w in range(WORKERS):
            starts[w][e].set()
        h, c = hashlib.md5(), 0.0
        for w in range(WORKERS):
            digest, used = dones[w].get(timeout=900)  # a worker that died: no result
            h.update(digest.encode())
            c += used - spent[w]
            spent[w] = used
        yield time.time() - t0, c + cpu() - c0, h.hexdigest()
    for p in procs:
        p.join()


def memmap_epochs(d, epochs):
    import numpy as np
    arrays = [np.load(os.path.join(d, f"array{i}.npy"), mmap_mode="r") for i in range(ARRAYS)]
    rnd = random.Random(3)
    n = 16 << 10  # float32s: 64 KiB a slice
    for e in range(epochs):
        drop(e)
        t0, c0, h = time.time(), cpu(), hashlib.md5()
        for _ in range(SLICES):
            a = arrays[rnd.randrange(ARRAYS)]
            at = rnd.randrange(a.size - n)
            h.update(np.ascontiguousarray(a[at:at + n]).tobytes())
        yield time.time() - t0, cpu() - c0, h.hexdigest()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["make", "sqlite", "lmdb", "memmap"])
    ap.add_argument("dir")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--readonly", action="store_true")
    ap.add_argument("--drop", action="store_true")
    a = ap.parse_args()
    global DROP
    DROP = a.drop
    if a.what == "make":
        return make(a.dir)
    if a.what == "lmdb":
        epochs = lmdb_epochs(a.dir, a.epochs, a.readonly)
    else:
        epochs = {"sqlite": sqlite_epochs, "memmap": memmap_epochs}[a.what](a.dir, a.epochs)
    for e, (wall, used, digest) in enumerate(epochs):
        print(json.dumps({"epoch": e + 1, "wall": wall, "cpu": used, "digest": digest}), flush=True)


if __name__ == "__main__":
    main()
