#!/usr/bin/env bash
# Unpacks the .deb files in DEBDIR (tools/gpu/pack_debs.sh) into PREFIX with
# dpkg -x, for tools/gpu/build.sh's FERRY_DEPS_PREFIX=PREFIX. Links that point
# at absolute paths (libz.so -> /lib/...) are made to point inside PREFIX.
#
#   tools/gpu/unpack_debs.sh DEBDIR PREFIX
set -euo pipefail
if [ $# -ne 2 ]; then
  echo "usage: $0 DEBDIR PREFIX" >&2
  exit 2
fi
DEBDIR="$1"
mkdir -p "$2"
PREFIX="$(cd "$2" && pwd)"
shopt -s nullglob
debs=("$DEBDIR"/*.deb)
if [ ${#debs[@]} -eq 0 ]; then
  echo "unpack_debs: no .deb files in $DEBDIR" >&2
  exit 1
fi
for deb in "${debs[@]}"; do
  dpkg -x "$deb" "$PREFIX"
done
find "$PREFIX" -type l | while read -r link; do
  target="$(readlink "$link")"
  case "$target" in
    /*) if [ -e "$PREFIX$target" ]; then ln -sfn "$PREFIX$target" "$link"; fi ;;
  esac
done
echo "unpack_debs: ${#debs[@]} packages into $PREFIX"
