#!/usr/bin/env bash
# Fetches what the real-kernel VM tier (ci/vm.sh) boots, into the peers
# cache, through private apt configurations (ci/debian-apt.sh), unpacked
# with dpkg -x, never installed:
#   - QEMU 10 (bookworm-backports: bookworm's own 7.2 has no igb device),
#     its data files and SeaBIOS; the shared libraries it links that
#     bookworm itself provides are installed with apt (bookworm packages);
#   - the kernel: Debian trixie-backports' linux-binary/-modules/-base at the
#     pinned ABI; backports drop superseded kernels, so a pin that is gone
#     falls back to what linux-image-amd64 depends on today (warned).
# The uncompressed vmlinux (PVH entry; QEMU boots it directly) is cut out of
# vmlinuz at the zstd magic, and depmod -b indexes the modules.
#
#   ci/vm-peers.sh [CACHE_DIR]      (default: /var/cache/kroce-peers)
#
# Prints KROCE_VM_QEMU (the qemu-system-x86_64 binary), KROCE_VM_QEMU_DATA
# (for -L), KROCE_VM_KERNEL (vmlinux) and KROCE_VM_MODULES (the tree for
# modprobe -d / depmod -b).
set -euo pipefail
export PATH=$PATH:/usr/sbin:/sbin

QEMU_VERSION=1:10.0.2+ds-2+deb13u1~bpo12+1
SEABIOS_VERSION=1.16.3-2~bpo12+1
KERNEL_ABI=7.3.4+deb13
KERNEL_VERSION=7.3.4-1~bpo13+1

cache=${1:-${KROCE_PEERS_DIR:-/var/cache/kroce-peers}}
mkdir -p "$cache"
cache=$(cd "$cache" && pwd)
# shellcheck source=ci/debian-apt.sh
. "$(dirname "$0")/debian-apt.sh"

qemu_apt=$cache/apt-bookworm-backports
fetch_unpack "$qemu_apt" bookworm-backports "$cache/qemu" \
  "qemu-system-x86=$QEMU_VERSION" "qemu-system-data=$QEMU_VERSION" "seabios=$SEABIOS_VERSION"
qemu_dir=$fetched
qemu=$qemu_dir/usr/bin/qemu-system-x86_64
# Its libraries: bookworm packages (qemu-system-x86's Depends minus the QEMU
# and firmware packages unpacked above), installed only where missing.
if ldd "$qemu" | grep -q 'not found'; then
  apt_init "$qemu_apt" bookworm-backports
  mapfile -t libs < <(apt_cache_private "$qemu_apt" show "qemu-system-x86=${qemu_dir#"$cache/qemu-"}" |
    awk '/^Depends:/ { sub(/^Depends: /, ""); n = split($0, d, /, /); for (i = 1; i <= n; i++) { split(d[i], a, / /); print a[1] } exit }' |
    grep -v -e '^qemu-' -e '^seabios' -e '^ipxe')
  missing=()
  for p in "${libs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >&2
  fi
fi
"$qemu" --version | head -n 1 >&2

kernel_apt=$cache/apt-trixie-backports
kernel_pkgs() {
  echo "linux-binary-$1-amd64=$2" "linux-modules-$1-amd64=$2" "linux-base-$1-amd64=$2"
}
# shellcheck disable=SC2046 # one word per package
if ! fetch_unpack "$kernel_apt" trixie-backports "$cache/linux" $(kernel_pkgs "$KERNEL_ABI" "$KERNEL_VERSION") 2>/dev/null; then
  # The ABI is in the package names: ask the meta-package what it is today.
  apt_init "$kernel_apt" trixie-backports
  image=$(apt_cache_private "$kernel_apt" show linux-image-amd64 |
    awk '/^Depends:/ { if (match($0, /linux-image-[^ ,]+-amd64 \(= [^)]+\)/)) print substr($0, RSTART, RLENGTH); exit }')
  now_abi=$(sed -E 's/^linux-image-(.*)-amd64 .*/\1/' <<<"$image")
  now_version=$(sed -E 's/.*\(= ([^)]+)\)/\1/' <<<"$image")
  if [ -z "$now_abi" ] || [ -z "$now_version" ]; then
    echo "vm-peers: no kernel in Debian trixie-backports (linux-image-amd64 depends on '$image')" >&2
    exit 1
  fi
  echo "vm-peers: WARNING: kernel $KERNEL_ABI ($KERNEL_VERSION, pinned) is no longer in Debian trixie-backports; using $now_abi ($now_version) (move the pin)" >&2
  # shellcheck disable=SC2046
  fetch_unpack "$kernel_apt" trixie-backports "$cache/linux" $(kernel_pkgs "$now_abi" "$now_version")
fi
kernel_dir=$fetched
modules=$kernel_dir/usr
release=$(basename "$(find "$modules/lib/modules" -mindepth 1 -maxdepth 1 -type d | head -n 1)")
vmlinux=$kernel_dir/vmlinux
if [ ! -s "$vmlinux" ]; then
  # vmlinuz is a bzImage whose payload is a zstd frame holding the ELF
  # vmlinux: cut at the frame's magic and decompress; zstd complains about
  # the bytes after the frame, having written the whole vmlinux.
  python3 - "$modules/lib/modules/$release/vmlinuz" "$vmlinux.zst" <<'PY'
import sys
data = open(sys.argv[1], "rb").read()
at = data.find(b"\x28\xb5\x2f\xfd")
if at < 0:
    sys.exit(f"no zstd frame in {sys.argv[1]}")
open(sys.argv[2], "wb").write(data[at:])
PY
  zstd -q -d -c "$vmlinux.zst" >"$vmlinux.tmp" 2>/dev/null || [ -s "$vmlinux.tmp" ]
  rm -f "$vmlinux.zst"
  mv "$vmlinux.tmp" "$vmlinux"
fi
[ -f "$modules/lib/modules/$release/modules.dep" ] || depmod -b "$modules" "$release"

echo "KROCE_VM_QEMU=$qemu"
echo "KROCE_VM_QEMU_DATA=$qemu_dir/usr/share"
echo "KROCE_VM_KERNEL=$vmlinux"
echo "KROCE_VM_MODULES=$modules"
