#!/usr/bin/env bash
# Sourced by scripts/fuzz.sh and scripts/sanitize.sh: installs clang with its sanitizer and
# libFuzzer runtimes (Debian 12 packages) and configures a clang build directory.
#   clang_build DIR MESON-OPTIONS...   (configures DIR once; ninja is the caller's)
clang_packages() {
  local missing=() p
  for p in clang libclang-rt-14-dev libomp-14-dev; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "[clang] installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get -o DPkg::Lock::Timeout=600 update -q
    apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends "${missing[@]}"
  fi
}
clang_build() {
  local dir=$1
  shift
  clang_packages
  if [[ ! -f $dir/build.ninja ]]; then
    CC=clang CXX=clang++ meson setup "$dir" --buildtype=debugoptimized -Db_lundef=false "$@" >/dev/null
  fi
}
