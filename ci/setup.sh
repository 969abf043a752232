#!/usr/bin/env bash
# Installs what the test suite needs and is missing, on a fresh Debian 12
# machine (as root), then prints the environment the tests read. Idempotent
# and quick when everything is there. Called by ci/test.sh; `.ci/run` only
# refreshes apt's lists first.
#
#   eval "$(ci/setup.sh)"
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
export DEBIAN_FRONTEND=noninteractive

# containernetworking-plugins: host-local IPAM and host-device (the CNI's
#   real peers); iproute2: netns tests; shellcheck: scripts;
# podman + debootstrap: image build check; ibverbs-utils + ibverbs-providers
#   + pciutils: real tools that must read our fixture hosts; runc +
#   busybox-static: the real container runtime's OCI runtime and test image;
#   prometheus (2.42): promtool checks and unit-tests the chart's alert rules.
# kmod + perftest (+ busybox-static): the real-kernel VM tier (depmod for the
#   guest kernel's modules, ib_write_bw/ib_send_lat run inside the guest).
packages=(containernetworking-plugins iproute2 procps util-linux mount
  shellcheck debootstrap ibverbs-utils ibverbs-providers pciutils
  runc busybox-static prometheus
  kmod perftest zstd xz-utils)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  # Stale or empty package lists: refresh once and try again.
  apt-get install -y --no-install-recommends "${missing[@]}" >&2 ||
    { apt-get update >&2 && apt-get install -y --no-install-recommends "${missing[@]}" >&2; }
fi
# podman with its recommends (storage and build helpers), as tested.
command -v podman >/dev/null || apt-get install -y podman >&2

python3 -c 'import kubernetes_validate' 2>/dev/null ||
  python3 -m pip install --quiet kubernetes-validate==1.37.0 >&2
# cel-python: evaluates the chart's ValidatingAdmissionPolicy CEL (ci/check-chart.sh).
python3 -c 'import celpy' 2>/dev/null ||
  python3 -m pip install --quiet cel-python==0.5.0 >&2
python3 "$repo/ci/install-helm.py" "$repo/.tools/bin" >&2

# containerd 2.1.9 (Debian unstable, unpacked into a cache, not installed).
"$repo/ci/real-peers.sh" | sed 's/^/export /'
# QEMU 10 and a Linux 7.3 kernel for the real-kernel VM tier (ci/vm.sh).
"$repo/ci/vm-peers.sh" | sed 's/^/export /'
