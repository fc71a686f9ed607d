#!/usr/bin/env bash
# ferry-worker under a launcher's environment, one process per rank on
# loopback: tensor- and data-parallel runs reproduce the one-rank loss, and a
# rank killed mid-step fails the others within the collective timeout,
# naming the collective, with no process left behind.
set -euo pipefail

RUNFILES="${TEST_SRCDIR:-$PWD}/ferry"
WORKER="$RUNFILES/server/ferry-worker"
WORK="$(mktemp -d "${TEST_TMPDIR:-/tmp}/launcher.XXXXXX")"
PY=/usr/bin/python3
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; for f in "$WORK"/*.out; do echo "--- $f" >&2; tail -5 "$f" >&2; done; exit 1; }
free_port() { "$PY" -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])"; }

job() {  # job FILE TENSOR DATA STEPS [SHARD]
  cat >"$1" <<YAML
name: launched
model: {layers: 2, hidden: 64, heads: 4, vocab_size: 64, seq_len: 32, dropout: 0.1}
data: {synthetic: {}}
train: {steps: $4, batch_size: 8, lr: 3.0e-3, threads: 1}
parallel: {tensor: $2, data: $3, shard: ${5:-none}}
YAML
}

# run_world NAME TENSOR DATA [SPEC]: every rank in the background, rank 0's
# output in NAME.0.out; prints rank 0's final loss.
run_world() {
  local name="$1" tensor="$2" data="$3" world=$(($2 * $3)) port pids=() spec="${4:-}"
  if [ -z "$spec" ]; then spec="$WORK/$name.yaml"; job "$spec" "$tensor" "$data" 12; fi
  port="$(free_port)"
  for ((r = world - 1; r >= 0; r--)); do
    MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" RANK="$r" WORLD_SIZE="$world" LOCAL_RANK="$r" \
      "$WORKER" --spec="$spec" --collective_timeout_s=60 >"$WORK/$name.$r.out" 2>&1 &
    pids+=($!)
    PIDS+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || fail "a rank of $name exited $?"; done
  sed -n 's/^final loss //p' "$WORK/$name.0.out"
}

ONE="$(run_world one 1 1)"
[ -n "$ONE" ] || fail "no final loss from the one-rank run"
for world in "2 1" "1 2" "2 2"; do
  set -- $world
  LOSS="$(run_world "t$1d$2" "$1" "$2")"
  echo "tensor $1 data $2: final loss $LOSS (one rank: $ONE)"
  "$PY" -c "import sys; a,b=map(float,sys.argv[1:]); assert abs(a-b) < 1e-5, (a,b)" "$LOSS" "$ONE" \
    || fail "tensor $1 data $2 ended at $LOSS, one rank at $ONE"
  [ -z "$(sed -n 's/^final loss //p' "$WORK/t$1d$2.1.out")" ] || fail "rank 1 printed progress"
done

# Sharded across two data ranks (processes), the optimizer states alone
# and everything (parallel.shard: full): the same training; a sharded
# checkpoint resumes on the same ranks bit for bit.
for level in optimizer full; do
  job "$WORK/sharded-$level.yaml" 1 2 12 "$level"
  SHARDED="$(run_world "sharded-$level" 1 2 "$WORK/sharded-$level.yaml")"
  echo "data 2, shard $level: final loss $SHARDED (one rank: $ONE)"
  "$PY" -c "import sys; a,b=map(float,sys.argv[1:]); assert abs(a-b) < 1e-5, (a,b)" "$SHARDED" "$ONE" \
    || fail "sharded ($level) data 2 ended at $SHARDED, one rank at $ONE"
  job "$WORK/shardckpt-$level.yaml" 1 2 20 "$level"
  printf 'checkpoint: {dir: %s, every_steps: 10, keep: 3}\n' "$WORK/shardckpt-$level" >>"$WORK/shardckpt-$level.yaml"
  SWHOLE="$(run_world "shardckpt-$level" 1 2 "$WORK/shardckpt-$level.yaml")"
  rm -rf "$WORK/shardckpt-$level/rank0/step-000000000020" "$WORK/shardckpt-$level/rank1/step-000000000020"
  SAGAIN="$(run_world "shardckpt-$level-again" 1 2 "$WORK/shardckpt-$level.yaml")"
  grep -q "checkpoint: resuming after step 10 " "$WORK/shardckpt-$level-again.0.out" \
    || fail "the sharded ($level) run did not resume"
  echo "shard $level, resumed from step 10: final loss $SAGAIN (uninterrupted $SWHOLE)"
  [ "$SAGAIN" = "$SWHOLE" ] || fail "sharded ($level) resumed at $SAGAIN, uninterrupted $SWHOLE"
done

# Ranks resume from the same step even when one lacks the others' newest
# checkpoint (it died writing it): both resume from the step before, and
# the run ends at the uninterrupted loss.
job "$WORK/ckpt.yaml" 1 2 30
printf 'checkpoint: {dir: %s, every_steps: 10, keep: 3}\n' "$WORK/ckpt" >>"$WORK/ckpt.yaml"
WHOLE="$(run_world ckpt 1 2 "$WORK/ckpt.yaml")"
[ -d "$WORK/ckpt/rank1/step-000000000030" ] || fail "rank 1 wrote no step-30 checkpoint"
rm -rf "$WORK/ckpt/rank1/step-000000000030"
AGAIN="$(run_world ckpt-again 1 2 "$WORK/ckpt.yaml")"
grep -q "checkpoint: resuming after step 20 " "$WORK/ckpt-again.0.out" \
  || fail "rank 0 did not resume at step 20: $(grep checkpoint "$WORK/ckpt-again.0.out" | head -3)"
grep -q "this rank's newest is step 30, another rank's only step 20" "$WORK/ckpt-again.0.out" \
  || fail "rank 0 did not say why it resumed earlier"
echo "two data ranks, one missing the newest checkpoint: final loss $AGAIN (uninterrupted $WHOLE)"
[ "$AGAIN" = "$WHOLE" ] || fail "resumed at $AGAIN, uninterrupted $WHOLE"

# The wrong number of ranks is refused before anyone waits.
job "$WORK/two.yaml" 2 1 12
set +e; MASTER_ADDR=127.0.0.1 MASTER_PORT="$(free_port)" RANK=0 WORLD_SIZE=3 "$WORKER" --spec="$WORK/two.yaml" \
  >"$WORK/wrong.out" 2>&1; rc=$?; set -e
[ "$rc" -eq 2 ] || fail "a world of 3 for a job of 2 ranks exited $rc"
grep -q "WORLD_SIZE is 3" "$WORK/wrong.out" || fail "$(cat "$WORK/wrong.out")"

# A rank killed mid-training: the other fails within the collective timeout.
job "$WORK/long.yaml" 1 2 100000
PORT="$(free_port)"
MASTER_ADDR=127.0.0.1 MASTER_PORT="$PORT" RANK=1 WORLD_SIZE=2 "$WORKER" --spec="$WORK/long.yaml" \
  --collective_timeout_s=5 >"$WORK/victim.out" 2>&1 &
VICTIM=$!; PIDS+=($VICTIM)
MASTER_ADDR=127.0.0.1 MASTER_PORT="$PORT" RANK=0 WORLD_SIZE=2 "$WORKER" --spec="$WORK/long.yaml" \
  --collective_timeout_s=5 >"$WORK/survivor.out" 2>&1 &
SURVIVOR=$!; PIDS+=($SURVIVOR)
for _ in $(seq 1 600); do grep -q "^step 10/" "$WORK/survivor.out" && break; sleep 0.1; done
grep -q "^step 10/" "$WORK/survivor.out" || fail "the two-rank job did not reach step 10"
kill -9 "$VICTIM"
START=$(date +%s)
set +e; wait "$SURVIVOR"; rc=$?; set -e
ELAPSED=$(($(date +%s) - START))
echo "rank 0 exited $rc, $ELAPSED s after rank 1 was killed"
[ "$rc" -eq 1 ] || fail "rank 0 exited $rc after its peer died"
[ "$ELAPSED" -le 30 ] || fail "rank 0 took $ELAPSED s to notice"
grep -q "all-reduce in the data group (rank 0 of 2) failed" "$WORK/survivor.out" \
  || fail "the error does not name the collective: $(tail -2 "$WORK/survivor.out")"
if kill -0 "$SURVIVOR" 2>/dev/null || kill -0 "$VICTIM" 2>/dev/null; then fail "a rank is still running"; fi
