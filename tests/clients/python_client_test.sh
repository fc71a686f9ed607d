#!/usr/bin/env bash
# The Python example client (client/python) against a live ferryd, with the
# stubs //proto:ferry_v1_py generates: the package imports, every module has
# its .pyi; a job file's job is watched to SUCCEEDED and its placement printed;
# the watch resumes after dropped connections without losing an event, and
# follows the job through a kill -9 and restart of the daemon.
set -euo pipefail
CLIENT_NAME=python
source "${TEST_SRCDIR:-$PWD}/ferry/tests/clients/lib.sh"

export PYTHONPATH="$RUNFILES/proto/python"
"$PY" - <<'PYEOF' || fail "the generated package does not import"
from ferry.v1 import ferry_pb2, ferry_pb2_grpc, job_pb2, memory_pb2, options_pb2, spec_pb2
methods = {m.name for m in ferry_pb2.DESCRIPTOR.services_by_name["Ferry"].methods}
assert {"SubmitJob", "WatchJob", "GetMemoryPlacement", "ExportWeights"} <= methods, methods
assert hasattr(ferry_pb2_grpc, "FerryStub")
print("ok: from ferry.v1 import ferry_pb2_grpc; Ferry has", ", ".join(sorted(methods)))
PYEOF
for m in ferry job memory options spec; do
  [ -s "$PYTHONPATH/ferry/v1/${m}_pb2.pyi" ] || fail "no ferry/v1/${m}_pb2.pyi"
done
[ -e "$PYTHONPATH/ferry/__init__.py" ] && [ -e "$PYTHONPATH/ferry/v1/__init__.py" ] || fail "no __init__.py"
grep -q "class FerryStub" "$PYTHONPATH/ferry/v1/ferry_pb2_grpc.py" || fail "no FerryStub"
echo "ok: .pyi files and __init__.py files present"

CLIENT=("$PY" "$RUNFILES/client/python/ferry_client.py")
start_daemon
start_proxy

# A job file, with the flags overriding it.
scenario_direct "$RUNFILES/examples/gpt2-tiny.yaml"
expect "$WORK/direct.out" "^submitted j-"
scenario_dropped_stream
scenario_daemon_restart kill_daemon
scenario_errors
scenario_snapshot_fallback
scenario_tls
echo PASS
