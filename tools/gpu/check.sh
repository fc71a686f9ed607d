#!/usr/bin/env bash
# The GPU check: on a machine with an NVIDIA GPU, PyTorch built for CUDA,
# CMake and ninja (no Bazel, gRPC or internet), in under 8 minutes on an
# H200, with tools/gpu/carry/ prepared beforehand by tools/gpu/pack.sh:
#   1. builds the engine, ferry-worker, bench/device_check and the engine's
#      tests against the wheel's LibTorch (tools/gpu/build.sh);
#   2. runs the engine's tests (built for CUDA; they train on the simulated
#      device) with ctest;
#   3. runs the device checks on cuda (bench/device_check.cc): the budget
#      cap, bytes moved against the plan, prefetch overlap from CUDA events,
#      the out-of-memory message, GPT training on cuda against the CPU, and
#      GPT-2 XL in bf16 capped at 6 GiB (static fails, auto trains), with
#      tokens/s and MFU capped and uncapped;
#   4. the same model under PyTorch's own offload (FSDP, CPUOffload) at the
#      same cap (tools/gpu/fsdp_offload.py);
#   5. a whole job through ferryd (carried) on the GPU.
# Writes $OUT/gpu.json (and each stage's log beside it). Each stage has its
# own time limit, so one that hangs costs only its share.
#
#   OUT=/path tools/gpu/check.sh        # the device tool sets $OUT
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT="$PWD"
OUT="${OUT:-$ROOT/gpu-out}"
mkdir -p "$OUT"
CARRY="$ROOT/tools/gpu/carry"
WORK="${TMPDIR:-/tmp}/ferry-gpu"
BUILD="$WORK/build"
PEAK_TFLOPS="${PEAK_TFLOPS:-989}"  # H100/H200 SXM, bf16 dense
START=$(date +%s)
declare -A RC
stage() { echo "== $1 at $(($(date +%s) - START)) s" | tee -a "$OUT/check.log"; }

if [ ! -d "$CARRY/debs" ]; then
  echo "check.sh: $CARRY/debs is missing: run tools/gpu/pack.sh where Bazel is, and carry tools/gpu/carry" >&2
  exit 2
fi
mkdir -p "$WORK"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$OUT/gpu.txt" 2>&1

stage "unpack"
tools/gpu/unpack_debs.sh "$CARRY/debs" "$WORK/deps" >"$OUT/unpack.log" 2>&1
TORCH_PREFIX="$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')"
TORCH_LIB="$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')"
export TORCH_PREFIX FERRY_DEPS_PREFIX="$WORK/deps" JOBS="$(nproc)"
export LD_LIBRARY_PATH="$WORK/deps/usr/lib/x86_64-linux-gnu:$TORCH_LIB:${LD_LIBRARY_PATH:-}"

stage "build"
timeout 210 tools/gpu/build.sh "$BUILD" >"$OUT/build.log" 2>&1
RC[build]=$?
tail -5 "$OUT/build.log"

if [ "${RC[build]}" = 0 ]; then
  stage "engine tests"
  (cd "$BUILD" && timeout 60 ctest -j "$(nproc)" --timeout 55 --output-on-failure) >"$OUT/ctest.log" 2>&1
  RC[tests]=$?
  tail -3 "$OUT/ctest.log"

  stage "device checks"
  timeout 150 "$BUILD/device_check" --device=cuda --peak_tflops="$PEAK_TFLOPS" --capped_preset=gpt2-xl \
    --capped_budget=6GiB --steps=3 --out="$OUT/device_check.json" 2>&1 | tee "$OUT/device_check.log" | grep -v "^I"
  RC[device_check]=${PIPESTATUS[0]}
fi

stage "fsdp offload"
timeout 50 python3 tools/gpu/fsdp_offload.py --preset=gpt2-xl --seq_len=1024 --budget_gib=6 --steps=3 \
  --peak_tflops="$PEAK_TFLOPS" --out="$OUT/fsdp_capped.json" >"$OUT/fsdp.log" 2>&1
RC[fsdp]=$?
tail -3 "$OUT/fsdp.log"

if [ "${RC[build]}" = 0 ] && [ -x "$CARRY/daemon/ferryd" ]; then
  stage "a job through ferryd"
  (
    export LD_LIBRARY_PATH="$CARRY/daemon/lib:$LD_LIBRARY_PATH" FERRY_ADDRESS=127.0.0.1:50561
    STATE="$WORK/state"
    rm -rf "$STATE"
    "$CARRY/daemon/ferryd" --listen="$FERRY_ADDRESS" --metrics_listen=127.0.0.1:0 --state_dir="$STATE" \
      --devices=cuda --worker_binary="$BUILD/ferry-worker" --ready_file="$WORK/ready" >"$OUT/ferryd.log" 2>&1 &
    DAEMON=$!
    trap 'kill $DAEMON 2>/dev/null; wait $DAEMON 2>/dev/null' EXIT
    for _ in $(seq 120); do [ -e "$WORK/ready" ] && break; sleep 0.5; done
    "$CARRY/daemon/ferry" info
    ID="$("$CARRY/daemon/ferry" submit examples/gpt2-tiny.yaml --set=train.steps=100 -o json |
      python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')"
    timeout 30 "$CARRY/daemon/ferry" watch "$ID" | tail -3
    "$CARRY/daemon/ferry" get "$ID" -o json >"$OUT/ferryd_job.json"
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); sys.exit(0 if d["state"]=="SUCCEEDED" else 1)' \
      "$OUT/ferryd_job.json"
  ) >"$OUT/ferryd_job.log" 2>&1
  RC[ferryd]=$?
  tail -3 "$OUT/ferryd_job.log"
fi

stage "report"
export CHECK_SECONDS=$(($(date +%s) - START))
for k in build tests device_check fsdp ferryd; do export "RC_$k=${RC[$k]:-skipped}"; done
python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
def load(name):
    try:
        return json.load(open(os.path.join(out, name)))
    except (OSError, ValueError):
        return None
def text(name, lines=3):
    try:
        return "".join(open(os.path.join(out, name)).readlines()[-lines:]).strip()
    except OSError:
        return ""
report = {
    "gpu": text("gpu.txt", 1),
    "seconds": int(os.environ["CHECK_SECONDS"]),
    "exit_codes": {k: os.environ["RC_" + k] for k in ("build", "tests", "device_check", "fsdp", "ferryd")},
    "engine_tests": text("ctest.log", 3),
    "device_check": load("device_check.json"),
    "fsdp_offload_capped": load("fsdp_capped.json"),
    "ferryd_job": load("ferryd_job.json"),
}
with open(os.path.join(out, "gpu.json"), "w") as f:
    json.dump(report, f, indent=2)
print(json.dumps(report["exit_codes"]))
PY
for k in build tests device_check ferryd; do [ "${RC[$k]:-1}" = 0 ] || exit 1; done
