#!/usr/bin/python3
"""The packages as built (fixture package.build): what each .deb holds, its
version, dependencies and configuration files, read back with dpkg-deb;
lintian finds no error; the plugstack.conf drop-in enables nothing as
shipped and loads the plugin in Slurm's sbatch once uncommented; the man
pages are their sources; the .rpm lists the same files (rpm -qlp) and
rpmlint finds no error but the missing signature; and `cmake --install`
installs what the packages hold. No cluster needed."""
import gzip
import os
import re
import shutil
import tempfile
import unittest

import pkgtest
from pkgtest import (BUILD, NODE, PLUGIN, SRC, monarch_lines, package_paths, packages, run,
                     sbatch_help)

VERSION = os.environ["MONARCH_PACKAGE_VERSION"]  # 0.1.0-1
MAN = "/usr/share/man/"
FILES = {
    NODE: ["/etc/enroot/hooks.d/90-monarch.sh", "/etc/monarch/monarch.conf", "/usr/bin/monarch-report", "/usr/bin/monarch-run",
           "/usr/bin/monarch-stager", "/usr/lib/monarch/libmonarch_interpose.so",
           "/usr/lib/monarch/libmonarch_jobwide.so",
           "/usr/libexec/monarch/enroot-hook.sh", "/usr/libexec/monarch/monarch-purge",
           "/usr/share/doc/monarch/changelog.Debian.gz", "/usr/share/doc/monarch/copyright",
           MAN + "man1/monarch-report.1.gz", MAN + "man1/monarch-run.1.gz",
           MAN + "man5/monarch.conf.5.gz", MAN + "man8/monarch-stager.8.gz"],
    PLUGIN: ["/etc/slurm/plugstack.conf.d/monarch.conf", "/usr/lib/monarch/spank_monarch.so",
             "/usr/share/doc/monarch-slurm-plugin/changelog.Debian.gz",
             "/usr/share/doc/monarch-slurm-plugin/copyright", MAN + "man8/spank_monarch.8.gz"],
}
CONFFILES = {NODE: ["/etc/monarch/monarch.conf"],
             PLUGIN: ["/etc/slurm/plugstack.conf.d/monarch.conf"]}
MAN_SOURCES = {"monarch-run.1": "stager/man/monarch-run.1",
               "monarch-report.1": "stager/man/monarch-report.1",
               "monarch-stager.8": "stager/man/monarch-stager.8",
               "monarch.conf.5": "etc/monarch.conf.5", "spank_monarch.8": "spank/spank_monarch.8"}


def slurm_release():
    """The Slurm here, major.minor and the next minor."""
    major, minor = pkgtest.slurm_release()
    return f"{major}.{minor:02d}", f"{major}.{minor + 1:02d}"


def field(deb, name):
    return run(["dpkg-deb", "--field", deb, name], check=True).stdout.strip()


class Deb(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.debs = packages("deb")
        cls.root = tempfile.mkdtemp(prefix="monarch-debs-")
        for deb in cls.debs.values():  # both packages into one root, as apt would
            run(["dpkg-deb", "--extract", deb, cls.root], check=True)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.root, ignore_errors=True)

    def test_each_package_holds_its_part(self):
        for name, deb in self.debs.items():
            self.assertEqual(package_paths(deb), sorted(FILES[name]), name)

    def test_versions_and_dependencies_carry_the_slurm_release(self):
        release, following = slurm_release()
        self.assertEqual(field(self.debs[NODE], "Version"), VERSION)
        self.assertEqual(field(self.debs[PLUGIN], "Version"), f"{VERSION}+slurm{release}")
        depends = [d.strip() for d in field(self.debs[PLUGIN], "Depends").split(",")]
        for wanted in (f"monarch (= {VERSION})", f"slurm-wlm-basic-plugins (>= {release})",
                       f"slurm-wlm-basic-plugins (<< {following})"):
            self.assertIn(wanted, depends)
        # What the release bounds admit, by dpkg's own comparison.
        installed = run(["dpkg-query", "-W", "-f=${Version}", "slurm-wlm-basic-plugins"],
                        check=True).stdout
        for relation, bound in (("ge", release), ("lt", following)):
            self.assertEqual(run(["dpkg", "--compare-versions", installed, relation, bound])
                             .returncode, 0, f"the installed Slurm {installed} {relation} {bound}")

    def test_configuration_files_are_conffiles(self):
        for name, deb in self.debs.items():
            control = tempfile.mkdtemp(prefix="monarch-control-")
            self.addCleanup(shutil.rmtree, control, True)
            run(["dpkg-deb", "--control", deb, control], check=True)
            with open(os.path.join(control, "conffiles")) as f:
                self.assertEqual(f.read().split(), CONFFILES[name])

    def test_the_drop_in_enables_nothing_until_uncommented(self):
        drop_in = os.path.join(self.root, "etc/slurm/plugstack.conf.d/monarch.conf")
        with open(drop_in) as f:
            text = f.read()
        lines = [line for line in text.splitlines() if line.strip()]
        self.assertTrue(all(line.startswith("#") for line in lines), text)
        include = [f"include {os.path.dirname(drop_in)}/*.conf"]
        out, err = sbatch_help(include)  # as installed: Slurm sees no plugin
        self.assertNotIn("--monarch-dataset", out)
        self.assertEqual(monarch_lines(err), [])
        (line,) = [x for x in lines if x.startswith("#required ")]  # one line to uncomment
        enabled = line[1:].replace(" /usr/", f" {self.root}/usr/").replace("=/etc/",
                                                                            f"={self.root}/etc/")
        with open(drop_in, "w") as f:
            f.write(text.replace(line, enabled))
        out, err = sbatch_help(include)
        self.assertIn("--monarch-dataset=DIR", out)
        self.assertEqual(monarch_lines(err), [])

    def test_man_pages_are_their_one_source(self):
        for page, source in MAN_SOURCES.items():
            section = page.rsplit(".", 1)[1]
            with gzip.open(os.path.join(self.root, f"usr/share/man/man{section}/{page}.gz")) as f:
                installed = f.read()
            with open(os.path.join(SRC, source), "rb") as f:
                self.assertEqual(installed, f.read(), page)

    def test_the_stager_needs_ucx_only_in_its_module(self):
        """A single-node stager starts without UCX and libcrypto: only the
        module a multi-node job loads (jobwide_load.h) needs them."""
        def needed(rel):
            out = run(["readelf", "-d", os.path.join(self.root, rel)], check=True).stdout
            return re.findall(r"\(NEEDED\)\s+Shared library: \[(\S+)\]", out)
        stager, module = needed("usr/bin/monarch-stager"), needed(
            "usr/lib/monarch/libmonarch_jobwide.so")
        for lib in ("libucp", "libucs", "libcrypto"):
            self.assertFalse([n for n in stager if n.startswith(lib)], stager)
            self.assertTrue([n for n in module if n.startswith(lib)], module)
        # ... and the package still depends on them (dpkg-shlibdeps reads the module).
        depends = field(self.debs[NODE], "Depends")
        for package in ("libucx0", "libssl3"):
            self.assertIn(package, depends)

    def test_lintian_finds_no_error(self):
        p = run(["lintian", "--tag-display-limit", "0", *self.debs.values()])
        errors = [line for line in p.stdout.splitlines() if line.startswith("E:")]
        self.assertEqual(errors, [], p.stdout)
        self.assertNotIn("exited with status", p.stderr)
        print("lintian:", p.stdout.strip() or "clean", flush=True)


class Rpm(unittest.TestCase):
    def test_rpms_list_the_same_files_and_depend_on_the_release(self):
        release, following = slurm_release()
        rpms, debs = packages("rpm"), packages("deb")
        for name, rpm in rpms.items():
            listed = run(["rpm", "-qp", "--qf", "[%{FILENAMES} %{FILEMODES:perms}\n]", rpm],
                         check=True).stdout.split("\n")
            files = sorted(line.split()[0] for line in listed
                           if line and not line.split()[1].startswith("d")
                           and "/.build-id/" not in line)  # rpmbuild's debug links
            self.assertEqual(files, package_paths(debs[name]), name)
            config = run(["rpm", "-qcp", rpm], check=True).stdout.split()
            self.assertEqual(config, CONFFILES[name])
        version = run(["rpm", "-qp", "--qf", "%{VERSION}-%{RELEASE}", rpms[PLUGIN]],
                      check=True).stdout
        self.assertEqual(version, f"{VERSION}.slurm{release}")
        requires = run(["rpm", "-qp", "--requires", rpms[PLUGIN]], check=True).stdout
        for wanted in (f"monarch = {VERSION}", f"slurm >= {release}", f"slurm < {following}"):
            self.assertIn(wanted, requires.splitlines())

    def test_rpmlint_finds_no_error_but_the_signature(self):
        # Signing is the site repository's step (rpmsign with its key).
        config = tempfile.NamedTemporaryFile("w", suffix=".toml")
        config.write('CompressExtension = "gz"\n')  # man pages as Fedora and RHEL have them
        # Slurm's commands and Monarch's daemon are words of their own (rpmlint
        # 2.7, Debian 13's, spell-checks the summary and description).
        config.write('Filters = ["spelling-error \\\\(\'(sbatch|srun|salloc|stager|plugstack)\'"]\n')
        config.flush()
        p = run(["rpmlint", "-c", config.name, *packages("rpm").values()])
        errors = [line for line in p.stdout.splitlines()
                  if ": E: " in line and not line.endswith(": E: no-signature")]
        self.assertEqual(errors, [], p.stdout)
        self.assertIn("packages and 0 specfiles checked", p.stdout)


class SourceRoute(unittest.TestCase):
    def test_cmake_install_installs_what_the_packages_hold(self):
        destdir = tempfile.mkdtemp(prefix="monarch-destdir-")
        self.addCleanup(shutil.rmtree, destdir, True)
        run(["cmake", "--install", BUILD], env=dict(os.environ, DESTDIR=destdir), check=True)
        installed = sorted("/" + os.path.relpath(os.path.join(d, n), destdir)
                           for d, _, names in os.walk(destdir) for n in names)
        packaged = sorted(p for deb in packages("deb").values() for p in package_paths(deb)
                          if not p.startswith("/usr/share/doc/"))  # the packages' own
        self.assertEqual(installed, packaged)


if __name__ == "__main__":
    unittest.main(verbosity=2)
