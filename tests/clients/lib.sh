# Shared by the example clients' tests: a ferryd on a free loopback port,
# restartable on the same state directory, behind drop_proxy.py so a test can
# cut every connection. Source it; set CLIENT_NAME first.

RUNFILES="${TEST_SRCDIR:-$PWD}/ferry"
source "$RUNFILES/tests/lib/ferryd.sh"
source "$RUNFILES/tests/lib/certs.sh"
WORK="$(mktemp -d "${TEST_TMPDIR:-/tmp}/clients.XXXXXX")"
STATE="$WORK/state"
DAEMON=""
PROXY=""
STARTS=0
DAEMON_ARGS=()

fail() {
  echo "FAIL ($CLIENT_NAME): $*" >&2
  for f in "$WORK"/*.out; do [ -e "$f" ] && { echo "--- $f" >&2; tail -25 "$f" >&2; }; done
  for f in "$WORK"/ferryd.*.log; do [ -e "$f" ] && { echo "--- $f" >&2; tail -15 "$f" >&2; }; done
  exit 1
}
cleanup() {
  [ -n "$DAEMON" ] && kill -9 "$DAEMON" 2>/dev/null
  [ -n "$PROXY" ] && kill "$PROXY" 2>/dev/null
  wait 2>/dev/null || true
}
trap cleanup EXIT

# Bearer tokens, where this ferryd takes them: every client call sends one.
FERRYD_HELP="$("$FERRYD" --helpfull 2>&1 || true)"
if grep -q -- "--tokens_file" <<<"$FERRYD_HELP"; then
  printf 'submitter client-test-token\n' >"$WORK/tokens"
  chmod 600 "$WORK/tokens"
  DAEMON_ARGS+=(--tokens_file="$WORK/tokens")
  export FERRY_TOKEN=client-test-token
fi

start_daemon() {
  STARTS=$((STARTS + 1))
  rm -f "$WORK/ready.json"
  # An event per step: the tests check that a client sees every step once.
  "$FERRYD" --state_dir="$STATE" --listen=127.0.0.1:0 --metrics_listen= --ready_file="$WORK/ready.json" \
    --progress_events_per_second=0 "${DAEMON_ARGS[@]}" >"$WORK/ferryd.$STARTS.log" 2>&1 &
  DAEMON=$!
  wait_ready "$DAEMON" "$WORK/ready.json"
  DAEMON_ADDRESS="$READY_ADDRESS"
  echo "$DAEMON_ADDRESS" >"$WORK/upstream"
  echo "ferryd $STARTS at $DAEMON_ADDRESS"
}
kill_daemon() { kill -9 "$DAEMON"; wait "$DAEMON" 2>/dev/null || true; DAEMON=""; }
stop_daemon() { kill -TERM "$DAEMON"; wait "$DAEMON" || fail "ferryd exited non-zero after SIGTERM"; DAEMON=""; }

start_proxy() {
  "$PY" "$RUNFILES/tests/clients/drop_proxy.py" "$WORK/proxy.port" "$WORK/upstream" 2>"$WORK/proxy.log" &
  PROXY=$!
  for _ in $(seq 1 100); do [ -s "$WORK/proxy.port" ] && break; sleep 0.1; done
  [ -s "$WORK/proxy.port" ] || fail "the proxy did not start"
  PROXY_ADDRESS="127.0.0.1:$(cat "$WORK/proxy.port")"
}
drop_connections() { kill -USR1 "$PROXY"; }

# wait_for FILE REGEX SECONDS: until FILE has a line matching REGEX.
wait_for() {
  for _ in $(seq 1 $(($3 * 10))); do grep -qE -- "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
  fail "no line matching '$2' in $1 after $3 s"
}
expect() { grep -qE -- "$2" "$1" || fail "$1 has no line matching '$2'"; }
expect_not() { ! grep -qE -- "$2" "$1" || fail "$1 has a line matching '$2': $(grep -E -- "$2" "$1" | head -1)"; }

# every_step_once FILE TOTAL: the progress lines are steps 1..TOTAL, each once.
every_step_once() {
  "$PY" - "$1" "$2" <<'PYEOF' || fail "$1 does not show every step once"
import re, sys
steps = [int(m.group(1)) for m in re.finditer(r"^step (\d+)/", open(sys.argv[1]).read(), re.M)]
want = list(range(1, int(sys.argv[2]) + 1))
assert steps == want, f"steps {steps}, wanted 1..{want[-1]}"
PYEOF
}

# A finished run: exit 0, the job succeeded at step TOTAL, its placement shown.
expect_success() {  # expect_success RC FILE TOTAL
  [ "$1" -eq 0 ] || fail "$CLIENT_NAME exited $1"
  expect "$2" "^j-[0-9a-f]+ succeeded at step $3, loss"
  expect "$2" "^memory placement of j-[0-9a-f]+ at step $3: auto policy on sim"
  expect "$2" "^  device +param "
  expect_not "$2" "gap in the events"
}

# The scenarios every client runs. CLIENT is the command; it takes --address
# and --steps and reads FERRY_TOKEN.
run_client() {  # run_client OUT args...: runs the client in the background
  local out="$1"; shift
  "${CLIENT[@]}" "$@" >"$WORK/$out.out" 2>&1 &
  CLIENT_PID=$!
}
finish_client() { set +e; wait "$CLIENT_PID"; CLIENT_RC=$?; set -e; }

scenario_direct() {
  run_client direct --address="$DAEMON_ADDRESS" --steps=20 "$@"
  finish_client
  expect_success "$CLIENT_RC" "$WORK/direct.out" 20
  every_step_once "$WORK/direct.out" 20
  echo "ok: a job watched to the end, placement printed"
}

# Connections cut twice mid-watch: the client resumes after its last event
# each time and misses none.
scenario_dropped_stream() {
  run_client dropped --address="$PROXY_ADDRESS" --steps=60
  wait_for "$WORK/dropped.out" "^step 10/60" 120
  drop_connections
  wait_for "$WORK/dropped.out" "^step 30/60" 120
  drop_connections
  finish_client
  expect_success "$CLIENT_RC" "$WORK/dropped.out" 60
  [ "$(grep -c "reconnecting after seq [1-9]" "$WORK/dropped.out")" -ge 2 ] || fail "the client did not reconnect twice"
  expect "$WORK/dropped.out" "snapshot at seq [0-9]+, after seq [1-9][0-9]*\)"
  expect_not "$WORK/dropped.out" "fresh snapshot"
  every_step_once "$WORK/dropped.out" 60
  echo "ok: resumed after dropped connections without losing an event"
}

# The daemon stopped (STOP: kill_daemon or stop_daemon) mid-watch and started
# again on the same state directory: the job resumes in the new daemon and the
# client follows it to the end, from its last seq or from a fresh snapshot.
scenario_daemon_restart() {
  local stop="$1"
  run_client restart --address="$PROXY_ADDRESS" --steps=60
  wait_for "$WORK/restart.out" "^step 10/60" 120
  "$stop"
  sleep 1
  start_daemon
  finish_client
  expect_success "$CLIENT_RC" "$WORK/restart.out" 60
  expect "$WORK/restart.out" "reconnecting after seq [1-9]"
  expect "$WORK/restart.out" "fresh snapshot|after seq [1-9][0-9]*\)"
  echo "ok: followed the job through a daemon restart ($stop)"
}

# job_step ID: the job's latest step, asked of the daemon with the Python stubs.
job_step() {
  PYTHONPATH="$RUNFILES/proto/python" "$PY" - "$DAEMON_ADDRESS" "$1" <<'PYEOF'
import os, sys, grpc
from ferry.v1 import ferry_pb2, ferry_pb2_grpc
token = os.environ.get("FERRY_TOKEN")
metadata = [("authorization", "Bearer " + token)] if token else []
with grpc.insecure_channel(sys.argv[1]) as channel:
    stub = ferry_pb2_grpc.FerryStub(channel)
    print(stub.GetJob(ferry_pb2.GetJobRequest(job_id=sys.argv[2]), metadata=metadata, timeout=10).progress.step)
PYEOF
}

# A client that falls further behind than the daemon's event buffer (8 events
# here): frozen with SIGSTOP, its connection cut, thawed 30 steps later. Its
# last seq is gone (OUT_OF_RANGE), so it starts again from a fresh snapshot
# and still follows the job to the end. Restarts the daemon with the small
# buffer; run it last.
scenario_snapshot_fallback() {
  stop_daemon
  DAEMON_ARGS+=(--event_buffer_events=8)
  start_daemon
  run_client fallback --address="$PROXY_ADDRESS" --steps=100
  wait_for "$WORK/fallback.out" "^step 10/100" 120
  kill -STOP "$CLIENT_PID"
  drop_connections
  local id step=0
  id="$(sed -n 's/^submitted \(j-[0-9a-f]*\).*/\1/p' "$WORK/fallback.out")"
  for _ in $(seq 1 1200); do
    step="$(job_step "$id")" || fail "GetJob $id failed"
    [ "$step" -ge 40 ] && break
    sleep 0.1
  done
  [ "$step" -ge 40 ] || fail "job $id reached only step $step"
  kill -CONT "$CLIENT_PID"
  finish_client
  expect_success "$CLIENT_RC" "$WORK/fallback.out" 100
  expect "$WORK/fallback.out" "^events after seq [1-9][0-9]* are gone .*starting again from a fresh snapshot"
  [ "$(grep -c "snapshot at seq [0-9]*, after seq 0)" "$WORK/fallback.out")" -ge 2 ] \
    || fail "the client did not watch again from a fresh snapshot"
  echo "ok: fell behind the event buffer, started again from a fresh snapshot"
}

# A ferryd serving TLS and requiring client certificates (mTLS), tokens as
# before: the client with the CA, its certificate and key runs a job to the
# end; without a CA it cannot connect (exit 3); half a key pair is bad usage.
# Restarts the daemon; run it last.
scenario_tls() {
  (cd "$WORK" && new_loopback_certs)
  stop_daemon
  DAEMON_ARGS+=(--tls_cert="$WORK/server.pem" --tls_key="$WORK/server.key" --tls_client_ca="$WORK/ca.pem")
  start_daemon
  grep -q "(TLS, client certificates" "$WORK/ferryd.$STARTS.log" || fail "ferryd does not serve mTLS"
  run_client tls --address="$DAEMON_ADDRESS" --steps=5 \
    --tls-ca="$WORK/ca.pem" --tls-cert="$WORK/client.pem" --tls-key="$WORK/client.key"
  finish_client
  expect_success "$CLIENT_RC" "$WORK/tls.out" 5
  set +e
  "${CLIENT[@]}" --address="$DAEMON_ADDRESS" --steps=1 >"$WORK/plain.out" 2>&1; rc=$?
  FERRY_TLS_CA="$WORK/ca.pem" "${CLIENT[@]}" --address="$DAEMON_ADDRESS" --steps=1 --tls-cert="$WORK/client.pem" \
    >"$WORK/half.out" 2>&1; half_rc=$?
  set -e
  [ "$rc" -eq 3 ] || fail "a plaintext client against TLS exited $rc, not 3"
  [ "$half_rc" -eq 2 ] || fail "--tls-cert without --tls-key exited $half_rc, not 2"
  expect "$WORK/half.out" "tls-cert and --tls-key go together"
  echo "ok: TLS with a client certificate; plaintext refused; half a key pair is bad usage"
}

# Refusals: exit 2 naming the field; an unreachable daemon: exit 3.
scenario_errors() {
  set +e
  "${CLIENT[@]}" --address="$DAEMON_ADDRESS" --preset=gpt2-huge >"$WORK/refused.out" 2>&1; rc=$?
  set -e
  [ "$rc" -eq 2 ] || fail "a bad preset exited $rc, not 2"
  expect "$WORK/refused.out" "submit: invalid argument: model.preset: unknown preset 'gpt2-huge'"
  set +e
  "${CLIENT[@]}" --address=127.0.0.1:1 --steps=1 >"$WORK/unreachable.out" 2>&1; rc=$?
  set -e
  [ "$rc" -eq 3 ] || fail "an unreachable daemon exited $rc, not 3"
  expect "$WORK/unreachable.out" "submit: unavailable"
  if [ -n "${FERRY_TOKEN:-}" ]; then
    set +e
    FERRY_TOKEN=wrong "${CLIENT[@]}" --address="$DAEMON_ADDRESS" --steps=1 >"$WORK/token.out" 2>&1; rc=$?
    set -e
    [ "$rc" -eq 2 ] || fail "a wrong token exited $rc, not 2"
    expect "$WORK/token.out" "submit: unauthenticated"
    echo "ok: the token is sent; a wrong one is refused"
  fi
  echo "ok: refusals exit 2, an unreachable daemon 3"
}
