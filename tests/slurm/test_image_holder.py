"""A process of the user outside the job cannot keep a job's space after
the job (issue 23, item 6): while a job runs, a process the test starts as
the job's user (not in the job's process tree or cgroups) takes its working
directory in the job's image on one tier and opens a file in its image on
the other. After the job, the tier's free space is back (statvfs, and the
images' backing files, held open by their loop devices, hold no block), the
holder gets errors for what it held, not data, and it was not killed.
The tiers' quotas are 1 GiB here, so that the images stand out from
whatever else the machine writes meanwhile."""
import json
import os
import subprocess

import slurmtest as st

USER = "monarchtest"
QUOTA = 1 << 30
GONE_LIMIT_S = 60

# As the user: cwd in argv[1], a file open in argv[2]; says "held PID", then
# on a line from the test tries them and prints what it got (JSON), then
# waits for its stdin to close.
HOLDER = r"""
import json, os, sys
os.chdir(sys.argv[1])
fd = os.open(os.path.join(sys.argv[2], "held"), os.O_RDONLY)
print("held", os.getpid(), flush=True)
sys.stdin.readline()
got = {}
for what, f in (("read", lambda: os.pread(fd, 16, 0)), ("open", lambda: open("held", "rb").read(16)),
                ("list", lambda: os.listdir("."))):
    try:
        got[what] = "data: %r" % (f(),)
    except OSError as e:
        got[what] = e.errno
print(json.dumps(got), flush=True)
sys.stdin.read()
"""


def holder_config():
    text = st.read(st.CONFIG).replace("quota = 9M", "quota = 1G").replace("quota = 256M",
                                                                          "quota = 1G")
    path = os.path.join(st.ROOT, "holder.conf")
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o644)
    return path


def free_bytes():
    vfs = os.statvfs(st.TIERS[0])
    return vfs.f_bavail * vfs.f_frsize


class ImageHolder(st.SlurmTest):
    def test_holder_outside_the_job(self):
        with st.plugstack_args(f"config={holder_config()}"):
            dataset = st.make_dataset("job")
            work = st.workdir(USER, "image-holder")
            job = st.sbatch(USER, work, [f"--monarch-dataset={dataset}", st.job_script("hold.sh")],
                            extra_env={"JOBS": st.JOBS, "SECOND_TIER": st.TIERS[1]})
            st.wait_for(lambda: os.path.exists(os.path.join(work, "started")), 60,
                        "the job to write into its images")
            # The backing files, held open here to watch their blocks.
            images = [os.open(os.path.join(t, ".monarch", "images", f"job{job}.img"), os.O_RDONLY)
                      for t in st.TIERS]
            holder = None
            try:
                for fd in images:
                    self.assertGreaterEqual(os.fstat(fd).st_blocks * 512, QUOTA * 0.99)
                free_during = free_bytes()
                dirs = [os.path.join(t, f"monarch-job{job}") for t in st.TIERS]
                holder = subprocess.Popen(
                    [st.RUNUSER, "-u", USER, "--", "/usr/bin/python3", "-c", HOLDER] + dirs,
                    cwd="/", env=st.user_env(USER), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                    text=True)
                word, pid = holder.stdout.readline().split()
                self.assertEqual(word, "held")
                open(os.path.join(work, "go"), "w").close()
                self.assertEqual(st.wait_job(job), "COMPLETED")
                st.wait_for(lambda: all(os.fstat(fd).st_blocks == 0 for fd in images),
                            GONE_LIMIT_S, "the images' blocks to come back")
                free_after = free_bytes()
                print(f"free on the tiers: {free_during / 2**30:.2f} GiB during the job, "
                      f"{free_after / 2**30:.2f} GiB after it")
                self.assertGreater(free_after - free_during, 1.5 * QUOTA)
                holder.stdin.write("try\n")
                holder.stdin.flush()
                got = json.loads(holder.stdout.readline())
                print(f"the holder got {got}")
                self.assertIsInstance(got["read"], int, "the held file gave data")
                self.assertIsInstance(got["open"], int, "a file in the held directory gave data")
                self.assertNotIn("\nState:\tZ", st.read(f"/proc/{pid}/status"))
                self.assertIsNone(holder.poll(), "the holder was killed")
                self.assertNoLeftovers(job)
            finally:
                for fd in images:
                    os.close(fd)
                if holder:
                    holder.stdin.close()
                    holder.wait(timeout=30)
            st.assert_clean(self)


if __name__ == "__main__":
    st.main()
