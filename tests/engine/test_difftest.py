#!/usr/bin/python3
"""The differential tester (issue 13): random, seeded sequences of file calls
(monarch-difftest, tests/engine/difftest.cpp) run once directly on tree A and
once under the interposition library on trees B1 (stager with stage_ahead =
no, small_file_max = 64K: files cached as they are read), B2 (stage_ahead
= yes, run once everything is cached) and B3 (consistency = open), a third
of the sequences on each. The
outputs must be equal line by line: each line is one call, its return value,
errno and what it showed (bytes, offsets, stat fields, flags), normalized so
that two trees of equal content print the same.

On a difference it prints the seed, the sequence, the first differing lines
and the shortest op list that still shows it (ddmin, each attempt on fresh
trees with a fresh stager), then fails. Before the real run, two self-checks
prove the comparison right: a second direct tree compares equal, and a tree
with one byte changed does not.

    test_difftest.py                       CI: 3,000 sequences (about 190,000 calls)
    test_difftest.py --sequences N --seed S
    test_difftest.py --minutes M --seed S  soak: rounds of fresh trees until time is up
Environment: MONARCH_BUILD (the build tree), MONARCH_DIFFTEST_SEQUENCES,
MONARCH_DIFFTEST_SEED, MONARCH_DIFFTEST_MINIMIZE_S (the minimizer's budget, 150).
Standard library only; run with /usr/bin/python3 like the other engine tests."""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

from harness import BUILD, LIBRARY, STAGER, preload

DIFFTEST = os.path.join(BUILD, "tests", "engine", "monarch-difftest")

# The two Monarch configurations; the tier section is added per stager.
CONFIGS = {
    # The trees are on a local disk: copy_fast_dataset keeps the stager copying.
    "B1": "stage_ahead = no\nsmall_file_max = 64K\ncopy_fast_dataset = yes\n",
    "B2": "stage_ahead = yes\nstage_ahead_window = 100%\ncopy_fast_dataset = yes\n",
    "B3": "consistency = open\nstage_ahead = yes\nstage_ahead_window = 100%\nsmall_file_max = 64K\n"
          "copy_fast_dataset = yes\n",
}


def ids_text(ids):
    """"0-99" for a range, "3,5,7" otherwise (monarch-difftest's LIST)."""
    ids = list(ids)
    if ids == list(range(ids[0], ids[-1] + 1)):
        return f"{ids[0]}-{ids[-1]}"
    return ",".join(map(str, ids))


def setup(tree, ids):
    subprocess.run([DIFFTEST, "setup", tree, "--sequences", ids_text(ids)], check=True)


def direct_env():
    e = {k: v for k, v in os.environ.items()
         if k not in ("LD_PRELOAD", "MONARCH_DATASET", "MONARCH_JOB_DIR")}
    if preload():  # a sanitizer build's runtime, as in the runs through the library
        e["LD_PRELOAD"] = preload()
    return e


def tier_parent(work):
    """A RAM tier (another device than the trees) when /dev/shm has room."""
    try:
        st = os.statvfs("/dev/shm")
        if st.f_bavail * st.f_frsize > (2 << 30):
            return tempfile.mkdtemp(prefix="monarch-difftest-tier-", dir="/dev/shm")
    except OSError:
        pass
    return tempfile.mkdtemp(prefix="tier-", dir=work)


class Stager:
    """A monarch-stager for tree/ds, started by hand as test_faults.py does,
    with the configuration `name` of CONFIGS."""

    def __init__(self, tree, name, work):
        self.tree, self.name = tree, name
        self.tier = tier_parent(work)
        os.chmod(self.tier, 0o1777)
        self.job = "difftest-" + name
        self.job_dir = os.path.join(self.tier, "monarch-" + self.job)
        conf = os.path.join(self.tier, "difftest.conf")
        with open(conf, "w") as f:
            f.write(CONFIGS[name] + f"[tier.a]\npath = {self.tier}\nquota = 4G\n")
        self.log = open(os.path.join(work, f"stager-{name}-{os.getpid()}.log"), "ab")
        r, w = os.pipe()
        self.proc = subprocess.Popen([STAGER, "--dataset", os.path.join(tree, "ds"), "--job",
                                      self.job, "--config", conf, "--ready-fd", str(w)],
                                     pass_fds=(w,), stdout=self.log, stderr=self.log,
                                     env=direct_env())
        os.close(w)
        with os.fdopen(r) as f:
            ready = f.readline().strip()
        if ready != "ready":
            self.stop()
            raise AssertionError(f"stager {name} did not start: {ready!r}")
        # "ready" comes before the walk: calls before the map would be the
        # PFS's alone, not Monarch's.
        end = time.time() + 60
        while not os.path.exists(os.path.join(self.job_dir, "index")):
            if time.time() > end or self.proc.poll() is not None:
                self.stop()
                raise AssertionError(f"stager {name} published no map")
            time.sleep(0.01)
        if CONFIGS[name].find("stage_ahead = yes") >= 0:
            self.wait_cached()

    def wait_cached(self, timeout=300):
        """Until every regular file of the dataset has a published copy."""
        want = sum(1 for d, _, names in os.walk(os.path.join(self.tree, "ds"))
                   for n in names if os.path.isfile(os.path.join(d, n))
                   and not os.path.islink(os.path.join(d, n)))
        data = os.path.join(self.job_dir, "data")
        end = time.time() + timeout
        while time.time() < end:
            have = sum(len(names) for _, _, names in os.walk(data))
            if have >= want:
                return
            time.sleep(0.05)
        raise AssertionError(f"stager {self.name}: {have} of {want} files cached after {timeout} s")

    def env(self):
        e = direct_env()
        e.update(LD_PRELOAD=preload(LIBRARY), MONARCH_DATASET=os.path.join(self.tree, "ds"),
                 MONARCH_JOB_DIR=self.job_dir)
        return e

    def stop(self, wait=True):
        """Stops the stager and removes its tier; without `wait`, later, in
        reap() (a stager takes 0.2 s to stop: the minimizer does not wait)."""
        if self.proc.poll() is None:
            self.proc.terminate()
        self.log.close()
        if not wait:
            Stager.stopping.append(self)
            return
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.tier, ignore_errors=True)

    stopping = []

    @staticmethod
    def reap():
        while Stager.stopping:
            Stager.stopping.pop().stop()


def start_exec(tree, args, env, out):
    with open(out, "wb") as f, open(out + ".err", "wb") as err:
        return subprocess.Popen([DIFFTEST, "exec", tree] + args, stdout=f, stderr=err, env=env)


def parse(path):
    """{sequence: [lines]} of an exec output."""
    seqs = {}
    with open(path, errors="replace") as f:
        for line in f:
            label = line.split(" ", 1)[0]
            k = label.split(".", 1)[0]
            if not k.isdigit():
                raise AssertionError(f"{path}: not a result line: {line[:200]!r}")
            seqs.setdefault(int(k), []).append(line.rstrip("\n"))
    return seqs


def is_call(line):
    return line.split(" ", 1)[0].split(".", 1)[1][:1].isdigit()


def first_difference(a, b):
    """Index of the first line where the two lists differ, or None."""
    for i in range(max(len(a), len(b))):
        if i >= len(a) or i >= len(b) or a[i] != b[i]:
            return i
    return None


# Calls that read bytes: one kind of difference whichever of them shows it.
READS = {"read", "pread", "pread64", "readv", "preadv", "preadv2", "fread", "cfr", "sendfile",
         "fsize", "read0"}


def outcome(line):
    """'ok', the errno name, or the signal of a result line."""
    if line is None:
        return "none"
    result = line.partition(" => ")[2].split(" ")
    if result[0] in ("-1", "NULL") and len(result) > 1:
        return result[1]
    if result[0] in ("child", "signal"):
        return " ".join(result[:3])
    return "ok"


def fds_fields(la, lb):
    """What differs between two end-of-sequence descriptor lists: 'open' (a
    descriptor on one side only), 'identity', 'fd' (FD_CLOEXEC), 'fl', 'off'."""
    def table(line):
        return {t.split(":", 1)[0]: t.split(":", 1)[1] for t in line.split(" => ", 1)[1].split()}
    ta, tb = table(la), table(lb)
    fields = set()
    for fd in set(ta) | set(tb):
        if fd not in ta or fd not in tb:
            fields.add("open")
            continue
        pa, pb = ta[fd].split(","), tb[fd].split(",")
        if pa[0] != pb[0]:
            fields.add("identity")
        fields.update(x.split("=")[0] for x, y in zip(pa[1:], pb[1:]) if x != y)
    return sorted(fields)


def signature(a, b, i):
    """The kind of the difference at line i: the call ('read' for every read)
    and how each side ended, e.g. 'read:EINVAL/ok', 'flock:EAGAIN/ok', 'fds'."""
    la, lb = (a[i] if i < len(a) else None), (b[i] if i < len(b) else None)
    label, _, rest = (la or lb).partition(" ")
    tail = label.split(".", 1)[1]
    if tail == "fds" and la and lb:
        return "fds:" + ",".join(fds_fields(la, lb))
    if not tail[:1].isdigit():
        return tail if tail != "end" else f"end:{outcome(la)}/{outcome(lb)}"
    op = rest.split(" ", 1)[0]
    if tail.endswith("/spawn"):
        op = "read0"
    return f"{'read' if op in READS else op}:{outcome(la)}/{outcome(lb)}"


def op_index(lines, i):
    """The top-level op a line belongs to (K.I, K.I/j, K.I/spawn), or None."""
    if i >= len(lines):
        return None
    tail = lines[i].split(" ", 1)[0].split(".", 1)[1]
    head = tail.split("/", 1)[0]
    return int(head) if head.isdigit() else None


def gen(seed, k):
    p = subprocess.run([DIFFTEST, "gen", "--seed", str(seed), "--sequence", str(k)],
                       capture_output=True, text=True, check=True)
    return p.stdout.splitlines()


class Attempt:
    """Runs one op list for sequence k directly and under Monarch (config
    `name`), each on a fresh tree with a fresh stager; returns both outputs."""

    def __init__(self, work, k, name):
        self.work, self.k, self.name, self.n = work, k, name, 0

    def run(self, ops):
        self.n += 1
        d = tempfile.mkdtemp(prefix="attempt-", dir=self.work)
        try:
            opsfile = os.path.join(d, "ops")
            with open(opsfile, "w") as f:
                f.write("".join(op + "\n" for op in ops))
            a, b = os.path.join(d, "A"), os.path.join(d, "B")
            setup(a, [self.k])
            setup(b, [self.k])
            stager = Stager(b, self.name, d)
            try:
                args = ["--ops", opsfile, "--sequence", str(self.k)]
                pa = start_exec(a, args, direct_env(), os.path.join(d, "a.out"))
                pb = start_exec(b, args, stager.env(), os.path.join(d, "b.out"))
                pa.wait()
                pb.wait()
            finally:
                stager.stop(wait=False)
            return (parse(os.path.join(d, "a.out")).get(self.k, []),
                    parse(os.path.join(d, "b.out")).get(self.k, []))
        finally:
            shutil.rmtree(d, ignore_errors=True)

    def shows(self, ops, sig):
        a, b = self.run(ops)
        i = first_difference(a, b)
        return i is not None and signature(a, b, i) == sig


def ddmin(ops, fails, deadline):
    """Zeller's ddmin: a 1-minimal sub-list of `ops` for which fails() holds
    (or the smallest found when the deadline passes)."""
    n = 2
    while len(ops) >= 2:
        if time.time() >= deadline:
            print("  (the minimizer's time is up: the list below may hold ops that do not matter)")
            return ops
        size = -(-len(ops) // n)
        chunks = [ops[i:i + size] for i in range(0, len(ops), size)]
        reduced = False
        for i, c in enumerate(chunks):
            if fails(c):
                ops, n, reduced = c, 2, True
                break
            rest = [op for j, ch in enumerate(chunks) if j != i for op in ch]
            if len(chunks) > 2 and fails(rest):
                ops, n, reduced = rest, max(n - 1, 2), True
                break
        if not reduced:
            if n >= len(ops):
                break
            n = min(len(ops), 2 * n)
    return ops


def minimize(work, seed, k, name, a_lines, b_lines, deadline):
    """Prints the shortest op list that still shows sequence k's difference."""
    i = first_difference(a_lines, b_lines)
    sig = signature(a_lines, b_lines, i)
    ops = gen(seed, k)
    last = op_index(a_lines, i)
    if last is not None:
        ops = ops[:last + 1]  # what follows the first difference cannot cause it
    # Alone on a fresh tree, the files earlier sequences had cached are not:
    # the other configuration (B2: everything cached) often stands for them.
    for config in [name] + [c for c in CONFIGS if c != name]:
        attempt = Attempt(work, k, config)
        if any(attempt.shows(ops, sig) for _ in range(3)):
            break
    else:
        Stager.reap()
        print(f"  not reproduced alone on fresh trees (it depends on earlier sequences or on "
              f"timing); its {len(ops)} ops up to the difference:")
        for op in ops:
            print("    " + op)
        return
    t0 = time.time()
    small = ddmin(ops, lambda c: attempt.shows(c, sig), deadline)
    Stager.reap()
    a, b = attempt.run(small)
    Stager.reap()
    print(f"  minimized to {len(small)} op(s) in {attempt.n} attempts, {time.time() - t0:.0f} s"
          f" (monarch-difftest exec TREE --ops FILE --sequence {k}, stager config "
          f"{attempt.name}):")
    for op in small:
        print("    " + op)
    j = first_difference(a, b)
    if j is not None:
        print(f"    direct : {a[j] if j < len(a) else '(none)'}")
        print(f"    monarch: {b[j] if j < len(b) else '(none)'}")


def compare(ref, got, which):
    """[(k, which, ref lines, got lines)] of the sequences that differ."""
    diffs = []
    for k, lines in sorted(got.items()):
        if ref.get(k) != lines:
            diffs.append((k, which, ref.get(k, []), lines))
    return diffs


def check_complete(seqs, ids, what):
    missing = [k for k in ids if not (seqs.get(k) and seqs[k][-1].startswith(f"{k}.end "))]
    if missing:
        raise AssertionError(f"{what}: sequences without an end line (the executor died): "
                             f"{missing[:10]}")


def report(diffs, seed, work, budget_s):
    """Prints every differing sequence briefly, then minimizes one per kind."""
    kinds = {}
    for d in diffs:
        k, which, a, b = d
        kinds.setdefault(signature(a, b, first_difference(a, b)), []).append(d)
    print(f"DIFFERENCES in {len(diffs)} sequence(s), seed {seed}, {len(kinds)} kind(s) "
          f"(the call, and how it ended directly/through Monarch):")
    for sig, ds in kinds.items():
        print(f"  {sig}: {len(ds)} sequence(s): "
              + " ".join(f"{k}({which})" for k, which, _, _ in ds[:12])
              + (" ..." if len(ds) > 12 else ""))
    for k, which, a, b in diffs[:20]:
        i = first_difference(a, b)
        print(f"sequence {k} ({which}: {CONFIGS[which].strip().replace(chr(10), ', ')}), "
              f"first difference at line {i}:")
        for j in range(i, min(i + 3, max(len(a), len(b)))):
            print(f"  direct : {a[j] if j < len(a) else '(none)'}")
            print(f"  monarch: {b[j] if j < len(b) else '(none)'}")
    if len(diffs) > 20:
        print(f"({len(diffs) - 20} more sequences differ)")
    deadline = time.time() + budget_s
    print(f"minimizing one sequence for each of {len(kinds)} kind(s) of difference "
          f"({', '.join(kinds)}), {budget_s} s in all:")
    for n, (sig, ((k, which, a, b), *_)) in enumerate(kinds.items()):
        if time.time() >= deadline:
            print(f"  (no time left for {sig})")
            continue
        share = time.time() + (deadline - time.time()) / (len(kinds) - n)
        print(f"[{sig}] seed {seed}, sequence {k}, {which}:")
        minimize(work, seed, k, which, a, b, share)


def run_round(work, seed, ids, plant=False, control=0):
    """One round on fresh trees: returns (sequences, calls, diffs, seconds).
    `plant`: B1 is a direct tree with one byte changed (the self-check).
    `control`: the first `control` ids also run directly on a second tree A2."""
    t0 = time.time()
    trees = {n: os.path.join(work, n) for n in ["A", "A2"] + list(CONFIGS)}
    for n in ("A", "B1") if plant else ["A"] + list(CONFIGS):
        setup(trees[n], ids)
    parts = {name: ids[i::len(CONFIGS)] for i, name in enumerate(CONFIGS)}
    stagers = {}
    try:
        procs = []
        if plant:
            with open(os.path.join(trees["B1"], "ds", "b.bin"), "r+b") as f:
                f.seek(1234)
                byte = f.read(1)
                f.seek(1234)
                f.write(bytes([byte[0] ^ 1]))
            procs.append(("B1", start_exec(trees["B1"], ["--seed", str(seed), "--sequences",
                                                         ids_text(ids)], direct_env(),
                                           os.path.join(work, "B1.out"))))
        else:
            for name in parts:
                stagers[name] = Stager(trees[name], name, work)
            for name, part in parts.items():
                procs.append((name, start_exec(trees[name], ["--seed", str(seed), "--sequences",
                                                             ids_text(part)],
                                               stagers[name].env(),
                                               os.path.join(work, name + ".out"))))
        if control:
            setup(trees["A2"], ids)
            procs.append(("A2", start_exec(trees["A2"], ["--seed", str(seed), "--sequences",
                                                         ids_text(ids[:control])], direct_env(),
                                           os.path.join(work, "A2.out"))))
        procs.append(("A", start_exec(trees["A"], ["--seed", str(seed), "--sequences",
                                                   ids_text(ids)], direct_env(),
                                      os.path.join(work, "A.out"))))
        for name, p in procs:
            if p.wait() != 0:
                raise AssertionError(f"monarch-difftest exec on {name} exited {p.returncode}:\n"
                                     + open(os.path.join(work, name + ".out.err")).read()[-2000:])
    finally:
        for s in stagers.values():
            s.stop()
    out = {name: parse(os.path.join(work, name + ".out")) for name, _ in procs}
    check_complete(out["A"], ids, "direct run")
    diffs = []
    if control:
        check_complete(out["A2"], ids[:control], "control run")
        diffs += compare(out["A"], out["A2"], "A2")
    if plant:
        check_complete(out["B1"], ids, "planted run")
        diffs += compare(out["A"], out["B1"], "B1")
    else:
        for name, part in parts.items():
            check_complete(out[name], part, "Monarch run " + name)
            diffs += compare(out["A"], out[name], name)
    calls = sum(1 for lines in out["A"].values() for line in lines if is_call(line))
    for n in trees.values():
        shutil.rmtree(n, ignore_errors=True)
    return len(ids), calls, diffs, time.time() - t0


def self_checks(work, seed):
    """The tester is right before it judges Monarch: the same sequences on two
    direct trees compare equal, and one changed byte in a shared file is seen."""
    ids = list(range(200))
    n, calls, diffs, secs = run_round(work, seed, ids, control=200, plant=True)
    control = [d for d in diffs if d[1] == "A2"]
    planted = [d for d in diffs if d[1] == "B1"]
    if control:
        k, _, a, b = control[0]
        i = first_difference(a, b)
        raise AssertionError(f"the tester is not deterministic: two direct trees differ in "
                             f"sequence {k}:\n{a[i] if i < len(a) else ''}\n"
                             f"{b[i] if i < len(b) else ''}")
    if not planted:
        raise AssertionError("a changed byte in ds/b.bin went unnoticed: the tester cannot fail")
    print(f"self-checks: {n} sequences ({calls} calls) on two direct trees: 0 differences; "
          f"one changed byte in ds/b.bin: {len(planted)} sequences differ ({secs:.1f} s)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sequences", type=int,
                    default=int(os.environ.get("MONARCH_DIFFTEST_SEQUENCES", 3000)))
    ap.add_argument("--seed", type=int, default=int(os.environ.get("MONARCH_DIFFTEST_SEED", 1)))
    ap.add_argument("--minutes", type=float, default=0,
                    help="soak: rounds of --sequences each, new seeds, until time is up")
    ap.add_argument("--no-self-check", action="store_true")
    args = ap.parse_args()
    budget = int(os.environ.get("MONARCH_DIFFTEST_MINIMIZE_S", 150))
    if not os.path.exists(DIFFTEST):
        sys.exit(f"{DIFFTEST} is missing: cmake --build build --target monarch-difftest")
    work = tempfile.mkdtemp(prefix="monarch-difftest-")
    os.chmod(work, 0o755)
    t0 = time.time()
    total_seqs = total_calls = 0
    try:
        if not args.no_self_check:
            self_checks(work, args.seed)
        end = t0 + args.minutes * 60
        round_no = 0
        while True:
            seed = args.seed + round_no
            ids = list(range(args.sequences))
            n, calls, diffs, secs = run_round(work, seed, ids)
            total_seqs += n
            total_calls += calls
            print(f"round {round_no + 1}, seed {seed}: {n} sequences, {calls} calls, "
                  f"{len(diffs)} sequences differ, {secs:.1f} s", flush=True)
            if diffs:
                report(diffs, seed, work, budget)
                break
            round_no += 1
            if not args.minutes or time.time() >= end:
                break
        print(f"compared {total_seqs} sequences, {total_calls} calls: "
              f"{len(diffs)} sequences differ; {time.time() - t0:.0f} s")
        return 1 if diffs else 0
    finally:
        Stager.reap()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
