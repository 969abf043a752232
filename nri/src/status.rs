//! The status file kroce-nri keeps so the node agent and `doctor` can report
//! what it cannot say in a container's adjustment: the runtime it is
//! connected to, whether that runtime can raise `RLIMIT_MEMLOCK`, and the
//! last request it had to cap.
//!
//! `<state-dir>/nri-status.json` (state dir: kroce-cni's, `--state-dir`):
//!
//! ```json
//! {"version":1,"updatedAt":1764633600,
//!  "runtimeName":"containerd","runtimeVersion":"2.1.9",
//!  "runtime":{"pid":1234,"capSysResource":false,"initialUserNamespace":true,
//!             "memlockSoft":"8388608","memlockHard":"8388608"},
//!  "lastCapped":{"container":"<id>","pod":"default/rdma-app","requested":"unlimited",
//!                "granted":"8388608","at":1764633600},
//!  "cappedCount":3}
//! ```
//!
//! Memlock values are strings: `"unlimited"` or decimal bytes. `runtime` is
//! null (and `runtimeError` says why) when the runtime's limits could not be
//! read; `lastCapped` is null until a request was capped. Everything
//! describes the current connection: it is rewritten when the plugin
//! (re)connects, on Configure and on every capped request.

use std::io;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::memlock::Memlock;
use crate::runtime::{RuntimeLimits, memlock_serde};

/// File name under the state dir.
pub const STATUS_FILE: &str = "nri-status.json";
/// The schema version written and understood.
pub const STATUS_VERSION: u32 = 1;

/// The status file's content.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusFile {
    pub version: u32,
    /// Unix seconds of the last write.
    pub updated_at: u64,
    /// From the runtime's Configure ("" before it).
    #[serde(default)]
    pub runtime_name: String,
    #[serde(default)]
    pub runtime_version: String,
    /// The runtime's limits, `None` when they could not be read.
    pub runtime: Option<RuntimeLimits>,
    /// Why `runtime` is `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_error: Option<String>,
    /// The last request capped at the runtime's hard limit on this connection.
    pub last_capped: Option<CappedRequest>,
    /// Requests capped on this connection.
    #[serde(default)]
    pub capped_count: u64,
}

/// A memlock request kroce-nri could not grant in full.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CappedRequest {
    /// Container ID.
    pub container: String,
    /// `namespace/name` of its pod ("" if unknown).
    pub pod: String,
    #[serde(with = "memlock_serde")]
    pub requested: Memlock,
    #[serde(with = "memlock_serde")]
    pub granted: Memlock,
    /// Unix seconds.
    pub at: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("{path}: not a kroce-nri status file: {source}")]
    Json {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{path}: version {version} is not supported (expected {STATUS_VERSION})")]
    Version { path: PathBuf, version: u32 },
}

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
        StatusPath(state_dir.join(STATUS_FILE))
    }
}

impl StatusSink for StatusPath {
    fn write(&self, status: &StatusFile) -> Result<(), StatusError> {
        let path = &self.0;
        let io_err = |p: &Path| {
            let p = p.to_owned();
            move |source| StatusError::Io { path: p, source }
        };
        let mut bytes = serde_json::to_vec(status).map_err(|source| StatusError::Json {
            path: path.clone(),
            source,
        })?;
        bytes.push(b'\n');
        // kroce-cni creates the state dir on its first ADD, which may come
        // after the plugin's first write.
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        }
        let tmp = path.with_extension("json.tmp");
        let mut file = std::fs::File::create(&tmp).map_err(io_err(&tmp))?;
        file.write_all(&bytes).map_err(io_err(&tmp))?;
        drop(file);
        std::fs::rename(&tmp, path).map_err(io_err(path))
    }
}

/// Reads a status file; `Ok(None)` when there is none.
pub fn read(path: &Path) -> Result<Option<StatusFile>, StatusError> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(StatusError::Io {
                path: path.to_owned(),
                source,
            });
        }
    };
    let status: StatusFile =
        serde_json::from_slice(&bytes).map_err(|source| StatusError::Json {
            path: path.to_owned(),
            source,
        })?;
    if status.version != STATUS_VERSION {
        return Err(StatusError::Version {
            path: path.to_owned(),
            version: status.version,
        });
    }
    Ok(Some(status))
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
    fn schema_is_the_documented_one() {
        let json = serde_json::to_value(sample()).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "version": 1, "updatedAt": 1_764_633_600u64,
                "runtimeName": "containerd", "runtimeVersion": "2.1.9",
                "runtime": {"pid": 1234, "capSysResource": false, "initialUserNamespace": true,
                            "memlockSoft": "8388608", "memlockHard": "8388608"},
                "lastCapped": {"container": "c1", "pod": "default/rdma-app", "requested": "unlimited",
                               "granted": "8388608", "at": 1_764_633_600u64},
                "cappedCount": 1
            })
        );
    }

    #[test]
    fn write_then_read_round_trips_and_missing_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let sink = StatusPath::in_state_dir(dir.path());
        assert!(read(&sink.0).unwrap().is_none());
        sink.write(&sample()).unwrap();
        assert_eq!(read(&sink.0).unwrap(), Some(sample()));
        assert!(!dir.path().join("nri-status.json.tmp").exists());
    }

    #[test]
    fn bad_files_are_errors_naming_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(STATUS_FILE);
        std::fs::write(&path, "{not json").unwrap();
        let err = read(&path).unwrap_err();
        assert!(err.to_string().contains("nri-status.json"), "{err}");
        let mut v2 = serde_json::to_value(sample()).unwrap();
        v2["version"] = 2.into();
        std::fs::write(&path, v2.to_string()).unwrap();
        let err = read(&path).unwrap_err();
        assert!(err.to_string().contains("version 2"), "{err}");
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
