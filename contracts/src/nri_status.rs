//! The status file kroce-nri keeps so the node agent and `doctor` can report
//! what it cannot say in a container's adjustment: the runtime it is
//! connected to, whether that runtime can raise `RLIMIT_MEMLOCK`, and the
//! last request it had to cap. kroce-nri writes it (its `status` module);
//! the node agent and `doctor` read it with [`read`].
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
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::memlock::Memlock;

/// File name under the state dir.
pub const STATUS_FILE: &str = "nri-status.json";
/// The schema version written and understood.
pub const STATUS_VERSION: u32 = 1;

/// `<state_dir>/nri-status.json`.
pub fn path_in(state_dir: &Path) -> PathBuf {
    state_dir.join(STATUS_FILE)
}

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

/// The runtime's side of the memlock question, as kroce-nri read it from
/// `/proc/<pid>` of the NRI socket's peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeLimits {
    pub pid: u32,
    /// Bit 24 of `CapEff`.
    pub cap_sys_resource: bool,
    /// `uid_map` is the identity over the whole range: the initial user
    /// namespace, where `CAP_SYS_RESOURCE` counts for rlimits.
    pub initial_user_namespace: bool,
    #[serde(with = "rlimit_serde")]
    pub memlock_soft: Memlock,
    #[serde(with = "rlimit_serde")]
    pub memlock_hard: Memlock,
}

impl RuntimeLimits {
    /// Whether the runtime may set a container's hard limit above its own.
    pub fn can_raise(&self) -> bool {
        self.cap_sys_resource && self.initial_user_namespace
    }
}

/// A memlock request kroce-nri could not grant in full.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CappedRequest {
    /// Container ID.
    pub container: String,
    /// `namespace/name` of its pod ("" if unknown).
    pub pod: String,
    #[serde(with = "rlimit_serde")]
    pub requested: Memlock,
    #[serde(with = "rlimit_serde")]
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

/// The file's bytes: compact JSON and a newline.
pub fn to_bytes(status: &StatusFile) -> Result<Vec<u8>, serde_json::Error> {
    let mut bytes = serde_json::to_vec(status)?;
    bytes.push(b'\n');
    Ok(bytes)
}

/// Parses a status file's bytes (`path` names it in errors).
pub fn parse(path: &Path, bytes: &[u8]) -> Result<StatusFile, StatusError> {
    let status: StatusFile = serde_json::from_slice(bytes).map_err(|source| StatusError::Json {
        path: path.to_owned(),
        source,
    })?;
    if status.version != STATUS_VERSION {
        return Err(StatusError::Version {
            path: path.to_owned(),
            version: status.version,
        });
    }
    Ok(status)
}

/// Reads a status file; `Ok(None)` when there is none.
pub fn read(path: &Path) -> Result<Option<StatusFile>, StatusError> {
    match std::fs::read(path) {
        Ok(bytes) => parse(path, &bytes).map(Some),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(StatusError::Io {
            path: path.to_owned(),
            source,
        }),
    }
}

/// `Memlock` as `"unlimited"` or decimal bytes in a string. Raw rlimits,
/// not the user grammar: a runtime's limit of 0 is real.
pub mod rlimit_serde {
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::memlock::Memlock;

    pub fn serialize<S: Serializer>(value: &Memlock, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(value)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Memlock, D::Error> {
        let text = String::deserialize(d)?;
        Memlock::parse_rlimit(&text).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "{text:?} is not \"unlimited\" or a decimal number of bytes"
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

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
                memlock_soft: Memlock::Bytes(8 * MIB),
                memlock_hard: Memlock::Bytes(8 * MIB),
            }),
            runtime_error: None,
            last_capped: Some(CappedRequest {
                container: "c1".into(),
                pod: "default/rdma-app".into(),
                requested: Memlock::Unlimited,
                granted: Memlock::Bytes(8 * MIB),
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

    /// A file as kroce-nri wrote it before the schema moved here.
    #[test]
    fn reads_a_file_the_old_writer_wrote() {
        let old = br#"{"version":1,"updatedAt":1764633600,"runtimeName":"containerd","runtimeVersion":"2.1.9","runtime":{"pid":1234,"capSysResource":false,"initialUserNamespace":true,"memlockSoft":"8388608","memlockHard":"8388608"},"lastCapped":{"container":"c1","pod":"default/rdma-app","requested":"unlimited","granted":"8388608","at":1764633600},"cappedCount":1}
"#;
        let path = Path::new("nri-status.json");
        assert_eq!(parse(path, old).unwrap(), sample());
        assert_eq!(to_bytes(&sample()).unwrap(), old.to_vec());
    }

    #[test]
    fn read_round_trips_and_missing_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let path = path_in(dir.path());
        assert!(read(&path).unwrap().is_none());
        std::fs::write(&path, to_bytes(&sample()).unwrap()).unwrap();
        assert_eq!(read(&path).unwrap(), Some(sample()));
    }

    #[test]
    fn bad_files_are_errors_naming_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = path_in(dir.path());
        std::fs::write(&path, "{not json").unwrap();
        let err = read(&path).unwrap_err();
        assert!(err.to_string().contains("nri-status.json"), "{err}");
        let mut v2 = serde_json::to_value(sample()).unwrap();
        v2["version"] = 2.into();
        std::fs::write(&path, v2.to_string()).unwrap();
        let err = read(&path).unwrap_err();
        assert!(err.to_string().contains("version 2"), "{err}");
        // A directory in the way is an I/O error, not "no file".
        let err = read(dir.path()).unwrap_err();
        assert!(matches!(err, StatusError::Io { .. }), "{err}");
    }

    #[test]
    fn limits_serialize_memlock_as_strings() {
        let l = RuntimeLimits {
            pid: 1,
            cap_sys_resource: false,
            initial_user_namespace: true,
            memlock_soft: Memlock::Bytes(8 * MIB),
            memlock_hard: Memlock::Unlimited,
        };
        let json = serde_json::to_value(l).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"pid":1,"capSysResource":false,"initialUserNamespace":true,"memlockSoft":"8388608","memlockHard":"unlimited"})
        );
        assert_eq!(serde_json::from_value::<RuntimeLimits>(json).unwrap(), l);
        // A runtime started with a memlock limit of 0 (raw rlimits are not
        // the memlock grammar, which refuses 0).
        let zero = RuntimeLimits {
            memlock_soft: Memlock::Bytes(0),
            memlock_hard: Memlock::Bytes(0),
            ..l
        };
        let json = serde_json::to_value(zero).unwrap();
        assert_eq!(serde_json::from_value::<RuntimeLimits>(json).unwrap(), zero);
        let bad = serde_json::json!({"pid":1,"capSysResource":false,"initialUserNamespace":true,"memlockSoft":"8Mi","memlockHard":"unlimited"});
        let err = serde_json::from_value::<RuntimeLimits>(bad).unwrap_err();
        assert!(err.to_string().contains("8Mi"), "{err}");
    }

    #[test]
    fn can_raise_needs_the_capability_in_the_initial_namespace() {
        let l = sample().runtime.unwrap();
        assert!(!l.can_raise());
        let cap = RuntimeLimits {
            cap_sys_resource: true,
            ..l
        };
        assert!(cap.can_raise());
        let userns = RuntimeLimits {
            initial_user_namespace: false,
            ..cap
        };
        assert!(!userns.can_raise());
    }
}
