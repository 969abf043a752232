#!/usr/bin/env bash
# Renders charts/kroce with the default values and every examples/values-*.yaml,
# validates every object (Kubernetes OpenAPI schemas + our CRD schemas), checks
# that wrong values are refused, and validates the example manifests.
# Needs: helm (ci/install-helm.py), python3 with kubernetes-validate.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
helm=${HELM:-$repo/.tools/bin/helm}
chart=$repo/charts/kroce
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
fail=0

"$helm" lint --strict "$chart"

render() { # name [values-file]
  local name=$1
  shift
  "$helm" template kroce "$chart" --namespace kroce-system "$@" >"$out/$name.yaml"
  python3 "$repo/ci/validate_manifests.py" "$out/$name.yaml" | tail -n 1
}
render default
for v in "$chart"/examples/values-*.yaml "$repo"/e2e/kind/values-kind.yaml; do
  render "$(basename "$v" .yaml)" --values "$v"
done

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

if [ "$fail" = 0 ]; then
  echo "chart: all checks passed"
fi
exit "$fail"
