#!/usr/bin/env bash
# Path confinement through a real ferryd started with --allowed_roots: paths
# outside the roots are refused at submit with the roots named; a job checked
# fine whose data file (or checkpoint directory) is then replaced by a link
# to somewhere outside fails in its worker, which reads and writes nothing
# out there; a job inside the roots trains, checkpoints and exports.
set -euo pipefail

RUNFILES="${TEST_SRCDIR:-$PWD}/ferry"
source "$RUNFILES/tests/lib/ferryd.sh"
WORK="$(mktemp -d "${TEST_TMPDIR:-/tmp}/paths.XXXXXX")"
WORK="$(cd "$WORK" && pwd -P)"
ROOT="$WORK/root"
OUT="$WORK/outside"
mkdir -p "$ROOT" "$OUT/ck"

fail() { echo "FAIL: $*" >&2; echo "--- ferryd log ---" >&2; tail -40 "$WORK/ferryd.log" >&2 || true; exit 1; }

# A root that does not exist stops ferryd at start, naming the flag.
set +e
"$FERRYD" --state_dir="$WORK/bad-state" --listen=127.0.0.1:0 --metrics_listen= \
  --allowed_roots="$WORK/nonexistent" >"$WORK/bad.log" 2>&1
rc=$?
set -e
[ "$rc" -eq 1 ] || fail "ferryd with a missing root exited $rc, not 1"
grep -q -- "--allowed_roots: $WORK/nonexistent" "$WORK/bad.log" || fail "no flag in: $(cat "$WORK/bad.log")"

"$FERRYD" --state_dir="$WORK/state" --listen=127.0.0.1:0 --metrics_listen= \
  --allowed_roots="$ROOT" --ready_file="$WORK/ready.json" >"$WORK/ferryd.log" 2>&1 &
DAEMON=$!
cleanup() { kill "$DAEMON" 2>/dev/null || true; wait "$DAEMON" 2>/dev/null || true; }
trap cleanup EXIT
wait_ready "$DAEMON" "$WORK/ready.json"
export FERRY_ADDRESS="$READY_ADDRESS"
grep -q "paths in job specs must be inside $ROOT" "$WORK/ferryd.log" || fail "the roots are not logged"
"$FERRY" info | grep -qxF "paths:   job spec paths must be inside $ROOT" || fail "ferry info does not show the roots"
[ "$("$FERRY" info -o json | json "d['allowed_roots']")" = "['$ROOT']" ] || fail "DaemonInfo.allowed_roots"

# Token files: one inside, one (just as good) outside.
seq 1 3000 >"$WORK/text.txt"
"$FERRY" data prepare --out="$ROOT/t.bin" "$WORK/text.txt" >/dev/null
cp "$ROOT/t.bin" "$OUT/secret.bin"
cp "$ROOT/t.bin" "$ROOT/swap.bin"
mkdir "$ROOT/ckswap"

job() {  # job FILE YAML
  printf '%s\n' "$2" >"$1"
}
job "$WORK/passwd.yaml" "data: {path: /etc/passwd}"
expect_refusal "permission denied: data.path: /etc/passwd is outside the allowed roots ($ROOT); put the file under one of them or start ferryd with --allowed_roots including its directory" \
  -- submit "$WORK/passwd.yaml"
job "$WORK/dotdot.yaml" "data: {path: $ROOT/../outside/secret.bin}"
expect_refusal "data.path: $ROOT/../outside/secret.bin resolves to $OUT/secret.bin, outside the allowed roots" \
  -- submit "$WORK/dotdot.yaml"
ln -s "$OUT/secret.bin" "$ROOT/link.bin"
job "$WORK/link.yaml" "data: {path: $ROOT/link.bin}"
expect_refusal "resolves to $OUT/secret.bin, outside the allowed roots" -- submit "$WORK/link.yaml"
ln -s "$OUT/ck" "$ROOT/cklink"
job "$WORK/cklink.yaml" "data: {path: $ROOT/t.bin}
checkpoint: {dir: $ROOT/cklink/run}"
expect_refusal "checkpoint.dir: $ROOT/cklink/run resolves to $OUT/ck/run, outside the allowed roots" \
  -- submit "$WORK/cklink.yaml"
mkfifo "$ROOT/fifo"
job "$WORK/fifo.yaml" "data: {path: $ROOT/fifo}"
expect_refusal "data.path: $ROOT/fifo is a FIFO" -- submit "$WORK/fifo.yaml"
job "$WORK/zero.yaml" "data: {path: /dev/zero}"
expect_refusal "permission denied: data.path: /dev/zero is outside the allowed roots" -- submit "$WORK/zero.yaml"

# A long job holds the device, so the next ones wait, checked and accepted.
job "$WORK/long.yaml" "data: {synthetic: {}}
train: {steps: 100000}"
LONG="$("$FERRY" submit "$WORK/long.yaml" -o json | json "d['id']")"
for _ in $(seq 1 300); do
  [ "$("$FERRY" get "$LONG" -o json | json "d['state']")" = "JOB_STATE_RUNNING" ] && break
  sleep 0.1
done
job "$WORK/swapdata.yaml" "data: {path: $ROOT/swap.bin}
train: {steps: 4}"
SWAPDATA="$("$FERRY" submit "$WORK/swapdata.yaml" -o json | json "d['id']")"
job "$WORK/swapck.yaml" "data: {path: $ROOT/t.bin}
train: {steps: 4}
checkpoint: {dir: $ROOT/ckswap, every_steps: 2}"
SWAPCK="$("$FERRY" submit "$WORK/swapck.yaml" -o json | json "d['id']")"
job "$WORK/good.yaml" "data: {path: $ROOT/t.bin}
train: {steps: 4}
checkpoint: {dir: $ROOT/ck-good, every_steps: 2}"
GOOD="$("$FERRY" submit "$WORK/good.yaml" -o json | json "d['id']")"
echo "accepted $SWAPDATA, $SWAPCK, $GOOD behind $LONG"

# After the check, before the workers run: links to the outside in their place.
rm "$ROOT/swap.bin"
ln -s "$OUT/secret.bin" "$ROOT/swap.bin"
rmdir "$ROOT/ckswap"
ln -s "$OUT/ck" "$ROOT/ckswap"
"$FERRY" cancel "$LONG" >/dev/null

wait_end() {  # wait_end ID -> prints the job's JSON once it has ended
  for _ in $(seq 1 1200); do
    "$FERRY" get "$1" -o json >"$WORK/$1.json"
    case "$(json "d['state']" <"$WORK/$1.json")" in
      JOB_STATE_SUCCEEDED|JOB_STATE_FAILED|JOB_STATE_CANCELLED) return 0 ;;
    esac
    sleep 0.1
  done
  fail "job $1 did not end in 120 s"
}
for id in "$SWAPDATA" "$SWAPCK" "$GOOD"; do wait_end "$id"; done

state() { json "d['state']" <"$WORK/$1.json"; }
error() { json "d.get('error', '')" <"$WORK/$1.json"; }
[ "$(state "$SWAPDATA")" = "JOB_STATE_FAILED" ] || fail "the job whose data became a link ended $(state "$SWAPDATA")"
error "$SWAPDATA" | grep -qF "data.path: $ROOT/swap.bin resolves to $OUT/secret.bin, outside the allowed roots ($ROOT)" \
  || fail "unclear error: $(error "$SWAPDATA")"
[ "$(state "$SWAPCK")" = "JOB_STATE_FAILED" ] || fail "the job whose checkpoint directory became a link ended $(state "$SWAPCK")"
error "$SWAPCK" | grep -qF "checkpoint.dir: $ROOT/ckswap resolves to $OUT/ck, outside the allowed roots ($ROOT)" \
  || fail "unclear error: $(error "$SWAPCK")"
[ -z "$(ls -A "$OUT/ck")" ] || fail "something was written outside the roots: $(ls -laR "$OUT/ck")"
echo "the swapped jobs failed: $(error "$SWAPDATA" | head -1)"

[ "$(state "$GOOD")" = "JOB_STATE_SUCCEEDED" ] || fail "the job inside the roots ended $(state "$GOOD"): $(error "$GOOD")"
[ -f "$ROOT/ck-good/rank0/step-000000000004/MANIFEST" ] || fail "no checkpoint under $ROOT/ck-good"
"$FERRY" export "$GOOD" "$WORK/good.safetensors" | grep -q "at step 4" || fail "the export failed"
[ -s "$WORK/good.safetensors" ] || fail "no exported file"

# The good job's checkpoint directory replaced by a link out: the export
# refuses it rather than read what is there.
mv "$ROOT/ck-good" "$OUT/ck-good"
ln -s "$OUT/ck-good" "$ROOT/ck-good"
set +e; out="$("$FERRY" export "$GOOD" "$WORK/again.safetensors" 2>&1)"; rc=$?; set -e
[ "$rc" -ne 0 ] || fail "an export through a link outside the roots succeeded"
grep -qF "failed precondition: checkpoint.dir: $ROOT/ck-good/rank0 resolves to $OUT/ck-good/rank0, outside the allowed roots" <<<"$out" \
  || fail "unclear export error: $out"
echo "PASS"
