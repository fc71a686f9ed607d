#!/usr/bin/env bash
# The Grafana dashboard type-checks against Grafana's own schema
# (@grafana/schema from npm, compiled with tsc --strict): the dashboard as a
# Dashboard, each panel with its plugin's options and field config, its
# queries as Prometheus queries. The provisioning files agree with it.
#
# The npm packages (pinned in deploy/grafana/check/package-lock.json) come
# from the cache tools/install_deps.sh fills (FERRY_NPM_CACHE, default
# ~/.cache/ferry/npm), or from the npm registry.
set -euo pipefail

RUNFILES="${TEST_SRCDIR:-$PWD}/ferry"
GRAFANA="$RUNFILES/deploy/grafana"
WORK="$(mktemp -d "${TEST_TMPDIR:-/tmp}/grafana.XXXXXX")"
PY=/usr/bin/python3
fail() { echo "FAIL: $*" >&2; exit 1; }

command -v npm >/dev/null || fail "npm is not installed; run tools/install_deps.sh"

# Bazel points HOME at the test's directory: find the cache by the user's.
REAL_HOME="$(getent passwd "$(id -u)" | cut -d: -f6)"
CACHE="${FERRY_NPM_CACHE:-$REAL_HOME/.cache/ferry/npm}"
mkdir -p "$WORK/check"
cp "$GRAFANA/check/package.json" "$GRAFANA/check/package-lock.json" "$GRAFANA/check/tsconfig.json" "$WORK/check/"
# A copy: npm writes to its cache, and the test may not write outside its tree.
if [ -d "$CACHE/_cacache" ]; then cp -r "$CACHE" "$WORK/npm-cache"; else echo "no npm cache at $CACHE: fetching from the registry"; fi
(cd "$WORK/check" && npm ci --cache "$WORK/npm-cache" --prefer-offline --no-audit --no-fund --ignore-scripts \
  >"$WORK/npm.log" 2>&1) || { cat "$WORK/npm.log" >&2; fail "npm ci in deploy/grafana/check failed (run tools/install_deps.sh with the npm registry reachable)"; }
TSC="$WORK/check/node_modules/.bin/tsc"
echo "tsc $("$TSC" --version), @grafana/schema $("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["version"])' "$WORK/check/node_modules/@grafana/schema/package.json")"

"$PY" "$RUNFILES/tests/monitoring/dashboard_ts.py" "$GRAFANA/dashboards/ferry.json" "$WORK/check/dashboard.ts"
(cd "$WORK/check" && "$TSC" -p tsconfig.json) || fail "deploy/grafana/dashboards/ferry.json does not type-check against @grafana/schema"
echo "ok: the dashboard type-checks"

# The check has teeth: a misspelt option value and an unknown field fail it.
for bad in 's/"mode": "normal"/"mode": "normall"/' 's/"showLegend": true/"showLegend": true, "showLegends": true/'; do
  sed "$bad" "$GRAFANA/dashboards/ferry.json" >"$WORK/bad.json"
  cmp -s "$WORK/bad.json" "$GRAFANA/dashboards/ferry.json" && fail "the edit $bad changed nothing"
  "$PY" "$RUNFILES/tests/monitoring/dashboard_ts.py" "$WORK/bad.json" "$WORK/check/dashboard.ts"
  if (cd "$WORK/check" && "$TSC" -p tsconfig.json >/dev/null); then fail "a dashboard with $bad type-checks"; fi
done
echo "ok: broken dashboards do not"

# The panels the issue asks for, the variables, and the provisioning files.
"$PY" - "$GRAFANA" <<'PYEOF'
import json, sys, yaml
root = sys.argv[1]
d = json.load(open(f"{root}/dashboards/ferry.json"))
panels = [p for p in d["panels"] if p["type"] != "row"]
titles = {p["title"] for p in panels}
exprs = " ".join(t["expr"] for p in panels for t in p["targets"])
want = ["Device memory by kind, against capacity", "Host memory by kind, against capacity", "Host ↔ device bandwidth",
        "Step time p50 / p99", "Tokens / s", "Loss and eval loss", "Loss scale and skipped steps", "Evictions and prefetch hit rate",
        "Recompute share", "Jobs by state"]
missing = [t for t in want if t not in titles]
assert not missing, f"panels missing: {missing}"
for q in ["ferry_eval_loss", "histogram_quantile(0.5,", "histogram_quantile(0.99,", "ferry_memory_capacity_bytes", "ferry_memory_transferred_bytes_total"]:
    assert q in exprs, q
variables = {v["name"]: v for v in d["templating"]["list"]}
assert {"datasource", "job", "instance"} <= set(variables), variables.keys()
for p in panels:
    for t in p["targets"]:
        assert 'job=~"$job"' in t["expr"] and 'instance=~"$instance"' in t["expr"], (p["title"], t["expr"])
ids = [p["id"] for p in d["panels"]]
assert len(ids) == len(set(ids)), "panel ids repeat"
ds = yaml.safe_load(open(f"{root}/provisioning/datasources/ferry-prometheus.yml"))
assert ds["apiVersion"] == 1 and ds["datasources"][0]["type"] == "prometheus"
assert ds["datasources"][0]["uid"] == variables["datasource"]["current"]["value"], "the dashboard defaults to another data source"
prov = yaml.safe_load(open(f"{root}/provisioning/dashboards/ferry.yml"))
assert prov["apiVersion"] == 1 and prov["providers"][0]["type"] == "file" and prov["providers"][0]["options"]["path"]
print(f"ok: {len(panels)} panels, variables {sorted(variables)}, provisioning files agree")
PYEOF
echo PASS
