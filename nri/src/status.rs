//! kroce-nri's status file, the writing side. The schema, the file name
//! and the reader are [`kroce_contracts::nri_status`] (the node agent and
//! `doctor` read it from there); here, where the plugin puts it.

use kroce_contracts::atomic_file::{self, Modes};
use std::path::{Path, PathBuf};

pub use kroce_contracts::nri_status::{
    CappedRequest, STATUS_FILE, STATUS_VERSION, StatusError, StatusFile, read,
};

/// Where the status goes.
pub trait StatusSink: std::fmt::Debug + Send + Sync {
    fn write(&self, status: &StatusFile) -> Result<(), StatusError>;
}

/// No status kept.
#[derive(Debug, Default)]
pub struct NoStatus;

impl StatusSink for NoStatus {
    fn write(&self, _: &StatusFile) -> Result<(), StatusError> {
        Ok(())
    }
}

/// The status file at a path, replaced atomically (temp file + rename) so a
/// reader never sees half of it.
#[derive(Debug, Clone)]
pub struct StatusPath(pub PathBuf);

impl StatusPath {
    /// `<state_dir>/nri-status.json`.
    pub fn in_state_dir(state_dir: &Path) -> Self {
        StatusPath(kroce_contracts::nri_status::path_in(state_dir))
    }
}

impl StatusSink for StatusPath {
    /// kroce's one atomic write (a temp file with a unique name, so a
    /// plugin restarting next to its predecessor does not write into the
    /// other's temp file; fsynced, renamed, the directory fsynced: a status
    /// written a moment before a crash is there after it). The file lives
    /// in kroce-cni's state dir, created 0700 if the plugin connects before
    /// kroce-cni's first ADD made it.
    fn write(&self, status: &StatusFile) -> Result<(), StatusError> {
        let path = &self.0;
        let bytes =
            kroce_contracts::nri_status::to_bytes(status).map_err(|source| StatusError::Json {
                path: path.clone(),
                source,
            })?;
        atomic_file::write(path, &bytes, Modes::PRIVATE).map_err(|e| StatusError::Io {
            path: path.clone(),
            source: std::io::Error::new(e.source.kind(), e.to_string()),
        })
    }
}

/// Seconds since the epoch (0 if the clock is before it).
pub fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Records every status written, for tests.
#[cfg(any(test, feature = "testing"))]
#[derive(Debug, Default)]
pub struct MemoryStatus(pub std::sync::Mutex<Vec<StatusFile>>);

#[cfg(any(test, feature = "testing"))]
impl MemoryStatus {
    /// The last status written.
    pub fn last(&self) -> Option<StatusFile> {
        self.0.lock().ok()?.last().cloned()
    }
}

#[cfg(any(test, feature = "testing"))]
impl StatusSink for MemoryStatus {
    fn write(&self, status: &StatusFile) -> Result<(), StatusError> {
        if let Ok(mut all) = self.0.lock() {
            all.push(status.clone());
        }
        Ok(())
    }
}

#[cfg(any(test, feature = "testing"))]
impl StatusSink for std::sync::Arc<MemoryStatus> {
    fn write(&self, status: &StatusFile) -> Result<(), StatusError> {
        self.as_ref().write(status)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memlock::Memlock;
    use crate::runtime::RuntimeLimits;

    fn sample() -> StatusFile {
        StatusFile {
            version: STATUS_VERSION,
            updated_at: 1_764_633_600,
            runtime_name: "containerd".into(),
            runtime_version: "2.1.9".into(),
            runtime: Some(RuntimeLimits {
                pid: 1234,
                cap_sys_resource: false,
                initial_user_namespace: true,
                memlock_soft: Memlock::Bytes(8 << 20),
                memlock_hard: Memlock::Bytes(8 << 20),
            }),
            runtime_error: None,
            last_capped: Some(CappedRequest {
                container: "c1".into(),
                pod: "default/rdma-app".into(),
                requested: Memlock::Unlimited,
                granted: Memlock::Bytes(8 << 20),
                at: 1_764_633_600,
            }),
            capped_count: 1,
        }
    }

    #[test]
    fn write_then_read_round_trips_and_missing_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let sink = StatusPath::in_state_dir(dir.path());
        assert!(read(&sink.0).unwrap().is_none());
        sink.write(&sample()).unwrap();
        assert_eq!(read(&sink.0).unwrap(), Some(sample()));
        // No temp file left behind.
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [STATUS_FILE]);
    }

    /// Another kroce-nri (the old pod of a rolling update) is mid-write:
    /// its temp file is not ours to truncate or rename.
    #[test]
    fn a_concurrent_writers_temp_file_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        // The name every writer used when it was fixed.
        let theirs = dir.path().join("nri-status.json.tmp");
        std::fs::write(&theirs, "half of another writer's file").unwrap();
        let sink = StatusPath::in_state_dir(dir.path());
        sink.write(&sample()).unwrap();
        assert_eq!(read(&sink.0).unwrap(), Some(sample()));
        assert_eq!(
            std::fs::read_to_string(&theirs).unwrap(),
            "half of another writer's file"
        );
    }

    /// Seen with a real containerd: the plugin connects (and writes) before
    /// kroce-cni's first ADD creates the state dir.
    #[test]
    fn missing_state_dir_is_created() {
        let dir = tempfile::tempdir().unwrap();
        let sink = StatusPath::in_state_dir(&dir.path().join("kroce-state"));
        sink.write(&sample()).unwrap();
        assert_eq!(read(&sink.0).unwrap(), Some(sample()));
    }

    #[test]
    fn unwritable_directory_is_an_error_naming_the_path() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a-file"), "").unwrap();
        let sink = StatusPath(dir.path().join("a-file").join(STATUS_FILE));
        let err = sink.write(&sample()).unwrap_err();
        assert!(err.to_string().contains("a-file"), "{err}");
    }
}
