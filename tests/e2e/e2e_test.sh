#!/usr/bin/env bash
# End to end: start ferryd, drive it with the ferry CLI through a real GPT
# training job, and check the outcome, the error handling and /metrics.
set -euo pipefail

RUNFILES="${TEST_SRCDIR:-$PWD}/ferry"
source "$RUNFILES/tests/lib/ferryd.sh"
EXAMPLE="$RUNFILES/examples/gpt2-tiny.yaml"
WORK="$(mktemp -d "${TEST_TMPDIR:-/tmp}/e2e.XXXXXX")"

fail() { echo "FAIL: $*" >&2; echo "--- ferryd log ---" >&2; tail -40 "$WORK/ferryd.log" >&2 || true; exit 1; }

"$FERRYD" --state_dir="$WORK/state" --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 \
  --ready_file="$WORK/ready.json" >"$WORK/ferryd.log" 2>&1 &
DAEMON=$!
cleanup() { kill "$DAEMON" 2>/dev/null || true; wait "$DAEMON" 2>/dev/null || true; }
trap cleanup EXIT

wait_ready "$DAEMON" "$WORK/ready.json"
export FERRY_ADDRESS="$READY_ADDRESS"
METRICS="$READY_METRICS"
echo "ferryd at $FERRY_ADDRESS, metrics at $METRICS"

"$FERRY" info | grep -q "device:  cpu" || fail "ferry info does not list the cpu"
# The CPU's matrix-product rates, probed once at start.
"$FERRY" info -o json | json "d['devices'][0]['fp32_matmul_flops'] > 1e8 and d['devices'][0]['bf16_matmul_flops'] > 1e8" \
  | grep -qx True || fail "ferry info has no matrix-product rates: $("$FERRY" info -o json)"

# A training job; it keeps running while the bad input below is refused.
ID="$("$FERRY" submit "$EXAMPLE" --set=train.steps=80 -o json | json "d['id']")"
echo "submitted $ID"

# Waits (up to 30 s) until the job has reported a step.
wait_for_steps() {
  for _ in $(seq 1 300); do
    "$FERRY" get "$1" -o json | json "d['progress']['step']" | grep -qv '^0$' && return 0
    sleep 0.1
  done
  fail "job $1 reported no step in 30 s"
}

expect_refusal() {  # expect_refusal EXIT_CODE TEXT -- ferry args...
  local code="$1" text="$2"; shift 3
  set +e; out="$("$FERRY" "$@" 2>&1)"; rc=$?; set -e
  [ "$rc" -eq "$code" ] || fail "ferry $* exited $rc, not $code: $out"
  grep -qF -- "$text" <<<"$out" || fail "ferry $* said '$out', which lacks '$text'"
  echo "refused as expected: ferry $*"
}
printf 'model: {layers: two}\ndata: {synthetic: {}}\n' >"$WORK/bad.yaml"
expect_refusal 2 "model.layers: expected a whole number" -- submit "$WORK/bad.yaml"
printf 'model: {layer: 2}\n' >"$WORK/typo.yaml"
expect_refusal 2 "did you mean 'layers'" -- submit "$WORK/typo.yaml"
printf 'model: {hidden: 100, heads: 3}\ndata: {synthetic: {}}\n' >"$WORK/shape.yaml"
expect_refusal 2 "invalid argument: model.hidden: 100 is not a multiple of model.heads" -- submit "$WORK/shape.yaml"
printf 'data: {path: missing.bin}\n' >"$WORK/missing.yaml"
expect_refusal 2 "failed precondition: data.path: $WORK/missing.bin does not exist" -- submit "$WORK/missing.yaml"
printf 'data: {synthetic: {}}\nmemory: {host_budget: 99TiB}\n' >"$WORK/absurd.yaml"
expect_refusal 2 "memory.host_budget" -- submit "$WORK/absurd.yaml"
expect_refusal 2 "memory.recompute_every: applies only with memory.recompute: every" -- \
  submit "$EXAMPLE" --set=memory.recompute=all,memory.recompute_every=3
expect_refusal 2 "not found: job_id: no job 'j-00000000'" -- get j-00000000
expect_refusal 2 "cannot read the job file" -- submit "$WORK/nope.yaml"

# Two watchers at once; the CLI's exit code says whether the job succeeded.
"$FERRY" watch "$ID" >"$WORK/watch2.txt" 2>&1 &
SECOND=$!
"$FERRY" watch "$ID" >"$WORK/watch1.txt" 2>&1 || fail "watch exited non-zero: $(tail -3 "$WORK/watch1.txt")"
wait "$SECOND" || fail "the second watcher exited non-zero"
grep -q "succeeded" "$WORK/watch1.txt" || fail "watch did not report success"
grep -q "final loss" "$WORK/watch2.txt" || fail "the second watcher missed the end"

"$FERRY" get "$ID" -o json >"$WORK/job.json"
STATE="$(json "d['state']" <"$WORK/job.json")"
FIRST="$(json "d['initial_loss']" <"$WORK/job.json")"
LAST="$(json "d['progress']['loss']" <"$WORK/job.json")"
STEP="$(json "d['progress']['step']" <"$WORK/job.json")"
echo "state $STATE, loss $FIRST at step 1, $LAST at step $STEP"
[ "$STATE" = "JOB_STATE_SUCCEEDED" ] || fail "job ended $STATE"
[ "$STEP" = "80" ] || fail "job ran $STEP steps, not 80"
"$PY" - "$FIRST" "$LAST" <<'PYEOF' || fail "the loss did not fall far enough"
import math, sys
first, last = float(sys.argv[1]), float(sys.argv[2])
half = 0.5 * math.log(256)
print(f"loss fell from {first:.4f} to {last:.4f}; half of ln(256) is {half:.4f}")
assert abs(first - math.log(256)) < 0.5, "the first loss should be near ln(vocab)"
assert last < half, "the final loss should be below half of ln(vocab)"
PYEOF

expect_refusal 2 "failed precondition: job $ID has already ended" -- cancel "$ID"

# Where the job's model data lived: every chunk on the simulated device.
"$FERRY" memory "$ID" >"$WORK/memory.txt" || fail "ferry memory failed"
grep -q "auto policy on sim, steady (step 80)" "$WORK/memory.txt" || fail "ferry memory: $(head -3 "$WORK/memory.txt")"
grep -q "chunk map" "$WORK/memory.txt" || fail "ferry memory shows no chunk map"
grep -q "backward h.1" "$WORK/memory.txt" || fail "ferry memory shows no warm-up trace"
[ "$("$FERRY" memory "$ID" -o json | json "len(d['chunks']) > 0 and d['phase']")" = "steady" ] || fail "ferry memory -o json"

# The picture: ferry memory --svg, rendered to PNG, holds a bar per period.
"$FERRY" memory "$ID" --svg="$WORK/memory.svg" | grep -q "^wrote $WORK/memory.svg: " || fail "ferry memory --svg"
rsvg-convert "$WORK/memory.svg" -o "$WORK/memory.png" || fail "the memory picture does not render"
"$PY" - "$WORK/memory.svg" "$WORK/memory.png" "$("$FERRY" memory "$ID" -o json | json "len(d['trace'])")" <<'PYEOF' \
  || fail "the memory picture lacks its series"
import struct, sys
import xml.etree.ElementTree as ET
svg, png, periods = sys.argv[1], sys.argv[2], int(sys.argv[3])
ns = {"s": "http://www.w3.org/2000/svg"}
root = ET.parse(svg).getroot()
groups = {g.get("id"): g for g in root.iter("{http://www.w3.org/2000/svg}g")}
for series in ("model", "non-model"):
    assert len(groups[series].findall("s:rect", ns)) == periods, (series, periods)
warmup = [e for e in root.iter("{http://www.w3.org/2000/svg}polyline") if e.get("id") == "warmup"][0]
assert len(warmup.get("points").split()) == periods
lines = {e.get("id") for e in root.iter("{http://www.w3.org/2000/svg}line")}
assert {"capacity", "limit"} <= lines, lines
width, height = struct.unpack(">II", open(png, "rb").read()[16:24])
assert width > 300 and height > 300, (width, height)
print(f"memory picture: {periods} periods, rendered {width}x{height}")
PYEOF
# Every command speaks YAML and tables too; ferry top shows the job at a glance.
"$FERRY" get "$ID" -o yaml | "$PY" -c "import sys, yaml; d = yaml.safe_load(sys.stdin); assert d['id'] == sys.argv[1] and str(d['progress']['step']) == '80', d" "$ID" \
  || fail "ferry get -o yaml"
"$FERRY" list -o table | head -1 | grep -q "^ID" || fail "ferry list -o table"
"$FERRY" info -o yaml | grep -q "^version: " || fail "ferry info -o yaml"
expect_refusal 2 "use text, table, json or yaml" -- get "$ID" -o xml
"$FERRY" top "$ID" --once >"$WORK/top.txt" || fail "ferry top --once"
for part in "$ID" "SUCCEEDED  step 80/80" "device [" "host   [" "moved   host->device" "time    [" "copying chunks" \
  "GFLOP/s (6 x parameters x tokens a second), " " of the device's "; do
  grep -qF -- "$part" "$WORK/top.txt" || fail "ferry top lacks '$part': $(cat "$WORK/top.txt")"
done
[ "$("$FERRY" top "$ID" --once -o json | head -1 | json "d['id']")" = "$ID" ] || fail "ferry top -o json"
# Shell completion: commands, then job ids from the daemon.
COMPLETION="$("$FERRY" completion bash)"
COMPLETED="$(PATH="$(dirname "$FERRY"):$PATH" bash -c "$COMPLETION"'
  COMP_WORDS=(ferry to); COMP_CWORD=1; _ferry; echo "${COMPREPLY[*]}"
  COMP_WORDS=(ferry get "'"${ID:0:4}"'"); COMP_CWORD=2; _ferry; echo "${COMPREPLY[*]}"')"
grep -qx "top" <<<"$(head -1 <<<"$COMPLETED")" || fail "completion of 'to': $COMPLETED"
grep -qw -- "$ID" <<<"$(tail -1 <<<"$COMPLETED")" || fail "completion of job ids: $COMPLETED"
"$FERRY" completion zsh | grep -q "bashcompinit" || fail "no zsh completion"

# Mixed precision through the daemon: fp16 with dynamic loss scaling.
HALF="$("$FERRY" submit "$EXAMPLE" --set=train.steps=30,train.precision=fp16 -o json | json "d['id']")"
"$FERRY" watch "$HALF" >"$WORK/half.txt" 2>&1 || fail "the fp16 job failed: $(tail -3 "$WORK/half.txt")"
grep -q "scale" "$WORK/half.txt" || fail "the fp16 progress line shows no loss scale"
"$FERRY" get "$HALF" -o json >"$WORK/half.json"
[ "$(json "d['spec']['train']['precision']" <"$WORK/half.json")" = "PRECISION_FP16" ] || fail "not fp16"
"$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); p=d['progress']; assert p['loss_scale'] >= 1 and p['loss'] < d['initial_loss'], p" "$WORK/half.json" \
  || fail "the fp16 job did not learn"

# Recompute through the daemon: with dropout on, every block re-runs its
# forward in the backward; progress, ferry get and ferry memory say which.
RECOMP="$("$FERRY" submit "$EXAMPLE" --set=train.steps=20,model.dropout=0.1,memory.recompute=all -o json | json "d['id']")"
"$FERRY" watch "$RECOMP" >"$WORK/recompute.txt" 2>&1 || fail "the recompute job failed: $(tail -3 "$WORK/recompute.txt")"
[ "$("$FERRY" get "$RECOMP" -o json | json "d['progress'].get('recomputed_blocks')")" = "[0, 1]" ] \
  || fail "progress does not list the recomputed blocks"
"$FERRY" get "$RECOMP" | grep -q "recompute: *0-1 of 2 blocks (all)" || fail "ferry get: $("$FERRY" get "$RECOMP")"
"$FERRY" memory "$RECOMP" >"$WORK/recompute-memory.txt"
grep -q "recomputing blocks 0-1" "$WORK/recompute-memory.txt" || fail "ferry memory shows no recomputing blocks"
grep -q "recompute+backward h.1" "$WORK/recompute-memory.txt" || fail "ferry memory's trace shows no recompute period"
# By default (auto) an ample device recomputes nothing after the warm-up.
[ "$("$FERRY" get "$ID" -o json | json "d['progress'].get('recomputed_blocks', [])")" = "[]" ] \
  || fail "auto recomputed on an ample device"

# A device budget too small for one step fails the job with the numbers and
# what to change; the daemon serves on.
SMALL="$("$FERRY" submit "$EXAMPLE" --set=train.steps=20,memory.device_budget=2MiB -o json | json "d['id']")"
set +e; "$FERRY" watch "$SMALL" >"$WORK/small.txt" 2>&1; rc=$?; set -e
[ "$rc" -eq 1 ] || fail "watch of the over-budget job exited $rc, not 1"
"$FERRY" get "$SMALL" -o json >"$WORK/small.json"
[ "$(json "d['state']" <"$WORK/small.json")" = "JOB_STATE_FAILED" ] || fail "the over-budget job did not fail"
json "d['error']" <"$WORK/small.json" | grep -q "out of device memory in period" || fail "no period in: $(json "d['error']" <"$WORK/small.json")"
json "d['error']" <"$WORK/small.json" | grep -q "memory.device_budget" || fail "no advice in the error"
"$FERRY" info >/dev/null || fail "ferryd stopped serving after an out-of-memory job"
"$FERRY" list | grep -q "$ID  tiny  succeeded" || fail "ferry list does not show the job"

# A job cancelled while it runs ends CANCELLED; ferry watch then exits 1.
LONG="$("$FERRY" submit "$EXAMPLE" --set=train.steps=100000 -o json | json "d['id']")"
wait_for_steps "$LONG"
"$FERRY" cancel "$LONG" | grep -q "stopping" || fail "cancel did not report the stop"
set +e; "$FERRY" watch "$LONG" >"$WORK/cancelled.txt" 2>&1; rc=$?; set -e
[ "$rc" -eq 1 ] || fail "watch of a cancelled job exited $rc, not 1"
[ "$("$FERRY" get "$LONG" -o json | json "d['state']")" = "JOB_STATE_CANCELLED" ] || fail "not cancelled"

# A worker killed mid-step fails its job with the reason; the daemon serves on.
CRASH="$("$FERRY" submit "$EXAMPLE" --set=train.steps=100000 -o json | json "d['id']")"
wait_for_steps "$CRASH"
WORKER_PID="$(pgrep -f -- "--spec=$WORK/state/jobs/$CRASH/spec.json")" || fail "no worker process for $CRASH"
kill -9 $WORKER_PID
set +e; "$FERRY" watch "$CRASH" >"$WORK/crashed.txt" 2>&1; rc=$?; set -e
[ "$rc" -eq 1 ] || fail "watch of a crashed job exited $rc, not 1"
"$FERRY" get "$CRASH" -o json >"$WORK/crashed.json"
[ "$(json "d['state']" <"$WORK/crashed.json")" = "JOB_STATE_FAILED" ] || fail "the crashed job is not FAILED"
json "d['error']" <"$WORK/crashed.json" | grep -q "killed by signal 9" || fail "the error does not say how the worker died"
"$FERRY" info >/dev/null || fail "ferryd stopped serving after a worker crash"
pgrep -f -- "--spec=$WORK/state/jobs/" && fail "a worker process was left behind"

# /metrics has the documented series, with values from the job.
curl -sf "http://$METRICS/metrics" >"$WORK/metrics.txt" || fail "cannot scrape /metrics"
for series in 'ferry_jobs{state="succeeded"} 3' 'ferry_loss_scale ' 'ferry_skipped_steps_total ' 'ferry_jobs{state="cancelled"} 1' 'ferry_jobs{state="failed"} 2' \
              'ferry_memory_transferred_bytes_total{direction="host_to_device"}' 'ferry_memory_phase{phase="steady"}' \
              'ferry_memory_capacity_bytes{tier="device"}' 'ferry_memory_evictions_total' 'ferry_recomputed_blocks ' \
              'ferry_step_duration_seconds_bucket{' 'ferry_step_duration_seconds_count' \
              'ferry_tokens_total ' 'ferry_loss ' 'ferry_memory_bytes{kind="param",tier="host"}' \
              'ferry_memory_capacity_bytes{tier="host"}' 'ferry_build_info{'; do
  grep -qF "$series" "$WORK/metrics.txt" || fail "/metrics lacks $series"
done
TOKENS="$(awk '/^ferry_tokens_total /{print $2}' "$WORK/metrics.txt")"
"$PY" -c "import sys; assert float(sys.argv[1]) >= 80*8*128, sys.argv[1]" "$TOKENS" \
  || fail "ferry_tokens_total is $TOKENS, less than the job's 81920 tokens"

# Evaluation on held-out data: the last tenth of a prepared token file,
# which training never samples; before training, every 10 steps and at the
# end, in progress events, ferry get and /metrics.
"$FERRY" data prepare --out="$WORK/licenses.bin" /usr/share/common-licenses/GPL-3 >/dev/null \
  || fail "ferry data prepare"
cat >"$WORK/eval.yaml" <<EOF
model: {preset: gpt2-tiny, seq_len: 64}
data: {path: $WORK/licenses.bin, eval: {held_out_fraction: 0.1}}
train: {steps: 20, batch_size: 4, lr: 3.0e-3, eval_every_steps: 10, eval_batches: 2}
EOF
EVAL="$("$FERRY" submit "$WORK/eval.yaml" -o json | json "d['id']")"
"$FERRY" watch "$EVAL" >"$WORK/eval.txt" 2>&1 || fail "the evaluating job failed: $(tail -3 "$WORK/eval.txt")"
for when in "before training" "after step 10" "after step 20"; do
  grep -q "eval: loss [0-9.]* (perplexity [0-9.]*) $when" "$WORK/eval.txt" || fail "watch shows no eval $when: $(cat "$WORK/eval.txt")"
done
grep -q "step 20/20 .* eval [0-9.]* (ppl " "$WORK/eval.txt" || fail "the last progress line has no eval: $(cat "$WORK/eval.txt")"
"$FERRY" get "$EVAL" -o json >"$WORK/eval.json"
"$PY" -c "
import json, math, sys
d = json.load(open(sys.argv[1]))
first, last = d['initial_eval'], d['last_eval']
assert int(first.get('step', 0)) == 0 and int(last['step']) == 20, (first, last)
assert int(last['tokens']) == 2 * 4 * 64 and abs(last['perplexity'] - math.exp(last['loss'])) < 1e-6 * last['perplexity'], last
assert last['loss'] < first['loss'], (first, last)
" "$WORK/eval.json" || fail "Job has no evaluations: $(cat "$WORK/eval.json")"
"$FERRY" get "$EVAL" | grep -q "^eval: .* at step 20, .* before training" || fail "ferry get shows no eval: $("$FERRY" get "$EVAL")"
# (Scraped to a file: grep -q stops reading at its match, and curl writing
# the rest would then fail the pipeline.)
curl -sf "http://$METRICS/metrics" >"$WORK/metrics-eval.txt" || fail "cannot scrape /metrics"
grep -q '^ferry_eval_loss [0-9]' "$WORK/metrics-eval.txt" || fail "/metrics has no ferry_eval_loss"

# Tensor parallel through ferryd: two workers, one job, the one-rank loss.
PAR_SET="train.steps=15,model.dropout=0.1"
SOLO="$("$FERRY" submit "$EXAMPLE" --set=$PAR_SET -o json | json "d['id']")"
"$FERRY" watch "$SOLO" >/dev/null 2>&1 || fail "the one-rank reference job failed"
# Two tensor ranks, and two data ranks with everything sharded
# (parallel.shard: full): the same loss.
for RUN in "tensor:parallel.tensor=2:two tensor ranks" \
  "full:parallel.data=2,parallel.shard=full:two fully sharded data ranks"; do
  IFS=: read -r NAME SET WHAT <<<"$RUN"
  ID="$("$FERRY" submit "$EXAMPLE" --set=$PAR_SET,$SET -o json | json "d['id']")"
  "$FERRY" watch "$ID" >"$WORK/$NAME.txt" 2>&1 || fail "the $WHAT job failed: $(tail -3 "$WORK/$NAME.txt")"
  [ -e "$WORK/state/jobs/$ID/worker.rank1.log" ] || fail "no second rank ran ($WHAT)"
  "$PY" - "$WHAT" "$("$FERRY" get "$SOLO" -o json | json "d['progress']['loss']")" \
    "$("$FERRY" get "$ID" -o json | json "d['progress']['loss']")" <<'PYEOF' || fail "$WHAT changed the training"
import sys
what, one, two = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
print(f"final loss: one rank {one:.8f}, {what} {two:.8f}")
assert abs(one - two) < 1e-5
PYEOF
  if [ "$NAME" = tensor ]; then TP="$ID"; fi
done
# Every rank's shard has its placement.
"$FERRY" memory "$TP" --rank=1 >"$WORK/rank1.txt" || fail "ferry memory --rank=1 failed"
head -1 "$WORK/rank1.txt" | grep -q "$TP rank 1 of 2  auto policy" || fail "ferry memory --rank=1: $(head -1 "$WORK/rank1.txt")"
expect_refusal 2 "rank: job $TP has 2 ranks; use 0 to 1" -- memory "$TP" --rank=2
curl -sf "http://$METRICS/metrics" >"$WORK/ranked-metrics.txt" || fail "cannot scrape /metrics"
grep -q '^ferry_rank_memory_bytes{rank="1",tier="device"}' "$WORK/ranked-metrics.txt" \
  || fail "/metrics has no memory series for rank 1"
# A rank killed mid-training fails the job naming the rank; no worker stays.
# Two data ranks shard the optimizer states by default.
PAR="$("$FERRY" submit "$EXAMPLE" --set=train.steps=100000,parallel.data=2 -o json | json "d['id']")"
wait_for_steps "$PAR"
[ "$("$FERRY" get "$PAR" -o json | json "d['spec']['parallel']['shard']")" = "SHARD_MODE_OPTIMIZER" ] \
  || fail "two data ranks do not shard by default: $("$FERRY" get "$PAR" -o json | json "d['spec']['parallel']")"
RANK1="$(pgrep -f -- "--spec=$WORK/state/jobs/$PAR/spec.json" | sort -n | tail -1)" || fail "no workers for $PAR"
kill -9 "$RANK1"
set +e; "$FERRY" watch "$PAR" >"$WORK/par.txt" 2>&1; rc=$?; set -e
[ "$rc" -eq 1 ] || fail "watch of the job with a killed rank exited $rc, not 1"
"$FERRY" get "$PAR" -o json >"$WORK/par.json"
[ "$(json "d['state']" <"$WORK/par.json")" = "JOB_STATE_FAILED" ] || fail "the job with a killed rank is not FAILED"
json "d['error']" <"$WORK/par.json" >"$WORK/par-error.txt"
grep -q "^rank 1: the worker was killed by signal 9" "$WORK/par-error.txt" \
  || fail "the error does not name the rank: $(cat "$WORK/par-error.txt")"
grep -Eq "rank 0: training: (all-reduce|reduce-scatter|all-gather) in the data group \(rank 0 of 2\) failed" \
  "$WORK/par-error.txt" \
  || fail "the error does not name the collective: $(cat "$WORK/par-error.txt")"
pgrep -f -- "--spec=$WORK/state/jobs/" && fail "a worker process was left behind"
"$FERRY" info >/dev/null || fail "ferryd stopped serving after a rank died"
# Cancelling a two-rank job stops both ranks after the same step.
PARC="$("$FERRY" submit "$EXAMPLE" --set=train.steps=100000,parallel.tensor=2 -o json | json "d['id']")"
wait_for_steps "$PARC"
"$FERRY" cancel "$PARC" >/dev/null
set +e; "$FERRY" watch "$PARC" >/dev/null 2>&1; set -e
[ "$("$FERRY" get "$PARC" -o json | json "d['state']")" = "JOB_STATE_CANCELLED" ] || fail "the two-rank job was not cancelled"
pgrep -f -- "--spec=$WORK/state/jobs/" && fail "a worker process was left behind after a cancel"

# A worker killed mid-training is restarted (max_restarts) and resumes from
# its newest checkpoint: the job succeeds at the undisturbed job's loss.
RESUME_SET="train.steps=200,model.dropout=0.1,max_restarts=2,checkpoint.every_steps=40"
CALM="$("$FERRY" submit "$EXAMPLE" --set=$RESUME_SET,checkpoint.dir=$WORK/calm-ckpt -o json | json "d['id']")"
"$FERRY" watch "$CALM" >/dev/null 2>&1 || fail "the undisturbed checkpointed job failed"
HIT="$("$FERRY" submit "$EXAMPLE" --set=$RESUME_SET,checkpoint.dir=$WORK/hit-ckpt -o json | json "d['id']")"
for _ in $(seq 1 600); do [ -d "$WORK/hit-ckpt/rank0/step-000000000080" ] && break; sleep 0.05; done
[ -d "$WORK/hit-ckpt/rank0/step-000000000080" ] || fail "no checkpoint at step 80"
kill -9 "$(pgrep -f -- "--spec=$WORK/state/jobs/$HIT/spec.json")"
"$FERRY" watch "$HIT" >"$WORK/hit.txt" 2>&1 || fail "the restarted job did not succeed: $(tail -3 "$WORK/hit.txt")"
"$FERRY" get "$HIT" -o json >"$WORK/hit.json"
[ "$(json "d['attempts']" <"$WORK/hit.json")" = "2" ] || fail "the job was not restarted once"
"$PY" - "$("$FERRY" get "$CALM" -o json | json "d['progress']['loss']")" "$(json "d['progress']['loss']" <"$WORK/hit.json")" <<'PYEOF' \
  || fail "the restarted job did not end where the undisturbed one did"
import sys
calm, hit = sys.argv[1:]
print(f"final loss: undisturbed {calm}, killed and restarted {hit}")
assert calm == hit
PYEOF

# SIGTERM: the daemon exits cleanly.
kill -TERM "$DAEMON"
for _ in $(seq 1 300); do kill -0 "$DAEMON" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$DAEMON" 2>/dev/null; then fail "ferryd did not exit within 30 s of SIGTERM"; fi
wait "$DAEMON" || fail "ferryd exited non-zero after SIGTERM"
trap - EXIT
echo PASS
