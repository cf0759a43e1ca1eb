#!/usr/bin/env bash
# Set-up from nothing, a build with warnings as errors, then every test (unit, integration, end to
# end, MPI, Slurm), each once: in that build, or under ASan + UBSan (see below); clang-tidy; TSan
# and the fuzzing smoke runs (MSAFLOW_SANITIZE=0 skips the sanitizers and runs all tests here).
# The phases run one after the other: run beside the suite at idle priority, the clang builds
# slowed the tests by more than they gained (measured, issue 47: the suite 858 -> 1,375 s for
# about 500 s of build).
set -euo pipefail
cd "$(dirname "$0")/.."
# Each phase's wall time, for CI's log: "[time] PHASE: N s (total M s)".
start=$SECONDS mark=$SECONDS
phase() {
  echo "[time] $1: $((SECONDS - mark)) s (total $((SECONDS - start)) s)"
  mark=$SECONDS
}
MSAFLOW_TESTS=1 MSAFLOW_BUILD_DIR=build-test MSAFLOW_WERROR=1 scripts/setup.sh
# The tests' own needs: a real headless browser to open `msaflow report`'s HTML in.
source scripts/packages.sh
ensure_packages chromium
phase "set-up and build"
status=0
# Each test once: with the sanitizers on, the plain pass runs suites 'unit' and 'once', and
# scripts/sanitize.sh asan every other test (tests/meson.build says which and why); without them,
# everything here. Arguments (e.g. a test's name) go to this meson test.
sanitize=${MSAFLOW_SANITIZE:-1}
plain=()
[[ $sanitize == 1 && $# == 0 ]] && plain=(--suite unit --suite once)
meson test -C build-test --print-errorlogs --num-processes 3 "${plain[@]}" "$@" || status=$?
phase "tests"
/usr/bin/python3 - build-test/meson-logs/testlog.json <<'PY'
import json, sys
passed = failed = 0
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r["result"] in ("OK", "EXPECTEDFAIL"):
        passed += 1
    elif r["result"] != "SKIP":
        failed += 1
print(f"tests: {passed} passed, {failed} failed")
PY
# clang-tidy's checks (.clang-tidy) over the sources, with the build's compile commands: zero findings.
if scripts/tidy.sh build-test; then echo "tidy: passed"; else echo "tidy: FAILED"; status=1; fi
phase "clang-tidy"
# The sanitizers (scripts/sanitize.sh; clang, Debian's packages): every test but suite 'once'
# (integration, MPI, end to end, and the unit tests again) with msaflow and the tests built with
# ASan + UBSan, the NAM tests under TSan, and every fuzzer over its corpus for a few seconds.
if [[ $sanitize == 1 ]]; then
  for part in "asan" "tsan" "fuzz 3"; do
    if scripts/sanitize.sh $part; then
      echo "sanitize ${part%% *}: passed"
    else
      echo "sanitize ${part%% *}: FAILED"
      status=1
    fi
    phase "sanitize ${part%% *}"
  done
fi
exit $status
