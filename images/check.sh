#!/usr/bin/env bash
# CI image check with podman and no image registry: a Debian base made by
# debootstrap, the three images built from it, then each image's binaries run
# inside its own root filesystem (podman image mount + chroot): `--version`
# must answer. `podman run` is not used: without CAP_SYS_RESOURCE, crun cannot
# set the rlimits podman asks for on this machine.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tag=ci
base=localhost/kroce-base:bookworm
# Leaves podman's storage as it found it (a gigabyte of layers otherwise
# sits on a CI disk through the test run): removes the images it built, and
# the base if it made it. KROCE_KEEP_IMAGES=1 keeps them for a look.
made=("kroce-operator:$tag" "kroce-node:$tag" "kroce-perftest:$tag")
podman image exists "$base" || made+=("$base")
# shellcheck disable=SC2317 # run by the trap
cleanup() {
  [ "${KROCE_KEEP_IMAGES:-0}" = 1 ] && return 0
  podman rmi -f "${made[@]}" >/dev/null 2>&1 || true
}
trap cleanup EXIT
"$here/make-base.sh" "$base"
BASE=$base PROFILE=${PROFILE:-debug} SKIP_CARGO=${SKIP_CARGO:-1} \
  "$here/build.sh" "$tag"

fail=0
run_in() { # image cmd...
  local img=$1
  shift
  local mnt
  mnt=$(podman image mount "$img")
  if out=$(chroot "$mnt" "$@" 2>&1); then
    echo "ok   $img: $* -> $(echo "$out" | head -n 1)"
  else
    echo "FAIL $img: $* -> $out" >&2
    fail=1
  fi
  podman image unmount "$img" >/dev/null
}
run_in "kroce-operator:$tag" /usr/local/bin/kroce-controller --version
for b in kroce-node-agent kroce-device-plugin kroce-nri kroce-cni; do
  [ "$b" = kroce-cni ] && continue
  run_in "kroce-node:$tag" "/usr/local/bin/$b" --version
done
# A CNI plugin answers VERSION from its environment, not --version.
run_in "kroce-node:$tag" /usr/bin/env CNI_COMMAND=VERSION /usr/local/bin/kroce-cni
# perftest prints its version but exits 1 for --version.
run_in "kroce-perftest:$tag" /bin/sh -c "ib_write_bw --version | grep -q Version && command -v ib_read_lat"
run_in "kroce-perftest:$tag" /bin/sh -n /usr/local/bin/kroce-gid-index
run_in "kroce-perftest:$tag" /usr/local/bin/kroce-perftest-run --version
run_in "kroce-node:$tag" /usr/sbin/ethtool --version
exit "$fail"
