"""A non-root user's batch job with --monarch-dataset reads the dataset for
3 epochs in the batch step and in a nested `srun -n2` step: the bytes are
those of a direct read, exactly one stager ran on the node, as that user
(real, effective, saved and file-system ids, groups), the tasks had the
library appended to their own LD_PRELOAD, the report is in the working
directory and the user's, the stager really copied and the reads were
served from the tiers; after the job nothing of it is left."""
import glob
import os
import pwd

import slurmtest as st

USER = "monarchtest"
EPOCHS = 3
USER_PRELOAD = "/lib/x86_64-linux-gnu/libm.so.6"  # harmless, and must be kept


def pfs_traffic_check(test, pfs, before, files):
    """The PFS (a counting FUSE mount) served each file's bytes once, over
    3 epochs of 3 tasks: the stager's copies and the readers' hand-offs of
    small files, nothing twice. Without Monarch it would be 9 times."""
    if pfs is None:
        print("note: no monarch-pfsemu in the build tree: PFS traffic not measured")
        return
    after = pfs.counts()
    size = sum(os.path.getsize(p) for p in files)
    served = after["bytes"] - before["bytes"]
    print(f"PFS: {served} bytes served for a dataset of {size} bytes, read 9 times")
    test.assertGreaterEqual(served, size, "the PFS served less than the dataset")
    test.assertLessEqual(served, size * 1.02, f"the PFS served {served} bytes for {size}")
    test.assertLessEqual(after["opens"] - before["opens"], len(files) * 2)


class Job(st.SlurmTest):
    def test_batch_and_nested_steps(self):
        pw = pwd.getpwnam(USER)
        groups = sorted(os.getgrouplist(USER, pw.pw_gid))
        source = st.make_dataset("job")
        files = st.dataset_files(source)
        pfs = st.Pfs() if os.path.exists(st.PFSEMU) else None
        if pfs:
            self.addCleanup(pfs.close)
        dataset = pfs.dataset("job") if pfs else source
        reference = st.reference_md5(source).replace(source, dataset)
        before = pfs.counts() if pfs else None
        work = st.workdir(USER, "job")
        job = st.sbatch(USER, work, [f"--monarch-dataset={dataset}", st.job_script("read_epochs.sh")],
                        extra_env={"DS": dataset, "EPOCHS": str(EPOCHS), "JOBS": st.JOBS,
                                   "LD_PRELOAD": USER_PRELOAD})
        watch = st.StagerWatch(job)
        watch.start()
        try:
            state = st.wait_job(job)
        finally:
            watch.stop()
        out = st.read(os.path.join(work, f"slurm-{job}.out"))
        self.assertEqual(state, "COMPLETED", out)
        self.assertNotIn("monarch: disabled", out)

        # The bytes: every epoch of every task reads what a direct read gives.
        tags = ["batch", "step.0", "step.1"]
        for tag in tags:
            for e in range(1, EPOCHS + 1):
                with open(os.path.join(work, f"{tag}.epoch{e}.md5")) as f:
                    self.assertEqual(f.read(), reference, f"{tag} epoch {e} read other bytes")

        # The tasks' environment: the user's LD_PRELOAD kept, the library once.
        for tag in tags:
            env = st.read_env(os.path.join(work, f"{tag}.env"))
            self.assertEqual(env.get("LD_PRELOAD"), f"{USER_PRELOAD}:{st.LIBRARY}", tag)
            self.assertEqual(env.get("MONARCH_DATASET"), dataset, tag)
            self.assertEqual(env.get("MONARCH_JOB_DIR"),
                             os.path.join(st.TIERS[0], f"monarch-job{job}"), tag)
            self.assertNotIn("MONARCH_LOG", env, tag)
            # What a container needs (README "Containers"), Apptainer's too.
            dirs = [os.path.join(t, f"monarch-job{job}") for t in st.TIERS]
            self.assertEqual(env.get("MONARCH_JOB_DIRS"), ":".join(dirs), tag)
            self.assertEqual(env.get("MONARCH_INTERPOSE_LIB"), st.LIBRARY, tag)
            self.assertEqual(env.get("APPTAINERENV_LD_PRELOAD"), st.LIBRARY, tag)
            self.assertEqual(env.get("APPTAINERENV_MONARCH_JOB_DIRS"), ":".join(dirs), tag)
            self.assertEqual(env.get("APPTAINER_BINDPATH"), ",".join([st.LIBRARY] + dirs), tag)
            self.assertEqual(st.read(os.path.join(work, f"{tag}.uid")).strip(),
                             str(pw.pw_uid))

        # One stager, as the user, seen by each task and by the watch.
        for tag in tags:
            lines = st.read(os.path.join(work, f"{tag}.stagers")).splitlines()
            self.assertEqual(len(lines), 1, f"{tag} saw {len(lines)} stagers: {lines}")
            ids = [int(x) for x in lines[0].split()[:8]]
            self.assertEqual(ids, [pw.pw_uid] * 4 + [pw.pw_gid] * 4, f"{tag}: {lines[0]}")
        self.assertGreater(watch.samples, 5)
        self.assertEqual(watch.max_count, 1, f"stagers at once: {watch.max_count}")
        self.assertEqual(len(watch.seen), 1, f"stagers started: {list(watch.seen.values())}")
        stager = next(iter(watch.seen.values()))
        self.assertEqual(stager["uids"], [pw.pw_uid] * 4)
        self.assertEqual(stager["gids"], [pw.pw_gid] * 4)
        self.assertEqual(sorted(stager["groups"]), groups)
        self.assertIn(dataset, stager["argv"])
        # Detached: its own session, nobody's child, no terminal, no job output.
        self.assertEqual(stager["stdio"], ["/dev/null"] * 3)
        self.assertEqual(stager["sid"], stager["pgid"])
        self.assertNotEqual(stager["sid"], os.getsid(int(st.read(st.SLURMD_PID))))

        # The report, the user's, from a stager that really copied.
        report = os.path.join(work, f"monarch-job{job}.json")
        self.assertTrue(os.path.exists(report), f"no report in {work}")
        for path in glob.glob(os.path.join(work, f"monarch-job{job}.*")):
            self.assertEqual(os.stat(path).st_uid, pw.pw_uid, f"{path} is not the user's")
        if os.path.exists(st.REPORT):
            for ext in ("txt", "svg"):
                self.assertTrue(os.path.exists(os.path.join(work, f"monarch-job{job}.{ext}")))
        stats = st.report_json(work, job)
        self.assertTrue(stats["complete"], "the stager did not stop cleanly")
        self.assertEqual(stats["user"], USER)
        self.assertEqual(stats["index"]["files"], len(files))
        self.assertGreater(st.stager_counter(stats, "copies"), 0)
        self.assertEqual(stats["cached"]["files"], len(files))
        # Both tiers were used (the first is too small for the dataset).
        self.assertGreater(stats["tiers"][0]["used"], 0)
        self.assertGreater(stats["tiers"][1]["used"], 0)
        # The reads went through the library and were answered from the tiers.
        totals = stats["totals"]
        self.assertGreaterEqual(totals["opens"], len(files) * EPOCHS * len(tags))
        self.assertGreater(sum(totals["tier_bytes"]), 0)
        pfs_traffic_check(self, pfs, before, files)

        self.assertNoLeftovers(job)
        self.assertEqual(st.node_state(), "idle")

    def test_example_job(self):
        """contrib/slurm/example-job.sh, as the user would submit it."""
        dataset = st.make_dataset("job")
        work = st.workdir(USER, "example")
        example = os.path.join(st.SRC, "contrib", "slurm", "example-job.sh")
        job = st.sbatch(USER, work, [f"--monarch-dataset={dataset}", example])
        self.assertEqual(st.wait_job(job), "COMPLETED")
        out = st.read(os.path.join(work, f"slurm-{job}.out"))
        size = sum(os.path.getsize(p) for p in st.dataset_files(dataset))
        self.assertIn(f"epoch 3: {size} bytes", out)
        sums = {line.split()[-2] for line in out.splitlines() if line.startswith("rank ")}
        self.assertEqual(len(sums), 1, out)
        stats = st.report_json(work, job)
        self.assertGreater(sum(stats["totals"]["tier_bytes"]), 0)
        self.assertNoLeftovers(job)


if __name__ == "__main__":
    st.main()
