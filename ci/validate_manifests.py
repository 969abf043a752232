#!/usr/bin/env python3
"""Validates rendered Kubernetes manifests offline.

Built-in kinds are checked strictly against the Kubernetes OpenAPI schemas
bundled in `kubernetes-validate`; kroce's own kinds against the
openAPIV3Schema of the CRDs in charts/kroce/crds; a few third-party kinds
(ServiceMonitor, PrometheusRule, NetworkAttachmentDefinition) against the
fields we use.
Any other kind, or any violation, fails.

Usage: validate_manifests.py [--k8s-version 1.37.0] FILE...
"""
import argparse, glob, os, sys

import jsonschema
import kubernetes_validate
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
CRD_DIR = os.path.join(HERE, "..", "charts", "kroce", "crds")

# Minimal schemas for third-party kinds whose CRDs are not ours.
THIRD_PARTY = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): {
        "type": "object",
        "required": ["spec"],
        "properties": {"spec": {"type": "object", "required": ["selector", "endpoints"],
            "properties": {"endpoints": {"type": "array", "minItems": 1, "items": {
                "type": "object", "properties": {"port": {"type": "string"},
                                                  "interval": {"type": "string"}}}}}}},
    },
    ("monitoring.coreos.com/v1", "PodMonitor"): {
        "type": "object",
        "required": ["spec"],
        "properties": {"spec": {"type": "object", "required": ["selector", "podMetricsEndpoints"],
            "properties": {"podMetricsEndpoints": {"type": "array", "minItems": 1, "items": {
                "type": "object", "properties": {"port": {"type": "string"},
                                                  "interval": {"type": "string"}}}}}}},
    },
    # The Prometheus Operator's PrometheusRule, the fields it defines that we use.
    ("monitoring.coreos.com/v1", "PrometheusRule"): {
        "type": "object",
        "required": ["spec"],
        "properties": {"spec": {"type": "object", "additionalProperties": False,
            "properties": {"groups": {"type": "array", "minItems": 1, "items": {
                "type": "object", "required": ["name", "rules"], "additionalProperties": False,
                "properties": {"name": {"type": "string", "minLength": 1},
                               "rules": {"type": "array", "minItems": 1, "items": {
                    "type": "object", "required": ["alert", "expr"], "additionalProperties": False,
                    "properties": {"alert": {"type": "string"}, "expr": {"type": "string"},
                                   "for": {"type": "string", "pattern": "^(0|([0-9]+(ms|s|m|h))+)$"},
                                   "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                                   "annotations": {"type": "object",
                                                   "additionalProperties": {"type": "string"}}}}}}}}}}},
    },
    ("k8s.cni.cncf.io/v1", "NetworkAttachmentDefinition"): {
        "type": "object",
        "properties": {"spec": {"type": "object", "properties": {"config": {"type": "string"}}}},
    },
}


def crd_schemas():
    out = {}
    for path in sorted(glob.glob(os.path.join(CRD_DIR, "*.yaml"))):
        with open(path) as f:
            for crd in yaml.safe_load_all(f):
                if not crd:
                    continue
                group = crd["spec"]["group"]
                kind = crd["spec"]["names"]["kind"]
                for v in crd["spec"]["versions"]:
                    schema = v.get("schema", {}).get("openAPIV3Schema")
                    if schema is not None:
                        out[(f"{group}/{v['name']}", kind)] = schema
    return out


def strip_k8s_extensions(schema):
    """x-kubernetes-* keys are not JSON Schema; int-or-string becomes a union."""
    if isinstance(schema, dict):
        out = {}
        for k, v in schema.items():
            if k == "x-kubernetes-int-or-string" and v:
                out.pop("type", None)
                out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
            elif k.startswith("x-kubernetes-"):
                continue
            else:
                out[k] = strip_k8s_extensions(v)
        if "anyOf" in out:
            out.pop("type", None)
        # kubectl's strict field validation rejects unknown fields, except
        # where the schema preserves them (e.g. opaque IPAM JSON).
        if ("properties" in out and "additionalProperties" not in out
                and not schema.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strip_k8s_extensions(x) for x in schema]
    return schema


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--k8s-version", default="1.37.0")
    ap.add_argument("files", nargs="+")
    args = ap.parse_args()
    ours = {}
    for key, raw in crd_schemas().items():
        schema = strip_k8s_extensions(raw)
        props = schema.setdefault("properties", {})
        for field in ("apiVersion", "kind"):
            props.setdefault(field, {"type": "string"})
        props.setdefault("metadata", {"type": "object"})
        ours[key] = schema
    failures = 0
    count = 0
    for path in args.files:
        with open(path) as f:
            docs = list(yaml.safe_load_all(f))
        for doc in docs:
            if not doc:
                continue
            count += 1
            key = (doc.get("apiVersion"), doc.get("kind"))
            name = f"{path}: {key[1]}/{doc.get('metadata', {}).get('name')}"
            try:
                if key in ours:
                    jsonschema.validate(doc, ours[key])
                elif key in THIRD_PARTY:
                    jsonschema.validate(doc, THIRD_PARTY[key])
                else:
                    kubernetes_validate.validate(doc, args.k8s_version, strict=True)
                print(f"ok      {name}")
            except Exception as e:  # every validator error is a failure
                failures += 1
                msg = str(e).splitlines()[0] if str(e) else repr(e)
                print(f"INVALID {name}: {msg}")
    print(f"validated {count} objects, {failures} invalid")
    return 1 if failures or count == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
