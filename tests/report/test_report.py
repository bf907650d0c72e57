#!/usr/bin/python3
"""monarch-report on real jobs: its counts agree within 1% with independent
counts (the PFS's own: a counting FUSE mount; the readers' system calls:
strace), its picture renders in headless Chromium, a killed stager still gives
a report, job ids are found where the Slurm epilog writes reports, and bad
input gets one clear line. Standard library only (Debian's /usr/bin/python3)."""
import contextlib
import html
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
from harness import (AFTER_INDEX, BUILD, GEN, LIBRARY, PY, READER, SMALL, SRC,  # noqa: E402
                     STAGER, UNSANITIZED_ENV, Case, Pfs, dataset, dataset_bytes, epoch_deltas,
                     parse_epochs, preload, read_dataset, run, tier)

REPORT = os.path.join(BUILD, "stager", "monarch-report")
CHROMIUM = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
            "--no-first-run", "--disable-background-networking", "--disable-component-update",
            "--disable-sync"]


def report(*args, check=True, **kw):
    p = subprocess.run([REPORT, *args], capture_output=True, text=True, **kw)
    if check and p.returncode != 0:
        raise AssertionError(f"monarch-report {args} exited {p.returncode}: {p.stderr}")
    return p


def png_pixels(path):
    """(width, height, rows of RGB tuples) of an 8-bit RGB/RGBA PNG."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width, height, bpp = 8, b"", 0, 0, 3
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and color in (2, 6) and not interlace, f"PNG {depth}/{color}"
            bpp = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw, rows, stride = zlib.decompress(idat), [], width * bpp
    prev = bytearray(stride)
    for y in range(height):
        kind = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
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
    """Per process-lifetime totals from `strace -f -y`: opens of files (not
    directories) under `root`, read calls on descriptors of files under it, and
    the bytes those returned."""
    opens = reads = nbytes = 0
    with open(trace) as f:
        for line in f:
            m = re.search(r"openat\(AT_FDCWD<[^>]*>, \"([^\"]+)\".*= (\d+)<", line)
            if m and m.group(1).startswith(root + "/") and "O_DIRECTORY" not in line:
                opens += 1
                continue
            m = re.search(r"\b(read|pread64)\(\d+<([^>]+)>, .* = (\d+)$", line.rstrip())
            if m and m.group(2).startswith(root + "/"):
                reads += 1
                nbytes += int(m.group(3))
    return opens, reads, nbytes


class Base(Case):
    @classmethod
    def setUpClass(cls):
        cls.root = dataset("small", **SMALL)

    def close(self, got, want, what):
        self.assertGreater(want, 0, what)
        self.assertLessEqual(abs(got - want), 0.01 * want,
                             f"{what}: report {got}, independent count {want}")

    def job_with_pfs(self, pfs, conf, out, counts=None):
        """The reader without Monarch under strace (what the job asks for),
        then the same reader through monarch-run. Returns the strace totals,
        the PFS's counters before and after the Monarch run, and its epochs."""
        trace = os.path.join(os.path.dirname(out), "trace")
        # Reads of 64 KiB: FUSE splits a larger read into requests of at most
        # 1 MiB, so one 32 MiB read the job makes on the PFS (a copy that
        # stalled for the stall timeout on a busy CI machine) is 32 requests
        # at the PFS and one read in the report, which counts system calls.
        args = [PY, READER, pfs.dataset, "--mode", "chunks", "--epochs", "3"]
        run(["strace", "-f", "-qq", "-y", "-e", "trace=openat,read,pread64", "-e",
             "signal=none", "-o", trace] + args)
        asked = strace_counts(trace, pfs.dataset)
        before = pfs.counts()
        # For counts to compare, the job starts reading once the index is
        # published, and pauses after each epoch: the stager's poll finds the
        # epoch's end with no reads around it, instead of interpolating.
        p = run(AFTER_INDEX + args + ["--pause", "0.3"] + (["--counts", counts] if counts else []),
                monarch=["--dataset", pfs.dataset, "--config", conf, "--report", out])
        return asked, before, pfs.counts(), parse_epochs(p.stdout)

    def pfs_setup(self):
        t = tier(self)
        conf = os.path.join(t, "monarch.conf")
        # 128 KiB blocks: one FUSE request per read, as counted. The FUSE
        # mount is on a local disk: copy_fast_dataset keeps the stager copying
        # (once the fast-file-system check stopped it, the readers read large
        # files directly, in reads FUSE splits into several requests).
        with open(conf, "w") as f:
            f.write(f"copy_fast_dataset = yes\n[tier.ssd]\npath = {t}\nquota = 1G\n"
                    "block_size = 128K\n")
        return conf, os.path.join(t, "stats.json")


class Report(Base):
    @classmethod
    def setUpClass(cls):
        cls.root = dataset("small", **SMALL)
        cls.size = dataset_bytes(cls.root)
        # One real 3-epoch job on a 1 GiB tier, shared by the tests that only
        # need a real job's statistics.
        cls.tmp = tempfile.mkdtemp(prefix="monarch-report-test-")
        os.chmod(cls.tmp, 0o1777)
        cls.stats = os.path.join(cls.tmp, "R.json")
        os.mkdir(os.path.join(cls.tmp, "tier"))
        conf = os.path.join(cls.tmp, "monarch.conf")
        with open(conf, "w") as f:  # a local disk: copy_fast_dataset keeps the stager copying
            f.write(f"copy_fast_dataset = yes\n[tier.ssd]\npath = {cls.tmp}/tier\nquota = 1G\n")
        # Every epoch counted (the picture marks each one's end): reads before
        # the index would go unseen.
        _, cls.job = read_dataset(cls.root, "read", prefix=AFTER_INDEX, monarch=[
            "--dataset", cls.root, "--config", conf, "--report", cls.stats])

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_counts_agree_with_the_pfs_and_with_strace(self):
        conf, out = self.pfs_setup()
        with Pfs(self.root) as pfs:
            (opens, reads, nbytes), before, after, _ = self.job_with_pfs(pfs, conf, out)
        r = json.loads(report("--json", out).stdout)
        total = r["total"]
        self.assertEqual(len(r["epochs"]), 3)
        self.assertGreater(total["local_bytes"], 0)
        self.close(total["opens"], opens, "opens asked by the job (strace)")
        self.close(total["reads"], reads, "reads asked by the job (strace)")
        self.close(total["bytes"], nbytes, "bytes asked by the job (strace)")
        self.close(total["pfs_opens"], after["opens"] - before["opens"], "opens at the PFS (FUSE)")
        self.close(total["pfs_reads"], after["reads"] - before["reads"], "reads at the PFS (FUSE)")
        self.close(total["pfs_bytes"], after["bytes"] - before["bytes"], "bytes at the PFS (FUSE)")
        # The same figures in the summary.
        text = report(out).stdout
        self.assertIn(f"PFS with Monarch: {total['pfs_opens']} opens, {total['pfs_reads']} reads",
                      text)

    def test_picture_renders_in_chromium(self):
        self.assertIn("monarch: monarch-run ", self.job.stderr, "monarch-run prints the summary")
        outdir = os.path.join(self.tmp, "out")
        os.mkdir(outdir)
        written = report("--write", outdir, self.stats).stdout.split()
        self.assertEqual([os.path.splitext(p)[1] for p in written], [".txt", ".json", ".svg"])
        self.assertEqual(sorted(os.listdir(outdir)), sorted(map(os.path.basename, written)))
        with open(written[2]) as f:
            svg = f.read()
        for outside in ("<script", "href", "@import", "url("):
            self.assertNotIn(outside, svg, "the picture must be self-contained")
        self.assertIn("end of epoch 3", svg)
        shot = os.path.join(self.tmp, "shot.png")
        profile = tempfile.mkdtemp(prefix="monarch-chromium-")
        self.addCleanup(shutil.rmtree, profile, True)
        subprocess.run(CHROMIUM + [f"--user-data-dir={profile}", f"--screenshot={shot}",
                                   "--window-size=1200,800", "file://" + written[2]],
                       env=UNSANITIZED_ENV, capture_output=True, timeout=120, check=True)
        width, height, rows = png_pixels(shot)
        self.assertEqual((width, height), (1200, 800))
        # Inside the axes (x 110-1020, y 84-474): colored areas, not white.
        plot = [px for row in rows[90:470] for px in row[115:1015]]
        colored = sum(1 for (r, g, b) in plot if max(r, g, b) - min(r, g, b) > 40)
        self.assertGreater(colored / len(plot), 0.05, "the plot is (nearly) empty")
        # The tier's teal (#2a9d8f at 85% over white) is there.
        teal = sum(1 for (r, g, b) in plot if abs(r - 74) < 20 and abs(g - 170) < 20
                   and abs(b - 158) < 20)
        self.assertGreater(teal, 1000, "no bytes from the tier drawn")

    def test_series_sampled_every_tenth_of_a_second(self):
        # A short job keeps the stager's first resolution, one sample per
        # 0.1 s up to the last beat (every 0.1 s): the picture shows 0.2-s epochs.
        with open(self.stats) as f:
            stats = json.load(f)
        self.assertEqual(stats["schema"], "monarch-stats/2")
        series = stats["series"]
        self.assertEqual(series["interval_s"], 0.1)
        samples = len(series["served"][0]["bytes"])
        self.assertLessEqual(abs(samples * 0.1 - stats["elapsed_s"]), 0.25,
                             f"{samples} samples for {stats['elapsed_s']} s")
        sampled = sum(sum(s["bytes"]) for s in series["served"] if s["kind"] == "tier")
        self.assertLessEqual(sampled, sum(stats["totals"]["tier_bytes"]))
        self.assertGreater(sampled, 0)

    def test_killed_stager_still_gives_a_report(self):
        t = tier(self)
        job = "k9"
        stager = subprocess.Popen([STAGER, "--dataset", self.root, "--job", job, "--tier",
                                   t + ":1G"])
        jobdir = os.path.join(t, "monarch-" + job)
        for _ in range(200):
            if os.path.exists(os.path.join(jobdir, "index")):  # its map published
                break
            time.sleep(0.05)
        env = {"LD_PRELOAD": preload(LIBRARY), "MONARCH_DATASET": self.root, "MONARCH_JOB_DIR": jobdir}
        read_dataset(self.root, "read", epochs=1, env=env)

        def opens_flushed():  # statistics are flushed every 5 s or so
            with contextlib.suppress(OSError, ValueError):
                with open(os.path.join(jobdir, "stats.json")) as f:
                    return json.load(f)["totals"]["opens"] > 0
            return False
        for _ in range(300):
            if opens_flushed():
                break
            time.sleep(0.05)
        stager.send_signal(signal.SIGKILL)
        stager.wait()
        out = os.path.join(t, "out")
        os.mkdir(out)
        txt, rep, svg = report("--write", out, os.path.join(jobdir, "stats.json")).stdout.split()
        with open(txt) as f:
            text = f.read()
        self.assertIn("[incomplete]", text)
        self.assertIn("the statistics are incomplete", text)
        self.assertRegex(text, r"read \d+\.\d \w+ in [1-9]\d* opens")
        with open(rep) as f:
            self.assertFalse(json.load(f)["complete"])
        with open(svg) as f:
            self.assertIn("incomplete statistics", f.read())

    def test_job_ids_and_nodes(self):
        # Reports as the Slurm epilog writes them: job key job<ID>, one
        # directory for every node of the job.
        with open(self.stats) as f:
            stats = json.load(f)
        d = tempfile.mkdtemp(prefix="monarch-reports-")
        self.addCleanup(shutil.rmtree, d, True)
        for host in ("node1", "node2"):
            stats.update(job="job4242", host=host)
            path = os.path.join(d, f"stats-{host}.json")
            with open(path, "w") as f:
                json.dump(stats, f)
            report("--write", d, path)
        self.assertTrue(os.path.exists(os.path.join(d, "monarch-job4242.json")))
        self.assertTrue(os.path.exists(os.path.join(d, "monarch-job4242-node2.svg")))
        text = report("4242", cwd=d).stdout
        self.assertEqual(len(re.findall(r"^monarch: job 4242 on node\d", text, re.M)), 2, text)
        env = dict(os.environ, MONARCH_REPORT_DIR=d)
        lines = report("--json", "job4242", cwd="/", env=env).stdout.splitlines()
        self.assertEqual([json.loads(x)["host"] for x in lines], ["node1", "node2"])
        self.assertEqual(report("--svg", os.path.join(d, "x.svg"), "4242", cwd="/", env=env,
                                check=False).returncode, 1, "several nodes: name one")
        report("--svg", os.path.join(d, "x.svg"), os.path.join(d, "monarch-job4242.json"))
        with open(os.path.join(d, "x.svg")) as f:
            self.assertIn("<svg", f.read())

    def test_bad_input_one_clear_line(self):
        d = tempfile.mkdtemp(prefix="monarch-bad-")
        self.addCleanup(shutil.rmtree, d, True)
        with open(self.stats) as f:
            good = f.read()
        files = {"truncated.json": good[:400], "foreign.json": '{"a": 1}', "empty.json": "",
                 "newer.json": '{"schema": "monarch-stats/3"}'}
        for name, text in files.items():
            with open(os.path.join(d, name), "w") as f:
                f.write(text)
        p = lambda n: os.path.join(d, n)  # noqa: E731
        cases = {p("missing.json"): p("missing.json") + ": cannot read: No such file or directory",
                 p("truncated.json"): p("truncated.json") + ": not valid JSON",
                 p("foreign.json"): p("foreign.json") + ": not Monarch statistics",
                 p("empty.json"): p("empty.json") + ": not valid JSON: the file is empty",
                 p("newer.json"): p("newer.json") + ": schema \"monarch-stats/3\" is from another",
                 d: d + ": cannot read: Is a directory",
                 "424242": "job 424242: no report: no monarch-job424242.json in the current "
                           "directory ($MONARCH_REPORT_DIR is not set)"}
        for arg, why in cases.items():
            for args in ([arg], ["--json", arg]):
                r = subprocess.run([REPORT, *args], capture_output=True, text=True, cwd=d,
                                   env=dict(os.environ, MONARCH_REPORT_DIR=""))
                self.assertEqual(r.returncode, 1, args)
                self.assertEqual(r.stdout, "", args)
                self.assertTrue(r.stderr.startswith(f"monarch-report: {why}"), r.stderr)
                self.assertEqual(len(r.stderr.splitlines()), 1, r.stderr)
        r = subprocess.run([REPORT, "424242"], capture_output=True, text=True, cwd=d,
                           env=dict(os.environ, MONARCH_REPORT_DIR="/nonexistent"))
        self.assertIn("in the current directory or /nonexistent ($MONARCH_REPORT_DIR)", r.stderr)
        r = report("--write", p("no-such-dir"), self.stats, check=False)
        self.assertEqual((r.returncode, len(r.stderr.splitlines())), (1, 1), r.stderr)
        self.assertIn(p("no-such-dir") + ": No such file or directory", r.stderr)
        r = report("--write", d, p("foreign.json"), check=False)
        self.assertEqual(r.stderr, f"monarch-report: {p('foreign.json')}: not Monarch statistics "
                                   '(no "schema": "monarch-stats/2")\n')
        for usage in ([], ["--bogus", "x"], ["--write", d], ["a", "b"]):
            self.assertEqual(report(*usage, check=False).returncode, 2, usage)


class EpochCounts(Base):
    """Apart from Report: each epoch's counts, which depend on when the
    stager notices that an epoch ended (see the report of this test)."""

    def test_counts_per_epoch(self):
        # Each epoch reads every file once: a third of what strace saw over
        # three epochs. The PFS's counters are snapshot by the reader after
        # each epoch. Every mismatch is listed, with both numbers.
        conf, out = self.pfs_setup()
        with Pfs(self.root) as pfs:
            (opens, reads, nbytes), before, _, epochs = self.job_with_pfs(
                pfs, conf, out, counts=pfs.counts_file)
        pfs_epochs = epoch_deltas(before, epochs)
        r = json.loads(report("--json", out).stdout)
        self.assertEqual([e["number"] for e in r["epochs"]], [1, 2, 3])
        bad = []
        for e, fuse in zip(r["epochs"], pfs_epochs):
            x = e["traffic"]
            for what, got, want in (("opens (strace / 3)", x["opens"], opens / 3),
                                    ("reads (strace / 3)", x["reads"], reads / 3),
                                    ("bytes (strace / 3)", x["bytes"], nbytes / 3),
                                    ("PFS opens (FUSE)", x["pfs_opens"], fuse["opens"]),
                                    ("PFS bytes (FUSE)", x["pfs_bytes"], fuse["bytes"])):
                if abs(got - want) > 0.01 * want or (want == 0 and got != 0):
                    bad.append(f"epoch {e['number']} {what}: report {got}, independent {want:.0f}")
        self.assertEqual(bad, [])


# Collects the box of every text of the inline picture once the page is laid
# out, into <pre id="boxes"> (--dump-dom prints the page after its scripts).
BOXES_SCRIPT = """<script>
const box = e => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
document.getElementById("boxes").textContent = JSON.stringify({
  svg: box(document.querySelector("svg")),
  texts: [...document.querySelectorAll("svg text")].map(t => [...box(t), t.textContent])});
</script>"""


def rendered_text_boxes(svg_path, workdir):
    """Every text of the picture as Chromium lays it out in a 1200x800
    window: (svg box, [(left, top, right, bottom, text)])."""
    with open(svg_path) as f:
        svg = f.read()
    page = os.path.join(workdir, os.path.basename(svg_path) + ".html")
    with open(page, "w") as f:
        f.write(f'<!doctype html><html><body style="margin:0">{svg}<pre id="boxes"></pre>'
                f"{BOXES_SCRIPT}</body></html>")
    profile = tempfile.mkdtemp(prefix="monarch-chromium-")
    try:
        p = subprocess.run(CHROMIUM + [f"--user-data-dir={profile}", "--dump-dom",
                                       "--window-size=1200,800", "file://" + page],
                           env=UNSANITIZED_ENV, capture_output=True, text=True, timeout=120,
                           check=True)
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    m = re.search(r'<pre id="boxes">(.*?)</pre>', p.stdout, re.S)
    assert m and m.group(1), f"no boxes in the page Chromium dumped: {p.stdout[-2000:]}"
    boxes = json.loads(html.unescape(m.group(1)))
    return boxes["svg"], boxes["texts"]


def hour_of_statistics(path, job="job2", epochs=100, interval=1.6, seconds=3600):
    """Statistics as a stager would write them for an hour-long job on two
    tiers: a 300-s first epoch that fills the tiers, then `epochs - 1`
    steady ones, sampled every `interval` s (the stager's 0.1 s halved 4
    times), on a node with a long name and a dataset with a long path."""
    size, files = 400 << 30, 1_200_000
    fill, steady = 300.0, (seconds - 300.0) / (epochs - 1)
    tiers = [{"name": "ram", "dir": "/dev/shm/monarch", "quota": 64 << 30, "used": 64 << 30,
              "full": False},
             {"name": "nvme", "dir": "/local/monarch", "quota": 2 << 40, "used": size - (64 << 30),
              "full": False}]

    def counters(local_fraction, stager_bytes, t):
        local = size * local_fraction
        return {"opens": files, "reads": 2 * files, "bytes": size,
                "tier_opens": [files * local_fraction * 0.16, files * local_fraction * 0.84],
                "tier_reads": [0.32 * files * local_fraction, 1.68 * files * local_fraction],
                "tier_bytes": [local * 0.16, local * 0.84],
                "pfs_served_bytes": size - local, "pfs_opens": files * (1 - local_fraction),
                "pfs_reads": 2 * files * (1 - local_fraction), "pfs_bytes": size - local,
                "pfs_read_ns": t * 0.5e9 * (1 - local_fraction), "local_sample_bytes": 1 << 30,
                "local_sample_ns": 2e8,
                "stager": {"pfs_opens": files * stager_bytes / size, "pfs_reads": stager_bytes / (4 << 20),
                           "pfs_bytes": stager_bytes, "pfs_read_ns": t * 4e9}}

    epoch_list, start = [], 0.0
    for e in range(epochs):
        length = fill if e == 0 else steady
        epoch_list.append({"number": e + 1, "complete": True, "start_s": start,
                           "end_s": start + length,
                           "counters": counters(0.3 if e == 0 else 1.0, size if e == 0 else 0,
                                                length)})
        start += length
    totals = json.loads(json.dumps(epoch_list[0]["counters"]))
    for e in epoch_list[1:]:
        for k, v in e["counters"].items():
            if isinstance(v, list):
                totals[k] = [a + b for a, b in zip(totals[k], v)]
            elif isinstance(v, dict):
                for kk, vv in v.items():
                    totals[k][kk] += vv
            else:
                totals[k] += v
    # The samples: during the fill 30% from the tiers and 70% from the PFS,
    # then everything from the tiers; they add up to the totals.
    n = int(seconds / interval)
    fill_samples = int(fill / interval)
    local = [(0.3 * size / fill_samples if i < fill_samples
              else (totals["bytes"] - size) / (n - fill_samples)) for i in range(n)]
    pfs = [0.7 * size / fill_samples if i < fill_samples else 0 for i in range(n)]
    series = {"interval_s": interval, "served": [
        {"name": "ram", "kind": "tier", "bytes": [0.16 * b for b in local]},
        {"name": "nvme", "kind": "tier", "bytes": [0.84 * b for b in local]},
        {"name": "pfs", "kind": "pfs", "bytes": pfs},
        {"name": "stager", "kind": "copy",
         "bytes": [size / fill_samples if i < fill_samples else 0 for i in range(n)]}],
        "cached": [{"name": t["name"], "kind": "tier",
                    "bytes": [t["used"] * min(1, (i + 1) / fill_samples) for i in range(n)]}
                   for t in tiers]}
    stats = {"schema": "monarch-stats/2", "complete": True, "job": job,
             "host": "gpu-node-0421.cluster.example.org", "user": "someone",
             "dataset": "/lustre/projects/vision/shared/datasets/imagenet-21k/train-2024-10",
             "config_file": "/etc/monarch/monarch.conf", "started_unix": 0, "updated_unix": 3600,
             "elapsed_s": seconds,
             "settings": {"consistency": "job", "copy_threads": 8, "stage_ahead": True,
                          "small_file_max": 1 << 20},
             "tiers": tiers, "index": {"files": files, "bytes": size, "dirs": 21000,
                                       "skipped": 0, "unreadable_dirs": 0, "seconds": 40,
                                       "map_bytes": 110 << 20},
             "cached": {"files": files, "bytes": size, "fill_seconds": fill},
             "totals": totals, "epochs": epoch_list, "series": series}
    with open(path, "w") as f:
        json.dump(stats, f)


class Picture(unittest.TestCase):
    """The picture of a job of any length, laid out by Chromium at 1200x800
    and checked from the text boxes of the rendered page: no two texts
    overlap, none leaves the picture or the window, the title names the job
    once, the header is whole."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="monarch-picture-")
        os.chmod(cls.tmp, 0o1777)
        cls.stats = {}
        # The demo's job (contrib/demo): its training script on a dataset of
        # its shape, half its size, behind the demo's emulated PFS.
        root = os.path.join(cls.tmp, "pfs", "dataset")
        subprocess.run([GEN, root, "--small", "1000", "--large", "6", "--large-min-mib", "16",
                        "--large-max-mib", "48"], check=True, stdout=subprocess.DEVNULL)
        os.mkdir(os.path.join(cls.tmp, "tier"))
        cls.stats["demo"] = os.path.join(cls.tmp, "demo.json")
        with Pfs(root, latency_us=1000, bandwidth_mbs=500) as pfs:
            run(AFTER_INDEX + [PY, os.path.join(SRC, "contrib", "slurm", "demo-train.py"),
                               pfs.dataset, "--epochs", "3", "--workers", "2"],
                monarch=["--dataset", pfs.dataset, "--tier", os.path.join(cls.tmp, "tier") + ":2G",
                         "--report", cls.stats["demo"]])
        cls.stats["hour"] = os.path.join(cls.tmp, "hour.json")
        hour_of_statistics(cls.stats["hour"])

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def check_layout(self, name):
        svg = os.path.join(self.tmp, name + ".svg")
        report("--svg", svg, self.stats[name])
        frame, texts = rendered_text_boxes(svg, self.tmp)
        self.assertGreater(len(texts), 20)
        left, top, right, bottom = frame
        self.assertLessEqual((right, bottom), (1200, 800), "the picture fits the window")
        for x0, y0, x1, y1, text in texts:
            self.assertTrue(x0 >= left and y0 >= top and x1 <= right and y1 <= bottom,
                            f"{name}: {text!r} at {(x0, y0, x1, y1)} leaves the picture {frame}")
        overlaps = [(a[4], b[4]) for i, a in enumerate(texts) for b in texts[i + 1:]
                    if min(a[2], b[2]) - max(a[0], b[0]) > 0.5
                    and min(a[3], b[3]) - max(a[1], b[1]) > 0.5]
        self.assertEqual(overlaps, [], f"{name}: overlapping texts")
        return [t[4] for t in texts]

    def test_the_demos_job(self):
        texts = self.check_layout("demo")
        title = texts[0]
        self.assertRegex(title, r"^Monarch: monarch-run \d+ on ")
        self.assertTrue(any(t.startswith("epoch 3: ") for t in texts), texts)
        self.assertIn("time since the stager started (s)", texts)

    def test_an_hour_long_job(self):
        texts = self.check_layout("hour")
        self.assertEqual(texts[0], "Monarch: job 2 on gpu-node-0421.cluster.example.org")
        header = " ".join(t for t in texts[1:4])
        self.assertIn("dataset /lustre/projects/vision/shared/datasets/imagenet-21k/train-2024-10",
                      header, "the dataset whole")
        self.assertIn("PFS traffic avoided:", header)
        self.assertIn("time since the stager started (min)", texts)
        labelled = [t for t in texts if re.fullmatch(r"epoch \d+: .*|\d+", t)]
        self.assertGreater(len(labelled), 5, texts)


if __name__ == "__main__":
    unittest.main(verbosity=2)
