#!/usr/bin/env bash
# A chunk file of the disk tier damaged under a running job, through ferryd:
# one byte flipped, or the file cut to half its size, between the update
# that wrote it and the one that reads it back. The job fails with DATA_LOSS
# naming the file ("failed its checksum", "is short"): it never trains on
# with wrong optimizer states. Its chunk files are removed, and the daemon
# serves on.
#
# The damage may land while the chunk is being updated, after its read and
# before its write, which rewrites the whole file: nothing is lost then, and
# the test damages the file again, a little later, until the job fails.
set -euo pipefail

RUNFILES="${TEST_SRCDIR:-$PWD}/ferry"
source "$RUNFILES/tests/lib/ferryd.sh"
WORK="$(mktemp -d "${TEST_TMPDIR:-/tmp}/diskdamage.XXXXXX")"
WORK="$(cd "$WORK" && pwd -P)"
STATE="$WORK/state"
fail() { echo "FAIL: $*" >&2; show_logs 8 "$WORK/ferryd.log" "$STATE"/jobs/*/worker.log; exit 1; }
kill_ferryd_at_exit
start_ferryd "$WORK/ferryd.log" --state_dir="$STATE" --allowed_roots="$WORK"

# The 21 chunks keep their gradients on disk, some their optimizer states
# too; every step reads and writes them all. More steps than the test needs.
cat >"$WORK/job.yaml" <<'YAML'
model: {layers: 2, hidden: 64, heads: 4, vocab_size: 64, seq_len: 32, dropout: 0.1}
data: {synthetic: {}}
train: {steps: 100000, batch_size: 8, lr: 3.0e-3, threads: 1}
memory: {policy: static, device_budget: 64MiB, host_budget: 1300KiB, chunk_size: 16KiB}
YAML

damage_until_failed() {  # damage_until_failed ID flip|truncate: prints the damaged file
  local id="$1" how="$2" file="" dir
  for _ in $(seq 1 1200); do
    [ "$(get "$id" "int(d.get('progress', {}).get('bytes_disk_to_host', 0))")" -gt 0 ] && break
    sleep 0.05
  done
  [ "$(get "$id" "int(d.get('progress', {}).get('bytes_disk_to_host', 0))")" -gt 0 ] \
    || fail "job $id read nothing from the disk in 60 s: $(get "$id" "d.get('progress')")"
  dir="$(sed -n 's/^memory: gradients of .* chunks on disk ([^ ]* [KMGT]\?i\?B in \(.*\)), host side.*/\1/p' \
    "$STATE/jobs/$id/worker.log")"
  [ -d "$dir" ] || fail "no chunk directory for $id: '$dir'"
  # An optimizer states' file: read every step, and never rewritten whole
  # before it is read (a gradients' file is, in every backward).
  file="$dir/$(ls "$dir" | grep '^o' | sort -V | head -1)"
  for attempt in $(seq 1 20); do
    case "$how" in
      flip)
        "$PY" -c "
import os, sys
p, k = sys.argv[1], int(sys.argv[2])
with open(p, 'r+b') as f:
    f.seek((k * 4099) % os.path.getsize(p)); b = f.read(1); f.seek(-1, 1); f.write(bytes([b[0] ^ 0xff]))" \
          "$file" "$attempt" ;;
      truncate) truncate -s "$(($(stat -c %s "$file") / 2))" "$file" ;;
    esac
    for _ in $(seq 1 10); do
      [ "$(get "$id" "d['state']")" = JOB_STATE_RUNNING ] || { echo "$file"; return 0; }
      sleep 0.05
    done
  done
  fail "the job trained on through 20 damages of $file"
}
ended() {  # ended ID: waits for the job to end, prints its JSON to $WORK/ID.json
  for _ in $(seq 1 600); do
    "$FERRY" get "$1" -o json >"$WORK/$1.json"
    case "$(json "d['state']" <"$WORK/$1.json")" in JOB_STATE_SUCCEEDED|JOB_STATE_FAILED|JOB_STATE_CANCELLED) return 0 ;; esac
    sleep 0.05
  done
  fail "job $1 did not end in 30 s"
}

# --- a flipped byte ---
FLIP="$(submit "$WORK/job.yaml")"
FILE="$(damage_until_failed "$FLIP" flip)"
ended "$FLIP"
[ "$(json "d['state']" <"$WORK/$FLIP.json")" = JOB_STATE_FAILED ] || fail "the job with a flipped byte ended $(json "d['state']" <"$WORK/$FLIP.json")"
ERR="$(json "d.get('error', '')" <"$WORK/$FLIP.json")"
grep -qE "memory.disk_dir: chunk file $FILE failed its checksum at offset [0-9]+ \(read CRC " <<<"$ERR" \
  || fail "the error does not name $FILE and its checksum: $ERR"
grep -qF "the file was changed or damaged under the job" <<<"$ERR" || fail "the error does not say what happened: $ERR"
[ -e "$STATE/jobs/$FLIP/scratch" ] && fail "the failed job's chunk files are still there"
echo "flipped a byte of $(basename "$FILE") at step $(json "d['progress']['step']" <"$WORK/$FLIP.json"): $(head -1 <<<"$ERR")"

# --- a file cut short ---
CUT="$(submit "$WORK/job.yaml")"
FILE="$(damage_until_failed "$CUT" truncate)"
ended "$CUT"
[ "$(json "d['state']" <"$WORK/$CUT.json")" = JOB_STATE_FAILED ] || fail "the job with a truncated file ended $(json "d['state']" <"$WORK/$CUT.json")"
ERR="$(json "d.get('error', '')" <"$WORK/$CUT.json")"
grep -qE "memory.disk_dir: chunk file $FILE is short: [0-9]+ bytes where [0-9]+ were written" <<<"$ERR" \
  || fail "the error does not name $FILE and its sizes: $ERR"
[ -e "$STATE/jobs/$CUT/scratch" ] && fail "the failed job's chunk files are still there"
echo "cut $(basename "$FILE") short at step $(json "d['progress']['step']" <"$WORK/$CUT.json"): $(head -1 <<<"$ERR")"

# The daemon serves on: a job with the disk tier trains to the end.
OK="$(submit "$WORK/job.yaml" --set=train.steps=30)"
"$FERRY" watch "$OK" >/dev/null 2>&1 || fail "a job after the damaged ones failed: $(get "$OK" "d.get('error')")"
[ "$(get "$OK" "int(d['progress']['bytes_disk_to_host'])")" -gt 0 ] || fail "the last job read nothing from disk"
kill -TERM "$DAEMON"; wait "$DAEMON" || fail "ferryd exited non-zero after SIGTERM"
trap - EXIT
echo PASS
