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
- pods/eviction is granted only when --drain (operator.drainHeldVfs) or
  --reboot (operator.rebootForRdmaMode) is on; cluster-wide pods list and
  the node agent's --allow-host-reboot only with --reboot.
- No core-group events (only events.k8s.io, which kube's Recorder uses), no
  event verbs beyond create/patch, no `update` on rdmanetworks(/status).
- ServiceMonitor rendered exactly when --servicemonitor says so.
- The RBAC table in operator/README.md lists exactly what the render grants
  the controller and node service accounts (group, resource, resourceNames,
  verb, scope), nothing more or less.
- DRA exactly when --dra (dra.enabled): the node DaemonSet's dra-plugin
  container, its flags and the host paths behind them (kubelet plugins and
  plugins_registry, /sys, /dev, CDI, state, device-info, the CNI state dir
  for memlock/network-attach requests, the device plugin's per-node key
  and, with --dra-shared, the chart's sharing ConfigMap after it); kroce-nri
  able to attach claims' VFs; the three DeviceClasses, whose CEL is evaluated on sample devices
  (each must select exactly its kind); ResourceSlice writes granted to the
  node service account only and narrowed to its own node by a
  ValidatingAdmissionPolicy; claims get and status patch. The operator may
  write DeviceClasses (for `frontend: dra` networks) in every render.

Usage: check_chart_objects.py FILE --namespace NS [--drain] [--reboot] [--servicemonitor]
       [--existing-namespace NS] [--dra [--dra-shared]]
Exit 1 with one line per violation.
"""
import argparse
import os
import sys

import yaml

CLUSTER_SCOPED = {
    "Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "DeviceClass",
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


# One device of each kind as kroce-dra publishes it (attributes of driver
# rdma.kroce.io), and one of another driver.
SAMPLE_DEVICES = {
    "vf": {"driver": "rdma.kroce.io", "attributes": {"rdma.kroce.io": {
        "type": "vf", "shared": False, "pciAddress": "0000:3b:00.2", "vfIndex": 0}}},
    "shared-slot": {"driver": "rdma.kroce.io", "attributes": {"rdma.kroce.io": {
        "type": "pci", "shared": True, "pciAddress": "0000:3b:00.0"}}},
    "pf": {"driver": "rdma.kroce.io", "attributes": {"rdma.kroce.io": {
        "type": "pci", "shared": False, "pciAddress": "0000:05:00.0"}}},
    "soft": {"driver": "rdma.kroce.io", "attributes": {"rdma.kroce.io": {
        "type": "soft", "shared": False, "netdev": "eth9"}}},
    "gpu": {"driver": "gpu.nvidia.com", "attributes": {"gpu.nvidia.com": {
        "type": "gpu"}}},
}
# DeviceClass -> the one sample it must select.
DEVICE_CLASSES = {
    "rdma-vf.kroce.io": "vf",
    "rdma-shared-hca.kroce.io": "shared-slot",
    "rdma-soft.kroce.io": "soft",
}


def cel_selected(expression, errors, where):
    """The sample devices a CEL selector selects (None: cannot evaluate)."""
    try:
        import celpy
    except ImportError:
        errors.append(f"{where}: cel-python is needed to check DeviceClass selectors (pip install cel-python)")
        return None
    env = celpy.Environment()
    try:
        prog = env.program(env.compile(expression))
    except celpy.CELParseError as e:
        errors.append(f"{where}: CEL does not parse: {e}")
        return None
    out = set()
    for name, dev in SAMPLE_DEVICES.items():
        try:
            v = prog.evaluate({"device": celpy.json_to_cel(dev)})
        except celpy.CELEvalError as e:
            errors.append(f"{where}: CEL fails on a {name} device: {e}")
            continue
        if isinstance(v, celpy.CELEvalError):
            errors.append(f"{where}: CEL fails on a {name} device: {v}")
        elif bool(v):
            out.add(name)
    return out


def check_dra(objs, a, errors, who_can):
    ds = [o for o in objs if o["kind"] == "DaemonSet" and o["metadata"]["name"].endswith("-node")]
    pod = ds[0]["spec"]["template"]["spec"] if len(ds) == 1 else {"containers": [], "volumes": []}
    dra = [c for c in pod["containers"] if c["name"] == "dra-plugin"]
    classes = {o["metadata"]["name"]: o for o in objs if o["kind"] == "DeviceClass"}
    slice_writers = {s for verb in ("create", "update", "patch", "delete")
                     for s, _ in who_can("resource.k8s.io", "resourceslices", verb)}
    op_dc = [v for v in ("get", "list", "watch", "create", "patch", "delete")
             if not any(s.endswith("-operator") for s, _ in who_can("resource.k8s.io", "deviceclasses", v))]
    if op_dc:
        errors.append(f"the operator may not {op_dc} deviceclasses (frontend: dra networks)")
    if not a.dra:
        for x in pod["containers"]:
            if x["name"] == "nri-memlock" and x.get("securityContext", {}).get("capabilities", {}).get("add"):
                errors.append("nri-memlock: capabilities added although dra.enabled is off")
        if dra:
            errors.append("dra-plugin container rendered although dra.enabled is off")
        if classes:
            errors.append(f"DeviceClasses {sorted(classes)} rendered although dra.enabled is off")
        if slice_writers:
            errors.append(f"resourceslices writable by {sorted(slice_writers)} although dra.enabled is off")
        return
    if len(dra) != 1:
        errors.append(f"dra.enabled but {len(dra)} dra-plugin containers in the node DaemonSet")
        return
    c = dra[0]
    where = "dra-plugin"
    flags = {}
    configs = []
    for arg in c.get("args", []):
        k, _, v = arg.partition("=")
        flags[k] = v
        if k == "--device-plugin-config":
            configs.append(v)
    env = {e["name"]: e for e in c.get("env", [])}
    if flags.get("--node-name") != "$(NODE_NAME)" or \
            env.get("NODE_NAME", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") != "spec.nodeName":
        errors.append(f"{where}: --node-name must be $(NODE_NAME) from spec.nodeName")
    if "/usr/local/bin/kroce-dra-plugin" not in c.get("command", []):
        errors.append(f"{where}: command is not kroce-dra-plugin: {c.get('command')}")
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in c.get("volumeMounts", [])}

    def host_mount(path, what, writable=True, host=None):
        """`path` mounted from the host's `host` (default: the same path)."""
        m = mounts.get(path)
        if m is None:
            errors.append(f"{where}: {what} {path} is not mounted")
            return
        hp = volumes.get(m["name"], {}).get("hostPath", {}).get("path")
        if hp != (host or path):
            errors.append(f"{where}: {what} {path} is mounted from {hp!r}, not the host's {host or path}")
        if writable and m.get("readOnly"):
            errors.append(f"{where}: {what} {path} is mounted read-only")

    def under_mount(path, what):
        """`path` inside a writable host mount at the same path."""
        for mp, m in mounts.items():
            hp = volumes.get(m["name"], {}).get("hostPath", {}).get("path")
            if hp == mp and (path == mp or path.startswith(mp.rstrip("/") + "/")) and not m.get("readOnly"):
                return
        errors.append(f"{where}: {what} {path} is not inside a writable host mount at the same path")

    for flag in ("--kubelet-dir", "--host-root", "--state-dir", "--cdi-dir", "--devinfo-dir",
                 "--memlock-dir", "--network-dir", "--device-plugin-config"):
        if not flags.get(flag):
            errors.append(f"{where}: {flag} missing")
    kubelet = flags.get("--kubelet-dir", "")
    if kubelet:
        host_mount(os.path.join(kubelet, "plugins"), "kubelet plugins dir")
        host_mount(os.path.join(kubelet, "plugins_registry"), "kubelet plugins_registry dir")
    root = flags.get("--host-root", "")
    if root:
        host_mount(os.path.join(root, "sys"), "host /sys", writable=False, host="/sys")
        host_mount(os.path.join(root, "dev"), "host /dev", writable=False, host="/dev")
    for flag, what in (("--state-dir", "state dir"), ("--cdi-dir", "CDI dir"),
                       ("--devinfo-dir", "device-info dir")):
        if flags.get(flag):
            host_mount(flags[flag], what)
    for flag, what in (("--memlock-dir", "memlock dir"), ("--network-dir", "network-attach dir")):
        if flags.get(flag):
            under_mount(flags[flag], what)
    # The device plugin's per-node key first (its pools decide), then the
    # chart's shared pools with --dra-shared.
    want = ["kroce-device-plugin"] + (["<own>"] if a.dra_shared else [])
    if len(configs) != len(want):
        errors.append(f"{where}: --device-plugin-config {configs}, expected {len(want)} (device plugin key{', sharing ConfigMap' if a.dra_shared else ''})")
    rendered = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ConfigMap"}
    for cfg, expect in zip(configs, want):
        m = mounts.get(os.path.dirname(cfg))
        cm = volumes.get(m["name"], {}).get("configMap") if m else None
        key = os.path.basename(cfg)
        if cm is None:
            errors.append(f"{where}: --device-plugin-config {cfg} is not in a mounted ConfigMap")
        elif expect == "kroce-device-plugin":
            if cm["name"] != expect or key != "$(NODE_NAME).yaml":
                errors.append(f"{where}: first --device-plugin-config {cfg} is not the device plugin's per-node key (ConfigMap kroce-device-plugin)")
        else:
            own = rendered.get(cm["name"])
            if own is None or key not in (own.get("data") or {}):
                errors.append(f"{where}: sharing config {cfg}: ConfigMap {cm['name']} with key {key} is not rendered")
            elif "mode: shared" not in own["data"][key]:
                errors.append(f"{where}: sharing config {cm['name']}/{key} has no shared pool")

    # kroce-nri attaches the claims' VFs (no Multus).
    nri = [x for x in pod["containers"] if x["name"] == "nri-memlock"]
    if nri:
        n = nri[0]
        caps = set(n.get("securityContext", {}).get("capabilities", {}).get("add", []))
        if not {"NET_ADMIN", "SYS_ADMIN"} <= caps:
            errors.append(f"nri-memlock: DRA network attach needs NET_ADMIN and SYS_ADMIN, has {sorted(caps)}")
        nargs = dict(x.partition("=")[::2] for x in n.get("args", []))
        if nargs.get("--dra-network") != "true":
            errors.append("nri-memlock: --dra-network=true missing with dra.enabled")
        nmounts = {m["mountPath"] for m in n.get("volumeMounts", [])}
        if nargs.get("--cni-bin-dir") not in nmounts:
            errors.append(f"nri-memlock: --cni-bin-dir {nargs.get('--cni-bin-dir')} is not mounted")
        net_dir = flags.get("--network-dir", "")
        if not any(net_dir.startswith(mp.rstrip("/") + "/") for mp in nmounts):
            errors.append(f"nri-memlock: the DRA plugin's --network-dir {net_dir} is not in its mounts")
    if set(classes) != set(DEVICE_CLASSES):
        errors.append(f"DeviceClasses {sorted(classes)}, expected {sorted(DEVICE_CLASSES)}")
    for name, want in DEVICE_CLASSES.items():
        dc = classes.get(name)
        if dc is None:
            continue
        exprs = [s.get("cel", {}).get("expression", "") for s in dc.get("spec", {}).get("selectors", [])]
        if len(exprs) != 1:
            errors.append(f"DeviceClass/{name}: expected one CEL selector, got {len(exprs)}")
            continue
        got = cel_selected(exprs[0], errors, f"DeviceClass/{name}")
        if got is not None and got != {want}:
            errors.append(f"DeviceClass/{name}: selects {sorted(got)}, expected only a {want} device")

    node_sa = [s for s in slice_writers if s.endswith("-node")]
    if slice_writers - set(node_sa):
        errors.append(f"resourceslices writable by more than the node service account: {sorted(slice_writers)}")
    needs = [("resourceslices", v) for v in ("get", "list", "create", "update", "delete")] + \
        [("resourceclaims", "get"), ("resourceclaims/status", "patch")]
    for res, verb in needs:
        if not any(s.endswith("-node") for s, _ in who_can("resource.k8s.io", res, verb)):
            errors.append(f"the node service account may not {verb} {res}")
    if not any(s.endswith("-node") for s, _ in who_can("", "nodes", "get")):
        errors.append("the node service account may not get nodes (ResourceSlice owner)")
    # RBAC cannot say "my node": the policy must.
    vaps = [o for o in objs if o["kind"] == "ValidatingAdmissionPolicy" and any(
        "resourceslices" in r.get("resources", []) and
        {"CREATE", "UPDATE", "DELETE"} <= set(r.get("operations", []))
        for r in o["spec"].get("matchConstraints", {}).get("resourceRules", []))]
    if len(vaps) != 1:
        errors.append(f"expected one ValidatingAdmissionPolicy on resourceslices, found {len(vaps)}")
    else:
        vap = vaps[0]
        cond = " ".join(m.get("expression", "") for m in vap["spec"].get("matchConditions", []))
        if f":{a.namespace}:" not in cond or "-node" not in cond:
            errors.append(f"ValidatingAdmissionPolicy/{vap['metadata']['name']}: does not match the node service account")
        text = yaml.safe_dump(vap["spec"].get("variables", [])) + yaml.safe_dump(vap["spec"].get("validations", []))
        if "authentication.kubernetes.io/node-name" not in text or "nodeName" not in text:
            errors.append(f"ValidatingAdmissionPolicy/{vap['metadata']['name']}: does not compare the token's node with spec.nodeName")
        bound = [o for o in objs if o["kind"] == "ValidatingAdmissionPolicyBinding"
                 and o["spec"].get("policyName") == vap["metadata"]["name"]
                 and "Deny" in o["spec"].get("validationActions", [])]
        if not bound:
            errors.append(f"ValidatingAdmissionPolicy/{vap['metadata']['name']}: no Deny binding")


README = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "operator", "README.md")


def readme_rbac_rows(path):
    """The RBAC table of operator/README.md: (who, where, when, group,
    resource, names, verbs) per row."""
    with open(path) as f:
        text = f.read()
    try:
        table = text.split("<!-- rbac-table -->", 1)[1].split("<!-- /rbac-table -->", 1)[0]
    except IndexError:
        return None
    rows = []
    for line in table.strip().splitlines()[2:]:
        if not line.strip():
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 7:
            rows.append(("?", line))
            continue
        who, where, when, group, resource, names, verbs = cells
        rows.append((who, where, when, "" if group == "core" else group, resource,
                     tuple(sorted(n.strip() for n in names.split(",") if n.strip() not in ("", "-"))),
                     tuple(v.strip() for v in verbs.split(","))))
    return rows


def check_readme_rbac(perms, a, test_ns, errors):
    """The operator README's RBAC table is exactly what this render grants
    the controller and node service accounts (one fact per verb)."""
    rows = readme_rbac_rows(README)
    if rows is None:
        errors.append(f"{README}: no <!-- rbac-table --> section")
        return
    scopes = {"cluster": None, "release": a.namespace, "perftest": test_ns}
    when = {"always": True, "drainHeldVfs": a.drain, "dra": a.dra,
            "rebootForRdmaMode": a.reboot, "drainHeldVfs or rebootForRdmaMode": a.drain or a.reboot}
    documented = set()
    for row in rows:
        if row[0] == "?":
            errors.append(f"{README}: RBAC table row not understood: {row[1]}")
            continue
        who, where, cond, group, resource, names, verbs = row
        if where not in scopes or cond not in when:
            errors.append(f"{README}: RBAC table row with unknown where/when: {row}")
            continue
        if not when[cond]:
            continue
        for v in verbs:
            documented.add((who, scopes[where], group, resource, names, v))
    granted = set()
    for subj, scope, r in perms:
        who = subj.rsplit("-", 1)[-1]
        who = {"operator": "controller", "node": "node"}.get(who, subj)
        for g in r.get("apiGroups", []):
            for res in r.get("resources", []):
                for v in r.get("verbs", []):
                    granted.add((who, scope, g, res, tuple(sorted(r.get("resourceNames", []))), v))
    fmt = lambda t: f"{t[0]} {t[5]} {t[2] or 'core'}/{t[3]}{'[' + ','.join(t[4]) + ']' if t[4] else ''} " \
                    f"{'cluster-wide' if t[1] is None else 'in ' + t[1]}"
    for t in sorted(granted - documented, key=str):
        errors.append(f"the chart grants {fmt(t)}, which the operator README's RBAC table does not list")
    for t in sorted(documented - granted, key=str):
        errors.append(f"the operator README's RBAC table lists {fmt(t)}, which the chart does not grant")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--namespace", required=True)
    ap.add_argument("--drain", action="store_true")
    ap.add_argument("--reboot", action="store_true", help="operator.rebootForRdmaMode")
    ap.add_argument("--servicemonitor", action="store_true")
    ap.add_argument("--existing-namespace", action="append", default=[],
                    help="a namespace the admin creates (operator.createTestNamespace=false)")
    ap.add_argument("--dra", action="store_true", help="dra.enabled")
    ap.add_argument("--dra-shared", action="store_true", help="dra.sharedPools set")
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
        reboot = [x for x in args if x.startswith("--reboot-for-rdma-mode=")]
        if reboot != [f"--reboot-for-rdma-mode={'true' if a.reboot else 'false'}"]:
            errors.append(f"operator: reboot flag {reboot} does not match rebootForRdmaMode={a.reboot}")
    agents = [c for o in objs if o["kind"] == "DaemonSet" and o["metadata"]["name"].endswith("-node")
              for c in o["spec"]["template"]["spec"]["containers"] if c["name"] == "node-agent"]
    allow = [c for c in agents if "--allow-host-reboot" in (c.get("args") or [])]
    if a.reboot and len(allow) != 1:
        errors.append("rebootForRdmaMode is on but the node agent runs without --allow-host-reboot")
    if not a.reboot and allow:
        errors.append("rebootForRdmaMode is off but the node agent runs with --allow-host-reboot")
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
    if (a.drain or a.reboot) and not evict:
        errors.append("drainHeldVfs or rebootForRdmaMode is on but nobody may create pods/eviction")
    if not (a.drain or a.reboot) and evict:
        errors.append(f"drainHeldVfs and rebootForRdmaMode are off but pods/eviction is granted to {evict}")
    wide_list = [s for s, sc in who_can("", "pods", "list") if sc is None]
    if a.reboot and not any(s.endswith("-operator") for s in wide_list):
        errors.append("rebootForRdmaMode is on but the operator may not list pods cluster-wide")
    if not a.reboot and wide_list:
        errors.append(f"rebootForRdmaMode is off but pods may be listed cluster-wide by {wide_list}")

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

    check_dra(objs, a, errors, who_can)
    check_readme_rbac(perms, a, test_ns, errors)

    sm = [o for o in objs if o["kind"] == "ServiceMonitor"]
    if a.servicemonitor and not sm:
        errors.append("ServiceMonitor expected (monitoring.coreos.com/v1 available) but not rendered")
    if not a.servicemonitor and sm:
        errors.append("ServiceMonitor rendered although monitoring.coreos.com/v1/ServiceMonitor is not served")

    # The node agent's counters (the alert rules' data): a PodMonitor on its
    # named metrics port whenever the ServiceMonitor is rendered.
    pm = [o for o in objs if o["kind"] == "PodMonitor"]
    if a.servicemonitor and not pm:
        errors.append("PodMonitor for the node agent expected with the ServiceMonitor but not rendered")
    if not a.servicemonitor and pm:
        errors.append("PodMonitor rendered although monitoring.coreos.com/v1 is not served")
    for o in pm:
        sel = o["spec"]["selector"]["matchLabels"]
        ports = [p.get("port") for p in o["spec"]["podMetricsEndpoints"]]
        ds = [d for d in objs if d["kind"] == "DaemonSet"
              and all(d["spec"]["template"]["metadata"]["labels"].get(k) == v for k, v in sel.items())]
        named = {p.get("name") for d in ds for c in d["spec"]["template"]["spec"]["containers"]
                 for p in c.get("ports", [])}
        if not ds or not set(ports) <= named:
            errors.append(f"PodMonitor {o['metadata']['name']} selects no DaemonSet with ports {ports}")

    for e in errors:
        print(f"{a.file}: {e}")
    if not errors:
        print(f"{a.file}: objects ok ({len(objs)} objects, perftest namespace {test_ns})")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
