#!/usr/bin/env bash
# The real-kernel VM tier: boots Linux 7.3 (Debian) under QEMU 10 with two
# NUMA nodes and an igb (82576, SR-IOV) PF on NUMA node 1, the host's / shared
# read-only so the project's shipped binaries (KROCE_BIN_DIR) and Debian's
# tools run inside, and runs e2e/vm/guest.sh there against the real kernel.
# The guest writes its checks and logs into RESULTS_DIR (a read-write share);
# e2e/tests/vm.rs reads them back and asserts. One boot runs every check.
#
#   KROCE_BIN_DIR=target/release ci/vm.sh RESULTS_DIR
#
# KROCE_VM_GUEST_TEST, if set, is the e2e `vm` test binary: the guest runs
# its `guest_whole_node` (node agent, device plugin, CNI on the igb VFs).
#
# Needs root and the peers of ci/vm-peers.sh (run here if KROCE_VM_QEMU is
# not set). KVM is used only where a probe boot proves it works (the
# machines CI runs on have a /dev/kvm that cannot run a normal guest); else
# TCG. KROCE_VM_ACCEL=tcg|kvm overrides the probe.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
results=${1:?usage: ci/vm.sh RESULTS_DIR}
mkdir -p "$results"
results=$(cd "$results" && pwd)
: "${KROCE_BIN_DIR:?KROCE_BIN_DIR must name the shipped (release) binaries}"
bin_dir=$(cd "$KROCE_BIN_DIR" && pwd)
guest_test=
[ -n "${KROCE_VM_GUEST_TEST:-}" ] && guest_test=$(realpath "$KROCE_VM_GUEST_TEST")
export PATH=$PATH:/usr/sbin:/sbin

if [ -z "${KROCE_VM_QEMU:-}" ]; then
  eval "$("$repo/ci/vm-peers.sh" | sed 's/^/export /')"
fi
release=$(basename "$(find "$KROCE_VM_MODULES/lib/modules" -mindepth 1 -maxdepth 1 -type d | head -n 1)")
qemu_base=("$KROCE_VM_QEMU" -L "$KROCE_VM_QEMU_DATA/seabios" -L "$KROCE_VM_QEMU_DATA/qemu"
  -machine q35 -display none -no-reboot -nodefaults -kernel "$KROCE_VM_KERNEL")

work=$(mktemp -d)
# Mount points of the guest's tmpfs (e2e/vm/init) on the read-only share of
# this host's /: a fresh machine without CNI plugins has no /var/lib/cni,
# and kroce-cni in the guest would then meet a read-only state dir.
mkdir -p /var/lib/cni
trap 'rm -rf "$work"' EXIT

# The initramfs: busybox-static, the init, and the 9p modules decompressed
# (busybox insmod reads no .ko.xz); the rest loads from the host's share.
mkdir -p "$work/initrd/bin" "$work/initrd/modules"
cp /bin/busybox "$work/initrd/bin/busybox"
cp "$repo/e2e/vm/init" "$work/initrd/init"
chmod +x "$work/initrd/init"
for m in netfs 9pnet 9pnet_virtio 9p; do
  ko=$(find "$KROCE_VM_MODULES/lib/modules/$release/kernel" -name "$m.ko*" | head -n 1)
  case $ko in
  *.xz) xz -d -c "$ko" >"$work/initrd/modules/$m.ko" ;;
  *.zst) zstd -q -d -c "$ko" >"$work/initrd/modules/$m.ko" ;;
  *) cp "$ko" "$work/initrd/modules/$m.ko" ;;
  esac
done
(cd "$work/initrd" && find . | busybox cpio -o -H newc 2>/dev/null) >"$work/initrd.cpio"

# The modules the guest script loads, and what they need, decompressed once
# into a small tree (the full tree's .ko.xz cost ~40 s of emulated xz at
# every boot); the guest falls back to the full tree for anything else.
fast=$(dirname "$KROCE_VM_MODULES")/modules-fast
if [ ! -f "$fast/.complete" ]; then
  rm -rf "$fast.tmp"
  for m in igb igbvf rdma_rxe ib_uverbs ib_umad rdma_ucm; do
    modprobe -d "$KROCE_VM_MODULES" -S "$release" --show-depends "$m"
  done | awk '$1 == "insmod" { print $2 }' | sort -u | while read -r ko; do
    rel=${ko#"$KROCE_VM_MODULES"/}
    mkdir -p "$fast.tmp/$(dirname "$rel")"
    case $ko in
    *.xz) xz -d -c "$ko" >"$fast.tmp/${rel%.xz}" ;;
    *.zst) zstd -q -d -c "$ko" >"$fast.tmp/${rel%.zst}" ;;
    *) cp "$ko" "$fast.tmp/$rel" ;;
    esac
  done
  cp "$KROCE_VM_MODULES/lib/modules/$release"/modules.{builtin,builtin.modinfo,order} \
    "$fast.tmp/lib/modules/$release/"
  depmod -b "$fast.tmp" "$release"
  rm -rf "$fast" && mv "$fast.tmp" "$fast" && touch "$fast/.complete"
fi

# KVM only if a guest really boots with it (probed once per host boot).
accel=${KROCE_VM_ACCEL:-}
if [ -z "$accel" ]; then
  probe=/run/kroce-vm-kvm-probe
  if [ ! -f "$probe" ]; then
    echo tcg >"$probe"
    if [ -w /dev/kvm ]; then
      (timeout 60 "${qemu_base[@]}" -accel kvm -cpu host -m 256 -smp 1 \
        -append "console=ttyS0 panic=-1" -serial "file:$work/kvm-probe.log" >/dev/null 2>&1) 2>/dev/null || true
      # No initramfs and no root: a kernel that runs reaches its panic.
      grep -q 'Kernel panic' "$work/kvm-probe.log" 2>/dev/null && echo kvm >"$probe"
    fi
  fi
  accel=$(cat "$probe")
fi
cpu=max
[ "$accel" = kvm ] && cpu=host
echo "vm: kernel $release, accel $accel" >&2

rm -rf "$results"/{checks,guest.log,guest.rc,console.log,perftest-client.log,perftest-server.log} \
  "$results"/{after-reboot.log,after-reboot.rc,console-after-reboot.log,reboot}
# Copies: bash reads a script as it runs, and an edit meanwhile breaks it.
cp "$repo/e2e/vm/guest.sh" "$repo/e2e/vm/after-reboot.sh" "$results/"
write_env() { # write_env SCRIPT: what the guest's init runs
  cat >"$results/env" <<ENV
KROCE_VM_SCRIPT=/mnt/results/$1
KROCE_REPO=$repo
KROCE_BIN_DIR=$bin_dir
KROCE_VM_MODULES=$KROCE_VM_MODULES
KROCE_VM_MODULES_FAST=$fast
KROCE_VM_RELEASE=$release
KROCE_VM_ACCEL=$accel
KROCE_VM_GUEST_TEST=${guest_test}
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
ENV
}

boot() { # boot: one boot of the same machine, to power-off
  local start rc=0
  start=$(date +%s)
  # 2 NUMA nodes (CPUs 0-1, 2-3); the igb PF behind a pxb-pcie bridge on
  # NUMA node 1 (on pcie.0 it would read numa_node -1).
  timeout "${KROCE_VM_TIMEOUT:-900}" "${qemu_base[@]}" -accel "$accel" -cpu "$cpu" -m 2048 -smp 4 \
    -object memory-backend-ram,id=m0,size=1G -object memory-backend-ram,id=m1,size=1G \
    -numa node,nodeid=0,cpus=0-1,memdev=m0 -numa node,nodeid=1,cpus=2-3,memdev=m1 \
    -device pxb-pcie,id=pxb1,bus_nr=0x80,numa_node=1,bus=pcie.0 \
    -device pcie-root-port,id=rp1,bus=pxb1,chassis=1,slot=1 \
    -netdev user,id=n1 -device igb,bus=rp1,netdev=n1,romfile= \
    -fsdev local,id=fs0,path=/,security_model=none,readonly=on,multidevs=remap \
    -device virtio-9p-pci,fsdev=fs0,mount_tag=hostroot,bus=pcie.0 \
    -fsdev "local,id=fs1,path=$results,security_model=none,multidevs=remap" \
    -device virtio-9p-pci,fsdev=fs1,mount_tag=results,bus=pcie.0 \
    -initrd "$work/initrd.cpio" \
    -append "console=ttyS0 panic=-1 quiet loglevel=4" \
    -serial "file:$results/console.log" || rc=1
  if [ "$rc" != 0 ]; then
    echo "vm: QEMU failed or timed out; console:" >&2
    tail -n 30 "$results/console.log" >&2 || true
    return 1
  fi
  echo "vm: boot to power-off $(($(date +%s) - start)) s" >&2
  if [ ! -f "$results/guest.rc" ]; then
    echo "vm: the guest script never finished; console:" >&2
    tail -n 30 "$results/console.log" >&2 || true
    return 1
  fi
}

write_env guest.sh
boot
rc=$(cat "$results/guest.rc")
# The node agent asked the host to reboot (guest.sh (f)): the same machine
# boots again (QEMU runs with -no-reboot; the results share keeps the
# agent's state and modprobe.d) into after-reboot.sh. Its logs go beside the
# first boot's.
if [ -s "$results/reboot/asked" ]; then
  for f in guest.log guest.rc console.log; do mv "$results/$f" "$results/first-$f"; done
  write_env after-reboot.sh
  boot || echo "vm: the second boot failed: e2e/tests/vm.rs reports the missing checks" >&2
  mv "$results/guest.log" "$results/after-reboot.log" 2>/dev/null || true
  mv "$results/guest.rc" "$results/after-reboot.rc" 2>/dev/null || true
  mv "$results/console.log" "$results/console-after-reboot.log" 2>/dev/null || true
  for f in guest.log guest.rc console.log; do mv "$results/first-$f" "$results/$f" || true; done
fi
exit "$rc"
