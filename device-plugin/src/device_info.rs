//! Device-info files (k8snetworkplumbingwg device-info-spec 1.1.0): what
//! Multus and kroce's CNI read to learn which VF a pod got, at
//! `<devinfo-dir>/<resource with / as ->-<device id>-device.json`.

use crate::inventory::{Candidate, DeviceKind};
use crate::resource_name::ResourceName;
use serde::{Deserialize, Serialize};

pub const SPEC_VERSION: &str = "1.1.0";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceInfo {
    #[serde(rename = "type")]
    pub kind: String,
    pub version: String,
    pub pci: PciInfo,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct PciInfo {
    pub pci_address: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pf_pci_address: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdma_device: Option<String>,
}

/// The file name for one device of a resource.
pub fn file_name(resource: &ResourceName, device_id: &str) -> String {
    format!("{}-{device_id}-device.json", resource.device_info_prefix())
}

/// The device-info of a candidate; `None` for a soft device with no PCI
/// function behind its netdev (the spec requires a PCI address).
pub fn for_candidate(c: &Candidate) -> Option<DeviceInfo> {
    let pci = c.pci?;
    Some(DeviceInfo {
        kind: "pci".into(),
        version: SPEC_VERSION.into(),
        pci: PciInfo {
            pci_address: pci.to_string(),
            pf_pci_address: match c.kind {
                DeviceKind::Vf => c.pf.map(|p| p.to_string()),
                _ => None,
            },
            rdma_device: c.rdma.as_ref().map(|r| r.name.clone()),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_name_follows_the_spec() {
        let r = ResourceName::parse("rdma/vf").unwrap();
        assert_eq!(
            file_name(&r, "0000:3b:00.2"),
            "rdma-vf-0000:3b:00.2-device.json"
        );
    }

    #[test]
    fn json_uses_spec_keys() {
        let info = DeviceInfo {
            kind: "pci".into(),
            version: SPEC_VERSION.into(),
            pci: PciInfo {
                pci_address: "0000:3b:00.2".into(),
                pf_pci_address: Some("0000:3b:00.0".into()),
                rdma_device: Some("mlx5_2".into()),
            },
        };
        let v: serde_json::Value = serde_json::to_value(&info).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"type": "pci", "version": "1.1.0", "pci": {
                "pci-address": "0000:3b:00.2", "pf-pci-address": "0000:3b:00.0",
                "rdma-device": "mlx5_2"}})
        );
    }
}
