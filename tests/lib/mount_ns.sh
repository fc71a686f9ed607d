# in_private_mounts SELF: runs the test script SELF again inside a private
# mount namespace, where it may mount small tmpfs file systems without
# touching the machine's: `unshare --mount` as root, else `unshare --user
# --map-root-user --mount`. Inside, FERRY_PRIVATE_MOUNTS names the command
# used and this returns at once. Where neither is allowed the test says why
# and exits 0 (skipped).
in_private_mounts() {
  local self="$1"
  [ -n "${FERRY_PRIVATE_MOUNTS:-}" ] && return 0
  probe() { "$@" /bin/sh -c 'd="$(mktemp -d)"; mount -t tmpfs -o size=1m tmpfs "$d" && umount "$d"; rmdir "$d"' 2>&1; }
  local why="" out ns
  for ns in "unshare --mount" "unshare --user --map-root-user --mount"; do
    # shellcheck disable=SC2086
    if out="$(probe $ns)"; then
      # shellcheck disable=SC2086
      exec env FERRY_PRIVATE_MOUNTS="$ns" $ns /bin/bash "$self"
    fi
    why="$why; $ns: ${out:-failed}"
  done
  echo "SKIP: cannot mount a small tmpfs here (needs a mount namespace)${why}"
  exit 0
}
