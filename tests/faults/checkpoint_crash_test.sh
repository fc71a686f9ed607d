#!/usr/bin/env bash
# A worker that dies between writing a checkpoint and renaming it into place
# (strace turns that rename into SIGKILL) leaves only a temporary directory;
# the next run ignores it, resumes from the checkpoint before and ends at the
# undisturbed run's final loss.
set -euo pipefail

RUNFILES="${TEST_SRCDIR:-$PWD}/ferry"
WORKER="$RUNFILES/server/ferry-worker"
WORK="$(mktemp -d "${TEST_TMPDIR:-/tmp}/crash.XXXXXX")"
fail() { echo "FAIL: $*" >&2; for f in "$WORK"/*.out; do echo "--- $f" >&2; tail -5 "$f" >&2; done; exit 1; }
command -v strace >/dev/null || fail "strace is missing (tools/install_deps.sh installs it)"

job() {  # job FILE CHECKPOINT_DIR
  cat >"$1" <<YAML
model: {layers: 2, hidden: 64, heads: 4, vocab_size: 64, seq_len: 32, dropout: 0.1}
data: {synthetic: {}}
train: {steps: 250, batch_size: 8, lr: 3.0e-3, threads: 1}
checkpoint: {dir: $2, every_steps: 50, keep: 3}
YAML
}

job "$WORK/calm.yaml" "$WORK/calm-ckpt"
"$WORKER" --spec="$WORK/calm.yaml" >"$WORK/calm.out" 2>&1 || fail "the undisturbed run failed"
CALM="$(sed -n 's/^final loss //p' "$WORK/calm.out")"
[ -n "$CALM" ] || fail "no final loss"

# Once step 100 is written, strace attaches and turns the next rename (step
# 150's directory, by the thread that writes it; renameat, relative to the
# checkpoint directory's descriptor) into SIGKILL.
job "$WORK/crash.yaml" "$WORK/crash-ckpt"
"$WORKER" --spec="$WORK/crash.yaml" >"$WORK/crash.out" 2>&1 &
PID=$!
for _ in $(seq 1 600); do grep -q "checkpoint: step 100 written" "$WORK/crash.out" && break; sleep 0.01; done
grep -q "checkpoint: step 100 written" "$WORK/crash.out" || fail "no checkpoint at step 100"
strace -f -qq -o /dev/null -p "$PID" -e trace=rename,renameat,renameat2 \
  -e inject=rename,renameat,renameat2:error=EIO:signal=SIGKILL:when=1 &
TRACER=$!
set +e
wait "$PID"
rc=$?
wait "$TRACER"
set -e
grep -q "^step 1[5-9][0-9]/" "$WORK/crash.out" || fail "strace attached too late or the run ended early"
[ "$rc" -ne 0 ] || fail "the worker was not killed at the rename"
grep -q "^final loss" "$WORK/crash.out" && fail "the run finished"
ls -d "$WORK"/crash-ckpt/rank0/.tmp-step-000000000150-* >/dev/null 2>&1 \
  || fail "no unfinished step-150 directory: $(ls -a "$WORK/crash-ckpt/rank0")"
[ -e "$WORK/crash-ckpt/rank0/step-000000000150" ] && fail "step 150 was renamed into place"
"$WORKER" --spec="$WORK/crash.yaml" >"$WORK/resumed.out" 2>&1 || fail "the run after the crash failed"
grep -q "checkpoint: resuming after step 100 " "$WORK/resumed.out" \
  || fail "it did not resume from step 100: $(grep checkpoint "$WORK/resumed.out" | head -3)"
RESUMED="$(sed -n 's/^final loss //p' "$WORK/resumed.out")"
echo "undisturbed $CALM, killed between write and rename and resumed $RESUMED"
[ "$RESUMED" = "$CALM" ] || fail "the resumed run ended at $RESUMED, the undisturbed one at $CALM"
ls -d "$WORK"/crash-ckpt/rank0/.tmp-* >/dev/null 2>&1 && fail "the unfinished directory was not cleaned up"
echo PASS
