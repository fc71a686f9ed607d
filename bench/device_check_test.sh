#!/usr/bin/env bash
# The device checks on the simulated device, small: every check passes and
# the JSON has each one's figures.
set -euo pipefail
OUT="$TEST_TMPDIR/device_check.json"
bench/device_check --device=cpu --quick --out="$OUT"
/usr/bin/python3 - "$OUT" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["ok"] and d["device"] == "sim", d
c = d["checks"]
for name in ("budget_cap", "moves", "overlap", "oom_message", "train_vs_cpu", "capped"):
    assert c[name]["ok"], (name, c[name])
assert c["moves"]["said_to_device_bytes"] == c["moves"]["copied_to_device_bytes"] > 0, c["moves"]
assert c["capped"]["auto_capped"]["tokens_per_second"] > 0, c["capped"]
assert not c["capped"]["static_capped"]["ok"], c["capped"]
print("device checks: ok")
PY
