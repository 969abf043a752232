//! State shared by the reconciler and the per-pool gRPC servers: the latest
//! snapshot, the settings Allocate needs, and what Allocate handed out.

use crate::inventory::Candidate;
use crate::resource_name::ResourceName;
use crate::snapshot::Snapshot;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::watch;

/// Where a handed-out VF is, as far as this plugin has seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Allocated; its netdev has not left the host namespace yet.
    Allocated,
    /// Its netdev left (moved into the pod). When it comes back, the pod is gone.
    Moved,
}

#[derive(Debug, Default)]
pub struct Allocations {
    handed_out: BTreeMap<(ResourceName, String), Phase>,
    /// Device-info files written and their pool; removed when the plugin
    /// stops or the pool goes.
    devinfo_files: BTreeMap<PathBuf, ResourceName>,
}

impl Allocations {
    pub fn record(&mut self, resource: &ResourceName, base_ids: impl IntoIterator<Item = String>) {
        for id in base_ids {
            self.handed_out
                .entry((resource.clone(), id))
                .or_insert(Phase::Allocated);
        }
    }

    pub fn add_devinfo_files(&mut self, resource: &ResourceName, paths: Vec<PathBuf>) {
        for p in paths {
            self.devinfo_files.insert(p, resource.clone());
        }
    }

    /// Forgets and returns the device-info files of one pool (or of all).
    pub fn take_devinfo_files(&mut self, resource: Option<&ResourceName>) -> Vec<PathBuf> {
        let (taken, kept) = std::mem::take(&mut self.devinfo_files)
            .into_iter()
            .partition(|(_, r)| resource.is_none_or(|want| want == r));
        self.devinfo_files = kept;
        taken.into_keys().collect()
    }

    pub fn is_handed_out(&self, resource: &ResourceName, id: &str) -> bool {
        self.handed_out
            .contains_key(&(resource.clone(), id.to_string()))
    }

    /// Follows each handed-out device through a scan: netdev gone means it
    /// moved into the pod; back again means the pod released it.
    pub fn observe(&mut self, candidates: &[Candidate]) {
        let by_id: BTreeMap<&str, &Candidate> =
            candidates.iter().map(|c| (c.id.as_str(), c)).collect();
        self.handed_out.retain(|(_, id), phase| {
            let Some(c) = by_id.get(id.as_str()) else {
                return false;
            };
            let visible = c.netdev.as_ref().is_some_and(|n| n.present);
            match (*phase, visible) {
                (Phase::Moved, true) => false,
                (_, false) => {
                    *phase = Phase::Moved;
                    true
                }
                (Phase::Allocated, true) => true,
            }
        });
    }
}

#[derive(Debug)]
pub struct Shared {
    pub snapshot: watch::Receiver<Arc<Snapshot>>,
    pub cdi: bool,
    pub devinfo_dir: PathBuf,
    allocations: Mutex<Allocations>,
}

impl Shared {
    pub fn new(snapshot: watch::Receiver<Arc<Snapshot>>, cdi: bool, devinfo_dir: PathBuf) -> Self {
        Shared {
            snapshot,
            cdi,
            devinfo_dir,
            allocations: Mutex::new(Allocations::default()),
        }
    }

    /// A poisoned lock only means another task panicked mid-update of plain
    /// bookkeeping; keep going with what is there.
    pub fn allocations(&self) -> MutexGuard<'_, Allocations> {
        self.allocations
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn latest(&self) -> Arc<Snapshot> {
        self.snapshot.borrow().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host_view::HostView;
    use crate::inventory::{Memory, candidates};

    #[test]
    fn handed_out_vf_is_forgotten_once_its_netdev_returns() {
        let (_dir, fx) = crate::testing::connectx_pair();
        let res = ResourceName::parse("vf").unwrap();
        let scan = |mem: &mut Memory| candidates(&HostView::scan(&fx.root()), mem);
        let mut mem = Memory::default();
        let mut book = Allocations::default();
        book.record(&res, ["0000:3b:00.2".to_string()]);
        book.observe(&scan(&mut mem));
        // Still in the host namespace: still handed out (the pod may not have started).
        assert!(book.is_handed_out(&res, "0000:3b:00.2"));
        fx.remove_netdev("ens1f0v0").unwrap();
        book.observe(&scan(&mut mem));
        assert!(book.is_handed_out(&res, "0000:3b:00.2"));
        // Back in the host namespace: the pod released it.
        let link = fx.path().join("sys/class/net/ens1f0v0");
        let target = std::fs::canonicalize(
            fx.path()
                .join("sys/bus/pci/devices/0000:3b:00.2/net/ens1f0v0"),
        )
        .unwrap();
        std::os::unix::fs::symlink(target, link).unwrap();
        book.observe(&scan(&mut mem));
        assert!(!book.is_handed_out(&res, "0000:3b:00.2"));
    }
}
