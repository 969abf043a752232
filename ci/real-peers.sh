#!/usr/bin/env bash
# Fetches the real peers the tests run against and that Debian bookworm does
# not have, at pinned versions, from Debian unstable through a private apt
# configuration (its own sources list, lists and cache: nothing from
# unstable is installed system-wide), unpacked with dpkg -x into a cache
# directory keyed by version, so a second run downloads nothing.
#
#   ci/real-peers.sh [CACHE_DIR]     (default: /var/cache/kroce-peers)
#
# Prints the environment the tests read, e.g.
#   KROCE_CONTAINERD_BIN=/var/cache/kroce-peers/containerd-2.1.9+ds1-5/usr/bin
set -euo pipefail

CONTAINERD_VERSION=2.1.9+ds1-5

cache=${1:-${KROCE_PEERS_DIR:-/var/cache/kroce-peers}}
mkdir -p "$cache"
cache=$(cd "$cache" && pwd)

apt_dir=$cache/apt-unstable
apt_opts=(
  -o "Dir::Etc::sourcelist=$apt_dir/sources.list"
  -o "Dir::Etc::sourceparts=$apt_dir/sources.list.d"
  -o "Dir::State::Lists=$apt_dir/lists"
  -o "Dir::Cache=$apt_dir/cache"
  -o "Dir::State::status=$apt_dir/status"
  -o "APT::Sandbox::User=root"
)

apt_ready=0
apt_unstable() {
  if [ "$apt_ready" = 0 ]; then
    mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$apt_dir/sources.list.d"
    : > "$apt_dir/status"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian unstable main" \
      > "$apt_dir/sources.list"
    apt-get "${apt_opts[@]}" update -qq >&2
    apt_ready=1
  fi
  apt-get "${apt_opts[@]}" "$@"
}

# unpack PACKAGE VERSION DEST: downloads the exact version and dpkg -x's it.
unpack() {
  local pkg=$1 version=$2 dest=$3
  [ -f "$dest/.complete" ] && return 0
  rm -rf "$dest.tmp" && mkdir -p "$dest.tmp/debs"
  (cd "$dest.tmp/debs" && apt_unstable download -qq "$pkg=$version" >&2)
  dpkg -x "$dest.tmp/debs/"*.deb "$dest.tmp"
  rm -rf "$dest.tmp/debs" "$dest"
  mv "$dest.tmp" "$dest"
  touch "$dest/.complete"
}

unpack containerd "$CONTAINERD_VERSION" "$cache/containerd-$CONTAINERD_VERSION"
"$cache/containerd-$CONTAINERD_VERSION/usr/bin/containerd" --version >&2

echo "KROCE_CONTAINERD_BIN=$cache/containerd-$CONTAINERD_VERSION/usr/bin"
