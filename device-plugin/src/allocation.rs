//! What a container gets for its devices, as plain data: device nodes,
//! env, annotations, CDI names and the device-info files to write.
//!
//! - `PCIDEVICE_<RESOURCE>`: comma-separated PCI addresses.
//! - `PCIDEVICE_<RESOURCE>_INFO`: JSON object keyed by device ID with the RDMA
//!   device, its char devices, netdev, NUMA node, PF and the RoCE v2 GID index
//!   of the netdev's IPv4 address when the GID table has one.
//! - annotation `kroce.io/rdma-devices.<res>`: the device IDs;
//!   `kroce.io/memlock.<res>`: the pool's memlock limit, when it has one.

use crate::cdi;
use crate::device_info::{self, DeviceInfo};
use crate::snapshot::PoolSnapshot;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// What a device gives a container is the same for both front ends:
/// `kroce_inventory`'s.
pub use kroce_inventory::device_nodes::{DeviceNode, RUNTIME_DEV_DIR, device_facts, device_nodes};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerAllocation {
    pub envs: BTreeMap<String, String>,
    /// Empty in CDI mode (the runtime takes them from the CDI spec).
    pub devices: Vec<DeviceNode>,
    pub annotations: BTreeMap<String, String>,
    pub cdi_devices: Vec<String>,
    /// (file name in the devinfo dir, content), one per device with a PCI address.
    pub device_infos: Vec<(String, DeviceInfo)>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocateError {
    #[error("no device IDs in the request for {resource}")]
    Empty { resource: String },
    #[error("unknown device ID {id:?} for resource {resource}")]
    Unknown { resource: String, id: String },
    #[error("device {id:?} of resource {resource} is unhealthy: {reasons}")]
    Unhealthy {
        resource: String,
        id: String,
        reasons: String,
    },
}

/// Validates every requested ID (known and healthy) and builds the
/// container's allocation. Duplicate IDs count once.
pub fn allocate(
    pool: &PoolSnapshot,
    ids: &[String],
    cdi_mode: bool,
) -> Result<ContainerAllocation, AllocateError> {
    let resource = &pool.pool.resource;
    if ids.is_empty() {
        return Err(AllocateError::Empty {
            resource: resource.to_string(),
        });
    }
    let ids: BTreeSet<&str> = ids.iter().map(String::as_str).collect();
    let mut devices = Vec::with_capacity(ids.len());
    for id in &ids {
        let d = pool
            .devices
            .get(*id)
            .ok_or_else(|| AllocateError::Unknown {
                resource: resource.to_string(),
                id: id.to_string(),
            })?;
        if !d.health.is_healthy() {
            return Err(AllocateError::Unhealthy {
                resource: resource.to_string(),
                id: id.to_string(),
                reasons: d.health.reasons().join("; "),
            });
        }
        devices.push(d);
    }
    let mut out = ContainerAllocation::default();
    let mut seen_nodes = BTreeSet::new();
    let mut pci = Vec::new();
    let mut info = BTreeMap::new();
    for d in &devices {
        let c = &d.candidate;
        let nodes = device_nodes(c);
        if let Some(p) = c.pci.map(|p| p.to_string())
            && !pci.contains(&p)
        {
            pci.push(p);
        }
        info.insert(d.id.clone(), device_facts(c, &nodes));
        if cdi_mode {
            out.cdi_devices.push(cdi::qualified_name(resource, &d.id));
        } else {
            for n in nodes {
                if seen_nodes.insert(n.container_path.clone()) {
                    out.devices.push(n);
                }
            }
        }
        if let Some(di) = device_info::for_candidate(c) {
            out.device_infos
                .push((device_info::file_name(resource, &d.id), di));
        }
    }
    if !pci.is_empty() {
        out.envs.insert(resource.pci_env(), pci.join(","));
    }
    out.envs.insert(
        resource.info_env(),
        serde_json::to_string(&info).unwrap_or_else(|_| "{}".into()),
    );
    out.annotations.insert(
        resource.devices_annotation(),
        ids.iter().copied().collect::<Vec<_>>().join(","),
    );
    if let Some(m) = pool.pool.memlock {
        out.annotations
            .insert(resource.memlock_annotation(), m.to_string());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Format, parse};
    use crate::host_view::HostView;
    use crate::inventory::{Memory, candidates};
    use crate::snapshot::Snapshot;
    use sriov_helpers::fixture::FixtureHost;
    use std::net::Ipv4Addr;

    fn snapshot(fx: &FixtureHost, yaml: &str) -> Snapshot {
        let cfg = parse(yaml, Format::Yaml).unwrap();
        let c = candidates(&HostView::scan(&fx.root()), &mut Memory::default());
        Snapshot::build(&cfg, c, &|_, _| false)
    }

    const VF_POOL: &str =
        "pools:\n- resourceName: vf\n  memlock: 1Gi\n  selectors: {devices: [\"101e\"]}\n";

    #[test]
    fn two_vfs_get_their_nodes_env_annotations_and_device_info() {
        let (_dir, fx) = crate::testing::connectx_pair();
        let s = snapshot(&fx, VF_POOL);
        let pool = &s.pools[0];
        let a = allocate(
            pool,
            &[
                "0000:3b:00.3".into(),
                "0000:3b:00.2".into(),
                "0000:3b:00.2".into(),
            ],
            false,
        )
        .unwrap();
        let uverbs: Vec<String> = ["0000:3b:00.2", "0000:3b:00.3"]
            .iter()
            .map(|id| {
                pool.devices[*id]
                    .candidate
                    .rdma
                    .as_ref()
                    .unwrap()
                    .char_devices[0]
                    .name
                    .clone()
            })
            .collect();
        let paths: Vec<&str> = a
            .devices
            .iter()
            .map(|d| d.container_path.as_str())
            .collect();
        // Two devices' uverbs+umad, rdma_cm once.
        assert_eq!(paths.len(), 5, "{paths:?}");
        assert_eq!(
            paths
                .iter()
                .filter(|p| **p == "/dev/infiniband/rdma_cm")
                .count(),
            1
        );
        for u in &uverbs {
            assert!(paths.contains(&format!("/dev/infiniband/{u}").as_str()));
        }
        assert!(
            a.devices
                .iter()
                .all(|d| d.permissions == "rw" && d.host_path == d.container_path)
        );
        assert_eq!(a.envs["PCIDEVICE_RDMA_VF"], "0000:3b:00.2,0000:3b:00.3");
        let info: serde_json::Value =
            serde_json::from_str(&a.envs["PCIDEVICE_RDMA_VF_INFO"]).unwrap();
        assert_eq!(info["0000:3b:00.2"]["netdev"], "ens1f0v0");
        assert_eq!(info["0000:3b:00.2"]["numaNode"], 0);
        assert_eq!(info["0000:3b:00.2"]["pfPciAddress"], "0000:3b:00.0");
        assert!(info["0000:3b:00.2"].get("roceV2GidIndex").is_none());
        assert_eq!(
            a.annotations["kroce.io/rdma-devices.rdma_vf"],
            "0000:3b:00.2,0000:3b:00.3"
        );
        assert_eq!(a.annotations["kroce.io/memlock.rdma_vf"], "1073741824");
        assert!(a.cdi_devices.is_empty());
        assert_eq!(a.device_infos.len(), 2);
        assert_eq!(a.device_infos[0].0, "rdma-vf-0000:3b:00.2-device.json");
        assert_eq!(
            a.device_infos[0].1.pci.pf_pci_address.as_deref(),
            Some("0000:3b:00.0")
        );
    }

    #[test]
    fn gid_index_comes_from_the_gid_table() {
        let (_dir, fx) = crate::testing::connectx_pair();
        let s = snapshot(&fx, VF_POOL);
        let rdma = s.pools[0].devices["0000:3b:00.2"]
            .candidate
            .rdma
            .as_ref()
            .unwrap()
            .name
            .clone();
        fx.add_ipv4_gid(&rdma, 4, Ipv4Addr::new(10, 0, 0, 7), "ens1f0v0")
            .unwrap();
        let s = snapshot(&fx, VF_POOL);
        let a = allocate(&s.pools[0], &["0000:3b:00.2".into()], false).unwrap();
        let info: serde_json::Value =
            serde_json::from_str(&a.envs["PCIDEVICE_RDMA_VF_INFO"]).unwrap();
        // RoCE v1 at 4, RoCE v2 at 5.
        assert_eq!(info["0000:3b:00.2"]["roceV2GidIndex"], 5);
        assert_eq!(info["0000:3b:00.2"]["roceV2GidIpv4"], "10.0.0.7");
    }

    #[test]
    fn cdi_mode_returns_names_not_nodes() {
        let (_dir, fx) = crate::testing::connectx_pair();
        let s = snapshot(&fx, VF_POOL);
        let a = allocate(&s.pools[0], &["0000:86:00.2".into()], true).unwrap();
        assert!(a.devices.is_empty());
        assert_eq!(a.cdi_devices, ["kroce.io/rdma_vf=0000-86-00.2"]);
        let spec = cdi::spec_for_pool(&s.pools[0]).unwrap();
        let d = spec
            .devices
            .iter()
            .find(|d| d.name == "0000-86-00.2")
            .unwrap();
        assert_eq!(d.container_edits.device_nodes.len(), 3);
        assert_eq!(spec.kind, "kroce.io/rdma_vf");
    }

    #[test]
    fn unknown_and_unhealthy_ids_are_named() {
        let (_dir, fx) = crate::testing::connectx_pair();
        fx.set_operstate("ens1f0v1", "down").unwrap();
        let s = snapshot(&fx, VF_POOL);
        let e = allocate(&s.pools[0], &["0000:99:00.1".into()], false).unwrap_err();
        assert!(e.to_string().contains("\"0000:99:00.1\""), "{e}");
        let e = allocate(&s.pools[0], &["0000:3b:00.3".into()], false).unwrap_err();
        assert!(
            e.to_string().contains("\"0000:3b:00.3\"")
                && e.to_string().contains("ens1f0v1 is down"),
            "{e}"
        );
        assert!(allocate(&s.pools[0], &[], false).is_err());
    }

    #[test]
    fn shared_pool_shares_hca_nodes() {
        let (_dir, fx) = crate::testing::connectx_pair();
        let s = snapshot(
            &fx,
            "pools:\n- resourceName: hca\n  mode: shared\n  sharedCount: 2\n  selectors: {devices: [\"101d\"]}\n",
        );
        let a = allocate(&s.pools[0], &["0000:3b:00.0-1".into()], false).unwrap();
        assert_eq!(a.envs["PCIDEVICE_RDMA_HCA"], "0000:3b:00.0");
        assert_eq!(a.devices.len(), 3);
        assert_eq!(a.device_infos[0].0, "rdma-hca-0000:3b:00.0-1-device.json");
        assert_eq!(a.device_infos[0].1.pci.pf_pci_address, None);
    }

    #[test]
    fn soft_device_gets_its_nodes_but_no_pci_env_or_device_info() {
        let (_dir, mut fx) = crate::testing::connectx_pair();
        fx.add_rxe("rxe0", "eth9").unwrap();
        let s = snapshot(
            &fx,
            "pools:\n- resourceName: soft\n  selectors: {ifNames: [eth9]}\n",
        );
        let a = allocate(&s.pools[0], &["rxe0".into()], false).unwrap();
        let paths: Vec<&str> = a
            .devices
            .iter()
            .map(|d| d.container_path.as_str())
            .collect();
        assert_eq!(paths.len(), 3, "{paths:?}");
        assert!(paths.contains(&"/dev/infiniband/rdma_cm"));
        assert!(!a.envs.contains_key("PCIDEVICE_RDMA_SOFT"));
        let info: serde_json::Value =
            serde_json::from_str(&a.envs["PCIDEVICE_RDMA_SOFT_INFO"]).unwrap();
        assert_eq!(info["rxe0"]["rdmaDevice"], "rxe0");
        assert_eq!(info["rxe0"]["netdev"], "eth9");
        assert!(a.device_infos.is_empty());
    }
}
