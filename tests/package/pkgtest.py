"""Shared pieces of the package tests: where the build and its packages are,
Slurm's own sbatch run against a private configuration that no daemon
answers (only `--help`, which loads the SPANK plugins and contacts nobody),
man pages rendered by groff, and a sandbox in which apt and dpkg install for
real into overlays of /usr, /etc and /var that nothing else sees. Standard
library only (Debian's /usr/bin/python3)."""
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.environ.get("MONARCH_SOURCE", os.path.dirname(os.path.dirname(HERE)))
BUILD = os.environ.get("MONARCH_BUILD", os.path.join(SRC, "build"))
PREFIX = os.environ.get("MONARCH_PREFIX", "/usr/local")
SLURM_RELEASE = os.environ.get("MONARCH_SLURM_RELEASE", "")
PACKAGES = os.path.join(BUILD, "packages")
SKIP = 77  # CTest SKIP_RETURN_CODE
NODE, PLUGIN = "monarch", "monarch-slurm-plugin"


def skip(why):
    """Exit with the skip code, or fail under contrib/check (MONARCH_STRICT=1),
    where every test can run."""
    print("skipped:", why)
    sys.exit(1 if os.environ.get("MONARCH_STRICT") == "1" else SKIP)


def run(argv, **kw):
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    return subprocess.run(argv, **kw)


def packages(kind):
    """The built packages of one kind ("deb" or "rpm"), by package name."""
    found = {}
    for path in glob.glob(os.path.join(PACKAGES, "*." + kind)):
        name = os.path.basename(path)
        found[re.split(r"_|-\d", name)[0]] = path
    if sorted(found) != [NODE, PLUGIN]:
        sys.exit(f"{PACKAGES}: expected the {kind} of {NODE} and {PLUGIN}, found {sorted(found)}; "
                 f"build them with: cmake --build {BUILD} --target packages")
    return found


def package_paths(deb, kind="-l"):
    """The files and links (kind "-l") or the directories (kind "d") a .deb
    holds, as absolute paths without a trailing slash."""
    listing = run(["dpkg-deb", "--contents", deb], check=True).stdout
    paths = []
    for line in listing.splitlines():
        if line[0] in kind:
            path = line.split()[5].rstrip("/")
            paths.append(path[1:] if path.startswith("./") else path)
    return sorted(paths)


# ---- sbatch against a cluster that does not exist ----

def offline_sbatch(plugstack_lines, args, script=None):
    """Slurm's sbatch with `args`, loading a plugstack.conf of these lines,
    `script` on its standard input. Its slurm.conf names a controller at an
    address nothing listens on: a submission fails ("Unable to contact slurm
    controller") and never reaches a cluster."""
    with tempfile.TemporaryDirectory(prefix="monarch-sbatch-") as workdir:
        conf = os.path.join(workdir, "slurm.conf")
        stack = os.path.join(workdir, "plugstack.conf")
        with open(conf, "w") as f:
            f.write("ClusterName=offline\nSlurmctldHost=offline(127.0.0.254)\nSlurmctldPort=9\n"
                    f"PlugStackConfig={stack}\n")
        with open(stack, "w") as f:
            f.write("".join(line + "\n" for line in plugstack_lines))
        env = dict(os.environ, SLURM_CONF=conf)
        return run(["sbatch", *args], env=env, input=script or "", timeout=120)


def slurm_release():
    """This Slurm's (major, minor), from its sbatch ("slurm-wlm 22.05.8"):
    with a configuration, which Slurm 24.11's asks for even for --version."""
    p = offline_sbatch([], ["--version"])
    m = re.search(r"(\d+)\.(\d+)\.\d+", p.stdout)
    if p.returncode != 0 or not m:
        raise AssertionError(f"sbatch --version exited {p.returncode}: {p.stdout} {p.stderr}")
    return int(m.group(1)), int(m.group(2))


def sbatch_help(plugstack_lines):
    """(stdout, stderr) of `sbatch --help` loading these plugstack lines
    (see offline_sbatch)."""
    p = offline_sbatch(plugstack_lines, ["--help"])
    if p.returncode != 0:
        raise AssertionError(f"sbatch --help exited {p.returncode}: {p.stderr}")
    return p.stdout, p.stderr


def monarch_lines(stderr):
    """The lines the plugin logged ("sbatch: error: monarch: ...")."""
    return [line for line in stderr.splitlines() if "monarch:" in line]


# ---- man pages ----

def render(page, width=300):
    """The man page as plain text (no bold or underline, no hyphenation),
    lines `width` characters wide; raises on any groff warning."""
    p = run(["groff", "-ww", "-man", "-Tascii", "-P-cbou", "-rHY=0", f"-rLL={width}n", page])
    if p.returncode != 0 or p.stderr:
        raise AssertionError(f"groff -ww {page}: exit {p.returncode}: {p.stderr}")
    return p.stdout


def words(text):
    return " ".join(text.split())


def sections(source):
    """{section title: [lines]} of a roff source (the lines after each .SH)."""
    out, title = {}, None
    with open(source) as f:
        for line in f.read().splitlines():
            if line.startswith(".SH "):
                title = line[4:].strip().strip('"')
                out[title] = []
            elif title:
                out[title].append(line)
    return out


def plain(roff_line):
    """A line of roff macros as the words it prints: fonts and quotes dropped."""
    line = re.sub(r"^\.(B|I|BI|IB|BR|RB|IR|RI)\s+", "", roff_line)
    line = re.sub(r"\\f[BIRP]", "", line).replace("\\-", "-").replace('"', "")
    return line


def tags(source, section):
    """The tags of the .TP items of one section of a roff source, as printed."""
    lines = sections(source).get(section)
    if lines is None:
        raise AssertionError(f"{source}: no section {section}")
    return [plain(lines[i + 1]) for i, line in enumerate(lines[:-1]) if line.startswith(".TP")]


def item_text(rendered, section, tag):
    """The words of the item `tag` of `section` in a rendered page."""
    body, inside, item = [], False, False
    for line in rendered.splitlines():
        if line and not line.startswith(" "):
            inside = line.strip() == section
            continue
        if not inside:
            continue
        if re.match(r"^ {7}\S", line):
            item = line.strip().split()[0] == tag
        if item:
            body.append(line)
    if not body:
        raise AssertionError(f"no item {tag} in {section}")
    return words("\n".join(body))


# ---- a sandbox for apt and dpkg ----

SANDBOXED = ("usr", "etc", "var")
# What apt, dpkg and their triggers rewrite for any package: not files of
# Monarch's, and not left by it.
BOOKKEEPING = (
    "/var/lib/dpkg/", "/var/lib/apt/", "/var/cache/", "/var/log/",
    "/etc/ld.so.cache",  # ldconfig, which CPack's maintainer scripts run for /usr/lib
)


class Sandbox:
    """Runs shell scripts in a mount namespace where /usr, /etc and /var are
    overlays over the real ones: apt and dpkg install, upgrade and remove
    for real, and every file they leave shows in the overlays' upper layers,
    while the machine itself never sees a change."""

    def __init__(self):
        self.root = tempfile.mkdtemp(prefix="monarch-sandbox-")
        self.script = os.path.join(self.root, "script.sh")

    def run(self, script, check=True):
        """Runs `script` (bash, `set -e`) in the sandbox; the overlays persist
        from one call to the next."""
        mounts = "\n".join(
            f"mkdir -p {self.root}/{d}-up {self.root}/{d}-work\n"
            f"mount -t overlay overlay -o lowerdir=/{d},upperdir={self.root}/{d}-up,"
            f"workdir={self.root}/{d}-work /{d}" for d in SANDBOXED)
        with open(self.script, "w") as f:
            f.write(f"set -euo pipefail\n{mounts}\nexport DEBIAN_FRONTEND=noninteractive\n"
                    f"{script}\n")
        p = run(["unshare", "--mount", "--propagation", "private", "bash", self.script],
                timeout=600)
        if check and p.returncode != 0:
            raise AssertionError(f"in the sandbox: exit {p.returncode}\n{script}\n"
                                 f"{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
        return p

    def left(self):
        """Files the sandbox has that the machine has not (new or changed,
        directories that already existed left out), as absolute paths."""
        out = []
        for d in SANDBOXED:
            upper = os.path.join(self.root, d + "-up")
            for where, dirs, files in os.walk(upper):
                rel = os.path.relpath(where, upper)
                base = "/" + d + ("" if rel == "." else "/" + rel)
                for name in dirs:
                    if not os.path.isdir(os.path.join(base, name)):
                        out.append(os.path.join(base, name) + "/")
                for name in files:
                    st = os.lstat(os.path.join(where, name))
                    if st.st_rdev == 0 and (st.st_mode & 0o170000) == 0o020000:
                        continue  # a whiteout: a file of the machine removed in the sandbox
                    out.append(os.path.join(base, name))
        return sorted(p for p in out if not p.startswith(BOOKKEEPING))

    def close(self):
        shutil.rmtree(self.root, ignore_errors=True)
