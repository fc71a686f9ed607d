#!/usr/bin/env bash
# Builds the fuzzers in tests/fuzz (bazel --config=fuzz: clang, libFuzzer,
# AddressSanitizer and UndefinedBehaviorSanitizer) and runs each for a bounded
# time from its seed corpus, tests/fuzz/corpus/<fuzzer>/.
#
#   tools/fuzz.sh                      # every fuzzer, 30 s each (what CI runs)
#   tools/fuzz.sh 600 checkpoint_fuzzer  # one fuzzer, 10 minutes
#
# New inputs found go to a scratch corpus ($FUZZ_OUT/<fuzzer>/corpus, default
# FUZZ_OUT=/tmp/ferry-fuzz), never into the committed one. A crash, a leak, a
# sanitizer report, an input running over 10 s or 2 GiB stops that fuzzer:
# the input is saved as $FUZZ_OUT/<fuzzer>/crash-... (or timeout-, oom-,
# leak-) and the script exits 1 after running the rest. Replay one with
# `bazel-bin/tests/fuzz/<fuzzer> FILE` (any build); once fixed, add it to the
# seed corpus, where every `bazel test` replays it. Extra bazel options come
# from $FUZZ_BAZEL_OPTS.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-${FUZZ_SECONDS:-30}}"
shift || true
fuzzers=("$@")
if [ ${#fuzzers[@]} -eq 0 ]; then
  # Every fuzzer has a seed corpus directory named after it.
  for dir in tests/fuzz/corpus/*/; do fuzzers+=("$(basename "$dir")"); done
fi
out="${FUZZ_OUT:-/tmp/ferry-fuzz}"

# shellcheck disable=SC2086
bazel build --config=fuzz ${FUZZ_BAZEL_OPTS:-} //tests/fuzz:fuzzers
# shellcheck disable=SC2086
bin="$(bazel info --config=fuzz ${FUZZ_BAZEL_OPTS:-} bazel-bin 2>/dev/null)/tests/fuzz"

export ASAN_SYMBOLIZER_PATH=/usr/bin/llvm-symbolizer-14
export UBSAN_OPTIONS="print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
failed=()
for fuzzer in "${fuzzers[@]}"; do
  work="$out/$fuzzer"
  mkdir -p "$work/corpus"
  echo "fuzz: $fuzzer for ${seconds}s (scratch corpus $work/corpus)" >&2
  if ! "$bin/$fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="$work/" \
      "$work/corpus" "tests/fuzz/corpus/$fuzzer" >"$work/log" 2>&1; then
    tail -n 60 "$work/log" >&2
    echo "fuzz: $fuzzer FAILED; input saved in $work/, log $work/log" >&2
    failed+=("$fuzzer")
  else
    grep -E "^stat::number_of_executed_units|^Done " "$work/log" | tr '\n' ' ' >&2
    echo >&2
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: failed: ${failed[*]}" >&2
  exit 1
fi
