#!/usr/bin/env bash
# End-to-end on a real cluster: kind + soft-RoCE (rdma_rxe).
# Needs: a kernel with rdma_rxe, docker, kind, kubectl, helm, iproute2 (rdma),
# and MULTUS_MANIFEST pointing at Multus' thin-plugin DaemonSet manifest.
# NOT run on the development machine (no rxe, no Docker engine there).
#
#   e2e/kind/run.sh            # create, test, delete
#   KEEP=1 e2e/kind/run.sh     # keep the cluster for debugging
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cluster=${CLUSTER:-kroce-e2e}
vfs_per_node=${VFS_PER_NODE:-2}
tag=${TAG:-e2e}

log() { printf '\n== %s\n' "$*"; }

cleanup() {
  if [ "${KEEP:-0}" = 1 ]; then
    log "KEEP=1: leaving cluster $cluster"
    return
  fi
  kind delete cluster --name "$cluster" >/dev/null 2>&1 || true
}
trap cleanup EXIT

log "preflight"
for tool in docker kind kubectl helm rdma ip; do
  command -v "$tool" >/dev/null || { echo "missing: $tool" >&2; exit 2; }
done
modprobe rdma_rxe || { echo "rdma_rxe is not available on this kernel" >&2; exit 2; }

log "build images"
# kind loads images from docker's store.
ENGINE=docker "$repo/images/build.sh" "$tag"

log "create cluster"
kind create cluster --name "$cluster" --config "$here/kind-config.yaml" --wait 120s
for img in kroce-operator kroce-node kroce-perftest; do
  kind load docker-image --name "$cluster" "$img:$tag"
done

log "soft-RoCE VFs on each worker"
for node in $(kind get nodes --name "$cluster" | grep worker); do
  "$here/setup-rxe.sh" "$node" "$vfs_per_node"
  kubectl label node "$node" kroce.io/e2e=true --overwrite
done

log "install Multus (thin) and kroce"
kubectl apply -f "${MULTUS_MANIFEST:?set MULTUS_MANIFEST to the Multus thin-plugin DaemonSet manifest (a file or URL)}"
helm install kroce "$repo/charts/kroce" --namespace kroce-system --create-namespace \
  --values "$here/values-kind.yaml" --set image.operator.tag="$tag" \
  --set image.node.tag="$tag" --set image.perftest.tag="$tag" --wait --timeout 5m

log "RdmaNetwork over rxe; admission perftests between the workers"
kubectl apply -f "$here/rdmanetwork-rxe.yaml"
kubectl wait rdmanetwork/rxe --for=condition=Ready --timeout=10m
for node in $(kind get nodes --name "$cluster" | grep worker); do
  kubectl wait "rdmanodestate/$node" --for=jsonpath='{.status.admissionPhase}'=Admitted --timeout=10m
  # Admitted nodes lose the admission taint.
  if kubectl get node "$node" -o jsonpath='{.spec.taints[*].key}' | grep -q kroce.io/rdma-unready; then
    echo "$node is admitted but still tainted" >&2
    exit 1
  fi
done
kubectl get rdmanodestates -o wide

log "two pods, ib_write_bw between them"
kubectl apply -f "$here/pods-rxe.yaml"
kubectl wait pod/rxe-client --for=jsonpath='{.status.phase}'=Succeeded --timeout=5m
kubectl logs rxe-client | tee /tmp/kroce-e2e-client.log
grep -Eq '^[[:space:]]*65536[[:space:]]' /tmp/kroce-e2e-client.log || {
  echo "ib_write_bw printed no result row" >&2
  exit 1
}
kubectl delete -f "$here/pods-rxe.yaml" --wait
kubectl delete -f "$here/rdmanetwork-rxe.yaml" --wait
log "e2e passed"
