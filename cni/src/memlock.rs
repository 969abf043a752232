//! memlock: the per-sandbox request file the node's memlock enforcer reads,
//! and the check of the locked-memory limit the runtime hands to containers.
//!
//! File: `<stateDir>/memlock/<containerID>.json` (its shape, name and the
//! largest-request rule are [`kroce_contracts::memlock_file`]'s), written
//! atomically (temp file + rename) under a directory flock, one per
//! sandbox. Removed with the sandbox's last attachment (DEL/GC).

use crate::state::write_atomic;
use kroce_contracts::memlock_file;
use nix::fcntl::{Flock, FlockArg};
use std::io;
use std::path::{Path, PathBuf};

/// The one memlock grammar and the file's shape, shared with kroce-nri
/// (the reader), the device plugin and the operator.
pub use kroce_contracts::Memlock;
pub use kroce_contracts::memlock_file::{AttachmentMemlock, SandboxMemlock};

/// What RDMA memory registration is assumed to need when the network asks
/// for nothing specific: enough for a few registered buffers of a real
/// RDMA application (rdma-core itself only warns below 32 KiB).
pub const DEFAULT_NEEDED: Memlock = Memlock::Bytes(64 << 20);

/// The memlock directory of a state dir.
#[derive(Debug, Clone)]
pub struct MemlockDir {
    dir: PathBuf,
}

impl MemlockDir {
    pub fn new(state_dir: &Path) -> MemlockDir {
        MemlockDir {
            dir: memlock_file::dir(state_dir),
        }
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The sandbox's file; an ID that is no file name is refused (CNI
    /// checks IDs first, so this only guards the rule being shared).
    pub fn file(&self, container_id: &str) -> io::Result<PathBuf> {
        memlock_file::file_name(container_id)
            .map(|name| self.dir.join(name))
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
    }

    /// Serialises writers of all sandboxes (short critical sections).
    fn lock(&self) -> io::Result<Flock<std::fs::File>> {
        crate::state::create_private_dir(&self.dir).map_err(|e| ctx(&self.dir, e))?;
        let f = std::fs::File::open(&self.dir).map_err(|e| ctx(&self.dir, e))?;
        Flock::lock(f, FlockArg::LockExclusive).map_err(|(_, e)| ctx(&self.dir, io::Error::from(e)))
    }

    pub fn read(&self, container_id: &str) -> io::Result<Option<SandboxMemlock>> {
        let path = self.file(container_id)?;
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
            .map(SandboxMemlock::into_attachments)
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
        let netns = current.netns.clone();
        let mut attachments = current.into_attachments();
        if attachments.remove(ifname).is_none() {
            return Ok(());
        }
        match SandboxMemlock::from_attachments(container_id, &netns, attachments) {
            Some(f) => self.write(&f),
            None => remove_if_present(&self.file(container_id)?),
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
            let Some(cid) = memlock_file::sandbox_id_of(&name) else {
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
        write_atomic(&self.file(&f.container_id)?, &bytes)
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
            serde_json::from_slice(&std::fs::read(m.file("c1").unwrap()).unwrap()).unwrap();
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
        assert!(!m.file("c1").unwrap().exists());
        m.forget("c1", "net3").unwrap();
        m.forget("never", "net1").unwrap();
        // A file from a kroce-cni that kept one attachment per sandbox.
        std::fs::write(
            m.file("old").unwrap(),
            r#"{"version":1,"containerID":"old","netns":"/n","ifname":"net1","memlock":1,"network":"a"}"#,
        )
        .unwrap();
        m.record("old", "/n", "net2", "b", Memlock::Bytes(2))
            .unwrap();
        assert_eq!(m.read("old").unwrap().unwrap().attachments.len(), 2);
        m.forget("old", "net2").unwrap();
        m.forget("old", "net1").unwrap();
        assert!(!m.file("old").unwrap().exists());
    }
}
