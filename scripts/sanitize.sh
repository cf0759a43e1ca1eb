#!/usr/bin/env bash
# The test suite under sanitizers, and the fuzzers' smoke runs (clang, Debian 12 packages).
#   scripts/sanitize.sh asan [meson test args]  every test but suite 'once' (the Slurm clusters' among them), msaflow
#                                               and the tests built with ASan + UBSan (build-fuzz/)
#   scripts/sanitize.sh tsan                    the NAM server and client tests under TSan (build-tsan/)
#   scripts/sanitize.sh fuzz [SECONDS]          each fuzz target for SECONDS (default 5) over its corpus
#   scripts/sanitize.sh all                     the three, as CI runs them
#   scripts/sanitize.sh build                   only build what the three run (build-fuzz/, build-tsan/)
# A sanitizer report fails the test that triggered it (halt_on_error). Leak checking is off: the
# MPI and libfabric libraries keep memory until exit by design.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/clang-build.sh
what=${1:-all}
shift || true
asan_build() {
  clang_build build-fuzz -Dfuzz=true -Db_sanitize=address,undefined -Dbench=false
  quiet_ninja build-fuzz
}
tsan_build() {
  clang_build build-tsan -Db_sanitize=thread -Dbench=false
  # Only common/ and nam/ (their own library) and the three tests compile.
  quiet_ninja build-tsan tests/nam_test tests/nam_server_test tests/common_test
}
asan() {
  asan_build
  # Suite 'once' (tests/meson.build says why each) runs in the plain pass only: the Slurm
  # clusters, tests of no msaflow code, tests whose msaflow code another test runs here, and the
  # independent runtimes' numbers. The rest run here only (scripts/test.sh), the unit tests in both.
  echo "[sanitize] the suite under ASan + UBSan (but suite 'once': the plain pass runs it)"
  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    meson test -C build-fuzz --print-errorlogs --num-processes 3 --no-suite once "$@"
}
tsan() {
  tsan_build
  # Tests that start the server as a process use this msaflow (not instrumented; the clients are).
  if [[ -z ${MSAFLOW_BIN:-} ]]; then
    export MSAFLOW_BIN=$PWD/build-test/msaflow
    [[ -x $MSAFLOW_BIN ]] || { quiet_ninja build-tsan msaflow; MSAFLOW_BIN=$PWD/build-tsan/msaflow; }
  fi
  echo "[sanitize] NAM server and client tests, and the data manager, under TSan"
  export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1"
  for t in nam_test nam_server_test common_test; do
    build-tsan/tests/$t --gtest_brief=1
  done
}
fuzz() {
  local seconds=${1:-5}
  scripts/fuzz.sh all "$seconds"
}
case $what in
  asan) asan "$@" ;;
  tsan) tsan ;;
  fuzz) fuzz "$@" ;;
  all) asan && tsan && fuzz ;;
  build) asan_build && tsan_build ;;
  *) echo "usage: scripts/sanitize.sh asan|tsan|fuzz [SECONDS]|all|build" >&2; exit 2 ;;
esac
