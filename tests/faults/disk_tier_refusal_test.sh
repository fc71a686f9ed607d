#!/usr/bin/env bash
# memory.disk_dir and memory.disk_budget refused at submit through the CLI
# of a ferryd started with --allowed_roots: a directory outside the roots
# (named, by `..`, or through a link), a regular file, a budget under 1 MiB,
# and a directory on a read-only mount; each exits 2 naming the field, and
# nothing is created where it points. A disk_dir swapped for a link to the
# outside after the submit fails the job in its worker, which writes
# nothing out there. A job with memory.disk_dir inside the roots keeps its
# chunk files in disk_dir/ferry-JOB_ID/rank0/ while it trains and removes
# them when it ends.
#
# The read-only mount needs a private mount namespace: `unshare --mount` as
# root, else `unshare --user --map-root-user --mount`. Where neither is
# allowed that case says why and is skipped; the rest runs.
set -euo pipefail

RUNFILES="${TEST_SRCDIR:-$PWD}/ferry"
source "$RUNFILES/tests/lib/ferryd.sh"
SELF="$(readlink -f "$0")"

if [ -z "${FERRY_REFUSAL_NS+set}" ]; then
  probe() { "$@" /bin/sh -c 'd="$(mktemp -d)"; mount --bind "$d" "$d" && mount -o remount,bind,ro "$d" && umount "$d"; rmdir "$d"' 2>&1; }
  why=""
  for ns in "unshare --mount" "unshare --user --map-root-user --mount"; do
    # shellcheck disable=SC2086
    if out="$(probe $ns)"; then
      # shellcheck disable=SC2086
      exec env FERRY_REFUSAL_NS="$ns" $ns /bin/bash "$SELF"
    fi
    why="$why; $ns: ${out:-failed}"
  done
  export FERRY_REFUSAL_NS="" FERRY_REFUSAL_WHY="${why#; }"
fi

WORK="$(mktemp -d "${TEST_TMPDIR:-/tmp}/diskrefuse.XXXXXX")"
WORK="$(cd "$WORK" && pwd -P)"
ROOT="$WORK/root"
OUT="$WORK/outside"
mkdir -p "$ROOT" "$OUT"
fail() { echo "FAIL: $*" >&2; show_logs 20 "$WORK/ferryd.log"; exit 1; }
kill_ferryd_at_exit
start_ferryd "$WORK/ferryd.log" --state_dir="$WORK/state" --allowed_roots="$ROOT"

# A job whose model data does not fit its host budget: its 21 chunks keep
# their gradients on disk, and some of them their optimizer states too.
job() {  # job FILE DISK_DIR [STEPS]
  cat >"$1" <<YAML
model: {layers: 2, hidden: 64, heads: 4, vocab_size: 64, seq_len: 32, dropout: 0.1}
data: {synthetic: {}}
train: {steps: ${3:-40}, batch_size: 8, lr: 3.0e-3, threads: 1}
memory: {policy: static, device_budget: 64MiB, host_budget: 1300KiB, chunk_size: 16KiB, disk_dir: $2}
YAML
}

job "$WORK/etc.yaml" /etc/ferry-disk-tier
expect_refusal "permission denied: memory.disk_dir: /etc/ferry-disk-tier is outside the allowed roots ($ROOT)" \
  -- submit "$WORK/etc.yaml"
[ -e /etc/ferry-disk-tier ] && fail "the refused job created /etc/ferry-disk-tier"
job "$WORK/dotdot.yaml" "$ROOT/../outside/dd"
expect_refusal "memory.disk_dir: $ROOT/../outside/dd resolves to $OUT/dd, outside the allowed roots ($ROOT)" \
  -- submit "$WORK/dotdot.yaml"
ln -s "$OUT" "$ROOT/link"
job "$WORK/link.yaml" "$ROOT/link/dd"
expect_refusal "memory.disk_dir: $ROOT/link/dd resolves to $OUT/dd, outside the allowed roots ($ROOT)" \
  -- submit "$WORK/link.yaml"
: >"$ROOT/afile"
job "$WORK/file.yaml" "$ROOT/afile"
expect_refusal "memory.disk_dir: $ROOT/afile" -- submit "$WORK/file.yaml"
grep -qi "not a directory" <<<"$out" || fail "the refusal of a file does not say it is not a directory: $out"
job "$WORK/budget.yaml" "$ROOT/dd"
expect_refusal "invalid argument: memory.disk_budget: 512 KiB is too small for the disk tier; use at least 1MiB" \
  -- submit "$WORK/budget.yaml" --set=memory.disk_budget=512KiB
[ -z "$(ls -A "$OUT")" ] || fail "a refused job created something outside the roots: $(ls -A "$OUT")"
[ -e "$ROOT/dd" ] && fail "a refused job created its disk_dir"

# A read-only bind mount inside the roots.
if [ -n "$FERRY_REFUSAL_NS" ]; then
  mkdir -p "$ROOT/ro"
  mount --bind "$ROOT/ro" "$ROOT/ro" && mount -o remount,bind,ro "$ROOT/ro" || fail "cannot make $ROOT/ro read-only"
  job "$WORK/ro.yaml" "$ROOT/ro/dd"
  expect_refusal "failed precondition: memory.disk_dir: $ROOT/ro/dd is on a read-only file system ($ROOT/ro); choose a directory on a writable one" \
    -- submit "$WORK/ro.yaml"
  job "$WORK/ro2.yaml" "$ROOT/ro"
  expect_refusal "failed precondition: memory.disk_dir: $ROOT/ro is on a read-only file system" -- submit "$WORK/ro2.yaml"
  umount "$ROOT/ro"
  [ -z "$(ls -A "$ROOT/ro")" ] || fail "a refused job wrote under the read-only mount"
else
  echo "SKIP: the read-only memory.disk_dir case: cannot make a read-only mount here (needs a mount namespace): $FERRY_REFUSAL_WHY"
fi

# Accepted, then swapped for a link to the outside while it waits behind a
# long job: its worker refuses the directory and writes nothing there.
cat >"$WORK/long.yaml" <<'YAML'
model: {layers: 1, hidden: 32, heads: 2, vocab_size: 32, seq_len: 16}
data: {synthetic: {}}
train: {steps: 1000000, batch_size: 2, threads: 1}
YAML
LONG="$(submit "$WORK/long.yaml")"
for _ in $(seq 1 600); do [ "$(get "$LONG" "d['state']")" = JOB_STATE_RUNNING ] && break; sleep 0.05; done
mkdir -p "$ROOT/swap" "$OUT/swap"
job "$WORK/swap.yaml" "$ROOT/swap"
SWAP="$(submit "$WORK/swap.yaml")"
rmdir "$ROOT/swap"
ln -s "$OUT/swap" "$ROOT/swap"
"$FERRY" cancel "$LONG" >/dev/null
"$FERRY" watch "$SWAP" >/dev/null 2>&1 && fail "the job whose disk_dir became a link to the outside succeeded"
[ "$(get "$SWAP" "d['state']")" = JOB_STATE_FAILED ] || fail "it ended $(get "$SWAP" "d['state']")"
ERR="$(get "$SWAP" "d.get('error', '')")"
grep -qF "memory.disk_dir: $ROOT/swap" <<<"$ERR" && grep -qF "outside the allowed roots ($ROOT)" <<<"$ERR" \
  || fail "unclear error: $ERR"
[ -z "$(ls -A "$OUT/swap")" ] || fail "the worker wrote outside the roots: $(ls -laR "$OUT/swap")"
echo "swapped for a link after the submit: $(head -1 <<<"$ERR")"

# Inside the roots: the chunk files live in disk_dir/ferry-ID/rank0/ while
# the job trains, moving bytes every step, and go when it ends.
job "$WORK/good.yaml" "$ROOT/dd" 400
GOOD="$(submit "$WORK/good.yaml")"
FILES=""
for _ in $(seq 1 600); do
  FILES="$(ls "$ROOT/dd/ferry-$GOOD"/rank0/ferry-chunks-*/ 2>/dev/null | tr '\n' ' ')" || true
  [ -n "$FILES" ] && break
  sleep 0.05
done
[ -n "$FILES" ] || fail "no chunk files under $ROOT/dd/ferry-$GOOD/rank0 while the job ran"
echo "chunk files of $GOOD in $ROOT/dd/ferry-$GOOD/rank0: $FILES"
"$FERRY" watch "$GOOD" >/dev/null 2>&1 || fail "the job with disk_dir inside the roots failed: $(get "$GOOD" "d.get('error')")"
"$FERRY" get "$GOOD" -o json >"$WORK/good.json"
"$PY" - "$WORK/good.json" "$ROOT/dd/ferry-$GOOD/rank0" <<'PYEOF' || fail "the job moved nothing to or from its disk_dir"
import json, sys
p = json.load(open(sys.argv[1]))["progress"]
assert p["disk_chunks"] == 21 and int(p["bytes_disk_to_host"]) > 0 and int(p["bytes_host_to_disk"]) > 0, p
PYEOF
grep -q "^memory: gradients of 21 and optimizer states of [1-9][0-9]* of 21 chunks on disk (.* in $ROOT/dd/ferry-$GOOD/rank0/ferry-chunks-" \
  "$WORK/state/jobs/$GOOD/worker.log" || fail "the worker log does not show the chunk files in disk_dir"
[ -e "$ROOT/dd/ferry-$GOOD" ] && fail "the finished job's chunk files are still there: $(ls -R "$ROOT/dd/ferry-$GOOD")"
[ -d "$ROOT/dd" ] || fail "memory.disk_dir itself was removed"
kill -TERM "$DAEMON"; wait "$DAEMON" || fail "ferryd exited non-zero after SIGTERM"
trap - EXIT
echo PASS
