//! A device's nodes and facts, as both front ends give them to a
//! container: the char devices (uverbs/umad/issm and `rdma_cm`), as plain
//! entries or as CDI entries carrying the host node's mode and owner, and
//! the facts a pod reads from its env.

use crate::inventory::Candidate;
use kroce_contracts::cdi;
use kroce_contracts::device_facts::DeviceFacts;
use serde::Serialize;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Where `/dev` is on the node for the container runtime. Device specs name
/// host paths as the runtime sees them, whatever `--dev-root` this process
/// reads from.
pub const RUNTIME_DEV_DIR: &str = "/dev";

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceNode {
    pub container_path: String,
    pub host_path: String,
    pub permissions: String,
}

impl DeviceNode {
    /// The CDI entry of this node; mode and owner from the host node's
    /// `meta` when it was read.
    pub fn into_cdi(self, meta: Option<&std::fs::Metadata>) -> cdi::DeviceNode {
        cdi::DeviceNode {
            path: self.container_path,
            host_path: self.host_path,
            permissions: self.permissions,
            file_mode: meta.map(|m| m.mode() & 0o777),
            uid: meta.map(MetadataExt::uid),
            gid: meta.map(MetadataExt::gid),
        }
    }
}

/// The device nodes of one device: its uverbs/umad/issm and `rdma_cm`.
pub fn device_nodes(c: &Candidate) -> Vec<DeviceNode> {
    let Some(r) = &c.rdma else {
        return Vec::new();
    };
    let mut names: Vec<&str> = r.char_devices.iter().map(|n| n.name.as_str()).collect();
    if c.rdma_cm {
        names.push("rdma_cm");
    }
    names
        .into_iter()
        .map(|n| DeviceNode {
            container_path: format!("/dev/infiniband/{n}"),
            host_path: format!("{RUNTIME_DEV_DIR}/infiniband/{n}"),
            permissions: "rw".into(),
        })
        .collect()
}

/// The CDI device nodes of one device, each with the permission bits and
/// owner of the host's node under `dev_infiniband` (the plugin's view of
/// the host's `/dev/infiniband`). A node that cannot be read (gone in the
/// meantime) goes without them: the runtime's defaults, as before.
pub fn device_nodes_on(c: &Candidate, dev_infiniband: &Path) -> Vec<cdi::DeviceNode> {
    device_nodes(c)
        .into_iter()
        .map(|n| {
            let name = n.container_path.rsplit('/').next().unwrap_or_default();
            let meta = std::fs::metadata(dev_infiniband.join(name)).ok();
            n.into_cdi(meta.as_ref())
        })
        .collect()
}

/// The facts a pod reads about one device from its env (the device
/// plugin's `PCIDEVICE_<RES>_INFO` and the DRA plugin's
/// `KROCE_DRA_<DEV>_INFO`): one function, so both front ends say the same.
pub fn device_facts(c: &Candidate, nodes: &[DeviceNode]) -> DeviceFacts {
    let gid = c.rdma.as_ref().and_then(|r| r.roce_v2_gid);
    DeviceFacts {
        pci_address: c.pci.map(|p| p.to_string()),
        pf_pci_address: c.pf.filter(|pf| Some(*pf) != c.pci).map(|p| p.to_string()),
        rdma_device: c.rdma.as_ref().map(|r| r.name.clone()),
        char_devices: nodes.iter().map(|n| n.container_path.clone()).collect(),
        netdev: c.netdev.as_ref().map(|n| n.name.clone()),
        numa_node: c.numa,
        roce_v2_gid_index: gid.map(|g| g.0),
        roce_v2_gid_ipv4: gid.map(|g| g.1.to_string()),
    }
}
