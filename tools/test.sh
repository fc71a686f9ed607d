#!/usr/bin/env bash
# Runs every test: installs what is missing, then `bazel test //...`, the
# CMake build that GPU machines without Bazel use (tools/gpu/build.sh, with a
# few of its engine tests; FERRY_CMAKE=0 skips it), a syntax check of the
# CUDA-only code (tools/gpu/cuda_syntax_check.sh), then
# tools/sanitize.sh (the server and engine unit tests under AddressSanitizer
# and UndefinedBehaviorSanitizer, the job core under ThreadSanitizer, and each
# fuzzer for $FUZZ_SECONDS, default 30). FERRY_SANITIZERS=0 skips that part.
# Extra arguments go to bazel (e.g. tools/test.sh --test_output=all).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh
# Run every test for real: a cached pass says nothing about this machine
# (the tests also use installed tools Bazel does not track).
bazel test //... --cache_test_results=no "$@"
# The CMake build (tools/gpu/CMakeLists.txt) of the engine, ferry-worker and
# the engine's tests, against Debian's LibTorch, so that it cannot rot between
# runs on a GPU machine; then a few quick engine tests it built. ccache keeps
# it short after the first run.
if [ "${FERRY_CMAKE:-1}" != 0 ]; then
  tools/gpu/build.sh --test='^(device_test|simulated_device_test|chunk_layout_test|cpu_adam_test|flat_adamw_test|gpt_test|data_test|safetensors_test|communicator_test)$'
fi
# The CUDA-only code compiles (a CPU LibTorch build never compiles it).
tools/gpu/cuda_syntax_check.sh
if [ "${FERRY_SANITIZERS:-1}" != 0 ]; then
  tools/sanitize.sh "$@"
fi
