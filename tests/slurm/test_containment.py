"""What Monarch starts for a job stays inside the job (issue 8, finding 3),
on a cluster that confines jobs with cgroups (proctrack/cgroup,
task/cgroup: cores, memory, devices), as many sites run: the stager lives
in the job's own cgroup ("monarch" below job_<ID>) in every hierarchy
Slurm made for the job, so its memory is charged to the job; it has the
job's file limit, not slurmstepd's; oom_score_adj 0; a task of the same
user cannot ptrace it (strace -p: Operation not permitted); and when the
job ends the stager, its cgroup and the job's cgroup are gone."""
import glob
import os

import slurmtest as st

USER = "monarchtest"
NOFILE = 1234  # the user's soft limit at submission: Slurm propagates it


def cgroup_paths(pid):
    """{controllers: path} of /proc/PID/cgroup."""
    out = {}
    for line in st.read(f"/proc/{pid}/cgroup").splitlines():
        _, controllers, path = line.split(":", 2)
        out[controllers] = path
    return out


def soft_limit(pid, name):
    for line in st.read(f"/proc/{pid}/limits").splitlines():
        if line.startswith(name):
            return int(line[len(name):].split()[0])
    raise AssertionError(f"no {name} in /proc/{pid}/limits")


class Containment(st.SlurmTest):
    def test_stager_inside_the_job(self):
        dataset = st.make_dataset("job")
        with st.plugstack_args(st.DEFAULT_PLUGSTACK_ARGS, env={"MONARCH_CLUSTER_CGROUP": "1"}):
            work = st.workdir(USER, "contain")
            r = st.run_as(USER, ["bash", "-c", f'ulimit -Sn {NOFILE}; exec sbatch --parsable '
                                 f'--monarch-dataset={dataset} {st.job_script("contain.sh")}'],
                          cwd=work, extra_env={"JOBS": st.JOBS})
            self.assertEqual(r.returncode, 0, r.stderr)
            job = int(r.stdout.strip())
            st.wait_for(lambda: os.path.exists(os.path.join(work, "probed")), 60, "the probe")
            pid = int(st.read(os.path.join(work, "stager.pid")))
            paths = cgroup_paths(pid)
            leaves = {c: p for c, p in paths.items() if p.endswith(f"/job_{job}/monarch")}
            # The stager is in the job's cgroup in every hierarchy where
            # Slurm made one for the job (cpuset, devices and freezer on
            # every release here; memory where Slurm made it: Slurm 24.11
            # made none on this machine, see the README's Slurm releases).
            for controller in ("memory", "cpuset", "devices", "freezer"):
                made = glob.glob(os.path.join(st.CGROUP_ROOT, controller, "**", f"job_{job}"),
                                 recursive=True)
                if not made and controller == "memory":
                    print(f"the job has no {controller} cgroup: the stager cannot be in it")
                    continue
                self.assertIn(controller, leaves, f"the stager is not in the job's {controller} "
                                                  f"cgroup: {paths}; the job's cgroups there: "
                                                  f"{made}")
            if "memory" in leaves:
                memory = os.path.join(st.CGROUP_ROOT, "memory") + leaves["memory"]
                self.assertIn(str(pid), st.read(os.path.join(memory, "cgroup.procs")).split())
                self.assertGreater(int(st.read(os.path.join(memory, "memory.usage_in_bytes"))),
                                   0, "the stager's memory is not charged to the job")
            self.assertEqual(st.read(f"/proc/{pid}/oom_score_adj").strip(), "0")
            self.assertEqual(int(st.read(os.path.join(work, "task.nofile"))), NOFILE)
            self.assertEqual(soft_limit(pid, "Max open files"), NOFILE)
            err = st.read(os.path.join(work, "strace.err"))
            self.assertIn("Operation not permitted", err, "a task could ptrace the stager")
            open(os.path.join(work, "go"), "w").close()
            self.assertEqual(st.wait_job(job), "COMPLETED")
            st.assert_clean(self)
            self.assertEqual(glob.glob(os.path.join(st.CGROUP_ROOT, "*", "*", "uid_*",
                                                    f"job_{job}")), [],
                             "the job's cgroups are still there")
            # The epilog read the leaf's charge before it killed it: the
            # memory peak of the stager and the report, in MiB.
            peak = [line for line in st.slurmd_log().splitlines()
                    if f"job{job}: the job's Monarch cgroup" in line and "used at most" in line]
            self.assertEqual(len(peak), 1 if "memory" in leaves else 0,
                             "the epilog's memory peak line, where the leaf has memory")
            if peak:
                self.assertGreater(int(peak[0].split("used at most ")[1].split()[0]), 0, peak[0])
            stats = st.report_json(work, job)
            self.assertGreater(st.stager_counter(stats, "copies"), 0)


if __name__ == "__main__":
    st.main()
