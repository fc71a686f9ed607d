#!/usr/bin/env bash
# Prepares, on this Debian 12 machine, what tools/gpu/check.sh needs on a GPU
# machine that has PyTorch (CUDA), CMake and ninja but no Bazel, gRPC,
# Abseil or internet, in tools/gpu/carry/ (ignored by git; carry it there):
#   debs/     the Debian packages the CMake build needs (tools/gpu/pack_debs.sh),
#   daemon/   ferryd and the ferry CLI built here, with the shared libraries
#             they need that a bare machine may lack (daemon/lib).
# Prints the total size: it must stay under what a transfer carries (64 MiB).
set -euo pipefail
cd "$(dirname "$0")/../.."
CARRY=tools/gpu/carry
rm -rf "$CARRY"
mkdir -p "$CARRY/daemon/lib"
tools/gpu/pack_debs.sh "$CARRY/debs"
bazel build //server:ferryd //client:ferry >/dev/null
cp bazel-bin/server/ferryd bazel-bin/client/ferry "$CARRY/daemon/"
chmod u+w "$CARRY/daemon/"*
# Everything they link but the C and C++ runtimes, which any Linux with a
# glibc as new as Debian 12's (2.36) has.
for bin in "$CARRY/daemon/ferryd" "$CARRY/daemon/ferry"; do
  ldd "$bin" | awk '/=> \//{print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libstdc++.so*|libgcc_s.so*) ;;
      *) cp -Ln "$lib" "$CARRY/daemon/lib/" ;;
    esac
  done
done
du -sh "$CARRY"/* "$CARRY"
