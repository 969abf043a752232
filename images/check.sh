#!/usr/bin/env bash
# CI image check with podman and no image registry: a Debian base made by
# debootstrap, the three images built from it, then each image's binaries run
# inside its own root filesystem (podman image mount + chroot): `--version`
# must answer. `podman run` is not used: without CAP_SYS_RESOURCE, crun cannot
# set the rlimits podman asks for on this machine.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tag=ci
"$here/make-base.sh" localhost/kroce-base:bookworm
BASE=localhost/kroce-base:bookworm PROFILE=${PROFILE:-debug} SKIP_CARGO=${SKIP_CARGO:-1} \
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
