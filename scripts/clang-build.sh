#!/usr/bin/env bash
# Sourced by scripts/fuzz.sh and scripts/sanitize.sh: installs clang with its sanitizer and
# libFuzzer runtimes (Debian 12 packages) and configures a clang build directory.
#   clang_build DIR MESON-OPTIONS...   (configures DIR, or sets the options of an existing one)
#   quiet_ninja DIR [TARGETS...]        builds quietly, but prints the compiler's errors when it fails
source "$(dirname "${BASH_SOURCE[0]}")/packages.sh"
clang_packages() { ensure_packages clang libclang-rt-14-dev libomp-14-dev; }
clang_build() {
  local dir=$1
  shift
  clang_packages
  if [[ ! -f $dir/build.ninja ]]; then
    # -O2 with line tables only: a sanitizer's report names files and lines as with -g, and the
    # build takes about 11 % less time (measured on modules/evaluate_step.cc, issue 47).
    # A unity build (4 sources of a target compiled as one): the headers every source includes
    # (nlohmann::json, fmt, oneDNN, Open MPI) are parsed and their templates compiled once per 4
    # sources; 35 % less CPU time under ASan on common, workflow, orchestrator and service
    # (247 -> 161 s), 13 % on all of msaflow's libraries (1,118 -> 970 s, summed from
    # .ninja_log in two fresh-clone CI runs); but the tests' own sources took longer together
    # (360 -> 469 s), so the whole ASan build summed 1,510 -> 1,480 s: about even. Sources of
    # one folder already share no file-local names (scripts/tidy.sh reads each folder as one
    # unit), so they compile together unchanged.
    CC=clang CXX=clang++ meson setup "$dir" --buildtype=plain -Doptimization=2 -Dcpp_args=-gline-tables-only \
      -Db_lundef=false -Dunity=on -Dunity_size=4 "$@" >/dev/null
  else
    meson setup --reconfigure "$dir" "$@" >/dev/null  # an existing directory takes the options as they are now
  fi
}
quiet_ninja() {
  local dir=$1 log
  shift
  log=$(mktemp)
  if ! ninja -C "$dir" "$@" >"$log" 2>&1; then
    echo "[build] ninja -C $dir $* failed:" >&2
    grep -v '^\[[0-9]*/[0-9]*\] ' "$log" | tail -n 60 >&2
    rm -f "$log"
    return 1
  fi
  rm -f "$log"
}
