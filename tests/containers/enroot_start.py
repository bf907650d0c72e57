#!/usr/bin/python3
"""`enroot start` as pyxis runs it, for the tests (enroot is not packaged for
Debian): run as root in new mount and PID namespaces (`unshare --mount --pid
--fork --propagation private`). Facts from enroot's sources (src/runtime.sh,
conf/mounts/10-system.fstab, bin/common.h) and pyxis's (pyxis_slurmstepd.c):
  - the root file system is the user's writable copy of the image: here an
    overlay on the cached root, so that nothing lands in the cache;
  - 10-system.fstab: /proc (new: a PID namespace), /sys and /dev bound,
    tmpfs on /tmp and /run (mode 755), /dev/shm bound;
  - the hooks (hooks.d/*.sh) run with the job's environment less LD_PRELOAD
    (pyxis passes no LD_PRELOAD to enroot) plus ENROOT_ROOTFS, ENROOT_MOUNTS
    (a new, empty fstab) and ENROOT_ENVIRON (the image's /etc/environment);
    a hook that exits non-zero aborts the start;
  - the hooks' fstab lines are mounted after them, then the user's
    --container-mounts;
  - the command gets only the environment file's variables (clearenv(), then
    each NAME=value line, the last of a name winning), PATH by default.
Usage: enroot_start.py ROOT HOOK [--mount SRC:DST[:ro]]... -- COMMAND..."""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rootfs import create, mount, overlay_root  # noqa: E402

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def fstab_line(root, line):
    """One fstab line of a hook (SOURCE TARGET TYPE OPTIONS), mounted as
    enroot-mount does for the options Monarch's hook writes."""
    source, target, _, options = line.split()[:4]
    opts = options.split(",")
    inside = root + target
    create(inside, "x-create=file" in opts)
    mount("--rbind" if "rbind" in opts else "--bind", source, inside)
    if "ro" in opts:
        mount("-o", "remount,bind,ro", inside)


def main():
    root_image, hook = sys.argv[1], sys.argv[2]
    args = sys.argv[3:]
    binds = []
    while args[0] != "--":
        assert args[0] == "--mount", args
        binds.append(args[1])
        args = args[2:]
    command = args[1:]

    # 10-system.fstab, with ENROOT_UNSHARE_PID's new /proc.
    work, root = overlay_root(root_image, "monarch-enroot-")
    os.mkdir(os.path.join(work, "run"))
    mount("-t", "tmpfs", "-o", "mode=755", "tmpfs", root + "/tmp")
    mount("-t", "tmpfs", "-o", "mode=755", "tmpfs", root + "/run")

    environ = os.path.join(work, "run", "environment")
    fstab = os.path.join(work, "run", "fstab")
    image_env = os.path.join(root, "etc", "environment")
    with open(environ, "w") as f:
        if os.path.isfile(image_env):
            with open(image_env) as image:
                f.write(image.read())
    open(fstab, "w").close()
    hook_env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    hook_env.update(ENROOT_ROOTFS=root, ENROOT_MOUNTS=fstab, ENROOT_ENVIRON=environ)
    p = subprocess.run([hook], env=hook_env)
    if p.returncode != 0:
        sys.exit(f"enroot: {hook} exited with return code {p.returncode}")
    with open(fstab) as f:
        for line in f:
            if line.strip() and not line.startswith("#"):
                fstab_line(root, line)
    for b in binds:  # --container-mounts
        source, target, *ro = b.split(":")
        fstab_line(root, f"{source} {target} none x-create="
                   f"{'dir' if os.path.isdir(source) else 'file'},bind{',ro' if ro else ''}")

    env = {}
    with open(environ) as f:
        for line in f:
            name, eq, value = line.rstrip("\n").partition("=")
            if eq and name.isidentifier():
                env[name] = value
    env.setdefault("PATH", DEFAULT_PATH)
    os.chroot(root)
    os.chdir("/")
    os.execve(command[0], command, env)


if __name__ == "__main__":
    main()
