#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The committed CRD YAML must be exactly what the Rust types generate, and
//! the schema must carry the validation the admin relies on.

use kroce_operator::crd::{RdmaNetwork, RdmaNodeState, crds_yaml};
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
        "{} drifted from the Rust types: run `kroce-operator crd > charts/kroce/crds/kroce.io_crds.yaml` \
         (or KROCE_UPDATE_CRDS=1 cargo test -p kroce-operator --test crd)",
        committed_path().display()
    );
}

fn network_schema() -> serde_json::Value {
    let crd = serde_json::to_value(RdmaNetwork::crd()).unwrap();
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
    assert!(required.contains(&"numVfs") && required.contains(&"nicSelector"));
    assert_eq!(num(&props["numVfs"]["minimum"]), 1.0);
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
