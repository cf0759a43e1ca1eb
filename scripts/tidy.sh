#!/usr/bin/env bash
# clang-tidy (.clang-tidy's checks) over every source of the libraries and the CLI, with the
# compile commands of a build directory (default build-test). Any finding fails it; CI runs it
# (scripts/test.sh). Each folder's sources are read as one unit (scripts/tidy_units.py): about
# 2 minutes on 2 cores, against 7 for one unit per source. So two sources of one folder may not
# both define a name in an anonymous namespace (clang reports "redefinition of").
#   scripts/tidy.sh [BUILD_DIR] [FILE-REGEX]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/packages.sh
# clang-tidy parses as clang: its own omp.h (the code includes it) is libomp-14-dev's, not GCC's.
ensure_packages clang-tidy libomp-14-dev
build=${1:-build-test}
[[ -f $build/compile_commands.json ]] || { echo "tidy: no $build/compile_commands.json (run scripts/setup.sh)" >&2; exit 2; }
folders="common|nam|kernels|workflow|ranking|parallel|modules|launch|record|orchestrator|report|simulate|service|inference|cli"
files=${2:-"^$PWD/($folders)/.*\\.cc\$"}
/usr/bin/python3 scripts/tidy_units.py "$build" "$files" >/dev/null
log=$(mktemp)
# GCC's flags that clang does not know (-Wno-restrict) are not findings.
# run-clang-tidy is a Python script: Debian's Python runs it, not whichever python3 PATH finds first.
if /usr/bin/python3 "$(command -v run-clang-tidy)" -p "$build/tidy-units" -j "$(nproc)" -quiet \
    -header-filter="/($folders)/.*\\.(h|cc)\$" -extra-arg=-Wno-unknown-warning-option \
    >"$log" 2>&1; then
  echo "tidy: no findings ($(grep -c '^#include' "$build"/tidy-units/*.cc | awk -F: '{n += $2} END {print n}') files)"
  rm -f "$log"
  exit 0
fi
sed 's/\x1b\[[0-9;]*m//g' "$log" | grep -E '(warning|error): ' | grep -v 'warnings generated' | sed "s|$PWD/$build/../||; s|$PWD/||" | sort -u >&2 || true
grep -q 'redefinition of' "$log" &&
  echo "tidy: a 'redefinition of' is two sources of one folder defining one name in their anonymous namespaces: rename one" >&2
echo "tidy: findings above (the full log: $log)" >&2
exit 1
