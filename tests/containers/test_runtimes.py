#!/usr/bin/python3
"""A Monarch job whose program runs in a container, as each runtime starts
one: enroot with Monarch's shipped hook (what pyxis runs; enroot_start.py),
`apptainer exec --cleanenv` with the environment the plugin sets
(apptainer_exec.py; monarch-run sets the same, task_env.h), and podman with
runc and the flags the README gives users. In a Debian 11 (glibc 2.31) and a
Debian 12 root file system (rootfs.py), a 3-epoch reader of the dataset
mounted at /data gets the right bytes, and epochs 2-3 come from the tier, as
the emulated PFS counts them; a variant binds the dataset at its host path.
An image the hook cannot serve (no C library it can tell, a glibc older than
2.17) runs its program to the right result, with one line saying why."""
import os
import resource
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "engine"))
from harness import (AFTER_INDEX, LIBRARY, READER, SMALL, Case, Pfs, conf_file, dataset,  # noqa
                     epoch_deltas, parse_epochs, reference, run, tier)

sys.path.insert(0, HERE)
import rootfs  # noqa: E402
from test_musl import PROGRAM, expected  # noqa: E402

HOOK = os.path.join(SRC, "etc", "enroot", "90-monarch.sh")
INSIDE_READER = "/usr/local/lib/monarch/reader.py"
INSIDE_COUNTS = "/usr/local/lib/monarch/pfs-counts"
NAMESPACES = ["unshare", "--mount", "--pid", "--fork", "--propagation", "private"]
# podman's flags for Monarch as the README gives them to users ("Containers"),
# expanded by sh in the job's environment: the library and every job
# directory at the same path, the library preloaded, Monarch's variables
# passed with their host values.
PODMAN_FLAGS = r"""
set -e
flags="-v $MONARCH_INTERPOSE_LIB:$MONARCH_INTERPOSE_LIB:ro -e LD_PRELOAD=$MONARCH_INTERPOSE_LIB"
for d in $(echo "$MONARCH_JOB_DIRS" | tr : ' '); do flags="$flags -v $d:$d"; done
"""


def podman(root, binds, command):
    """podman run of `command` in `root` (":O": an overlay, nothing lands in
    the cache), with Monarch's flags and the user's `-v binds`. runc: crun
    refuses cgroups in hybrid mode here; the limits: runc cannot set the
    host's nproc limit here, and podman's default nofile is above this one's."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    script = PODMAN_FLAGS + (
        "exec podman --runtime runc --cgroup-manager cgroupfs run --rm --network none "
        f"--ulimit nofile={nofile}:{nofile} --ulimit nproc=4096:4096 "
        "$flags --env 'MONARCH_*' \"$@\"")
    args = []
    for b in binds:
        args += ["-v", b]
    return ["sh", "-c", script, "sh"] + args + ["--rootfs", root + ":O"] + command


class Runtimes:
    """The tests, for the root of `suite` (subclasses below)."""
    suite = None

    @classmethod
    def setUpClass(cls):
        cls.root = dataset("small", **SMALL)
        images = os.path.join(cls.root, "images")
        cls.ref = {os.path.relpath(os.path.join(cls.root, k), images): v
                   for k, v in reference(cls.root).items() if k.startswith("images/")}

    def container(self, runtime, binds, command):
        """The command line that starts `command` in the root with `runtime`,
        the user's `binds` (SRC:DST[:ro]) added."""
        root = rootfs.path(self.suite)
        if runtime == "enroot":
            cmd = NAMESPACES + ["/usr/bin/python3", os.path.join(HERE, "enroot_start.py"),
                                root, HOOK]
            for b in binds:
                cmd += ["--mount", b]
            return cmd + ["--"] + command
        if runtime == "apptainer":
            cmd = NAMESPACES + ["/usr/bin/python3", os.path.join(HERE, "apptainer_exec.py"),
                                root]
            for b in binds:
                cmd += ["--bind", b]
            return cmd + ["--"] + command
        return podman(root, binds, command)

    def read_in(self, runtime, at_data):
        """3 epochs of the dataset (600 files, each stat'ed then read whole)
        in a container of `runtime`, the dataset at /data or at its host path."""
        with Pfs(self.root) as pfs:
            t = tier(self)
            images = os.path.join(pfs.dataset, "images")
            inside = "/data" if at_data else images
            conf = conf_file(self, t, quota="100%", copy_fast_dataset="yes")
            before = pfs.counts()
            binds = [f"{images}:{inside}:ro", f"{READER}:{INSIDE_READER}:ro",
                     f"{pfs.counts_file}:{INSIDE_COUNTS}:ro"]
            reader = ["/usr/bin/python3", INSIDE_READER, inside, "--mode", "read", "--epochs",
                      "3", "--stat", "--counts", INSIDE_COUNTS]
            p = run(AFTER_INDEX + self.container(runtime, binds, reader),
                    monarch=["--dataset", images, "--config", conf], timeout=900)
        epochs = parse_epochs(p.stdout)
        self.assertSameBytes(epochs, self.ref)
        summary = p.stderr[-3000:]
        d = epoch_deltas(before, epochs)
        size = sum(os.path.getsize(os.path.join(self.root, "images", k)) for k in self.ref)
        self.assertGreater(d[0]["opens"], 0, "epoch 1 read the PFS (the test would be vacuous)")
        where = f"{runtime} in {self.suite}, the dataset at {inside}"
        print(f"{where}: PFS opens, reads, bytes by epoch "
              f"{[(x['opens'], x['reads'], x['bytes']) for x in d]}", flush=True)
        # At least 90% of the bytes of epochs 2-3 from the tier. (Epoch 2 may
        # still meet files the stager has not copied yet on a loaded machine.)
        self.assertLessEqual(d[1]["bytes"] + d[2]["bytes"], 2 * size // 10,
                             f"epochs 2-3: more than 10% of the bytes from the PFS ({where})\n"
                             f"{summary}")
        self.assertNotIn("monarch: off", p.stderr)

    def test_enroot_dataset_at_data(self):
        self.read_in("enroot", at_data=True)

    def test_enroot_dataset_at_its_path(self):
        self.read_in("enroot", at_data=False)

    def test_apptainer_dataset_at_data(self):
        self.read_in("apptainer", at_data=True)

    def test_apptainer_dataset_at_its_path(self):
        self.read_in("apptainer", at_data=False)

    def test_podman_dataset_at_data(self):
        self.read_in("podman", at_data=True)

    def test_podman_dataset_at_its_path(self):
        self.read_in("podman", at_data=False)


class Hook(Case):
    """The shipped hook run alone, as enroot runs it: it never fails the
    container's start, does nothing outside a Monarch job, and says in one
    line why it turns Monarch off."""

    def hook(self, **env):
        tmp = tempfile.mkdtemp(prefix="monarch-hook-")
        self.addCleanup(shutil.rmtree, tmp, True)
        files = {"ENROOT_MOUNTS": os.path.join(tmp, "fstab"),
                 "ENROOT_ENVIRON": os.path.join(tmp, "environment")}
        for f in files.values():
            open(f, "w").close()
        job = tier(self)
        base = {"PATH": os.environ["PATH"], "ENROOT_ROOTFS": rootfs.path("bookworm"), **files,
                "MONARCH_DATASET": "/scratch/ds", "MONARCH_JOB_DIR": job,
                "MONARCH_JOB_DIRS": job, "MONARCH_INTERPOSE_LIB": LIBRARY}
        base.update(env)
        p = subprocess.run([HOOK], env={k: v for k, v in base.items() if v is not None},
                           capture_output=True, text=True, timeout=60)
        written = {}
        for k, path in files.items():
            with open(path) as f:
                written[k] = f.read()
        return p, written

    def test_serves_a_job(self):
        p, written = self.hook(MONARCH_LOG="1")
        self.assertEqual((p.returncode, p.stdout, p.stderr), (0, "", ""))
        self.assertEqual(len(written["ENROOT_MOUNTS"].splitlines()), 2)  # library, job dir
        self.assertIn(f"LD_PRELOAD={LIBRARY}\n", written["ENROOT_ENVIRON"])
        self.assertIn("MONARCH_LOG=1\n", written["ENROOT_ENVIRON"])

    def test_does_nothing_outside_a_job(self):
        for name in ("MONARCH_DATASET", "MONARCH_JOB_DIRS"):
            p, written = self.hook(**{name: None})
            self.assertEqual((p.returncode, p.stdout, p.stderr), (0, "", ""), name)
            self.assertEqual(written, {"ENROOT_MOUNTS": "", "ENROOT_ENVIRON": ""}, name)

    def test_every_fault_is_one_line_and_exit_0(self):
        for env, why in (({"MONARCH_JOB_DIRS": "/nonexistent"}, "not a job directory"),
                         ({"MONARCH_JOB_DIRS": "/tmp/a b"}, "not a job directory"),
                         ({"MONARCH_INTERPOSE_LIB": None}, "is not a readable library"),
                         ({"MONARCH_DATASET": "/d\nLD_PRELOAD=/x"}, "control character"),
                         ({"ENROOT_ROOTFS": "/nonexistent"}, "ENROOT_ROOTFS is not")):
            p, written = self.hook(**env)
            self.assertEqual(p.returncode, 0, env)
            self.assertEqual(len(p.stderr.splitlines()), 1, p.stderr)
            self.assertIn(why, p.stderr)
            self.assertEqual(written["ENROOT_MOUNTS"], "", env)
            self.assertEqual(written["ENROOT_ENVIRON"], "LD_PRELOAD=\n", env)


class Unserved(Case):
    """Images the hook turns Monarch off in, and a musl image it serves: a
    program that prints each file's size and hash (test_musl.py), built
    with musl-gcc, in a root of only that program (and a C library), reads
    the dataset at /data through enroot_start.py and the shipped hook."""

    @classmethod
    def setUpClass(cls):
        cls.dataset = os.path.join(dataset("small", **SMALL), "images")
        cls.tmp = tempfile.mkdtemp(prefix="monarch-unserved-")
        src = os.path.join(cls.tmp, "fnv.c")
        with open(src, "w") as f:
            f.write(PROGRAM)
        cls.programs = {}
        for kind, flags in (("dynamic", []), ("static", ["-static"])):
            cls.programs[kind] = os.path.join(cls.tmp, f"fnv-{kind}")
            subprocess.run(["musl-gcc", "-O2", *flags, "-o", cls.programs[kind], src], check=True)
        names = sorted(os.listdir(os.path.join(cls.dataset, "class_000")))
        cls.files = [os.path.join("/data", "class_000", n) for n in names]
        want = expected([os.path.join(cls.dataset, "class_000", n) for n in names])
        cls.want = want.replace(cls.dataset + "/", "/data/")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def image(self, name, program, files=None):
        """A root with the mount points enroot needs, `program` at /bin/fnv,
        and `files` ({path inside: host file or bytes})."""
        root = os.path.join(self.tmp, name)
        for d in ("bin", "proc", "sys", "dev", "tmp", "run", "etc"):
            os.makedirs(os.path.join(root, d), exist_ok=True)
        shutil.copy(self.programs[program], os.path.join(root, "bin", "fnv"))
        for path, content in (files or {}).items():
            os.makedirs(os.path.dirname(root + path), exist_ok=True)
            if isinstance(content, bytes):
                with open(root + path, "wb") as f:
                    f.write(content)
            else:
                shutil.copy(content, root + path)
        return root

    def run_in(self, root):
        conf = conf_file(self, tier(self), quota="100%", copy_fast_dataset="yes")
        cmd = NAMESPACES + ["/usr/bin/python3", os.path.join(HERE, "enroot_start.py"), root, HOOK,
                            "--mount", f"{self.dataset}:/data:ro", "--", "/bin/fnv"] + self.files
        p = run(cmd, monarch=["--dataset", self.dataset, "--config", conf], timeout=300)
        self.assertEqual(p.stdout, self.want)
        return [line for line in p.stderr.splitlines() if line.startswith("monarch: off")], p

    def test_no_c_library_it_can_tell(self):
        said, p = self.run_in(self.image("static", "static"))
        self.assertEqual(said, ["monarch: off in this container: cannot tell the image's C "
                                "library (no libc.so.6, no musl loader); reading from the PFS"],
                         p.stderr[-2000:])
        print(said[0], flush=True)

    def test_glibc_older_than_2_17(self):
        banner = b"\0GNU C Library (fake) stable release version 2.12, by someone.\0"
        said, p = self.run_in(self.image("old", "static", {"/lib64/libc.so.6": banner}))
        self.assertEqual(said, ["monarch: off in this container: the image's glibc 2.12 is "
                                "older than 2.17; reading from the PFS"], p.stderr[-2000:])
        print(said[0], flush=True)

    def test_musl_is_served_and_the_library_stays_off_by_itself(self):
        loader = os.path.realpath("/lib/ld-musl-x86_64.so.1")  # Debian's musl (musl-tools)
        said, p = self.run_in(self.image("musl", "dynamic", {"/lib/ld-musl-x86_64.so.1": loader}))
        self.assertEqual(said, [], p.stderr[-2000:])
        glibc_only = [line for line in p.stderr.splitlines() if "does not use glibc" in line]
        self.assertEqual(len(glibc_only), 1, p.stderr[-2000:])


class Bullseye(Runtimes, Case):
    suite = "bullseye"  # glibc 2.31


class Bookworm(Runtimes, Case):
    suite = "bookworm"  # glibc 2.36, as the build's


if __name__ == "__main__":
    rootfs.test_main((Bullseye.suite, Bookworm.suite))
