#!/usr/bin/env bash
# Builds the engine, ferry-worker, bench/device_check and the engine's tests
# with CMake and ninja (tools/gpu/CMakeLists.txt), without Bazel; optionally
# runs the tests with ctest.
#
#   tools/gpu/build.sh [--test[=REGEX]] [BUILD_DIR]     BUILD_DIR default: build-cmake/
#
# Environment:
#   TORCH_PREFIX       LibTorch's CMake prefix (the directory holding Torch/);
#                      default: torch.utils.cmake_prefix_path of python3's torch
#                      when it imports, else the system's (Debian's libtorch-dev).
#   FERRY_DEPS_PREFIX  where Debian packages were unpacked (tools/gpu/unpack_debs.sh);
#                      default: the system.
#   JOBS               parallel compiles (default: nproc). Each one that
#                      includes LibTorch takes about a gigabyte.
#   CCACHE_DIR         default ~/.cache/ferry-ccache; CCACHE_BASEDIR is the
#                      repository root, so another clone's build hits the same
#                      cache when its build directory is inside the clone.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
TEST=""
BUILD=""
for arg in "$@"; do
  case "$arg" in
    --test) TEST="." ;;
    --test=*) TEST="${arg#--test=}" ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    -*) echo "build.sh: unknown option $arg" >&2; exit 2 ;;
    *) BUILD="$arg" ;;
  esac
done
BUILD="${BUILD:-$ROOT/build-cmake}"
JOBS="${JOBS:-$(nproc)}"

if [ -z "${TORCH_PREFIX:-}" ]; then
  TORCH_PREFIX="$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null || true)"
  [ -f "$TORCH_PREFIX/Torch/TorchConfig.cmake" ] || TORCH_PREFIX=""
fi

export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ferry-ccache}"
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$ROOT}"
# Debug info names the compile's directory; leave it out of the hash so that
# another build directory hits the cache.
export CCACHE_NOHASHDIR=1

args=(-S "$ROOT/tools/gpu" -B "$BUILD" -G Ninja)
[ -n "$TORCH_PREFIX" ] && args+=("-DCMAKE_PREFIX_PATH=$TORCH_PREFIX")
[ -n "${FERRY_DEPS_PREFIX:-}" ] && args+=("-DFERRY_DEPS_PREFIX=$FERRY_DEPS_PREFIX")
have_ccache=""
command -v ccache >/dev/null 2>&1 && have_ccache=1
[ -n "$have_ccache" ] && ccache --zero-stats >/dev/null
start=$(date +%s)
cmake "${args[@]}"
cmake --build "$BUILD" -j "$JOBS"
echo "build.sh: built in $(($(date +%s) - start)) s in $BUILD"
if [ -n "$have_ccache" ]; then
  ccache --show-stats 2>/dev/null | grep -E '^ *(Hits|Misses):' || true
fi

if [ -n "$TEST" ]; then
  cd "$BUILD"
  ctest -j "$JOBS" --output-on-failure -R "$TEST"
fi
