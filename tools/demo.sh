#!/usr/bin/env bash
# The demo: installs what is missing, builds Ferry, starts ferryd, and trains
# a small GPT through it on the license texts every Debian system has, showing
# the progress live. No GPU needed. Run from anywhere:
#   tools/demo.sh           # stops the daemon at the end
#   tools/demo.sh --keep    # leaves it running for you to try the CLI
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
KEEP=0
[ "${1:-}" = "--keep" ] && KEEP=1

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "Installing build dependencies (only what is missing)"
bash tools/install_deps.sh

say "Building ferryd, ferry-worker and ferry"
start=$(date +%s)
if ! bazel build //server:ferryd //server:ferry-worker //client:ferry >"$ROOT/.ferry-build.log" 2>&1; then
  tail -30 "$ROOT/.ferry-build.log" >&2
  echo "the build failed; the whole log is in $ROOT/.ferry-build.log" >&2
  exit 1
fi
echo "built in $(( $(date +%s) - start )) s"
BIN="$(bazel info bazel-bin 2>/dev/null)"
FERRYD="$BIN/server/ferryd"
FERRY="$BIN/client/ferry"

DEMO="$ROOT/.ferry-demo"
mkdir -p "$DEMO"
rm -f "$DEMO/ready.json"

say "Starting ferryd (state in $DEMO/state, log in $DEMO/ferryd.log)"
# Job paths must lie in --allowed_roots (by default the state directory and
# your home directory); the demo's token file is in $DEMO.
"$FERRYD" --state_dir="$DEMO/state" --allowed_roots="$DEMO" --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 \
  --ready_file="$DEMO/ready.json" >"$DEMO/ferryd.log" 2>&1 &
DAEMON=$!
stop_daemon() { kill -TERM "$DAEMON" 2>/dev/null && wait "$DAEMON" 2>/dev/null || true; }
[ "$KEEP" = 1 ] || trap stop_daemon EXIT
for _ in $(seq 1 600); do
  [ -s "$DEMO/ready.json" ] && break
  kill -0 "$DAEMON" 2>/dev/null || { echo "ferryd did not start:" >&2; tail "$DEMO/ferryd.log" >&2; exit 1; }
  sleep 0.1
done
field() { /usr/bin/python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$DEMO/ready.json" "$1"; }
export FERRY_ADDRESS="$(field listen)"
METRICS="$(field metrics_listen)"
"$FERRY" info

say "Tokenising /usr/share/common-licenses (byte-level)"
"$FERRY" data prepare --out="$DEMO/licenses.bin" /usr/share/common-licenses/* 2>/dev/null

say "Training gpt2-tiny on them: ferry submit examples/licenses.yaml --wait"
"$FERRY" submit examples/licenses.yaml --set=data.path="$DEMO/licenses.bin" --wait
JOB="$("$FERRY" list -o json | /usr/bin/python3 -c "import json,sys; print(json.load(sys.stdin)['jobs'][-1]['id'])")"

say "The finished job: ferry get $JOB"
"$FERRY" get "$JOB"

say "A few of the daemon's Prometheus metrics (http://$METRICS/metrics)"
curl -s "http://$METRICS/metrics" | grep -E '^ferry_(jobs\{|loss |tokens_total |step_duration_seconds_(count|sum)|memory_(bytes\{kind="param"|transferred_bytes_total|phase))' || true

if [ "$KEEP" = 1 ]; then
  say "ferryd keeps running (pid $DAEMON). Try:"
  echo "  export FERRY_ADDRESS=$FERRY_ADDRESS"
  echo "  $FERRY submit examples/gpt2-tiny.yaml --wait"
  echo "  $FERRY list"
  echo "  kill $DAEMON    # to stop it"
else
  say "Done; stopping ferryd. (tools/demo.sh --keep leaves it running.)"
fi
