//! Edge: the checkpoint of prepared claims, `<state dir>/checkpoint.json`,
//! written atomically after every change. Its shape and reader are
//! [`kroce_contracts::dra_checkpoint`] (the node agent reads it too). A restarted plugin answers
//! NodePrepareResources for a prepared claim with the same CDI IDs, and can
//! still unprepare claims prepared before the restart.
//!
//! [`CheckpointStore`] is the narrow edge the driver state writes through:
//! [`FileCheckpoint`] on a node, a counting or slow one in tests.

use kroce_contracts::atomic_file::{self, AtomicFileError, Modes};
use kroce_contracts::dra_checkpoint::{self as contract, LoadError};
pub use kroce_contracts::dra_checkpoint::{Checkpoint, FILE_NAME, VERSION};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// Read or parse: the contract's own error (one wording for dra and
    /// the node agent).
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    Write(#[from] AtomicFileError),
    #[error("checkpoint {path}: the write was lost: {message}")]
    Lost { path: PathBuf, message: String },
}

/// Where the checkpoint is kept. Both calls block (file I/O, fsync): the
/// driver state calls them off the async workers.
pub trait CheckpointStore: Send + Sync + std::fmt::Debug {
    /// The stored checkpoint; none yet is an empty one.
    fn load(&self) -> Result<Checkpoint, CheckpointError>;
    /// Replaces the stored checkpoint, durably (on disk when this returns),
    /// all or nothing: a failed save leaves the previous one.
    fn save(&self, cp: &Checkpoint) -> Result<(), CheckpointError>;
    /// Named in errors.
    fn path(&self) -> &Path;
}

/// The checkpoint file, written atomically and fsynced.
#[derive(Debug, Clone)]
pub struct FileCheckpoint {
    path: PathBuf,
}

impl FileCheckpoint {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        FileCheckpoint { path: path.into() }
    }
}

impl CheckpointStore for FileCheckpoint {
    fn load(&self) -> Result<Checkpoint, CheckpointError> {
        load(&self.path)
    }

    fn save(&self, cp: &Checkpoint) -> Result<(), CheckpointError> {
        save(cp, &self.path)
    }

    fn path(&self) -> &Path {
        &self.path
    }
}

/// The checkpoint at `path`; none there yet is an empty one.
pub fn load(path: &Path) -> Result<Checkpoint, CheckpointError> {
    Ok(contract::load(path)?.unwrap_or_else(Checkpoint::empty))
}

/// Writes `cp` at `path`, atomically and fsynced.
pub fn save(cp: &Checkpoint, path: &Path) -> Result<(), CheckpointError> {
    let bytes = contract::to_bytes(cp).map_err(|e| LoadError::Parse {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    Ok(atomic_file::write(path, &bytes, Modes::SHARED)?)
}
