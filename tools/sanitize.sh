#!/usr/bin/env bash
# The sanitizer part of tools/test.sh (docs/BUILDING.md, "Sanitizers and
# fuzzing"); extra arguments go to bazel.
#   1. the server and engine unit tests under AddressSanitizer and
#      UndefinedBehaviorSanitizer (--config=asan), but those tagged no_asan;
#   2. the event buffer, job registry, job store, disk store and the memory
#      manager's tests (the simulated device's copy engine runs beside
#      compute) under ThreadSanitizer (--config=tsan);
#   3. every fuzzer for FUZZ_SECONDS (default 30) from its seed corpus
#      (tools/fuzz.sh).
# Each step runs even when an earlier one failed; the exit status is 1 if any
# did.
set -uo pipefail
cd "$(dirname "$0")/.."

failed=()
step() {
  local name="$1"
  shift
  local start=$SECONDS
  echo "sanitize: $name" >&2
  if "$@"; then
    echo "sanitize: $name passed in $((SECONDS - start)) s" >&2
  else
    echo "sanitize: $name FAILED after $((SECONDS - start)) s" >&2
    failed+=("$name")
  fi
}

step "ASan+UBSan: server and engine unit tests" \
  bazel test --config=asan --cache_test_results=no --test_tag_filters=-no_asan \
  //server/... //engine/... "$@"
step "TSan: event buffer, job registry, job store, disk store, memory manager, host worker" \
  bazel test --config=tsan --cache_test_results=no \
  //server/jobs:event_buffer_test //server/jobs:job_registry_test //server/jobs:job_store_test \
  //engine/memory:disk_store_test //engine/memory:simulated_device_test //engine/memory:payload_store_test \
  //engine/memory:chunk_manager_test //engine/memory:host_worker_test "$@"
step "fuzzers, ${FUZZ_SECONDS:-30} s each" tools/fuzz.sh "${FUZZ_SECONDS:-30}"

if [ ${#failed[@]} -gt 0 ]; then
  echo "sanitize: failed: ${failed[*]}" >&2
  exit 1
fi
