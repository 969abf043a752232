//! CDI (Container Device Interface) spec files: what both kubelet front
//! ends (the device plugin per pool, the DRA plugin per claim) write for the
//! container runtime to read. The shape and the version are defined once
//! here; what goes in them (a device's nodes) is `kroce_inventory`'s.

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
    /// The node's permission bits in the container (CDI `fileMode`, a
    /// number). Without it runtimes create the node 0666 (containerd 2.1
    /// was seen to), wider than the host's `umadN` 0600: copied from the
    /// host node, with its owner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_mode: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
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
