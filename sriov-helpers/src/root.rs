//! The host root: where `sys/`, `proc/` and `dev/` are found. The real host is
//! `/`; tests and the demo use a fixture tree in a temp dir.

use std::path::{Path, PathBuf};

/// Roots of the three trees the host model reads. Each can be set separately
/// (a container usually sees the host's `/sys` at `/sys` but its `/dev` elsewhere).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRoot {
    sys: PathBuf,
    proc: PathBuf,
    dev: PathBuf,
}

impl HostRoot {
    /// All three trees under one root: `<root>/sys`, `<root>/proc`, `<root>/dev`.
    pub fn new(root: impl AsRef<Path>) -> Self {
        let root = root.as_ref();
        HostRoot {
            sys: root.join("sys"),
            proc: root.join("proc"),
            dev: root.join("dev"),
        }
    }

    /// Explicit paths for each tree (the `/sys`, `/proc`, `/dev` themselves).
    pub fn with_paths(sys: PathBuf, proc: PathBuf, dev: PathBuf) -> Self {
        HostRoot { sys, proc, dev }
    }

    /// The live host.
    pub fn real() -> Self {
        HostRoot::new("/")
    }

    pub fn sys(&self) -> &Path {
        &self.sys
    }
    pub fn proc(&self) -> &Path {
        &self.proc
    }
    pub fn dev(&self) -> &Path {
        &self.dev
    }

    pub fn pci_devices(&self) -> PathBuf {
        self.sys.join("bus/pci/devices")
    }
    pub fn class_net(&self) -> PathBuf {
        self.sys.join("class/net")
    }
    pub fn class_infiniband(&self) -> PathBuf {
        self.sys.join("class/infiniband")
    }
    pub fn class_verbs(&self) -> PathBuf {
        self.sys.join("class/infiniband_verbs")
    }
    pub fn class_mad(&self) -> PathBuf {
        self.sys.join("class/infiniband_mad")
    }
    pub fn numa_nodes(&self) -> PathBuf {
        self.sys.join("devices/system/node")
    }
    pub fn dev_infiniband(&self) -> PathBuf {
        self.dev.join("infiniband")
    }
    pub fn proc_irq(&self) -> PathBuf {
        self.proc.join("irq")
    }
}
