#!/usr/bin/python3
"""A plugin built for another Slurm release, loaded by this one, says so in
one log line and does nothing more; the plugin built for this release says
nothing. Slurm's own sbatch loads both (`sbatch --help`, which contacts no
controller). Usage: test_slurm_release.py PLUGIN FOREIGN_PLUGIN, FOREIGN
built claiming the next major release (tests/package/CMakeLists.txt)."""
import sys
import unittest

from pkgtest import monarch_lines, offline_sbatch, sbatch_help, slurm_release

SCRIPT = "#!/bin/sh\ntrue\n"
REFUSED = "sbatch: error: monarch: --monarch-dataset=/nonexistent: no such directory"
UNREACHABLE = "Unable to contact slurm controller"

PLUGIN, FOREIGN = sys.argv[1], sys.argv[2]


class Release(unittest.TestCase):

    def test_the_plugin_of_this_release_says_nothing(self):
        out, err = sbatch_help([f"required {PLUGIN}"])
        self.assertEqual(monarch_lines(err), [])
        self.assertIn("--monarch-dataset=DIR", out)
        # It checks the options: a missing dataset is refused before submission.
        p = offline_sbatch([f"required {PLUGIN}"], ["--monarch-dataset=/nonexistent"],
                           SCRIPT)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn(REFUSED, p.stderr)
        self.assertNotIn(UNREACHABLE, p.stderr)

    def test_a_plugin_of_another_release_says_so_once_and_stays_off(self):
        major, minor = slurm_release()
        running, built = f"{major}.{minor:02d}", f"{major + 1}.{minor:02d}"
        out, err = sbatch_help([f"required {FOREIGN}"])
        self.assertEqual(monarch_lines(err), [
            f"sbatch: error: monarch: built for Slurm {built} but loaded by Slurm {running}: "
            f"Monarch is off on this host; install the Monarch Slurm plugin built for {running}"])
        # Off, as with enabled=no: the options stay, so jobs that ask for
        # Monarch are accepted (and run without it): the same missing dataset
        # goes on to the submission, which finds no controller here.
        self.assertIn("--monarch-dataset=DIR", out)
        p = offline_sbatch([f"required {FOREIGN}"], ["--monarch-dataset=/nonexistent"],
                           SCRIPT)
        self.assertNotIn(REFUSED, p.stderr)
        self.assertIn(UNREACHABLE, p.stderr)
        self.assertEqual(len(monarch_lines(p.stderr)), 1, p.stderr)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
