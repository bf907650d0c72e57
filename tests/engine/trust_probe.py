#!/usr/bin/python3
"""One case of issue 13 ("Trust"), run by test_trust.py once directly and once
through Monarch on two identical trees; prints what the program observed, one
JSON value per line, normalized so that the two trees compare equal (the tree's
path becomes <T>, inode numbers become the tree-relative name of that inode,
found with raw system calls Monarch never sees).

  trust_probe.py CASE TREE

TREE holds ds/ (the dataset), out/ (look-alikes: same names and sizes, other
bytes) and work/ (a working directory with its own look-alike a.bin)."""
import ctypes
import errno
import hashlib
import json
import os
import resource
import struct
import subprocess
import sys
import threading

CASE, TREE = sys.argv[1], os.path.realpath(sys.argv[2])
DS = os.path.join(TREE, "ds")
libc = ctypes.CDLL(None, use_errno=True)  # the process's symbols: Monarch's wrappers first
libc.syscall.restype = ctypes.c_long
SYS_close_range, SYS_newfstatat, SYS_statx = 436, 262, 332

out = []


def say(*v):
    out.append(json.dumps(v, default=str).replace(TREE, "<T>"))


def raw_stat(path, fd=-100, flags=0):
    """(dev, ino, size, mtime_ns) by the raw system call, or None."""
    buf = ctypes.create_string_buffer(144)
    if libc.syscall(SYS_newfstatat, fd, path.encode(), buf, flags) != 0:
        return None
    dev, ino = struct.unpack_from("<QQ", buf, 0)
    size, = struct.unpack_from("<q", buf, 48)
    sec, nsec = struct.unpack_from("<qq", buf, 88)
    return dev, ino, size, sec * 10**9 + nsec


INODES, MTIMES = {}, {}
for d, dirs, files in os.walk(TREE):
    for n in dirs + files:
        p = os.path.join(d, n)
        s = raw_stat(p, flags=0x100)
        if s:
            INODES[s[1]] = os.path.relpath(p, TREE)
            MTIMES[s[1]] = s[3]


def name_of(ino):
    return INODES.get(ino, "?")


def attempt(f, *a):
    try:
        return f(*a)
    except OSError as e:
        return "E" + errno.errorcode.get(e.errno, str(e.errno))


def md5(b):
    return hashlib.md5(b).hexdigest()[:12]


def read_path(p):
    return attempt(lambda: md5(open(p, "rb").read()))


def stat_view(s):
    mtime = "=" if MTIMES.get(s.st_ino) == s.st_mtime_ns else "changed"
    return [name_of(s.st_ino), s.st_size, oct(s.st_mode), s.st_nlink, mtime, s.st_blocks]


def fd_view(fd):
    """What a program can see of a descriptor without reading it."""
    st = attempt(os.fstat, fd)
    return [stat_view(st) if not isinstance(st, str) else st,
            attempt(os.readlink, f"/proc/self/fd/{fd}"),
            attempt(lambda: oct(__import__("fcntl").fcntl(fd, 3)))]  # F_GETFL


def statx_btime(fd):
    buf = ctypes.create_string_buffer(256)
    r = libc.statx(fd, b"", 0x1000, 0x7ff | 0x800, buf)  # AT_EMPTY_PATH, basic stats + BTIME
    if r != 0:
        return "E" + errno.errorcode[ctypes.get_errno()]
    mask, = struct.unpack_from("<I", buf, 0)
    ino, size = struct.unpack_from("<QQ", buf, 32)
    return [mask & 0xfff, name_of(ino), size]


def warm(*names):
    """Reads files once and gives Monarch time to copy them: later opens find
    them cached. (Without Monarch this only reads them.)"""
    for n in names:
        read_path(os.path.join(DS, n))
    import time
    time.sleep(1.0)


def case_vfork_cwd():
    os.chdir(os.path.join(TREE, "work"))
    keep = os.open(os.path.join(DS, "a.bin"), os.O_RDONLY)
    big = os.open(os.path.join(DS, "big.bin"), os.O_RDONLY)
    os.read(big, 1000)
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        subprocess.run(["true"], cwd=DS)  # vfork + chdir + close_range in the child
    say("fds", len(os.listdir("/proc/self/fd")) - before)
    say("own a.bin", read_path("a.bin"))
    say("stat sub/c.bin", attempt(lambda: stat_view(os.stat("sub/c.bin"))))
    say("kept", fd_view(keep), md5(os.pread(keep, 1 << 20, 0)))
    say("big", fd_view(big), md5(os.read(big, 5000)))
    warm("a.bin")
    say("dataset a.bin", read_path(os.path.join(DS, "a.bin")))
    subprocess.run(["true"], cwd=DS, close_fds=False)
    say("own a.bin again", read_path("a.bin"))


def case_dotdot():
    names = ["a.bin/.", "a.bin/", "nonexist/../a.bin", "a.bin/../b.bin", "linkdir/../a.bin",
             "sub/../a.bin", "./a.bin", "sub//c.bin", "sub/./c.bin", "sub/c.bin/..",
             "linkdir/a.bin", "sublink/c.bin", "sublink/../a.bin", "../ds/a.bin",
             "../out/a.bin", "sub/deeper/../../b.bin"]
    for rnd in ("first", "cached"):
        os.chdir(DS)
        for n in names:
            say(rnd, n, read_path(n), attempt(lambda: stat_view(os.stat(n))),
                attempt(lambda: stat_view(os.lstat(n))), read_path(os.path.join(DS, n)))
        os.chdir(os.path.join(TREE, "work"))
        for n in ["../ds/a.bin", "../ds/sub/../a.bin", "../ds/linkdir/../a.bin", "a.bin"]:
            say(rnd, "work", n, read_path(n), attempt(lambda: stat_view(os.stat(n))))
        warm("a.bin", "b.bin", "sub/c.bin")


def case_recycled():
    for rnd in ("first", "cached"):
        a = os.open(os.path.join(DS, "a.bin"), os.O_RDONLY)
        big = os.open(os.path.join(DS, "big.bin"), os.O_RDONLY)
        os.read(big, 10)
        libc.syscall(SYS_close_range, a, big, 0)  # closed behind Monarch's back
        x = os.open(os.path.join(TREE, "out", "other.bin"), os.O_RDONLY)
        y = os.open(os.path.join(TREE, "out", "a.bin"), os.O_RDONLY)
        say(rnd, "raw close_range", x == a, y == big, fd_view(x), md5(os.read(x, 1 << 20)),
            fd_view(y), md5(os.read(y, 1 << 20)), md5(os.pread(y, 100, 0)))
        os.close(x)
        os.close(y)
        a = os.open(os.path.join(DS, "a.bin"), os.O_RDONLY)
        libc.closefrom(a)
        x = os.open(os.path.join(TREE, "out", "other.bin"), os.O_RDONLY)
        say(rnd, "closefrom", x == a, fd_view(x), md5(os.read(x, 1 << 20)))
        os.close(x)
        libc.fopen.restype = ctypes.c_void_p
        libc.freopen.restype = ctypes.c_void_p
        f = libc.fopen(os.path.join(DS, "a.bin").encode(), b"r")
        fd = libc.fileno(ctypes.c_void_p(f))
        f = libc.freopen(os.path.join(TREE, "out", "other.bin").encode(), b"r", ctypes.c_void_p(f))
        fd2 = libc.fileno(ctypes.c_void_p(f))
        say(rnd, "freopen", fd == fd2, fd_view(fd2), md5(os.pread(fd2, 1 << 20, 0)))
        libc.fclose(ctypes.c_void_p(f))
        warm("a.bin", "big.bin")


def case_dup_offsets():
    for rnd in ("first", "cached"):
        for name in ("big.bin", "a.bin"):
            fd = os.open(os.path.join(DS, name), os.O_RDONLY)
            d = os.dup(fd)
            parts = []
            for i in range(6):
                parts.append(md5(os.read(fd if i % 2 else d, 777)))
            parts.append(os.lseek(fd, 0, os.SEEK_CUR))
            d2 = os.dup2(fd, 50, inheritable=False)  # dup3
            parts.append(md5(os.read(d2, 333)))
            pid = os.fork()
            if pid == 0:
                os.read(fd, 1000)
                os._exit(0)
            os.waitpid(pid, 0)
            parts.append(os.lseek(d, 0, os.SEEK_CUR))
            parts.append(md5(os.read(fd, 4096)))
            parts.append([fd_view(x) for x in (fd, d, d2)])
            say(rnd, name, parts)
            for x in (fd, d, d2):
                os.close(x)
        warm("a.bin", "big.bin")


def case_identity():
    import fcntl
    for rnd in ("first", "cached"):
        fd = os.open(os.path.join(DS, "a.bin"), os.O_RDONLY | os.O_NONBLOCK)
        d = os.dup(fd)
        d2 = fcntl.fcntl(fd, fcntl.F_DUPFD, 30)
        os.dup2(fd, fd)
        try:
            os.dup2(fd, -5)
        except (OSError, ValueError):
            pass
        say(rnd, [fd_view(x) for x in (fd, d, d2)], statx_btime(fd), statx_btime(d))
        fd1 = os.open(os.path.join(DS, "a.bin"), os.O_RDONLY)
        fd2 = os.open(os.path.join(DS, "a.bin"), os.O_RDONLY)
        fcntl.flock(fd1, fcntl.LOCK_EX | fcntl.LOCK_NB)
        say(rnd, "flock", attempt(fcntl.flock, fd2, fcntl.LOCK_EX | fcntl.LOCK_NB))
        dst = os.open(os.path.join(TREE, "out", "copy.bin"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        say(rnd, "copy_file_range", attempt(os.copy_file_range, fd, dst, 1 << 20),
            attempt(os.sendfile, dst, fd1, 0, 1000), os.lseek(fd, 0, os.SEEK_CUR),
            os.lseek(fd1, 0, os.SEEK_CUR))
        for x in (fd, d, d2, fd1, fd2, dst):
            os.close(x)
        say(rnd, "copied", read_path(os.path.join(TREE, "out", "copy.bin")))
        warm("a.bin")


def case_limits():
    # RLIMIT_FSIZE below the file's size: reading is not writing.
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1000, hard))
    say("fsize", read_path(os.path.join(DS, "a.bin")), read_path(os.path.join(DS, "b.bin")))
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    # RLIMIT_NOFILE: exactly as many descriptors as without Monarch.
    fds = []
    highest = max(int(x) for x in os.listdir("/proc/self/fd"))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (highest + 20, hard))
    names = ["a.bin", "b.bin", "big.bin", "sub/c.bin"]
    err = None
    while err is None and len(fds) < 1000:
        try:
            fd = os.open(os.path.join(DS, names[len(fds) % 4]), os.O_RDONLY)
            os.read(fd, 100)
            fds.append(fd)
        except OSError as e:
            err = errno.errorcode[e.errno]
    say("nofile", len(fds), err)
    for fd in fds:
        os.close(fd)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def case_pread_negative():
    for name in ("big.bin", "a.bin"):  # a copy under way, and bytes read whole at open
        fd = os.open(os.path.join(DS, name), os.O_RDONLY)
        say(name, md5(os.read(fd, 100)), attempt(lambda: os.pread(fd, 10, -1)),
            attempt(lambda: os.preadv(fd, [bytearray(10)], -1)),
            attempt(lambda: os.pread(fd, 10, 2**63 - 5)),  # past what an offset can hold
            attempt(lambda: os.preadv(fd, [bytearray(1)] * 1100, 0)),  # more than IOV_MAX
            os.lseek(fd, 0, os.SEEK_CUR))


def case_magic_names():
    # A descriptor's magic names (/proc/self/fd/N, /dev/fd/N) reach the file
    # itself: reopened for writing, the write is the file's, not a copy's.
    warm("a.bin", "b.bin")
    fd = os.open(os.path.join(DS, "a.bin"), os.O_RDONLY)
    say("stat", stat_view(os.stat(f"/proc/self/fd/{fd}")), stat_view(os.stat(f"/dev/fd/{fd}")))
    r = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY)
    say("reopened", fd_view(r), md5(os.read(r, 1 << 20)))
    w = os.open(f"/dev/fd/{fd}", os.O_WRONLY)
    os.write(w, b"written through a magic name")
    os.close(w)
    say("after", read_path(os.path.join(DS, "a.bin")), md5(os.pread(fd, 1 << 20, 0)),
        os.stat(os.path.join(DS, "a.bin")).st_size)


def case_hard_links():
    # Two names of one file in the dataset: a write through one is seen through both.
    warm("h1.bin", "h2.bin")
    with open(os.path.join(DS, "h1.bin"), "r+b") as f:
        f.write(b"changed through h1")
    say(read_path(os.path.join(DS, "h2.bin")), stat_view(os.stat(os.path.join(DS, "h2.bin"))))


def case_moved_root():
    # The directory above the dataset renamed, and another dataset put in its place.
    warm("a.bin", "sub/c.bin")
    os.chdir("/")
    os.rename(TREE, TREE + ".old")
    os.makedirs(os.path.join(DS, "sub"))
    with open(os.path.join(DS, "a.bin"), "wb") as f:
        f.write(b"another dataset now")
    say(read_path(os.path.join(DS, "a.bin")), read_path(os.path.join(DS, "sub", "c.bin")),
        attempt(lambda: stat_view(os.stat(os.path.join(DS, "b.bin")))))
    os.rename(TREE + ".old", TREE + ".gone")  # (the test removes TREE and TREE.gone)


def case_missing():
    # An indexed file removed behind Monarch's back (a raw system call, like
    # another client of the PFS would), and paths that never existed.
    libc.syscall(87, os.path.join(DS, "u.bin").encode())  # SYS_unlink
    for n in ("u.bin", "missing.bin", "sub/missing", "a.bin/x", "a.bin/", "", "sub/../missing"):
        p = os.path.join(DS, n) if n else ""
        say(n, attempt(lambda: stat_view(os.stat(p))), read_path(p))


def case_writes():
    w = os.path.join(DS, "w.bin")
    say("before", read_path(w), stat_view(os.stat(w)))
    warm("w.bin")
    reader = os.open(w, os.O_RDONLY)  # opened before the writes: sees them, as the kernel shows
    with open(w, "ab") as f:
        f.write(b"appended" * 100)
    say("append", read_path(w), os.stat(w).st_size, md5(os.pread(reader, 1 << 20, 0)))
    libc.fopen.restype = ctypes.c_void_p
    f = libc.fopen(w.encode(), b"a")
    libc.fwrite(b"more", 1, 4, ctypes.c_void_p(f))
    libc.fclose(ctypes.c_void_p(f))
    say("fopen a", read_path(w), os.stat(w).st_size, os.fstat(reader).st_size)
    os.truncate(w, 5000)
    say("truncate", read_path(w), os.stat(w).st_size, os.lseek(reader, 0, os.SEEK_END))
    v = os.path.join(DS, "v.bin")
    warm("v.bin")
    alias = os.path.join(TREE, "work", "alias.bin")
    # Another name of the same file, made behind Monarch's back (a raw system
    # call): a write through it changes v.bin all the same.
    libc.syscall(86, v.encode(), alias.encode())  # SYS_link
    say("link", os.stat(os.path.join(DS, "b.bin")).st_nlink)
    with open(alias, "r+b") as f:
        f.write(b"changed through another name")
    say("alias write", read_path(v), os.stat(v).st_size)
    os.chmod(v, 0o600)
    say("chmod", oct(os.stat(v).st_mode))
    u = os.path.join(DS, "u.bin")
    os.rename(u, u + ".moved")
    say("renamed", attempt(lambda: stat_view(os.stat(u))), read_path(u),
        read_path(u + ".moved"))
    os.unlink(os.path.join(DS, "sub", "c.bin"))
    say("unlinked", attempt(os.stat, os.path.join(DS, "sub", "c.bin")))
    os.rename(os.path.join(DS, "sub"), os.path.join(DS, "sub2"))
    say("dir renamed", read_path(os.path.join(DS, "sub", "deeper", "d.bin")),
        read_path(os.path.join(DS, "sub2", "deeper", "d.bin")))


def case_fork_during_stat():
    import signal
    import time
    os.chdir(DS)
    stop = False

    def spin():
        while not stop:
            try:
                os.stat("sub/c.bin")
                os.chdir(".")
            except OSError:
                pass

    threads = [threading.Thread(target=spin) for _ in range(4)]
    for t in threads:
        t.start()
    ok = 0
    for _ in range(500):
        pid = os.fork()
        if pid == 0:
            os.stat("sub/c.bin")
            os._exit(0)
        end = time.time() + 5
        while True:  # a child that hangs is killed and counted as such
            done, st = os.waitpid(pid, os.WNOHANG)
            if done or time.time() > end:
                break
            time.sleep(0.001)
        if not done:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        ok += done != 0 and st == 0
    stop = True
    for t in threads:
        t.join()
    say("children done", ok)


globals()["case_" + CASE]()
print("\n".join(out))
