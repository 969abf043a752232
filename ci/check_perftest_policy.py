#!/usr/bin/env python3
"""Evaluates the chart's ValidatingAdmissionPolicies (CEL, with cel-python).

The perftest-pods policy on pods: the pod the operator creates for a
perftest run must be admitted; pods needing more than baseline plus IPC_LOCK
must be refused, each by the rule that names why. kroce's own policies
(kroce_policies.py cases below: the controller's Nodes, attachment
definitions, DeviceClasses, ConfigMap/Lease creates; the node agent's own
RdmaNodeState; with --dra the DRA plugin's own ResourceClaims; with
--reboot the render has operator.rebootForRdmaMode on): each write
the code makes is admitted and each write beyond it refused, with the
policy's message.

cel-python evaluates CEL on JSON values as the API server does for fields
present in the object; it has no Kubernetes schema, so a typo in a field
name shows up as a wrong verdict on the cases below rather than at compile
time.

Usage: check_perftest_policy.py RENDERED.yaml TEST_NAMESPACE [--dra] [--reboot]
"""
import copy
import sys

import celpy
import yaml

# Mirrors test_pod() in controller/src/admission/pods.rs.
PERFTEST_POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {
        "name": "run-1-client",
        "labels": {"kroce.io/admission-run": "run-1"},
        "annotations": {"k8s.v1.cni.cncf.io/networks": "kroce-admission-rdma"},
    },
    "spec": {
        "restartPolicy": "Never",
        "activeDeadlineSeconds": 600,
        "terminationGracePeriodSeconds": 5,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]}}},
        "tolerations": [{"key": "kroce.io/rdma-unready", "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [{
            "name": "perftest",
            "image": "kroce-perftest:0.1.0",
            "command": ["kroce-perftest-run", "client"],
            "resources": {"requests": {"cpu": "2", "memory": "1Gi", "rdma/vf": "1"},
                          "limits": {"cpu": "2", "memory": "1Gi", "rdma/vf": "1"}},
            "securityContext": {
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"], "add": ["IPC_LOCK"]},
                "seccompProfile": {"type": "RuntimeDefault"},
            },
        }],
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
    },
}


def mutate(path_value_pairs):
    pod = copy.deepcopy(PERFTEST_POD)
    for path, value in path_value_pairs:
        cur = pod
        for k in path[:-1]:
            cur = cur[k] if isinstance(k, int) else cur.setdefault(k, {})
        cur[path[-1]] = value
    return pod


C0 = ["spec", "containers", 0]
REFUSED = [  # (what, pod, word the refusing message must contain)
    ("privileged container", mutate([(C0 + ["securityContext", "privileged"], True)]), "privileged"),
    ("hostNetwork", mutate([(["spec", "hostNetwork"], True)]), "host's network"),
    ("hostPID", mutate([(["spec", "hostPID"], True)]), "host's network"),
    ("hostIPC", mutate([(["spec", "hostIPC"], True)]), "host's network"),
    ("hostPath volume", mutate([(["spec", "volumes"], [{"name": "root", "hostPath": {"path": "/"}}])]), "host paths"),
    ("SYS_ADMIN", mutate([(C0 + ["securityContext", "capabilities", "add"], ["SYS_ADMIN"])]), "IPC_LOCK"),
    ("IPC_LOCK and NET_ADMIN", mutate([(C0 + ["securityContext", "capabilities", "add"], ["IPC_LOCK", "NET_ADMIN"])]), "IPC_LOCK"),
    ("hostPort", mutate([(C0 + ["ports"], [{"containerPort": 18515, "hostPort": 18515}])]), "host ports"),
    ("seccomp Unconfined (container)", mutate([(C0 + ["securityContext", "seccompProfile"], {"type": "Unconfined"})]), "Unconfined"),
    ("seccomp Unconfined (pod)", mutate([(["spec", "securityContext"], {"seccompProfile": {"type": "Unconfined"}})]), "Unconfined"),
    ("AppArmor Unconfined", mutate([(C0 + ["securityContext", "appArmorProfile"], {"type": "Unconfined"})]), "Unconfined"),
    ("unmasked /proc", mutate([(C0 + ["securityContext", "procMount"], "Unmasked")]), "unmask"),
    ("SELinux user", mutate([(["spec", "securityContext"], {"seLinuxOptions": {"user": "system_u"}})]), "SELinux"),
    ("SELinux spc_t", mutate([(C0 + ["securityContext", "seLinuxOptions"], {"type": "spc_t"})]), "SELinux"),
    ("unsafe sysctl", mutate([(["spec", "securityContext"], {"sysctls": [{"name": "kernel.msgmax", "value": "1"}]})]), "sysctls"),
    ("privileged init container", mutate([(["spec", "initContainers"], [{"name": "i", "image": "x", "securityContext": {"privileged": True}}])]), "privileged"),
    ("ephemeral container with SYS_PTRACE", mutate([(["spec", "ephemeralContainers"], [{"name": "e", "image": "x", "securityContext": {"capabilities": {"add": ["SYS_PTRACE"]}}}])]), "IPC_LOCK"),
]
ADMITTED = [
    ("the operator's perftest pod", PERFTEST_POD),
    ("a pod without any securityContext", mutate([(C0, {"name": "c", "image": "x"})])),
    ("RuntimeDefault seccomp, container_t, safe sysctl, emptyDir", mutate([
        (["spec", "securityContext"], {"seccompProfile": {"type": "RuntimeDefault"},
                                       "seLinuxOptions": {"type": "container_t"},
                                       "sysctls": [{"name": "net.ipv4.ping_group_range", "value": "0 0"}]}),
        (["spec", "volumes"], [{"name": "scratch", "emptyDir": {}}]),
        (C0 + ["securityContext", "procMount"], "Default"),
    ])),
]


def main():
    rendered, test_ns = sys.argv[1], sys.argv[2]
    with open(rendered) as f:
        objs = [o for o in yaml.safe_load_all(f) if o]
    errors = []
    policies = [o for o in objs if o["kind"] == "ValidatingAdmissionPolicy"
                and (o["spec"]["matchConstraints"].get("namespaceSelector") or {})
                .get("matchLabels", {}).get("kubernetes.io/metadata.name") == test_ns]
    if len(policies) != 1:
        print(f"{rendered}: expected one ValidatingAdmissionPolicy for namespace {test_ns}, found {len(policies)}")
        return 1
    policy = policies[0]
    pname = policy["metadata"]["name"]
    bindings = [o for o in objs if o["kind"] == "ValidatingAdmissionPolicyBinding"
                and o["spec"]["policyName"] == pname]
    if len(bindings) != 1 or bindings[0]["spec"].get("validationActions") != ["Deny"]:
        errors.append(f"policy {pname}: expected one binding with validationActions [Deny], got {bindings}")
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    if not any("pods" in r["resources"] and "CREATE" in r["operations"] for r in rules):
        errors.append(f"policy {pname} does not match pod creation: {rules}")

    env = celpy.Environment()
    programs = []
    for v in policy["spec"]["validations"]:
        try:
            programs.append((env.program(env.compile(v["expression"])), v["message"]))
        except celpy.CELParseError as e:
            errors.append(f"policy {pname}: does not compile: {v['expression']!r}: {e}")

    def refusals(pod):
        out = []
        act = {"object": celpy.json_to_cel(pod)}
        for prog, msg in programs:
            try:
                ok = prog.evaluate(act)
            except celpy.CELEvalError as e:
                out.append(f"evaluation error ({msg}): {e}")
                continue
            if isinstance(ok, celpy.CELEvalError) or not isinstance(ok, celpy.celtypes.BoolType) or not bool(ok):
                out.append(msg)
        return out

    for what, pod in ADMITTED:
        got = refusals(pod)
        if got:
            errors.append(f"refuses {what}: {got}")
    for what, pod, word in REFUSED:
        got = refusals(pod)
        if not got:
            errors.append(f"admits {what}")
        elif not any(word in m for m in got):
            errors.append(f"refuses {what} but not saying {word!r}: {got}")
    n_cases = check_kroce_policies(objs, test_ns, "--dra" in sys.argv[3:], errors,
                                   reboot="--reboot" in sys.argv[3:])
    for e in errors:
        print(f"{rendered}: {e}")
    if not errors:
        print(f"{rendered}: perftest pod policy: admits {len(ADMITTED)}, refuses {len(REFUSED)} as expected; "
              f"kroce's policies: {n_cases} cases as expected")
    return 1 if errors else 0


# ---------------------------------------------------------------------------
# kroce's own policies: a request as the API server builds it for admission.

RELEASE_NS = "kroce-system"
OPERATOR = f"system:serviceaccount:{RELEASE_NS}:kroce-operator"
NODE_SA = f"system:serviceaccount:{RELEASE_NS}:kroce-node"
NODE_NAME_KEY = "authentication.kubernetes.io/node-name"


def request(op, resource, user, node=None, group="", sub=""):
    extra = {NODE_NAME_KEY: [node]} if node else {}
    return {"operation": op, "resource": {"group": group, "version": "v1", "resource": resource},
            "subResource": sub, "userInfo": {"username": user, "extra": extra}}


def policy_verdict(policy, req, obj, old, params=None):
    """None when the policy does not apply (matchConditions); else the
    messages of the validations that fail (empty: admitted)."""
    env = celpy.Environment()
    act = {"request": celpy.json_to_cel(req), "object": celpy.json_to_cel(obj),
           "oldObject": celpy.json_to_cel(old), "params": celpy.json_to_cel(params)}

    def run(expr):
        return env.program(env.compile(expr)).evaluate(act)

    for m in policy["spec"].get("matchConditions", []):
        if not bool(run(m["expression"])):
            return None
    variables = {}
    for v in policy["spec"].get("variables", []):
        variables[v["name"]] = run(v["expression"])
        act["variables"] = celpy.celtypes.MapType(
            {celpy.celtypes.StringType(k): x for k, x in variables.items()})
    out = []
    for v in policy["spec"]["validations"]:
        try:
            ok = run(v["expression"])
        except celpy.CELEvalError as e:
            out.append(f"evaluation error: {e}")
            continue
        if isinstance(ok, celpy.CELEvalError) or not bool(ok):
            msg = v.get("message")
            if msg is None:
                try:
                    msg = str(run(v["messageExpression"]))
                except celpy.CELEvalError as e:
                    msg = f"messageExpression fails: {e}"
            out.append(msg)
    return out


def node(labels=None, annotations=None, taints=None, unschedulable=None, provider="aws:///i-1"):
    spec = {"providerID": provider}
    if taints is not None:
        spec["taints"] = taints
    if unschedulable is not None:
        spec["unschedulable"] = unschedulable
    meta = {"name": "node-a", "labels": {"kubernetes.io/hostname": "node-a", **(labels or {})}}
    if annotations is not None:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Node", "metadata": meta, "spec": spec}


ADMIN_TAINT = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}
KROCE_TAINT = {"key": "kroce.io/rdma-unready", "effect": "NoSchedule"}
READY = {"kroce.io/rdma-ready": "true"}
DRAIN = {"kroce.io/drain": "cordoned"}


def nad(name, ns, labels):
    return {"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
            "metadata": {"name": name, "namespace": ns, "labels": labels},
            "spec": {"config": '{"cniVersion":"1.0.0","name":"%s","type":"kroce-cni"}' % name}}


KROCE_NAD = {"app.kubernetes.io/managed-by": "kroce-operator", "kroce.io/network": "fast"}
FAST = {"apiVersion": "kroce.io/v1alpha1", "kind": "RdmaNetwork", "metadata": {"name": "fast"},
        "spec": {"nicSelector": {"pfNames": ["ens1f0"]}, "numVfs": 4, "networkNamespaces": ["team-a"]}}
OTHER = {"apiVersion": "kroce.io/v1alpha1", "kind": "RdmaNetwork", "metadata": {"name": "other"},
         "spec": {"nicSelector": {"pfNames": ["ens2f0"]}, "numVfs": 4}}


def device_class(name, labels):
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": name, "labels": labels}, "spec": {}}


def claim(node_name, devices=None, reserved=None):
    st = {"allocation": {"devices": {"results": [{"request": "vf", "driver": "rdma.kroce.io",
                                                  "pool": node_name, "device": "vf-0"}]},
                         "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                             {"key": "metadata.name", "operator": "In", "values": [node_name]}]}]}},
          "reservedFor": [{"resource": "pods", "name": "p", "uid": "u1"}] if reserved is None else reserved}
    if devices is not None:
        st["devices"] = devices
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "team-a"}, "status": st}


KROCE_DEV = {"driver": "rdma.kroce.io", "pool": "node-a", "device": "vf-0",
             "networkData": {"interfaceName": "net1", "ips": ["10.56.0.7/24"]}}
GPU_DEV = {"driver": "gpu.example.com", "pool": "node-a", "device": "gpu-0"}


def state(name):
    return {"apiVersion": "kroce.io/v1alpha1", "kind": "RdmaNodeState", "metadata": {"name": name},
            "spec": {"nodeName": name, "pfs": []}}


DRAIN_STARTED = {"kroce.io/drain": "cordoned", "kroce.io/drain-started": "2026-12-05T08:00:00Z"}
DRAIN_TIMED_OUT = {"kroce.io/drain-timed-out": "2"}


def kroce_policy_cases(test_ns):
    """(policy name suffix, what, request, object, oldObject, params,
    None: admitted | a word the refusing message must contain)."""
    upd_node = request("UPDATE", "nodes", OPERATOR)
    nad_req = lambda op, ns: dict(request(op, "network-attachment-definitions", OPERATOR, group="k8s.cni.cncf.io"))
    dc = lambda op: request(op, "deviceclasses", OPERATOR, group="resource.k8s.io")
    plain = node(taints=[ADMIN_TAINT])
    return [
        # Nodes (the controller).
        ("operator-nodes", "admission label added", upd_node, node(READY, taints=[ADMIN_TAINT]), plain, None, None),
        ("operator-nodes", "admission label removed", upd_node, plain, node(READY, taints=[ADMIN_TAINT]), None, None),
        ("operator-nodes", "admission taint added", upd_node, node(taints=[ADMIN_TAINT, KROCE_TAINT]), plain, None, None),
        ("operator-nodes", "admission taint removed", upd_node, plain, node(taints=[ADMIN_TAINT, KROCE_TAINT]), None, None),
        ("operator-nodes", "drain mark and cordon", upd_node, node(annotations=DRAIN, taints=[ADMIN_TAINT], unschedulable=True), plain, None, None),
        # The disruption budget's drain (controller/src/drain.rs): start
        # time with the mark, a timed-out record instead of the cordon.
        ("operator-nodes", "drain start: mark, start time, cordon", upd_node, node(annotations=DRAIN_STARTED, taints=[ADMIN_TAINT], unschedulable=True), plain, None, None),
        ("operator-nodes", "drain timed out: mark and cordon cleared, record set", upd_node, node(annotations=DRAIN_TIMED_OUT, taints=[ADMIN_TAINT]), node(annotations=DRAIN_STARTED, taints=[ADMIN_TAINT], unschedulable=True), None, None),
        ("operator-nodes", "timed-out record forgotten", upd_node, node(annotations={}, taints=[ADMIN_TAINT]), node(annotations=DRAIN_TIMED_OUT, taints=[ADMIN_TAINT]), None, None),
        ("operator-nodes", "cordon with only the timed-out record", upd_node, node(annotations=DRAIN_TIMED_OUT, taints=[ADMIN_TAINT], unschedulable=True), node(annotations=DRAIN_TIMED_OUT, taints=[ADMIN_TAINT]), None, "cordon"),
        ("operator-nodes", "another kroce.io annotation", upd_node, node(annotations={"kroce.io/other": "x"}, taints=[ADMIN_TAINT]), plain, None, "annotation"),
        ("operator-nodes", "drain done: mark and cordon cleared", upd_node, node(annotations={}, taints=[ADMIN_TAINT]), node(annotations=DRAIN, taints=[ADMIN_TAINT], unschedulable=True), None, None),
        ("operator-nodes", "another user relabels (not matched)", request("UPDATE", "nodes", "admin"), node({"role": "x"}), plain, None, None),
        ("operator-nodes", "another label changed", upd_node, node({"node-role.kubernetes.io/worker": ""}, taints=[ADMIN_TAINT]), plain, None, "Node label"),
        ("operator-nodes", "admission label not true", upd_node, node({"kroce.io/rdma-ready": "false"}, taints=[ADMIN_TAINT]), plain, None, "only to"),
        ("operator-nodes", "the admin's taint removed", upd_node, node(taints=[]), plain, None, "taint"),
        ("operator-nodes", "a foreign taint added", upd_node, node(taints=[ADMIN_TAINT, {"key": "x", "effect": "NoExecute"}]), plain, None, "taint"),
        ("operator-nodes", "admission taint as NoExecute", upd_node, node(taints=[ADMIN_TAINT, dict(KROCE_TAINT, effect="NoExecute")]), plain, None, "taint"),
        ("operator-nodes", "cordon without the drain mark", upd_node, node(taints=[ADMIN_TAINT], unschedulable=True), plain, None, "cordon"),
        ("operator-nodes", "another annotation", upd_node, node(annotations={"x": "y"}, taints=[ADMIN_TAINT]), plain, None, "annotation"),
        ("operator-nodes", "providerID changed", upd_node, node(taints=[ADMIN_TAINT], provider="x"), plain, None, "spec field"),
        # Attachment definitions (the controller).
        ("operator-nads", "network NAD created", nad_req("CREATE", "team-a"), nad("fast", "team-a", KROCE_NAD), None, None, None),
        ("operator-nads", "network NAD updated", nad_req("UPDATE", "team-a"), nad("fast", "team-a", KROCE_NAD), nad("fast", "team-a", KROCE_NAD), None, None),
        ("operator-nads", "network NAD deleted", nad_req("DELETE", "team-a"), None, nad("fast", "team-a", KROCE_NAD), None, None),
        ("operator-nads", "test NAD applied", nad_req("CREATE", test_ns), nad("kroce-admission-fast", test_ns, {"app.kubernetes.io/managed-by": "kroce-operator", "kroce.io/admission-network": "fast"}), None, None, None),
        ("operator-nads", "unlabelled NAD in kube-system", nad_req("CREATE", "kube-system"), nad("host", "kube-system", {}), None, None, "managed-by"),
        ("operator-nads", "the admin's NAD taken over", nad_req("UPDATE", "team-a"), nad("fast", "team-a", KROCE_NAD), nad("fast", "team-a", {}), None, "managed-by"),
        ("operator-nads", "the admin's NAD deleted", nad_req("DELETE", "team-a"), None, nad("fast", "team-a", {"kroce.io/network": "fast"}), None, "managed-by"),
        ("operator-nads", "NAD not named after its network", nad_req("CREATE", "team-a"), nad("other", "team-a", KROCE_NAD), None, None, "named after"),
        ("operator-nad-namespaces", "in a namespace its network names", nad_req("CREATE", "team-a"), nad("fast", "team-a", KROCE_NAD), None, FAST, None),
        ("operator-nad-namespaces", "checked against another network", nad_req("CREATE", "kube-system"), nad("fast", "kube-system", KROCE_NAD), None, OTHER, None),
        ("operator-nad-namespaces", "the perftest namespace", nad_req("CREATE", test_ns), nad("kroce-admission-fast", test_ns, {}), None, FAST, None),
        ("operator-nad-namespaces", "in a namespace its network does not name", nad_req("CREATE", "kube-system"), nad("fast", "kube-system", KROCE_NAD), None, FAST, "does not name namespace kube-system"),
        # DeviceClasses (the controller).
        ("operator-deviceclasses", "own class created", dc("CREATE"), device_class("fast", {"kroce.io/network": "fast"}), None, None, None),
        ("operator-deviceclasses", "own class deleted", dc("DELETE"), None, device_class("fast", {"kroce.io/network": "fast"}), None, None),
        ("operator-deviceclasses", "someone else's class deleted", dc("DELETE"), None, device_class("gpu.example.com", {}), None, "DeviceClasses labelled"),
        ("operator-deviceclasses", "someone else's class relabelled", dc("UPDATE"), device_class("gpu", {"kroce.io/network": "gpu"}), device_class("gpu", {}), None, "DeviceClasses labelled"),
        ("operator-deviceclasses", "label of another name", dc("CREATE"), device_class("gpu", {"kroce.io/network": "fast"}), None, None, "DeviceClasses labelled"),
        # ConfigMap and Lease creates (the controller, release namespace).
        ("operator-creates", "its ConfigMap", request("CREATE", "configmaps", OPERATOR), {"metadata": {"name": "kroce-device-plugin"}}, None, None, None),
        ("operator-creates", "its Lease", request("CREATE", "leases", OPERATOR, group="coordination.k8s.io"), {"metadata": {"name": "kroce-operator"}}, None, None, None),
        ("operator-creates", "another ConfigMap", request("CREATE", "configmaps", OPERATOR), {"metadata": {"name": "coredns"}}, None, None, "not configmaps coredns"),
        ("operator-creates", "another Lease", request("CREATE", "leases", OPERATOR, group="coordination.k8s.io"), {"metadata": {"name": "kube-scheduler"}}, None, None, "not leases kube-scheduler"),
        # The node agent's own RdmaNodeState.
        ("node-own-state", "its own node", request("UPDATE", "rdmanodestates", NODE_SA, node="node-a", group="kroce.io", sub="status"), state("node-a"), state("node-a"), None, None),
        ("node-own-state", "another node", request("UPDATE", "rdmanodestates", NODE_SA, node="node-a", group="kroce.io", sub="status"), state("node-b"), state("node-b"), None, "node 'node-a' may only update the RdmaNodeState of its own node, not 'node-b'"),
        ("node-own-state", "a token that is not node-bound", request("UPDATE", "rdmanodestates", NODE_SA, group="kroce.io", sub="status"), state("node-a"), state("node-a"), None, "not node-bound"),
    ]


PENDING = {"kroce.io/rdma-netns-mode-pending": "reboot-required"}
REBOOT_STARTED = {"kroce.io/reboot": "cordoned", "kroce.io/reboot-started": "2026-12-05T08:00:00Z"}
REBOOT_TIMED_OUT = {"kroce.io/reboot-timed-out": "2"}


def reboot_policy_cases(reboot):
    """The RDMA netns mode's node label (always) and the reboot's marks
    (controller/src/reboot.rs): set only with operator.rebootForRdmaMode,
    removable always (releasing nodes after the flag went off)."""
    upd_node = request("UPDATE", "nodes", OPERATOR)
    plain = node(taints=[ADMIN_TAINT])
    on = lambda word: None if reboot else word
    return [
        ("operator-nodes", "netns-mode pending label added", upd_node, node(PENDING, taints=[ADMIN_TAINT]), plain, None, None),
        ("operator-nodes", "netns-mode pending label removed", upd_node, plain, node(PENDING, taints=[ADMIN_TAINT]), None, None),
        ("operator-nodes", "netns-mode pending label with another value", upd_node, node({"kroce.io/rdma-netns-mode-pending": "yes"}, taints=[ADMIN_TAINT]), plain, None, "only to"),
        ("operator-nodes", "reboot start: mark, start time, cordon", upd_node, node(annotations=REBOOT_STARTED, taints=[ADMIN_TAINT], unschedulable=True), plain, None, on("annotation")),
        ("operator-nodes", "reboot timed out: mark and cordon cleared, record set", upd_node, node(annotations=REBOOT_TIMED_OUT, taints=[ADMIN_TAINT]), node(annotations=REBOOT_STARTED, taints=[ADMIN_TAINT], unschedulable=True), None, on("annotation")),
        ("operator-nodes", "reboot done: mark and cordon cleared", upd_node, node(annotations={}, taints=[ADMIN_TAINT]), node(annotations=REBOOT_STARTED, taints=[ADMIN_TAINT], unschedulable=True), None, None),
        ("operator-nodes", "reboot timed-out record forgotten", upd_node, node(annotations={}, taints=[ADMIN_TAINT]), node(annotations=REBOOT_TIMED_OUT, taints=[ADMIN_TAINT]), None, None),
        ("operator-nodes", "cordon with only the reboot timed-out record", upd_node, node(annotations=REBOOT_TIMED_OUT, taints=[ADMIN_TAINT], unschedulable=True), node(annotations=REBOOT_TIMED_OUT, taints=[ADMIN_TAINT]), None, "cordon"),
        ("operator-nodes", "reboot mark changed", upd_node, node(annotations={"kroce.io/reboot": "already-cordoned"}, taints=[ADMIN_TAINT]), node(annotations={"kroce.io/reboot": "cordoned"}, taints=[ADMIN_TAINT]), None, on("annotation")),
    ]


def dra_policy_cases():
    upd = lambda n: request("UPDATE", "resourceclaims", NODE_SA, node=n, group="resource.k8s.io", sub="status")
    return [
        ("dra-own-claims", "network data of its own claim", upd("node-a"), claim("node-a", [KROCE_DEV]), claim("node-a"), None, None),
        ("dra-own-claims", "another node's claim", upd("node-b"), claim("node-a", [KROCE_DEV]), claim("node-a"), None, "claims allocated on that node"),
        ("dra-own-claims", "a token that is not node-bound", upd(None), claim("node-a", [KROCE_DEV]), claim("node-a"), None, "node-bound"),
        ("dra-own-claims", "reservations changed", upd("node-a"), claim("node-a", [KROCE_DEV], reserved=[]), claim("node-a"), None, "allocation or reservations"),
        ("dra-own-claims", "another driver's entry changed", upd("node-a"), claim("node-a", [KROCE_DEV]), claim("node-a", [GPU_DEV]), None, "its own driver"),
    ]


def check_kroce_policies(objs, test_ns, dra, errors, reboot=False):
    policies = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ValidatingAdmissionPolicy"}
    bindings = {o["spec"]["policyName"]: o for o in objs if o["kind"] == "ValidatingAdmissionPolicyBinding"}
    cases = kroce_policy_cases(test_ns) + reboot_policy_cases(reboot) + (dra_policy_cases() if dra else [])
    for suffix in {c[0] for c in cases}:
        name = f"kroce-{suffix}"
        if name not in policies:
            errors.append(f"policy {name} not rendered")
        elif "Deny" not in (bindings.get(name, {}).get("spec", {}).get("validationActions") or []):
            errors.append(f"policy {name}: no Deny binding")
    for suffix, what, req, obj, old, params, word in cases:
        policy = policies.get(f"kroce-{suffix}")
        if policy is None:
            continue
        if policy["spec"].get("paramKind") and params is None:
            errors.append(f"{suffix}: {what}: the policy takes params, the case gives none")
            continue
        res = req["resource"]["resource"] + ("/" + req["subResource"] if req["subResource"] else "")
        rules = policy["spec"]["matchConstraints"]["resourceRules"]
        if not any(res in r["resources"] and req["operation"] in r["operations"] for r in rules):
            errors.append(f"{suffix}: {what}: the policy does not match {req['operation']} {res}")
            continue
        try:
            got = policy_verdict(policy, req, obj, old, params)
        except Exception as e:  # noqa: BLE001 - any CEL trouble is a failed check
            errors.append(f"{suffix}: {what}: cannot evaluate: {type(e).__name__}: {e}")
            continue
        if word is None and got:
            errors.append(f"{suffix}: refuses {what}: {got}")
        elif word is not None and not got:
            errors.append(f"{suffix}: admits {what}" + (" (matchConditions do not match)" if got is None else ""))
        elif word is not None and not any(word in m for m in got):
            errors.append(f"{suffix}: refuses {what} but not saying {word!r}: {got}")
    return len(cases)


if __name__ == "__main__":
    sys.exit(main())
