//! The memlock requests kroce-nri applies: kroce-cni's per sandbox,
//! `<state-dir>/memlock/<sandboxID>.json`, and the DRA plugin's per claim,
//! `<state-dir>/dra-memlock/<claim uid>.json`. The file's shape, version,
//! names and the ID rule are [`kroce_contracts::memlock_file`]'s, shared
//! with both writers; reading them is here.
//!
//! Unknown fields are ignored; a missing file is "no request"; a bad file
//! is an error the caller logs and skips.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use kroce_contracts::memlock_file::{self, SandboxMemlock};

use crate::memlock::Memlock;

pub use kroce_contracts::memlock_file::{
    DEFAULT_STATE_DIR, DRA_MEMLOCK_DIR, FILE_VERSION, MEMLOCK_DIR,
};

#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error(transparent)]
    BadSandboxId(#[from] memlock_file::SandboxIdError),
    #[error("{path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error("{path}: not JSON of the expected shape: {source}")]
    Json {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{path}: version {version} is not supported (expected {FILE_VERSION})")]
    Version { path: PathBuf, version: String },
    #[error("{path}: containerID {found:?} does not match sandbox {expected:?}")]
    WrongSandbox {
        path: PathBuf,
        found: String,
        expected: String,
    },
    #[error("{path}: field \"memlock\" is missing")]
    MissingMemlock { path: PathBuf },
    #[error("{path}: field \"memlock\": {source}")]
    BadMemlock {
        path: PathBuf,
        source: kroce_contracts::MemlockError,
    },
}

/// Looks up the memlock requests recorded for a sandbox or a DRA claim.
pub trait MemlockRequests {
    /// kroce-cni's request for a sandbox; `Ok(None)` when it has none.
    fn lookup(&self, sandbox_id: &str) -> Result<Option<Memlock>, RequestError>;
    /// The DRA plugin's request for a prepared claim; `Ok(None)` when it
    /// has none (no `memlock` in its config, or not prepared here).
    fn lookup_claim(&self, claim_uid: &str) -> Result<Option<Memlock>, RequestError>;
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
        Ok(memlock_file::path(&self.root, sandbox_id)?)
    }

    /// `<root>/dra-memlock/<claim_uid>.json`, refusing UIDs that could leave
    /// the directory.
    pub fn claim_request_path(&self, claim_uid: &str) -> Result<PathBuf, RequestError> {
        Ok(memlock_file::dra_dir(&self.root).join(memlock_file::file_name(claim_uid)?))
    }
}

/// The request in `path` (`containerID` must be `id`); a missing file is none.
fn read_request(path: PathBuf, id: &str) -> Result<Option<Memlock>, RequestError> {
    match std::fs::read(&path) {
        Ok(bytes) => parse_request(&bytes, id, &path).map(|f| Some(f.memlock)),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(RequestError::Read { path, source }),
    }
}

impl MemlockRequests for StateDir {
    fn lookup(&self, sandbox_id: &str) -> Result<Option<Memlock>, RequestError> {
        read_request(self.request_path(sandbox_id)?, sandbox_id)
    }

    fn lookup_claim(&self, claim_uid: &str) -> Result<Option<Memlock>, RequestError> {
        read_request(self.claim_request_path(claim_uid)?, claim_uid)
    }
}

/// In-memory requests keyed by sandbox ID or claim UID (tests and benches;
/// the two never look alike).
impl MemlockRequests for BTreeMap<String, Memlock> {
    fn lookup(&self, sandbox_id: &str) -> Result<Option<Memlock>, RequestError> {
        Ok(self.get(sandbox_id).copied())
    }

    fn lookup_claim(&self, claim_uid: &str) -> Result<Option<Memlock>, RequestError> {
        Ok(self.get(claim_uid).copied())
    }
}

/// Parses one request file's bytes. `path` is only used in errors. The
/// version, the sandbox and the memlock are checked one by one first, so
/// each error names its field; then the whole file must have the shared
/// shape.
pub fn parse_request(
    bytes: &[u8],
    sandbox_id: &str,
    path: &Path,
) -> Result<SandboxMemlock, RequestError> {
    let json = |source| RequestError::Json {
        path: path.to_owned(),
        source,
    };
    let value: serde_json::Value = serde_json::from_slice(bytes).map_err(json)?;
    if let Some(version) = value.get("version")
        && version.as_u64() != Some(u64::from(FILE_VERSION))
    {
        return Err(RequestError::Version {
            path: path.to_owned(),
            version: version.to_string(),
        });
    }
    if let Some(found) = value.get("containerID").and_then(|v| v.as_str())
        && found != sandbox_id
    {
        return Err(RequestError::WrongSandbox {
            path: path.to_owned(),
            found: found.to_owned(),
            expected: sandbox_id.to_owned(),
        });
    }
    let memlock = value
        .get("memlock")
        .ok_or_else(|| RequestError::MissingMemlock {
            path: path.to_owned(),
        })?;
    Memlock::from_json(memlock).map_err(|source| RequestError::BadMemlock {
        path: path.to_owned(),
        source,
    })?;
    serde_json::from_value(value).map_err(json)
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
        .map(|f| f.memlock)
    }

    /// A whole v1 file with `memlock` as given (raw JSON).
    fn file(memlock: &str) -> String {
        format!(
            r#"{{"version":1,"containerID":"{SB}","netns":"/var/run/netns/cni-1","ifname":"net1","memlock":{memlock},"network":"rdma-a",
                "attachments":{{"net1":{{"memlock":{memlock},"network":"rdma-a"}}}}}}"#
        )
    }

    #[test]
    fn documented_shapes() {
        assert_eq!(parse(&file(r#""unlimited""#)).unwrap(), Memlock::Unlimited);
        assert_eq!(parse(&file("1073741824")).unwrap(), Memlock::Bytes(1 << 30));
        // kroce-cni keeps every attachment of the sandbox under `attachments`;
        // the top-level memlock is the largest request, which is what we apply.
        let with_attachments = format!(
            r#"{{"version":1,"containerID":"{SB}","netns":"/n","ifname":"net2","memlock":2147483648,"network":"b",
                "attachments":{{"net1":{{"memlock":1073741824,"network":"a"}},"net2":{{"memlock":2147483648,"network":"b"}}}}}}"#
        );
        assert_eq!(parse(&with_attachments).unwrap(), Memlock::Bytes(2 << 30));
    }

    #[test]
    fn unknown_fields_and_the_one_grammar_in_strings() {
        let f = file(r#""64Gi""#).replacen('{', r#"{"future":{"x":[1,2]},"#, 1);
        assert_eq!(parse(&f).unwrap(), Memlock::Bytes(64 << 30));
    }

    #[test]
    fn bad_files_name_path_and_field() {
        let cases = [
            ("not json".to_string(), "not JSON"),
            (
                file("1").replace(r#""version":1"#, r#""version":2"#),
                "version 2",
            ),
            (r#"{"version":1}"#.to_string(), "\"memlock\" is missing"),
            (file("-5"), "\"memlock\": -5 is not a whole number"),
            (file("0"), "\"memlock\": \"0\" is zero"),
            (file("1.5"), "\"memlock\": 1.5 is not a whole number"),
            (file(r#""lots""#), "\"memlock\": \"lots\""),
            (file(r#""64g""#), "\"memlock\": \"64g\" has unknown unit"),
            (file("true"), "\"memlock\": \"true\""),
            (file("1").replace(SB, "other"), "does not match"),
            (
                file("1").replace(r#","network":"rdma-a""#, ""),
                "missing field",
            ),
        ];
        for (json, needle) in cases {
            let err = parse(&json).unwrap_err().to_string();
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
            file("268435456"),
        )
        .unwrap();
        assert_eq!(state.lookup(SB).unwrap(), Some(Memlock::Bytes(256 << 20)));
        assert_eq!(state.lookup("other").unwrap(), None);
    }

    /// The DRA plugin's per-claim file (as `kroce_dra::prepare` writes it:
    /// containerID = claim UID, no netns, one attachment per device) is
    /// read from `dra-memlock/`, never from kroce-cni's `memlock/`.
    #[test]
    fn claim_lookup_reads_the_dra_plugins_file() {
        let uid = "6c1d3e0a-0000-4000-8000-000000000001";
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::new(dir.path());
        assert_eq!(state.lookup_claim(uid).unwrap(), None, "no directory yet");
        let file = SandboxMemlock::from_attachments(
            uid,
            "",
            [(
                "vf-0000-3b-00-2".to_string(),
                memlock_file::AttachmentMemlock {
                    memlock: Memlock::Bytes(4 << 20),
                    network: "vf".into(),
                },
            )]
            .into(),
        )
        .unwrap();
        let dra = dir.path().join("dra-memlock");
        std::fs::create_dir_all(&dra).unwrap();
        std::fs::write(
            dra.join(format!("{uid}.json")),
            serde_json::to_vec(&file).unwrap(),
        )
        .unwrap();
        assert_eq!(
            state.lookup_claim(uid).unwrap(),
            Some(Memlock::Bytes(4 << 20))
        );
        assert_eq!(state.lookup(uid).unwrap(), None, "not a sandbox request");
        // Another claim's file under this name is refused, naming the path.
        std::fs::write(
            dra.join("6c1d3e0a-0000-4000-8000-000000000002.json"),
            serde_json::to_vec(&file).unwrap(),
        )
        .unwrap();
        let err = state
            .lookup_claim("6c1d3e0a-0000-4000-8000-000000000002")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("dra-memlock") && err.contains("does not match"),
            "{err}"
        );
        assert!(matches!(
            state.lookup_claim("../memlock/x"),
            Err(RequestError::BadSandboxId { .. })
        ));
    }

    #[test]
    fn sandbox_ids_never_become_paths_outside_the_dir() {
        let state = StateDir::new(DEFAULT_STATE_DIR);
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
