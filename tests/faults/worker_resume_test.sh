#!/usr/bin/env bash
# A worker killed with SIGKILL mid-training and started again on the same
# job resumes from its last checkpoint and ends at exactly the final loss of
# an undisturbed run; a flipped byte or a truncated file in the newest
# checkpoint is detected and
# the one before is used, with the same result.
set -euo pipefail

RUNFILES="${TEST_SRCDIR:-$PWD}/ferry"
WORKER="$RUNFILES/server/ferry-worker"
WORK="$(mktemp -d "${TEST_TMPDIR:-/tmp}/resume.XXXXXX")"
fail() { echo "FAIL: $*" >&2; for f in "$WORK"/*.out; do echo "--- $f" >&2; tail -5 "$f" >&2; done; exit 1; }

job() {  # job FILE CHECKPOINT_DIR
  cat >"$1" <<YAML
name: resume
model: {layers: 2, hidden: 64, heads: 4, vocab_size: 64, seq_len: 32, dropout: 0.1}
data: {synthetic: {}}
train: {steps: 400, batch_size: 8, lr: 3.0e-3, threads: 1}
checkpoint: {dir: $2, every_steps: 50, keep: 3}
YAML
}

job "$WORK/calm.yaml" "$WORK/calm-ckpt"
"$WORKER" --spec="$WORK/calm.yaml" >"$WORK/calm.out" 2>&1 || fail "the undisturbed run failed"
CALM="$(sed -n 's/^final loss //p' "$WORK/calm.out")"
[ -n "$CALM" ] || fail "no final loss"

# Killed after a checkpoint, mid-step, then started again.
job "$WORK/killed.yaml" "$WORK/killed-ckpt"
"$WORKER" --spec="$WORK/killed.yaml" >"$WORK/killed.out" 2>&1 &
PID=$!
for _ in $(seq 1 600); do grep -q "checkpoint: step 150 written" "$WORK/killed.out" && break; sleep 0.05; done
grep -q "checkpoint: step 150 written" "$WORK/killed.out" || fail "no checkpoint at step 150"
kill -9 "$PID"; wait "$PID" 2>/dev/null || true
grep -q "^final loss" "$WORK/killed.out" && fail "the run finished before it was killed"
"$WORKER" --spec="$WORK/killed.yaml" >"$WORK/resumed.out" 2>&1 || fail "the resumed run failed"
grep -q "checkpoint: resuming after step 1[5-9]0" "$WORK/resumed.out" || fail "it did not resume: $(head -3 "$WORK/resumed.out")"
RESUMED="$(sed -n 's/^final loss //p' "$WORK/resumed.out")"
echo "undisturbed $CALM, killed and resumed $RESUMED"
[ "$RESUMED" = "$CALM" ] || fail "resumed run ended at $RESUMED, undisturbed at $CALM"

# SIGTERM: the worker stops after the current step, checkpoints it, and
# exits 3 (cancelled); the next run resumes right there.
job "$WORK/term.yaml" "$WORK/term-ckpt"
"$WORKER" --spec="$WORK/term.yaml" >"$WORK/term.out" 2>&1 &
PID=$!
for _ in $(seq 1 600); do grep -q "^step 60/" "$WORK/term.out" && break; sleep 0.05; done
kill -TERM "$PID"
set +e; wait "$PID"; rc=$?; set -e
[ "$rc" -eq 3 ] || fail "a worker asked to stop exited $rc, not 3"
STOPPED="$(sed -n 's/^checkpoint: step \([0-9]*\) written.*/\1/p' "$WORK/term.out" | tail -1)"
[ -n "$STOPPED" ] && [ $((STOPPED % 50)) -ne 0 ] || fail "no checkpoint at the stop (last: '$STOPPED')"
"$WORKER" --spec="$WORK/term.yaml" >"$WORK/term2.out" 2>&1 || fail "the run after SIGTERM failed"
grep -q "checkpoint: resuming after step $STOPPED " "$WORK/term2.out" || fail "it did not resume after step $STOPPED"
[ "$(sed -n 's/^final loss //p' "$WORK/term2.out")" = "$CALM" ] || fail "the run after SIGTERM ended elsewhere"

# Damage the newest checkpoint of a finished run's directory: the next run
# skips it, says why, and resumes from the one before.
NEWEST="$(ls -d "$WORK/calm-ckpt/rank0/step-"* | sort | tail -1)"
FILE="$NEWEST/rank0.chunks"
/usr/bin/python3 -c "
import sys; p=sys.argv[1]; b=bytearray(open(p,'rb').read()); b[len(b)//2]^=0xff; open(p,'wb').write(bytes(b))" "$FILE"
"$WORKER" --spec="$WORK/calm.yaml" >"$WORK/damaged.out" 2>&1 || fail "the run after damage failed"
grep -q "checkpoint: skipped step-000000000400: rank0.chunks: CRC-32" "$WORK/damaged.out" \
  || fail "the damage was not reported: $(grep checkpoint "$WORK/damaged.out" | head -3)"
grep -q "checkpoint: resuming after step 350" "$WORK/damaged.out" || fail "it did not fall back to step 350"
[ "$(sed -n 's/^final loss //p' "$WORK/damaged.out")" = "$CALM" ] || fail "the run after damage ended elsewhere"

# Truncate the newest checkpoint's chunks (a disk that lost the file's end):
# skipped for its size, the one before used, the same result.
NEWEST="$(ls -d "$WORK/calm-ckpt/rank0/step-"* | sort | tail -1)"
truncate -s 1000 "$NEWEST/rank0.chunks"
"$WORKER" --spec="$WORK/calm.yaml" >"$WORK/truncated.out" 2>&1 || fail "the run after truncation failed"
grep -q "checkpoint: skipped step-000000000400: rank0.chunks: 1000 bytes, the manifest says .* (truncated?)" \
  "$WORK/truncated.out" || fail "the truncation was not reported: $(grep checkpoint "$WORK/truncated.out" | head -3)"
grep -q "checkpoint: resuming after step 350" "$WORK/truncated.out" || fail "it did not fall back to step 350"
[ "$(sed -n 's/^final loss //p' "$WORK/truncated.out")" = "$CALM" ] || fail "the run after truncation ended elsewhere"
echo PASS
