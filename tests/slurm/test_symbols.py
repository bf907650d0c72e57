"""The plugin exports only what Slurm looks up, and every other symbol it
needs resolves: a symbol left undefined (e.g. a C function declared
without C linkage) only shows when slurmstepd loads the plugin, as a failed
epilog that drains the node. No cluster needed. Usage: test_symbols.py SO"""
import subprocess
import sys

so = sys.argv[1]
exported = subprocess.run(["nm", "-D", "--defined-only", so], capture_output=True, text=True,
                          check=True).stdout.split()
names = sorted(w for w in exported if not w.isupper() and len(w) > 1 and not w[0].isdigit())
bad = [n for n in names if not (n.startswith("slurm_spank_") or n.startswith("plugin_")
                                or n == "spank_plugin_version")]
assert not bad, f"exported beyond slurm_spank_* and plugin_*: {bad}"
for needed in ("plugin_name", "plugin_type", "plugin_version", "spank_plugin_version",
               "slurm_spank_init", "slurm_spank_job_epilog"):
    assert needed in names, f"{needed} is not exported"
# ldd -r: the only undefined symbols may be Slurm's own (slurmstepd, srun... provide them).
r = subprocess.run(["ldd", "-r", so], capture_output=True, text=True)
undefined = [line.split()[2] for line in (r.stdout + r.stderr).splitlines()
             if line.startswith("undefined symbol:")]
bad = [u for u in undefined if not (u.startswith("slurm_") or u.startswith("spank_"))]
assert not bad, f"undefined symbols outside Slurm's API: {bad}"
print(f"ok: exports {names}; leaves {len(undefined)} Slurm symbols to the host")
