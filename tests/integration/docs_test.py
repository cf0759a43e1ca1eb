"""Docs that stay true: docs/cli.md's command table names exactly the commands `msaflow --help`
and `msaflow nam --help` list, with the options each command's --help offers; and every
repository path the sources and docs mention (`folder/file.ext`) exists.
Usage: docs_test.py MSAFLOW SOURCE_ROOT"""
import pathlib
import re
import subprocess
import sys
import unittest

MSAFLOW, ROOT = sys.argv[1], pathlib.Path(sys.argv[2])


def subcommands(*words):
    out = subprocess.run([MSAFLOW, *words, "--help"], capture_output=True, text=True, check=True).stdout
    names, inside = set(), False
    for line in out.splitlines():
        if line.startswith("Subcommands:"):
            inside = True
            continue
        if inside:
            m = re.match(r"^  ([a-z-]+)\s", line)
            if m:
                names.add(m.group(1))
            elif line.strip() and not line.startswith("  "):
                inside = False
    return names


def options(*words):
    out = subprocess.run([MSAFLOW, *words, "--help"], capture_output=True, text=True, check=True).stdout
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", out)) - {"--help"}


GROUPS = ("nam", "users")  # commands of commands: a row per `nam serve`, `users add`, ...


def table_rows():
    rows = {}
    text = (ROOT / "docs/cli.md").read_text()
    for m in re.finditer(r"^\| `([a-z][^`]*)` \|", text, re.M):
        words = m.group(1).split()
        key = " ".join(words[:2]) if words[0] in GROUPS else words[0]
        rows[key] = m.group(1)
    return rows


class CliTable(unittest.TestCase):
    def test_the_table_names_every_command_and_no_other(self):
        rows = table_rows()
        listed = {k for k in rows if k.split()[0] not in GROUPS} | set(GROUPS)
        self.assertEqual(listed, subcommands(), "docs/cli.md's table against `msaflow --help`")
        for group in GROUPS:
            self.assertEqual({k.split()[1] for k in rows if k.split()[0] == group}, subcommands(group),
                             f"docs/cli.md's {group} rows against `msaflow {group} --help`")

    def test_every_option_a_command_takes_is_in_its_row(self):
        for key, row in table_rows().items():
            if key == "module":  # its options are the launchers' business (--task only)
                continue
            shown = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", row))
            missing = options(*key.split()) - shown
            # The nam client commands share --nam, --json and such; each row names what it takes.
            self.assertFalse(missing, f"docs/cli.md's row for `{key}` lacks {sorted(missing)}")


PATH = re.compile(r"(?<![\w./-])((?:cli|common|nam|kernels|workflow|ranking|parallel|modules|launch|record|orchestrator|"
                  r"report|service|simulate|inference|configs|pipelines|scripts|tests|bench|fuzz|docs)/[\w./-]*\w\.(?:h|cc|py|sh|md|json|cl|build))")


class Paths(unittest.TestCase):
    def test_every_path_mentioned_exists(self):
        missing = []
        files = [p for p in ROOT.rglob("*") if p.suffix in (".h", ".cc", ".py", ".sh", ".md") and p.is_file()
                 and not any(part.startswith(("build", ".")) or part in ("data", "models", "runs", "node_modules")
                             for part in p.relative_to(ROOT).parts)]
        for f in files:
            for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
                for m in PATH.finditer(line):
                    path = m.group(1)
                    if "*" in path or "<" in path or path.startswith("tests/fixtures"):
                        continue
                    if not (ROOT / path).exists() and not (f.parent / path).exists():
                        missing.append(f"{f.relative_to(ROOT)}:{n}: {path}")
        self.assertFalse(missing, "paths that do not exist:\n" + "\n".join(missing))


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
