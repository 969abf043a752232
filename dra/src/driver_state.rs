//! The plugin's state and the two operations the kubelet calls: prepare and
//! unprepare one claim, idempotent, checkpointed, all-or-nothing on disk.
//!
//! Prepares and unprepares of different claims run in parallel: a short
//! std mutex guards the in-memory book (planning against the devices
//! already taken happens under it), the files are written off the async
//! workers, and the checkpoint is written by group commit — every change
//! queued while a write is in flight goes into the next write, so N
//! concurrent prepares cost about two write+fsync rounds instead of N.
//! No call answers before a checkpoint containing its change is on disk;
//! the checkpoint never lists a claim whose files are not all written
//! (files first, then the checkpoint), as before. Calls for one claim are
//! serialised by a per-claim lock.

use crate::checkpoint::{Checkpoint, CheckpointError, CheckpointStore, FileCheckpoint};
use crate::claims::{ClaimError, ClaimRef, ClaimSource, allocation_of};
use crate::prepare::{self, Paths, PlanError, PreparedClaim, PreparedDevice};
use crate::slice::Published;
use kroce_contracts::atomic_file::{self, AtomicFileError, Modes};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use tokio::sync::{oneshot, watch};

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
        source: AtomicFileError,
    },
    #[error("claim {claim}: {source} (prepared files removed again)")]
    Checkpoint {
        claim: String,
        #[source]
        source: Arc<CheckpointError>,
    },
    #[error("claim {claim}: prepare ended early: {message}")]
    Task { claim: String, message: String },
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
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    node: String,
    paths: Paths,
    claims: Arc<dyn ClaimSource>,
    /// The last scan's devices; receivers (the health stream) see each new one.
    inventory: watch::Sender<Arc<Inventory>>,
    store: Arc<dyn CheckpointStore>,
    /// Never held across an await.
    book: Arc<Mutex<Book>>,
    /// One lock per claim with a call in progress: two calls for one claim
    /// (a retry overtaking the first, an unprepare racing a prepare) never
    /// interleave.
    claim_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// What is prepared, as far as answers and planning are concerned.
#[derive(Debug)]
struct Book {
    /// The last checkpoint on disk plus the changes queued or being
    /// written (each of those is held by a call still waiting for it).
    cp: Checkpoint,
    /// Devices of claims planned whose files are being written: not in
    /// `cp` yet, but no other claim may take them. By claim UID.
    reserved: BTreeMap<String, Vec<String>>,
    /// Changes not yet in a write.
    queued: Vec<Change>,
    /// A writer task is running; it takes `queued` until it is empty.
    writing: bool,
}

type Commit = Result<(), Arc<CheckpointError>>;

/// One claim's change of the checkpoint, waiting for a write.
#[derive(Debug)]
struct Change {
    uid: String,
    /// Put back when the write fails.
    before: Option<PreparedClaim>,
    done: oneshot::Sender<Commit>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The book stays consistent at every unlock; a panic elsewhere must not
    // take prepare down with it.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl DriverState {
    pub fn open(
        node: &str,
        paths: Paths,
        claims: Arc<dyn ClaimSource>,
        checkpoint_path: PathBuf,
    ) -> Result<DriverState, CheckpointError> {
        DriverState::with_store(
            node,
            paths,
            claims,
            Arc::new(FileCheckpoint::new(checkpoint_path)),
        )
    }

    /// [`DriverState::open`] over any checkpoint store.
    pub fn with_store(
        node: &str,
        paths: Paths,
        claims: Arc<dyn ClaimSource>,
        store: Arc<dyn CheckpointStore>,
    ) -> Result<DriverState, CheckpointError> {
        let cp = store.load()?;
        Ok(DriverState {
            inner: Arc::new(Inner {
                node: node.to_string(),
                paths,
                claims,
                inventory: watch::Sender::new(Arc::default()),
                store,
                book: Arc::new(Mutex::new(Book {
                    cp,
                    reserved: BTreeMap::new(),
                    queued: Vec::new(),
                    writing: false,
                })),
                claim_locks: Mutex::default(),
            }),
        })
    }

    pub fn node(&self) -> &str {
        &self.inner.node
    }

    pub fn set_inventory(&self, devices: Vec<Published>) {
        let inv: Inventory = devices
            .into_iter()
            .map(|p| (p.device.name.clone(), p))
            .collect();
        self.inner.inventory.send_replace(Arc::new(inv));
    }

    /// The last scan's devices.
    pub fn inventory(&self) -> Arc<Inventory> {
        self.inner.inventory()
    }

    /// Sees every new scan's devices.
    pub fn watch_inventory(&self) -> watch::Receiver<Arc<Inventory>> {
        self.inner.inventory.subscribe()
    }

    /// Names of prepared devices, and of devices being prepared (their
    /// netdev may be in a pod: not a fault).
    pub async fn in_use(&self) -> BTreeSet<String> {
        let b = lock(&self.inner.book);
        b.cp.devices()
            .into_keys()
            .chain(b.reserved.values().flatten().cloned())
            .collect()
    }

    /// UIDs of prepared claims.
    pub async fn prepared_claims(&self) -> Vec<String> {
        lock(&self.inner.book).cp.claims.keys().cloned().collect()
    }

    /// Prepares one claim. A claim already prepared gets the same answer
    /// without asking the API server again. Runs to its end even when the
    /// caller goes away (the kubelet's deadline): a half-done prepare would
    /// leave files or a reserved device behind.
    pub async fn prepare(&self, claim: &ClaimRef) -> Result<Vec<PreparedDevice>, PrepareError> {
        prepare::check_uid(&claim.uid).map_err(|source| PrepareError::Plan {
            claim: claim.to_string(),
            source,
        })?;
        let inner = self.inner.clone();
        let c = claim.clone();
        match tokio::spawn(async move { inner.prepare(&c).await }).await {
            Ok(r) => r,
            Err(e) => Err(PrepareError::Task {
                claim: claim.to_string(),
                message: e.to_string(),
            }),
        }
    }

    /// Unprepares one claim: removes its files (a file already gone is
    /// fine) and forgets it. A claim not prepared here is already done.
    /// When a file cannot be removed the claim stays in the checkpoint, so
    /// the kubelet's retry tries again. Runs to its end like prepare.
    pub async fn unprepare(&self, claim: &ClaimRef) -> Result<(), UnprepareError> {
        let inner = self.inner.clone();
        let c = claim.clone();
        tokio::spawn(async move { inner.unprepare(&c).await })
            .await
            .unwrap_or_else(|e| {
                Err(UnprepareError {
                    claim: claim.to_string(),
                    errors: vec![e.to_string()],
                })
            })
    }
}

/// Holds one claim's lock; drops the map entry when no one else wants it.
struct ClaimGuard<'a> {
    inner: &'a Inner,
    uid: String,
    lock: Arc<tokio::sync::Mutex<()>>,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Drop for ClaimGuard<'_> {
    fn drop(&mut self) {
        self.guard.take();
        let mut locks = lock(&self.inner.claim_locks);
        // Ours and the map's: nobody waits.
        if Arc::strong_count(&self.lock) == 2 {
            locks.remove(&self.uid);
        }
    }
}

impl Inner {
    fn inventory(&self) -> Arc<Inventory> {
        self.inventory.borrow().clone()
    }

    async fn lock_claim(&self, uid: &str) -> ClaimGuard<'_> {
        let l = lock(&self.claim_locks)
            .entry(uid.to_string())
            .or_default()
            .clone();
        let guard = l.clone().lock_owned().await;
        ClaimGuard {
            inner: self,
            uid: uid.to_string(),
            lock: l,
            guard: Some(guard),
        }
    }

    async fn prepare(&self, claim: &ClaimRef) -> Result<Vec<PreparedDevice>, PrepareError> {
        let _claim_lock = self.lock_claim(&claim.uid).await;
        // Holding the claim's lock, an entry here is on disk.
        if let Some(done) = lock(&self.book).cp.claims.get(&claim.uid) {
            return Ok(done.devices.clone());
        }
        // The API call holds no shared lock: a slow API server must not
        // hold up other claims.
        let rc = self.claims.get(claim).await?;
        let alloc = allocation_of(claim, &rc)?;
        // Planned under the book's lock (two claims must never both get a
        // device), on the blocking pool: it stats the host's device nodes.
        let plan = {
            let book = self.book.clone();
            let (c, node, inventory, paths) = (
                claim.clone(),
                self.node.clone(),
                self.inventory(),
                self.paths.clone(),
            );
            let planned = tokio::task::spawn_blocking(move || {
                let mut b = lock(&book);
                let mut taken = b.cp.devices();
                for (uid, devices) in &b.reserved {
                    taken.extend(devices.iter().map(|d| (d.clone(), uid.clone())));
                }
                let plan = prepare::plan(&c, &alloc, &node, &inventory, &taken, &paths)?;
                let devices = plan.claim.devices.iter().map(|d| d.device.clone());
                b.reserved.insert(c.uid.clone(), devices.collect());
                Ok(plan)
            })
            .await;
            match planned {
                Ok(Ok(plan)) => plan,
                Ok(Err(source)) => {
                    return Err(PrepareError::Plan {
                        claim: claim.to_string(),
                        source,
                    });
                }
                Err(e) => {
                    return Err(PrepareError::Task {
                        claim: claim.to_string(),
                        message: e.to_string(),
                    });
                }
            }
        };
        let writes = plan.writes;
        let written = tokio::task::spawn_blocking(move || write_all(&writes))
            .await
            .unwrap_or_else(|e| {
                Err(AtomicFileError {
                    action: "write",
                    path: PathBuf::from(format!("prepared files of claim {claim}")),
                    source: std::io::Error::other(e.to_string()),
                })
            });
        if let Err(source) = written {
            lock(&self.book).reserved.remove(&claim.uid);
            return Err(PrepareError::Write {
                claim: claim.to_string(),
                source,
            });
        }
        let files = plan.claim.files.clone();
        let devices = plan.claim.devices.clone();
        if let Err(source) = self.commit(&claim.uid, Some(plan.claim)).await {
            let _ = tokio::task::spawn_blocking(move || remove_all(&files)).await;
            return Err(PrepareError::Checkpoint {
                claim: claim.to_string(),
                source,
            });
        }
        Ok(devices)
    }

    async fn unprepare(&self, claim: &ClaimRef) -> Result<(), UnprepareError> {
        let _claim_lock = self.lock_claim(&claim.uid).await;
        let Some(prepared) = lock(&self.book).cp.claims.get(&claim.uid).cloned() else {
            return Ok(());
        };
        let files = prepared.files;
        let mut errors = tokio::task::spawn_blocking(move || {
            files
                .iter()
                .filter_map(|p| atomic_file::remove(p).err().map(|e| e.to_string()))
                .collect::<Vec<String>>()
        })
        .await
        .unwrap_or_else(|e| vec![e.to_string()]);
        // The files are gone: forget the claim. A failed write puts the
        // entry back, so the retry saves again (removing gone files is not
        // an error).
        if errors.is_empty()
            && let Err(e) = self.commit(&claim.uid, None).await
        {
            errors.push(e.to_string());
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

    /// Sets (or removes) one claim's entry and waits until a checkpoint
    /// with it is on disk. The caller holds the claim's lock. On failure
    /// the entry is back as it was before this answers.
    async fn commit(&self, uid: &str, entry: Option<PreparedClaim>) -> Commit {
        let (done, answer) = oneshot::channel();
        let start = {
            let mut b = lock(&self.book);
            b.reserved.remove(uid);
            let before = match entry {
                Some(e) => b.cp.claims.insert(uid.to_string(), e),
                None => b.cp.claims.remove(uid),
            };
            b.queued.push(Change {
                uid: uid.to_string(),
                before,
                done,
            });
            !std::mem::replace(&mut b.writing, true)
        };
        if start {
            tokio::spawn(write_queued(self.book.clone(), self.store.clone()));
        }
        answer.await.unwrap_or_else(|_| {
            Err(Arc::new(CheckpointError::Lost {
                path: self.store.path().to_path_buf(),
                message: "the checkpoint writer ended".into(),
            }))
        })
    }
}

/// The group commit: writes the book's checkpoint for everything queued,
/// answers those changes, and goes on while changes came in meanwhile.
async fn write_queued(book: Arc<Mutex<Book>>, store: Arc<dyn CheckpointStore>) {
    loop {
        let (snapshot, batch) = {
            let mut b = lock(&book);
            if b.queued.is_empty() {
                b.writing = false;
                return;
            }
            (b.cp.clone(), std::mem::take(&mut b.queued))
        };
        let s = store.clone();
        let result = tokio::task::spawn_blocking(move || s.save(&snapshot))
            .await
            .unwrap_or_else(|e| {
                Err(CheckpointError::Lost {
                    path: store.path().to_path_buf(),
                    message: e.to_string(),
                })
            });
        match result {
            Ok(()) => {
                for c in batch {
                    let _ = c.done.send(Ok(()));
                }
            }
            Err(e) => {
                let e = Arc::new(e);
                {
                    // Before the next snapshot: the next write must not
                    // carry a change whose caller is told it failed. The
                    // claims of a batch are distinct (per-claim locks), and
                    // later changes touch other claims.
                    let mut b = lock(&book);
                    for c in &batch {
                        match &c.before {
                            Some(prev) => b.cp.claims.insert(c.uid.clone(), prev.clone()),
                            None => b.cp.claims.remove(&c.uid),
                        };
                    }
                }
                for c in batch {
                    let _ = c.done.send(Err(e.clone()));
                }
            }
        }
    }
}

/// Writes `writes` all or nothing, 0644 (one group fsync:
/// [`atomic_file::write_all`]).
fn write_all(writes: &[(PathBuf, Vec<u8>)]) -> Result<(), AtomicFileError> {
    atomic_file::write_all(writes, Modes::SHARED)
}

fn remove_all(paths: &[PathBuf]) {
    for p in paths {
        if let Err(e) = atomic_file::remove(p) {
            tracing::warn!(error = %e, "cannot remove a file of a failed prepare");
        }
    }
}
