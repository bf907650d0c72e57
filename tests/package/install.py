#!/usr/bin/python3
"""Installs the build as a site would, for the Slurm tests: the packages
with apt (`apt-get install ./*.deb`, reinstalled if the same version is
there) when the build is configured for /usr and they were built (fixture
package.build), else `cmake --install` (a source build under /usr/local).
Usage: install.py BUILD_DIR"""
import glob
import os
import subprocess
import sys

build = sys.argv[1]
debs = sorted(glob.glob(os.path.join(build, "packages", "*.deb")))
if os.environ.get("MONARCH_PREFIX") == "/usr":
    if not debs:
        sys.exit(f"install: no packages in {build}/packages: build them with "
                 f"cmake --build {build} --target packages")
    subprocess.run(["apt-get", "install", "-y", "-q", "--reinstall", "--allow-downgrades",
                    *[os.path.abspath(d) for d in debs]], check=True, stdout=subprocess.DEVNULL,
                   env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
    print("installed", " ".join(os.path.basename(d) for d in debs))
else:
    subprocess.run(["cmake", "--install", build], check=True, stdout=subprocess.DEVNULL)
    print("installed with cmake --install", build)
