#!/usr/bin/env bash
# A checkpoint directory on a file system too small for a second checkpoint
# (a 2 MiB tmpfs; one checkpoint of this model is about 1.3 MB): the worker
# writes the first, reports the next ones as not written with "No space left
# on device", keeps the first valid, and trains on to the undisturbed run's
# final loss; a following run resumes from the first checkpoint and ends
# there too. With checkpoint.on_error: fail the run fails cleanly instead.
#
# A small tmpfs needs a private mount namespace: `unshare --mount` as root,
# else `unshare --user --map-root-user --mount`. Where neither is allowed
# the test says why and skips.
set -euo pipefail

RUNFILES="${TEST_SRCDIR:-$PWD}/ferry"
source "$RUNFILES/tests/lib/ferryd.sh"
WORKER="$RUNFILES/server/ferry-worker"
SELF="$(readlink -f "$0")"

source "$RUNFILES/tests/lib/mount_ns.sh"
in_private_mounts "$SELF"

WORK="$(mktemp -d "${TEST_TMPDIR:-/tmp}/diskfull.XXXXXX")"
fail() { echo "FAIL: $*" >&2; for f in "$WORK"/*.out; do echo "--- $f" >&2; grep -v '^step' "$f" | tail -8 >&2; done; exit 1; }

job() {  # job FILE CHECKPOINT_DIR [ON_ERROR]
  cat >"$1" <<YAML
name: diskfull
model: {layers: 2, hidden: 64, heads: 4, vocab_size: 64, seq_len: 32, dropout: 0.1}
data: {synthetic: {}}
train: {steps: 200, batch_size: 8, lr: 3.0e-3, threads: 1}
checkpoint: {dir: $2, every_steps: 50, keep: 2${3:+, on_error: $3}}
YAML
}
small_fs() {  # small_fs DIR: a 2 MiB tmpfs at DIR
  mkdir -p "$1"
  mount -t tmpfs -o size=2m tmpfs "$1" || fail "cannot mount a tmpfs at $1"
}

echo "in a private mount namespace: $FERRY_PRIVATE_MOUNTS"
job "$WORK/calm.yaml" "$WORK/calm-ckpt"
"$WORKER" --spec="$WORK/calm.yaml" >"$WORK/calm.out" 2>&1 || fail "the undisturbed run failed"
CALM="$(sed -n 's/^final loss //p' "$WORK/calm.out")"
[ -n "$CALM" ] || fail "no final loss"
SIZE="$(du -sb "$WORK/calm-ckpt/rank0/step-000000000200" | cut -f1)"
echo "one checkpoint: $SIZE bytes; the file system holds 2097152"
[ "$SIZE" -lt 2097152 ] && [ $((2 * SIZE)) -gt 2097152 ] || fail "checkpoint of $SIZE bytes: resize the tmpfs"

# Default (on_error: continue): step 50 fits, the rest do not; training goes on.
small_fs "$WORK/small"
job "$WORK/full.yaml" "$WORK/small/ckpt"
"$WORKER" --spec="$WORK/full.yaml" >"$WORK/full.out" 2>&1 || fail "a run with a full disk failed (on_error: continue)"
grep -q "checkpoint: step 50 written" "$WORK/full.out" || fail "the first checkpoint was not written"
grep -q "checkpoint: step 100 not written: .*rank0.*No space left on device; the newest checkpoint is still step 50; training continues" \
  "$WORK/full.out" || fail "the full disk was not reported: $(grep checkpoint "$WORK/full.out" | head -4)"
grep -q "checkpoint: step 200 not written" "$WORK/full.out" || fail "the last checkpoint's failure was not reported"
FULL="$(sed -n 's/^final loss //p' "$WORK/full.out")"
[ "$FULL" = "$CALM" ] || fail "with the disk full training ended at '$FULL', undisturbed at $CALM"
[ "$(ls -A "$WORK/small/ckpt/rank0" | tr '\n' ' ')" = "latest step-000000000050 " ] \
  || fail "the checkpoint directory holds $(ls -A "$WORK/small/ckpt/rank0" | tr '\n' ' ')"

# The next run resumes from step 50 (still valid) and ends where the
# undisturbed run did, its own checkpoints failing alike.
"$WORKER" --spec="$WORK/full.yaml" >"$WORK/again.out" 2>&1 || fail "the run after the full disk failed"
grep -q "checkpoint: resuming after step 50 " "$WORK/again.out" || fail "it did not resume from step 50"
grep -q "checkpoint: skipped" "$WORK/again.out" && fail "a checkpoint was damaged"
[ "$(sed -n 's/^final loss //p' "$WORK/again.out")" = "$CALM" ] || fail "the resumed run ended elsewhere"

# on_error: fail: the run fails at the next checkpoint (step 150), naming the
# cause, and leaves step 50 in place.
small_fs "$WORK/small2"
job "$WORK/strict.yaml" "$WORK/small2/ckpt" fail
set +e; "$WORKER" --spec="$WORK/strict.yaml" >"$WORK/strict.out" 2>&1; rc=$?; set -e
[ "$rc" -eq 1 ] || fail "with on_error: fail the worker exited $rc, not 1 (failed)"
grep -q "^ferry-worker: .*No space left on device (checkpoint.on_error: fail)" "$WORK/strict.out" \
  || fail "the failure does not name the cause: $(tail -2 "$WORK/strict.out")"
grep -q "^final loss" "$WORK/strict.out" && fail "the run with on_error: fail trained to the end"
LAST="$(sed -n 's/^step \([0-9]*\)\/200.*/\1/p' "$WORK/strict.out" | tail -1)"
[ "$LAST" -ge 100 ] && [ "$LAST" -le 150 ] || fail "it stopped after step $LAST, not at the checkpoint after the failed one"
[ "$(ls -A "$WORK/small2/ckpt/rank0" | tr '\n' ' ')" = "latest step-000000000050 " ] \
  || fail "the checkpoint directory holds $(ls -A "$WORK/small2/ckpt/rank0" | tr '\n' ' ')"
echo "full disk: reported, step 50 kept, final loss $FULL = $CALM; on_error: fail exits 1 after step $LAST"

# Through ferryd: the job's events carry the warning and it succeeds; with
# on_error: fail it fails naming the cause; the daemon serves on.
"$FERRYD" --state_dir="$WORK/state" --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 --ready_file="$WORK/ready.json" \
  >"$WORK/ferryd.out" 2>&1 &
DAEMON=$!
trap 'kill -9 $DAEMON 2>/dev/null || true' EXIT
wait_ready "$DAEMON" "$WORK/ready.json"
export FERRY_ADDRESS="$READY_ADDRESS"
small_fs "$WORK/small3"
ID="$("$FERRY" submit "$WORK/calm.yaml" --set=checkpoint.dir=$WORK/small3/ckpt -o json \
  | /usr/bin/python3 -c "import json,sys; print(json.load(sys.stdin)['id'])")"
"$FERRY" watch "$ID" >"$WORK/daemon-full.out" 2>&1 || fail "the job with a full disk did not succeed through ferryd"
grep -q "checkpoint: step 100 not written: .*No space left on device" "$WORK/daemon-full.out" \
  || fail "the watcher did not see the full disk: $(grep checkpoint "$WORK/daemon-full.out" | head -3)"
"$FERRY" get "$ID" | grep -q "^checkpoint: *step 50," || fail "ferry get does not show step 50 as the last checkpoint"
# The metrics count the written checkpoint and the failed writes.
METRICS="$(/usr/bin/python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['metrics_listen'])" "$WORK/ready.json")"
curl -sf "http://$METRICS/metrics" >"$WORK/metrics.txt" || fail "cannot scrape ferryd's metrics"
/usr/bin/python3 - "$WORK/metrics.txt" <<'PYEOF' || fail "checkpoint metrics: $(grep checkpoint "$WORK/metrics.txt" | grep -v '^#' | grep -v _bucket)"
import re, sys
m = dict(re.findall(r'^(ferry_(?:checkpoints_total\{result="\w+"\}|last_checkpoint_step)) (\S+)$', open(sys.argv[1]).read(), re.M))
assert float(m['ferry_checkpoints_total{result="written"}']) == 1, m
assert float(m['ferry_checkpoints_total{result="failed"}']) >= 2, m
assert float(m['ferry_last_checkpoint_step']) == 50, m
PYEOF
small_fs "$WORK/small4"
ID="$("$FERRY" submit "$WORK/strict.yaml" --set=checkpoint.dir=$WORK/small4/ckpt -o json \
  | /usr/bin/python3 -c "import json,sys; print(json.load(sys.stdin)['id'])")"
set +e; "$FERRY" watch "$ID" >"$WORK/daemon-strict.out" 2>&1; rc=$?; set -e
[ "$rc" -eq 1 ] || fail "watch of the on_error: fail job exited $rc, not 1"
# Read the whole answer before looking at it: under pipefail `ferry get |
# grep -q` fails when grep exits at its match before ferry has written the
# rest (ferry then dies of SIGPIPE), as it can once the JSON passes 4 KiB.
GOT="$("$FERRY" get "$ID" -o json)" || fail "ferry get of the on_error: fail job failed"
STATE="$(json "d['state']" <<<"$GOT")" || fail "ferry get -o json returned no job: $GOT"
[ "$STATE" = JOB_STATE_FAILED ] || fail "the on_error: fail job is $STATE, not FAILED"
"$FERRY" get "$ID" | grep -q "No space left on device (checkpoint.on_error: fail)" || fail "its error lacks the cause"
"$FERRY" info >/dev/null || fail "ferryd stopped serving"
kill -TERM "$DAEMON"; wait "$DAEMON" || fail "ferryd exited non-zero"
trap - EXIT
echo "through ferryd: the full disk reported to watchers, the job succeeded; on_error: fail failed it; ferryd served on"
