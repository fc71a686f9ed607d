#!/usr/bin/env bash
# Installs every Debian package that building, running and testing Ferry needs.
# Idempotent: when everything is present it only checks, in about a second.
set -euo pipefail

PACKAGES=(
  # Build system (Bazel 4 from Debian, offline) and its Java rules.
  bazel-bootstrap bazel-rules-java
  g++ git ca-certificates
  # C++ libraries.
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libtorch-dev libgloo-dev prometheus-cpp-dev libgtest-dev
  libgmock-dev libgoogle-glog-dev libgflags-dev libsqlite3-dev libyaml-cpp-dev zlib1g-dev
  # An optimised BLAS for LibTorch: without it Debian falls back to the
  # reference BLAS, 20x slower at matrix products.
  libopenblas0-openmp
  # Tests and tools: the Python client stubs, YAML for the manifests, curl for
  # scraping /metrics, PyTorch for reading exported weights, the sqlite3 shell
  # for the job store's tests, strace for crashing a worker mid-checkpoint.
  python3 python3-grpcio python3-protobuf python3-yaml curl sqlite3 python3-torch strace
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "install_deps: installing ${#missing[@]} package(s): ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install_deps: done" >&2
