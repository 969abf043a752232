//! The plugin's state and the two operations the kubelet calls: prepare and
//! unprepare one claim, idempotent, checkpointed, all-or-nothing on disk.

use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::claims::{ClaimError, ClaimRef, ClaimSource, allocation_of};
use crate::prepare::{self, Paths, PlanError, PreparedDevice};
use crate::slice::Published;
use kroce_device_plugin::files::{self, FileError};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::watch;

#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error("claim {claim}: {source}")]
    Plan {
        claim: String,
        #[source]
        source: PlanError,
    },
    #[error(transparent)]
    Claim(#[from] ClaimError),
    #[error("claim {claim}: {source} (nothing was left behind)")]
    Write {
        claim: String,
        #[source]
        source: FileError,
    },
    #[error("claim {claim}: {source} (prepared files removed again)")]
    Checkpoint {
        claim: String,
        #[source]
        source: CheckpointError,
    },
}

#[derive(Debug, thiserror::Error)]
#[error("claim {claim}: unprepare failed: {}", .errors.join("; "))]
pub struct UnprepareError {
    pub claim: String,
    pub errors: Vec<String>,
}

/// Published devices by name.
pub type Inventory = BTreeMap<String, Published>;

#[derive(Debug)]
pub struct DriverState {
    node: String,
    paths: Paths,
    claims: Arc<dyn ClaimSource>,
    /// The last scan's devices; receivers (the health stream) see each new one.
    inventory: watch::Sender<Arc<Inventory>>,
    checkpoint_path: PathBuf,
    /// Held from planning to the checkpoint save of a prepare, and across an
    /// unprepare: the kubelet may call concurrently, and two claims must
    /// never race for one device.
    checkpoint: tokio::sync::Mutex<Checkpoint>,
}

impl DriverState {
    pub fn open(
        node: &str,
        paths: Paths,
        claims: Arc<dyn ClaimSource>,
        checkpoint_path: PathBuf,
    ) -> Result<DriverState, CheckpointError> {
        let cp = Checkpoint::load(&checkpoint_path)?;
        Ok(DriverState {
            node: node.to_string(),
            paths,
            claims,
            inventory: watch::Sender::new(Arc::default()),
            checkpoint_path,
            checkpoint: tokio::sync::Mutex::new(cp),
        })
    }

    pub fn node(&self) -> &str {
        &self.node
    }

    pub fn set_inventory(&self, devices: Vec<Published>) {
        let inv: Inventory = devices
            .into_iter()
            .map(|p| (p.device.name.clone(), p))
            .collect();
        self.inventory.send_replace(Arc::new(inv));
    }

    /// The last scan's devices.
    pub fn inventory(&self) -> Arc<Inventory> {
        self.inventory.borrow().clone()
    }

    /// Sees every new scan's devices.
    pub fn watch_inventory(&self) -> watch::Receiver<Arc<Inventory>> {
        self.inventory.subscribe()
    }

    /// Names of prepared devices (their netdev may be in a pod: not a fault).
    pub async fn in_use(&self) -> BTreeSet<String> {
        self.checkpoint.lock().await.devices().into_keys().collect()
    }

    /// UIDs of prepared claims.
    pub async fn prepared_claims(&self) -> Vec<String> {
        self.checkpoint
            .lock()
            .await
            .claims
            .keys()
            .cloned()
            .collect()
    }

    /// Prepares one claim. A claim already prepared gets the same answer
    /// without asking the API server again.
    pub async fn prepare(&self, claim: &ClaimRef) -> Result<Vec<PreparedDevice>, PrepareError> {
        let plan_err = |source| PrepareError::Plan {
            claim: claim.to_string(),
            source,
        };
        prepare::check_uid(&claim.uid).map_err(plan_err)?;
        if let Some(done) = self.checkpoint.lock().await.claims.get(&claim.uid) {
            return Ok(done.devices.clone());
        }
        // The API call runs without the lock: a slow API server must not
        // hold up other claims' unprepare.
        let rc = self.claims.get(claim).await?;
        let alloc = allocation_of(claim, &rc)?;
        let mut cp = self.checkpoint.lock().await;
        // Prepared meanwhile by a concurrent call for the same claim.
        if let Some(done) = cp.claims.get(&claim.uid) {
            return Ok(done.devices.clone());
        }
        let plan = prepare::plan(
            claim,
            &alloc,
            &self.node,
            &self.inventory(),
            &cp.devices(),
            &self.paths,
        )
        .map_err(plan_err)?;
        let mut written = Vec::new();
        for (path, bytes) in &plan.writes {
            if let Err(source) = files::write_atomic(path, bytes) {
                remove_all(&written);
                return Err(PrepareError::Write {
                    claim: claim.to_string(),
                    source,
                });
            }
            written.push(path.clone());
        }
        cp.claims.insert(claim.uid.clone(), plan.claim.clone());
        if let Err(source) = cp.save(&self.checkpoint_path) {
            cp.claims.remove(&claim.uid);
            remove_all(&written);
            return Err(PrepareError::Checkpoint {
                claim: claim.to_string(),
                source,
            });
        }
        Ok(plan.claim.devices)
    }

    /// Unprepares one claim: removes its files (a file already gone is
    /// fine) and forgets it. A claim not prepared here is already done.
    /// When a file cannot be removed the claim stays in the checkpoint, so
    /// the kubelet's retry tries again.
    pub async fn unprepare(&self, claim: &ClaimRef) -> Result<(), UnprepareError> {
        let mut cp = self.checkpoint.lock().await;
        let Some(prepared) = cp.claims.get(&claim.uid).cloned() else {
            return Ok(());
        };
        let mut errors: Vec<String> = prepared
            .files
            .iter()
            .filter_map(|p| files::remove(p).err().map(|e| e.to_string()))
            .collect();
        if errors.is_empty() {
            cp.claims.remove(&claim.uid);
            if let Err(e) = cp.save(&self.checkpoint_path) {
                // The files are gone; the entry comes back so the retry
                // saves again (removing gone files is not an error).
                cp.claims.insert(claim.uid.clone(), prepared);
                errors.push(e.to_string());
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(UnprepareError {
                claim: claim.to_string(),
                errors,
            })
        }
    }
}

fn remove_all(paths: &[PathBuf]) {
    for p in paths {
        if let Err(e) = files::remove(p) {
            tracing::warn!(error = %e, "cannot remove a file of a failed prepare");
        }
    }
}
