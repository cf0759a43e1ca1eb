#!/usr/bin/env bash
# Set-up from nothing, then the quickstart pipeline (both backbones + the raw-pixel baseline
# on Fashion-MNIST). Extra arguments go to `msaflow run`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec build/msaflow run pipelines/quickstart.json "$@"
