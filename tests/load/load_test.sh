#!/usr/bin/env bash
# ferryd under load: 200 watchers on a training job and a steady stream of
# submits, gets, lists and cancels. No crash, no lost event, every watcher
# sees the job end, the daemon's memory bounded. The job's throughput,
# watched against unwatched, is reported, not checked.
#
# As the test (bazel test //tests/load:load_test) it measures 20 s windows;
# as the benchmark (bazel run //bench:load) 60 s ones, and the figures go to
# bench/results/load.json.
set -euo pipefail

if [ -n "${TEST_SRCDIR:-}" ]; then RUNFILES="$TEST_SRCDIR/ferry"; else RUNFILES="${RUNFILES_DIR:-$0.runfiles}/ferry"; fi
source "$RUNFILES/tests/lib/ferryd.sh"
CLIENT="$RUNFILES/tests/load/load_client"
WORK="$(mktemp -d "${TEST_TMPDIR:-/tmp}/load.XXXXXX")"
SECONDS_EACH="${FERRY_LOAD_SECONDS:-20}"
RESULT=""
if [ "${1:-}" = "--bench" ]; then
  SECONDS_EACH="${FERRY_LOAD_SECONDS:-60}"
  RESULT="${BUILD_WORKSPACE_DIRECTORY:-$PWD}/bench/results/load.json"
fi

fail() { echo "FAIL: $*" >&2; tail -20 "$WORK/ferryd.log" >&2 || true; exit 1; }
"$FERRYD" --state_dir="$WORK/state" --listen=127.0.0.1:0 --metrics_listen= --ready_file="$WORK/ready.json" \
  >"$WORK/ferryd.log" 2>&1 &
DAEMON=$!
trap 'kill -9 $DAEMON 2>/dev/null || true' EXIT
wait_ready "$DAEMON" "$WORK/ready.json"
ADDRESS="$READY_ADDRESS"

# The load client stands in for watchers and callers on other machines: at
# the lowest CPU priority it takes only what the daemon and the job leave,
# so the ratio measures the daemon's cost, not the client's.
nice -n 19 "$CLIENT" --address="$ADDRESS" --daemon_pid="$DAEMON" --watchers=200 --seconds="$SECONDS_EACH" \
  --ops_per_second=20 --json_out="$WORK/load.json" || fail "the load run failed its checks"
kill -0 "$DAEMON" || fail "ferryd died"
cat "$WORK/load.json"
if [ -n "$RESULT" ]; then
  mkdir -p "$(dirname "$RESULT")"
  cp "$WORK/load.json" "$RESULT"
  echo "wrote $RESULT"
fi
kill -TERM "$DAEMON"; wait "$DAEMON" || fail "ferryd exited non-zero"
trap - EXIT
echo PASS
