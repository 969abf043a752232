//! Device-info files (k8snetworkplumbingwg device-info-spec 1.1.0): the
//! device plugin and the DRA plugin write one per allocated PCI device,
//! `<devinfo-dir>/<resource prefix>-<device id>-device.json`; Multus and
//! kroce-cni (`runtimeConfig.CNIDeviceInfoFile`) read it to learn which PCI
//! function a pod got. One type for the writers and the reader.

use serde::{Deserialize, Serialize};

/// The spec version kroce writes; readers take any 1.x.
pub const SPEC_VERSION: &str = "1.1.0";

/// Biggest device-info file a reader takes (the spec's are a few hundred
/// bytes; the path may come from a pod's runtime config).
pub const MAX_SIZE: u64 = 64 * 1024;

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

impl DeviceInfo {
    /// A `pci` device-info of this spec version.
    pub fn pci(
        pci_address: String,
        pf_pci_address: Option<String>,
        rdma_device: Option<String>,
    ) -> Self {
        Self {
            kind: "pci".into(),
            version: SPEC_VERSION.into(),
            pci: PciInfo {
                pci_address,
                pf_pci_address,
                rdma_device,
            },
        }
    }
}

impl DeviceInfo {
    /// The file's bytes, as every writer writes them (pretty JSON).
    pub fn to_bytes(&self) -> Vec<u8> {
        // Strings and options only: serializing cannot fail; an empty file
        // would be refused by every reader.
        serde_json::to_vec_pretty(self).unwrap_or_default()
    }
}

/// The file name for one device of a resource, from the resource's
/// device-info prefix (`ResourceName::device_info_prefix`, `rdma-vf`).
pub fn file_name(resource_prefix: &str, device_id: &str) -> String {
    format!("{resource_prefix}-{device_id}-device.json")
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceInfoError {
    #[error("not a device-info JSON object: {0}")]
    NotJson(String),
    #[error("type {0:?} is not \"pci\"")]
    Type(String),
    #[error("version {0:?} is not a 1.x device-info-spec version")]
    Version(String),
    #[error("the \"pci\" object is missing")]
    NoPci,
    #[error("pci.pci-address is missing")]
    NoPciAddress,
}

/// What a file may hold before it is checked: every field optional, so a
/// missing one is named by [`parse`] rather than by serde.
#[derive(Deserialize)]
struct Raw {
    #[serde(rename = "type", default)]
    kind: String,
    #[serde(default)]
    version: String,
    pci: Option<RawPci>,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct RawPci {
    #[serde(default)]
    pci_address: Option<String>,
    #[serde(default)]
    pf_pci_address: Option<String>,
    #[serde(default)]
    rdma_device: Option<String>,
}

/// Parses and checks a device-info file's bytes: type `pci`, a 1.x version,
/// a PCI address. Empty strings count as absent. Addresses are left as
/// text: the reader parses them with its own PCI address type.
pub fn parse(bytes: &[u8]) -> Result<DeviceInfo, DeviceInfoError> {
    let raw: Raw =
        serde_json::from_slice(bytes).map_err(|e| DeviceInfoError::NotJson(e.to_string()))?;
    if raw.kind != "pci" {
        return Err(DeviceInfoError::Type(raw.kind));
    }
    if !raw.version.starts_with("1.") {
        return Err(DeviceInfoError::Version(raw.version));
    }
    let pci = raw.pci.ok_or(DeviceInfoError::NoPci)?;
    let set = |s: Option<String>| s.filter(|s| !s.is_empty());
    Ok(DeviceInfo {
        kind: raw.kind,
        version: raw.version,
        pci: PciInfo {
            pci_address: set(pci.pci_address).ok_or(DeviceInfoError::NoPciAddress)?,
            pf_pci_address: set(pci.pf_pci_address),
            rdma_device: set(pci.rdma_device),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_uses_spec_keys_and_reads_back() {
        let info = DeviceInfo::pci(
            "0000:3b:00.2".into(),
            Some("0000:3b:00.0".into()),
            Some("mlx5_2".into()),
        );
        let bytes = serde_json::to_vec(&info).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"type": "pci", "version": "1.1.0", "pci": {
                "pci-address": "0000:3b:00.2", "pf-pci-address": "0000:3b:00.0",
                "rdma-device": "mlx5_2"}})
        );
        assert_eq!(parse(&bytes).unwrap(), info);
        let bare = DeviceInfo::pci("0000:3b:00.2".into(), None, None);
        let v = serde_json::to_value(&bare).unwrap();
        assert_eq!(v["pci"], serde_json::json!({"pci-address": "0000:3b:00.2"}));
        assert_eq!(parse(&serde_json::to_vec(&bare).unwrap()).unwrap(), bare);
    }

    /// A file as the device plugin wrote it before the writer moved here
    /// (`serde_json::to_vec_pretty` of its own struct): still read, and
    /// written again byte for byte.
    #[test]
    fn reads_and_writes_the_old_writers_file() {
        let old = r#"{
  "type": "pci",
  "version": "1.1.0",
  "pci": {
    "pci-address": "0000:3b:00.2",
    "pf-pci-address": "0000:3b:00.0",
    "rdma-device": "mlx5_2"
  }
}"#;
        let info = parse(old.as_bytes()).unwrap();
        assert_eq!(
            info,
            DeviceInfo::pci(
                "0000:3b:00.2".into(),
                Some("0000:3b:00.0".into()),
                Some("mlx5_2".into())
            )
        );
        assert_eq!(String::from_utf8(info.to_bytes()).unwrap(), old);
        let bare = DeviceInfo::pci("0000:3b:00.0".into(), None, None);
        assert_eq!(parse(&bare.to_bytes()).unwrap(), bare);
    }

    #[test]
    fn file_name_follows_the_spec() {
        assert_eq!(
            file_name("rdma-vf", "0000:3b:00.2"),
            "rdma-vf-0000:3b:00.2-device.json"
        );
    }

    #[test]
    fn bad_files_are_named() {
        for (bad, needle) in [
            (r#"{"type":"vdpa","version":"1.1.0","pci":{}}"#, "vdpa"),
            (r#"{"type":"pci","version":"2.0.0","pci":{}}"#, "2.0.0"),
            (r#"{"type":"pci","version":"1.1.0"}"#, "\"pci\" object"),
            (
                r#"{"type":"pci","version":"1.1.0","pci":{}}"#,
                "pci-address",
            ),
            (
                r#"{"type":"pci","version":"1.1.0","pci":{"pci-address":""}}"#,
                "pci-address",
            ),
            ("nope", "JSON"),
        ] {
            let e = parse(bad.as_bytes()).unwrap_err().to_string();
            assert!(e.contains(needle), "{bad}: {e}");
        }
    }

    #[test]
    fn empty_optional_fields_are_absent() {
        let d = parse(br#"{"type":"pci","version":"1.0.0","pci":{"pci-address":"0000:3b:00.2","pf-pci-address":"","rdma-device":""}}"#).unwrap();
        assert_eq!(d.pci.pf_pci_address, None);
        assert_eq!(d.pci.rdma_device, None);
    }
}
