# Shell helpers for tests that run ferryd. Source it after defining
# fail() (which prints its message, and any logs, and exits 1).

# wait_ready PID READY_FILE: waits up to 60 s for the ferryd started as PID
# to write its --ready_file; fails if it exits first or never does. Then
# READY_ADDRESS and READY_METRICS hold the addresses it serves on.
wait_ready() {
  local pid="$1" file="$2"
  for _ in $(seq 1 600); do
    [ -s "$file" ] && break
    kill -0 "$pid" 2>/dev/null || fail "ferryd exited during start-up"
    sleep 0.1
  done
  [ -s "$file" ] || fail "ferryd did not become ready in 60 s"
  READY_ADDRESS="$(/usr/bin/python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['listen'])" "$file")"
  READY_METRICS="$(/usr/bin/python3 -c "import json,sys; print(json.load(open(sys.argv[1])).get('metrics_listen', ''))" "$file")"
}
