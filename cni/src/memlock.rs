//! memlock: the per-sandbox request file the node's memlock enforcer reads,
//! and the check of the locked-memory limit the runtime hands to containers.
//!
//! File: `<stateDir>/memlock/<containerID>.json`, written atomically
//! (temp file + rename), one per sandbox. Several attachments of one sandbox
//! are kept per ifname under `attachments`; the top-level `ifname`,
//! `memlock` and `network` are those of the largest request (what the
//! enforcer applies). Removed with the sandbox's last attachment (DEL/GC).

use crate::state::write_atomic;
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

/// A locked-memory size: bytes, or no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Memlock {
    Bytes(u64),
    Unlimited,
}

/// What RDMA memory registration is assumed to need when the network asks
/// for nothing specific: enough for a few registered buffers of a real
/// RDMA application (rdma-core itself only warns below 32 KiB).
pub const DEFAULT_NEEDED: Memlock = Memlock::Bytes(64 << 20);

impl fmt::Display for Memlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Memlock::Unlimited => f.write_str("unlimited"),
            Memlock::Bytes(b) => write!(f, "{b} bytes"),
        }
    }
}

impl Serialize for Memlock {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Memlock::Unlimited => s.serialize_str("unlimited"),
            Memlock::Bytes(b) => s.serialize_u64(*b),
        }
    }
}

impl<'de> Deserialize<'de> for Memlock {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = serde_json::Value::deserialize(d)?;
        parse_memlock(&v).map_err(serde::de::Error::custom)
    }
}

/// `"unlimited"`, a byte count (number or string), or a string with a
/// binary (`Ki`, `Mi`, `Gi`, `Ti`) or decimal (`K`/`k`, `M`, `G`, `T`)
/// suffix as in Kubernetes quantities. Zero is refused (it would forbid all
/// registration).
pub fn parse_memlock(v: &serde_json::Value) -> Result<Memlock, String> {
    let bytes = match v {
        serde_json::Value::Number(n) => n
            .as_u64()
            .ok_or_else(|| format!("{n} is not a whole number of bytes"))?,
        serde_json::Value::String(s) => {
            if s == "unlimited" {
                return Ok(Memlock::Unlimited);
            }
            parse_size(s)?
        }
        other => return Err(format!("{other} is neither \"unlimited\" nor a byte size")),
    };
    if bytes == 0 {
        return Err("0 would forbid every memory registration".into());
    }
    Ok(Memlock::Bytes(bytes))
}

fn parse_size(s: &str) -> Result<u64, String> {
    let digits_end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, suffix) = s.split_at(digits_end);
    if num.is_empty() {
        return Err(format!("{s:?} does not start with a number"));
    }
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?}: {num} is too large"))?;
    let mult: u64 = match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "K" | "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        _ => {
            return Err(format!(
                "{s:?} has unknown unit {suffix:?} (use Ki, Mi, Gi, Ti, K, M, G, T)"
            ));
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("{s:?} overflows 64 bits"))
}

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
    #[serde(rename = "containerID")]
    pub container_id: String,
    pub netns: String,
    /// The attachment whose request is the largest.
    pub ifname: String,
    pub memlock: Memlock,
    pub network: String,
    /// Every attachment's request, by ifname.
    pub attachments: BTreeMap<String, AttachmentMemlock>,
}

impl SandboxMemlock {
    /// Rebuilds the top-level fields from `attachments` (largest wins; on a
    /// tie the first ifname). `None` when no attachment is left.
    fn from_attachments(
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
            version: 1,
            container_id: container_id.to_string(),
            netns: netns.to_string(),
            ifname: ifname.clone(),
            memlock: top.memlock,
            network: top.network.clone(),
            attachments: attachments.clone(),
        })
    }
}

/// The memlock directory of a state dir.
#[derive(Debug, Clone)]
pub struct MemlockDir {
    dir: PathBuf,
}

impl MemlockDir {
    pub fn new(state_dir: &Path) -> MemlockDir {
        MemlockDir {
            dir: state_dir.join("memlock"),
        }
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    pub fn file(&self, container_id: &str) -> PathBuf {
        self.dir.join(format!("{container_id}.json"))
    }

    /// Serialises writers of all sandboxes (short critical sections).
    fn lock(&self) -> io::Result<Flock<std::fs::File>> {
        std::fs::create_dir_all(&self.dir).map_err(|e| ctx(&self.dir, e))?;
        let f = std::fs::File::open(&self.dir).map_err(|e| ctx(&self.dir, e))?;
        Flock::lock(f, FlockArg::LockExclusive).map_err(|(_, e)| ctx(&self.dir, io::Error::from(e)))
    }

    pub fn read(&self, container_id: &str) -> io::Result<Option<SandboxMemlock>> {
        let path = self.file(container_id);
        match std::fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b).map(Some).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{}: {e}", path.display()),
                )
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(ctx(&path, e)),
        }
    }

    /// Records (or replaces) one attachment's request.
    pub fn record(
        &self,
        container_id: &str,
        netns: &str,
        ifname: &str,
        network: &str,
        memlock: Memlock,
    ) -> io::Result<()> {
        let _lock = self.lock()?;
        let mut attachments = self
            .read(container_id)?
            .map(|f| f.attachments)
            .unwrap_or_default();
        attachments.insert(
            ifname.to_string(),
            AttachmentMemlock {
                memlock,
                network: network.to_string(),
            },
        );
        match SandboxMemlock::from_attachments(container_id, netns, attachments) {
            Some(f) => self.write(&f),
            None => Ok(()),
        }
    }

    /// Drops one attachment's request; removes the file with the last one.
    /// Nothing recorded is fine.
    pub fn forget(&self, container_id: &str, ifname: &str) -> io::Result<()> {
        if !self.dir.is_dir() {
            return Ok(());
        }
        let _lock = self.lock()?;
        let Some(current) = self.read(container_id)? else {
            return Ok(());
        };
        let mut attachments = current.attachments;
        if attachments.remove(ifname).is_none() {
            return Ok(());
        }
        match SandboxMemlock::from_attachments(container_id, &current.netns, attachments) {
            Some(f) => self.write(&f),
            None => remove_if_present(&self.file(container_id)),
        }
    }

    /// Every recorded `(containerID, ifname, network)`.
    pub fn entries(&self) -> io::Result<Vec<(String, String, String)>> {
        let mut out = Vec::new();
        let rd = match std::fs::read_dir(&self.dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(ctx(&self.dir, e)),
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(cid) = name.strip_suffix(".json") else {
                continue;
            };
            if let Ok(Some(f)) = self.read(cid) {
                for (ifname, a) in f.attachments {
                    out.push((cid.to_string(), ifname, a.network));
                }
            }
        }
        out.sort();
        Ok(out)
    }

    fn write(&self, f: &SandboxMemlock) -> io::Result<()> {
        let bytes = serde_json::to_vec_pretty(f).map_err(io::Error::other)?;
        write_atomic(&self.file(&f.container_id), &bytes)
    }
}

fn remove_if_present(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(ctx(path, e)),
        _ => Ok(()),
    }
}

fn ctx(path: &Path, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

/// `Max locked memory` soft and hard limits from a `/proc/<pid>/limits` text.
pub fn parse_limits(text: &str) -> Option<(Memlock, Memlock)> {
    let line = text.lines().find(|l| l.starts_with("Max locked memory"))?;
    let mut fields = line["Max locked memory".len()..].split_whitespace();
    let one = |s: &str| -> Option<Memlock> {
        if s == "unlimited" {
            Some(Memlock::Unlimited)
        } else {
            s.parse().ok().map(Memlock::Bytes)
        }
    };
    let soft = one(fields.next()?)?;
    let hard = one(fields.next()?)?;
    Some((soft, hard))
}

/// The locked-memory limits of one process, read under a procfs root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessLimit {
    pub pid: String,
    pub comm: Option<String>,
    pub soft: Memlock,
    pub hard: Memlock,
}

pub fn read_limit(proc_root: &Path, pid: &str) -> io::Result<ProcessLimit> {
    let path = proc_root.join(pid).join("limits");
    let text = std::fs::read_to_string(&path).map_err(|e| ctx(&path, e))?;
    let (soft, hard) = parse_limits(&text).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: no readable 'Max locked memory' line", path.display()),
        )
    })?;
    let comm = std::fs::read_to_string(proc_root.join(pid).join("comm"))
        .ok()
        .map(|s| s.trim().to_string());
    Ok(ProcessLimit {
        pid: pid.to_string(),
        comm,
        soft,
        hard,
    })
}

/// Warnings for every process of the runtime's tree whose soft limit is
/// below `needed` (pure: the limits are read by the caller).
pub fn limit_warnings(
    limits: &[ProcessLimit],
    needed: Memlock,
    requested: Option<Memlock>,
) -> Vec<String> {
    limits
        .iter()
        .filter(|l| l.soft < needed)
        .map(|l| {
            format!(
                "RLIMIT_MEMLOCK of pid {}{} is {} (soft) / {} (hard), below the {} RDMA memory registration needs{}; containers started by this runtime inherit it unless the kroce memlock enforcer raises it",
                l.pid,
                l.comm.as_deref().map(|c| format!(" ({c})")).unwrap_or_default(),
                l.soft,
                l.hard,
                needed,
                requested.map(|r| format!(" (network requests {r})")).unwrap_or_default(),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parse_sizes() {
        assert_eq!(
            parse_memlock(&json!("unlimited")).unwrap(),
            Memlock::Unlimited
        );
        assert_eq!(parse_memlock(&json!(4096)).unwrap(), Memlock::Bytes(4096));
        assert_eq!(
            parse_memlock(&json!("64Mi")).unwrap(),
            Memlock::Bytes(64 << 20)
        );
        assert_eq!(
            parse_memlock(&json!("2G")).unwrap(),
            Memlock::Bytes(2_000_000_000)
        );
        assert_eq!(parse_memlock(&json!("512")).unwrap(), Memlock::Bytes(512));
        for bad in [
            json!(0),
            json!("0"),
            json!(-1),
            json!(1.5),
            json!("lots"),
            json!("5Qi"),
            json!(true),
            json!("99999999999999999999"),
            json!("20000000Ti"),
        ] {
            assert!(parse_memlock(&bad).is_err(), "{bad}");
        }
        assert!(Memlock::Unlimited > Memlock::Bytes(u64::MAX));
    }

    #[test]
    fn limits_text() {
        let text = "Limit                     Soft Limit           Hard Limit           Units     \n\
Max cpu time              unlimited            unlimited            seconds   \n\
Max locked memory         8388608              unlimited            bytes     \n";
        assert_eq!(
            parse_limits(text),
            Some((Memlock::Bytes(8388608), Memlock::Unlimited))
        );
        assert_eq!(parse_limits("nothing here"), None);
    }

    #[test]
    fn warnings_only_below_needed() {
        let l = |soft| ProcessLimit {
            pid: "1".into(),
            comm: Some("containerd".into()),
            soft,
            hard: soft,
        };
        assert!(limit_warnings(&[l(Memlock::Unlimited)], Memlock::Unlimited, None).is_empty());
        let w = limit_warnings(&[l(Memlock::Bytes(8 << 20))], DEFAULT_NEEDED, None);
        assert_eq!(w.len(), 1);
        assert!(
            w[0].contains("containerd") && w[0].contains("8388608"),
            "{}",
            w[0]
        );
    }

    #[test]
    fn file_keeps_largest_and_is_removed_with_last() {
        let dir = tempfile::tempdir().unwrap();
        let m = MemlockDir::new(dir.path());
        m.record("c1", "/run/netns/p", "net1", "a", Memlock::Bytes(1 << 30))
            .unwrap();
        m.record("c1", "/run/netns/p", "net2", "b", Memlock::Unlimited)
            .unwrap();
        m.record("c1", "/run/netns/p", "net3", "c", Memlock::Bytes(1 << 20))
            .unwrap();
        let f = m.read("c1").unwrap().unwrap();
        assert_eq!(f.ifname, "net2");
        assert_eq!(f.memlock, Memlock::Unlimited);
        assert_eq!(f.network, "b");
        assert_eq!(f.attachments.len(), 3);
        let raw: serde_json::Value =
            serde_json::from_slice(&std::fs::read(m.file("c1")).unwrap()).unwrap();
        assert_eq!(raw["memlock"], "unlimited");
        assert_eq!(raw["containerID"], "c1");
        assert_eq!(raw["attachments"]["net1"]["memlock"], 1u64 << 30);
        m.forget("c1", "net2").unwrap();
        let f = m.read("c1").unwrap().unwrap();
        assert_eq!(
            (f.ifname.as_str(), f.memlock),
            ("net1", Memlock::Bytes(1 << 30))
        );
        m.forget("c1", "net1").unwrap();
        m.forget("c1", "net3").unwrap();
        assert!(!m.file("c1").exists());
        m.forget("c1", "net3").unwrap();
        m.forget("never", "net1").unwrap();
    }
}
