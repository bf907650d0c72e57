#!/usr/bin/python3
"""Formats whose default open is for reading and writing (issue 26): SQLite
(sqlite3.connect(path): O_RDWR|O_CREAT) and LMDB (lmdb.open(path): data.mdb
O_RDWR|O_CREAT) read a dataset they never write. Each program runs directly
and through monarch-run on its own copy of the same dataset; what it prints
must be equal, and epochs 2-3 must be served from the copies: the job's
reads that reached the PFS there at most 10% of the bytes it read, from the
job's own counters (the stats.json the stager rewrites every 5 s, read after
each epoch once it is newer than the epoch's end). A program that then
writes through its descriptor sees, and shows other processes, exactly what
the direct run does.

    test_formats_rdwr.py              the tests (label engine)
    test_formats_rdwr.py child ...    the programs they run (see child())
Standard library only, but for the formats' own modules (sqlite3, lmdb);
run with /usr/bin/python3 like the other engine tests."""
import hashlib
import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
import unittest

from harness import AFTER_INDEX, PY, Case, conf_file, run, tier

SELF = os.path.abspath(__file__)
EPOCHS = 3
QUERIES = 2000  # point queries (or gets) an epoch


# ---- the programs (run directly, and through monarch-run) ----

def stats_after(t_end):
    """The job's counters once the stager wrote them after t_end (None directly)."""
    job = os.environ.get("MONARCH_JOB_DIR")
    if not job:
        return None
    path = os.path.join(job, "stats.json")
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            if os.stat(path).st_mtime > t_end + 0.05:
                with open(path) as f:
                    return json.load(f)["totals"]
        except (OSError, ValueError):
            pass
        time.sleep(0.1)
    raise SystemExit(f"{path} not rewritten within 30 s of an epoch's end")


def epoch_line(epoch, digest):
    print(json.dumps({"epoch": epoch, "hash": digest.hexdigest(),
                      "stats": stats_after(time.time())}), flush=True)


def child_sqlite(path, how, seed):
    con = sqlite3.connect(path) if how == "once" else None
    rng = random.Random(seed)
    for epoch in range(EPOCHS):
        c = con or sqlite3.connect(path)
        h = hashlib.sha256()
        n = c.execute("select count(*) from t").fetchone()[0]
        for q in range(QUERIES):
            i = rng.randrange(n)
            if q % 2:
                row = c.execute("select k, v from t where id = ?", (i,)).fetchone()
            else:  # through the index
                row = c.execute("select id, v from t where k = ?", (f"key{i:08d}",)).fetchone()
            h.update(repr(row).encode())
        if c is not con:
            c.close()
        epoch_line(epoch + 1, h)


def child_lmdb(path, seed, how="defaults"):
    import lmdb
    rng = random.Random(seed)
    for epoch in range(EPOCHS):
        # The defaults: read-write, locked (data.mdb opened O_RDWR). Read-only:
        # data.mdb opened O_RDONLY, lock.mdb still read-write.
        env = lmdb.open(path) if how == "defaults" else lmdb.open(path, readonly=True)
        h = hashlib.sha256()
        with env.begin() as txn:
            n = env.stat()["entries"]
            for _ in range(QUERIES):
                v = txn.get(b"%08d" % rng.randrange(n))
                h.update(v if v is not None else b"-")
        env.close()
        epoch_line(epoch + 1, h)


def copy_exists(rel, present=True):
    """Waits (30 s at most) for the copy of `rel` to be published (`present`)
    or dropped (not `present`); whether it was (direct: True)."""
    job = os.environ.get("MONARCH_JOB_DIR")
    if not job:
        return True
    deadline = time.time() + 30
    while time.time() < deadline:
        if os.path.exists(os.path.join(job, "data", rel)) == present:
            return True
        time.sleep(0.02)
    return False


def child_rw(root, rel):
    """Opens `rel` for reading and writing, reads, writes, reads back; a
    second descriptor and a second process read it too. Prints what each
    call showed, normalized (the root is <R>)."""
    path = os.path.join(root, rel)
    out = []

    def show(what, value):
        out.append(f"{what}: {value}")

    def digest(b):
        return hashlib.sha256(b).hexdigest()[:16]

    # The copy first, so that the descriptor opened for reading and writing
    # is served from it (test_served checks that it is, and stays, there).
    with open(path, "rb") as f:
        show("read whole", digest(f.read()))
    show("copy published", copy_exists(rel))
    fd = os.open(path, os.O_RDWR)
    st = os.fstat(fd)
    show("fstat", (st.st_size, oct(st.st_mode), st.st_nlink))
    fl = __import__("fcntl").fcntl(fd, __import__("fcntl").F_GETFL)
    show("getfl", oct(fl & ~0o100000))  # O_LARGEFILE: the direct run may show it or not
    show("fdlink", os.readlink(f"/proc/self/fd/{fd}").replace(root, "<R>"))
    show("pread 0", digest(os.pread(fd, 4096, 0)))
    show("pread mid", digest(os.pread(fd, 10000, st.st_size // 2)))
    show("read", digest(os.read(fd, 5000)))
    show("lseek", os.lseek(fd, 0, os.SEEK_CUR))
    time.sleep(0.3)  # the stager would have dropped a copy marked stale by now
    show("copy kept while only read", copy_exists(rel))
    show("pwrite", os.pwrite(fd, b"W" * 3000, 1000))
    show("pread back", digest(os.pread(fd, 8000, 0)))
    show("write", os.write(fd, b"Z" * 100))
    show("lseek after write", os.lseek(fd, 0, os.SEEK_CUR))
    with open(path, "rb") as f:  # another descriptor, opened after the writes
        show("other descriptor", digest(f.read()))
    p = subprocess.run([PY, "-c", "import sys,hashlib;"
                        "print(hashlib.sha256(open(sys.argv[1],'rb').read()).hexdigest()[:16])",
                        path], capture_output=True, text=True, check=True)
    show("second process", p.stdout.strip())
    os.ftruncate(fd, st.st_size - 10)
    show("size after ftruncate", os.fstat(fd).st_size)
    with open(path, "rb") as f:
        show("after ftruncate", digest(f.read()))
    os.close(fd)
    # O_RDWR|O_CREAT of an existing file that is never written: served, kept.
    fd = os.open(os.path.join(root, "other.bin"), os.O_RDWR | os.O_CREAT, 0o644)
    show("creat pread", digest(os.pread(fd, 1 << 20, 12345)))
    os.close(fd)
    print("\n".join(out), flush=True)


def child_append(root, rel):
    """Appends to a dataset file the way shell scripts do (bash's builtin
    echo writes through stdio, glibc's own calls), then reads it again."""
    path = os.path.join(root, rel)
    with open(path, "rb") as f:
        f.read()
    print("copy made:", copy_exists(rel))
    cmd = f'echo appended >> "{path}"; exec 3<>"{path}"; echo rw >&3; exec 3>&-; wc -c < "{path}"'
    print(subprocess.run(["bash", "-c", cmd], capture_output=True, text=True).stdout.strip())
    # The shell ran under Monarch too (a program the job starts inherits the
    # library): its opens marked the file changed, and the stager drops the copy.
    print("copy dropped:", copy_exists(rel, present=False))
    with open(path, "rb") as f:
        data = f.read()
    print(len(data), hashlib.sha256(data).hexdigest(), data[:8])


def child():
    kind = sys.argv[2]
    if kind == "append":
        child_append(sys.argv[3], sys.argv[4])
    if kind == "sqlite":
        child_sqlite(sys.argv[3], sys.argv[4], int(sys.argv[5]))
    elif kind == "lmdb":
        child_lmdb(sys.argv[3], int(sys.argv[4]), *sys.argv[5:])
    elif kind == "rw":
        child_rw(sys.argv[3], sys.argv[4])


# ---- the datasets ----

def make_sqlite(path, rows=20000, seed=7):
    """A few MB: rows of ~200 bytes with an index on k."""
    rng = random.Random(seed)
    con = sqlite3.connect(path)
    con.execute("create table t (id integer primary key, k text, v blob)")
    con.executemany("insert into t values (?, ?, ?)",
                    ((i, f"key{i:08d}", rng.randbytes(150 + rng.randrange(100)))
                     for i in range(rows)))
    con.execute("create index t_k on t (k)")
    con.commit()
    con.close()


def make_lmdb(path, n=6000, seed=8):
    import lmdb
    rng = random.Random(seed)
    env = lmdb.open(path, map_size=256 << 20)
    with env.begin(write=True) as txn:
        for i in range(n):
            txn.put(b"%08d" % i, rng.randbytes(500 + rng.randrange(1000)))
    env.close()


class RdwrFormats(Case):
    @classmethod
    def setUpClass(cls):
        cls.work = tempfile.mkdtemp(prefix="monarch-rdwr-")
        os.chmod(cls.work, 0o755)
        cls.master = os.path.join(cls.work, "master")
        os.makedirs(cls.master)
        make_sqlite(os.path.join(cls.master, "db.sqlite"))
        make_lmdb(os.path.join(cls.master, "env"))
        with open(os.path.join(cls.master, "rw.bin"), "wb") as f:
            f.write(random.Random(9).randbytes(300_000))
        with open(os.path.join(cls.master, "other.bin"), "wb") as f:
            f.write(random.Random(10).randbytes(2_000_000))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.work, ignore_errors=True)

    def fresh(self):
        """A copy of the dataset of its own for one run (runs write to it)."""
        d = tempfile.mkdtemp(prefix="ds-", dir=self.work)
        os.chmod(d, 0o755)
        ds = os.path.join(d, "ds")
        shutil.copytree(self.master, ds)
        return ds

    def both(self, args):
        """(direct stdout, Monarch stdout, Monarch stderr) of the child `args`,
        where "{ds}" stands for the run's own dataset."""
        ds = self.fresh()
        direct = run([PY, SELF, "child"] + [a.format(ds=ds) for a in args]).stdout
        ds = self.fresh()
        t = tier(self)
        conf = conf_file(self, t, copy_fast_dataset="yes")
        p = run(AFTER_INDEX + [PY, SELF, "child"] + [a.format(ds=ds) for a in args],
                monarch=["--dataset", ds, "--config", conf])
        return direct, p.stdout, p.stderr[-3000:]

    def epochs(self, args, unchanged=True):
        """`unchanged`: no file may be marked changed (LMDB writes its lock.mdb)."""
        direct, monarch, summary = self.both(args)
        a = [json.loads(line) for line in direct.splitlines()]
        b = [json.loads(line) for line in monarch.splitlines()]
        self.assertEqual([e["hash"] for e in a], [e["hash"] for e in b], "results differ")
        self.assertEqual(len(b), EPOCHS)
        # Epochs 2-3: what the job read, and what of it reached the PFS.
        first, last = b[0]["stats"], b[-1]["stats"]
        read = sum(last[k] - first[k] for k in ("mem_bytes", "peer_served_bytes",
                                                "pfs_served_bytes"))
        read += sum(last["tier_bytes"]) - sum(first["tier_bytes"])
        pfs = last["pfs_bytes"] - first["pfs_bytes"]
        stale = last["fb_stale"]
        print(f"{args[0]} {args[2:]}: epochs 2-3 read {read} B, {pfs} B of it from the PFS "
              f"({100 * pfs / max(read, 1):.1f}%); files found changed: {stale}", flush=True)
        self.assertGreater(read, 0, "epochs 2-3 read nothing through Monarch\n" + summary)
        self.assertLessEqual(pfs, 0.10 * read, summary)
        if unchanged:
            self.assertEqual(stale, 0, "a file that was only read was marked changed\n" + summary)

    def test_sqlite_connection_per_epoch(self):
        self.epochs(["sqlite", "{ds}/db.sqlite", "per-epoch", "1"])

    def test_sqlite_connection_kept(self):
        # Opened before its copy existed: the descriptor moves to the copy once.
        self.epochs(["sqlite", "{ds}/db.sqlite", "once", "2"])

    def test_lmdb_env_per_epoch_readonly(self):
        # LMDB reads through its mapping of data.mdb: served when the file is
        # opened for reading only (readonly=True, the usual way to open a
        # dataset); epochs 2-3 map the copy.
        first, last = self.lmdb_mappings("readonly")
        mapped = last["mmap_bytes"] - first["mmap_bytes"]
        local = last["mmap_local_bytes"] - first["mmap_local_bytes"]
        self.assertGreater(mapped, 0)
        self.assertGreaterEqual(local, 0.9 * mapped)

    def test_lmdb_env_per_epoch_defaults_maps_the_pfs_file(self):
        # lmdb.open(path): data.mdb opened for reading and writing. Its
        # mapping is the PFS file's (mappings.cpp, on_mmap: a write by
        # another process would reach a mapping of the copy too late), and
        # the values are the direct run's.
        first, last = self.lmdb_mappings("defaults")
        self.assertGreater(last["mmap_bytes"] - first["mmap_bytes"], 0)
        self.assertEqual(last["mmap_local_bytes"] - first["mmap_local_bytes"], 0)

    def lmdb_mappings(self, how):
        direct, monarch, summary = self.both(["lmdb", "{ds}/env", "3", how])
        a = [json.loads(line) for line in direct.splitlines()]
        b = [json.loads(line) for line in monarch.splitlines()]
        self.assertEqual([e["hash"] for e in a], [e["hash"] for e in b], "results differ")
        self.assertEqual(len(b), EPOCHS)
        print(f"lmdb {how}: epochs 2-3 mapped {b[-1]['stats']['mmap_bytes'] - b[0]['stats']['mmap_bytes']} B, "
              f"{b[-1]['stats']['mmap_local_bytes'] - b[0]['stats']['mmap_local_bytes']} B of copies",
              flush=True)
        return b[0]["stats"], b[-1]["stats"]

    def test_shell_appends(self):
        # `>>` opens O_WRONLY|O_APPEND and `<>` O_RDWR; bash's echo writes
        # through stdio, which Monarch never sees: the opens and the duplicate
        # onto descriptor 1 are the changes.
        direct, monarch, summary = self.both(["append", "{ds}", "rw.bin"])
        self.assertEqual(direct.splitlines(), monarch.splitlines(), summary)
        self.assertIn("copy made: True", monarch)

    def test_read_then_write(self):
        direct, monarch, summary = self.both(["rw", "{ds}", "rw.bin"])
        self.assertEqual(direct.splitlines(), monarch.splitlines(), summary)
        self.assertIn("copy kept while only read: True", monarch)


if __name__ == "__main__":
    if sys.argv[1:2] == ["child"]:
        child()
    else:
        unittest.main()
