//! The device plugin's pool config for one node, from its desired state.
//! Contract with `kroce-device-plugin`: one shared ConfigMap, key
//! `<nodeName>.yaml`, holding `pools:` as below.

use crate::crd::{ObservedPf, RdmaNodeStateSpec};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DevicePluginConfig {
    pub pools: Vec<Pool>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Pool {
    /// Full name (`rdma/vf`).
    pub resource_name: String,
    /// `exclusive`: one VF per container.
    pub mode: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memlock: Option<String>,
    pub selectors: Selectors,
}

/// The device plugin's selector keys; empty ones are left out.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Selectors {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub vendors: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drivers: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pf_names: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub root_devices: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub link_types: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is_rdma: Option<bool>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub numa_nodes: Vec<u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub if_names: Vec<String>,
}

/// One pool per resource name; its `pfNames` carry the exact VF ranges of
/// the desired state, so two networks on one PF never share a VF. A
/// soft-device group becomes a pool selecting its netdevs by `ifNames`.
pub fn device_plugin_config(
    spec: &RdmaNodeStateSpec,
    inventory: &[ObservedPf],
    memlock: &BTreeMap<&str, Option<&str>>,
) -> DevicePluginConfig {
    let mut pools: BTreeMap<&str, Pool> = BTreeMap::new();
    let new_pool = |resource: &str, network: &str| Pool {
        resource_name: resource.to_string(),
        mode: "exclusive".into(),
        memlock: memlock.get(network).copied().flatten().map(str::to_string),
        selectors: Selectors {
            is_rdma: Some(true),
            ..Default::default()
        },
    };
    for pf in &spec.pfs {
        let vendor = inventory
            .iter()
            .find(|i| i.pci_address == pf.pci_address)
            .map(|i| i.vendor.to_ascii_lowercase());
        for g in &pf.vf_groups {
            let pool = pools
                .entry(&g.resource_name)
                .or_insert_with(|| new_pool(&g.resource_name, &g.network));
            pool.selectors
                .pf_names
                .push(format!("{}#{}", pf.if_name, g.vf_range));
            if let Some(v) = &vendor
                && !pool.selectors.vendors.contains(v)
            {
                pool.selectors.vendors.push(v.clone());
            }
        }
    }
    for g in &spec.soft_devices {
        let pool = pools
            .entry(&g.resource_name)
            .or_insert_with(|| new_pool(&g.resource_name, &g.network));
        for n in &g.if_names {
            if !pool.selectors.if_names.contains(n) {
                pool.selectors.if_names.push(n.clone());
            }
        }
    }
    DevicePluginConfig {
        pools: pools.into_values().collect(),
    }
}

impl DevicePluginConfig {
    pub fn to_yaml(&self) -> Result<String, serde_saphyr::SerializeError> {
        serde_saphyr::to_string(self)
    }
}

/// ConfigMap key of a node's pool config.
pub fn config_key(node: &str) -> String {
    format!("{node}.yaml")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::merge::tests::{net, node};
    use crate::plan::merge::{Desired, plan_node};

    #[test]
    fn pools_carry_disjoint_vf_ranges_and_round_trip_as_yaml() {
        let mut a = net("alpha", &["ens1f0#0-3"], 8);
        a.spec.memlock = Some("unlimited".into());
        a.spec.resource_name = Some("vf".into());
        let b = net("beta", &["ens1f0#4-7", "ens2f0#0-1"], 8);
        let p = plan_node(&node("n1", &[]), &[a, b]);
        assert!(matches!(p.desired, Desired::Spec(_)));
        let cfg = p.device_plugin.unwrap();
        let yaml = cfg.to_yaml().unwrap();
        let expected = "\
pools:
- resourceName: rdma/beta
  mode: exclusive
  selectors:
    vendors:
    - 15b3
    pfNames:
    - ens1f0#4-7
    - ens2f0#0-1
    isRdma: true
- resourceName: rdma/vf
  mode: exclusive
  memlock: unlimited
  selectors:
    vendors:
    - 15b3
    pfNames:
    - ens1f0#0-3
    isRdma: true
";
        assert_eq!(yaml, expected);
        let back: DevicePluginConfig = serde_saphyr::from_str(&yaml).unwrap();
        assert_eq!(back, cfg);
        assert_eq!(config_key("n1"), "n1.yaml");
    }

    #[test]
    fn soft_device_network_is_an_if_names_pool_without_vfs() {
        let rxe: crate::plan::NetworkInput = crate::plan::NetworkInput {
            name: "rxe".into(),
            spec: serde_json::from_value(serde_json::json!({
                "nicSelector": {"ifNames": ["kvf0", "kvf1"]},
                "resourceName": "vf",
                "memlock": "unlimited",
            }))
            .unwrap(),
        };
        let mut n = node("kind-worker", &[]);
        // A kind node has no SR-IOV PF at all: the agent reports none, and
        // a soft network does not even need that report.
        n.inventory = None;
        let p = plan_node(&n, &[rxe]);
        let Desired::Spec(spec) = &p.desired else {
            panic!("expected a spec, got {:?}", p.desired)
        };
        assert!(spec.pfs.is_empty(), "no PF, no VFs: {spec:?}");
        assert_eq!(spec.soft_devices.len(), 1);
        assert_eq!(p.matched, ["rxe"]);
        let yaml = p.device_plugin.unwrap().to_yaml().unwrap();
        assert_eq!(
            yaml,
            "\
pools:
- resourceName: rdma/vf
  mode: exclusive
  memlock: unlimited
  selectors:
    isRdma: true
    ifNames:
    - kvf0
    - kvf1
"
        );
    }
}
