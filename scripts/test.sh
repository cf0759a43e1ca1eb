#!/usr/bin/env bash
# Set-up from nothing, then every test (unit, integration, end to end) with warnings as errors.
set -euo pipefail
cd "$(dirname "$0")/.."
MSAFLOW_BUILD_DIR=build-test MSAFLOW_WERROR=1 scripts/setup.sh
meson test -C build-test --print-errorlogs --num-processes 2 "$@"
