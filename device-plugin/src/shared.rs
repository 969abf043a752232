//! State shared by the reconciler and the per-pool gRPC servers: the latest
//! snapshot, the settings Allocate needs, and what Allocate handed out.

use crate::resource_name::ResourceName;
use crate::snapshot::Snapshot;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// What Allocate handed out, with when: the kubelet records an allocation
/// only after Allocate returns, so for a short while this process knows of
/// it and the kubelet's answers do not yet.
#[derive(Debug, Default)]
pub struct Allocations {
    recent: BTreeMap<(String, String), Instant>,
    /// Bumped by every Allocate: the device-info files it wrote are a change
    /// the periodic check must see even when the grace is already over.
    generation: u64,
}

impl Allocations {
    pub fn record(
        &mut self,
        resource: &ResourceName,
        ids: impl IntoIterator<Item = String>,
        at: Instant,
    ) {
        for id in ids {
            self.recent.insert((resource.to_string(), id), at);
        }
        self.generation += 1;
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The allocations a kubelet answer taken at `asked_at` may not show
    /// yet (made less than `grace` before it); older ones are forgotten.
    /// `None` (no answer): all of them, forgetting none.
    pub fn pending(
        &mut self,
        asked_at: Option<Instant>,
        grace: Duration,
    ) -> BTreeSet<(String, String)> {
        if let Some(asked) = asked_at {
            self.recent.retain(|_, at| *at + grace > asked);
        }
        self.recent.keys().cloned().collect()
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

    #[test]
    fn allocations_are_pending_only_until_the_kubelet_was_asked_after_the_grace() {
        let res = ResourceName::parse("vf").unwrap();
        let t0 = Instant::now();
        let grace = Duration::from_secs(1);
        let mut book = Allocations::default();
        book.record(&res, ["0000:3b:00.2".to_string()], t0);
        let key = ("rdma/vf".to_string(), "0000:3b:00.2".to_string());
        // Asked right after Allocate: the kubelet may not show it yet.
        assert!(book.pending(Some(t0 + grace / 2), grace).contains(&key));
        // No answer at all: kept.
        assert!(book.pending(None, grace).contains(&key));
        // Asked after the grace: the kubelet's answer decides, and it is forgotten.
        assert!(book.pending(Some(t0 + grace), grace).is_empty());
        assert!(book.pending(None, grace).is_empty());
    }
}
