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
# The state dir from the environment, never from the network config: both
# the current name and the one the CNI's roots-from-env change reads.
export KROCE_STATE_DIR=/var/lib/cni/kroce KROCE_CNI_STATE_DIR=/var/lib/cni/kroce
state=$KROCE_STATE_DIR

check() { # check NAME CONDITION-RC DETAIL...
  local name=$1 rc=$2
  shift 2
  if [ "$rc" = 0 ]; then echo "PASS $name $*"; else echo "FAIL $name $*"; fi | tee -a "$out/checks"
}
section() { printf "\n===== %s (at %s s)\n" "$*" "$SECONDS"; }

section "kernel $(uname -r), accel ${KROCE_VM_ACCEL:-?}"
# No /lib/modules for this kernel on the host's /: load from the unpacked
# tree, also for the kernel's own on-demand loads (rxe needs crc32). No udev
# here: ib_uverbs/ib_umad/rdma_ucm (what udev loads for an RDMA device) by hand.
printf '#!/bin/sh\n/sbin/modprobe -d %s "$@" 2>/dev/null || exec /sbin/modprobe -d %s "$@"\n' \
  "$KROCE_VM_MODULES_FAST" "$KROCE_VM_MODULES" >/tmp/modprobe
chmod +x /tmp/modprobe
echo /tmp/modprobe >/proc/sys/kernel/modprobe
for m in igb igbvf rdma_rxe ib_uverbs ib_umad rdma_ucm; do /tmp/modprobe "$m" || echo "modprobe $m failed"; done
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

# (0) The RDMA netns mode (issue 22), first: the kernel changes it only
# while no netns but the initial one exists (rdma_compatdev_set: EBUSY).
# The host's modprobe.d is read-only here: the agent's goes under /tmp.
section "(0) RDMA netns mode through kroce-node-agent apply"
netns_etc=/tmp/netns-mode-host/etc/modprobe.d
netns_file=$netns_etc/kroce-rdma-netns-mode.conf
netns_apply() { # netns_apply MODE OUT: a spec with no PFs, only the mode
  printf '{"nodeName": "vm", "rdmaNetnsModes": [{"network": "vm-net", "mode": "%s"}]}\n' "$1" >/tmp/netns-mode-spec.json
  "$bin/kroce-node-agent" apply --spec-file /tmp/netns-mode-spec.json --state-dir /run/kroce-netns-mode-agent \
    --modprobe-dir "$netns_etc" >"$out/$2.json" 2>"$out/$2.err"
}
pending_of() { # pending_of FILE: "status reason" of RdmaNetnsModePending
  python3 -c 'import json,sys
c=[c for c in json.load(open(sys.argv[1]))["conditions"] if c["type"]=="RdmaNetnsModePending"]
print(c[0]["status"], c[0]["reason"]) if c else print("absent")' "$1" 2>/dev/null
}
# iproute2's own request bytes (a no-op while shared: same mode is 0 in the
# kernel), for the codec's unit test: e2e/tests/vm.rs compares them.
live_before=$(rdma system show 2>&1 | grep -o 'netns [a-z]*')
strace -f -e trace=sendmsg,sendto -xx -o "$out/rdma-sys-set-shared.strace" rdma system set netns shared
netns_apply exclusive netns-mode-exclusive
rc=$?
live=$(rdma system show 2>&1 | grep -o 'netns [a-z]*')
pending=$(pending_of "$out/netns-mode-exclusive.json")
cat "$out/netns-mode-exclusive.json" "$out/netns-mode-exclusive.err"
[ "$rc" = 0 ] && [ "$live" = "netns exclusive" ] && grep -qx 'options ib_core netns_mode=0' "$netns_file" && [ "$pending" = "False Applied" ]
check netns-mode-exclusive-applied-live "$?" "apply exit $rc; live $live_before -> $live; $netns_file: $(grep options "$netns_file" 2>/dev/null); RdmaNetnsModePending $pending"
strace -f -e trace=sendmsg,sendto -xx -o "$out/rdma-sys-set-exclusive.strace" rdma system set netns exclusive
# A netns exists (a pod's): shared cannot be set live; the file says shared
# for the next boot, the condition says a reboot is needed.
ip netns add mode-probe
netns_apply shared netns-mode-shared-busy
rc=$?
live=$(rdma system show 2>&1 | grep -o 'netns [a-z]*')
pending=$(pending_of "$out/netns-mode-shared-busy.json")
cat "$out/netns-mode-shared-busy.json" "$out/netns-mode-shared-busy.err"
[ "$rc" = 0 ] && [ "$live" = "netns exclusive" ] && grep -qx 'options ib_core netns_mode=1' "$netns_file" && [ "$pending" = "True RebootRequired" ]
check netns-mode-reboot-required-with-netns "$?" "apply exit $rc; live still $live; $netns_file: $(grep options "$netns_file" 2>/dev/null); RdmaNetnsModePending $pending"
doctor_line=$(timeout 120 "$bin/kroce-node-agent" doctor --modprobe-dir "$netns_etc" 2>/dev/null | grep '^RDMA netns mode:')
[ "$doctor_line" = "RDMA netns mode: live exclusive, at boot shared ($netns_file)" ]
check netns-mode-doctor-live-vs-boot "$?" "doctor: ${doctor_line:-no line}"
ip netns del mode-probe
# Nothing asks any more: kroce's file goes, the live mode stays.
printf '{"nodeName": "vm"}\n' >/tmp/netns-mode-spec.json
"$bin/kroce-node-agent" apply --spec-file /tmp/netns-mode-spec.json --state-dir /run/kroce-netns-mode-agent \
  --modprobe-dir "$netns_etc" >"$out/netns-mode-unmanaged.json" 2>"$out/netns-mode-unmanaged.err"
rc=$?
live=$(rdma system show 2>&1 | grep -o 'netns [a-z]*')
[ "$rc" = 0 ] && [ ! -e "$netns_file" ] && [ "$live" = "netns exclusive" ]
check netns-mode-unmanaged-removes-file "$?" "apply exit $rc; file $([ -e "$netns_file" ] && echo kept || echo removed); live $live"

# (a) VFs through the node agent: the real sriov_numvfs, NUMA-local IRQs.
section "(a) kroce-node-agent apply"
cat >/tmp/node-state.json <<JSON
{"nodeName": "vm", "pfs": [{"pciAddress": "$pf_pci", "ifName": "$pf", "numVfs": 2, "mtu": 1500,
  "vfGroups": [{"network": "vm-net", "resourceName": "kroce.io/vm", "vfRange": "0-1"}],
  "irqAffinity": {"policy": "numaLocal"}}]}
JSON
"$bin/kroce-node-agent" apply --spec-file /tmp/node-state.json --vf-wait-seconds 60 --state-dir /run/kroce-node-agent >"$out/node-agent.json" 2>"$out/node-agent.err"
rc=$?
cat "$out/node-agent.json" "$out/node-agent.err"
numvfs=$(cat "/sys/bus/pci/devices/$pf_pci/sriov_numvfs")
# The agent records the PF it changed and its count before (0), so a
# release restores 0 and never goes below what was there before kroce.
record=$(tr -d " \n" </run/kroce-node-agent/changed-pfs.json 2>/dev/null)
echo "record: $record"
[ "$numvfs" = 2 ] && [ "$rc" = 0 ] && case $record in *"\"$pf_pci\":0"*) true ;; *) false ;; esac
check agent-apply-vfs "$?" "apply exit $rc, sriov_numvfs $numvfs (0 -> 2 through the real sysfs), record $record"
if [ "$numvfs" != 2 ]; then
  echo 0 >"/sys/bus/pci/devices/$pf_pci/sriov_numvfs"
  echo 2 >"/sys/bus/pci/devices/$pf_pci/sriov_numvfs"
fi
vf_pci() { basename "$(readlink -f "/sys/bus/pci/devices/$pf_pci/virtfn$1")"; }
vf_netdev() { ls "/sys/bus/pci/devices/$(vf_pci "$1")/net" 2>/dev/null | head -n 1; }
for _ in $(seq 50); do [ -n "$(vf_netdev 1)" ] && break; sleep 0.2; done
# IRQs of the PF and its VFs: pinned to NUMA node 1's CPUs (2-3)?
irq_report() { # irq_report PCI: one "irq=affinity" per MSI-X vector, "irq=absent" when /proc/irq/N is not there
  local f n
  for f in /sys/bus/pci/devices/"$1"/msi_irqs/*; do
    [ -e "$f" ] || continue
    n=$(basename "$f")
    if [ -f "/proc/irq/$n/smp_affinity_list" ]; then echo "$n=$(cat "/proc/irq/$n/smp_affinity_list")"; else echo "$n=absent"; fi
  done | tr '\n' ' '
}
local_cpus=$(cat "/sys/bus/pci/devices/$pf_pci/local_cpulist")
pf_irqs=$(irq_report "$pf_pci")
echo "NUMA node 1 CPUs: $local_cpus; PF IRQs: $pf_irqs"
# within CPULIST REPORT: every present IRQ's CPUs are in CPULIST.
within() { python3 -c '
import sys
def cpus(l):
    out = set()
    for part in l.split(","):
        a, _, b = part.partition("-")
        out |= set(range(int(a), int(b or a) + 1))
    return out
ok = cpus(sys.argv[1])
irqs = [i.split("=", 1)[1] for i in sys.argv[2].split()]
sys.exit(0 if irqs and all(a == "absent" or cpus(a) <= ok for a in irqs) else 1)' "$1" "$2"; }
within "$local_cpus" "$pf_irqs"
check agent-pf-irqs-numa-local "$?" "PF IRQs on CPUs $local_cpus: $pf_irqs"
vf_irqs="$(irq_report "$(vf_pci 0)")$(irq_report "$(vf_pci 1)")"
echo "VF IRQs (VF netdevs down): $vf_irqs"
if grep -q absent <<<"$vf_irqs"; then
  # igbvf requests its MSI-X vectors only when the netdev opens: an agent
  # run with the VFs down has nothing to pin yet (reported as IrqsPending;
  # pinned by a later pass: check agent-vf-irqs-pinned-when-open below).
  echo "KNOWN agent-vf-irqs-numa-local VF IRQs not requested while the VFs are down: $vf_irqs" | tee -a "$out/checks"
else
  within "$local_cpus" "$vf_irqs"
  check agent-vf-irqs-numa-local "$?" "VF IRQs on CPUs $local_cpus: $vf_irqs"
fi

vf0=$(vf_pci 0) vf1=$(vf_pci 1)
check vfs-created "$([ -n "$(vf_netdev 0)" ] && [ -n "$(vf_netdev 1)" ] && echo 0 || echo 1)" \
  "VF0 $vf0 $(vf_netdev 0), VF1 $vf1 $(vf_netdev 1), driver $(basename "$(readlink "/sys/bus/pci/devices/$vf0/driver")")"

# The PF-side state of VF N as ip reports it, and the VF netdev's own MAC.
# (ip -j prints no spaces; cut at each VF's object: no python per snapshot,
# which costs seconds under TCG.)
pf_vf_state() { ip -j -d link show "$pf" | sed 's/{"vf":/\n{"vf":/g' | grep "^{\"vf\":$1,"; }
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
[ -n "$in_pod" ] || in_pod='[{}]'
echo "$in_pod"
ok=$(python3 -c '
import json, sys
l = json.loads(sys.argv[1])[0]
a = [i["local"] for i in l.get("addr_info", []) if i["family"] == "inet"]
print(0 if l["mtu"] == 1400 and l["address"] == "0a:55:c2:28:c8:90" and a and a[0].startswith("10.56.0.") and "UP" in l["flags"] else 1)' "$in_pod" 2>/dev/null || echo 1)
check cni-add-in-pod "$ok" "net1 in the pod: MTU 1400, MAC, IP from host-local, up"
during=$(pf_vf_state 0)
echo "$during"
missing=
for w in '"vlan":100' '"qos":3' '"0a:55:c2:28:c8:90"' '"trust":true' '"spoofchk":false' '"max_tx":100'; do
  grep -qF "$w" <<<"$during" || missing="$missing $w"
done
[ -z "$missing" ]
check cni-add-pf-side "$?" "PF side after ADD (vlan 100 qos 3, MAC, trust on, spoofchk off, max_tx_rate 100); missing:${missing:- none}"
# (a) again: VF 0's netdev is now open (net1 in the pod), so igbvf has
# requested its MSI-X vectors; the agent's next pass pins them NUMA-local,
# and reports VF 1's (still down) as pending, not as kept.
"$bin/kroce-node-agent" apply --spec-file /tmp/node-state.json --vf-wait-seconds 60 --state-dir /run/kroce-node-agent >"$out/node-agent-2.json" 2>"$out/node-agent-2.err"
vf0_irqs=$(irq_report "$(vf_pci 0)")
echo "VF 0 IRQs (net1 up in the pod): $vf0_irqs"
pending=$(python3 -c '
import json, sys
s = json.load(open(sys.argv[1]))
c = [c for c in s.get("conditions", []) if c["type"] == "IrqsPending"]
print(c[0]["status"] if c else "none")' "$out/node-agent-2.json" 2>/dev/null)
! grep -q absent <<<"$vf0_irqs" && within "$local_cpus" "$vf0_irqs" && [ "$pending" = True ]
check agent-vf-irqs-pinned-when-open "$?" "VF 0 IRQs on CPUs $local_cpus once open: $vf0_irqs; IrqsPending (VF 1 down): $pending"
res=$(cni DEL c-a pod-a net1 "$cfg"); rc=$?
echo "DEL: $res"
check cni-del-with-mac "$rc" "DEL exit $rc $res"
after=$(snapshot 0)
echo "$after"
# igb learns a VF's own MAC through the VF-PF mailbox, answered in the PF's
# interrupt handler: under TCG on a loaded machine that can lag the DEL.
# Re-read for up to 3 s, say how long it took, and name what differs.
settled=0
while [ "$before" != "$after" ] && [ "$settled" -lt 6 ]; do
  sleep 0.5; settled=$((settled + 1)); after=$(snapshot 0)
done
[ "$before" = "$after" ]; check cni-del-restores "$?" "PF side, VF netdev (name, MAC, MTU) and claims as before ADD (re-read $settled x 0.5 s)$(diff <(echo "$before") <(echo "$after") | grep '^[<>]' | tr '\n' ' ')"
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
  [ "$before" = "$after" ] || printf 'before:\n%s\nafter:\n%s\n' "$before" "$after"
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
# (b) The device plugin's view: an rxe on a VF netdev is that VF's RDMA device.
section "(b) kroce-device-plugin discover"
vfn1=$(vf_netdev 1)
rdma link add rxe_vf1 type rxe netdev "$vfn1"
rc=$?
ls /sys/class/infiniband/ /dev/infiniband/ 2>&1 | tr '\n' ' '; echo
"$bin/kroce-device-plugin" discover --json >"$out/discover.json" 2>"$out/discover.err"
drc=$?
cat "$out/discover.json" "$out/discover.err"
python3 -c '
import json, sys
vf, rdma = sys.argv[2], sys.argv[3]
rows = [d["device"] for d in json.load(open(sys.argv[1]))["devices"] if d["device"].get("pci") == vf]
print("VF row:", json.dumps(rows))
sys.exit(0 if rows and rdma in json.dumps(rows[0].get("rdma")) else 1)' "$out/discover.json" "$(vf_pci 1)" rxe_vf1
check dp-rxe-on-vf-is-the-vfs-rdma-device "$?" "rxe_vf1 (rdma link add exit $rc) on $vfn1 listed with VF $(vf_pci 1) (discover exit $drc)"
rdma link delete rxe_vf1

# (d) Two pods' VFs in two netns, soft-RoCE created in each pod netns after
# the netdev moved (kernel 7.3, exclusive mode), perftest through the
# admission runner; e2e/tests/vm.rs judges the logs with its parser and
# thresholds.
section "(d) ib_write_bw / ib_send_lat through kroce-perftest-run"
# Already exclusive since (0) (kroce-node-agent apply): a no-op, kept so
# this section stands alone.
rdma system set netns exclusive
rdma system show

# (c) An rxe on a VF: the kernel deletes it when the VF netdev leaves the
# host netns; kroce-cni makes it again in the pod (same name, over net1) and,
# at DEL, on the host over the VF netdev. rdma true: it must be found.
section "(c) CNI ADD/DEL of a VF carrying an rxe"
vfn1=$(vf_netdev 1)
rdma link add rxe_vf1 type rxe netdev "$vfn1"
ip netns add pod-x
cfg_x=$(net_config "$(vf_pci 1)" '"rdma": true,')
cni ADD c-px pod-x net1 "$cfg_x" >"$out/rxe-add.json" 2>&1
rc=$?
cat "$out/rxe-add.json"
in_pod=$(ip netns exec pod-x rdma link show 2>&1 | tr '\n' ' ')
on_host=$(rdma link show 2>&1 | tr '\n' ' ')
echo "pod-x: $in_pod; host: $on_host"
[ "$rc" = 0 ] && grep -q "rxe_vf1/1 .*netdev net1" <<<"$in_pod" && ! grep -q rxe_vf1 <<<"$on_host"
check cni-rxe-on-vf-made-again-in-pod "$?" "ADD (rdma true) exit $rc; in pod-x: $in_pod; on the host: $on_host"
cni DEL c-px pod-x net1 "$cfg_x" >"$out/rxe-del.json" 2>&1
rc=$?
cat "$out/rxe-del.json"
vfn1_now=$(vf_netdev 1)
on_host=$(rdma link show 2>&1 | tr '\n' ' ')
[ "$rc" = 0 ] && [ "$vfn1_now" = "$vfn1" ] && grep -q "rxe_vf1/1 .*netdev $vfn1" <<<"$on_host" && [ -z "$(claims)" ]
check cni-rxe-on-vf-back-on-host "$?" "DEL exit $rc; VF netdev $vfn1_now (was $vfn1); host: $on_host; claims: $(claims)"
ip netns delete pod-x
rdma link delete rxe_vf1

# The kind path: an rxe over a macvlan attached by name (deviceID is the
# rxe's name). The kernel deletes it when the macvlan leaves the host netns;
# kroce-cni makes it again over net1 in the pod and over the macvlan on DEL.
section "(c) CNI ADD/DEL of an rxe over a plain netdev (kind path)"
/tmp/modprobe macvlan || echo "modprobe macvlan failed"
ip link add kmv0 link "$pf" type macvlan mode bridge
ip link set kmv0 up
mv_mac=$(cat /sys/class/net/kmv0/address)
rdma link add rxe_mv0 type rxe netdev kmv0
ip netns add pod-m
cfg_m=$(cat <<JSON
{"cniVersion": "1.0.0", "name": "vm-net", "type": "kroce-cni", "deviceID": "rxe_mv0", "rdma": true,
 "ipam": {"type": "host-local", "dataDir": "/tmp/host-local", "ranges": [[{"subnet": "10.56.0.0/24"}]]}}
JSON
)
cni ADD c-pm pod-m net1 "$cfg_m" >"$out/rxe-plain-add.json" 2>&1
rc=$?
cat "$out/rxe-plain-add.json"
in_pod=$(ip netns exec pod-m rdma link show 2>&1 | tr '\n' ' ')
on_host=$(rdma link show 2>&1 | tr '\n' ' ')
[ "$rc" = 0 ] && grep -q "rxe_mv0/1 .*netdev net1" <<<"$in_pod" && ! grep -q rxe_mv0 <<<"$on_host"
check cni-rxe-plain-made-again-in-pod "$?" "ADD (deviceID rxe_mv0, rdma true) exit $rc; in pod-m: $in_pod; on the host: $on_host"
cni DEL c-pm pod-m net1 "$cfg_m" >"$out/rxe-plain-del.json" 2>&1
rc=$?
cni DEL c-pm pod-m net1 "$cfg_m" >>"$out/rxe-plain-del.json" 2>&1
rc2=$?
cat "$out/rxe-plain-del.json"
on_host=$(rdma link show 2>&1 | tr '\n' ' ')
mac_now=$(cat /sys/class/net/kmv0/address 2>/dev/null)
[ "$rc" = 0 ] && [ "$rc2" = 0 ] && [ "$mac_now" = "$mv_mac" ] && grep -q "rxe_mv0/1 .*netdev kmv0" <<<"$on_host" && [ -z "$(claims)" ]
check cni-rxe-plain-back-on-host "$?" "DEL exit $rc, again $rc2; kmv0 MAC $mac_now (was $mv_mac); host: $on_host; claims: $(claims)"
ip netns delete pod-m
rdma link delete rxe_mv0
ip link delete kmv0

ip netns add pod-a
ip netns add pod-b
cfg_a=$(net_config "$vf0" '"rdma": false,')
cfg_b=$(net_config "$(vf_pci 1)" '"rdma": false,')
cni ADD c-pa pod-a net1 "$cfg_a" >/dev/null; rc_a=$?
cni ADD c-pb pod-b net1 "$cfg_b" >/dev/null; rc_b=$?
ip_b=$(ip netns exec pod-b ip -4 -o addr show net1 | awk '{ split($4, a, "/"); print a[1] }')
for p in a b; do
  ip netns exec "pod-$p" rdma link add "rxe$p" type rxe netdev net1
  rdma dev set "rxe$p" netns "pod-$p" 2>&1 || true
done
ip netns exec pod-a rdma dev; ip netns exec pod-b rdma dev
runner_args=(--bw-tool ib_write_bw --lat-tool ib_send_lat --duration 2 --qps 1 --size 65536
  --iterations 100 --gid-wait 30 --connect-wait 60)
perftest_pair() {
  ip netns exec pod-b "$bin/kroce-perftest-run" server --device rxeb "${runner_args[@]}" \
    >"$out/perftest-server.log" 2>&1 &
  server=$!
  ip netns exec pod-a "$bin/kroce-perftest-run" client --server-ip "$ip_b" --device rxea "${runner_args[@]}" \
    >"$out/perftest-client.log" 2>&1
  rc=$?
  wait "$server"
  src=$?
}
perftest_pair
# Under TCG perftest's cycle-counter timing can print inf/-nan, which the
# runner's parser rightly refuses: one more run, said as KNOWN.
if grep -Eqw -- '-?(inf|nan)' "$out/perftest-client.log" "$out/perftest-server.log"; then
  echo "KNOWN perftest-inf-nan perftest printed inf/nan under TCG: run once more" | tee -a "$out/checks"
  cat "$out/perftest-client.log"
  perftest_pair
fi
cat "$out/perftest-client.log" "$out/perftest-server.log"
[ "$rc_a" = 0 ] && [ "$rc_b" = 0 ] && [ "$rc" = 0 ] && [ "$src" = 0 ]
check perftest-runner "$?" "ADD exits $rc_a/$rc_b, client exit $rc, server exit $src (logs: perftest-*.log)"
for p in a b; do
  ip netns exec "pod-$p" rdma link delete "rxe$p" 2>/dev/null
done
cni DEL c-pa pod-a net1 "$cfg_a" >/dev/null
cni DEL c-pb pod-b net1 "$cfg_b" >/dev/null
ip netns delete pod-a
ip netns delete pod-b

# (e) The whole-node flow of e2e/tests/node.rs on the igb VFs: the e2e vm
# test binary (host build, over the 9p share) writes node-e2e-* checks.
section "(e) whole node: node agent, device plugin, CNI on igb VFs"
if [ -x "${KROCE_VM_GUEST_TEST:-}" ]; then
  KROCE_VM_GUEST_CHECKS=$out/checks "$KROCE_VM_GUEST_TEST" guest_whole_node --exact --nocapture --test-threads 1
  echo "guest_whole_node exit $?"
else
  echo "FAIL node-e2e no test binary (KROCE_VM_GUEST_TEST=${KROCE_VM_GUEST_TEST:-unset})" | tee -a "$out/checks"
fi

# (f) Reboot for the RDMA netns mode (issue 22), boot 1 of 2: shared live,
# a pod's netns present, the spec asks for exclusive: only a reboot applies
# it. The controller's request (this boot's id) is on the object; the agent
# runs its real reboot command: util-linux nsenter into PID 1's namespaces,
# then `systemctl reboot` resolved in PID 1's root, the initramfs here
# (no systemd in this VM: that `systemctl` records the ask). ci/vm.sh boots
# again into e2e/vm/after-reboot.sh, whose
# modprobe reads only the agent's modprobe.d (on the results share, which
# survives the reboot, as does the agent's state dir).
section "(f) reboot for the RDMA netns mode, first boot"
reboot_dir=$out/reboot
rm -rf "$reboot_dir"
mkdir -p "$reboot_dir/modprobe.d" "$reboot_dir/agent-state" /tmp/reboot-shim
# Resolved after nsenter's setns into PID 1's mount namespace, whose root is
# the initramfs (init chroots only its child): /newroot is the host tree.
cat >"$reboot_dir/systemctl" <<'SHIM'
#!/bin/busybox sh
echo "systemctl $*" >>/newroot/mnt/results/reboot/asked
SHIM
install -m 0755 "$reboot_dir/systemctl" /tmp/reboot-shim/systemctl
for ns in $(ip netns list | awk '{print $1}'); do ip netns delete "$ns"; done
# Netns teardown is asynchronous (cleanup_net): EBUSY until it ran.
for _ in $(seq 50); do rdma system set netns shared 2>/dev/null && break; sleep 0.2; done
live_before=$(rdma system show 2>&1 | grep -o 'netns [a-z]*')
ip netns add reboot-busy
boot1=$(cat /proc/sys/kernel/random/boot_id)
echo "$boot1" >"$reboot_dir/boot1"
printf '{"metadata": {"name": "vm", "annotations": {"kroce.io/reboot-boot-id": "%s"}},
 "spec": {"nodeName": "vm", "rdmaNetnsModes": [{"network": "vm-net", "mode": "exclusive"}]}}\n' \
  "$boot1" >"$reboot_dir/object.json"
reboot_apply() { # reboot_apply OUT [FLAG]
  PATH=/newroot/tmp/reboot-shim:$PATH "$bin/kroce-node-agent" apply --spec-file "$reboot_dir/object.json" \
    --state-dir "$reboot_dir/agent-state" --modprobe-dir "$reboot_dir/modprobe.d" "${@:2}" \
    >"$reboot_dir/$1.json" 2>"$reboot_dir/$1.err"
}
# Without --allow-host-reboot the request is refused, and said.
reboot_apply refused
rc=$?
msg=$(python3 -c 'import json,sys
c=[c for c in json.load(open(sys.argv[1]))["conditions"] if c["type"]=="RdmaNetnsModePending"]
print(c[0]["status"], c[0]["reason"], c[0]["message"]) if c else print("absent")' "$reboot_dir/refused.json" 2>/dev/null)
[ "$rc" = 0 ] && [ ! -e "$reboot_dir/asked" ] && [ ! -e "$reboot_dir/agent-state/reboot-asked" ] &&
  case $msg in "True RebootRequired "*--allow-host-reboot*) true ;; *) false ;; esac
check reboot-refused-without-flag "$?" "apply exit $rc; live $live_before; asked $(cat "$reboot_dir/asked" 2>/dev/null || echo never); condition: $msg"
reboot_apply asked --allow-host-reboot
rc=$?
# A later pass in the same boot (the host has not gone down yet): no second ask.
reboot_apply again --allow-host-reboot
rc2=$?
cat "$reboot_dir/asked.json" "$reboot_dir/asked.err" "$reboot_dir/again.err"
msg=$(python3 -c 'import json,sys
c=[c for c in json.load(open(sys.argv[1]))["conditions"] if c["type"]=="RdmaNetnsModePending"]
print(c[0]["status"], c[0]["reason"], c[0]["message"]) if c else print("absent")' "$reboot_dir/asked.json" 2>/dev/null)
[ "$rc" = 0 ] && [ "$rc2" = 0 ] && [ "$(cat "$reboot_dir/asked" 2>/dev/null)" = "systemctl reboot" ] &&
  [ "$(cat "$reboot_dir/agent-state/reboot-asked" 2>/dev/null)" = "$boot1" ] &&
  grep -qx 'options ib_core netns_mode=0' "$reboot_dir/modprobe.d/kroce-rdma-netns-mode.conf" &&
  case $msg in "True RebootRequired "*"reboot asked of the host (boot $boot1)"*) true ;; *) false ;; esac
check reboot-asked-once-through-nsenter "$?" "apply exits $rc/$rc2; live $live_before; PID 1's root ran: $(tr '\n' '|' <"$reboot_dir/asked" 2>/dev/null); record $(cat "$reboot_dir/agent-state/reboot-asked" 2>/dev/null); condition: $msg"

section "end"
echo "PASS guest-finished" >>"$out/checks"
# The VM powers off (init); ci/vm.sh boots it again, as the host's reboot
# would, when $reboot_dir/asked says the agent asked.
