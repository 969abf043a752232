//! Writing `sriov_numvfs`: one write per call (the agent plans the "0, then
//! N" sequence the kernel requires), with a timeout because a driver can
//! block the write for a long time, and the kernel's errors turned into
//! something an admin can act on.

use sriov_helpers::{HostError, HostRoot, PciAddress};
use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum SriovNumvfsError {
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
    /// An earlier write timed out and the kernel is still in it: writing
    /// again would queue behind it (or race it).
    #[error(
        "{pf}: an earlier write of sriov_numvfs={num} is still running in the kernel ({elapsed:?}); not writing again until it returns"
    )]
    Busy {
        pf: PciAddress,
        num: u32,
        elapsed: Duration,
    },
    #[error("{pf}: {source}")]
    Host {
        pf: PciAddress,
        #[source]
        source: HostError,
    },
}

impl SriovNumvfsError {
    /// Condition reason for the error.
    pub fn reason(&self) -> &'static str {
        match self {
            SriovNumvfsError::Timeout { .. } => "VfCreateTimeout",
            SriovNumvfsError::Busy { .. } => "VfWriteInProgress",
            SriovNumvfsError::Kernel { source, .. } => match source.raw_os_error() {
                Some(libc::ENOSPC) => "VfResourcesExhausted",
                Some(libc::EBUSY) => "VfBusy",
                _ => "VfCreateFailed",
            },
            SriovNumvfsError::Host { .. } => "VfCreateFailed",
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

fn map_host_error(pf: PciAddress, num: u32, e: HostError) -> SriovNumvfsError {
    match e {
        HostError::Write { source, .. } => SriovNumvfsError::Kernel {
            pf,
            num,
            hint: errno_hint(source.raw_os_error()),
            source,
        },
        other => SriovNumvfsError::Host { pf, source: other },
    }
}

pub trait VfControl: Send + Sync {
    /// One write of `num` to the PF's `sriov_numvfs`.
    fn write_num_vfs(&self, pf: PciAddress, num: u32) -> Result<(), SriovNumvfsError>;
}

/// A write that outlived its timeout, still in the kernel.
#[derive(Debug)]
struct InFlight {
    num: u32,
    started: std::time::Instant,
    done: Arc<AtomicBool>,
}

/// The real thing: the sysfs write on a helper thread, abandoned (and
/// reported) if it does not return within `timeout`. An abandoned write
/// keeps its PF busy until its thread returns: later writes to that PF are
/// refused with [`SriovNumvfsError::Busy`] instead of piling up behind it.
#[derive(Debug, Clone)]
pub struct SysfsVfControl {
    pub root: HostRoot,
    pub timeout: Duration,
    in_flight: Arc<Mutex<BTreeMap<PciAddress, InFlight>>>,
}

impl SysfsVfControl {
    pub fn new(root: HostRoot, timeout: Duration) -> Self {
        SysfsVfControl {
            root,
            timeout,
            in_flight: Arc::default(),
        }
    }
}

impl VfControl for SysfsVfControl {
    fn write_num_vfs(&self, pf: PciAddress, num: u32) -> Result<(), SriovNumvfsError> {
        {
            let mut in_flight = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(w) = in_flight.get(&pf) {
                if !w.done.load(Ordering::SeqCst) {
                    return Err(SriovNumvfsError::Busy {
                        pf,
                        num: w.num,
                        elapsed: w.started.elapsed(),
                    });
                }
                in_flight.remove(&pf);
            }
        }
        let started = std::time::Instant::now();
        let (tx, rx) = std::sync::mpsc::channel();
        let root = self.root.clone();
        let done = Arc::new(AtomicBool::new(false));
        let finished = done.clone();
        std::thread::Builder::new()
            .name(format!("sriov-numvfs-{pf}"))
            .spawn(move || {
                let r = sriov_helpers::pci::set_num_vfs(&root, pf, num);
                finished.store(true, Ordering::SeqCst);
                // Nobody waits any more after a timeout: say how it ended.
                if let Err(r) = tx.send(r) {
                    match r.0 {
                        Ok(()) => tracing::warn!(%pf, num, "late sriov_numvfs write finished"),
                        Err(e) => {
                            tracing::warn!(%pf, num, error = %e, "late sriov_numvfs write failed")
                        }
                    }
                }
            })
            .map_err(|source| SriovNumvfsError::Kernel {
                pf,
                num,
                hint: "cannot start the writer thread",
                source,
            })?;
        match rx.recv_timeout(self.timeout) {
            Ok(r) => r.map_err(|e| map_host_error(pf, num, e)),
            Err(_) => {
                self.in_flight
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(pf, InFlight { num, started, done });
                Err(SriovNumvfsError::Timeout {
                    pf,
                    num,
                    timeout: self.timeout,
                })
            }
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
    fn write_num_vfs(&self, pf: PciAddress, num: u32) -> Result<(), SriovNumvfsError> {
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
            return Err(SriovNumvfsError::Kernel {
                pf,
                num,
                hint: errno_hint(Some(errno)),
                source: io::Error::from_raw_os_error(errno),
            });
        }
        let mut host = self.host.lock().map_err(|_| SriovNumvfsError::Kernel {
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
            return Err(SriovNumvfsError::Kernel {
                pf,
                num,
                hint: errno_hint(Some(libc::EBUSY)),
                source: io::Error::from_raw_os_error(libc::EBUSY),
            });
        }
        host.set_num_vfs(&pf, num)
            .map_err(|source| SriovNumvfsError::Kernel {
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
        let e = SriovNumvfsError::Kernel {
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
        let ctl = SysfsVfControl::new(host.root(), Duration::from_secs(5));
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

#[cfg(test)]
mod busy_tests {
    use super::*;
    use std::io::Write as _;

    /// Issue 19: a timed-out write keeps its PF busy, so the next pass does
    /// not write again while the kernel is still in the first one. A FIFO
    /// stands in for a `sriov_numvfs` whose driver blocks.
    #[test]
    fn a_timed_out_write_marks_its_pf_busy_until_it_returns() {
        let host = sriov_helpers::fixture::FixtureHost::connectx6dx_pair().unwrap();
        let pf: PciAddress = "0000:3b:00.0".parse().unwrap();
        let file = host.root().pci_devices().join("0000:3b:00.0/sriov_numvfs");
        std::fs::remove_file(&file).unwrap();
        nix::unistd::mkfifo(&file, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let ctl = SysfsVfControl::new(host.root(), Duration::from_millis(100));
        let e = ctl.write_num_vfs(pf, 4).unwrap_err();
        assert!(matches!(e, SriovNumvfsError::Timeout { .. }), "{e}");
        // Still blocked: refused at once, no second writer.
        let t = std::time::Instant::now();
        let e = ctl.write_num_vfs(pf, 4).unwrap_err();
        assert!(t.elapsed() < Duration::from_millis(50), "{:?}", t.elapsed());
        assert_eq!(e.reason(), "VfWriteInProgress");
        assert!(
            e.to_string().contains("0000:3b:00.0") && e.to_string().contains("still running"),
            "{e}"
        );
        // The kernel returns: the blocked read of the current count gets 4,
        // the write is done (nothing to change).
        let mut w = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
        w.write_all(b"4\n").unwrap();
        drop(w);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            match ctl.write_num_vfs(pf, 4) {
                Err(SriovNumvfsError::Busy { .. }) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                // Free again: a new write runs (and blocks on the FIFO).
                Err(SriovNumvfsError::Timeout { .. }) => break,
                other => panic!("{other:?}"),
            }
        }
        // Unblock that writer too so its thread ends.
        let mut w = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
        w.write_all(b"4\n").unwrap();
        drop(w);
    }
}
