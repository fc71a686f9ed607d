#!/usr/bin/env bash
# A worker killed with SIGKILL mid-training and started again on the same
# job resumes from its last checkpoint and ends at exactly the final loss of
# an undisturbed run; a flipped byte in the newest checkpoint is detected and
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
