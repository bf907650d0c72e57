#!/usr/bin/python3
"""Install, upgrade, remove and purge the packages with apt and dpkg, for
real, in a sandbox (pkgtest.Sandbox: overlays of /usr, /etc and /var that
only this test sees, so whatever is left shows): installing adds only the
packages' files; a run of monarch-run in between leaves nothing; upgrading
while no job runs keeps the admin's configuration; removing leaves only the
configuration files, and purging leaves nothing at all. Runs as root."""
import glob
import os
import shutil
import tempfile
import unittest

from pkgtest import (BUILD, NODE, PLUGIN, Sandbox, package_paths, packages, run)

VERSION = os.environ["MONARCH_PACKAGE_VERSION"]  # 0.1.0-1
CONFFILES = ["/etc/monarch/monarch.conf", "/etc/slurm/plugstack.conf.d/monarch.conf"]


def upgrade_packages(directory):
    """The same packages one release later (cpack with the release raised)."""
    for package in ("node", "slurm"):
        p = run(["cpack", "--config", os.path.join(BUILD, "CPackConfig.cmake"), "-G", "DEB",
                 "-D", f"MONARCH_PACKAGE={package}", "-D", "CPACK_MONARCH_RELEASE=99",
                 "-D", f"CPACK_PACKAGE_DIRECTORY={directory}"], cwd=BUILD)
        if p.returncode != 0:
            raise AssertionError(f"cpack {package}: {p.stdout[-3000:]} {p.stderr[-3000:]}")
    return sorted(glob.glob(os.path.join(directory, "*.deb")))


def apt(*args):
    return "apt-get -y -q -o Dpkg::Use-Pty=0 " + " ".join(args) + " >/dev/null"


def status(names):
    """`name version status` lines of dpkg's database, "-" for unknown packages."""
    return (f"for p in {' '.join(names)}; do dpkg-query -W -f='${{Package}} ${{Version}} "
            f"${{db:Status-Abbrev}}\\n' $p 2>/dev/null || echo \"$p -\"; done")


class Lifecycle(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.debs = packages("deb")
        cls.paths = sorted(p for deb in cls.debs.values() for p in package_paths(deb))
        cls.dirs = sorted({p for deb in cls.debs.values() for p in package_paths(deb, "d")})
        cls.tmp = tempfile.mkdtemp(prefix="monarch-lifecycle-")
        cls.newer = upgrade_packages(os.path.join(cls.tmp, "newer"))
        cls.sandbox = Sandbox()
        # Start from a machine without Monarch, whatever this one has.
        cls.sandbox.run(f"dpkg --purge {PLUGIN} {NODE} >/dev/null 2>&1")

    @classmethod
    def tearDownClass(cls):
        cls.sandbox.close()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def exists(self, paths):
        """The paths that exist in the sandbox."""
        listing = os.path.join(self.sandbox.root, "paths")
        with open(listing, "w") as f:
            f.write("\n".join(paths) + "\n")
        p = self.sandbox.run(f"while read -r p; do [[ -e $p || -L $p ]] && echo \"$p\"; "
                             f"done < {listing}; true")
        return p.stdout.split()

    def test_install_run_upgrade_remove_purge(self):
        s = self.sandbox
        left_before = s.left()  # the purge above, if Monarch was installed here
        s.run(apt("install", *self.debs.values()))
        installed = s.run(status([NODE, PLUGIN])).stdout.split()
        self.assertEqual(installed[:3], [NODE, VERSION, "ii"])
        self.assertEqual(installed[3], PLUGIN)
        self.assertTrue(installed[4].startswith(VERSION + "+slurm"), installed)
        # Installing adds the packages' files and directories, nothing else.
        new_dirs = [d for d in self.dirs if not os.path.isdir(d)]
        self.assertEqual(sorted(set(s.left()) - set(left_before)),
                         sorted(self.paths + [d + "/" for d in new_dirs]))
        # man finds every page where the packages put them (MANPATH: a copy
        # installed from source under /usr/local would be found first).
        self.assertEqual(
            s.run("MANPATH=/usr/share/man man -w monarch-run monarch-report monarch-stager "
                  "monarch.conf spank_monarch").stdout.split(),
            ["/usr/share/man/man1/monarch-run.1.gz", "/usr/share/man/man1/monarch-report.1.gz",
             "/usr/share/man/man8/monarch-stager.8.gz", "/usr/share/man/man5/monarch.conf.5.gz",
             "/usr/share/man/man8/spank_monarch.8.gz"])

        # A run of monarch-run, as a user would, from the installed programs.
        s.run("mkdir -p /var/tmp/monarch-lifecycle-data /var/tmp/monarch-lifecycle-tier\n"
              "seq 100000 > /var/tmp/monarch-lifecycle-data/a\n"
              "/usr/bin/monarch-run -q --dataset /var/tmp/monarch-lifecycle-data "
              "--tier /var/tmp/monarch-lifecycle-tier:10M -- "
              "cat /var/tmp/monarch-lifecycle-data/a >/dev/null\n"
              "# monarch-run deletes its copies in the background: rmdir fails unless\n"
              "# the deletion ends, and leaves the tier empty.\n"
              "for i in $(seq 100); do rmdir /var/tmp/monarch-lifecycle-tier 2>/dev/null && break;"
              " sleep 0.1; done\n"
              "test ! -e /var/tmp/monarch-lifecycle-tier\n"
              "rm -r /var/tmp/monarch-lifecycle-data")

        # The admin edits both configuration files, then upgrades between jobs.
        edit = "# edited by the site"
        s.run("\n".join(f"echo '{edit}' >> {c}" for c in CONFFILES))
        s.run(apt("install", *self.newer))
        upgraded = s.run(status([NODE, PLUGIN])).stdout.split()
        self.assertEqual(upgraded[1], VERSION.rsplit("-", 1)[0] + "-99")
        for conf in CONFFILES:
            self.assertEqual(s.run(f"tail -n 1 {conf}").stdout.strip(), edit, conf)
        self.assertEqual(s.run("ls /etc/monarch /etc/slurm/plugstack.conf.d").stdout.count(
            "dpkg-"), 0, "no .dpkg-new or .dpkg-dist beside the configuration")

        # Remove: only the (edited) configuration files stay, as dpkg keeps them.
        s.run(apt("remove", NODE, PLUGIN))
        self.assertEqual(self.exists(self.paths), CONFFILES)
        self.assertEqual(s.run(status([NODE, PLUGIN])).stdout.split()[2], "rc")
        # Purge: nothing.
        s.run(apt("purge", NODE, PLUGIN))
        self.assertEqual(self.exists(self.paths), [])
        self.assertEqual(sorted(set(s.left()) - set(left_before)), [])


if __name__ == "__main__":
    unittest.main(verbosity=2)
