#!/usr/bin/env bash
# Installs every Debian package that building, running and testing Ferry needs.
# Idempotent: when everything is present it only checks, in about a second.
set -euo pipefail

PACKAGES=(
  # Build system (Bazel 4 from Debian, offline) and its Java rules.
  bazel-bootstrap bazel-rules-java
  g++ git ca-certificates
  # The CMake build for GPU machines without Bazel (tools/gpu/build.sh), which
  # CI also runs: CMake, ninja, ccache.
  cmake ninja-build ccache
  # C++ libraries.
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libtorch-dev libgloo-dev prometheus-cpp-dev libgtest-dev
  libgmock-dev libgoogle-glog-dev libgflags-dev libsqlite3-dev libyaml-cpp-dev zlib1g-dev
  # Tokenizers: PCRE2 for GPT-2's pre-tokenisation pattern, nlohmann/json for
  # vocab.json and token file headers, SentencePiece.
  libpcre2-dev nlohmann-json3-dev libsentencepiece-dev
  # An optimised BLAS for LibTorch: without it Debian falls back to the
  # reference BLAS, 20x slower at matrix products.
  libopenblas0-openmp
  # Tests and tools: the Python client stubs, YAML for the manifests, curl for
  # scraping /metrics, PyTorch for reading exported weights, the sqlite3 shell
  # for the job store's tests, strace for crashing a worker mid-checkpoint,
  # openssl for the certificates of the TLS tests.
  python3 python3-grpcio python3-protobuf python3-yaml curl sqlite3 python3-torch strace openssl
  # The tokenizer tests' references: the regex module for GPT-2's pattern,
  # SentencePiece's Python binding.
  python3-regex python3-sentencepiece
  # Sanitizer and fuzzing builds (--config=asan, tsan, fuzz): clang, its
  # sanitizer and libFuzzer runtimes, llvm-symbolizer for their reports.
  clang-14 libclang-rt-14-dev llvm-14
  # Monitoring tests: Prometheus and promtool; Node.js for type-checking the
  # Grafana dashboard (tests/monitoring).
  prometheus nodejs
  # Go stubs (//proto:ferry_v1_go) and the Go example client: Go, the protoc
  # plugins, grpc-go and protobuf-go (APIv2, and the 1.5 APIv1 shim it needs).
  golang-go protoc-gen-go protoc-gen-go-grpc golang-google-grpc-dev
  golang-google-protobuf-dev golang-github-golang-protobuf-1-5-dev
  # Deployment checks (systemd-analyze verify), and rsvg-convert to render the
  # memory pictures `ferry memory --svg` draws.
  systemd librsvg2-bin
)
# A Node.js from elsewhere (NodeSource's nodejs) brings its own npm.
command -v npm >/dev/null 2>&1 || PACKAGES+=(npm)

# The dashboard type check's npm packages (deploy/grafana/check), fetched
# once into this cache; the test installs them from it.
NPM_CACHE="${FERRY_NPM_CACHE:-$HOME/.cache/ferry/npm}"
fill_npm_cache() {
  local check lock stamp tmp
  check="$(cd "$(dirname "$0")/.." && pwd)/deploy/grafana/check"
  lock="$check/package-lock.json"
  [ -f "$lock" ] && command -v npm >/dev/null 2>&1 || return 0
  stamp="$NPM_CACHE/.ferry-$(sha256sum "$lock" | cut -c1-16)"
  [ -e "$stamp" ] && return 0
  tmp="$(mktemp -d)"
  cp "$check/package.json" "$lock" "$tmp/"
  if (cd "$tmp" && npm ci --cache "$NPM_CACHE" --no-audit --no-fund --ignore-scripts >/dev/null 2>&1); then
    touch "$stamp"
    echo "install_deps: npm packages for the dashboard check cached in $NPM_CACHE" >&2
  else
    echo "install_deps: could not fetch the dashboard check's npm packages (registry unreachable?)" >&2
  fi
  rm -rf "$tmp"
}

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  fill_npm_cache
  exit 0
fi

echo "install_deps: installing ${#missing[@]} package(s): ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install_deps: done" >&2
fill_npm_cache
