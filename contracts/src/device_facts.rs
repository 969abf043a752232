//! The per-device facts a pod reads from its environment: the JSON value of
//! the device plugin's `PCIDEVICE_<RESOURCE>_INFO` (an object keyed by
//! device ID) and of the DRA plugin's `KROCE_DRA_<DEVICE>_INFO` (one
//! object). Written by both front ends, read by the pod's own code, so one
//! shape: a field added here reaches both.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceFacts {
    /// The device's PCI function (none for a soft device on a plain netdev).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_address: Option<String>,
    /// A VF's PF (absent for a PF or a soft device).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pf_pci_address: Option<String>,
    /// The RDMA device's name (`mlx5_2`, `rxe0`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdma_device: Option<String>,
    /// Container paths of the device's char devices (`/dev/infiniband/uverbs2`, ...).
    #[serde(default)]
    pub char_devices: Vec<String>,
    /// The host netdev at allocation time (the CNI renames it in the pod).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netdev: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<u32>,
    /// The RoCE v2 GID index to use (IPv4-mapped when there is one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roce_v2_gid_index: Option<u32>,
    /// The IPv4 address that GID carries, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roce_v2_gid_ipv4: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_camel_case_and_absent_fields_left_out() {
        let f = DeviceFacts {
            pci_address: Some("0000:3b:00.2".into()),
            rdma_device: Some("mlx5_2".into()),
            char_devices: vec!["/dev/infiniband/uverbs2".into()],
            roce_v2_gid_index: Some(3),
            ..Default::default()
        };
        let v = serde_json::to_value(&f).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"pciAddress": "0000:3b:00.2", "rdmaDevice": "mlx5_2",
                "charDevices": ["/dev/infiniband/uverbs2"], "roceV2GidIndex": 3})
        );
        assert_eq!(serde_json::from_value::<DeviceFacts>(v).unwrap(), f);
    }
}
