#!/usr/bin/env bash
# The disk tier on a full file system, through ferryd (memory.disk_dir on a
# small tmpfs; this job's chunk files take 1.3 MiB):
#  - too small at submit: refused, naming memory.disk_budget, the directory
#    and the bytes needed and free;
#  - filled between submit and start (the job queued behind another): the
#    job fails when it starts, naming the directory and the bytes, leaves
#    nothing there, and the daemon serves on;
#  - files landing on a smaller file system than the checks looked at (one
#    mounted at the job's own directory in memory.disk_dir): reserving the
#    chunk files fails at start, naming the chunk file and its bytes;
#  - filled while a job trains: its chunk files' space was reserved at start,
#    so it trains and checkpoints on; stopped with the daemon and started
#    again on the full file system it fails, its checkpoints untouched, and
#    once space is free a job of the same spec resumes from them and ends at
#    the undisturbed run's final loss.
#
# A small tmpfs needs a private mount namespace: `unshare --mount` as root,
# else `unshare --user --map-root-user --mount`. Where neither is allowed
# the test says why and skips.
set -euo pipefail

RUNFILES="${TEST_SRCDIR:-$PWD}/ferry"
source "$RUNFILES/tests/lib/ferryd.sh"
SELF="$(readlink -f "$0")"

source "$RUNFILES/tests/lib/mount_ns.sh"
in_private_mounts "$SELF"

WORK="$(mktemp -d "${TEST_TMPDIR:-/tmp}/diskfull.XXXXXX")"
WORK="$(cd "$WORK" && pwd -P)"
STATE="$WORK/state"
STARTS=0
fail() { echo "FAIL: $*" >&2; show_logs 8 "$WORK"/ferryd.*.log "$STATE"/jobs/*/worker.log; exit 1; }
kill_ferryd_at_exit
echo "in a private mount namespace: $FERRY_PRIVATE_MOUNTS"

start_daemon() {
  STARTS=$((STARTS + 1))
  start_ferryd "$WORK/ferryd.$STARTS.log" --state_dir="$STATE" --allowed_roots="$WORK"
}
wait_state() {  # wait_state ID STATE
  for _ in $(seq 1 1200); do [ "$(get "$1" "d['state']")" = "$2" ] && return 0; sleep 0.05; done
  fail "job $1 is $(get "$1" "d['state']"), not $2, after 60 s"
}
wait_end() {  # wait_end ID: until the job has ended
  for _ in $(seq 1 2400); do
    case "$(get "$1" "d['state']")" in JOB_STATE_SUCCEEDED|JOB_STATE_FAILED|JOB_STATE_CANCELLED) return 0 ;; esac
    sleep 0.05
  done
  fail "job $1 did not end in 120 s"
}
small_fs() {  # small_fs DIR SIZE: a tmpfs of SIZE at DIR
  mkdir -p "$1"
  mount -t tmpfs -o "size=$2" tmpfs "$1" || fail "cannot mount a tmpfs at $1"
}
fill() {  # fill DIR [LEAVE_KIB]: fills DIR's file system, then leaves LEAVE_KIB free
  dd if=/dev/zero of="$1/fill.$$.$RANDOM" bs=4k 2>/dev/null || true
  [ "${2:-0}" -gt 0 ] && truncate -s "-${2}K" "$(ls -t "$1"/fill.* | head -1)"
  echo "$1: $(df -k --output=avail "$1" | tail -1 | tr -d ' ') KiB free"
}
job() {  # job FILE DISK_DIR [MORE_YAML]: 1.3 MiB of gradients and optimizer states on disk
  cat >"$1" <<YAML
model: {layers: 2, hidden: 64, heads: 4, vocab_size: 64, seq_len: 32, dropout: 0.1}
data: {synthetic: {}}
train: {steps: 400, batch_size: 8, lr: 3.0e-3, threads: 1}
memory: {policy: static, device_budget: 64MiB, host_budget: 1300KiB, chunk_size: 16KiB, disk_dir: $2}
${3:-}
YAML
}
cat >"$WORK/plain.yaml" <<'YAML'
model: {layers: 1, hidden: 32, heads: 2, vocab_size: 32, seq_len: 16}
data: {synthetic: {}}
train: {steps: 20, batch_size: 2, threads: 1}
YAML

start_daemon

# --- too small at submit ---
small_fs "$WORK/tiny" 512k
job "$WORK/tiny.yaml" "$WORK/tiny"
expect_refusal "failed precondition: memory.disk_budget: the disk tier needs 1.3 MiB for the gradients and optimizer states memory.host_budget cannot hold, but only 512 KiB is free under $WORK/tiny; free space there, choose another memory.disk_dir, or raise memory.host_budget" \
  -- submit "$WORK/tiny.yaml" --set=memory.disk_budget=4MiB
# Without a budget the tier may take 9/10 of the free space: too little.
expect_refusal "more than the " -- submit "$WORK/tiny.yaml"
grep -q "Raise memory.disk_budget or free space under memory.disk_dir" <<<"$out" || fail "the refusal does not say what to change: $out"
[ -z "$(ls -A "$WORK/tiny")" ] || fail "a refused job left files: $(ls -A "$WORK/tiny")"

# --- filled between submit and start ---
LONG="$(submit "$WORK/plain.yaml" --set=train.steps=1000000)"
wait_state "$LONG" JOB_STATE_RUNNING
small_fs "$WORK/small" 2m
job "$WORK/small.yaml" "$WORK/small"
QUEUED="$(submit "$WORK/small.yaml" --set=memory.disk_budget=4MiB)"
[ "$(get "$QUEUED" "d['state']")" = JOB_STATE_PENDING ] || fail "the disk tier job is not queued behind $LONG"
fill "$WORK/small" 300
"$FERRY" cancel "$LONG" >/dev/null
wait_end "$QUEUED"
"$FERRY" get "$QUEUED" -o json >"$WORK/queued.json"
[ "$(json "d['state']" <"$WORK/queued.json")" = JOB_STATE_FAILED ] || fail "the job on the full disk ended $(json "d['state']" <"$WORK/queued.json")"
ERR="$(json "d.get('error', '')" <"$WORK/queued.json")"
grep -qE "memory.disk_budget: the disk tier needs 1.3 MiB .* but only [0-9.]+ KiB is free under $WORK/small;" <<<"$ERR" \
  || fail "the error does not name the directory and the bytes: $ERR"
[ "$(json "d.get('progress', {}).get('step', 0)" <"$WORK/queued.json")" = 0 ] || fail "the job on the full disk trained"
[ -e "$WORK/small/ferry-$QUEUED" ] && fail "the failed job left $(ls -R "$WORK/small/ferry-$QUEUED")"
echo "filled after submit: $ERR"
PLAIN="$(submit "$WORK/plain.yaml")"
"$FERRY" watch "$PLAIN" >/dev/null 2>&1 || fail "a job without the disk tier failed after the full disk"

# --- the chunk files on a smaller file system than the one checked ---
mkdir -p "$WORK/big"
LONG="$(submit "$WORK/plain.yaml" --set=train.steps=1000000)"
wait_state "$LONG" JOB_STATE_RUNNING
job "$WORK/big.yaml" "$WORK/big"
UNDER="$(submit "$WORK/big.yaml" --set=memory.disk_budget=4MiB)"
small_fs "$WORK/big/ferry-$UNDER" 256k
"$FERRY" cancel "$LONG" >/dev/null
wait_end "$UNDER"
"$FERRY" get "$UNDER" -o json >"$WORK/under.json"
[ "$(json "d['state']" <"$WORK/under.json")" = JOB_STATE_FAILED ] || fail "the job whose files had no room ended $(json "d['state']" <"$WORK/under.json")"
ERR="$(json "d.get('error', '')" <"$WORK/under.json")"
grep -qE "memory.disk_dir: no space for chunk file $WORK/big/ferry-$UNDER/rank0/ferry-chunks-[A-Za-z0-9]{6}/[go][0-9]+ of [0-9]+ bytes: No space left on device" <<<"$ERR" \
  || fail "the error does not name the chunk file and its bytes: $ERR"
[ "$(json "d.get('progress', {}).get('step', 0)" <"$WORK/under.json")" = 0 ] || fail "the job without room trained"
echo "no room for the chunk files: $(head -1 <<<"$ERR")"
umount "$WORK/big/ferry-$UNDER"
"$FERRY" info >/dev/null || fail "ferryd stopped serving"

# --- filled while a job trains; then started again on the full disk ---
small_fs "$WORK/fs" 2m
job "$WORK/ck.yaml" "$WORK/fs"
sed -i 's/disk_dir: /disk_budget: 4MiB, disk_dir: /' "$WORK/ck.yaml"
CALM="$(submit "$WORK/ck.yaml" --set=checkpoint.dir=$WORK/calm-ckpt,checkpoint.every_steps=50)"
"$FERRY" watch "$CALM" >/dev/null 2>&1 || fail "the undisturbed job failed"
"$FERRY" get "$CALM" -o json >"$WORK/calm.json"
"$PY" - "$WORK/calm.json" <<'PYEOF' || fail "the undisturbed job moved nothing to or from the disk"
import json, sys
p = json.load(open(sys.argv[1]))["progress"]
assert p["disk_chunks"] > 0 and int(p["bytes_disk_to_host"]) > 0 and int(p["bytes_host_to_disk"]) > 0, p
PYEOF
CALM_LOSS="$(json "d['progress']['loss']" <"$WORK/calm.json")"
[ -z "$(ls -A "$WORK/fs")" ] || fail "the finished job left $(ls -A "$WORK/fs")"

HIT="$(submit "$WORK/ck.yaml" --set=checkpoint.dir=$WORK/ckpt,checkpoint.every_steps=50)"
wait_checkpoint "$HIT" 100
fill "$WORK/fs"
AT="$(get "$HIT" "d['last_checkpoint']['step']")"
wait_checkpoint "$HIT" $((AT + 100))
echo "with $WORK/fs full the job trained on to a checkpoint at step $(get "$HIT" "d['last_checkpoint']['step']")"
kill -TERM "$DAEMON"; wait "$DAEMON" || fail "ferryd exited non-zero after SIGTERM"; DAEMON=""
[ -e "$WORK/fs/ferry-$HIT" ] && fail "the stopped run's chunk files were not removed"
fill "$WORK/fs"
(cd "$WORK/ckpt" && find . -type f | sort | xargs sha256sum) >"$WORK/ckpt.sums"
NEWEST="$(sed -n 's|.*\./rank0/step-0*\([0-9][0-9]*\)/MANIFEST$|\1|p' "$WORK/ckpt.sums" | sort -n | tail -1)"
[ -n "$NEWEST" ] || fail "no checkpoint in $WORK/ckpt: $(cat "$WORK/ckpt.sums")"
start_daemon
wait_end "$HIT"
"$FERRY" get "$HIT" -o json >"$WORK/hit.json"
[ "$(json "d['state']" <"$WORK/hit.json")" = JOB_STATE_FAILED ] || fail "the job started on a full disk ended $(json "d['state']" <"$WORK/hit.json")"
ERR="$(json "d.get('error', '')" <"$WORK/hit.json")"
grep -qE "memory.disk_budget: the disk tier needs 1.3 MiB .* but only [0-9.]+ [KMG]?i?B is free under $WORK/fs;" <<<"$ERR" \
  || fail "the error does not name the directory and the bytes: $ERR"
echo "started again on the full disk: $ERR"
(cd "$WORK/ckpt" && find . -type f | sort | xargs sha256sum) | diff "$WORK/ckpt.sums" - \
  || fail "the checkpoints changed when the job failed on the full disk"
rm -f "$WORK"/fs/fill.*
AGAIN="$(submit "$WORK/ck.yaml" --set=checkpoint.dir=$WORK/ckpt,checkpoint.every_steps=50)"
"$FERRY" watch "$AGAIN" >/dev/null 2>&1 || fail "the job with space again failed"
grep -q "^checkpoint: resuming after step $NEWEST " "$STATE/jobs/$AGAIN/worker.log" \
  || fail "it did not resume from step $NEWEST: $(grep '^checkpoint' "$STATE/jobs/$AGAIN/worker.log" | head -3)"
grep -q "^checkpoint: skipped" "$STATE/jobs/$AGAIN/worker.log" && fail "a checkpoint was damaged"
AGAIN_LOSS="$(get "$AGAIN" "d['progress']['loss']")"
echo "resumed after step $NEWEST: final loss $AGAIN_LOSS, undisturbed $CALM_LOSS"
[ "$AGAIN_LOSS" = "$CALM_LOSS" ] || fail "the resumed job ended at $AGAIN_LOSS, the undisturbed one at $CALM_LOSS"
PLAIN="$(submit "$WORK/plain.yaml")"
"$FERRY" watch "$PLAIN" >/dev/null 2>&1 || fail "a job without the disk tier failed"
kill -TERM "$DAEMON"; wait "$DAEMON" || fail "ferryd exited non-zero after SIGTERM"; DAEMON=""
echo PASS
