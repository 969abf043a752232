//! The memlock request file, version 1. Two writers, one format:
//!
//! - kroce-cni per sandbox (ADD writes, DEL and GC remove):
//!   `<state dir>/memlock/<sandbox id>.json`; kroce-nri applies it to every
//!   container of the sandbox;
//! - the DRA plugin per prepared claim (prepare writes, unprepare removes):
//!   `<state dir>/dra-memlock/<claim uid>.json`, `containerID` = the claim
//!   UID, `netns` empty, one attachment per device; kroce-nri applies it to
//!   every container holding the claim (its [`crate::dra::claim_env`]
//!   env). A directory of its own: kroce-cni garbage-collects files in
//!   `memlock/` whose sandbox is gone.
//!
//! ```json
//! {"version":1,"containerID":"<sandbox id>","netns":"/var/run/netns/cni-…",
//!  "ifname":"net2","memlock":"unlimited","network":"rdma-b",
//!  "attachments":{"net1":{"memlock":1073741824,"network":"rdma-a"},
//!                 "net2":{"memlock":"unlimited","network":"rdma-b"}}}
//! ```
//!
//! `memlock` is `"unlimited"` or a number of bytes. The top-level `ifname`,
//! `memlock` and `network` are those of the largest request among
//! `attachments` ([`SandboxMemlock::from_attachments`]): that is what the
//! reader applies. Unknown fields are ignored, so a writer may add some
//! without a new version. The I/O (locking, atomic writes, reading) stays
//! with the writer and the reader; the shape, names and paths are here.

use crate::memlock::Memlock;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// kroce-cni's state directory unless its config says otherwise (kroce-nri
/// reads the same default).
pub const DEFAULT_STATE_DIR: &str = "/var/lib/cni/kroce";
/// The subdirectory of the state dir holding kroce-cni's request files.
pub const MEMLOCK_DIR: &str = "memlock";
/// The subdirectory of the state dir holding the DRA plugin's per-claim
/// request files.
pub const DRA_MEMLOCK_DIR: &str = "dra-memlock";
/// `<default state dir>/dra-memlock`: the DRA plugin's `--memlock-dir`.
pub const DEFAULT_DRA_DIR: &str = "/var/lib/cni/kroce/dra-memlock";
/// The file format version written and understood.
pub const FILE_VERSION: u32 = 1;
/// Suffix of a request file after the sandbox ID.
pub const FILE_SUFFIX: &str = ".json";

/// One attachment's request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttachmentMemlock {
    pub memlock: Memlock,
    pub network: String,
}

/// The per-sandbox file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxMemlock {
    pub version: u32,
    /// The sandbox ID (what CNI calls the container ID).
    #[serde(rename = "containerID")]
    pub container_id: String,
    pub netns: String,
    /// The attachment whose request is the largest.
    pub ifname: String,
    pub memlock: Memlock,
    pub network: String,
    /// Every attachment's request, by ifname. Absent in files of kroce-cni
    /// versions that kept one attachment per sandbox (still version 1): the
    /// top level is then the only request.
    #[serde(default)]
    pub attachments: BTreeMap<String, AttachmentMemlock>,
}

impl SandboxMemlock {
    /// The file for these attachments: the top-level fields are the largest
    /// request's (on a tie the first ifname). `None` when none is left.
    pub fn from_attachments(
        container_id: &str,
        netns: &str,
        attachments: BTreeMap<String, AttachmentMemlock>,
    ) -> Option<SandboxMemlock> {
        let (ifname, top) =
            attachments
                .iter()
                .fold(
                    None::<(&String, &AttachmentMemlock)>,
                    |best, (k, v)| match best {
                        Some((_, b)) if b.memlock >= v.memlock => best,
                        _ => Some((k, v)),
                    },
                )?;
        Some(SandboxMemlock {
            version: FILE_VERSION,
            container_id: container_id.to_string(),
            netns: netns.to_string(),
            ifname: ifname.clone(),
            memlock: top.memlock,
            network: top.network.clone(),
            attachments: attachments.clone(),
        })
    }
}

impl SandboxMemlock {
    /// Every attachment's request; for a file without `attachments`, its
    /// top-level one.
    pub fn into_attachments(self) -> BTreeMap<String, AttachmentMemlock> {
        if self.attachments.is_empty() {
            BTreeMap::from([(
                self.ifname,
                AttachmentMemlock {
                    memlock: self.memlock,
                    network: self.network,
                },
            )])
        } else {
            self.attachments
        }
    }
}

/// A sandbox ID that cannot name a file in the memlock directory.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "sandbox id {id:?} is not usable as a file name (1-250 letters, digits, '_', '.', '-', starting with a letter or digit)"
)]
pub struct SandboxIdError {
    pub id: String,
}

/// The CNI spec's container ID alphabet (what runtimes use: hex), short
/// enough for a file name with its suffix; never a path.
pub fn check_sandbox_id(id: &str) -> Result<(), SandboxIdError> {
    let ok = id.len() <= 255 - FILE_SUFFIX.len()
        && id.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(SandboxIdError { id: id.to_owned() })
    }
}

/// `<state dir>/memlock`.
pub fn dir(state_dir: &Path) -> PathBuf {
    state_dir.join(MEMLOCK_DIR)
}

/// `<sandbox id>.json`, refusing IDs that could leave the directory.
pub fn file_name(sandbox_id: &str) -> Result<String, SandboxIdError> {
    check_sandbox_id(sandbox_id)?;
    Ok(format!("{sandbox_id}{FILE_SUFFIX}"))
}

/// `<state dir>/dra-memlock`.
pub fn dra_dir(state_dir: &Path) -> PathBuf {
    state_dir.join(DRA_MEMLOCK_DIR)
}

/// `<state dir>/memlock/<sandbox id>.json`.
pub fn path(state_dir: &Path, sandbox_id: &str) -> Result<PathBuf, SandboxIdError> {
    Ok(dir(state_dir).join(file_name(sandbox_id)?))
}

/// The sandbox ID a directory entry is the request file of, if it is one.
pub fn sandbox_id_of(file_name: &str) -> Option<&str> {
    file_name
        .strip_suffix(FILE_SUFFIX)
        .filter(|id| check_sandbox_id(id).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn att(memlock: Memlock, network: &str) -> AttachmentMemlock {
        AttachmentMemlock {
            memlock,
            network: network.into(),
        }
    }

    #[test]
    fn largest_request_is_on_top_and_the_shape_is_v1() {
        let f = SandboxMemlock::from_attachments(
            "c1",
            "/run/netns/p",
            [
                ("net1".to_string(), att(Memlock::Bytes(1 << 30), "a")),
                ("net2".to_string(), att(Memlock::Unlimited, "b")),
                ("net3".to_string(), att(Memlock::Bytes(1 << 20), "c")),
            ]
            .into_iter()
            .collect(),
        )
        .expect("file");
        assert_eq!((f.ifname.as_str(), f.memlock), ("net2", Memlock::Unlimited));
        let v = serde_json::to_value(&f).expect("json");
        assert_eq!(v["version"], 1);
        assert_eq!(v["containerID"], "c1");
        assert_eq!(v["memlock"], "unlimited");
        assert_eq!(v["attachments"]["net1"]["memlock"], 1u64 << 30);
        let back: SandboxMemlock = serde_json::from_value(v).expect("back");
        assert_eq!(back, f);
        assert_eq!(
            SandboxMemlock::from_attachments("c1", "/n", BTreeMap::new()),
            None
        );
    }

    #[test]
    fn unknown_fields_are_ignored() {
        let f: SandboxMemlock = serde_json::from_str(
            r#"{"version":1,"containerID":"c","netns":"/n","ifname":"net1","memlock":4096,
                "network":"a","attachments":{},"future":[1]}"#,
        )
        .expect("parse");
        assert_eq!(f.memlock, Memlock::Bytes(4096));
        let old: SandboxMemlock = serde_json::from_str(
            r#"{"version":1,"containerID":"c","netns":"/n","ifname":"net1","memlock":1,"network":"a"}"#,
        )
        .expect("without attachments");
        assert!(old.attachments.is_empty());
        let all = old.into_attachments();
        assert_eq!(all["net1"], att(Memlock::Bytes(1), "a"));
    }

    #[test]
    fn sandbox_ids_never_become_paths_outside_the_dir() {
        for bad in ["", "../etc/passwd", "a/b", ".hidden", "..", "a\0b", "-x"] {
            assert!(check_sandbox_id(bad).is_err(), "{bad:?}");
            assert!(path(Path::new("/s"), bad).is_err(), "{bad:?}");
        }
        assert!(check_sandbox_id(&"a".repeat(251)).is_err());
        assert_eq!(
            path(Path::new(DEFAULT_STATE_DIR), "abc-1_2.3").expect("ok"),
            Path::new("/var/lib/cni/kroce/memlock/abc-1_2.3.json")
        );
        assert_eq!(sandbox_id_of("4f1c.json"), Some("4f1c"));
        assert_eq!(
            dra_dir(Path::new(DEFAULT_STATE_DIR)),
            Path::new(DEFAULT_DRA_DIR)
        );
        assert_eq!(sandbox_id_of("4f1c.json.tmp"), None);
        assert_eq!(sandbox_id_of(".x.json"), None);
    }
}
