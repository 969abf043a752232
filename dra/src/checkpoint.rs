//! Edge: the checkpoint of prepared claims, `<state dir>/checkpoint.json`,
//! written atomically after every change. A restarted plugin answers
//! NodePrepareResources for a prepared claim with the same CDI IDs, and can
//! still unprepare claims prepared before the restart.
//!
//! [`CheckpointStore`] is the narrow edge the driver state writes through:
//! [`FileCheckpoint`] on a node, a counting or slow one in tests.

use crate::prepare::PreparedClaim;
use kroce_device_plugin::files::{self, FileError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub const FILE_NAME: &str = "checkpoint.json";
pub const VERSION: u32 = 1;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub version: u32,
    /// By claim UID.
    pub claims: BTreeMap<String, PreparedClaim>,
}

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("cannot read checkpoint {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("checkpoint {path} is not a version {VERSION} checkpoint: {message}")]
    Parse { path: PathBuf, message: String },
    #[error(transparent)]
    Write(#[from] FileError),
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
        Checkpoint::load(&self.path)
    }

    fn save(&self, cp: &Checkpoint) -> Result<(), CheckpointError> {
        cp.save(&self.path)
    }

    fn path(&self) -> &Path {
        &self.path
    }
}

impl Checkpoint {
    /// The checkpoint at `path`; none there yet is an empty one.
    pub fn load(path: &Path) -> Result<Checkpoint, CheckpointError> {
        let text = match std::fs::read(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Checkpoint {
                    version: VERSION,
                    ..Default::default()
                });
            }
            Err(source) => {
                return Err(CheckpointError::Read {
                    path: path.to_path_buf(),
                    source,
                });
            }
        };
        let cp: Checkpoint = serde_json::from_slice(&text).map_err(|e| CheckpointError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        if cp.version != VERSION {
            return Err(CheckpointError::Parse {
                path: path.to_path_buf(),
                message: format!("version {}", cp.version),
            });
        }
        Ok(cp)
    }

    pub fn save(&self, path: &Path) -> Result<(), CheckpointError> {
        let bytes = serde_json::to_vec_pretty(self).map_err(|e| CheckpointError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        Ok(files::write_atomic(path, &bytes)?)
    }

    /// Device name → UID of the claim it is prepared for.
    pub fn devices(&self) -> BTreeMap<String, String> {
        self.claims
            .iter()
            .flat_map(|(uid, c)| {
                c.devices
                    .iter()
                    .map(move |d| (d.device.clone(), uid.clone()))
            })
            .collect()
    }
}
