#!/usr/bin/env python3
"""Checks what a rendered kroce chart grants and where it puts things.

- Every namespaced object (and every ServiceAccount a binding names) is in the
  release namespace or in a Namespace the chart itself renders.
- The perftest namespace is rendered, differs from the release namespace, is
  labelled with the Pod Security level its pods need (IPC_LOCK: privileged),
  and is the one the operator is told (--test-namespace).
- No service account may create pods in the release namespace (where the
  privileged node DaemonSet runs) or cluster-wide; the operator may create
  pods only in the perftest namespace.
- pods/eviction is granted only when --drain (operator.drainHeldVfs) is on.
- No core-group events (only events.k8s.io, which kube's Recorder uses), no
  event verbs beyond create/patch, no `update` on rdmanetworks(/status).
- ServiceMonitor rendered exactly when --servicemonitor says so.

Usage: check_chart_objects.py FILE --namespace NS [--drain] [--servicemonitor]
       [--existing-namespace NS]
Exit 1 with one line per violation.
"""
import argparse
import sys

import yaml

CLUSTER_SCOPED = {
    "Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
    "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "PriorityClass",
    "RdmaNetwork", "RdmaNodeState",
}
PSA_ENFORCE = "pod-security.kubernetes.io/enforce"


def grants(rule, group, resource, verb):
    def has(values, v):
        return "*" in values or v in values
    return (has(rule.get("apiGroups", []), group)
            and has(rule.get("resources", []), resource)
            and has(rule.get("verbs", []), verb))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--namespace", required=True)
    ap.add_argument("--drain", action="store_true")
    ap.add_argument("--servicemonitor", action="store_true")
    ap.add_argument("--existing-namespace", action="append", default=[],
                    help="a namespace the admin creates (operator.createTestNamespace=false)")
    a = ap.parse_args()
    with open(a.file) as f:
        objs = [o for o in yaml.safe_load_all(f) if o]
    errors = []
    name = lambda o: f"{o['kind']}/{o['metadata']['name']}"

    namespaces = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Namespace"}
    known = {a.namespace} | set(namespaces) | set(a.existing_namespace)
    for o in objs:
        ns = o["metadata"].get("namespace")
        if o["kind"] in CLUSTER_SCOPED:
            if ns:
                errors.append(f"{name(o)}: cluster-scoped but has namespace {ns}")
        elif not ns:
            errors.append(f"{name(o)}: namespaced object without metadata.namespace")
        elif ns not in known:
            errors.append(f"{name(o)}: in namespace {ns!r}, which is neither the release namespace nor created by the chart")
        for s in o.get("subjects", []) or []:
            if s.get("kind") == "ServiceAccount" and s.get("namespace") not in known:
                errors.append(f"{name(o)}: subject {s.get('name')} in unknown namespace {s.get('namespace')!r}")

    # The operator and where it runs perftest pods.
    operator = [o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-operator")]
    test_ns = None
    if len(operator) != 1:
        errors.append(f"expected one operator Deployment, found {len(operator)}")
    else:
        args = operator[0]["spec"]["template"]["spec"]["containers"][0]["args"]
        flags = [x.split("=", 1)[1] for x in args if x.startswith("--test-namespace=")]
        if len(flags) != 1:
            errors.append(f"operator: expected one --test-namespace flag, got {flags}")
        else:
            test_ns = flags[0]
        drain = [x for x in args if x.startswith("--drain-held-vfs=")]
        if drain != [f"--drain-held-vfs={'true' if a.drain else 'false'}"]:
            errors.append(f"operator: drain flag {drain} does not match drainHeldVfs={a.drain}")
    if test_ns is not None:
        if test_ns == a.namespace:
            errors.append(f"perftest namespace is the release namespace {test_ns!r}")
        ns_obj = namespaces.get(test_ns)
        if test_ns in a.existing_namespace:
            if ns_obj is not None:
                errors.append(f"perftest namespace {test_ns!r} should exist already but the chart renders it")
        elif ns_obj is None:
            errors.append(f"perftest namespace {test_ns!r} is not created by the chart")
        else:
            level = (ns_obj["metadata"].get("labels") or {}).get(PSA_ENFORCE)
            # IPC_LOCK is not among baseline's allowed added capabilities.
            if level != "privileged":
                errors.append(f"Namespace/{test_ns}: {PSA_ENFORCE}={level!r}, perftest pods (IPC_LOCK) need privileged")

    # Who may do what, and where (None: cluster-wide).
    roles = {}
    for o in objs:
        if o["kind"] in ("Role", "ClusterRole"):
            roles[(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"])] = o.get("rules", [])
    perms = []  # (subject, scope, rule)
    for o in objs:
        if o["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        ref = o["roleRef"]
        scope = o["metadata"].get("namespace") if o["kind"] == "RoleBinding" else None
        key = (ref["kind"], scope if ref["kind"] == "Role" else None, ref["name"])
        if key not in roles:
            errors.append(f"{name(o)}: refers to {ref['kind']}/{ref['name']}, not rendered in that scope")
            continue
        for s in o.get("subjects", []):
            for r in roles[key]:
                perms.append((f"{s.get('namespace')}/{s['name']}", scope, r))

    def who_can(group, resource, verb):
        return [(subj, scope) for subj, scope, r in perms if grants(r, group, resource, verb)]

    for subj, scope in who_can("", "pods", "create"):
        where = "cluster-wide" if scope is None else f"in namespace {scope}"
        if scope is None or scope == a.namespace or scope != test_ns:
            errors.append(f"{subj} may create pods {where}")
    if test_ns is not None and not any(
            s.endswith("-operator") and sc == test_ns for s, sc in who_can("", "pods", "create")):
        errors.append(f"the operator may not create pods in the perftest namespace {test_ns!r}")
    for verb in ("list", "watch", "delete"):
        if test_ns is not None and not any(sc == test_ns for _, sc in who_can("", "pods", verb)):
            errors.append(f"the operator may not {verb} pods in the perftest namespace {test_ns!r}")
    if test_ns is not None and not any(sc == test_ns for _, sc in who_can("", "pods/log", "get")):
        errors.append(f"the operator may not read perftest pod logs in {test_ns!r}")

    evict = who_can("", "pods/eviction", "create")
    if a.drain and not evict:
        errors.append("drainHeldVfs is on but nobody may create pods/eviction")
    if not a.drain and evict:
        errors.append(f"drainHeldVfs is off but pods/eviction is granted to {evict}")

    for subj, scope, r in perms:
        groups, resources, verbs = r.get("apiGroups", []), r.get("resources", []), set(r.get("verbs", []))
        if "events" in resources and "" in groups:
            errors.append(f"{subj}: core-group events granted (kube's Recorder writes events.k8s.io)")
        if "events" in resources and verbs - {"create", "patch"}:
            errors.append(f"{subj}: event verbs beyond create/patch: {sorted(verbs - {'create', 'patch'})}")
        if "kroce.io" in groups and {"rdmanetworks", "rdmanetworks/status"} & set(resources) and "update" in verbs:
            errors.append(f"{subj}: update on {resources} (the operator only patches them)")
        if "*" in verbs or "*" in resources:
            errors.append(f"{subj}: wildcard rule {r}")

    sm = [o for o in objs if o["kind"] == "ServiceMonitor"]
    if a.servicemonitor and not sm:
        errors.append("ServiceMonitor expected (monitoring.coreos.com/v1 available) but not rendered")
    if not a.servicemonitor and sm:
        errors.append("ServiceMonitor rendered although monitoring.coreos.com/v1/ServiceMonitor is not served")

    for e in errors:
        print(f"{a.file}: {e}")
    if not errors:
        print(f"{a.file}: objects ok ({len(objs)} objects, perftest namespace {test_ns})")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
