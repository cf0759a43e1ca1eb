#!/usr/bin/env python3
"""The folders' dependency direction, checked. ALLOWED below is the one map: docs/design-notes.md's
table ("uses") must say the same, and meson.build must link each folder's library with every folder
it may include (its dependencies' closure). Then every `#include "folder/..."` in a folder's
sources must name the folder itself or one it may use (docs/design-notes.md has the map). And
record/ owns a run's directory (record/run_dir.h) and journal: no other folder compares an event's name
as a string or spells the name of a run's
journal, results or submitted record, in code or comment. And a training mode is asked what it
does (workflow/kinds.h: RanksShareModels, HasGroups, ...; switches there), never compared with
== or != outside workflow/kinds.cc (kAuto, "not yet resolved", excepted); nor is a launcher's
kind outside launch/. The service starts no process itself (orchestrator::Runs does). Exits 1 naming each include that goes
the wrong way and each such name. Usage: check_layers.py SOURCE_ROOT"""
import pathlib
import re
import sys

# folder -> the folders its code may include (besides itself)
ALLOWED = {
    "common": set(),
    "nam": {"common"},
    "kernels": {"common"},
    "workflow": {"common", "nam", "kernels"},
    "ranking": {"common", "kernels", "workflow"},
    "parallel": {"common", "kernels", "workflow"},
    "modules": {"common", "nam", "kernels", "workflow", "parallel"},
    "inference": {"common", "nam", "kernels", "workflow", "modules", "record"},
    "launch": {"common", "nam", "workflow"},
    "record": {"common", "workflow", "launch"},
    "orchestrator": {"common", "nam", "kernels", "workflow", "ranking", "launch", "record"},
    "report": {"common", "workflow", "record", "orchestrator"},
    "simulate": {"common", "workflow", "record"},
    "service": {"common", "kernels", "workflow", "launch", "record", "orchestrator", "report", "inference"},
    "cli": {"common", "nam", "kernels", "workflow", "ranking", "parallel", "modules", "launch", "record", "orchestrator",
            "report", "service", "inference", "simulate"},
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([a-z_]+)/', re.M)
# The run directory's files whose names only record/ spells.
RUN_FILES = re.compile(r"journal\.jsonl|results\.json|submitted\.json")
# A journal event's name compared as a string (readers switch on record::EventKind).
EVENT_NAME_COMPARED = re.compile(r"\.event\s*[!=]=\s*\"|\"[a-z0-9]+(?:-[a-z]+)+\"\s*[!=]=\s*[\w.]*\.event\b")
# A resolved training mode compared, either way round.
MODE = r"(?:workflow::)?TrainMode::k(?:Independent|Sync|Async|Hybrid)\b"
MODE_COMPARED = re.compile(rf"[!=]=\s*{MODE}|{MODE}\s*[!=]=")
# The rounds' strategy is workflow::Strategy; its name is compared nowhere.
STRATEGY_COMPARED = re.compile(r"strategy\s*[!=]=\s*\"")
# Nor a backbone's kind (workflow::BackboneKind).
BACKBONE_KIND_COMPARED = re.compile(r"kind_?\s*[!=]=\s*\"(?:pixels|onnx)\"")
# Nor a precision (kernels::Precision).
PRECISION_COMPARED = re.compile(r"precision\s*[!=]=\s*\"")
# Nor a Slurm mode (workflow::SlurmMode).
SLURM_MODE_COMPARED = re.compile(r"\"(?:hetjob|chained|single)\"\s*[!=]=|[!=]=\s*\"(?:hetjob|chained|single)\"")
# Nor a step by its name (workflow::Step; the dataset split "train" is not a step).
STEP_NAMES = r"\"(?:load|prepare|train|store|evaluate|select)\""
STEP_COMPARED = re.compile(rf"\bstep\w*\s*[!=]=\s*{STEP_NAMES}|{STEP_NAMES}\s*[!=]=\s*[\w.]*step\w*\b")
# A NAM backend's own header: the folders that read a run's objects (the service, inference)
# open the NAM by URI (nam/store.h) and ask record/ where a run's NAM is, not a backend.
NAM_BACKEND = re.compile(r'^\s*#\s*include\s+"nam/(file_store|fabric_store|mem_store|fault_store|recording_store|server)\.h"',
                         re.M)
NO_NAM_BACKENDS = ("service", "inference")
# The service starts a run's coordinator through the run library (orchestrator::Runs), never by
# a process or an msaflow command line of its own.
OWN_PROCESS = re.compile(r"ChildProcess::Start\b|msaflow_exe\s*,\s*\"")
NO_OWN_PROCESSES = ("service",)
# The launcher's kind is asked what it can do (workflow::OnThisHost, Launcher's methods), never
# compared, outside launch/ and its definition's home (workflow/machine.cc).
LAUNCHER_COMPARED = re.compile(r"[!=]=\s*(?:workflow::)?LauncherKind::k\w+|(?:workflow::)?LauncherKind::k\w+\s*[!=]=|"
                               r"launcher\s*[!=]=\s*\"(?:local|slurm)\"")


# (what is looked for, in which sources (folder, path), what the finding says)
RULES = [
    (RUN_FILES, lambda folder, rel: folder != "record",
     lambda folder, m: f"spells the run file {m.group(0)}: ask record/run_dir.h for it (its path, or the file read)"),
    (EVENT_NAME_COMPARED, lambda folder, rel: folder != "record",
     lambda folder, m: f"compares a journal event's name ({m.group(0).strip()}): compare its record::EventKind"),
    (NAM_BACKEND, lambda folder, rel: folder in NO_NAM_BACKENDS,
     lambda folder, m: f"{folder}/ includes the NAM backend nam/{m.group(1)}.h: open the NAM by URI (nam/store.h)"),
    (OWN_PROCESS, lambda folder, rel: folder in NO_OWN_PROCESSES,
     lambda folder, m: f"{folder}/ starts a process itself ({m.group(0)}): start a run's coordinator through "
                       "orchestrator::Runs (StartCoordinator)"),
    (LAUNCHER_COMPARED, lambda folder, rel: folder != "launch" and rel != "workflow/machine.cc",
     lambda folder, m: f"compares a launcher kind ({m.group(0).strip()}): ask what it can do (workflow::OnThisHost, "
                       "the Launcher's methods)"),
    (STRATEGY_COMPARED, lambda folder, rel: True,
     lambda folder, m: f"compares the strategy by name ({m.group(0).strip()}): compare workflow::Strategy"),
    (BACKBONE_KIND_COMPARED, lambda folder, rel: True,
     lambda folder, m: f"compares a backbone's kind by name ({m.group(0).strip()}): compare workflow::BackboneKind"),
    (PRECISION_COMPARED, lambda folder, rel: True,
     lambda folder, m: f"compares a precision by name ({m.group(0).strip()}): compare kernels::Precision"),
    (SLURM_MODE_COMPARED, lambda folder, rel: True,
     lambda folder, m: f"compares a Slurm mode by name ({m.group(0).strip()}): compare workflow::SlurmMode"),
    (STEP_COMPARED, lambda folder, rel: True,
     lambda folder, m: f"compares a step by name ({m.group(0).strip()}): compare workflow::Step"),
    (MODE_COMPARED, lambda folder, rel: rel != "workflow/kinds.cc",
     lambda folder, m: f"compares a training mode ({m.group(0).strip()}): ask workflow/kinds.h what it does "
                       "(RanksShareModels, HasGroups, ...) or switch on it"),
]


def meson_links(root: pathlib.Path) -> dict:
    """folder -> the folders its library links with in meson.build (through dependencies, transitively)."""
    text = (root / "meson.build").read_text()
    direct = {}
    for folder in ALLOWED:
        deps = set()
        for pattern in (rf"^{folder}_lib = static_library\((.*?\n\)[^\n]*)", rf"^{folder}_dep = declare_dependency\((.*?)\)\n"):
            m = re.search(pattern, text, re.M | re.S)
            if m:
                body = m.group(1)
                for lst in re.findall(r"\b(\w+_deps)\b", body):  # a list variable: its own items
                    d = re.search(rf"^{lst} = \[([^\]]*)\]", text, re.M)
                    body += d.group(1) if d else ""
                deps |= {f for f in re.findall(r"\b(\w+)_dep\b", body) if f in ALLOWED and f != folder}
        direct[folder] = deps
    closure = {}
    for folder in ALLOWED:
        seen, todo = set(), list(direct[folder])
        while todo:
            f = todo.pop()
            if f not in seen:
                seen.add(f)
                todo += direct.get(f, [])
        closure[folder] = seen
    return closure


def docs_uses(root: pathlib.Path) -> dict:
    """folder -> the folders docs/design-notes.md's map says it uses."""
    out = {}
    for line in (root / "docs/design-notes.md").read_text().splitlines():
        m = re.match(r"^\| `([a-z_]+)/` \|.*\| ([^|]*) \|$", line)
        if not m:
            continue
        cell = re.sub(r"\([^)]*\)", "", m.group(2)).strip()
        if cell == "everything below":
            out[m.group(1)] = set(ALLOWED) - {m.group(1)}
        else:
            out[m.group(1)] = {w.strip() for w in cell.split(",") if w.strip() not in ("", "—")}
    return out


def check_map(root: pathlib.Path) -> list:
    bad = []
    if (root / "meson.build").exists():
        links = meson_links(root)
        for folder, allowed in ALLOWED.items():
            if folder == "cli":
                continue  # the executable, linked with core_dep: everything
            missing = allowed - links[folder]
            if missing:
                bad.append(f"meson.build: msaflow_{folder} may include {', '.join(sorted(missing))} (ALLOWED) but does "
                           "not link with it: add the dependency, or take it out of ALLOWED")
    if (root / "docs/design-notes.md").exists():
        uses = docs_uses(root)
        for folder, allowed in ALLOWED.items():
            if folder not in uses:
                bad.append(f"docs/design-notes.md: the map has no row for {folder}/")
            elif uses[folder] != allowed:
                bad.append(f"docs/design-notes.md: the map says {folder}/ uses {', '.join(sorted(uses[folder])) or 'nothing'}; "
                           f"scripts/check_layers.py's ALLOWED says {', '.join(sorted(allowed)) or 'nothing'}")
        for folder in sorted(set(uses) - set(ALLOWED)):
            bad.append(f"docs/design-notes.md: the map has a row for {folder}/, which ALLOWED does not place")
    return bad


def main() -> int:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    bad = []
    for folder, allowed in ALLOWED.items():
        for path in sorted((root / folder).rglob("*")):
            if path.suffix not in (".h", ".cc"):
                continue
            text = path.read_text(errors="replace")
            for m in INCLUDE.finditer(text):
                target = m.group(1)
                if target != folder and target in ALLOWED and target not in allowed:
                    line = text.count("\n", 0, m.start()) + 1
                    bad.append(f"{path.relative_to(root)}:{line}: {folder}/ includes {target}/ "
                               f"(it may use {', '.join(sorted(allowed)) or 'nothing else'})")
            rel = path.relative_to(root).as_posix()
            for pattern, applies, says in RULES:
                if applies(folder, rel):
                    for m in pattern.finditer(text):
                        line = text.count("\n", 0, m.start()) + 1
                        bad.append(f"{rel}:{line}: {says(folder, m)}")
    unknown = sorted(p.name for p in root.iterdir()
                     if p.is_dir() and p.name not in ALLOWED and any(p.glob("*.cc"))
                     and p.name not in ("tests", "bench", "fuzz"))
    for u in unknown:
        bad.append(f"{u}/: a folder of C++ sources that scripts/check_layers.py does not place; add it to ALLOWED")
    bad += check_map(root)
    for b in bad:
        print(b)
    print(f"layers: {len(bad)} finding(s)" if bad else "layers: every include follows the direction, which meson.build links and "
          "docs/design-notes.md's map states; only record/ names a run's files; no training "
          "mode or launcher kind compared; no NAM backend in service/ or inference/; no process the service "
          "starts itself")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
