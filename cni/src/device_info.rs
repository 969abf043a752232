//! device-info-spec 1.1.0 files (`runtimeConfig.CNIDeviceInfoFile`): the
//! device plugin's record of which PCI function a pod got.

use serde_json::Value;
use sriov_helpers::PciAddress;
use std::path::Path;

/// What kroce-cni takes from a device-info file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    pub pci_address: PciAddress,
    pub pf_pci_address: Option<PciAddress>,
    pub rdma_device: Option<String>,
}

/// Parses the file's JSON. Errors name the field and value.
pub fn parse(bytes: &[u8]) -> Result<DeviceInfo, String> {
    let v: Value = serde_json::from_slice(bytes).map_err(|e| format!("not JSON: {e}"))?;
    let ty = v.get("type").and_then(Value::as_str).unwrap_or_default();
    if ty != "pci" {
        return Err(format!("type {ty:?} is not \"pci\""));
    }
    let version = v.get("version").and_then(Value::as_str).unwrap_or_default();
    if !version.starts_with("1.") {
        return Err(format!(
            "version {version:?} is not a 1.x device-info-spec version"
        ));
    }
    let pci = v.get("pci").ok_or("the \"pci\" object is missing")?;
    let addr = |k: &str| -> Result<Option<PciAddress>, String> {
        match pci.get(k).and_then(Value::as_str) {
            None | Some("") => Ok(None),
            Some(s) => s.parse().map(Some).map_err(|e| format!("pci.{k}: {e}")),
        }
    };
    Ok(DeviceInfo {
        pci_address: addr("pci-address")?.ok_or("pci.pci-address is missing")?,
        pf_pci_address: addr("pf-pci-address")?,
        rdma_device: pci
            .get("rdma-device")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_string),
    })
}

/// Biggest device-info file read (the spec's are a few hundred bytes).
const MAX_SIZE: u64 = 64 * 1024;

/// Reads and parses a device-info file. The path comes with the config
/// (`runtimeConfig`), so only a regular file of at most 64 KiB is read: a
/// FIFO, a device or `/dev/zero` is refused, not waited on.
pub fn read(path: &Path) -> Result<DeviceInfo, String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let cannot = |e: std::io::Error| format!("cannot read {}: {e}", path.display());
    // Non-blocking: opening a FIFO for reading would wait for a writer.
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
        .open(path)
        .map_err(cannot)?;
    if !f.metadata().map_err(cannot)?.is_file() {
        return Err(format!("{} is not a regular file", path.display()));
    }
    let mut bytes = Vec::new();
    f.take(MAX_SIZE + 1)
        .read_to_end(&mut bytes)
        .map_err(cannot)?;
    if bytes.len() as u64 > MAX_SIZE {
        return Err(format!("{} is over {MAX_SIZE} bytes", path.display()));
    }
    parse(&bytes).map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_example() {
        let d = parse(br#"{"type":"pci","version":"1.1.0","pci":{"pci-address":"0000:3b:00.2","pf-pci-address":"0000:3b:00.0","rdma-device":"mlx5_2"}}"#).unwrap();
        assert_eq!(d.pci_address.to_string(), "0000:3b:00.2");
        assert_eq!(d.pf_pci_address.unwrap().to_string(), "0000:3b:00.0");
        assert_eq!(d.rdma_device.as_deref(), Some("mlx5_2"));
    }

    #[test]
    fn bad_files() {
        for (bad, needle) in [
            (r#"{"type":"vdpa","version":"1.1.0","pci":{}}"#, "type"),
            (r#"{"type":"pci","version":"2.0.0","pci":{}}"#, "version"),
            (r#"{"type":"pci","version":"1.1.0"}"#, "pci"),
            (
                r#"{"type":"pci","version":"1.1.0","pci":{"pci-address":"../x"}}"#,
                "pci-address",
            ),
            (
                r#"{"type":"pci","version":"1.1.0","pci":{}}"#,
                "pci-address",
            ),
            ("nope", "JSON"),
        ] {
            let e = parse(bad.as_bytes()).unwrap_err();
            assert!(e.contains(needle), "{bad}: {e}");
        }
    }
}
