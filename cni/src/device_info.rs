//! device-info-spec 1.1.0 files (`runtimeConfig.CNIDeviceInfoFile`): the
//! device plugin's record of which PCI function a pod got.

use kroce_contracts::device_info::MAX_SIZE;
use sriov_helpers::PciAddress;
use std::path::Path;

/// What kroce-cni takes from a device-info file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    pub pci_address: PciAddress,
    pub pf_pci_address: Option<PciAddress>,
    pub rdma_device: Option<String>,
}

/// Parses the file's JSON ([`kroce_contracts::device_info`], the format the
/// device plugin and the DRA plugin write). Errors name the field and value.
pub fn parse(bytes: &[u8]) -> Result<DeviceInfo, String> {
    let d = kroce_contracts::device_info::parse(bytes).map_err(|e| e.to_string())?;
    let addr = |k: &str, s: &str| -> Result<PciAddress, String> {
        s.parse().map_err(|e| format!("pci.{k}: {e}"))
    };
    Ok(DeviceInfo {
        pci_address: addr("pci-address", &d.pci.pci_address)?,
        pf_pci_address: d
            .pci
            .pf_pci_address
            .as_deref()
            .map(|p| addr("pf-pci-address", p))
            .transpose()?,
        rdma_device: d.pci.rdma_device,
    })
}

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
