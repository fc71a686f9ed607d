#!/usr/bin/env bash
# Monitoring with a real Prometheus (Debian's package): lint the scrape config
# and alert rules and run the rules' unit tests; start ferryd and a training
# job, let Prometheus (on loopback, scraping every second, with our alert
# rules loaded) scrape it, and query memory by tier, bytes moved, step time
# and loss over the HTTP API; lint a live scrape with promtool; check every
# Grafana panel and alert names only metrics the daemon exports, and that
# Prometheus accepts every one of their expressions.
set -euo pipefail

RUNFILES="${TEST_SRCDIR:-$PWD}/ferry"
source "$RUNFILES/tests/lib/ferryd.sh"
DEPLOY="$RUNFILES/deploy"
NAMES="$RUNFILES/tests/monitoring/promql_names.py"
WORK="$(mktemp -d "${TEST_TMPDIR:-/tmp}/monitoring.XXXXXX")"
DAEMON=""
PROM=""

fail() {
  echo "FAIL: $*" >&2
  echo "--- ferryd log ---" >&2; tail -20 "$WORK/ferryd.log" >&2 || true
  echo "--- prometheus log ---" >&2; tail -20 "$WORK/prometheus.log" >&2 || true
  exit 1
}
cleanup() {
  for p in $PROM $DAEMON; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

for tool in prometheus promtool curl; do
  command -v "$tool" >/dev/null || fail "$tool is not installed; run tools/install_deps.sh (Debian package prometheus)"
done
prometheus --version 2>&1 | head -1

# --- The shipped configuration and rules. ---
promtool check config "$DEPLOY/prometheus/prometheus.yml" || fail "promtool check config prometheus.yml"
promtool check rules "$DEPLOY/prometheus/alerts.yml" || fail "promtool check rules alerts.yml"
(cd "$DEPLOY/prometheus" && promtool test rules alerts_test.yml) || fail "promtool test rules alerts_test.yml"

# --- ferryd. ---
"$FERRYD" --state_dir="$WORK/state" --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 \
  --ready_file="$WORK/ready.json" >"$WORK/ferryd.log" 2>&1 &
DAEMON=$!
wait_ready "$DAEMON" "$WORK/ready.json"
export FERRY_ADDRESS="$READY_ADDRESS"
METRICS="$READY_METRICS"
echo "ferryd at $FERRY_ADDRESS, metrics at $METRICS"

# --- Prometheus on a free loopback port, scraping ferryd every second. ---
PORT="$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
cat >"$WORK/prometheus.yml" <<YAML
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - $DEPLOY/prometheus/alerts.yml
scrape_configs:
  - job_name: ferryd
    static_configs:
      - targets: ["$METRICS"]
YAML
promtool check config "$WORK/prometheus.yml" >/dev/null || fail "the generated config does not check"
prometheus --config.file="$WORK/prometheus.yml" --storage.tsdb.path="$WORK/tsdb" \
  --web.listen-address="127.0.0.1:$PORT" >"$WORK/prometheus.log" 2>&1 &
PROM=$!
API="http://127.0.0.1:$PORT/api/v1"
for _ in $(seq 1 300); do
  curl -sf "http://127.0.0.1:$PORT/-/ready" >/dev/null && break
  kill -0 "$PROM" 2>/dev/null || fail "prometheus exited during start-up"
  sleep 0.1
done
curl -sf "http://127.0.0.1:$PORT/-/ready" >/dev/null || fail "prometheus not ready in 30 s"
echo "prometheus at 127.0.0.1:$PORT"

# A training job that moves model data between the tiers (a 10 MiB device)
# and checkpoints.
cat >"$WORK/job.yaml" <<'YAML'
name: monitored
model: {preset: gpt2-tiny}
data: {synthetic: {branching: 2}}
train: {steps: 200, batch_size: 4, lr: 3.0e-3, seed: 1}
memory: {policy: auto, device_budget: 10MiB}
checkpoint: {dir: ckpt, every_steps: 20, keep: 2}
YAML
ID="$("$FERRY" submit "$WORK/job.yaml" -o json | json "d['id']")"
echo "submitted $ID"

# query PROMQL: prints the result vector as JSON lines {"metric":..., "value": v}
query() {
  curl -sf --get "$API/query" --data-urlencode "query=$1" |
    "$PY" -c '
import json, sys
d = json.load(sys.stdin)
assert d["status"] == "success", d
for r in d["data"]["result"]:
    print(json.dumps({"metric": r["metric"], "value": float(r["value"][1])}, sort_keys=True))'
}
# has PROMQL PYTHON-CONDITION: the query returns at least one sample, and
# the condition holds for the list `rs` of results.
has() {
  query "$1" >"$WORK/q.txt" 2>/dev/null || return 1
  "$PY" - "$WORK/q.txt" "$2" <<'PYEOF'
import json, math, sys
rs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {tuple(sorted(r["metric"].items())): r["value"] for r in rs}
ok = bool(rs) and all(not math.isnan(r["value"]) for r in rs) and eval(sys.argv[2], {"rs": rs, "v": [r["value"] for r in rs], "label": lambda k: {r["metric"].get(k): r["value"] for r in rs}})
sys.exit(0 if ok else 1)
PYEOF
}

# Wait until the job is past its warm-up and Prometheus has a few scrapes.
declare -A CHECKS=(
  ["memory by tier"]='sum by (tier) (ferry_memory_bytes)|label("tier").get("device", 0) > 0 and "host" in label("tier")'
  ["device capacity"]='ferry_memory_capacity_bytes{tier="device"}|v[0] == 10 * 2**20'
  ["bytes moved"]='sum by (direction) (rate(ferry_memory_transferred_bytes_total[5s]))|label("direction").get("host_to_device", 0) > 0'
  ["step time p50"]='histogram_quantile(0.5, sum by (le) (rate(ferry_step_duration_seconds_bucket[5s])))|0 < v[0] < 120'
  ["step time p99"]='histogram_quantile(0.99, sum by (le) (rate(ferry_step_duration_seconds_bucket[5s])))|0 < v[0] <= 120'
  ["loss"]='ferry_loss|0 < v[0] < 10'
  ["tokens/s"]='rate(ferry_tokens_total[5s])|v[0] > 0'
  ["jobs running"]='ferry_jobs{state="running"}|v[0] == 1'
  ["scrape up"]='up{job="ferryd"}|v[0] == 1'
)
pending=("${!CHECKS[@]}")
for _ in $(seq 1 120); do
  still=()
  for name in "${pending[@]}"; do
    spec="${CHECKS[$name]}"
    if has "${spec%%|*}" "${spec#*|}"; then
      echo "ok: $name: $(tr '\n' ' ' <"$WORK/q.txt" | cut -c1-200)"
    else
      still+=("$name")
    fi
  done
  pending=("${still[@]+"${still[@]}"}")
  [ ${#pending[@]} -eq 0 ] && break
  [ "$("$FERRY" get "$ID" -o json | json "d['state']")" = "JOB_STATE_RUNNING" ] || break
  sleep 1
done
[ ${#pending[@]} -eq 0 ] || fail "no data while the job ran for: ${pending[*]} (last: $(cat "$WORK/q.txt"))"

# --- A live scrape mid-job: lint it, and check what the dashboard and the
# alerts name against it. ---
curl -sf "http://$METRICS/metrics" >"$WORK/scrape.txt" || fail "cannot scrape ferryd"
promtool check metrics <"$WORK/scrape.txt" || fail "promtool check metrics found problems in a live scrape"
echo "promtool check metrics: clean ($(grep -c '^# HELP' "$WORK/scrape.txt") families)"
"$PY" "$NAMES" check "$WORK/scrape.txt" "$DEPLOY/grafana/dashboards/ferry.json" "$DEPLOY/prometheus/alerts.yml" ||
  fail "the dashboard or the alerts name metrics ferryd does not export"
# Prometheus accepts every panel's and alert's expression (variables filled in).
n=0
while IFS= read -r expr; do
  curl -sf --get "$API/query" --data-urlencode "query=$expr" >/dev/null || {
    curl -s --get "$API/query" --data-urlencode "query=$expr" >&2 || true
    fail "prometheus refuses: $expr"
  }
  n=$((n + 1))
done < <("$PY" "$NAMES" exprs "$DEPLOY/grafana/dashboards/ferry.json" "$DEPLOY/prometheus/alerts.yml")
echo "prometheus ran all $n dashboard and alert expressions"

# --- The job's end: checkpoints written, none failed; the rules loaded. ---
"$FERRY" watch "$ID" >"$WORK/watch.txt" 2>&1 || fail "the job failed: $(tail -3 "$WORK/watch.txt")"
for _ in $(seq 1 30); do
  has 'ferry_checkpoints_total{result="written"}' 'v[0] >= 6' && has 'ferry_jobs_finished_total{state="succeeded"}' 'v[0] == 1' && break
  sleep 1
done
has 'ferry_checkpoints_total{result="written"}' 'v[0] >= 6' || fail "checkpoints written: $(cat "$WORK/q.txt")"
has 'ferry_checkpoints_total{result="failed"}' 'v[0] == 0' || fail "checkpoints failed: $(cat "$WORK/q.txt")"
has 'ferry_last_checkpoint_step' 'v[0] == 200' || fail "last checkpoint step: $(cat "$WORK/q.txt")"
has 'histogram_quantile(0.99, sum by (le, part) (increase(ferry_checkpoint_duration_seconds_bucket[5m])))' \
  'set(label("part")) == {"blocking", "total"}' || fail "checkpoint durations: $(cat "$WORK/q.txt")"
curl -sf "$API/rules" | "$PY" -c '
import json, sys
rules = [r for g in json.load(sys.stdin)["data"]["groups"] for r in g["rules"]]
names = sorted(r["name"] for r in rules)
bad = [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
print("rules loaded:", ", ".join(names))
assert len(names) == 5 and not bad, bad
firing = [r["name"] for r in rules if r["state"] == "firing"]
assert not firing, f"alerts firing on a healthy run: {firing}"' || fail "the alert rules did not load and evaluate cleanly"
echo "PASS"
