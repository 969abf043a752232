#!/bin/bash
# The second boot of the real-kernel VM (ci/vm.sh runs it when the first
# boot's node agent asked the host to reboot, guest.sh section (f)). Same
# machine, a new kernel boot; the results share kept the agent's state dir
# and its modprobe.d. Nothing here sets the RDMA netns mode: ib_core loads
# with the options of the agent's file alone (modprobe -C), as a host's
# modprobe.d applies at boot. Appends its checks to /mnt/results/checks.
set -u
out=/mnt/results
bin=$KROCE_BIN_DIR
reboot_dir=$out/reboot
check() { # check NAME CONDITION-RC DETAIL...
  local name=$1 rc=$2
  shift 2
  if [ "$rc" = 0 ]; then echo "PASS $name $*"; else echo "FAIL $name $*"; fi | tee -a "$out/checks"
}
echo "===== second boot: kernel $(uname -r)"
boot1=$(cat "$reboot_dir/boot1" 2>/dev/null)
boot2=$(cat /proc/sys/kernel/random/boot_id)
[ -n "$boot1" ] && [ "$boot2" != "$boot1" ]
check reboot-new-boot "$?" "boot id $boot1 -> $boot2"

# The kernel's own loads too (as in guest.sh), reading only kroce's file.
printf '#!/bin/sh\n/sbin/modprobe -C %s -d %s "$@" 2>/dev/null || exec /sbin/modprobe -C %s -d %s "$@"\n' \
  "$reboot_dir/modprobe.d" "$KROCE_VM_MODULES_FAST" "$reboot_dir/modprobe.d" "$KROCE_VM_MODULES" >/tmp/modprobe
chmod +x /tmp/modprobe
echo /tmp/modprobe >/proc/sys/kernel/modprobe
/tmp/modprobe rdma_rxe || echo "modprobe rdma_rxe failed"
param=$(cat /sys/module/ib_core/parameters/netns_mode 2>/dev/null)
live=$(rdma system show 2>&1 | grep -o 'netns [a-z]*')
# ib_core's default is shared (netns_mode=1): exclusive came from the file.
[ "$live" = "netns exclusive" ] && [ "$param" = N ]
check reboot-mode-live-from-file "$?" "live $live; ib_core netns_mode=$param; file: $(cat "$reboot_dir/modprobe.d/"*.conf 2>/dev/null | grep options)"

# The agent again, with the same object (the request names the first boot)
# and the flag: the mode is applied, no second reboot.
mkdir -p /tmp/reboot-shim
install -m 0755 "$reboot_dir/systemctl" /tmp/reboot-shim/systemctl
PATH=/newroot/tmp/reboot-shim:$PATH "$bin/kroce-node-agent" apply --spec-file "$reboot_dir/object.json" \
  --state-dir "$reboot_dir/agent-state" --modprobe-dir "$reboot_dir/modprobe.d" --allow-host-reboot \
  >"$reboot_dir/after.json" 2>"$reboot_dir/after.err"
rc=$?
cat "$reboot_dir/after.json" "$reboot_dir/after.err"
pending=$(python3 -c 'import json,sys
c=[c for c in json.load(open(sys.argv[1]))["conditions"] if c["type"]=="RdmaNetnsModePending"]
print(c[0]["status"], c[0]["reason"]) if c else print("absent")' "$reboot_dir/after.json" 2>/dev/null)
asks=$(wc -l <"$reboot_dir/asked" 2>/dev/null)
[ "$rc" = 0 ] && [ "$pending" = "False Applied" ] && [ "$asks" = 1 ] &&
  [ "$(cat "$reboot_dir/agent-state/reboot-asked" 2>/dev/null)" = "$boot1" ]
check reboot-applied-not-again "$?" "apply exit $rc; RdmaNetnsModePending $pending; reboots asked in all: ${asks:-0}; record $(cat "$reboot_dir/agent-state/reboot-asked" 2>/dev/null)"
echo "PASS guest-finished-after-reboot" >>"$out/checks"
