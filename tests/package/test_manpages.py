#!/usr/bin/python3
"""The man pages against the code: every page renders with `man -l` and
without one groff warning (`groff -ww`); each page lists exactly the options
or keys the code accepts, as the programs themselves say them (their --help,
Slurm's `sbatch --help` with the plugin loaded, the errors that name what is
accepted); and each key of monarch.conf(5) quotes the values the code
accepts in the code's own words. No cluster needed."""
import os
import re
import tempfile
import unittest

from pkgtest import (BUILD, SRC, item_text, monarch_lines, render, run, sbatch_help, sections,
                     tags, words)

PAGES = {
    "monarch-run": "stager/man/monarch-run.1",
    "monarch-report": "stager/man/monarch-report.1",
    "monarch-stager": "stager/man/monarch-stager.8",
    "monarch.conf": "etc/monarch.conf.5",
    "spank_monarch": "spank/spank_monarch.8",
}
PROGRAMS = {name: os.path.join(BUILD, "stager", name)
            for name in ("monarch-run", "monarch-report", "monarch-stager")}
PLUGIN = os.path.join(BUILD, "spank", "spank_monarch.so")


def page(name):
    return os.path.join(SRC, PAGES[name])


def options_in(text):
    """Every option named in `text`: -h, --dataset, --monarch-dataset."""
    return set(re.findall(r"(?<![\w-])(--?[a-z][a-z-]*)", text))


def documented_options(name):
    return set().union(*(options_in(t) for t in tags(page(name), "OPTIONS")))


class Rendering(unittest.TestCase):
    def test_every_page_renders_without_warnings(self):
        for name in PAGES:
            with self.subTest(page=name):
                render(page(name), width=80)  # raises on any warning
                p = run(["man", "--warnings=w", "-l", page(name)],
                        env=dict(os.environ, MANWIDTH="80", MAN_KEEP_STDERR="1"))
                self.assertEqual((p.returncode, p.stderr), (0, ""))
                self.assertIn("NAME", p.stdout)


class Programs(unittest.TestCase):
    """The options of each program, from its own --help."""

    def accepted(self, name):
        p = run([PROGRAMS[name], "--help"], check=True)
        if name == "monarch-report":  # usage lines and "(also -h)"
            return options_in("\n".join(line for line in p.stdout.splitlines()
                                        if "monarch-report" in line))
        # Boost.Program_options: "  -h [ --help ]  ...", "  --dataset arg  ..."
        return set().union(*(options_in(line.split("  ")[1]) for line in p.stdout.splitlines()
                             if line.startswith("  -")))

    def test_each_program_page_lists_exactly_its_options(self):
        for name in PROGRAMS:
            with self.subTest(program=name):
                code = self.accepted(name)
                self.assertGreater(len(code), 3, f"{name} --help parsed badly")
                self.assertEqual(documented_options(name), code,
                                 f"{PAGES[name]} OPTIONS against {name} --help")


class ConfigKeys(unittest.TestCase):
    """The keys of monarch.conf, from the errors of the code that reads it."""

    def error(self, text):
        with tempfile.NamedTemporaryFile("w", suffix=".conf") as f:
            f.write(text)
            f.flush()
            p = run([PROGRAMS["monarch-run"], "--config", f.name, "--dataset", "/tmp", "--", "true"])
        self.assertEqual(p.returncode, 2, p.stderr)
        return p.stderr.strip()

    def accepted_list(self, text):
        m = re.search(r"unknown key; accepted(?: in \[tier\.NAME\])?: (.*)$", self.error(text))
        self.assertTrue(m, text)
        return m.group(1).split(", ")

    def test_the_page_lists_exactly_the_keys_in_the_code_order(self):
        tier = "[tier.t]\npath = /var/tmp\nquota = 1G\n"
        general = self.accepted_list("no_such_key = 1\n" + tier)
        tier_keys = self.accepted_list(tier + "no_such_key = 1\n")
        self.assertEqual(tags(page("monarch.conf"), "GENERAL KEYS"), general)
        self.assertEqual(tags(page("monarch.conf"), "TIER KEYS"), tier_keys)

    def test_the_shipped_configuration_sets_every_key(self):
        # etc/monarch.conf loads (monarch-run goes on to the dataset) and
        # names every key, general and of its tier, once.
        shipped = os.path.join(SRC, "etc", "monarch.conf")
        p = run([PROGRAMS["monarch-run"], "--config", shipped, "--dataset", "/nonexistent",
                 "--", "true"])
        self.assertIn("--dataset /nonexistent", p.stderr)
        with open(shipped) as f:
            keys = [line.split("=")[0].strip() for line in f
                    if "=" in line and not line.lstrip().startswith("#")]
        self.assertEqual(keys, tags(page("monarch.conf"), "GENERAL KEYS") +
                         tags(page("monarch.conf"), "TIER KEYS"))

    def test_each_key_quotes_what_the_code_accepts(self):
        rendered = render(page("monarch.conf"))
        for section in ("GENERAL KEYS", "TIER KEYS"):
            for key in tags(page("monarch.conf"), section):
                with self.subTest(key=key):
                    tier = {"path": "/var/tmp", "quota": "1G"}
                    general = ""
                    if section == "GENERAL KEYS":
                        general = f"{key} = @\n"
                    else:
                        tier[key] = "@"
                    message = self.error(general + "[tier.t]\n" +
                                         "".join(f"{k} = {v}\n" for k, v in tier.items()))
                    m = re.search(r"accepted: (.*)$", message)
                    self.assertTrue(m, message)
                    self.assertIn(f"Accepted: {m.group(1)}.", item_text(rendered, section, key))


class Plugin(unittest.TestCase):
    """The plugin's options as Slurm registers them, and its arguments."""


    def test_options_are_those_sbatch_lists(self):
        out, err = sbatch_help([f"required {PLUGIN}"])
        self.assertEqual(monarch_lines(err), [])
        code = {o for o in options_in(out) if o.startswith("--monarch")}
        self.assertGreaterEqual(len(code), 3, out)
        self.assertEqual(documented_options("spank_monarch"), code)

    def test_plugstack_arguments_are_those_it_accepts(self):
        documented = [t.split("=")[0] for t in tags(page("spank_monarch"), "PLUGSTACK ARGUMENTS")]
        # What it accepts, in its own words: the line for an unknown argument.
        _, err = sbatch_help([f"required {PLUGIN} no_such_argument=1"])
        (line,) = monarch_lines(err)
        m = re.search(r"unknown plugstack argument 'no_such_argument' ignored; accepted: (.*)$",
                      line)
        self.assertTrue(m, line)
        self.assertEqual(documented, [a.split("=")[0] for a in m.group(1).split(", ")])
        # And each documented one is taken as known.
        args = " ".join(f"{a}={'/etc/monarch/monarch.conf' if a == 'config' else 'yes'}"
                        for a in documented)
        _, err = sbatch_help([f"required {PLUGIN} {args}"])
        self.assertEqual(monarch_lines(err), [])


class SeeAlso(unittest.TestCase):
    def test_every_page_is_named_by_the_others(self):
        for name in PAGES:
            others = words("\n".join(sections(page(name))["SEE ALSO"]))
            for other in PAGES:
                if other != name:
                    self.assertIn(f".BR {other} (", others, f"{name}: SEE ALSO lacks {other}")


if __name__ == "__main__":
    unittest.main(verbosity=2)
