#!/usr/bin/env bash
# Makes a local Debian base image without pulling from any image registry:
# debootstrap from Debian's package archive, then import into podman.
#   images/make-base.sh [NAME]   (default localhost/kroce-base:bookworm)
set -euo pipefail
name=${1:-localhost/kroce-base:bookworm}
if podman image exists "$name"; then
  exit 0
fi
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase bookworm "$root" >/dev/null
tar -C "$root" -c . | podman import - "$name"
