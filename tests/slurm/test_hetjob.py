"""Heterogeneous jobs (issue 8): each component is a job of its own, with
its own id, epilog and nodes. A step of component 1, on the second node,
stages under the key of component 1's job id, and that component's epilog
(on that node) stops that stager and removes that space: the id the stager
uses is the id the epilog cleans, for each component."""
import os

import slurmtest as st

USER = "monarchtest"

SCRIPT = """#!/bin/bash
#SBATCH -p het -w {host} -n1
#SBATCH hetjob
#SBATCH -p het -w {host2} -n1
probe() {{
  {{ echo "node=$SLURMD_NODENAME"; echo "dir=$MONARCH_JOB_DIR"; }} >"$OUT/$1.env"
  ps -o args= -C monarch-stager >"$OUT/$1.stagers"
}}
export OUT=$PWD
export -f probe
probe batch
srun --het-group=1 bash -c 'probe het1'
srun --het-group=0 bash -c 'probe het0'
"""


class HetJob(st.SlurmTest):
    def test_component_ids(self):
        dataset = st.make_dataset("job")
        work = st.workdir(USER, "hetjob")
        script = os.path.join(work, "het.sh")
        with open(script, "w") as f:
            f.write(SCRIPT.format(host=st.HOST, host2=st.HOST2))
        os.chmod(script, 0o755)
        job = st.sbatch(USER, work, [f"--monarch-dataset={dataset}", script])
        st.wait_for(lambda: not st.squeue_has(job), 120, f"het job {job}")
        st.wait_for(lambda: all("comp" not in s for s in st.node_states().values()), 60,
                    "the epilogs")
        for tag, node, key in (("batch", st.HOST, job), ("het0", st.HOST, job),
                               ("het1", st.HOST2, job + 1)):
            env = st.read_env(os.path.join(work, f"{tag}.env"))
            self.assertEqual(env["node"], node, tag)
            self.assertEqual(env["dir"], os.path.join(st.TIERS[0], f"monarch-job{key}"), tag)
            self.assertIn(f"--job job{key} ", st.read(os.path.join(work, f"{tag}.stagers")) + " ",
                          f"{tag}: no stager of job{key}")
        log = st.slurmd_log()
        for key in (job, job + 1):
            self.assertRegex(log, rf"monarch: job{key}: stopped 1 stager\(s\)")
            self.assertRegex(log, rf"monarch: job{key}: epilog done in")
            self.assertNotRegex(log, rf"monarch: job{key}: swept")
            self.assertNoLeftovers(key)


if __name__ == "__main__":
    st.main()
