"""A job whose tasks enter containers the way pyxis has enroot start them,
with the hook and the plugin the packages installed (issue 24): in a Debian
12 root, a 3-epoch reader of the dataset bound at /data gets the right bytes
and epochs 2-3 never reach the PFS; in an image the hook cannot serve (a
static program, no C library it can tell) the program runs to the right
result, with one line in its output saying why."""
import hashlib
import json
import os
import shutil
import subprocess
import sys

import slurmtest as st

CONTAINERS = os.path.join(st.SRC, "tests", "containers")
sys.path.insert(0, CONTAINERS)
sys.path.insert(0, os.path.join(st.SRC, "tests", "engine"))
import rootfs  # noqa: E402
from harness import READER  # noqa: E402
from test_musl import PROGRAM, expected  # noqa: E402

USER = "monarchtest"


def md5(path):
    with open(path, "rb") as f:
        return hashlib.md5(f.read()).hexdigest()


class Containers(st.SlurmTest):
    def test_tasks_in_containers(self):
        if not os.path.exists(rootfs.path("bookworm") + ".stamp"):
            self.skipTest("no Debian 12 root: run tests/containers/rootfs.py")
        if not os.path.exists(st.PFSEMU):
            self.skipTest("no monarch-pfsemu in the build tree")
        source = st.make_dataset("containers")
        files = st.dataset_files(source)
        pfs = st.Pfs()
        self.addCleanup(pfs.close)
        dataset = pfs.dataset("containers")
        # The images as `enroot create` leaves them: the user's own copies.
        image = os.path.join(st.ROOT, "bookworm-image")
        shutil.rmtree(image, ignore_errors=True)
        self.addCleanup(shutil.rmtree, image, True)
        subprocess.run(["cp", "-a", rootfs.path("bookworm"), image], check=True)
        # The unserved image: a static musl program alone.
        unserved = os.path.join(st.ROOT, "unserved-image")
        shutil.rmtree(unserved, ignore_errors=True)
        self.addCleanup(shutil.rmtree, unserved, True)
        for d in ("bin", "proc", "sys", "dev", "tmp", "run", "etc"):
            os.makedirs(os.path.join(unserved, d), mode=0o755)
        with open(os.path.join(st.ROOT, "fnv.c"), "w") as f:
            f.write(PROGRAM)
        subprocess.run(["musl-gcc", "-O2", "-static", "-o", os.path.join(unserved, "bin", "fnv"),
                        os.path.join(st.ROOT, "fnv.c")], check=True)
        for d in (image, unserved):
            subprocess.run(["chown", "-R", f"{USER}:", d], check=True)
        few = files[:4]
        inside = [p.replace(source, "/data") for p in few]

        work = st.workdir(USER, "containers")
        before = pfs.counts()
        job = st.sbatch(USER, work, [f"--monarch-dataset={dataset}",
                                     os.path.join(st.JOBS, "container.sh")],
                        extra_env={"DS": dataset, "JOBS": st.JOBS, "CONTAINERS": CONTAINERS,
                                   "ROOT": image, "UNSERVED": unserved,
                                   "READER": READER, "COUNTS": os.path.join(pfs.mount,
                                                                           ".pfsemu-counts"),
                                   "FILES": " ".join(inside)})
        self.assertEqual(st.wait_job(job), "COMPLETED")
        out = lambda name: st.read(os.path.join(work, name))  # noqa: E731

        # Served: the right bytes every epoch, epochs 2-3 not from the PFS.
        self.assertEqual(out("served.rc").strip(), "0", out("served.err"))
        epochs = [json.loads(x) for x in out("served.out").splitlines() if x.startswith("{")]
        self.assertEqual(len(epochs), 3, out("served.err"))
        want = {os.path.relpath(p, source): md5(p) for p in files}
        for e in epochs:
            self.assertEqual(e["files"], want, f"epoch {e['epoch']}")
        snaps = [before] + [e["pfs"] for e in epochs]
        d = [{k: snaps[i + 1][k] - snaps[i][k] for k in ("opens", "reads", "bytes")}
             for i in range(3)]
        print(f"PFS opens, reads, bytes by epoch in the container: "
              f"{[(x['opens'], x['reads'], x['bytes']) for x in d]}", flush=True)
        self.assertGreater(d[0]["opens"], 0, "epoch 1 read the PFS (the test would be vacuous)")
        for e in (1, 2):
            self.assertEqual((d[e]["opens"], d[e]["reads"]), (0, 0),
                             f"epoch {e + 1} reached the PFS\n{out('served.err')}")
        self.assertNotIn("monarch: off", out("served.err"))

        # Unserved: the right output, one line saying why.
        self.assertEqual(out("unserved.rc").strip(), "0", out("unserved.err"))
        self.assertEqual(out("unserved.out"),
                         expected(few).replace(source + "/", "/data/"))
        said = [x for x in out("unserved.err").splitlines() if x.startswith("monarch:")]
        self.assertEqual(said, ["monarch: off in this container: cannot tell the image's C "
                                "library (no libc.so.6, no musl loader); reading from the PFS"],
                         out("unserved.err"))


if __name__ == "__main__":
    st.main()
