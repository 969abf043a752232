#!/usr/bin/env python3
"""Evaluates the chart's perftest-pods ValidatingAdmissionPolicy (CEL, with
cel-python) on pods: the pod the operator creates for a perftest run must be
admitted; pods needing more than baseline plus IPC_LOCK must be refused, each
by the rule that names why.

cel-python evaluates CEL on JSON values as the API server does for fields
present in the object; it has no Kubernetes schema, so a typo in a field
name shows up as a wrong verdict on the cases below rather than at compile
time.

Usage: check_perftest_policy.py RENDERED.yaml TEST_NAMESPACE
"""
import copy
import sys

import celpy
import yaml

# Mirrors test_pod() in operator/src/controller/admission.rs.
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
            "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}},
        }],
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
    for e in errors:
        print(f"{rendered}: {e}")
    if not errors:
        print(f"{rendered}: perftest pod policy: admits {len(ADMITTED)}, refuses {len(REFUSED)} as expected")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
