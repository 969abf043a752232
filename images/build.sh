#!/usr/bin/env bash
# Builds kroce's three images with podman/buildah or docker.
#   images/build.sh [TAG]
# Env: PROFILE=release|debug (which cargo build to package, default release),
#      BASE=<image> (default debian:bookworm-slim; with no registry, make one
#      with images/make-base.sh and pass BASE=localhost/kroce-base:bookworm),
#      ENGINE=podman|docker (default: podman if present).
set -euo pipefail
tag=${1:-dev}
profile=${PROFILE:-release}
base=${BASE:-debian:bookworm-slim}
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
engine=${ENGINE:-$(command -v podman >/dev/null && echo podman || echo docker)}
target=${CARGO_TARGET_DIR:-$repo/target}

if [ "${SKIP_CARGO:-0}" != 1 ]; then
  flag=()
  [ "$profile" = release ] && flag=(--release)
  (cd "$repo" && cargo build "${flag[@]}" -p kroce-controller -p kroce-node-agent -p kroce-device-plugin -p kroce-nri -p kroce-cni -p kroce-admission --bins)
fi
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
mkdir -p "$ctx/bin" "$ctx/perftest"
for b in kroce-controller kroce-node-agent kroce-device-plugin kroce-nri kroce-cni kroce-perftest-run; do
  cp "$target/$profile/$b" "$ctx/bin/"
done
cp "$here/perftest/kroce-gid-index" "$ctx/perftest/"
for img in operator node perftest; do
  # podman's chroot isolation runs RUN steps without an OCI runtime, which
  # also works where crun may not set rlimits (no CAP_SYS_RESOURCE).
  # podman: never pull (the base is local); docker pulls BASE as usual.
  extra=()
  [ "$engine" = podman ] && extra=(--isolation "${ISOLATION:-chroot}" --pull=never)
  "$engine" build "${extra[@]}" --build-arg "BASE=$base" -t "kroce-$img:$tag" -f "$here/$img/Containerfile" "$ctx"
done
