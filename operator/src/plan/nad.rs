//! NetworkAttachmentDefinitions (`k8s.cni.cncf.io/v1`) that pods name in
//! `k8s.v1.cni.cncf.io/networks`, one per network per namespace, using
//! `kroce-cni` with the network's VLAN, MTU, memlock and IPAM.

use crate::crd::RdmaNetworkSpec;
use crate::names::{MANAGED_BY_LABEL, MANAGER, NETWORK_LABEL};
use kube::CustomResource;
use kube::api::ObjectMeta;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Multus's annotation tying an attachment to a device plugin resource.
pub use crate::names::MULTUS_RESOURCE_ANNOTATION as RESOURCE_ANNOTATION;

/// The Multus CRD, only as far as kroce writes it.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[kube(
    group = "k8s.cni.cncf.io",
    version = "v1",
    kind = "NetworkAttachmentDefinition",
    plural = "network-attachment-definitions",
    namespaced,
    derive = "PartialEq"
)]
pub struct NetworkAttachmentDefinitionSpec {
    /// The CNI config as a JSON string.
    pub config: String,
}

/// The `kroce-cni` network config for a network (keys in the CNI's terms).
pub fn cni_config(network: &str, spec: &RdmaNetworkSpec) -> serde_json::Value {
    let mut c = serde_json::Map::new();
    c.insert("cniVersion".into(), "1.0.0".into());
    c.insert("name".into(), network.into());
    c.insert("type".into(), "kroce-cni".into());
    if let Some(v) = spec.vlan {
        c.insert("vlan".into(), v.into());
    }
    if let Some(q) = spec.vlan_qos {
        c.insert("vlanQoS".into(), q.into());
    }
    if let Some(m) = spec.mtu {
        c.insert("mtu".into(), m.into());
    }
    if let Some(m) = &spec.memlock {
        c.insert("memlock".into(), m.clone().into());
    }
    c.insert("rdma".into(), "auto".into());
    if let Some(ipam) = &spec.ipam {
        c.insert("ipam".into(), ipam.clone());
    }
    serde_json::Value::Object(c)
}

/// The attachment definition for `network` in `namespace`.
pub fn attachment_definition(
    network: &str,
    spec: &RdmaNetworkSpec,
    namespace: &str,
) -> NetworkAttachmentDefinition {
    let labels = BTreeMap::from([
        (NETWORK_LABEL.to_string(), network.to_string()),
        (MANAGED_BY_LABEL.to_string(), MANAGER.to_string()),
    ]);
    let annotations = BTreeMap::from([(
        RESOURCE_ANNOTATION.to_string(),
        spec.full_resource_name(network),
    )]);
    NetworkAttachmentDefinition {
        metadata: ObjectMeta {
            name: Some(network.to_string()),
            namespace: Some(namespace.to_string()),
            labels: Some(labels),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: NetworkAttachmentDefinitionSpec {
            config: cni_config(network, spec).to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::merge::tests::net;

    #[test]
    fn nad_names_the_resource_and_carries_the_cni_config() {
        let mut n = net("fast", &["ens1f0"], 4);
        n.spec.vlan = Some(100);
        n.spec.vlan_qos = Some(3);
        n.spec.memlock = Some("unlimited".into());
        n.spec.resource_name = Some("vf".into());
        n.spec.ipam = Some(serde_json::json!({"type": "host-local", "subnet": "10.56.0.0/24"}));
        let nad = attachment_definition("fast", &n.spec, "team-a");
        assert_eq!(nad.metadata.namespace.as_deref(), Some("team-a"));
        assert_eq!(
            nad.metadata.annotations.as_ref().unwrap()[RESOURCE_ANNOTATION],
            "rdma/vf"
        );
        let cfg: serde_json::Value = serde_json::from_str(&nad.spec.config).unwrap();
        assert_eq!(
            cfg,
            serde_json::json!({
                "cniVersion": "1.0.0", "name": "fast", "type": "kroce-cni",
                "vlan": 100, "vlanQoS": 3, "mtu": 9000, "memlock": "unlimited",
                "rdma": "auto",
                "ipam": {"type": "host-local", "subnet": "10.56.0.0/24"}
            })
        );
        let plain = cni_config("p", &net("p", &["ens1f0"], 4).spec);
        assert!(plain.get("vlan").is_none() && plain.get("ipam").is_none());
    }
}
