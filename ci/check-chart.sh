#!/usr/bin/env bash
# Renders charts/kroce with the default values and every examples/values-*.yaml,
# validates every object (Kubernetes OpenAPI schemas + our CRD schemas), checks
# that wrong values are refused, and validates the example manifests.
# Needs: helm (ci/install-helm.py), python3 with kubernetes-validate and
# cel-python (pip install kubernetes-validate==1.37.0 cel-python==0.5.0).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
helm=${HELM:-$repo/.tools/bin/helm}
chart=$repo/charts/kroce
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
fail=0

"$helm" lint --strict "$chart"

render() { # name [helm args...]
  local name=$1
  shift
  "$helm" template kroce "$chart" --namespace kroce-system "$@" >"$out/$name.yaml"
  python3 "$repo/ci/validate_manifests.py" "$out/$name.yaml" | tail -n 1
}
# What the chart grants and where it puts things (ci/check_chart_objects.py):
# check NAME [expectations...] after render NAME.
check() {
  local name=$1
  shift
  python3 "$repo/ci/check_chart_objects.py" "$out/$name.yaml" --namespace kroce-system "$@" || fail=1
}
render default
check default
# The perftest-pods policy's CEL, evaluated on the operator's test pod and on
# pods that need more than baseline plus IPC_LOCK, and kroce's own policies
# (controller Nodes/NADs/DeviceClasses/creates, node agent) on the writes the
# code makes and writes beyond them (ci/check_perftest_policy.py).
python3 "$repo/ci/check_perftest_policy.py" "$out/default.yaml" kroce-perftest || fail=1
for v in "$chart"/examples/values-*.yaml "$repo"/e2e/kind/values-kind.yaml; do
  render "$(basename "$v" .yaml)" --values "$v"
done
check values-no-nri
check values-kind
# Without the Prometheus Operator's API the ServiceMonitor is left out (an
# install would fail on it); with it, it is rendered.
check values-production
render values-production-monitoring --values "$chart/examples/values-production.yaml" \
  --api-versions monitoring.coreos.com/v1/ServiceMonitor --api-versions monitoring.coreos.com/v1/PodMonitor
check values-production-monitoring --servicemonitor
render serviceMonitor-without-api --set serviceMonitor.enabled=true
check serviceMonitor-without-api
# Eviction is granted only with drainHeldVfs.
render drain --set operator.drainHeldVfs=true
check drain --drain
# Rebooting for the RDMA netns mode: eviction, cluster-wide pods list, the
# agent's --allow-host-reboot and the reboot marks in the Nodes policy only
# with rebootForRdmaMode (the default render's policy refuses setting them).
render reboot --set operator.rebootForRdmaMode=true
check reboot --reboot
python3 "$repo/ci/check_perftest_policy.py" "$out/reboot.yaml" kroce-perftest --reboot || fail=1
# DRA: the plugin container, its mounts, DeviceClasses (CEL evaluated on
# sample devices), ResourceSlice RBAC and the own-node policy; shared HCAs
# from the chart's own sharing ConfigMap (examples/values-dra.yaml).
render dra --set dra.enabled=true
check dra --dra
# The DRA plugin's own-claims policy, evaluated like the others.
python3 "$repo/ci/check_perftest_policy.py" "$out/dra.yaml" kroce-perftest --dra || fail=1
check values-dra --dra --dra-shared
# A perftest namespace the admin creates: the chart only binds the role there.
render existing-test-ns --set operator.createTestNamespace=false --set operator.testNamespace=rdma-tests
check existing-test-ns --existing-namespace rdma-tests

# The RoCE alert rules (files/kroce-rules.yaml): a PrometheusRule only where
# the Prometheus Operator serves the kind; the plain rules file (ConfigMap)
# checked and unit-tested by the real promtool (Debian's prometheus package):
# each alert fires on its series and stays silent on normal traffic
# (ci/promtool/kroce-rules-test.yaml, default thresholds).
render alerts --set alerts.enabled=true --set alerts.configMap=true \
  --api-versions monitoring.coreos.com/v1/PrometheusRule
render alerts-without-api --set alerts.enabled=true
if grep -q "kind: PrometheusRule" "$out/alerts-without-api.yaml"; then
  echo "PrometheusRule rendered without the monitoring.coreos.com/v1 API" >&2
  fail=1
fi
grep -q "kind: PrometheusRule" "$out/alerts.yaml" || { echo "no PrometheusRule rendered" >&2; fail=1; }
promtool=${PROMTOOL:-promtool}
mkdir "$out/rules"
python3 - "$out/alerts.yaml" "$out/rules" <<'PY' || fail=1
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
cm = next(d for d in docs if d["kind"] == "ConfigMap" and "kroce-rules.yaml" in d.get("data", {}))
pr = next(d for d in docs if d["kind"] == "PrometheusRule")
plain = yaml.safe_load(cm["data"]["kroce-rules.yaml"])
# One copy: the PrometheusRule carries exactly the plain file's groups.
if plain != pr["spec"]:
    sys.exit("PrometheusRule spec and the plain rules file differ")
open(sys.argv[2] + "/kroce-rules.yaml", "w").write(cm["data"]["kroce-rules.yaml"])
PY
cp "$repo/ci/promtool/kroce-rules-test.yaml" "$out/rules/"
"$promtool" check rules "$out/rules/kroce-rules.yaml" || fail=1
"$promtool" test rules "$out/rules/kroce-rules-test.yaml" || fail=1

# The Grafana dashboard: a ConfigMap with the sidecar's label only when
# enabled, holding files/kroce-dashboard.json as valid JSON whose every
# panel has a query and whose variables are node, device and port (its
# PromQL is run against a real Prometheus by e2e/tests/prometheus.rs).
render dashboard --set grafanaDashboard.enabled=true \
  --set grafanaDashboard.labels.team=rdma --set grafanaDashboard.annotations.grafana_folder=RDMA
if grep -q "kroce-dashboard.json" "$out/default.yaml"; then
  echo "dashboard ConfigMap rendered with grafanaDashboard.enabled=false" >&2
  fail=1
fi
python3 - "$out/dashboard.yaml" "$chart/files/kroce-dashboard.json" <<'PY' || fail=1
import json, sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
cms = [d for d in docs if d["kind"] == "ConfigMap" and "kroce-dashboard.json" in d.get("data", {})]
if len(cms) != 1:
    sys.exit(f"expected one dashboard ConfigMap, got {len(cms)}")
cm = cms[0]
labels = cm["metadata"].get("labels", {})
if labels.get("grafana_dashboard") != "1" or labels.get("team") != "rdma":
    sys.exit(f"dashboard ConfigMap labels {labels}: want grafana_dashboard=1 and the extra label")
if cm["metadata"].get("annotations", {}).get("grafana_folder") != "RDMA":
    sys.exit("dashboard ConfigMap lost its annotations")
dash = json.loads(cm["data"]["kroce-dashboard.json"])
if dash != json.load(open(sys.argv[2])):
    sys.exit("the rendered dashboard differs from files/kroce-dashboard.json")
names = [v["name"] for v in dash["templating"]["list"]]
for v in ("datasource", "node", "device", "port"):
    if v not in names:
        sys.exit(f"dashboard variable {v} missing: {names}")
panels = [p for p in dash["panels"] if p["type"] != "row"]
empty = [p["title"] for p in panels if not [t for t in p.get("targets", []) if t.get("expr")]]
if empty:
    sys.exit(f"panels without a query: {empty}")
print(f"dashboard: {len(panels)} panels, variables {names}")
PY

# kroce-cni refuses a network config naming a host path (issue 19): nothing
# the chart renders (a NAD, a ConfigMap with a CNI config) may carry one.
if grep -nE '"(hostRoot|sysfsRoot|procRoot|stateDir|logFile)"[[:space:]]*:' "$out"/*.yaml; then
  echo "a rendered manifest carries a kroce-cni config key naming a host path (kroce-cni refuses it)"
  fail=1
fi

# Every rendered file at once, so a failure anywhere fails the run.
python3 "$repo/ci/validate_manifests.py" "$out"/*.yaml >"$out/report.txt" || {
  grep INVALID "$out/report.txt"
  fail=1
}

# The CRDs themselves and the example objects (RdmaNetwork against our CRD).
mapfile -t examples < <(find "$chart/examples" "$repo/e2e/kind" -name '*.yaml' ! -name 'values-*.yaml' ! -name 'kind-config.yaml' | sort)
python3 "$repo/ci/validate_manifests.py" "$chart"/crds/*.yaml "${examples[@]}" | grep -E "INVALID|^validated" || fail=1

# Wrong values must be refused at install time, naming the field.
expect_refused() { # description field-to-find --set ...
  local what=$1 field=$2
  shift 2
  if "$helm" template kroce "$chart" "$@" >/dev/null 2>"$out/err.txt"; then
    echo "NOT REFUSED: $what" >&2
    fail=1
  elif ! grep -q "$field" "$out/err.txt"; then
    echo "refused without naming $field: $what" >&2
    cat "$out/err.txt" >&2
    fail=1
  else
    echo "refused as expected: $what"
  fi
}
expect_refused "string replicas" "/operator/replicas" --set operator.replicas=two
expect_refused "typo key" "replcas" --set operator.replcas=2
expect_refused "bad memlock" "/node/nri/defaultMemlock" --set node.nri.defaultMemlock=lots
expect_refused "relative path" "/node/paths/cniBinDir" --set node.paths.cniBinDir=opt/cni/bin
expect_refused "bad log level" "/logLevel" --set logLevel=loud
expect_refused "zero perftest CPUs" "/operator/perftest/cpus" --set operator.perftest.cpus=0
expect_refused "bad perftest memory" "/operator/perftest/memory" --set operator.perftest.memory=lots
expect_refused "perftest pods in the release namespace" "operator.testNamespace" \
  --namespace kroce-system --set operator.testNamespace=kroce-system
expect_refused "perftest namespace not a DNS label" "/operator/testNamespace" --set operator.testNamespace=Tests_NS
expect_refused "relative DRA state dir" "/dra/paths/stateDir" --set dra.paths.stateDir=var/lib/kroce/dra
expect_refused "shared pool without selectors" "/dra/sharedPools/0" --set dra.sharedPools[0].resourceName=hca
expect_refused "negative alert threshold" "/alerts/pauseStorm/framesPerSecond" --set alerts.pauseStorm.framesPerSecond=-1
expect_refused "alert for not a duration" "/alerts/discards/for" --set alerts.discards.for=soon
expect_refused "paused-time fraction above 1" "/alerts/pausedTime/fraction" --set alerts.pausedTime.fraction=2
expect_refused "dashboard label not a string" "/grafanaDashboard/labels/grafana_dashboard" --set grafanaDashboard.labels.grafana_dashboard=1
expect_refused "shared pool count 0" "/dra/sharedPools/0/sharedCount" \
  --set dra.sharedPools[0].resourceName=hca --set dra.sharedPools[0].sharedCount=0 \
  --set dra.sharedPools[0].selectors.vendors[0]=15b3

if [ "$fail" = 0 ]; then
  echo "chart: all checks passed"
fi
exit "$fail"
