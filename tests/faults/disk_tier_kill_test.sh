#!/usr/bin/env bash
# A job whose gradients and optimizer states partly live in the disk tier's
# chunk files (bf16: AdamW's moments and the fp32 master weights), killed three times
# while it trains — its worker with SIGKILL at a random moment of a step,
# its worker again by strace at the write of a chunk file (the others of
# that step already written), and the daemon with SIGKILL — resumes each
# time from its newest checkpoint and ends at bit for bit the final loss of
# the same spec run undisturbed. No run reuses the chunk files of a killed
# one: each run has a scratch directory of its own and the one a killed
# daemon left behind is gone once the next run trains; the job's scratch/
# is gone when it ends.
set -euo pipefail

RUNFILES="${TEST_SRCDIR:-$PWD}/ferry"
source "$RUNFILES/tests/lib/ferryd.sh"
WORK="$(mktemp -d "${TEST_TMPDIR:-/tmp}/diskkill.XXXXXX")"
WORK="$(cd "$WORK" && pwd -P)"
STATE="$WORK/state"
STARTS=0

fail() { echo "FAIL: $*" >&2; show_logs 12 "$WORK"/ferryd.*.log "$STATE"/jobs/*/worker.log; exit 1; }
kill_ferryd_at_exit
command -v strace >/dev/null || fail "strace is missing (tools/install_deps.sh installs it)"

start_daemon() {
  STARTS=$((STARTS + 1))
  start_ferryd "$WORK/ferryd.$STARTS.log" --state_dir="$STATE" --allowed_roots="$WORK"
}
worker_pid() { pgrep -f -- "--spec=$STATE/jobs/$1/" || true; }
# The scratch directory each run of job $1 used, in order, from its log.
chunk_dirs() { sed -n 's/^memory: gradients of .* chunks on disk ([^ ]* [KMGT]\?i\?B in \(.*\)), host side.*/\1/p' "$STATE/jobs/$1/worker.log" 2>/dev/null; }
wait_runs() {  # wait_runs ID N: until the Nth run of job ID has laid out its chunk files
  for _ in $(seq 1 1200); do [ "$(chunk_dirs "$1" | wc -l)" -ge "$2" ] && return 0; sleep 0.05; done
  fail "run $2 of $1 did not start in 60 s"
}

# Static placement keeps every optimizer state off the device (ZeRO-Offload's
# split), so each update reads and writes the disk-homed states whatever the
# device's size; 16 KiB chunks make 21 similar ones, and a host budget below
# the model's data sends the states of some of them to disk.
cat >"$WORK/job.yaml" <<'YAML'
model: {layers: 2, hidden: 64, heads: 4, vocab_size: 64, seq_len: 32, dropout: 0.1}
data: {synthetic: {}}
train: {steps: 600, batch_size: 8, lr: 3.0e-3, threads: 1, precision: bf16}
memory: {policy: static, device_budget: 64MiB, host_budget: 1200KiB, chunk_size: 16KiB}
max_restarts: 3
YAML

start_daemon
CALM="$("$FERRY" submit "$WORK/job.yaml" --set=checkpoint.dir=$WORK/calm,checkpoint.every_steps=50 -o json | json "d['id']")"
"$FERRY" watch "$CALM" >"$WORK/calm.txt" 2>&1 || fail "the undisturbed job failed: $(tail -2 "$WORK/calm.txt")"
"$FERRY" get "$CALM" -o json >"$WORK/calm.json"
grep -q "^memory: gradients of [0-9]* and optimizer states of [1-9][0-9]* of 21 chunks on disk" \
  "$STATE/jobs/$CALM/worker.log" || fail "no optimizer states on disk: $(grep '^memory:' "$STATE/jobs/$CALM/worker.log")"
"$PY" - "$WORK/calm.json" <<'PYEOF' || fail "the undisturbed job moved nothing to or from the disk"
import json, sys
p = json.load(open(sys.argv[1]))["progress"]
print(f"undisturbed: {p['disk_chunks']} chunks' gradients or optimizer states on disk, {p['bytes_disk_to_host']} bytes read "
      f"and {p['bytes_host_to_disk']} written in its last step")
assert p["disk_chunks"] > 0 and int(p["disk_model_bytes"]) > 0, p
assert int(p["bytes_disk_to_host"]) > 0 and int(p["bytes_host_to_disk"]) > 0, p
PYEOF
[ -e "$STATE/jobs/$CALM/scratch" ] && fail "the finished job's scratch directory is still there: $(ls -R "$STATE/jobs/$CALM/scratch")"
CALM_LOSS="$(json "d['progress']['loss']" <"$WORK/calm.json")"

HIT="$("$FERRY" submit "$WORK/job.yaml" --set=checkpoint.dir=$WORK/hit,checkpoint.every_steps=50 -o json | json "d['id']")"

# 1. The worker, at a random moment of a step after the step-100 checkpoint.
wait_runs "$HIT" 1
wait_checkpoint "$HIT" 100
sleep "0.0$((RANDOM % 10))$((RANDOM % 10))"
PID="$(worker_pid "$HIT")"
[ -n "$PID" ] || fail "no worker for $HIT"
kill -9 "$PID"
echo "killed the worker (pid $PID) at step $(get "$HIT" "d['progress']['step']")"

# 2. The worker, by strace, as it writes the chunk file of the last disk-homed
# chunk: the step's earlier chunk files hold its new states, this one the
# step before's.
wait_runs "$HIT" 2
wait_checkpoint "$HIT" 200
DIR="$(chunk_dirs "$HIT" | sed -n 2p)"
LAST="$(ls "$DIR" | sort -V | tail -1)"
PID="$(worker_pid "$HIT")"
[ -n "$PID" ] || fail "no worker for the second run"
strace -f -qq -o "$WORK/strace.out" -p "$PID" -P "$DIR/$LAST" -e trace=pwrite64 \
  -e inject=pwrite64:error=EIO:signal=SIGKILL:when=1 2>/dev/null &
TRACER=$!
wait "$TRACER" || true
grep -q "^[0-9]* *pwrite64(" "$WORK/strace.out" || fail "strace saw no write of $DIR/$LAST: $(tail -5 "$WORK/strace.out")"
grep -q "killed by SIGKILL" "$WORK/strace.out" || fail "the worker was not killed at the write: $(tail -5 "$WORK/strace.out")"
for _ in $(seq 1 50); do [ "$(worker_pid "$HIT")" = "$PID" ] || break; sleep 0.1; done
[ "$(worker_pid "$HIT")" = "$PID" ] && fail "the worker outlived its kill"
echo "killed the worker (pid $PID) writing $LAST at step $(get "$HIT" "d['progress']['step']")"

# 3. The daemon: its worker dies with it, and nobody removes the run's
# chunk files; the next daemon's run empties the rank's directory.
wait_runs "$HIT" 3
wait_checkpoint "$HIT" 300
DIR3="$(chunk_dirs "$HIT" | sed -n 3p)"
kill -9 "$DAEMON"; wait "$DAEMON" 2>/dev/null || true; DAEMON=""
for _ in $(seq 1 50); do [ -z "$(worker_pid "$HIT")" ] && break; sleep 0.1; done
[ -z "$(worker_pid "$HIT")" ] || fail "a worker outlived its daemon"
[ -n "$(ls -A "$DIR3")" ] || fail "the killed daemon's run left no chunk files in $DIR3"
echo "killed ferryd; its run left $(ls "$DIR3" | wc -l) chunk files in $DIR3"
start_daemon
wait_runs "$HIT" 4
DIR4="$(chunk_dirs "$HIT" | sed -n 4p)"
LEFT="$(ls -A "$(dirname "$DIR4")" 2>/dev/null | tr '\n' ' ')"
[ -e "$DIR3" ] && fail "the killed run's chunk files are still there beside the new run's: $(ls -la "$DIR3")"
[ -z "$LEFT" ] || [ "$LEFT" = "$(basename "$DIR4") " ] || fail "the rank's directory holds $LEFT, not only the new run's $DIR4"

"$FERRY" watch "$HIT" >"$WORK/hit.txt" 2>&1 || fail "the job killed three times did not succeed: $(tail -3 "$WORK/hit.txt")"
"$FERRY" get "$HIT" -o json >"$WORK/hit.json"
[ "$(json "d['state']" <"$WORK/hit.json")" = JOB_STATE_SUCCEEDED ] || fail "the job is $(json "d['state']" <"$WORK/hit.json")"
[ "$(json "d['attempts']" <"$WORK/hit.json")" = 4 ] || fail "attempts is $(json "d['attempts']" <"$WORK/hit.json"), not 4"
[ "$(json "d.get('interrupted_runs', 0)" <"$WORK/hit.json")" = 1 ] || fail "interrupted_runs is not 1"
[ "$(chunk_dirs "$HIT" | sort -u | wc -l)" = 4 ] || fail "runs shared a scratch directory: $(chunk_dirs "$HIT")"
[ "$(grep -c "^checkpoint: resuming after step " "$STATE/jobs/$HIT/worker.log")" = 3 ] \
  || fail "not every run after a kill resumed from a checkpoint: $(grep '^checkpoint: resuming' "$STATE/jobs/$HIT/worker.log")"
grep -q "^checkpoint: skipped" "$STATE/jobs/$HIT/worker.log" && fail "a checkpoint was damaged by a kill"
"$PY" - "$WORK/hit.json" <<'PYEOF' || fail "the resumed job moved nothing to or from the disk"
import json, sys
p = json.load(open(sys.argv[1]))["progress"]
assert p["disk_chunks"] > 0 and int(p["bytes_disk_to_host"]) > 0 and int(p["bytes_host_to_disk"]) > 0, p
PYEOF
HIT_LOSS="$(json "d['progress']['loss']" <"$WORK/hit.json")"
echo "undisturbed final loss $CALM_LOSS, killed three times and resumed $HIT_LOSS"
[ "$HIT_LOSS" = "$CALM_LOSS" ] || fail "the resumed job ended at $HIT_LOSS, the undisturbed one at $CALM_LOSS"
[ -e "$STATE/jobs/$HIT/scratch" ] && fail "the job's scratch directory outlived it: $(ls -R "$STATE/jobs/$HIT/scratch")"
kill -TERM "$DAEMON"; wait "$DAEMON" || fail "ferryd exited non-zero after SIGTERM"
DAEMON=""
echo PASS
