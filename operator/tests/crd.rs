#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The committed CRD YAML must be exactly what the Rust types generate, and
//! the schema must carry the validation the admin relies on.

use kroce_operator::crd::{
    RdmaNetwork, RdmaNodeState, crds_yaml, rdma_network_crd, rdma_node_state_crd,
};
use kube::CustomResourceExt;
use std::path::PathBuf;

fn committed_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../charts/kroce/crds/kroce.io_crds.yaml")
}

#[test]
fn committed_crds_match_generated() {
    let generated = crds_yaml().unwrap();
    if std::env::var_os("KROCE_UPDATE_CRDS").is_some() {
        std::fs::create_dir_all(committed_path().parent().unwrap()).unwrap();
        std::fs::write(committed_path(), &generated).unwrap();
    }
    let committed = std::fs::read_to_string(committed_path()).unwrap_or_default();
    assert!(
        committed == generated,
        "{} drifted from the Rust types: run `kroce-controller crd > charts/kroce/crds/kroce.io_crds.yaml` \
         (or KROCE_UPDATE_CRDS=1 cargo test -p kroce-operator --test crd)",
        committed_path().display()
    );
}

fn network_schema() -> serde_json::Value {
    let crd = serde_json::to_value(rdma_network_crd()).unwrap();
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"].clone()
}

fn num(v: &serde_json::Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("{v} is not a number"))
}

#[test]
fn network_schema_validates_fields() {
    let spec = network_schema();
    let props = &spec["properties"];
    let required: Vec<&str> = spec["required"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    // numVfs is optional: soft-device networks (ifNames) have none; the CEL
    // rules (below) require it with PF selectors.
    assert_eq!(required, ["nicSelector"]);
    assert_eq!(num(&props["numVfs"]["minimum"]), 0.0);
    let if_names = &props["nicSelector"]["properties"]["ifNames"];
    assert_eq!(num(&if_names["items"]["maxLength"]), 15.0);
    assert!(if_names["items"]["pattern"].is_string());
    assert_eq!(num(&props["vlan"]["maximum"]), 4094.0);
    assert_eq!(num(&props["vlanQoS"]["maximum"]), 7.0);
    assert_eq!(props["ipam"]["x-kubernetes-preserve-unknown-fields"], true);
    let qos = &props["qos"]["properties"];
    assert_eq!(num(&qos["pfcPriority"]["maximum"]), 7.0);
    assert_eq!(num(&qos["pfcPriority"]["default"]), 3.0);
    let trust: Vec<&str> = qos["trust"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(trust, ["dscp", "pcp"]);
    let irq = &props["irqAffinity"]["properties"];
    assert!(irq["policy"]["enum"].to_string().contains("numaLocal"));
    assert!(irq["reservedCpus"]["pattern"].is_string());
    let adm = &props["admission"]["properties"];
    for f in [
        "enabled",
        "minBandwidthGbps",
        "minBandwidthFraction",
        "maxLatencyUs",
        "maxP99LatencyUs",
        "durationSeconds",
        "messageSize",
        "queuePairs",
        "iterations",
        "image",
        "maxConcurrentNodes",
        "retestIntervalSeconds",
        "gate",
    ] {
        assert!(
            adm.get(f).is_some(),
            "admission.{f} missing from the schema"
        );
    }
    assert_eq!(num(&adm["minBandwidthFraction"]["maximum"]), 1.0);
}

#[test]
fn crds_are_cluster_scoped_with_status_and_columns() {
    for crd in [RdmaNetwork::crd(), RdmaNodeState::crd()] {
        let v = serde_json::to_value(&crd).unwrap();
        assert_eq!(v["spec"]["scope"], "Cluster");
        assert_eq!(v["spec"]["group"], "kroce.io");
        let ver = &v["spec"]["versions"][0];
        assert_eq!(ver["name"], "v1alpha1");
        assert!(ver["subresources"]["status"].is_object());
    }
    let v = serde_json::to_value(RdmaNetwork::crd()).unwrap();
    let cols: Vec<String> = v["spec"]["versions"][0]["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(cols, ["VFs", "Resource", "Ready", "Matched", "Age"]);
}

#[test]
fn generated_yaml_parses_back_as_two_crds() {
    let yaml = crds_yaml().unwrap();
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&yaml).unwrap();
    let kinds: Vec<&str> = docs
        .iter()
        .map(|d| d["spec"]["names"]["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["RdmaNetwork", "RdmaNodeState"]);
}

fn read_yaml(rel: &str) -> serde_json::Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel);
    serde_saphyr::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// The RdmaNetwork CRD's `x-kubernetes-validations`, evaluated by a CEL
/// interpreter with Kubernetes semantics, as the API server would.
fn cel_errors(obj: &serde_json::Value) -> Vec<String> {
    let crd = serde_json::to_value(rdma_network_crd()).unwrap();
    let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    match kube::core::cel::Validator::new().validate(schema, obj, None) {
        Ok(()) => vec![],
        Err(e) => e.into_vec().into_iter().map(|e| e.message).collect(),
    }
}

fn network(spec: serde_json::Value) -> serde_json::Value {
    serde_json::json!({"apiVersion": "kroce.io/v1alpha1", "kind": "RdmaNetwork",
                       "metadata": {"name": "n"}, "spec": spec})
}

#[test]
fn the_kind_rxe_network_is_valid_in_the_schema_and_the_controller() {
    let obj = read_yaml("../e2e/kind/rdmanetwork-rxe.yaml");
    assert_eq!(cel_errors(&obj), Vec::<String>::new());
    let net: RdmaNetwork = serde_json::from_value(obj).unwrap();
    assert_eq!(net.spec.nic_selector.if_names, ["kvf0", "kvf1"]);
    assert_eq!(
        kroce_operator::plan::validate_network("rxe", &net.spec),
        Ok(())
    );
}

#[test]
fn cel_rules_reject_what_the_controller_rejects() {
    let cases = [
        (
            serde_json::json!({"nicSelector": {"pfNames": ["ens1f0"]}}),
            "numVfs (at least 1) is required",
        ),
        (
            serde_json::json!({"nicSelector": {"vendor": "15b3"}, "numVfs": 0}),
            "numVfs (at least 1) is required",
        ),
        (
            serde_json::json!({"nicSelector": {"ifNames": ["kvf0"]}, "numVfs": 4}),
            "numVfs must be unset (or 0) with nicSelector.ifNames",
        ),
        (
            serde_json::json!({"nicSelector": {"ifNames": ["kvf0"], "rootDevices": ["0000:3b:00.0"]}, "numVfs": 4}),
            "ifNames (soft devices) cannot be combined",
        ),
    ];
    for (spec, want) in cases {
        let errs = cel_errors(&network(spec.clone()));
        assert!(
            errs.iter().any(|e| e.contains(want)),
            "{spec}: expected {want:?}, got {errs:?}"
        );
        let parsed: kroce_operator::crd::RdmaNetworkSpec = serde_json::from_value(spec).unwrap();
        assert!(kroce_operator::plan::validate_network("n", &parsed).is_err());
    }
    let ok = network(serde_json::json!({"nicSelector": {"pfNames": ["ens1f0#0-3"]}, "numVfs": 8}));
    assert_eq!(cel_errors(&ok), Vec::<String>::new());
}

/// Every `format` in both CRDs is one the API server knows: schemars'
/// uint8..uint64 made every apply print "unrecognized format" warnings.
#[test]
fn crds_carry_only_formats_the_api_server_knows() {
    fn formats(v: &serde_json::Value, path: &str, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                if let Some(f) = m.get("format").and_then(|f| f.as_str()) {
                    out.push(format!("{path}: {f}"));
                }
                for (k, v) in m {
                    formats(v, &format!("{path}.{k}"), out);
                }
            }
            serde_json::Value::Array(a) => {
                for (i, v) in a.iter().enumerate() {
                    formats(v, &format!("{path}[{i}]"), out);
                }
            }
            _ => {}
        }
    }
    // k8s.io/kube-openapi's known formats that schemars can produce.
    let known = [
        "int32",
        "int64",
        "float",
        "double",
        "date-time",
        "date",
        "byte",
    ];
    let mut found = Vec::new();
    for crd in [rdma_network_crd(), rdma_node_state_crd()] {
        formats(&serde_json::to_value(crd).unwrap(), "", &mut found);
    }
    let unknown: Vec<&String> = found
        .iter()
        .filter(|f| !known.iter().any(|k| f.ends_with(&format!(": {k}"))))
        .collect();
    assert!(unknown.is_empty(), "{unknown:#?}");
    // The ranges stay.
    let props = &network_schema()["properties"];
    assert_eq!(num(&props["vlan"]["minimum"]), 0.0);
    assert_eq!(num(&props["numVfs"]["maximum"]), 4096.0);
    assert!(props["vlan"].get("format").is_none(), "{}", props["vlan"]);
    let yaml = crds_yaml().unwrap();
    assert!(
        !yaml.contains("format: uint"),
        "the shipped YAML still has uint formats"
    );
}

/// Inputs the API server admitted and that broke later: the schema (CEL as
/// the API server evaluates it) and the controller's validation must both
/// refuse them, each naming the field; good ones pass both.
#[test]
fn schema_and_controller_agree_on_what_broke_later() {
    let long = "n".repeat(64);
    // (case, name, spec, the field the controller names, a piece of the CEL message)
    let bad = [
        (
            "name longer than 63",
            long.as_str(),
            serde_json::json!({"nicSelector": {"pfNames": ["ens1f0"]}, "numVfs": 4}),
            "metadata.name",
            "metadata.name must be at most 63",
        ),
        (
            "namespace not a DNS label",
            "n",
            serde_json::json!({"nicSelector": {"pfNames": ["ens1f0"]}, "numVfs": 4,
                               "networkNamespaces": ["team-a", "Team_B"]}),
            "spec.networkNamespaces[1]",
            "networkNamespaces entries must be namespace names",
        ),
        (
            "vlanQoS without vlan",
            "n",
            serde_json::json!({"nicSelector": {"pfNames": ["ens1f0"]}, "numVfs": 4, "vlanQoS": 3}),
            "spec.vlanQoS",
            "vlanQoS needs a non-zero vlan",
        ),
        (
            "vlanQoS with vlan 0",
            "n",
            serde_json::json!({"nicSelector": {"pfNames": ["ens1f0"]}, "numVfs": 4, "vlan": 0, "vlanQoS": 3}),
            "spec.vlanQoS",
            "vlanQoS needs a non-zero vlan",
        ),
        (
            "VF range beyond numVfs",
            "n",
            serde_json::json!({"nicSelector": {"pfNames": ["ens1f0", "ens1f1#2-9"]}, "numVfs": 8}),
            "spec.nicSelector.pfNames[1]",
            "nicSelector.pfNames uses a VF index at or above numVfs",
        ),
        (
            "VF list beyond numVfs",
            "n",
            serde_json::json!({"nicSelector": {"pfNames": ["ens1f0#0,8"]}, "numVfs": 8}),
            "spec.nicSelector.pfNames[0]",
            "nicSelector.pfNames uses a VF index at or above numVfs",
        ),
        (
            "malformed pfNames entry",
            "n",
            serde_json::json!({"nicSelector": {"pfNames": ["ens1f0#x"]}, "numVfs": 8}),
            "spec.nicSelector.pfNames[0]",
            "pfNames entries are a netdev name",
        ),
        (
            "empty nicSelector",
            "n",
            serde_json::json!({"nicSelector": {}, "numVfs": 4}),
            "spec.nicSelector",
            "nicSelector is empty",
        ),
        (
            "nicSelector with only empty lists",
            "n",
            serde_json::json!({"nicSelector": {"pfNames": [], "ifNames": []}, "numVfs": 4}),
            "spec.nicSelector",
            "nicSelector is empty",
        ),
        (
            "ipam subnet not a CIDR",
            "n",
            serde_json::json!({"nicSelector": {"pfNames": ["ens1f0"]}, "numVfs": 4,
                               "ipam": {"type": "host-local", "subnet": "10.56.0.0/33"}}),
            "spec.ipam.subnet",
            "ipam.subnet must be a CIDR",
        ),
        (
            "ipam subnet with host bits",
            "n",
            serde_json::json!({"nicSelector": {"pfNames": ["ens1f0"]}, "numVfs": 4,
                               "ipam": {"type": "host-local", "subnet": "10.0.0.5/24"}}),
            "spec.ipam.subnet",
            "ipam.subnet has host bits set",
        ),
        (
            "ipam rangeStart outside the subnet",
            "n",
            serde_json::json!({"nicSelector": {"pfNames": ["ens1f0"]}, "numVfs": 4,
                               "ipam": {"type": "host-local", "subnet": "10.0.0.0/24",
                                        "rangeStart": "10.0.1.10"}}),
            "spec.ipam.rangeStart",
            "ipam.rangeStart must be an address inside ipam.subnet",
        ),
        (
            "ipam rangeEnd that is no address",
            "n",
            serde_json::json!({"nicSelector": {"pfNames": ["ens1f0"]}, "numVfs": 4,
                               "ipam": {"type": "host-local", "subnet": "10.0.0.0/24",
                                        "rangeEnd": "ten"}}),
            "spec.ipam.rangeEnd",
            "ipam.rangeEnd must be an address inside ipam.subnet",
        ),
        (
            "memlock that is no quantity",
            "n",
            serde_json::json!({"nicSelector": {"pfNames": ["ens1f0"]}, "numVfs": 4,
                               "memlock": "64g"}),
            "spec.memlock",
            "memlock must be \"unlimited\" or a whole number of bytes",
        ),
        (
            "maxUnavailable of zero percent",
            "n",
            serde_json::json!({"nicSelector": {"pfNames": ["ens1f0"]}, "numVfs": 4,
                               "maxUnavailable": "0%"}),
            "spec.maxUnavailable",
            "maxUnavailable must be a whole number of nodes",
        ),
        (
            "ipam subnet without a prefix",
            "n",
            serde_json::json!({"nicSelector": {"pfNames": ["ens1f0"]}, "numVfs": 4,
                               "ipam": {"type": "host-local", "subnet": "10.56.0.1"}}),
            "spec.ipam.subnet",
            "ipam.subnet must be a CIDR",
        ),
    ];
    for (case, name, spec, field, message) in bad {
        let mut obj = network(spec.clone());
        obj["metadata"]["name"] = name.into();
        let errs = cel_errors(&obj);
        assert!(
            errs.iter().any(|e| e.contains(message)),
            "{case}: the schema should say {message:?}, got {errs:?}"
        );
        let parsed: kroce_operator::crd::RdmaNetworkSpec = serde_json::from_value(spec).unwrap();
        let ctl = kroce_operator::plan::validate_network(name, &parsed).unwrap_err();
        assert!(
            ctl.iter().any(|e| e.field == field),
            "{case}: the controller should name {field}, got {ctl:?}"
        );
    }
    let good = [
        serde_json::json!({"nicSelector": {"pfNames": ["ens1f0#0-3,6-7", "ens2f0"]}, "numVfs": 8,
                           "networkNamespaces": ["default", "team-a"], "vlan": 100, "vlanQoS": 3,
                           "ipam": {"type": "host-local", "subnet": "10.56.0.0/16"}}),
        serde_json::json!({"nicSelector": {"vendor": "15b3"}, "numVfs": 4,
                           "ipam": {"type": "whereabouts", "range": "fd00::/64"}}),
        serde_json::json!({"nicSelector": {"ifNames": ["kvf0"]},
                           "ipam": {"type": "host-local", "subnet": "fd00:1::/64"}}),
        serde_json::json!({"nicSelector": {"pfNames": ["ens1f0"]}, "numVfs": 4,
                           "memlock": "64Gi", "maxUnavailable": "10%",
                           "ipam": {"type": "host-local", "subnet": "10.56.0.0/16",
                                    "rangeStart": "10.56.3.1", "rangeEnd": "10.56.255.254"}}),
    ];
    let name63 = "n".repeat(63);
    for spec in good {
        let mut obj = network(spec.clone());
        obj["metadata"]["name"] = name63.as_str().into();
        assert_eq!(cel_errors(&obj), Vec::<String>::new(), "{spec}");
        let parsed: kroce_operator::crd::RdmaNetworkSpec = serde_json::from_value(spec).unwrap();
        assert_eq!(
            kroce_operator::plan::validate_network(&name63, &parsed),
            Ok(())
        );
    }
}

/// Issue 24 item 13: the name-length rule points at `metadata.name` (the
/// API server reported it against `<nil>`), which the schema declares (a
/// `fieldPath` must name a declared field); memlock is a CEL rule with a
/// sentence, its grammar still `kroce_contracts::memlock`'s pattern.
#[test]
fn name_rule_names_its_field_and_memlock_reads_as_a_sentence() {
    let crd = serde_json::to_value(rdma_network_crd()).unwrap();
    let root = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    assert_eq!(
        root["properties"]["metadata"]["properties"]["name"]["type"],
        "string"
    );
    let rule = root["x-kubernetes-validations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["rule"].as_str().unwrap().contains("metadata.name"))
        .unwrap();
    assert_eq!(rule["fieldPath"], ".metadata.name");
    let memlock = &root["properties"]["spec"]["properties"]["memlock"];
    assert!(memlock.get("pattern").is_none(), "{memlock}");
    let rules = memlock["x-kubernetes-validations"].as_array().unwrap();
    assert!(
        rules[0]["rule"]
            .as_str()
            .unwrap()
            .contains(&kroce_contracts::memlock::crd_pattern()),
        "{rules:?}"
    );
    // CEL and the parser agree on the grammar.
    for (value, ok) in [
        ("unlimited", true),
        ("64Gi", true),
        ("1", true),
        ("64g", false),
        ("0", false),
        ("64 GiB", false),
    ] {
        let obj = network(serde_json::json!({"nicSelector": {"pfNames": ["ens1f0"]},
                                             "numVfs": 4, "memlock": value}));
        assert_eq!(
            cel_errors(&obj).is_empty(),
            ok,
            "{value}: {:?}",
            cel_errors(&obj)
        );
        assert_eq!(
            value.parse::<kroce_contracts::Memlock>().is_ok(),
            ok,
            "{value}"
        );
    }
}

/// `maxUnavailable`: a CEL rule whose pattern is
/// `kroce_contracts::max_unavailable`'s, agreeing with its parser.
#[test]
fn max_unavailable_rule_is_the_contracts_grammar() {
    let crd = serde_json::to_value(rdma_network_crd()).unwrap();
    let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    let field = &spec["properties"]["maxUnavailable"];
    assert_eq!(field["type"], "string");
    let rules = field["x-kubernetes-validations"].as_array().unwrap();
    assert!(
        rules[0]["rule"]
            .as_str()
            .unwrap()
            .contains(&kroce_contracts::max_unavailable::crd_pattern()),
        "{rules:?}"
    );
    for (value, ok) in [
        ("1", true),
        ("250", true),
        ("10%", true),
        ("100%", true),
        ("0", false),
        ("101%", false),
        ("010", false),
        ("10 %", false),
        ("100000", false),
    ] {
        let obj = network(serde_json::json!({"nicSelector": {"pfNames": ["ens1f0"]},
                                             "numVfs": 4, "maxUnavailable": value}));
        assert_eq!(
            cel_errors(&obj).is_empty(),
            ok,
            "{value}: {:?}",
            cel_errors(&obj)
        );
        assert_eq!(
            value
                .parse::<kroce_contracts::max_unavailable::MaxUnavailable>()
                .is_ok(),
            ok,
            "{value}"
        );
    }
}
