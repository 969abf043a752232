//! device-info-spec 1.1.0 files (`runtimeConfig.CNIDeviceInfoFile`): the
//! device plugin's record of which PCI function a pod got.

use kroce_contracts::device_info::MAX_SIZE;
use sriov_helpers::PciAddress;
use std::path::{Path, PathBuf};

/// What kroce-cni takes from a device-info file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    pub pci_address: PciAddress,
    pub pf_pci_address: Option<PciAddress>,
    pub rdma_device: Option<String>,
}

/// Parses the file's JSON ([`kroce_contracts::device_info`], the format the
/// device plugin and the DRA plugin write). Errors name the field and value.
pub fn parse(bytes: &[u8]) -> Result<DeviceInfo, DeviceInfoFileError> {
    let d = kroce_contracts::device_info::parse(bytes)?;
    let addr = |key: &'static str, s: &str| -> Result<PciAddress, DeviceInfoFileError> {
        s.parse()
            .map_err(|source| DeviceInfoFileError::Pci { key, source })
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

/// A device-info file kroce-cni cannot use: which file, and why.
#[derive(Debug, thiserror::Error)]
pub enum DeviceInfoFileError {
    #[error(transparent)]
    Contract(#[from] kroce_contracts::device_info::DeviceInfoError),
    #[error("pci.{key}: {source}")]
    Pci {
        key: &'static str,
        #[source]
        source: sriov_helpers::ParseError,
    },
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} is not a regular file", path.display())]
    NotRegular { path: PathBuf },
    #[error("{} is over {MAX_SIZE} bytes", path.display())]
    TooBig { path: PathBuf },
    #[error("{}: {source}", path.display())]
    Parse {
        path: PathBuf,
        #[source]
        source: Box<DeviceInfoFileError>,
    },
}

/// Reads and parses a device-info file. The path comes with the config
/// (`runtimeConfig`), so only a regular file of at most 64 KiB is read: a
/// FIFO, a device or `/dev/zero` is refused, not waited on.
pub fn read(path: &Path) -> Result<DeviceInfo, DeviceInfoFileError> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let cannot = |source| DeviceInfoFileError::Read {
        path: path.to_path_buf(),
        source,
    };
    // Non-blocking: opening a FIFO for reading would wait for a writer.
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
        .open(path)
        .map_err(cannot)?;
    if !f.metadata().map_err(cannot)?.is_file() {
        return Err(DeviceInfoFileError::NotRegular {
            path: path.to_path_buf(),
        });
    }
    let mut bytes = Vec::new();
    f.take(MAX_SIZE + 1)
        .read_to_end(&mut bytes)
        .map_err(cannot)?;
    if bytes.len() as u64 > MAX_SIZE {
        return Err(DeviceInfoFileError::TooBig {
            path: path.to_path_buf(),
        });
    }
    parse(&bytes).map_err(|e| DeviceInfoFileError::Parse {
        path: path.to_path_buf(),
        source: Box::new(e),
    })
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
            let e = parse(bad.as_bytes()).unwrap_err().to_string();
            assert!(e.contains(needle), "{bad}: {e}");
        }
    }
}
