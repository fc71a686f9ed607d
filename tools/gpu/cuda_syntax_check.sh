#!/usr/bin/env bash
# Compiles (syntax and types only) the sources' CUDA-only code -- what
# FERRY_LIBTORCH_CUDA and USE_C10D_NCCL guard, which a CPU LibTorch build
# never compiles -- against Debian's LibTorch headers (they include c10/cuda
# and ATen/cuda) and the CUDA toolkit's headers, so that code cannot rot
# between runs on a GPU machine. A LibTorch 2.x build for CUDA is the real
# target (tools/gpu/check.sh); calls that differ between versions go
# through version-neutral forms (docs/BUILDING.md).
#
#   tools/gpu/cuda_syntax_check.sh        skips, saying so, without CUDA headers
set -euo pipefail
cd "$(dirname "$0")/../.."
CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
if [ ! -f "$CUDA_HOME/include/cuda_runtime_api.h" ]; then
  echo "cuda_syntax_check: no CUDA toolkit headers under $CUDA_HOME; skipped"
  exit 0
fi
SHIM="$(mktemp -d)"
trap 'rm -rf "$SHIM"' EXIT
# The header LibTorch's CUDA build generates; Debian's CPU package lacks it.
mkdir -p "$SHIM/c10/cuda/impl"
printf '#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n' >"$SHIM/c10/cuda/impl/cuda_cmake_macros.h"
mapfile -t FILES < <(grep -rlE 'FERRY_LIBTORCH_CUDA|USE_C10D_NCCL' engine server --include='*.cc' | sort)
status=0
for f in "${FILES[@]}"; do
  if g++ -std=c++17 -fsyntax-only -D_GLIBCXX_USE_CXX11_ABI=1 -DFERRY_LIBTORCH_CUDA=1 -DUSE_C10D_NCCL \
      -DUSE_C10D_GLOO -I. -I"$SHIM" -I"$CUDA_HOME/include" -I/usr/include/torch/csrc/api/include \
      -Wno-deprecated-declarations "$f"; then
    echo "cuda_syntax_check: $f ok"
  else
    echo "cuda_syntax_check: $f FAILED"
    status=1
  fi
done
exit $status
