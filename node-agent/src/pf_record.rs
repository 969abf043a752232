//! Which PFs kroce itself changed, and the `sriov_numvfs` each had before
//! kroce's first write: on release (the PF leaves the spec) the agent puts
//! back that value, and never touches a PF it did not change. VFs that an
//! admin or the firmware made are not kroce's to remove.
//!
//! Kept on the node (a root-owned 0600 file in a 0700 directory under the
//! agent's state dir), not in the `RdmaNodeState` status: the record must
//! outlive the object (the controller deletes and recreates it when the
//! node is deselected and selected again), must survive agent restarts, and
//! must not be writable by whatever may patch that status. The entry is
//! written before the first write to the PF, so a crash in between leaves
//! a record of a change that did not happen (harmless: restoring to the
//! current value is no write), never a change without a record.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

/// File name under the agent's state dir.
pub const FILE_NAME: &str = "changed-pfs.json";
/// The agent's state dir on the host.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/kroce/node-agent";
pub const VERSION: u32 = 1;

/// PF PCI address -> `sriov_numvfs` before kroce's first write to it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChangedPfs {
    pub version: u32,
    pub num_vfs_before: BTreeMap<String, u32>,
}

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("record of PFs kroce changed, {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("record of PFs kroce changed, {path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
}

/// Where the record lives; a real file and an in-memory one.
pub trait PfRecord: Send + Sync {
    fn load(&self) -> Result<ChangedPfs, RecordError>;
    fn save(&self, r: &ChangedPfs) -> Result<(), RecordError>;
}

/// `<state dir>/changed-pfs.json`.
#[derive(Debug, Clone)]
pub struct FilePfRecord {
    pub dir: PathBuf,
}

impl FilePfRecord {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        FilePfRecord { dir: dir.into() }
    }

    pub fn path(&self) -> PathBuf {
        self.dir.join(FILE_NAME)
    }

    /// The directory must be ours alone: a record someone else can write
    /// would let them choose what the agent writes to `sriov_numvfs`.
    fn check_dir(&self) -> Result<(), RecordError> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(&self.dir).map_err(|source| RecordError::Io {
            path: self.dir.clone(),
            source,
        })?;
        let me = nix::unistd::geteuid().as_raw();
        if m.uid() != me || m.mode() & 0o022 != 0 {
            return Err(RecordError::Invalid {
                path: self.dir.clone(),
                reason: format!(
                    "directory owned by uid {} with mode {:o}; it must be owned by uid {me} and not group/world writable",
                    m.uid(),
                    m.mode() & 0o7777
                ),
            });
        }
        Ok(())
    }
}

impl PfRecord for FilePfRecord {
    fn load(&self) -> Result<ChangedPfs, RecordError> {
        let path = self.path();
        if !self.dir.exists() {
            return Ok(ChangedPfs {
                version: VERSION,
                ..Default::default()
            });
        }
        self.check_dir()?;
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Ok(ChangedPfs {
                    version: VERSION,
                    ..Default::default()
                });
            }
            Err(source) => return Err(RecordError::Io { path, source }),
        };
        let r: ChangedPfs = serde_json::from_slice(&bytes).map_err(|e| RecordError::Invalid {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        if r.version != VERSION {
            return Err(RecordError::Invalid {
                path,
                reason: format!("version {} (this agent reads {VERSION})", r.version),
            });
        }
        Ok(r)
    }

    fn save(&self, r: &ChangedPfs) -> Result<(), RecordError> {
        use std::io::Write as _;
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        let io_err = |path: &Path| {
            let path = path.to_path_buf();
            move |source| RecordError::Io { path, source }
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
            .map_err(io_err(&self.dir))?;
        self.check_dir()?;
        let path = self.path();
        let tmp = self
            .dir
            .join(format!(".{FILE_NAME}.tmp.{}", std::process::id()));
        let bytes = serde_json::to_vec_pretty(r).map_err(|e| RecordError::Invalid {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .and_then(|mut f| {
                f.write_all(&bytes)?;
                f.sync_all()
            })
            .and_then(|()| std::fs::rename(&tmp, &path));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(io_err(&path)(e));
        }
        Ok(())
    }
}

/// The record in memory, for tests.
#[cfg(any(test, feature = "testing"))]
#[derive(Debug, Default)]
pub struct MemPfRecord {
    pub record: std::sync::Mutex<ChangedPfs>,
    /// Saves fail (as a full or read-only disk would).
    pub fail_saves: std::sync::atomic::AtomicBool,
}

#[cfg(any(test, feature = "testing"))]
impl MemPfRecord {
    pub fn entries(&self) -> BTreeMap<String, u32> {
        self.record
            .lock()
            .map(|r| r.num_vfs_before.clone())
            .unwrap_or_default()
    }
}

#[cfg(any(test, feature = "testing"))]
impl PfRecord for MemPfRecord {
    fn load(&self) -> Result<ChangedPfs, RecordError> {
        let mut r = self.record.lock().map(|r| r.clone()).unwrap_or_default();
        r.version = VERSION;
        Ok(r)
    }

    fn save(&self, r: &ChangedPfs) -> Result<(), RecordError> {
        if self.fail_saves.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(RecordError::Io {
                path: PathBuf::from("<memory>"),
                source: io::Error::from_raw_os_error(libc::EROFS),
            });
        }
        if let Ok(mut m) = self.record.lock() {
            *m = r.clone();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_record_round_trips_private_and_refuses_a_shared_dir() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let rec = FilePfRecord::new(tmp.path().join("agent"));
        assert!(rec.load().unwrap().num_vfs_before.is_empty(), "none yet");
        let mut r = rec.load().unwrap();
        r.num_vfs_before.insert("0000:3b:00.0".into(), 4);
        rec.save(&r).unwrap();
        assert_eq!(rec.load().unwrap(), r);
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&rec.dir), 0o700);
        assert_eq!(mode(&rec.path()), 0o600);
        // A directory others can write is refused, naming it.
        std::fs::set_permissions(&rec.dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = rec.load().unwrap_err().to_string();
        assert!(e.contains("agent") && e.contains("writable"), "{e}");
        std::fs::set_permissions(&rec.dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::write(rec.path(), "{garbage").unwrap();
        let e = rec.load().unwrap_err().to_string();
        assert!(e.contains(FILE_NAME), "{e}");
    }
}
