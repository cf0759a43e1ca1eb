#!/usr/bin/env bash
# Set-up from nothing, then every test (unit, integration, end to end, MPI, Slurm) with warnings
# as errors, clang-tidy, then the sanitizer and fuzzing smoke runs (MSAFLOW_SANITIZE=0 skips them).
# The suites leave a quarter of the CPU idle (they wait on daemons, sockets and sleeps): the
# sanitizer builds run beside the plain suite, and clang-tidy beside the ASan one, at idle
# priority (SCHED_IDLE), so that they take only what the tests leave.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each phase's wall time, for CI's log: "[time] PHASE: N s (total M s)".
start=$SECONDS mark=$SECONDS
phase() {
  echo "[time] $1: $((SECONDS - mark)) s (total $((SECONDS - start)) s)"
  mark=$SECONDS
}
MSAFLOW_TESTS=1 MSAFLOW_BUILD_DIR=build-test MSAFLOW_WERROR=1 scripts/setup.sh
# The tests' own needs: a real headless browser to open `msaflow report`'s HTML in; clang, its
# sanitizer runtimes and clang-tidy, installed now so that nothing beside the tests runs apt.
source scripts/packages.sh
ensure_packages chromium clang clang-tidy libclang-rt-14-dev libomp-14-dev
phase "set-up and build"
sanitize=${MSAFLOW_SANITIZE:-1}
logs=build-test/ci-logs
mkdir -p "$logs"
declare -A beside_pid
# beside NAME CMD...: CMD at idle priority, in the background; its output in $logs/NAME.log.
beside() {
  local name=$1
  shift
  chrt --idle 0 nice -n 19 "$@" >"$logs/$name.log" 2>&1 &
  beside_pid[$name]=$!
}
# joined NAME: waits for it; its exit status.
joined() {
  local rc=0
  wait "${beside_pid[$1]}" || rc=$?
  return $rc
}
tidy_beside() { beside tidy scripts/tidy.sh build-test; }
tidy_joined() {
  if joined tidy; then
    tail -n 1 "$logs/tidy.log"
    echo "tidy: passed"
  else
    cat "$logs/tidy.log"
    echo "tidy: FAILED"
    status=1
  fi
}
status=0
if [[ $sanitize == 1 ]]; then beside sanitizer-builds scripts/sanitize.sh build; else tidy_beside; fi
meson test -C build-test --print-errorlogs --num-processes 3 "$@" || status=$?
phase "tests (beside them: $([[ $sanitize == 1 ]] && echo "the sanitizer builds" || echo clang-tidy))"
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
if [[ $sanitize != 1 ]]; then
  # clang-tidy's checks (.clang-tidy) over the sources, with the build's compile commands: zero findings.
  tidy_joined
  phase "clang-tidy (what was left of it)"
  exit $status
fi
# A build that failed here fails again, with its errors, in the step that needs it below.
joined sanitizer-builds || echo "sanitizer builds: failed beside the tests; built again below"
phase "sanitizer builds (what was left of them)"
# The sanitizers (scripts/sanitize.sh; clang, Debian's packages): the suite again (unit,
# integration, MPI; the Slurm clusters' suites only ran above) with msaflow and the tests built
# with ASan + UBSan, the NAM tests under TSan, and every fuzzer over its corpus for a few seconds.
tidy_beside
for part in "asan" "tsan" "fuzz 3"; do
  if scripts/sanitize.sh $part; then
    echo "sanitize ${part%% *}: passed"
  else
    echo "sanitize ${part%% *}: FAILED"
    status=1
  fi
  phase "sanitize ${part%% *}$([[ $part == asan ]] && echo " (beside it: clang-tidy)")"
  if [[ $part == asan ]]; then
    tidy_joined
    phase "clang-tidy (what was left of it)"
  fi
done
exit $status
