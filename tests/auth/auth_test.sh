#!/usr/bin/env bash
# Access control through a real ferryd: every RPC (through the ferry CLI) x
# {no token, viewer, submitter, bad token} over plaintext on loopback and
# over TLS; mTLS refuses a client without a certificate or with one from
# another CA; SIGHUP adds and removes tokens and keeps the old ones when the
# file is bad; start-up errors name the flag; health and reflection stay
# open; and no token or key appears in ferryd's logs or state.
set -euo pipefail

RUNFILES="${TEST_SRCDIR:-$PWD}/ferry"
source "$RUNFILES/tests/lib/ferryd.sh"
source "$RUNFILES/tests/lib/certs.sh"
WORK="$(mktemp -d "${TEST_TMPDIR:-/tmp}/auth.XXXXXX")"
unset FERRY_TOKEN FERRY_TLS_CA FERRY_TLS_CERT FERRY_TLS_KEY FERRY_ADDRESS

LOG="$WORK/none.log"
fail() { echo "FAIL: $*" >&2; echo "--- $LOG ---" >&2; tail -30 "$LOG" >&2 || true; exit 1; }

# --- Certificates: a CA, ferryd's (for 127.0.0.1 and localhost), a client's,
# and a client's from another CA.
cd "$WORK"
new_loopback_certs
new_ca rogue-ca
new_cert rogue rogue-ca $'extendedKeyUsage=clientAuth'

VIEWER="viewer-$(openssl rand -hex 16)"
SUBMITTER="submitter-$(openssl rand -hex 16)"
BAD="unknown-$(openssl rand -hex 16)"
NEWVIEWER="newviewer-$(openssl rand -hex 16)"
SECRETS=("$VIEWER" "$SUBMITTER" "$BAD" "$NEWVIEWER")
printf '# ferryd tokens\n\nviewer %s\n  submitter\t%s\n' "$VIEWER" "$SUBMITTER" >tokens
chmod 600 tokens

DAEMONS=()
cleanup() {
  for pid in "${DAEMONS[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

start() {  # start NAME FLAGS...: starts ferryd, sets PID and ADDRESS
  local name="$1"; shift
  LOG="$WORK/$name.log"
  "$FERRYD" --state_dir="$WORK/state-$name" --listen=127.0.0.1:0 --metrics_listen= \
    --ready_file="$WORK/$name.ready" "$@" >"$LOG" 2>&1 &
  PID=$!
  DAEMONS+=("$PID")
  wait_ready "$PID" "$WORK/$name.ready"
  ADDRESS="$READY_ADDRESS"
  echo "ferryd $name at $ADDRESS"
}

# run CALLER ferry-args...: runs ferry with the caller's token (none, viewer,
# submitter, bad) and the transport's flags in TRANSPORT; sets OUT and RC.
TRANSPORT=()
run() {
  local caller="$1" token=()
  shift
  case "$caller" in
    viewer) token=(--token="$VIEWER") ;;
    submitter) token=(--token="$SUBMITTER") ;;
    bad) token=(--token="$BAD") ;;
  esac
  set +e; OUT="$("$FERRY" --address="$ADDRESS" "${TRANSPORT[@]}" "${token[@]}" "$@" 2>&1)"; RC=$?; set -e
}

expect() {  # expect ok|unauthenticated|denied CALLER ferry-args...
  local want="$1" caller="$2"
  shift 2
  run "$caller" "$@"
  case "$want" in
    ok)
      [ "$RC" -eq 0 ] || fail "$caller: ferry $* exited $RC: $OUT"
      ;;
    unauthenticated)
      [ "$RC" -eq 2 ] || fail "$caller: ferry $* exited $RC, not 2: $OUT"
      grep -q '^ferry: unauthenticated: .*--token or FERRY_TOKEN' <<<"$OUT" || fail "$caller: ferry $*: $OUT"
      ;;
    denied)
      [ "$RC" -eq 2 ] || fail "$caller: ferry $* exited $RC, not 2: $OUT"
      grep -q '^ferry: permission denied: .* needs the submitter role and this token has the viewer role' \
        <<<"$OUT" || fail "$caller: ferry $*: $OUT"
      ;;
  esac
  for secret in "${SECRETS[@]}"; do
    ! grep -qF -- "$secret" <<<"$OUT" || fail "ferry $* printed a token"
  done
  echo "  $caller: ferry $1: $want"
}

# Every RPC x every caller against the daemon at ADDRESS (tokens file in use).
matrix() {
  local done_job new_job
  # A checkpoint directory per daemon: a job resuming another's would train no step.
  cat >job.yaml <<YAML
name: auth
model: {layers: 2, hidden: 32, heads: 4, vocab_size: 64, seq_len: 16}
data: {synthetic: {}}
train: {steps: 8, batch_size: 4, lr: 3.0e-3, threads: 1}
checkpoint: {dir: $WORK/ckpt-${ADDRESS##*:}, every_steps: 4, keep: 1}
YAML
  done_job="$(run submitter submit job.yaml -o json; json "d['id']" <<<"$OUT")"
  run submitter watch "$done_job"
  [ "$RC" -eq 0 ] || fail "the setup job $done_job did not succeed: $OUT"
  for caller in none bad viewer submitter; do
    local denied=denied
    case "$caller" in none | bad) denied=unauthenticated ;; submitter) denied=ok ;; esac
    local allowed=ok
    [ "$denied" = unauthenticated ] && allowed=unauthenticated
    expect "$allowed" "$caller" info                                   # GetDaemonInfo
    expect "$allowed" "$caller" list                                   # ListJobs
    expect "$allowed" "$caller" get "$done_job"                        # GetJob
    expect "$allowed" "$caller" watch "$done_job"                      # WatchJob
    expect "$allowed" "$caller" memory "$done_job"                     # GetMemoryPlacement
    expect "$denied" "$caller" submit job.yaml --set=train.steps=400 -o json   # SubmitJob
    if [ "$caller" = submitter ]; then
      new_job="$(json "d['id']" <<<"$OUT")"
    else
      new_job="$done_job"
    fi
    expect "$denied" "$caller" cancel "$new_job"                       # CancelJob
    expect "$denied" "$caller" export "$done_job" "$WORK/out-$caller.safetensors"  # ExportWeights
  done
  [ -s "$WORK/out-submitter.safetensors" ] || fail "the submitter's export wrote nothing"
  [ ! -e "$WORK/out-viewer.safetensors" ] || fail "a refused export left a file"
  rm -f "$WORK"/out-*.safetensors
}

# Health and reflection answer without a token: raw gRPC from Python.
open_services() {  # open_services [CA_FILE]
  "$PY" - "$ADDRESS" "${1:-}" <<'PY' || fail "health or reflection refused a call without a token"
import sys, grpc
address, ca = sys.argv[1], sys.argv[2]
if ca:
    channel = grpc.secure_channel(address, grpc.ssl_channel_credentials(open(ca, "rb").read()))
else:
    channel = grpc.insecure_channel(address)
check = channel.unary_unary("/grpc.health.v1.Health/Check")
assert check(b"", timeout=10) == b"\x08\x01", "health is not SERVING"
reflect = channel.stream_stream("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo")
answers = list(reflect(iter([b"\x3a\x00"]), timeout=10))  # list_services: ""
assert b"ferry.v1.Ferry" in answers[0], answers
PY
  echo "  health and reflection: open"
}

# --- Start-up errors name the flag (and the line), never the token.
startup_error() {  # startup_error TEXT FLAGS...
  local text="$1"; shift
  set +e
  out="$("$FERRYD" --state_dir="$WORK/state-bad" --listen=127.0.0.1:0 --metrics_listen= "$@" 2>&1)"
  rc=$?
  set -e
  [ "$rc" -eq 1 ] || fail "ferryd $* exited $rc, not 1: $out"
  grep -qF -- "$text" <<<"$out" || fail "ferryd $* said '$out', which lacks '$text'"
  for secret in "${SECRETS[@]}"; do
    ! grep -qF -- "$secret" <<<"$out" || fail "ferryd $* printed a token: $out"
  done
  echo "refused to start as expected: $text"
}
startup_error "--tls_cert: needs --tls_key" --tls_cert=server.pem
startup_error "--tls_key: needs --tls_cert" --tls_key=server.key
startup_error "--tls_client_ca: client certificates need TLS" --tls_client_ca=ca.pem
startup_error "--tls_key=$WORK/missing.key: cannot read it" --tls_cert=server.pem --tls_key="$WORK/missing.key"
startup_error "--tls_key=server.pem: not a PEM private key" --tls_cert=server.pem --tls_key=server.pem
startup_error "--tls_key=client.key: gRPC cannot serve TLS with it and --tls_cert=server.pem (is it the certificate's private key?)" \
  --tls_cert=server.pem --tls_key=client.key
startup_error "--tokens_file=$WORK/missing: cannot open" --tokens_file="$WORK/missing"
printf 'viewer %s\nsubmitter\n' "$VIEWER" >bad-tokens
startup_error "--tokens_file=bad-tokens: line 2: expected \`ROLE TOKEN\`, found one field" --tokens_file=bad-tokens
printf 'viewer %s\n%s submitter\n' "$VIEWER" "$SUBMITTER" >bad-tokens
startup_error "--tokens_file=bad-tokens: line 2: the first field is not a role" --tokens_file=bad-tokens
printf 'viewer %s\nsubmitter %s\n' "$VIEWER" "$VIEWER" >bad-tokens
startup_error "line 2: the same token as line 1" --tokens_file=bad-tokens

# --- Plaintext on loopback with tokens.
echo "plaintext on loopback, tokens:"
start plain --tokens_file="$WORK/tokens" --metrics_listen=127.0.0.1:0
PLAIN_PID=$PID
PLAIN_ADDRESS=$ADDRESS
PLAIN_METRICS=$READY_METRICS
grep -q "serving on .* (plaintext, bearer tokens)" "$LOG" || fail "the start-up line does not say plaintext with tokens"
grep -q "bearer tokens from $WORK/tokens: 1 viewer, 1 submitter" "$LOG" || fail "the tokens were not counted"
TRANSPORT=()
matrix
open_services
# Refusals are logged (a burst of 10, then a line a second) and counted by
# method and code. The matrix's refusals come one process at a time, which a
# slow machine may spread thin enough to log every one: 30 at once spend the
# burst whatever the machine's pace.
grep -q "refused [A-Za-z]* from ipv4:127.0.0.1:[0-9]*: UNAUTHENTICATED: .*--token or FERRY_TOKEN" "$LOG" \
  || fail "no refusal was logged"
burst=()
for _ in $(seq 30); do
  "$FERRY" --address="$ADDRESS" "${TRANSPORT[@]}" --token="$VIEWER" cancel j-00000000 >/dev/null 2>&1 &
  burst+=($!)
done
wait "${burst[@]}" || true
sleep 1.1
expect denied viewer cancel j-00000000
grep -q "refused CancelJob from ipv4:127.0.0.1:[0-9]*: PERMISSION_DENIED: CancelJob needs the submitter role .* (and [0-9]* more refusals since the previous line were not logged)" \
  "$LOG" || fail "the denial after a second was not logged with the count of those not logged"
scrape="$("$PY" -c 'import sys, urllib.request; print(urllib.request.urlopen("http://" + sys.argv[1] + "/metrics").read().decode())' "$PLAIN_METRICS")"
for series in 'code="PERMISSION_DENIED",method="CancelJob"' 'code="PERMISSION_DENIED",method="SubmitJob"' \
              'code="UNAUTHENTICATED",method="ListJobs"' 'code="UNAUTHENTICATED",method="WatchJob"'; do
  grep -Eq "^ferry_rpc_refused_total\{$series\} [1-9]" <<<"$scrape" || fail "ferry_rpc_refused_total{$series} not counted"
done
! grep -q 'code="PERMISSION_DENIED",method="ListJobs"' <<<"$scrape" || fail "a viewer's ListJobs was counted as refused"
echo "refusals logged and counted in ferry_rpc_refused_total"
# FERRY_TOKEN is the same as --token.
FERRY_TOKEN="$VIEWER" "$FERRY" --address="$ADDRESS" list >/dev/null || fail "FERRY_TOKEN was not used"
set +e; out="$(FERRY_TOKEN="$VIEWER x" "$FERRY" --address="$ADDRESS" list 2>&1)"; rc=$?; set -e
[ "$rc" -eq 2 ] && grep -q "FERRY_TOKEN) has a space" <<<"$out" || fail "a token with a space: $rc $out"
# A TLS client cannot talk to a plaintext port.
TRANSPORT=(--tls_ca=ca.pem --timeout=3)
run submitter info
[ "$RC" -eq 3 ] || fail "a TLS client against plaintext exited $RC: $OUT"

# SIGHUP: the viewer's token is replaced by a new one; a bad file keeps them.
printf 'viewer %s\nsubmitter %s\n' "$NEWVIEWER" "$SUBMITTER" >tokens
kill -HUP "$PLAIN_PID"
for _ in $(seq 1 100); do grep -q "bearer tokens reloaded" "$LOG" && break; sleep 0.1; done
grep -q "bearer tokens reloaded from $WORK/tokens: 1 viewer, 1 submitter" "$LOG" || fail "SIGHUP did not reload"
TRANSPORT=()
expect unauthenticated viewer list
SECRETS_OLD_VIEWER="$VIEWER"
VIEWER="$NEWVIEWER"
expect ok viewer list
expect denied viewer cancel j-00000000
printf 'viewer %s\nviewer\n' "$BAD" >tokens
kill -HUP "$PLAIN_PID"
for _ in $(seq 1 100); do grep -q "SIGHUP: --tokens_file" "$LOG" && break; sleep 0.1; done
grep -q "SIGHUP: --tokens_file=$WORK/tokens: line 2: expected \`ROLE TOKEN\`, found one field.*; keeping the tokens loaded before" "$LOG" \
  || fail "a bad tokens file at SIGHUP was not reported"
expect ok viewer list
expect unauthenticated bad list
VIEWER="$SECRETS_OLD_VIEWER"
printf 'viewer %s\nsubmitter %s\n' "$VIEWER" "$SUBMITTER" >tokens

# --- TLS with tokens.
echo "TLS, tokens:"
start tls --tls_cert=server.pem --tls_key=server.key --tokens_file="$WORK/tokens"
grep -q "serving on .* (TLS, bearer tokens)" "$LOG" || fail "the start-up line does not say TLS with tokens"
TRANSPORT=(--tls_ca=ca.pem)
matrix
open_services ca.pem
# The environment works as the flags do.
FERRY_TLS_CA=ca.pem FERRY_TOKEN="$SUBMITTER" "$FERRY" --address="$ADDRESS" info >/dev/null \
  || fail "FERRY_TLS_CA and FERRY_TOKEN were not used"
# localhost is in the certificate too.
"$FERRY" --address="localhost:${ADDRESS##*:}" --tls_ca=ca.pem --token="$VIEWER" info >/dev/null \
  || fail "localhost did not verify"
# A plaintext client, or one that does not trust the CA, does not get in.
TRANSPORT=(--timeout=3)
run submitter info
[ "$RC" -eq 3 ] && grep -q "if ferryd serves TLS, give --tls_ca" <<<"$OUT" \
  || fail "a plaintext client against TLS exited $RC: $OUT"
TRANSPORT=(--tls_ca=rogue-ca.pem --timeout=3)
run submitter info
[ "$RC" -eq 3 ] || fail "a client trusting another CA exited $RC: $OUT"

# --- mTLS (with tokens): a client certificate from the CA is required.
echo "mTLS, tokens:"
start mtls --tls_cert=server.pem --tls_key=server.key --tls_client_ca=ca.pem --tokens_file="$WORK/tokens"
grep -q "serving on .* (TLS, client certificates, bearer tokens)" "$LOG" || fail "the start-up line does not say mTLS"
TRANSPORT=(--tls_ca=ca.pem --timeout=3)
run submitter info
[ "$RC" -eq 3 ] && grep -q "needs --tls_cert and --tls_key" <<<"$OUT" \
  || fail "a client without a certificate exited $RC: $OUT"
echo "  no client certificate: refused"
TRANSPORT=(--tls_ca=ca.pem --tls_cert=rogue.pem --tls_key=rogue.key --timeout=3)
run submitter info
[ "$RC" -eq 3 ] || fail "a client certificate from another CA exited $RC: $OUT"
echo "  certificate from another CA: refused"
TRANSPORT=(--tls_ca=ca.pem --tls_cert=client.pem --tls_key=client.key)
expect ok viewer info
expect ok submitter info
expect unauthenticated none info
expect denied viewer cancel j-00000000
FERRY_TLS_CA=ca.pem FERRY_TLS_CERT=client.pem FERRY_TLS_KEY=client.key FERRY_TOKEN="$VIEWER" \
  "$FERRY" --address="$ADDRESS" list >/dev/null || fail "FERRY_TLS_CERT and FERRY_TLS_KEY were not used"
set +e; out="$("$FERRY" --address="$ADDRESS" --tls_ca=ca.pem --tls_cert=client.pem info 2>&1)"; rc=$?; set -e
[ "$rc" -eq 2 ] && grep -q "go together" <<<"$out" || fail "--tls_cert without --tls_key: $rc $out"

# --- mTLS alone: the certificate is the credential, no token needed.
echo "mTLS, no tokens:"
start mtls-only --tls_cert=server.pem --tls_key=server.key --tls_client_ca=ca.pem
TRANSPORT=(--tls_ca=ca.pem --tls_cert=client.pem --tls_key=client.key)
expect ok none info
expect ok none list
TRANSPORT=(--tls_ca=ca.pem --timeout=3)
run none info
[ "$RC" -eq 3 ] || fail "a client without a certificate exited $RC: $OUT"

# --- No token or key in any log, job directory or job store.
SECRETS+=("$(sed -n 2p server.key)" "$(sed -n 2p client.key)")
for secret in "${SECRETS[@]}"; do
  if grep -rqF -- "$secret" "$WORK"/*.log "$WORK"/state-*; then
    fail "a secret is in $(grep -rlF -- "$secret" "$WORK"/*.log "$WORK"/state-* | head -3)"
  fi
done
echo "no token or key in ferryd's logs or state"
echo "PASS"
