#!/usr/bin/env bash
# Runs deploy_test.py with Debian's Python (python3-yaml).
set -euo pipefail
exec /usr/bin/python3 "${TEST_SRCDIR:-.}/ferry/tests/deploy/deploy_test.py"
