#!/usr/bin/python3
"""Fixture of the package tests and the Slurm tests: builds the packages
(`cmake --build BUILD --target packages`, two cpack runs) into
BUILD/packages. Packages come only from a build configured for /usr (the
programs find each other at compiled-in paths): another build skips."""
import os

from pkgtest import BUILD, PREFIX, SLURM_RELEASE, packages, run, skip

if PREFIX != "/usr":
    skip(f"the build is configured for {PREFIX}: packages need -DCMAKE_INSTALL_PREFIX=/usr "
         "(contrib/check configures it so)")
if not SLURM_RELEASE:
    skip("no slurm/spank.h (Debian: libslurm-dev): no plugin, no packages")
p = run(["cmake", "--build", BUILD, "--target", "packages"])
if p.returncode != 0:
    raise SystemExit(f"cmake --build {BUILD} --target packages failed:\n{p.stdout[-4000:]}"
                     f"\n{p.stderr[-4000:]}")
for kind in ("deb", "rpm"):
    for name, path in sorted(packages(kind).items()):
        print(f"built {os.path.basename(path)} ({os.path.getsize(path)} bytes)")
