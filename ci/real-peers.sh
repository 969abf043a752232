#!/usr/bin/env bash
# Fetches the real peers the tests run against and that Debian bookworm does
# not have, at pinned versions, from Debian unstable through a private apt
# configuration (ci/debian-apt.sh: its own sources list, lists and cache;
# nothing from unstable is installed system-wide; the mirror is the
# machine's own), unpacked with dpkg -x into a cache directory keyed by
# version, so a second run downloads nothing. A pinned version Debian has
# dropped falls back to the current one, with a warning naming both.
#
#   ci/real-peers.sh [CACHE_DIR]     (default: /var/cache/kroce-peers)
#
# Prints the environment the tests read, e.g.
#   KROCE_CONTAINERD_BIN=/var/cache/kroce-peers/containerd-2.1.9+ds1-5/usr/bin
set -euo pipefail

CONTAINERD_VERSION=2.1.9+ds1-5
GO_VERSION=1.27.3-1
LIBCNI_VERSION=1.3.0-2
GRPC_VERSION=1.81.1-1
ETCD_VERSION=3.5.30-2
# The apiextensions-apiserver's sources: this package plus the pinned
# golang-*-dev closure in ci/apiextensions-packages.txt.
APIEXTENSIONS_VERSION=0.36.4-1

cache=${1:-${KROCE_PEERS_DIR:-/var/cache/kroce-peers}}
mkdir -p "$cache"
cache=$(cd "$cache" && pwd)

# shellcheck source=ci/debian-apt.sh
. "$(dirname "$0")/debian-apt.sh"
apt_dir=$cache/apt-unstable

fetch_unpack "$apt_dir" unstable "$cache/containerd" "containerd=$CONTAINERD_VERSION"
containerd_dir=$fetched
"$containerd_dir/usr/bin/containerd" --version >&2

# Go (runs on bookworm's glibc) and libcni's source, for the test tree's
# small Go drivers, built in GOPATH mode (no module proxy here).
fetch_unpack "$apt_dir" unstable "$cache/go" "golang-1.27-go=$GO_VERSION" "golang-1.27-src=$GO_VERSION"
go_dir=$fetched
fetch_unpack "$apt_dir" unstable "$cache/libcni" "golang-github-appc-cni-dev=$LIBCNI_VERSION"
libcni_dir=$fetched
# grpc-go, the kubelet's gRPC library: dra/tests/kubelet_grpc.rs dials the
# plugins' sockets with it exactly as the kubelet does (the socket path as
# the target, so its :authority is the percent-encoded path).
fetch_unpack "$apt_dir" unstable "$cache/grpc-go" "golang-google-grpc-dev=$GRPC_VERSION" \
  golang-google-protobuf-dev=1.36.10-2 golang-google-genproto-dev=0.0~git20260414.afd174a-2 \
  golang-golang-x-net-dev=1:0.62.0-1 golang-golang-x-sys-dev=0.49.0+dfsg-1 \
  golang-golang-x-text-dev=0.43.0-1 golang-github-golang-protobuf-1-5-dev=1.5.4-2
grpc_dir=$fetched

# etcd and k8s.io/apiextensions-apiserver, the real CRD server the
# operator's API code is tested against (operator/tests/real_crd_server.rs).
fetch_unpack "$apt_dir" unstable "$cache/etcd" "etcd-server=$ETCD_VERSION"
etcd_dir=$fetched
"$etcd_dir/usr/bin/etcd" --version >&2

# Keyed by version and by the pinned package list, so editing the list
# rebuilds. GOPATH mode (no module proxy here); nojsonv2: Go 1.27's default
# jsonv2 makes Kubernetes-era servers serve broken OpenAPI documents.
repo=$(cd "$(dirname "$0")/.." && pwd)
ae_list=$repo/ci/apiextensions-packages.txt
ae_key=$APIEXTENSIONS_VERSION-$(grep -v '^#' "$ae_list" | sha256sum | cut -c1-12)
ae_src=$cache/apiextensions-src-$ae_key
ae_bin=$cache/apiextensions-apiserver-$ae_key/apiextensions-apiserver
if [ ! -x "$ae_bin" ]; then
  mapfile -t ae_pkgs < <(grep -v '^#' "$ae_list" | grep .)
  start=$(date +%s)
  # Unstable moves on; on a machine without the cached binary, a pin that is
  # gone falls back to the current versions of the same packages (warned).
  # (resolve_pins warns for each pin that moved, naming both versions.)
  unpack_into "$apt_dir" unstable "$ae_src" "${ae_pkgs[@]}" || {
    echo "real-peers: WARNING: pinned apiextensions sources unavailable; using Debian unstable's current versions (regenerate ci/apiextensions-packages.txt)" >&2
    mapfile -t ae_now < <(resolve_pins "$apt_dir" unstable "${ae_pkgs[@]}")
    unpack_into "$apt_dir" unstable "$ae_src" "${ae_now[@]}"
  }
  # A build reads neither tests nor their data: 0.5 of the 2 GB.
  find "$ae_src" -name '*_test.go' -delete
  find "$ae_src" -depth -type d -name testdata -exec rm -rf {} +
  echo "apiextensions-apiserver sources: $(($(date +%s) - start)) s" >&2
  start=$(date +%s)
  # No DWARF: halves the build cache (2.3 -> 1.2 GB) on a disk CI shares.
  gocache=$(mktemp -d)
  mkdir -p "$(dirname "$ae_bin")"
  # nice: CI machines are shared with other builds.
  (cd "$ae_src" &&
    env GOROOT="$go_dir/usr/lib/go-1.27" GO111MODULE=off \
      GOPATH="$ae_src/usr/share/gocode" GOFLAGS= GOEXPERIMENT=nojsonv2 \
      GOTOOLCHAIN=local GOPROXY=off GOCACHE="$gocache" \
      nice "$go_dir/usr/lib/go-1.27/bin/go" build \
      -gcflags=all=-dwarf=false -ldflags=-w \
      -o "$ae_bin.tmp" k8s.io/apiextensions-apiserver >&2)
  rm -rf "$gocache"
  mv "$ae_bin.tmp" "$ae_bin"
  echo "apiextensions-apiserver build: $(($(date +%s) - start)) s" >&2
  # 2 GB of sources, needed again only if the binary goes (then fetched
  # again, under a minute): the cache keeps the 110 MB binary alone.
  rm -rf "$ae_src"
fi

echo "KROCE_CONTAINERD_BIN=$containerd_dir/usr/bin"
echo "KROCE_GOROOT=$go_dir/usr/lib/go-1.27"
echo "KROCE_LIBCNI_GOPATH=$libcni_dir/usr/share/gocode"
echo "KROCE_GRPC_GOPATH=$grpc_dir/usr/share/gocode"
echo "KROCE_ETCD=$etcd_dir/usr/bin/etcd"
echo "KROCE_APIEXTENSIONS=$ae_bin"
