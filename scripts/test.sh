#!/usr/bin/env bash
# Set-up from nothing, then every test (unit, integration, end to end) with warnings as errors.
set -euo pipefail
cd "$(dirname "$0")/.."
MSAFLOW_BUILD_DIR=build-test MSAFLOW_WERROR=1 scripts/setup.sh
status=0
meson test -C build-test --print-errorlogs --num-processes 2 "$@" || status=$?
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
exit $status
