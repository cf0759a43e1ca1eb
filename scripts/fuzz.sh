#!/usr/bin/env bash
# Runs a libFuzzer target (fuzz/) for SECONDS; builds it first (clang, ASan + UBSan, in build-fuzz/).
#   scripts/fuzz.sh TARGET SECONDS [libFuzzer options...]
#   TARGET: pipeline machine task onnx idx image nam_wire journal, or all (each for SECONDS)
# Seeds: the repository's real files (pipelines/, configs/machines/) and fuzz/corpus/<target>/;
# the growing corpus stays in build-fuzz/corpus/<target>/, findings go to build-fuzz/findings/<target>/
# (the script then exits 1 and names them). Turn a finding into a regression test.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
TARGETS=(pipeline machine task onnx idx image nam_wire journal)
usage() { echo "usage: scripts/fuzz.sh TARGET SECONDS [libFuzzer options]; TARGET: ${TARGETS[*]} or all" >&2; exit 2; }
(($# >= 2)) || usage
target=$1 seconds=$2
shift 2
[[ $seconds =~ ^[0-9]+$ ]] || usage
if [[ $target == all ]]; then
  for t in "${TARGETS[@]}"; do "$0" "$t" "$seconds" "$@"; done
  exit 0
fi
[[ " ${TARGETS[*]} " == *" $target "* ]] || usage

# clang, ASan + UBSan, coverage for libFuzzer: the build scripts/sanitize.sh runs the suite in.
source scripts/clang-build.sh
BUILD=build-fuzz
clang_build "$BUILD" -Dfuzz=true -Db_sanitize=address,undefined -Dbench=false
quiet_ninja "$BUILD" "fuzz/fuzz_$target"

corpus=$BUILD/corpus/$target findings=$BUILD/findings/$target
mkdir -p "$corpus" "$findings"
seeds=("$ROOT/fuzz/corpus/$target")
case $target in
  pipeline) seeds=("$ROOT/pipelines") ;;
  machine) seeds=("$ROOT/configs/machines") ;;
esac
max_len=65536
[[ $target == nam_wire ]] && max_len=40000
# UBSan stops at the first report; leaks of the libraries (Open MPI, libfabric) are not ours.
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0}
echo "[fuzz] $target for ${seconds}s (corpus $corpus)"
set +e
"$BUILD/fuzz/fuzz_$target" -max_total_time="$seconds" -timeout=25 -rss_limit_mb=4096 -max_len=$max_len \
  -print_final_stats=1 -artifact_prefix="$findings/" "$@" "$corpus" "${seeds[@]}" 2>"$BUILD/fuzz-$target.log"
rc=$?
set -e
grep -E "^stat::number_of_executed_units|^stat::peak_rss_mb|^#[0-9]+.*DONE" "$BUILD/fuzz-$target.log" | sed 's/^/[fuzz]   /' || true
if ((rc != 0)) || [[ -n $(ls -A "$findings") ]]; then
  echo "[fuzz] $target: FOUND something (exit $rc); log $BUILD/fuzz-$target.log; inputs:" >&2
  ls "$findings" >&2
  tail -40 "$BUILD/fuzz-$target.log" >&2
  exit 1
fi
echo "[fuzz] $target: no crash, hang or sanitizer report"
