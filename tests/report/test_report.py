#!/usr/bin/python3
"""monarch-report on real jobs: its counts agree with independent counts (the
PFS's own, a counting FUSE mount; the readers' system calls, strace), its
picture renders in headless Chromium, a killed stager still gives a report,
and bad input gets one clear line."""
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import unittest
import zlib

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "engine"))
from harness import (BUILD, PY, READER, SMALL, STAGER, Case, Pfs, dataset, read_dataset,  # noqa
                     run, stager_pids, tier)

REPORT = os.path.join(BUILD, "stager", "monarch-report")
CHROMIUM = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
            "--no-first-run", "--disable-background-networking", "--disable-component-update",
            "--disable-sync"]


def report(*args, check=True):
    p = subprocess.run([REPORT, *args], capture_output=True, text=True)
    if check and p.returncode != 0:
        raise AssertionError(f"monarch-report {args} exited {p.returncode}: {p.stderr}")
    return p


def png_pixels(path):
    """(width, height, rows of RGB tuples) of an 8-bit RGB/RGBA PNG."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and color in (2, 6), f"PNG depth {depth} color {color}"
            bpp = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw, rows, prev = zlib.decompress(idat), [], bytearray(width * bpp)
    stride = width * bpp
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + a) & 255
            elif kind == 2:
                line[i] = (line[i] + b) & 255
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append([tuple(line[i:i + 3]) for i in range(0, stride, bpp)])
        prev = line
    return width, height, rows


def strace_counts(trace, root):
    """Opens of files (not directories), read calls and bytes under `root`,
    from `strace -f -y`."""
    opens = reads = nbytes = 0
    with open(trace) as f:
        lines = f.read().splitlines()
    for line in lines:
        m = re.search(r"openat\(AT_FDCWD<[^>]*>, \"([^\"]+)\".*= (\d+)<", line)
        if m and m.group(1).startswith(root + "/") and "O_DIRECTORY" not in line:
            opens += 1
            continue
        m = re.search(r"\b(read|pread64)\(\d+<([^>]+)>, .* = (\d+)$", line)
        if m and m.group(2).startswith(root + "/"):
            reads += 1
            nbytes += int(m.group(3))
    return opens, reads, nbytes


class Report(Case):
    @classmethod
    def setUpClass(cls):
        cls.root = dataset("small", **SMALL)

    def test_counts_agree_with_the_pfs_and_with_strace(self):
        t = tier(self)
        conf = os.path.join(t, "monarch.conf")
        with open(conf, "w") as f:  # 128 KiB blocks: one FUSE request per read, as counted
            f.write(f"[tier.ssd]\npath = {t}\nquota = 100%\nblock_size = 128K\n")
        out = os.path.join(t, "stats.json")
        with Pfs(self.root) as pfs:
            # What the readers ask for: the same reader, without Monarch, under strace.
            trace = os.path.join(t, "trace")
            args = [PY, READER, pfs.dataset, "--mode", "read", "--epochs", "3"]
            run(["strace", "-f", "-qq", "-y", "-e", "trace=openat,read,pread64", "-e",
                 "signal=none", "-o", trace] + args)
            want_opens, want_reads, want_bytes = strace_counts(trace, pfs.dataset)
            before = pfs.counts()
            run(args, monarch=["--dataset", pfs.dataset, "--config", conf, "--report", out])
            after = pfs.counts()
        with open(out) as f:
            r = json.loads(report("--json", out).stdout)
        total = r["total"]
        self.assertGreater(total["local_bytes"], 0)

        def close(got, want, what):
            self.assertGreater(want, 0, what)
            self.assertLessEqual(abs(got - want), 0.01 * want, f"{what}: report {got}, independent {want}")

        close(total["opens"], want_opens, "opens asked by the job (strace)")
        close(total["reads"], want_reads, "reads asked by the job (strace)")
        close(total["bytes"], want_bytes, "bytes asked by the job (strace)")
        close(total["pfs_opens"], after["opens"] - before["opens"], "opens at the PFS (FUSE)")
        close(total["pfs_reads"], after["reads"] - before["reads"], "reads at the PFS (FUSE)")
        close(total["pfs_bytes"], after["bytes"] - before["bytes"], "bytes at the PFS (FUSE)")
        self.assertEqual(len(r["epochs"]), 3)

    def test_picture_renders_in_chromium(self):
        t = tier(self)
        stats = os.path.join(t, "stats.json")
        read_dataset(self.root, "read", monarch=["--dataset", self.root, "--tier", t,
                                                 "--report", stats])
        outdir = os.path.join(t, "out")
        os.mkdir(outdir)
        written = report("--write", outdir, stats).stdout.split()
        self.assertEqual([os.path.splitext(p)[1] for p in written], [".txt", ".json", ".svg"])
        svg = written[2]
        shot = os.path.join(t, "shot.png")
        profile = tempfile.mkdtemp(prefix="monarch-chromium-")
        self.addCleanup(shutil.rmtree, profile, True)
        subprocess.run(CHROMIUM + [f"--user-data-dir={profile}", f"--screenshot={shot}",
                                   "--window-size=1100,540", "file://" + svg],
                       capture_output=True, timeout=120, check=True)
        width, height, rows = png_pixels(shot)
        # The plot area (inside the axes) holds colored areas, not just white.
        plot = [px for row in rows[80:450] for px in row[120:1000]]
        colored = sum(1 for (r, g, b) in plot if max(r, g, b) - min(r, g, b) > 40)
        self.assertGreater(colored / len(plot), 0.05, "the plot is (nearly) empty")

    def test_killed_stager_still_gives_a_report(self):
        t = tier(self)
        job = "killed"
        stager = subprocess.Popen([STAGER, "--dataset", self.root, "--job", job, "--tier", t])
        jobdir = os.path.join(t, "monarch-" + job)
        for _ in range(200):
            if os.path.exists(os.path.join(jobdir, "ctl.sock")):
                break
            time.sleep(0.05)
        env = {"LD_PRELOAD": os.path.join(BUILD, "interpose", "libmonarch_interpose.so"),
               "MONARCH_DATASET": self.root, "MONARCH_JOB_DIR": jobdir}
        read_dataset(self.root, "read", epochs=1, env=env)
        time.sleep(5.5)  # one periodic flush of the statistics
        stager.send_signal(signal.SIGKILL)
        stager.wait()
        text = report(os.path.join(jobdir, "stats.json")).stdout
        self.assertIn("[incomplete]", text)
        self.assertIn("the statistics are incomplete", text)
        self.assertRegex(text, r"read \d+\.\d \w+ in [1-9]\d* opens")

    def test_bad_input_one_clear_line(self):
        d = tempfile.mkdtemp(prefix="monarch-bad-")
        self.addCleanup(shutil.rmtree, d, True)
        good = os.path.join(d, "good.json")
        read_dataset(self.root, "read", epochs=1,
                     monarch=["--dataset", self.root, "--tier", tier(self), "--report", good])
        truncated, foreign = os.path.join(d, "truncated.json"), os.path.join(d, "foreign.json")
        with open(good) as f, open(truncated, "w") as g:
            g.write(f.read()[:400])
        with open(foreign, "w") as f:
            json.dump({"name": "something else"}, f)
        cases = {os.path.join(d, "missing.json"): "cannot read: No such file or directory",
                 truncated: "not valid JSON", foreign: "not Monarch statistics",
                 "424242": "no report for job 424242: no monarch-job424242.json"}
        for arg, why in cases.items():
            p = subprocess.run([REPORT, arg], capture_output=True, text=True, cwd=d,
                               env=dict(os.environ, MONARCH_REPORT_DIR=""))
            self.assertEqual(p.returncode, 1, arg)
            self.assertEqual(p.stdout, "", arg)
            lines = p.stderr.splitlines()
            self.assertEqual(len(lines), 1, p.stderr)
            self.assertIn(why, lines[0])
        self.assertEqual(report(check=False).returncode, 2)  # usage


if __name__ == "__main__":
    unittest.main(verbosity=2)
