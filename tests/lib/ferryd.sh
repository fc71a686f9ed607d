# Shell helpers for tests that run ferryd. Source it with RUNFILES set (the
# runfiles' ferry directory); define fail() (which prints its message, and
# any logs, and exits 1) before calling them.

FERRYD="$RUNFILES/server/ferryd"
FERRY="$RUNFILES/client/ferry"
PY=/usr/bin/python3

# json EXPR: evaluates the Python expression EXPR on the JSON document read
# from stdin (as d) and prints it: json "d['id']" <<<"$(ferry get ID -o json)".
json() { "$PY" -c "import json,sys; d=json.load(sys.stdin); print($1)"; }

# wait_ready PID READY_FILE: waits up to 60 s for the ferryd started as PID
# to write its --ready_file; fails if it exits first or never does. Then
# READY_ADDRESS and READY_METRICS hold the addresses it serves on.
wait_ready() {
  local pid="$1" file="$2"
  for _ in $(seq 1 600); do
    [ -s "$file" ] && break
    kill -0 "$pid" 2>/dev/null || fail "ferryd exited during start-up"
    sleep 0.1
  done
  [ -s "$file" ] || fail "ferryd did not become ready in 60 s"
  READY_ADDRESS="$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['listen'])" "$file")"
  READY_METRICS="$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1])).get('metrics_listen', ''))" "$file")"
}

# start_ferryd LOG ARG...: starts ferryd on a free loopback port without
# metrics, with ARGs (--state_dir and whatever else), logging to LOG, and
# waits until it serves: DAEMON is its pid, FERRY_ADDRESS its address.
start_ferryd() {
  local log="$1" ready
  shift
  ready="$(mktemp -u "${TEST_TMPDIR:-/tmp}/ready.XXXXXX")"
  "$FERRYD" --listen=127.0.0.1:0 --metrics_listen= --ready_file="$ready" "$@" >"$log" 2>&1 &
  DAEMON=$!
  wait_ready "$DAEMON" "$ready"
  export FERRY_ADDRESS="$READY_ADDRESS"
}

# get ID EXPR: EXPR (see json) on job ID as `ferry get -o json` shows it.
get() { "$FERRY" get "$1" -o json | json "$2"; }
# submit ARG...: `ferry submit ARG...`; prints the new job's id.
submit() { "$FERRY" submit "$@" -o json | json "d['id']"; }

# kill_ferryd_at_exit: when the test exits, the ferryd whose pid is in
# DAEMON (none yet) is killed and what the test started is waited for.
kill_ferryd_at_exit() {
  DAEMON=""
  trap '[ -n "$DAEMON" ] && kill -9 "$DAEMON" 2>/dev/null; wait 2>/dev/null || true' EXIT
}

# show_logs LINES FILE...: for fail(): the last LINES lines of each FILE
# that exists, its step lines left out, on stderr.
show_logs() {
  local lines="$1" f
  shift
  for f in "$@"; do
    [ -f "$f" ] && { echo "--- $f" >&2; grep -v '^step' "$f" | tail -"$lines" >&2; }
  done
  return 0
}

# expect_refusal TEXT -- ARG...: `ferry ARG...` must exit 2 (refused) with
# TEXT in what it says; `out` holds what it said.
expect_refusal() {
  local text="$1" rc
  shift 2
  set +e; out="$("$FERRY" "$@" 2>&1)"; rc=$?; set -e
  [ "$rc" -eq 2 ] || fail "ferry $* exited $rc, not 2: $out"
  grep -qF -- "$text" <<<"$out" || fail "ferry $* said '$out', which lacks '$text'"
  echo "refused as expected: $out"
}

# wait_checkpoint ID STEP: until job ID's newest checkpoint is at STEP or
# later (60 s at most).
wait_checkpoint() {
  for _ in $(seq 1 1200); do
    [ "$(get "$1" "d.get('last_checkpoint', {}).get('step', 0)")" -ge "$2" ] && return 0
    sleep 0.05
  done
  fail "no checkpoint of $1 at step $2 in 60 s"
}
