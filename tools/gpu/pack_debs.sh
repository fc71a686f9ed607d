#!/usr/bin/env bash
# Downloads, on a Debian 12 machine, the Debian packages tools/gpu/CMakeLists.txt
# needs beyond what a GPU machine with PyTorch, CMake, ninja and a C++
# compiler has: Abseil, protobuf with protoc, yaml-cpp, PCRE2, nlohmann/json,
# zlib's headers, GoogleTest and SentencePiece (headers and libraries). On
# the GPU machine, tools/gpu/unpack_debs.sh unpacks them into a prefix for
# FERRY_DEPS_PREFIX. Prints their total size, which must stay well under what
# one transfer carries (64 MiB).
#
#   tools/gpu/pack_debs.sh [OUTDIR]        OUTDIR default: tools/gpu/debs/
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
OUT="${1:-$ROOT/tools/gpu/debs}"
LIMIT_MIB=60

PACKAGES=(
  # Abseil 20220623, as //third_party:absl links it.
  libabsl-dev libabsl20220623
  # protobuf 3.21 and protoc (messages only, no gRPC).
  libprotobuf-dev libprotobuf32 protobuf-compiler libprotoc32
  libyaml-cpp-dev libyaml-cpp0.7
  # PCRE2's 8-bit library (GPT-2's pre-tokenisation pattern).
  libpcre2-dev libpcre2-8-0
  # utf8proc (Unicode normalisation of Hugging Face tokenizers).
  libutf8proc-dev libutf8proc2
  nlohmann-json3-dev
  # zlib's headers and link name; the runtime too, which libz.so points at.
  zlib1g-dev zlib1g
  # GoogleTest and GoogleMock: headers and static libraries.
  libgtest-dev libgmock-dev
  # SentencePiece, for libferry_sentencepiece.so (optional in the build).
  libsentencepiece-dev libsentencepiece0
)

if ! apt-cache show --no-all-versions "${PACKAGES[0]}" >/dev/null 2>&1; then
  apt-get update -qq
fi
rm -rf "$OUT"
mkdir -p "$OUT"
# As root, download as root: apt's sandbox user may not write to OUTDIR.
sandbox=()
[ "$(id -u)" = 0 ] && sandbox=(-o APT::Sandbox::User=root)
(cd "$OUT" && apt-get download -qq "${sandbox[@]}" "${PACKAGES[@]}")
bytes=$(cat "$OUT"/*.deb | wc -c)
mib=$(( (bytes + 1048575) / 1048576 ))
echo "pack_debs: $(ls "$OUT"/*.deb | wc -l) packages, $bytes bytes ($mib MiB) in $OUT"
if [ "$mib" -gt "$LIMIT_MIB" ]; then
  echo "pack_debs: more than $LIMIT_MIB MiB: too much to carry with the rest" >&2
  exit 1
fi
