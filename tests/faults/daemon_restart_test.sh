#!/usr/bin/env bash
# The daemon's jobs survive the daemon: killed with SIGKILL mid-training and
# started again, it resumes the running job from its newest checkpoint and
# the job ends at the undisturbed job's loss; 100 queued jobs, through a
# graceful restart and a kill, all end SUCCEEDED exactly once, in order.
set -euo pipefail

RUNFILES="${TEST_SRCDIR:-$PWD}/ferry"
source "$RUNFILES/tests/lib/ferryd.sh"
WORK="$(mktemp -d "${TEST_TMPDIR:-/tmp}/restart.XXXXXX")"
STATE="$WORK/state"
STARTS=0

fail() { echo "FAIL: $*" >&2; show_logs 15 "$WORK"/ferryd.*.log; exit 1; }
kill_ferryd_at_exit

start_daemon() {
  STARTS=$((STARTS + 1))
  start_ferryd "$WORK/ferryd.$STARTS.log" --state_dir="$STATE"
}
kill_daemon() {
  kill -9 "$DAEMON"; wait "$DAEMON" 2>/dev/null || true; DAEMON=""
}
stop_daemon() {
  kill -TERM "$DAEMON"
  wait "$DAEMON" || fail "ferryd exited non-zero after SIGTERM"
  DAEMON=""
}
no_workers_left() {
  for _ in $(seq 1 50); do pgrep -f -- "--spec=$STATE/jobs/" >/dev/null || return 0; sleep 0.1; done
  fail "a worker outlived its daemon: $(pgrep -af -- "--spec=$STATE/jobs/")"
}

cat >"$WORK/job.yaml" <<'YAML'
model: {layers: 2, hidden: 64, heads: 4, vocab_size: 64, seq_len: 32, dropout: 0.1}
data: {synthetic: {}}
train: {steps: 300, batch_size: 8, lr: 3.0e-3, threads: 1}
YAML

# --- kill -9 of the daemon mid-training ---
start_daemon
CALM="$(submit "$WORK/job.yaml" --set=checkpoint.dir=$WORK/calm,checkpoint.every_steps=50)"
HIT="$(submit "$WORK/job.yaml" --set=checkpoint.dir=$WORK/hit,checkpoint.every_steps=50)"
QUEUED="$(submit "$WORK/job.yaml" --set=train.steps=20)"
"$FERRY" watch "$CALM" >/dev/null 2>&1 || fail "the undisturbed job failed"
for _ in $(seq 1 600); do
  [ "$(get "$HIT" "d.get('last_checkpoint', {}).get('step', 0)")" -ge 100 ] && break
  sleep 0.1
done
[ "$(get "$HIT" "d.get('last_checkpoint', {}).get('step', 0)")" -ge 100 ] || fail "no checkpoint at step 100"
"$FERRY" get "$HIT" | grep -q "^checkpoint: *step 1[05]0, $WORK/hit/rank0/step-" || fail "ferry get does not show the checkpoint"
kill_daemon
no_workers_left
start_daemon
grep -q "job store $STATE/jobs.db: 3 jobs, 2 of them queued" "$WORK/ferryd.2.log" || fail "the restarted daemon did not recover the jobs"
"$FERRY" watch "$HIT" >"$WORK/hit.txt" 2>&1 || fail "the interrupted job did not succeed: $(tail -3 "$WORK/hit.txt")"
"$FERRY" get "$HIT" -o json >"$WORK/hit.json"
[ "$(json "d['interrupted_runs']" <"$WORK/hit.json")" = 1 ] || fail "interrupted_runs is not 1"
[ "$(json "d['attempts']" <"$WORK/hit.json")" = 2 ] || fail "attempts is not 2"
grep -q "checkpoint: resuming after step 1[05]0" "$STATE/jobs/$HIT/worker.log" || fail "the job did not resume from its checkpoint"
[ "$(get "$CALM" "d['progress']['loss']")" = "$(json "d['progress']['loss']" <"$WORK/hit.json")" ] \
  || fail "the resumed job ended at $(json "d['progress']['loss']" <"$WORK/hit.json"), the undisturbed one at $(get "$CALM" "d['progress']['loss']")"
echo "kill -9 of the daemon: resumed at the undisturbed loss $(get "$CALM" "d['progress']['loss']")"
"$FERRY" watch "$QUEUED" >/dev/null 2>&1 || fail "the queued job did not run after the restart"
[ "$(get "$CALM" "d['state']")" = JOB_STATE_SUCCEEDED ] || fail "the finished job was not remembered"

# --- 100 jobs through a graceful restart and a kill ---
cat >"$WORK/small.yaml" <<'YAML'
model: {layers: 1, hidden: 32, heads: 2, vocab_size: 32, seq_len: 16}
data: {synthetic: {}}
train: {steps: 6, batch_size: 2, threads: 1}
YAML
: >"$WORK/ids"
for i in $(seq 1 100); do
  "$FERRY" submit "$WORK/small.yaml" --set=name=n$i,checkpoint.dir=$WORK/many/$i,checkpoint.every_steps=2 -o json \
    | json "d['id']" >>"$WORK/ids"
done
done_count() { "$FERRY" list --state=succeeded -o json | json "len(d.get('jobs', []))"; }
wait_done() {  # wait_done N: until at least N jobs have succeeded
  for _ in $(seq 1 1200); do [ "$(done_count)" -ge "$1" ] && return 0; sleep 0.1; done
  fail "fewer than $1 jobs succeeded in 120 s"
}
wait_done 30
stop_daemon
no_workers_left
start_daemon
wait_done 65
kill_daemon
no_workers_left
start_daemon
for id in $(cat "$WORK/ids"); do "$FERRY" watch "$id" >/dev/null 2>&1 || fail "job $id did not succeed"; done
"$FERRY" list -o json >"$WORK/list.json"
"$PY" - "$WORK" "$STATE" <<'PYEOF' || fail "the 100 jobs did not each succeed once, in order"
import glob, json, re, sys
work, state = sys.argv[1:]
ids = open(f"{work}/ids").read().split()
assert len(ids) == 100 and len(set(ids)) == 100
jobs = {j["id"]: j for j in json.load(open(f"{work}/list.json"))["jobs"]}
states = {jobs[i]["state"] for i in ids}
assert states == {"JOB_STATE_SUCCEEDED"}, states
# Each job's run reached its end exactly once across the three daemons, and
# they finished in the order they were submitted.
finished = []
for n in (2, 3, 4):
    for line in open(f"{work}/ferryd.{n}.log"):
        m = re.search(r"\bjob (j-[0-9a-f]+) (succeeded|failed|cancelled)\b", line)
        if m:
            finished.append((m.group(1), m.group(2)))
ours = [(i, s) for i, s in finished if i in set(ids)]
assert all(s == "succeeded" for _, s in ours), [x for x in ours if x[1] != "succeeded"]
assert [i for i, _ in ours] == ids, "not each exactly once in submission order"
interrupted = [i for i in ids if jobs[i].get("interrupted_runs")]
resumed = [i for i in ids if int(jobs[i].get("attempts", 1)) > 1]
print(f"100 jobs: all succeeded once, in order; {len(resumed)} ran more than once "
      f"({len(interrupted)} interrupted by the kill, the rest drained)")
assert len(interrupted) <= 1
PYEOF
stop_daemon
trap - EXIT
echo PASS
