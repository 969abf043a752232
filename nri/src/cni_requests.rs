//! The per-sandbox memlock requests kroce-cni records:
//! `<state-dir>/memlock/<sandboxID>.json`, content
//! `{"version":1,"containerID":"<sandbox id>","netns":"…","ifname":"…","memlock":"unlimited"|<u64>,"network":"…"}`.
//!
//! Parsed tolerantly: unknown fields are ignored; a missing file is "no
//! request"; a bad file is an error the caller logs and skips.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::memlock::Memlock;

/// kroce-cni's default state directory.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/cni/kroce";
/// Subdirectory of the state dir holding the memlock request files.
pub const MEMLOCK_DIR: &str = "memlock";
/// The only file format version this reader understands.
pub const FILE_VERSION: u64 = 1;

#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error("sandbox id {id:?} is not usable as a file name")]
    BadSandboxId { id: String },
    #[error("{path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error("{path}: not JSON of the expected shape: {source}")]
    Json {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{path}: version {version} is not supported (expected {FILE_VERSION})")]
    Version { path: PathBuf, version: u64 },
    #[error("{path}: containerID {found:?} does not match sandbox {expected:?}")]
    WrongSandbox {
        path: PathBuf,
        found: String,
        expected: String,
    },
    #[error("{path}: field \"memlock\" is missing")]
    MissingMemlock { path: PathBuf },
    #[error("{path}: field \"memlock\": {detail}")]
    BadMemlock { path: PathBuf, detail: String },
}

/// Looks up the memlock request recorded for a sandbox.
pub trait MemlockRequests {
    /// `Ok(None)` when the sandbox has no request.
    fn lookup(&self, sandbox_id: &str) -> Result<Option<Memlock>, RequestError>;
}

/// Reads the request files under a kroce-cni state directory.
#[derive(Clone, Debug)]
pub struct StateDir {
    root: PathBuf,
}

impl StateDir {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        StateDir { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `<root>/memlock/<sandbox_id>.json`, refusing IDs that could leave the directory.
    pub fn request_path(&self, sandbox_id: &str) -> Result<PathBuf, RequestError> {
        check_sandbox_id(sandbox_id)?;
        Ok(self
            .root
            .join(MEMLOCK_DIR)
            .join(format!("{sandbox_id}.json")))
    }
}

impl MemlockRequests for StateDir {
    fn lookup(&self, sandbox_id: &str) -> Result<Option<Memlock>, RequestError> {
        let path = self.request_path(sandbox_id)?;
        match std::fs::read(&path) {
            Ok(bytes) => parse_request(&bytes, sandbox_id, &path).map(Some),
            Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(RequestError::Read { path, source }),
        }
    }
}

/// In-memory requests keyed by sandbox ID.
impl MemlockRequests for BTreeMap<String, Memlock> {
    fn lookup(&self, sandbox_id: &str) -> Result<Option<Memlock>, RequestError> {
        Ok(self.get(sandbox_id).copied())
    }
}

/// Container runtimes use hex IDs; allow a little more, never a path.
fn check_sandbox_id(id: &str) -> Result<(), RequestError> {
    let ok = !id.is_empty()
        && id.len() <= 255
        && !id.starts_with('.')
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(RequestError::BadSandboxId { id: id.to_owned() })
    }
}

#[derive(Deserialize)]
struct RequestFile {
    version: Option<u64>,
    #[serde(rename = "containerID")]
    container_id: Option<String>,
    memlock: Option<serde_json::Value>,
}

/// Parses one request file's bytes. `path` is only used in errors.
pub fn parse_request(bytes: &[u8], sandbox_id: &str, path: &Path) -> Result<Memlock, RequestError> {
    let file: RequestFile = serde_json::from_slice(bytes).map_err(|source| RequestError::Json {
        path: path.to_owned(),
        source,
    })?;
    if let Some(version) = file.version
        && version != FILE_VERSION
    {
        return Err(RequestError::Version {
            path: path.to_owned(),
            version,
        });
    }
    if let Some(found) = file.container_id
        && !found.is_empty()
        && found != sandbox_id
    {
        return Err(RequestError::WrongSandbox {
            path: path.to_owned(),
            found,
            expected: sandbox_id.to_owned(),
        });
    }
    let value = file.memlock.ok_or_else(|| RequestError::MissingMemlock {
        path: path.to_owned(),
    })?;
    let bad = |detail: String| RequestError::BadMemlock {
        path: path.to_owned(),
        detail,
    };
    match value {
        serde_json::Value::Number(n) => n
            .as_u64()
            .map(Memlock::from_rlimit)
            .ok_or_else(|| bad(format!("{n} is not a byte count (0..=u64::MAX)"))),
        // A decimal string is tolerated as well as the documented number.
        serde_json::Value::String(s) => s.parse::<Memlock>().map_err(|e| bad(e.to_string())),
        other => Err(bad(format!(
            "{other} is neither \"unlimited\" nor a number"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SB: &str = "4f1c0a9e8b7d";

    fn parse(json: &str) -> Result<Memlock, RequestError> {
        parse_request(
            json.as_bytes(),
            SB,
            Path::new("/x/memlock/4f1c0a9e8b7d.json"),
        )
    }

    #[test]
    fn documented_shapes() {
        let full = format!(
            r#"{{"version":1,"containerID":"{SB}","netns":"/var/run/netns/cni-1","ifname":"net1","memlock":"unlimited","network":"rdma-a"}}"#
        );
        assert_eq!(parse(&full).unwrap(), Memlock::Unlimited);
        assert_eq!(
            parse(r#"{"version":1,"memlock":1073741824}"#).unwrap(),
            Memlock::Bytes(1 << 30)
        );
        // kroce-cni keeps every attachment of the sandbox under `attachments`;
        // the top-level memlock is the largest request, which is what we apply.
        let with_attachments = format!(
            r#"{{"version":1,"containerID":"{SB}","netns":"/n","ifname":"net2","memlock":2147483648,"network":"b",
                "attachments":{{"net1":{{"memlock":1073741824,"network":"a"}},"net2":{{"memlock":2147483648,"network":"b"}}}}}}"#
        );
        assert_eq!(parse(&with_attachments).unwrap(), Memlock::Bytes(2 << 30));
    }

    #[test]
    fn tolerant_of_unknown_fields_missing_version_and_numeric_strings() {
        assert_eq!(
            parse(r#"{"memlock":"4096","future":{"x":[1,2]}}"#).unwrap(),
            Memlock::Bytes(4096)
        );
    }

    #[test]
    fn bad_files_name_path_and_field() {
        let cases = [
            ("not json", "not JSON"),
            (r#"{"version":2,"memlock":1}"#, "version 2"),
            (r#"{"version":1}"#, "\"memlock\" is missing"),
            (r#"{"memlock":-5}"#, "-5 is not a byte count"),
            (r#"{"memlock":1.5}"#, "1.5 is not a byte count"),
            (r#"{"memlock":"lots"}"#, "\"lots\""),
            (r#"{"memlock":true}"#, "neither"),
            (r#"{"containerID":"other","memlock":1}"#, "does not match"),
        ];
        for (json, needle) in cases {
            let err = parse(json).unwrap_err().to_string();
            assert!(
                err.contains("/x/memlock/4f1c0a9e8b7d.json"),
                "{json}: {err}"
            );
            assert!(err.contains(needle), "{json}: {err}");
        }
    }

    #[test]
    fn state_dir_lookup() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::new(dir.path());
        assert_eq!(state.lookup(SB).unwrap(), None, "no directory yet");
        std::fs::create_dir_all(dir.path().join("memlock")).unwrap();
        std::fs::write(
            dir.path().join("memlock").join(format!("{SB}.json")),
            format!(r#"{{"version":1,"containerID":"{SB}","memlock":268435456}}"#),
        )
        .unwrap();
        assert_eq!(state.lookup(SB).unwrap(), Some(Memlock::Bytes(256 << 20)));
        assert_eq!(state.lookup("other").unwrap(), None);
    }

    #[test]
    fn sandbox_ids_never_become_paths_outside_the_dir() {
        let state = StateDir::new("/var/lib/cni/kroce");
        for bad in ["", "../etc/passwd", "a/b", ".hidden", "..", "a\0b"] {
            assert!(
                matches!(state.lookup(bad), Err(RequestError::BadSandboxId { .. })),
                "{bad:?}"
            );
        }
        assert_eq!(
            state.request_path("abc-1_2.3").unwrap(),
            Path::new("/var/lib/cni/kroce/memlock/abc-1_2.3.json")
        );
    }
}
