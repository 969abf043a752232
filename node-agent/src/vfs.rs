//! Writing `sriov_numvfs`: one write per call (the agent plans the "0, then
//! N" sequence the kernel requires), with a timeout because a driver can
//! block the write for a long time, and the kernel's errors turned into
//! something an admin can act on.

use sriov_helpers::{HostError, HostRoot, PciAddress};
use std::io;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum VfError {
    #[error("{pf}: writing sriov_numvfs={num} did not finish within {timeout:?} (driver blocked)")]
    Timeout {
        pf: PciAddress,
        num: u32,
        timeout: Duration,
    },
    #[error("{pf}: sriov_numvfs={num} refused: {hint} ({source})")]
    Kernel {
        pf: PciAddress,
        num: u32,
        hint: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("{pf}: {source}")]
    Host {
        pf: PciAddress,
        #[source]
        source: HostError,
    },
}

impl VfError {
    /// Condition reason for the error.
    pub fn reason(&self) -> &'static str {
        match self {
            VfError::Timeout { .. } => "VfCreateTimeout",
            VfError::Kernel { source, .. } => match source.raw_os_error() {
                Some(libc::ENOSPC) => "VfResourcesExhausted",
                Some(libc::EBUSY) => "VfBusy",
                _ => "VfCreateFailed",
            },
            VfError::Host { .. } => "VfCreateFailed",
        }
    }
}

/// What an errno from `sriov_numvfs` means in practice.
pub fn errno_hint(errno: Option<i32>) -> &'static str {
    match errno {
        Some(libc::ENOSPC) => {
            "not enough MSI-X vectors or bus numbers for that many VFs; lower numVfs or raise the firmware's VF limit (e.g. NUM_OF_VFS)"
        }
        Some(libc::EBUSY) => {
            "device busy: VFs still exist or are in use, or another change is in progress"
        }
        Some(libc::ENOMEM) => "the driver could not allocate memory for the VFs",
        Some(libc::EINVAL) => "more VFs than sriov_totalvfs, or the driver rejects the count",
        Some(libc::EPERM) | Some(libc::EACCES) => {
            "permission denied: the agent needs CAP_SYS_ADMIN and a writable /sys"
        }
        Some(libc::EIO) => "the firmware failed the request (see dmesg)",
        _ => "the kernel refused",
    }
}

fn map_host_error(pf: PciAddress, num: u32, e: HostError) -> VfError {
    match e {
        HostError::Write { source, .. } => VfError::Kernel {
            pf,
            num,
            hint: errno_hint(source.raw_os_error()),
            source,
        },
        other => VfError::Host { pf, source: other },
    }
}

pub trait VfControl: Send + Sync {
    /// One write of `num` to the PF's `sriov_numvfs`.
    fn write_num_vfs(&self, pf: PciAddress, num: u32) -> Result<(), VfError>;
}

/// The real thing: the sysfs write on a helper thread, abandoned (and
/// reported) if it does not return within `timeout`.
#[derive(Debug, Clone)]
pub struct SysfsVfControl {
    pub root: HostRoot,
    pub timeout: Duration,
}

impl VfControl for SysfsVfControl {
    fn write_num_vfs(&self, pf: PciAddress, num: u32) -> Result<(), VfError> {
        let (tx, rx) = std::sync::mpsc::channel();
        let root = self.root.clone();
        std::thread::Builder::new()
            .name(format!("sriov-numvfs-{pf}"))
            .spawn(move || {
                let _ = tx.send(sriov_helpers::pci::set_num_vfs(&root, pf, num));
            })
            .map_err(|source| VfError::Kernel {
                pf,
                num,
                hint: "cannot start the writer thread",
                source,
            })?;
        match rx.recv_timeout(self.timeout) {
            Ok(r) => r.map_err(|e| map_host_error(pf, num, e)),
            Err(_) => Err(VfError::Timeout {
                pf,
                num,
                timeout: self.timeout,
            }),
        }
    }
}

/// The simulated kernel for fixture hosts: a write creates or removes the
/// VF entries like the real one (via [`sriov_helpers::fixture::FixtureHost::set_num_vfs`]);
/// errors can be injected per PF; every write is recorded.
#[cfg(any(test, feature = "testing"))]
#[derive(Debug)]
pub struct FixtureKernel {
    pub host: std::sync::Mutex<sriov_helpers::fixture::FixtureHost>,
    pub writes: std::sync::Mutex<Vec<(PciAddress, u32)>>,
    /// `(pf, errno)`: the next writes of a non-zero count to this PF fail.
    pub fail: std::sync::Mutex<Vec<(PciAddress, i32)>>,
    /// Extra hook run after each write (e.g. to lay out configfs entries for
    /// new RDMA devices as `mkdir` would populate them).
    pub after_write: Option<fn(&sriov_helpers::fixture::FixtureHost)>,
}

#[cfg(any(test, feature = "testing"))]
impl FixtureKernel {
    pub fn new(host: sriov_helpers::fixture::FixtureHost) -> Self {
        FixtureKernel {
            host: std::sync::Mutex::new(host),
            writes: std::sync::Mutex::new(Vec::new()),
            fail: std::sync::Mutex::new(Vec::new()),
            after_write: None,
        }
    }
    pub fn writes(&self) -> Vec<(PciAddress, u32)> {
        self.writes.lock().map(|w| w.clone()).unwrap_or_default()
    }
}

#[cfg(any(test, feature = "testing"))]
impl VfControl for FixtureKernel {
    fn write_num_vfs(&self, pf: PciAddress, num: u32) -> Result<(), VfError> {
        if let Ok(mut w) = self.writes.lock() {
            w.push((pf, num));
        }
        let injected = self
            .fail
            .lock()
            .ok()
            .and_then(|f| f.iter().find(|(p, _)| *p == pf).map(|(_, e)| *e));
        if let Some(errno) = injected
            && num != 0
        {
            return Err(VfError::Kernel {
                pf,
                num,
                hint: errno_hint(Some(errno)),
                source: io::Error::from_raw_os_error(errno),
            });
        }
        let mut host = self.host.lock().map_err(|_| VfError::Kernel {
            pf,
            num,
            hint: "fixture lock poisoned",
            source: io::Error::other("poisoned"),
        })?;
        // The kernel refuses N -> M without going through 0.
        let current: u32 = std::fs::read_to_string(
            host.root()
                .pci_devices()
                .join(pf.to_string())
                .join("sriov_numvfs"),
        )
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
        if current != 0 && num != 0 && current != num {
            return Err(VfError::Kernel {
                pf,
                num,
                hint: errno_hint(Some(libc::EBUSY)),
                source: io::Error::from_raw_os_error(libc::EBUSY),
            });
        }
        host.set_num_vfs(&pf, num)
            .map_err(|source| VfError::Kernel {
                pf,
                num,
                hint: "fixture",
                source,
            })?;
        if let Some(f) = self.after_write {
            f(&host);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_hints_and_reasons() {
        let e = VfError::Kernel {
            pf: PciAddress::new(0, 0x3b, 0, 0),
            num: 64,
            hint: errno_hint(Some(libc::ENOSPC)),
            source: io::Error::from_raw_os_error(libc::ENOSPC),
        };
        assert_eq!(e.reason(), "VfResourcesExhausted");
        let text = e.to_string();
        assert!(
            text.contains("0000:3b:00.0") && text.contains("MSI-X"),
            "{text}"
        );
        assert!(errno_hint(Some(libc::EBUSY)).contains("busy"));
    }

    #[test]
    fn real_sysfs_write_on_a_fixture_file_and_missing_pf_error() {
        let host = sriov_helpers::fixture::FixtureHost::connectx6dx_pair().unwrap();
        let ctl = SysfsVfControl {
            root: host.root(),
            timeout: Duration::from_secs(5),
        };
        let pf: PciAddress = "0000:3b:00.0".parse().unwrap();
        // A plain file takes the write (the fixture has no kernel behind it).
        ctl.write_num_vfs(pf, 0).unwrap();
        let path = host.root().pci_devices().join("0000:3b:00.0/sriov_numvfs");
        assert_eq!(std::fs::read_to_string(path).unwrap().trim(), "0");
        let missing: PciAddress = "0000:99:00.0".parse().unwrap();
        let e = ctl.write_num_vfs(missing, 4).unwrap_err();
        assert!(e.to_string().contains("0000:99:00.0"), "{e}");
    }
}
