#!/usr/bin/python3
"""The fault soak of issue 12 (contrib/fault-soak): jobs of 16 reader processes
run one after another through monarch-run over an emulated PFS, for MINUTES,
while faults are injected at random: the stager killed (-9), stopped and
continued, the tier's file system filled and emptied from outside, PFS files
replaced by identical copies (a new inode, as another client's rewrite),
malformed datagrams with descriptors. Every file every reader reads is checked
against its reference checksum. Prints the totals: files read, wrong bytes,
failed readers, hangs (a job past its time limit), faults injected, and the
stager's descriptors and memory over each job (first and last sample).

  fault_soak.py [--minutes M] [--seed S]     (run as root: tmpfs, /proc)"""
import argparse
import array
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from harness import (MONARCH_RUN, PY, SMALL, Pfs, dataset, reference,  # noqa: E402
                     stager_pids)

READER = os.path.join(HERE, "fault_reader.py")
JOB_LIMIT_S = 600


def proc_sample(pid):
    """(descriptors, resident KiB) of a process, or None."""
    try:
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        with open(f"/proc/{pid}/status") as f:
            rss = next(int(l.split()[1]) for l in f if l.startswith("VmRSS:"))
        return fds, rss
    except (OSError, StopIteration):
        return None


class Injector(threading.Thread):
    """Injects random faults into one job until stopped; samples its stager."""

    def __init__(self, rnd, tier_dir, conf, source, counts):
        super().__init__(daemon=True)
        self.rnd, self.tier, self.conf, self.source, self.counts = rnd, tier_dir, conf, source, counts
        self.stop = threading.Event()
        self.samples = []

    def stager(self):
        pids = stager_pids(self.conf)  # the stager's command line names the configuration
        return pids[0] if pids else None

    def fault(self):
        kind = self.rnd.choice(["kill", "stop", "fill", "replace", "datagrams", "replace"])
        pid = self.stager()
        if kind == "kill" and pid and self.rnd.random() < 0.3:
            os.kill(pid, signal.SIGKILL)
        elif kind == "stop" and pid:
            os.kill(pid, signal.SIGSTOP)
            self.stop.wait(self.rnd.uniform(0.2, 3))
            os.kill(pid, signal.SIGCONT)
        elif kind == "fill":
            filler = os.path.join(self.tier, "filler")
            subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=1M"],
                           stderr=subprocess.DEVNULL)
            self.stop.wait(self.rnd.uniform(0.5, 3))
            os.unlink(filler)
        elif kind == "replace":  # same bytes, new inode: the version changes, not the content
            names = [os.path.join(d, n) for d, _, ns in os.walk(self.source) for n in ns]
            for p in self.rnd.sample(names, 5):
                tmp = p + ".soak"
                shutil.copy2(p, tmp)
                os.rename(tmp, p)
        elif kind == "datagrams" and pid:
            jobs = [d for d in os.listdir(self.tier) if d.startswith("monarch-")]
            sock = os.path.join(self.tier, jobs[0], "ctl.sock") if jobs else ""
            s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            null = os.open("/dev/null", os.O_RDONLY)
            for _ in range(500):
                fds = array.array("i", [null] * self.rnd.randint(0, 4))
                try:
                    s.sendmsg([self.rnd.randbytes(self.rnd.choice([4, 28, 32, 64]))],
                               [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)] if fds else [],
                               0, sock)
                except OSError:
                    pass
            os.close(null)
            s.close()
        else:
            return
        self.counts[kind] = self.counts.get(kind, 0) + 1

    def run(self):
        while not self.stop.wait(self.rnd.uniform(0.1, 1.0)):
            pid = self.stager()
            if pid:
                s = proc_sample(pid)
                if s:
                    self.samples.append(s)
            self.fault()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=60)
    ap.add_argument("--seed", type=int, default=int(time.time()))
    a = ap.parse_args()
    rnd = random.Random(a.seed)
    root = dataset("small", **SMALL)
    ref = reference(root)
    # The PFS serves a private copy of the dataset: replacements change it.
    work = tempfile.mkdtemp(prefix="monarch-soak-")
    src = os.path.join(work, "src")
    shutil.copytree(root, src)
    os.chmod(work, 0o755)
    tmpfs = os.path.join(work, "tier")
    os.mkdir(tmpfs)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=400m,mode=1777", "tmpfs", tmpfs],
                   check=True)
    conf = os.path.join(work, "monarch.conf")  # its own: not whatever is installed
    with open(conf, "w") as f:
        f.write(f"[tier.a]\npath = {tmpfs}\nquota = 300M\n")
    totals = dict(jobs=0, files=0, wrong=0, failed=0, hangs=0)
    faults, fd_growth, rss_max = {}, [], 0
    end = time.time() + a.minutes * 60
    print(f"fault-soak: {a.minutes} minutes, seed {a.seed}, 16 readers a job", flush=True)
    try:
        with Pfs(src, latency_us=500) as pfs:
            while time.time() < end:
                inj = Injector(rnd, tmpfs, conf, src, faults)
                cmd = [MONARCH_RUN, "--dataset", pfs.dataset, "--config", conf, "-q",
                       "--", PY, READER, pfs.dataset, "--workers", "16", "--epochs", "6"]
                p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
                inj.start()
                try:
                    out, err = p.communicate(timeout=JOB_LIMIT_S)
                except subprocess.TimeoutExpired:
                    p.kill()
                    out, err = p.communicate()
                    totals["hangs"] += 1
                inj.stop.set()
                inj.join()
                totals["jobs"] += 1
                if p.returncode != 0:
                    totals["failed"] += 1
                    print(f"job {totals['jobs']}: exit {p.returncode}: {err[-500:]}", flush=True)
                for line in out.splitlines():
                    if not line.startswith("{"):
                        continue
                    e = json.loads(line)
                    totals["failed"] += e["failed"]
                    totals["files"] += len(e["files"])
                    totals["wrong"] += sum(1 for k, v in e["files"].items() if ref.get(k) != v)
                if inj.samples:
                    fd_growth.append(inj.samples[-1][0] - inj.samples[0][0])
                    rss_max = max(rss_max, max(s[1] for s in inj.samples))
                print(f"job {totals['jobs']}: {json.dumps(totals)} faults {json.dumps(faults)}",
                      flush=True)
    finally:
        subprocess.run(["umount", "-l", tmpfs])
        shutil.rmtree(work, ignore_errors=True)
    print(f"fault-soak totals: {totals['jobs']} jobs, {totals['files']} files read by 16-process "
          f"jobs, {totals['wrong']} wrong bytes, {totals['failed']} failed readers or jobs, "
          f"{totals['hangs']} hangs; faults {json.dumps(faults)}; stager descriptors grew at "
          f"most {max(fd_growth, default=0)} within a job, stager memory at most "
          f"{rss_max / 1024:.0f} MiB")
    return 0 if totals["wrong"] == totals["failed"] == totals["hangs"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
