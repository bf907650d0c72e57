"""Holds the built preload library to what lets it load into any userland a
job brings (interpose/CMakeLists.txt says why each rule):
  - no glibc symbol version above the floor (the loader refuses a library
    that needs one its libc lacks: every program of the job exits 1);
  - no library needed but libc.so.6 and libdl.so.2 (musl's loader answers
    those names itself; any other one it cannot find makes every musl
    program exit 127);
  - exports exactly the wrappers of wrappers.def.
Runs after each link of the library (with --remove: a library that fails is
removed, so that the next build links and checks it again) and as a test.
A sanitizer build's library (--sanitized: a test build, never packaged) may
need the sanitizers' runtimes and libm, which the compiler links in with them.
Usage: check_library.py [--remove] [--sanitized] LIBRARY WRAPPERS_DEF FLOOR"""
import os
import re
import subprocess
import sys

ALLOWED_NEEDED = {"libc.so.6", "libdl.so.2"}
SANITIZER_NEEDED = re.compile(r"lib(asan|ubsan|tsan)\.so\.\d+|libm\.so\.6")


def version_key(v):
    return tuple(int(x) for x in v.split("."))


def main():
    args = sys.argv[1:]
    flags = {a for a in args if a.startswith("--")}
    remove = "--remove" in flags
    sanitized = "--sanitized" in flags
    lib, wrappers_def, floor = [a for a in args if not a.startswith("--")]
    problems = []

    # The versions the loader checks: the library's version references.
    dump = subprocess.run(["objdump", "-p", lib], capture_output=True, text=True,
                          check=True).stdout
    needed = re.findall(r"^\s+NEEDED\s+(\S+)$", dump, re.M)
    versions = set(re.findall(r"^\s+0x[0-9a-f]+ 0x[0-9a-f]+ \d+ GLIBC_([0-9.]+)$", dump, re.M))
    above = sorted((v for v in versions if version_key(v) > version_key(floor)), key=version_key)
    if above:
        symbols = subprocess.run(["objdump", "-T", lib], capture_output=True, text=True,
                                 check=True).stdout
        for v in above:
            users = sorted(set(re.findall(r"\(GLIBC_%s\)\s+(\S+)$" % re.escape(v), symbols, re.M)))
            problems.append(f"needs GLIBC_{v} (above the floor GLIBC_{floor}) for "
                            f"{', '.join(users) or 'an unnamed symbol'}")
    other = sorted(n for n in set(needed) - ALLOWED_NEEDED
                   if not (sanitized and SANITIZER_NEEDED.fullmatch(n)))
    if other:
        problems.append(f"needs {', '.join(other)}: only {', '.join(sorted(ALLOWED_NEEDED))} "
                        f"may be needed")

    # Exports: exactly the wrappers (MONARCH_OPEN names its function first,
    # the other kinds second, after the return type).
    text = open(wrappers_def).read()
    wrappers = set(re.findall(r"^MONARCH_OPEN\((\w+),", text, re.M))
    wrappers |= set(re.findall(r"^MONARCH_(?:WRAP|VARIADIC|READ|ON_FD)\([^,]+,\s*(\w+),", text,
                               re.M))
    defined = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True,
                             check=True).stdout
    exported = {line.split()[2].split("@")[0] for line in defined.splitlines()
                if len(line.split()) == 3}
    if exported - wrappers:
        problems.append(f"exports what wrappers.def does not wrap: "
                        f"{', '.join(sorted(exported - wrappers))}")
    if wrappers - exported:
        problems.append(f"does not export wrappers of wrappers.def: "
                        f"{', '.join(sorted(wrappers - exported))}")

    if problems:
        for p in problems:
            print(f"check_library: {lib}: {p}", file=sys.stderr)
        if remove:
            os.unlink(lib)
        sys.exit(1)
    top = max(versions, key=version_key) if versions else "none"
    print(f"check_library: ok: {len(exported)} wrappers exported; needs {', '.join(needed)}; "
          f"highest glibc version GLIBC_{top} (floor GLIBC_{floor})")


main()
