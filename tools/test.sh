#!/usr/bin/env bash
# Runs every test: installs what is missing, then `bazel test //...`.
# Extra arguments go to bazel (e.g. tools/test.sh --test_output=all).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh
# Run every test for real: a cached pass says nothing about this machine
# (the tests also use installed tools Bazel does not track).
bazel test //... --cache_test_results=no "$@"
