//! The contracts between kroce's crates, checked on real outputs: what the
//! operator writes must be what the device plugin and the CNI accept, and the
//! annotations the device plugin sets must be what the NRI plugin reads.
//! Each crate is tested alone elsewhere; these fail when two of them drift.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use kroce_operator::crd::{ObservedPf, RdmaNetworkSpec};
use kroce_operator::plan::{NetworkInput, NodeInput, plan_cluster};
use std::collections::BTreeMap;
use std::path::PathBuf;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// An RdmaNetwork manifest's spec, as the operator reads it.
fn network(path: &str) -> NetworkInput {
    let text = std::fs::read_to_string(repo().join(path)).unwrap();
    let doc: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
    let spec: RdmaNetworkSpec =
        serde_json::from_value(doc["spec"].clone()).unwrap_or_else(|e| panic!("{path}: {e}"));
    NetworkInput {
        name: doc["metadata"]["name"].as_str().unwrap().to_string(),
        spec,
    }
}

fn node(labels: &[(&str, &str)]) -> NodeInput {
    NodeInput {
        name: "worker-1".into(),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>(),
        inventory: Some(vec![ObservedPf {
            pci_address: "0000:3b:00.0".into(),
            if_name: Some("ens1f0".into()),
            vendor: "15b3".into(),
            device_id: "101d".into(),
            total_vfs: 127,
            numa_node: Some(0),
            ..Default::default()
        }]),
    }
}

#[test]
fn operator_pool_configs_are_accepted_by_the_device_plugin() {
    let cases = [
        (
            "charts/kroce/examples/rdmanetwork-connectx.yaml",
            node(&[("feature.node.kubernetes.io/network-sriov.capable", "true")]),
        ),
        (
            "e2e/kind/rdmanetwork-rxe.yaml",
            node(&[("kroce.io/e2e", "true")]),
        ),
    ];
    for (path, n) in cases {
        let plan = plan_cluster(&[n], &[network(path)]);
        assert!(plan.invalid.is_empty(), "{path}: {:?}", plan.invalid);
        let np = &plan.nodes[0];
        assert!(np.conflicts.is_empty(), "{path}: {:?}", np.conflicts);
        let yaml = np
            .device_plugin
            .as_ref()
            .unwrap_or_else(|| panic!("{path}: no device plugin config"))
            .to_yaml()
            .unwrap();
        let cfg =
            kroce_device_plugin::config::parse(&yaml, kroce_device_plugin::config::Format::Yaml)
                .unwrap_or_else(|e| panic!("{path}: the device plugin refuses\n{yaml}\n{e}"));
        assert_eq!(cfg.pools.len(), 1, "{path}");
        assert_eq!(cfg.pools[0].resource.to_string(), "rdma/vf", "{path}");
    }
}

#[test]
fn operator_network_configs_are_accepted_by_the_cni() {
    // deviceID as Multus passes it: the device plugin's device ID (a VF's
    // PCI address, a soft device's RDMA device name).
    for (path, device_id) in [
        (
            "charts/kroce/examples/rdmanetwork-connectx.yaml",
            "0000:3b:00.2",
        ),
        ("e2e/kind/rdmanetwork-rxe.yaml", "rxe_kvf0"),
    ] {
        let net = network(path);
        let mut conf = kroce_operator::plan::nad::cni_config(&net.name, &net.spec);
        conf["deviceID"] = device_id.into();
        let bytes = serde_json::to_vec(&conf).unwrap();
        let args = kroce_cni::protocol::env::CniArgs::parse("").unwrap();
        kroce_cni::config::parse(&bytes, &args)
            .unwrap_or_else(|e| panic!("{path}: kroce-cni refuses {conf}: {e}"));
    }
}

#[test]
fn device_plugin_annotations_are_what_the_nri_plugin_reads() {
    for resource in ["rdma/vf", "rdma/hca", "example.com/rdma_a"] {
        let devices = kroce_nri::policy::devices_annotation(resource);
        let memlock = kroce_nri::policy::memlock_annotation(resource);
        let res = kroce_device_plugin::resource_name::ResourceName::parse(resource).unwrap();
        assert_eq!(res.devices_annotation(), devices, "{resource}");
        assert_eq!(res.memlock_annotation(), memlock, "{resource}");
    }
}
