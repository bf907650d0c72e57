#!/usr/bin/python3
"""`apptainer exec --cleanenv` for the tests (Apptainer is not packaged for
Debian 12): run as root in new mount and PID namespaces (`unshare --mount
--pid --fork --propagation private`). Its rules, from Apptainer's sources:
  - environment (internal/pkg/util/env/create.go): with --cleanenv no host
    variable passes but APPTAINERENV_X, which sets X (SINGULARITYENV_X too,
    where no APPTAINERENV_X sets it); LANG=C, HOME and PATH are Apptainer's;
  - binds (cmd/internal/cli/action_flags.go, pkg/cmdline/flag.go):
    APPTAINER_BINDPATH (else SINGULARITY_BINDPATH), comma-separated
    src[:dest[:opts]], added to --bind's; by default $HOME, /tmp, /var/tmp,
    $PWD, /proc, /sys, /dev; a destination missing in the image is made in an
    overlay ("enable overlay", apptainer.conf): here an overlay on the cached
    root, so that nothing lands in the cache.
Usage: apptainer_exec.py ROOT [--bind SPEC]... -- COMMAND..."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rootfs import create, mount, overlay_root  # noqa: E402

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PREFIXES = ("APPTAINERENV_", "SINGULARITYENV_")


def bind(root, spec):
    source, dest, opts = (spec.split(":") + [None, None])[:3]
    inside = root + (dest or source)
    create(inside, not os.path.isdir(source))
    mount("--rbind", source, inside)
    if opts == "ro":
        mount("-o", "remount,bind,ro", inside)


def main():
    root_image = sys.argv[1]
    args = sys.argv[2:]
    binds = []
    while args[0] != "--":
        assert args[0] == "--bind", args
        binds += args[1].split(",")
        args = args[2:]
    command = args[1:]
    host = dict(os.environ)
    bindpath = host.get("APPTAINER_BINDPATH", host.get("SINGULARITY_BINDPATH", ""))
    binds += [b for b in bindpath.split(",") if b.strip()]

    _, root = overlay_root(root_image, "monarch-apptainer-")
    home = host.get("HOME", "/root")
    defaults = [home, "/tmp", "/var/tmp", os.getcwd()]
    for spec in [d for d in dict.fromkeys(defaults) if os.path.isdir(d)] + binds:
        bind(root, spec)

    env = {"LANG": "C"}
    for prefix in reversed(PREFIXES):  # APPTAINERENV_ wins over SINGULARITYENV_
        env.update({k[len(prefix):]: v for k, v in host.items()
                    if k.startswith(prefix) and len(k) > len(prefix)})
    env.update(HOME=home, PATH=DEFAULT_PATH)
    os.chroot(root)
    os.chdir("/")
    os.execve(command[0], command, env)


if __name__ == "__main__":
    main()
