//! CDI (Container Device Interface) specs: in CDI mode each pool's devices
//! are described in `<cdi-dir>/kroce.io-<class>.json` with kind
//! `kroce.io/<class>` (class = resource name with `/` as `_`), and Allocate
//! returns fully qualified names like `kroce.io/rdma_vf=0000-3b-00.2`.

use crate::allocation::device_nodes;
use crate::resource_name::{ResourceName, VENDOR_DOMAIN};
use crate::snapshot::PoolSnapshot;
use serde::{Deserialize, Serialize};

/// hostPath on device nodes needs 0.5.0; 0.6.0 is widely supported
/// (containerd 1.7+, CRI-O 1.28+).
pub const CDI_VERSION: &str = "0.6.0";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    pub cdi_version: String,
    pub kind: String,
    pub devices: Vec<Device>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    pub name: String,
    pub container_edits: ContainerEdits,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerEdits {
    pub device_nodes: Vec<DeviceNode>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceNode {
    pub path: String,
    pub host_path: String,
    pub permissions: String,
}

/// A CDI device name for a device ID. CDI names allow letters, digits,
/// `-`, `_`, `.`; the `:` of PCI addresses becomes `-`.
pub fn device_name(id: &str) -> String {
    id.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// `kroce.io/rdma_vf=0000-3b-00.2`.
pub fn qualified_name(resource: &ResourceName, id: &str) -> String {
    format!("{}={}", resource.cdi_kind(), device_name(id))
}

/// The spec file name of a pool inside the CDI dir.
pub fn file_name(resource: &ResourceName) -> String {
    format!("{VENDOR_DOMAIN}-{}.json", resource.underscored())
}

/// The spec for every device of a pool; `None` when it has none (an empty
/// spec is invalid).
pub fn spec_for_pool(pool: &PoolSnapshot) -> Option<Spec> {
    if pool.devices.is_empty() {
        return None;
    }
    Some(Spec {
        cdi_version: CDI_VERSION.into(),
        kind: pool.pool.resource.cdi_kind(),
        devices: pool
            .devices
            .values()
            .map(|d| Device {
                name: device_name(&d.id),
                container_edits: ContainerEdits {
                    device_nodes: device_nodes(&d.candidate)
                        .into_iter()
                        .map(|n| DeviceNode {
                            path: n.container_path,
                            host_path: n.host_path,
                            permissions: n.permissions,
                        })
                        .collect(),
                },
            })
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        let r = ResourceName::parse("rdma/vf").unwrap();
        assert_eq!(
            qualified_name(&r, "0000:3b:00.2"),
            "kroce.io/rdma_vf=0000-3b-00.2"
        );
        assert_eq!(
            qualified_name(&r, "0000:3b:00.0-7"),
            "kroce.io/rdma_vf=0000-3b-00.0-7"
        );
        assert_eq!(device_name("rxe0"), "rxe0");
        assert_eq!(file_name(&r), "kroce.io-rdma_vf.json");
    }
}
