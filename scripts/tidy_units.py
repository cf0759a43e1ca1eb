"""Writes the translation units scripts/tidy.sh gives clang-tidy: one per folder (per set of
compile flags), each including that folder's sources, so the headers they share (the standard
library, nlohmann::json, oneDNN, Open MPI) are parsed and matched once per folder, not once per
file: about a quarter of the time of one unit per source (issue 47). The findings are the same:
clang-tidy reports into an included .cc as into a header, which tidy.sh's header filter admits.

    tidy_units.py BUILD_DIR FILE_REGEX   writes BUILD_DIR/tidy-units/{u*.cc,compile_commands.json}
"""
import collections
import json
import os
import re
import sys


def main():
    build, pattern = sys.argv[1], re.compile(sys.argv[2])
    out = os.path.abspath(os.path.join(build, "tidy-units"))
    os.makedirs(out, exist_ok=True)
    for old in os.listdir(out):
        os.unlink(os.path.join(out, old))
    groups = collections.OrderedDict()
    for e in json.load(open(os.path.join(build, "compile_commands.json"))):
        path = os.path.normpath(os.path.join(e["directory"], e["file"]))
        if not pattern.search(path):
            continue
        # The flags, less what names this file (its output, dependency file and source).
        flags = re.sub(r" -MD -MQ \S+ -MF \S+ -o \S+ -c \S+$", "", e["command"])
        if flags == e["command"]:
            sys.exit(f"tidy_units: cannot read the compile command of {path}")
        groups.setdefault((e["directory"], flags, os.path.dirname(path)), []).append(path)
    entries = []
    for i, ((directory, flags, folder), files) in enumerate(groups.items()):
        unit = os.path.join(out, f"u{i}-{os.path.basename(folder)}.cc")
        with open(unit, "w") as f:
            f.writelines(f'#include "{p}"  // NOLINT(bugprone-suspicious-include)\n' for p in files)
        entries.append({"directory": directory, "command": f"{flags} -c {unit}", "file": unit})
    json.dump(entries, open(os.path.join(out, "compile_commands.json"), "w"), indent=1)
    print(f"{sum(len(v) for v in groups.values())} files in {len(entries)} units")


main()
