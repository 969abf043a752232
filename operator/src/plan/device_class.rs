//! The DeviceClass (`resource.k8s.io/v1`) of a `frontend: dra` network:
//! named after the network, selecting its VFs among the devices of driver
//! `rdma.kroce.io` and carrying its vlan/mtu/ipam/memlock as the DRA
//! plugin's opaque config, so a ResourceClaim naming the class gets a VF
//! configured for the network.
//!
//! A class is cluster-wide and a device's attributes do not name its node,
//! so the selector names the network's VFs by PF PCI address and VF index,
//! gathered from every node's spec. Where the same (PF address, VF index)
//! is another DRA network's or no network's on some node, the class would
//! select that VF too: [`foreign_vfs`] finds it and the class is not written.

use crate::crd::{RdmaNetworkSpec, RdmaNodeStateSpec};
use crate::names::{MANAGED_BY_LABEL, MANAGER, NETWORK_LABEL};
use k8s_openapi::api::resource::v1::{
    CELDeviceSelector, DeviceClass, DeviceClassConfiguration, DeviceClassSpec, DeviceSelector,
    OpaqueDeviceConfiguration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use kroce_contracts::dra::{CONFIG_API_VERSION, CONFIG_KIND, DRIVER_NAME};
use sriov_helpers::CpuList;
use std::collections::{BTreeMap, BTreeSet};

/// The API server's limit on a CEL selector expression.
pub const MAX_EXPRESSION_LEN: usize = 10 * 1024;

/// A network's devices over every node: VF indices by PF PCI address, and
/// the netdevs of its soft devices.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NetworkDevices {
    pub vfs: BTreeMap<String, BTreeSet<u32>>,
    pub soft: BTreeSet<String>,
}

/// What `network` has in these node specs.
pub fn network_devices<'a>(
    network: &str,
    nodes: impl IntoIterator<Item = &'a RdmaNodeStateSpec>,
) -> NetworkDevices {
    let mut out = NetworkDevices::default();
    for spec in nodes {
        for pf in &spec.pfs {
            for g in pf.vf_groups.iter().filter(|g| g.network == network) {
                // Ranges are the planner's own (`CpuList` form): a bad one
                // selects nothing rather than something wrong.
                if let Ok(r) = g.vf_range.parse::<CpuList>() {
                    out.vfs
                        .entry(pf.pci_address.to_ascii_lowercase())
                        .or_default()
                        .extend(r.cpus());
                }
            }
        }
        for g in spec.soft_devices.iter().filter(|g| g.network == network) {
            out.soft.extend(g.if_names.iter().cloned());
        }
    }
    out
}

/// VFs the class of `network` would select on some node although they are
/// not its there: another `frontend: dra` network's (`is_dra`), or created
/// but no network's (the DRA plugin publishes both). A `devicePlugin`
/// network's VFs are not counted: the DRA plugin reads the device plugin's
/// config and leaves them out. `node n: PF 0000:3b:00.0 VF 2 is network
/// other's` / `... is no network's`.
pub fn foreign_vfs<'a>(
    network: &str,
    devices: &NetworkDevices,
    nodes: impl IntoIterator<Item = &'a RdmaNodeStateSpec>,
    is_dra: impl Fn(&str) -> bool,
) -> Vec<String> {
    let mut out = Vec::new();
    for spec in nodes {
        for pf in &spec.pfs {
            let Some(ours) = devices.vfs.get(&pf.pci_address.to_ascii_lowercase()) else {
                continue;
            };
            let mut owner: BTreeMap<u32, &str> = BTreeMap::new();
            for g in &pf.vf_groups {
                if let Ok(r) = g.vf_range.parse::<CpuList>() {
                    owner.extend(r.cpus().map(|v| (v, g.network.as_str())));
                }
            }
            let clash = ours.iter().filter(|v| **v < pf.num_vfs).find_map(|v| {
                match owner.get(v) {
                    Some(n) if *n == network => None,
                    Some(n) if is_dra(n) => Some(format!("network {n}'s")),
                    Some(_) => None,
                    None => Some("no network's".to_string()),
                }
                .map(|who| (v, who))
            });
            if let Some((vf, who)) = clash {
                out.push(format!(
                    "node {}: PF {} VF {vf} is {who}",
                    spec.node_name, pf.pci_address
                ));
            }
        }
    }
    out
}

fn quote(s: &str) -> String {
    // Attribute values here are PCI addresses and netdev names: no quotes
    // or backslashes, escaped anyway.
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

/// `a.vfIndex >= 0 && a.vfIndex <= 3 || a.vfIndex == 6` for {0..3, 6}.
fn index_runs(attr: &str, vfs: &BTreeSet<u32>) -> String {
    let mut runs: Vec<(u32, u32)> = Vec::new();
    for &v in vfs {
        match runs.last_mut() {
            Some((_, end)) if *end + 1 == v => *end = v,
            _ => runs.push((v, v)),
        }
    }
    runs.iter()
        .map(|(a, b)| {
            if a == b {
                format!("{attr}.vfIndex == {a}")
            } else {
                format!("({attr}.vfIndex >= {a} && {attr}.vfIndex <= {b})")
            }
        })
        .collect::<Vec<_>>()
        .join(" || ")
}

/// The CEL selector: driver `rdma.kroce.io`, and a VF of one of the PFs at
/// one of its indices (PFs with the same indices grouped), or a soft device
/// on one of its netdevs. Nothing yet: `false` (the class exists, claims
/// wait).
pub fn selector(devices: &NetworkDevices) -> String {
    let a = format!("device.attributes[{}]", quote(DRIVER_NAME));
    let mut by_set: BTreeMap<&BTreeSet<u32>, Vec<&str>> = BTreeMap::new();
    for (pf, vfs) in devices.vfs.iter().filter(|(_, v)| !v.is_empty()) {
        by_set.entry(vfs).or_default().push(pf);
    }
    let mut alts = Vec::new();
    for (vfs, pfs) in by_set {
        let list: Vec<String> = pfs.iter().map(|p| quote(p)).collect();
        alts.push(format!(
            "({a}.type == \"vf\" && has({a}.pfPciAddress) && has({a}.vfIndex) && {a}.pfPciAddress in [{}] && ({}))",
            list.join(", "),
            index_runs(&a, vfs)
        ));
    }
    if !devices.soft.is_empty() {
        let list: Vec<String> = devices.soft.iter().map(|n| quote(n)).collect();
        alts.push(format!(
            "({a}.type == \"soft\" && has({a}.netdev) && {a}.netdev in [{}])",
            list.join(", ")
        ));
    }
    if alts.is_empty() {
        return "false".into();
    }
    format!(
        "device.driver == {} && ({})",
        quote(DRIVER_NAME),
        alts.join(" || ")
    )
}

/// The DRA plugin's opaque config for the network (`vlanQoS` has no DRA
/// counterpart yet and is left out).
pub fn opaque_parameters(spec: &RdmaNetworkSpec) -> serde_json::Value {
    let mut p = serde_json::Map::new();
    p.insert("apiVersion".into(), CONFIG_API_VERSION.into());
    p.insert("kind".into(), CONFIG_KIND.into());
    if let Some(v) = spec.vlan {
        p.insert("vlan".into(), v.into());
    }
    if let Some(m) = spec.mtu {
        p.insert("mtu".into(), m.into());
    }
    if let Some(i) = &spec.ipam {
        p.insert("ipam".into(), i.clone());
    }
    if let Some(m) = &spec.memlock {
        p.insert("memlock".into(), m.clone().into());
    }
    serde_json::Value::Object(p)
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceClassError {
    #[error(
        "the DeviceClass selector of network {network} would be {len} characters, over the API \
         server's {MAX_EXPRESSION_LEN}: too many distinct PF addresses/VF ranges"
    )]
    TooLong { network: String, len: usize },
}

/// The network's DeviceClass.
pub fn device_class(
    network: &str,
    spec: &RdmaNetworkSpec,
    devices: &NetworkDevices,
) -> Result<DeviceClass, DeviceClassError> {
    let expression = selector(devices);
    if expression.len() > MAX_EXPRESSION_LEN {
        return Err(DeviceClassError::TooLong {
            network: network.to_string(),
            len: expression.len(),
        });
    }
    Ok(DeviceClass {
        metadata: ObjectMeta {
            name: Some(network.to_string()),
            labels: Some(BTreeMap::from([
                (NETWORK_LABEL.to_string(), network.to_string()),
                (MANAGED_BY_LABEL.to_string(), MANAGER.to_string()),
            ])),
            ..Default::default()
        },
        spec: Some(DeviceClassSpec {
            selectors: Some(vec![DeviceSelector {
                cel: Some(CELDeviceSelector { expression }),
            }]),
            config: Some(vec![DeviceClassConfiguration {
                opaque: Some(OpaqueDeviceConfiguration {
                    driver: DRIVER_NAME.into(),
                    parameters: RawExtension(opaque_parameters(spec)),
                }),
            }]),
            ..Default::default()
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{PfConfig, SoftDeviceGroup, VfGroup};
    use crate::plan::merge::tests::net;

    fn pf(addr: &str, groups: &[(&str, &str)]) -> PfConfig {
        serde_json::from_value(serde_json::json!({
            "pciAddress": addr, "ifName": "ens1f0", "numVfs": 8,
            "vfGroups": groups.iter().map(|(n, r)| serde_json::to_value(VfGroup {
                network: n.to_string(), resource_name: format!("rdma/{n}"),
                vf_range: r.to_string(), mtu: None,
            }).unwrap()).collect::<Vec<_>>(),
        }))
        .unwrap()
    }

    fn node(name: &str, pfs: Vec<PfConfig>) -> RdmaNodeStateSpec {
        RdmaNodeStateSpec {
            node_name: name.into(),
            pfs,
            soft_devices: vec![],
            rdma_netns_modes: vec![],
        }
    }

    #[test]
    fn selector_names_the_networks_vfs_by_pf_and_index() {
        let a = node(
            "a",
            vec![pf("0000:3B:00.0", &[("fast", "0-3"), ("slow", "4-7")])],
        );
        let b = node("b", vec![pf("0000:86:00.0", &[("fast", "0-3,6")])]);
        let c = node("c", vec![pf("0000:3b:00.0", &[("fast", "0-3")])]);
        let d = network_devices("fast", [&a, &b, &c]);
        assert_eq!(d.vfs.len(), 2);
        let s = selector(&d);
        let a_ = r#"device.attributes["rdma.kroce.io"]"#;
        assert_eq!(
            s,
            format!(
                r#"device.driver == "rdma.kroce.io" && (({a_}.type == "vf" && has({a_}.pfPciAddress) && has({a_}.vfIndex) && {a_}.pfPciAddress in ["0000:3b:00.0"] && (({a_}.vfIndex >= 0 && {a_}.vfIndex <= 3))) || ({a_}.type == "vf" && has({a_}.pfPciAddress) && has({a_}.vfIndex) && {a_}.pfPciAddress in ["0000:86:00.0"] && (({a_}.vfIndex >= 0 && {a_}.vfIndex <= 3) || {a_}.vfIndex == 6)))"#
            )
        );
        assert!(foreign_vfs("fast", &d, [&a, &b, &c], |_| true).is_empty());
        assert_eq!(selector(&NetworkDevices::default()), "false");
    }

    #[test]
    fn same_pf_address_with_another_dra_networks_or_free_vfs_elsewhere_is_found() {
        let a = node("a", vec![pf("0000:3b:00.0", &[("fast", "0-3")])]);
        let b = node("b", vec![pf("0000:3b:00.0", &[("other", "2-7")])]);
        let c = node("c", vec![pf("0000:3b:00.0", &[("other", "0-7")])]);
        let d = network_devices("fast", [&a, &b, &c]);
        // Another DRA network's VFs.
        assert_eq!(
            foreign_vfs("fast", &d, [&a, &c], |n| n == "other"),
            ["node c: PF 0000:3b:00.0 VF 0 is network other's"]
        );
        // A device plugin network's: the DRA plugin does not publish them.
        assert!(foreign_vfs("fast", &d, [&a, &c], |_| false).is_empty());
        // VFs 0-1 exist on b (numVfs 8) and are no network's: published.
        assert_eq!(
            foreign_vfs("fast", &d, [&a, &b], |_| false),
            ["node b: PF 0000:3b:00.0 VF 0 is no network's"]
        );
        // A PF with fewer VFs than the indices: those VFs do not exist.
        let mut e = node("e", vec![pf("0000:3b:00.0", &[])]);
        e.pfs[0].num_vfs = 0;
        assert!(foreign_vfs("fast", &d, [&a, &e], |_| true).is_empty());
    }

    #[test]
    fn soft_devices_and_opaque_config() {
        let mut s = node("a", vec![]);
        s.soft_devices.push(SoftDeviceGroup {
            network: "soft".into(),
            resource_name: "rdma/soft".into(),
            if_names: vec!["eth9".into()],
        });
        let d = network_devices("soft", [&s]);
        assert!(
            selector(&d).contains(r#".netdev in ["eth9"]"#),
            "{}",
            selector(&d)
        );

        let mut n = net("fast", &["ens1f0"], 4);
        n.spec.vlan = Some(100);
        n.spec.memlock = Some("64Gi".into());
        n.spec.ipam = Some(serde_json::json!({"type": "host-local", "subnet": "10.56.0.0/24"}));
        let dc = device_class("fast", &n.spec, &d).unwrap();
        assert_eq!(dc.metadata.name.as_deref(), Some("fast"));
        let cfg = &dc.spec.as_ref().unwrap().config.as_ref().unwrap()[0];
        let o = cfg.opaque.as_ref().unwrap();
        assert_eq!(o.driver, "rdma.kroce.io");
        assert_eq!(
            o.parameters.0,
            serde_json::json!({
                "apiVersion": "rdma.kroce.io/v1alpha1", "kind": "RdmaConfig",
                "vlan": 100, "mtu": 9000, "memlock": "64Gi",
                "ipam": {"type": "host-local", "subnet": "10.56.0.0/24"}
            })
        );
    }

    #[test]
    fn too_many_pfs_is_an_error_naming_the_network() {
        let pfs: Vec<PfConfig> = (0..800)
            .map(|i| {
                pf(
                    &format!("0000:{:02x}:{:02x}.0", i / 32, i % 32),
                    &[("big", &format!("{}", i % 7))],
                )
            })
            .collect();
        let a = node("a", pfs);
        let d = network_devices("big", [&a]);
        let n = net("big", &["ens1f0"], 8);
        let e = device_class("big", &n.spec, &d).unwrap_err().to_string();
        assert!(e.contains("network big"), "{e}");
    }
}
