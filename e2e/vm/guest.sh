#!/bin/bash
# shellcheck disable=SC2012 # sysfs names are plain
# Runs inside the VM (ci/vm.sh), chrooted into the host's / (read-only; /tmp,
# /run, /var/lib/cni are the guest's tmpfs), against the real Linux 7.3
# kernel, an emulated igb (82576) PF on NUMA node 1 and its real VFs. Runs
# the shipped binaries in KROCE_BIN_DIR. Every check appends one line to
# /mnt/results/checks: "<PASS|FAIL|KNOWN> <name> <detail>" (KNOWN: a known
# open defect, reported, not failed); e2e/tests/vm.rs reads them.
set -u
out=/mnt/results
bin=$KROCE_BIN_DIR
export KROCE_STATE_DIR=/var/lib/cni/kroce
state=$KROCE_STATE_DIR

check() { # check NAME CONDITION-RC DETAIL...
  local name=$1 rc=$2
  shift 2
  if [ "$rc" = 0 ]; then echo "PASS $name $*"; else echo "FAIL $name $*"; fi | tee -a "$out/checks"
}
section() { printf "\n===== %s (at %s s)\n" "$*" "$SECONDS"; }

section "kernel $(uname -r), accel ${KROCE_VM_ACCEL:-?}"
# No /lib/modules for this kernel on the host's /: load from the unpacked
# tree, also for the kernel's own on-demand loads (rxe needs crc32).
printf '#!/bin/sh\nexec /sbin/modprobe -d %s "$@"\n' "$KROCE_VM_MODULES" >/tmp/modprobe
chmod +x /tmp/modprobe
echo /tmp/modprobe >/proc/sys/kernel/modprobe
for m in igb igbvf rdma_rxe; do /tmp/modprobe "$m" || echo "modprobe $m failed"; done
ip link set lo up

pf_pci=
for d in /sys/bus/pci/devices/*; do
  [ -f "$d/sriov_totalvfs" ] && pf_pci=$(basename "$d") && break
done
for _ in $(seq 50); do
  [ -n "$pf_pci" ] && [ -d "/sys/bus/pci/devices/$pf_pci/net" ] && break
  sleep 0.2
done
pf=$(ls "/sys/bus/pci/devices/$pf_pci/net" 2>/dev/null | head -n 1)
check igb-pf "$([ -n "$pf" ] && echo 0 || echo 1)" "PF $pf_pci netdev ${pf:-none} numa_node $(cat "/sys/bus/pci/devices/$pf_pci/numa_node" 2>/dev/null) totalvfs $(cat "/sys/bus/pci/devices/$pf_pci/sriov_totalvfs" 2>/dev/null)"
[ -n "$pf" ] || exit 1
ip link set "$pf" up

# VFs: through the node agent when it can (item a), else sriov_numvfs.
section "VFs"
echo 2 >"/sys/bus/pci/devices/$pf_pci/sriov_numvfs"
sleep 1
vf_pci() { basename "$(readlink -f "/sys/bus/pci/devices/$pf_pci/virtfn$1")"; }
vf_netdev() { ls "/sys/bus/pci/devices/$(vf_pci "$1")/net" 2>/dev/null | head -n 1; }
for _ in $(seq 50); do [ -n "$(vf_netdev 1)" ] && break; sleep 0.2; done
vf0=$(vf_pci 0) vf1=$(vf_pci 1)
check vfs-created "$([ -n "$(vf_netdev 0)" ] && [ -n "$(vf_netdev 1)" ] && echo 0 || echo 1)" \
  "VF0 $vf0 $(vf_netdev 0), VF1 $vf1 $(vf_netdev 1), driver $(basename "$(readlink "/sys/bus/pci/devices/$vf0/driver")")"

# The PF-side state of VF N as ip reports it, and the VF netdev's own MAC.
pf_vf_state() { ip -j -d link show "$pf" | python3 -c '
import json, sys
vf = [v for v in json.load(sys.stdin)[0].get("vfinfo_list", []) if v.get("vf") == int(sys.argv[1])][0]
for k in ("vf", "address", "vlan_list", "rate", "spoofchk", "trust", "link_state", "tx_rate"):
    if k in vf: print(k, json.dumps(vf[k], sort_keys=True))' "$1"; }
vf_own_mac() { cat "/sys/bus/pci/devices/$(vf_pci "$1")/net/"*/address 2>/dev/null; }
claims() { ls "$state/vf" 2>/dev/null | tr '\n' ' '; }
snapshot() { # everything a clean release must leave as it was
  echo "pf-side:"; pf_vf_state "$1"
  echo "vf netdev: $(vf_netdev "$1") mac $(vf_own_mac "$1") mtu $(cat /sys/bus/pci/devices/"$(vf_pci "$1")"/net/*/mtu 2>/dev/null)"
  echo "claims: $(claims)"
}

cni() { # cni COMMAND CONTAINER NETNS IFNAME CONFIG: prints the answer, returns the exit code
  printf '%s' "$5" | env CNI_COMMAND="$1" CNI_CONTAINERID="$2" CNI_NETNS="/run/netns/$3" \
    CNI_IFNAME="$4" CNI_PATH=/usr/lib/cni "$bin/kroce-cni"
}
net_config() { # net_config VF-PCI EXTRA-JSON-MEMBERS
  cat <<JSON
{"cniVersion": "1.0.0", "name": "vm-net", "type": "kroce-cni", "deviceID": "$1", $2
 "ipam": {"type": "host-local", "dataDir": "/tmp/host-local", "ranges": [[{"subnet": "10.56.0.0/24"}]]}}
JSON
}

section "(c) CNI ADD/DEL on a real igb VF, PF-side settings"
ip netns add pod-a
before=$(snapshot 0)
echo "$before"
cfg=$(net_config "$vf0" '"vlan": 100, "vlanQoS": 3, "mac": "0a:55:c2:28:c8:90", "mtu": 1400, "spoofchk": "off", "trust": "on", "max_tx_rate": 100, "rdma": false,')
res=$(cni ADD c-a pod-a net1 "$cfg"); rc=$?
echo "$res"
check cni-add "$rc" "ADD exit $rc"
in_pod=$(ip netns exec pod-a ip -j addr show net1 2>/dev/null)
echo "$in_pod"
ok=$(python3 -c '
import json, sys
l = json.loads(sys.argv[1])[0]
a = [i["local"] for i in l.get("addr_info", []) if i["family"] == "inet"]
print(0 if l["mtu"] == 1400 and l["address"] == "0a:55:c2:28:c8:90" and a and a[0].startswith("10.56.0.") and "UP" in l["flags"] else 1)' "${in_pod:-[{}]}" 2>/dev/null || echo 1)
check cni-add-in-pod "$ok" "net1 in the pod: MTU 1400, MAC, IP from host-local, up"
during=$(pf_vf_state 0)
echo "$during"
ok=$(python3 -c '
import sys
s = sys.argv[1]
want = ["\"vlan\": 100", "\"qos\": 3", "0a:55:c2:28:c8:90", "trust true", "spoofchk false", "\"max_tx\": 100"]
miss = [w for w in want if w not in s]
print(0 if not miss else 1, miss)' "$during")
check cni-add-pf-side "${ok%% *}" "PF side after ADD (vlan 100 qos 3, MAC, trust on, spoofchk off, max_tx_rate 100); missing: ${ok#* }"
res=$(cni DEL c-a pod-a net1 "$cfg"); rc=$?
echo "DEL: $res"
check cni-del-with-mac "$rc" "DEL exit $rc $res"
after=$(snapshot 0)
echo "$after"
[ "$before" = "$after" ]; check cni-del-restores "$?" "PF side, VF netdev (name, MAC, MTU) and claims as before ADD"
res=$(cni DEL c-a pod-a net1 "$cfg"); rc=$?
check cni-del-idempotent "$rc" "second DEL exit $rc $res"
ip netns delete pod-a

# The driver's refusals: the ADD fails and leaves everything as it was.
refusal() { # refusal NAME MEMBERS
  local cfg before after res rc
  ip netns add pod-r
  before=$(snapshot 0)
  cfg=$(net_config "$vf0" "\"vlan\": 100, \"mac\": \"0a:55:c2:28:c8:91\", $2 \"rdma\": false,")
  res=$(cni ADD c-r pod-r net1 "$cfg"); rc=$?
  echo "ADD ($1): exit $rc $res"
  after=$(snapshot 0)
  [ "$rc" != 0 ] && [ "$before" = "$after" ]
  check "cni-refused-$1" "$?" "ADD refused (exit $rc) and PF, VF and claims as before"
  [ "$before" = "$after" ] || diff <(echo "$before") <(echo "$after")
  cni DEL c-r pod-r net1 "$cfg" >/dev/null
  ip netns delete pod-r
}
section "(c) refusals"
refusal vlan-proto-802.1ad '"vlanProto": "802.1ad",'
refusal min-tx-rate '"min_tx_rate": 10, "max_tx_rate": 100,'
refusal link-state '"link_state": "enable",'
# After the refusals the VF can still change its own MAC (no admin MAC left).
vfn=$(vf_netdev 0)
ip link set "$vfn" address 0a:55:c2:28:c8:92 2>&1; rc=$?
check vf-mac-settable-after-refusals "$rc" "VF netdev $vfn can set its own MAC (exit $rc)"
section "end"
echo "PASS guest-finished" >>"$out/checks"
