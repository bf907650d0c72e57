#!/usr/bin/python3
"""A program that maps dataset files once, before its epochs, as formats do
(test_formats_maps.py runs it directly and through monarch-run and compares).

  memmap DIR   numpy.memmap (mode 'r') of every *.bin file, random slices
  lmdb DIR     one LMDB environment (readonly=True, lock=False), random gets
  mutate DIR   a mapping of DIR/big.dat made writable (mprotect) and written,
               and a mapping partly unmapped (munmap), once both were moved
  write DIR    a mapping of DIR/big.dat on its copy, then the file written

Prints one JSON line per epoch: the digest of what it read, the emulated
PFS's counters after it (--counts), and the mappings of dataset files as the
kernel shows them (the PFS file, or a node-local copy: any other path).
Between epochs the pages of its mappings
are paged out (MADV_PAGEOUT), as a dataset larger than memory would be, so
that every epoch reads from where its mappings are."""
import argparse
import ctypes
import hashlib
import json
import mmap
import os
import random
import time

libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                      ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.mprotect.argtypes = libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
PAGE = mmap.PAGESIZE
MADV_PAGEOUT = 21


ROOT = None  # the dataset directory, links resolved


def mappings(names):
    """The kernel's mappings of the files whose base names are in `names`,
    as (start, end, perms, on_copy): on_copy when the file is not the
    dataset's own (the kernel names the node-local copy)."""
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) < 6 or os.path.basename(parts[5].rstrip("\n")) not in names:
                continue
            start, end = (int(x, 16) for x in parts[0].split("-"))
            out.append((start, end, parts[1], not parts[5].startswith(ROOT + "/")))
    return out


def page_out(name):
    for start, end, _, _ in mappings(name):
        libc.madvise(start, end - start, MADV_PAGEOUT)


def counts(path):
    if not path:
        return None
    with open(path) as f:
        return json.load(f)


def wait_moved(names, seconds):
    """Until every mapping of `names` is on a copy, or `seconds`: each look is
    a call Monarch intercepts (a stat), as a training loop makes."""
    end = time.time() + seconds
    while time.time() < end and not all(m[3] for m in mappings(names)):
        os.stat("/")
        time.sleep(0.01)


def epochs(a, read_one, name, keys):
    rng = random.Random(a.seed)
    for epoch in range(a.epochs):
        h = hashlib.md5()
        for _ in range(a.reads):
            h.update(read_one(rng.choice(keys), rng))
        os.stat(a.dir)  # what a loop does between epochs (a checkpoint's, a log's)
        if a.wait_moved and epoch == 0:  # (the copies' own PFS reads are then over)
            wait_moved(name, 60)
        maps = mappings(name)
        print(json.dumps({"epoch": epoch + 1, "digest": h.hexdigest(), "pfs": counts(a.counts),
                          "on_copy": sum(m[3] for m in maps), "maps": len(maps)}), flush=True)
        page_out(name)


def run_memmap(a):
    import numpy as np
    names = sorted(n for n in os.listdir(a.dir) if n.endswith(".bin"))
    arrays = {n: np.memmap(os.path.join(a.dir, n), dtype=np.uint8, mode="r") for n in names}
    print(json.dumps({"made": len(mappings(names))}), flush=True)

    def read_one(n, rng):
        m = arrays[n]
        at = rng.randrange(len(m) - a.size)
        return bytes(m[at:at + a.size])
    epochs(a, read_one, set(names), names)


def run_lmdb(a):
    import lmdb
    env = lmdb.open(a.dir, readonly=True, lock=False)
    with env.begin() as txn:
        keys = [k for k, _ in txn.cursor()]
    print(json.dumps({"made": len(mappings({"data.mdb"}))}), flush=True)

    def read_one(k, rng):
        with env.begin(buffers=False) as txn:
            return txn.get(k)
    epochs(a, read_one, {"data.mdb"}, keys)


def run_mutate(a):
    path = os.path.join(a.dir, "big.dat")
    size = os.path.getsize(path)
    fd = os.open(path, os.O_RDONLY)
    private = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_PRIVATE, fd, 0)
    shared = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    os.close(fd)
    name = {"big.dat"}

    def where(addr, length):
        """on_copy of the mappings in [addr, addr+length), or None if none."""
        got = [m for m in mappings(name) if m[0] < addr + length and addr < m[1]]
        return [(m[0] - addr, m[1] - addr, m[2], m[3]) for m in got]
    if a.wait_moved:
        wait_moved(name, 60)
    moved = [m[3] for m in where(private, size) + where(shared, size)]
    # munmap of the middle of the shared one: head and tail stay, as they were.
    hole = 4 * PAGE
    libc.munmap(shared + hole, hole)
    head = ctypes.string_at(shared, hole)
    tail = ctypes.string_at(shared + 2 * hole, size - 2 * hole)
    # The private one made writable, written, read back.
    rc = libc.mprotect(private, size, mmap.PROT_READ | mmap.PROT_WRITE)
    ctypes.memset(private + 100, 0x41, 5000)
    after = ctypes.string_at(private, size)
    # And a page of it paged out, then read again: the PFS file's bytes, or
    # the program's own for the pages it wrote.
    libc.madvise(private + 8 * PAGE, PAGE, MADV_PAGEOUT)
    again = ctypes.string_at(private, size)
    print(json.dumps({
        "moved_before": moved,
        "head": hashlib.md5(head).hexdigest(), "tail": hashlib.md5(tail).hexdigest(),
        "shared_after_munmap": where(shared, size), "mprotect": rc,
        "written": hashlib.md5(after).hexdigest(), "again": hashlib.md5(again).hexdigest(),
        "private_after_mprotect": where(private, size)}), flush=True)


def run_write(a):
    """A shared mapping of DIR/big.dat on its copy, then the file written
    through another descriptor: the mapping shows the write, as the kernel's
    page cache does without Monarch."""
    path = os.path.join(a.dir, "big.dat")
    size = os.path.getsize(path)
    fd = os.open(path, os.O_RDONLY)
    shared = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    os.close(fd)
    name = {"big.dat"}
    if a.wait_moved:
        wait_moved(name, 60)
    before = [m[3] for m in mappings(name)]
    fd = os.open(path, os.O_WRONLY)
    os.pwrite(fd, b"B" * 5000, 8192)
    os.close(fd)
    print(json.dumps({"on_copy_before": before, "on_copy_after": [m[3] for m in mappings(name)],
                      "read": hashlib.md5(ctypes.string_at(shared, size)).hexdigest()}),
          flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["memmap", "lmdb", "mutate", "write"])
    ap.add_argument("dir")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--reads", type=int, default=2000)
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--counts")
    ap.add_argument("--wait-moved", action="store_true",
                    help="through Monarch: wait (60 s at most) for the mappings to be on copies")
    a = ap.parse_args()
    global ROOT
    ROOT = os.path.realpath(a.dir)
    {"memmap": run_memmap, "lmdb": run_lmdb, "mutate": run_mutate, "write": run_write}[a.mode](a)


if __name__ == "__main__":
    main()
