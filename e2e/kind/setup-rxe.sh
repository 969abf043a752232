#!/usr/bin/env bash
# Gives a kind node N soft-RoCE "VFs": a macvlan per VF inside the node's
# netns and an rxe device over each. Docker snapshots /dev at container start,
# so the new uverbs/umad char devices are created inside the node by hand.
#   setup-rxe.sh NODE COUNT
set -euo pipefail
node=$1
count=$2
pid=$(docker inspect -f '{{.State.Pid}}' "$node")
for i in $(seq 0 $((count - 1))); do
  ifname="kvf$i"
  nsenter -t "$pid" -n ip link add "$ifname" link eth0 type macvlan mode bridge
  nsenter -t "$pid" -n ip link set "$ifname" up
  nsenter -t "$pid" -n rdma link add "rxe_$ifname" type rxe netdev "$ifname"
done
docker exec "$node" mkdir -p /dev/infiniband
for class in infiniband_verbs infiniband_mad; do
  for d in "/sys/class/$class"/*; do
    [ -f "$d/dev" ] || continue
    name=$(basename "$d")
    IFS=: read -r major minor < "$d/dev"
    docker exec "$node" sh -c "[ -e /dev/infiniband/$name ] || mknod -m 0666 /dev/infiniband/$name c $major $minor"
  done
done
docker exec "$node" sh -c "[ -e /dev/infiniband/rdma_cm ] || mknod -m 0666 /dev/infiniband/rdma_cm c 10 $(awk '\$2==\"rdma_cm\"{print \$1}' /proc/misc)"
