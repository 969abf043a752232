//! The state dir (`/var/lib/cni/kroce` by default):
//!
//! - `vf/<pci or soft RDMA name>.json`: the claim on a VF or soft device (who holds it, its original state,
//!   what ADD planned, the result) — written before the first side effect,
//!   removed when the VF is released;
//! - `locks/<pci or name>.lock`: the per-device flock, held across a whole ADD/DEL/GC of
//!   that VF (the file is removed while held; lockers re-check the inode);
//! - `memlock/<containerID>.json`: see [`crate::memlock`];
//! - `ipam-versions.json`: see [`crate::ipam::ExecIpam`].
//!
//! Files are written atomically (temp file in the same dir + swap, see
//! [`write_atomic`]), mode 0600, in directories created 0700. The state dir must be root's and not
//! group/world writable ([`StateDir::ensure_private`]): what is in it is
//! trusted to say which VF an attachment holds and what to restore.

use crate::addr::Mac;
use crate::vf::{DeviceKey, Target};
use kroce_contracts::atomic_file::{Modes, TempFile};
use kroce_netlink::route::LinkInfo;
use kroce_netlink::vf_attrs::{VfSetting, VfState};
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Shared with kroce-nri, which reads the memlock requests under it.
pub use kroce_contracts::DEFAULT_STATE_DIR;

/// The IPAM delegates' remembered CNI versions, in the state dir. About
/// the node's delegates, not an attachment: it stays when every VF is free.
pub const IPAM_VERSIONS_FILE: &str = "ipam-versions.json";

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("state dir: {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("device {key} is locked by another kroce-cni call (waited {waited:?})")]
    LockTimeout { key: DeviceKey, waited: Duration },
    #[error("state dir {path}: {reason}")]
    Insecure { path: PathBuf, reason: NotPrivate },
    #[error("state file {path} is corrupt: {reason}")]
    Corrupt { path: PathBuf, reason: String },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> StateError + '_ {
    move |source| StateError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Creates `dir` and its missing parents, each new one mode 0700.
pub fn create_private_dir(dir: &Path) -> io::Result<()> {
    kroce_contracts::atomic_file::ensure_dir(dir, Modes::PRIVATE.dir).map_err(|e| e.source)
}

/// Writes `bytes` to `path` (mode 0600) via a temp file in the same
/// directory (kroce's one [`TempFile`]: a unique name, removed on any
/// failure) and a swap, so readers see the old or the new file, never a
/// torn one.
///
/// Not [`kroce_contracts::atomic_file::write`] (fsync, rename over, fsync
/// the directory), on purpose: an existing file is *exchanged* with the
/// temp file (`RENAME_EXCHANGE`) and the old one unlinked, a different
/// operation from a rename over it, which makes ext4 flush the new file's
/// data first (`auto_da_alloc`, ~2.4 ms on a disk mounted with `discard`).
/// An ADD rewrites its claim several times; with the two fsyncs each write
/// took 11 ms instead of 0.4 on the dev VM (ext4 on virtio). No fsync here: what must
/// survive a crash is the lease, and its writer syncs.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let in_context = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", path.display()));
    let mut tmp = TempFile::create(path, Modes::PRIVATE).map_err(|e| in_context(e.source))?;
    tmp.write_all(bytes).map_err(|e| in_context(e.source))?;
    tmp.place_with(replace).map_err(|e| in_context(e.source))
}

/// Puts `tmp` at `path`: swapped with an existing file, whose old content
/// (now at `tmp`) is unlinked; renamed when there is none (or the
/// filesystem cannot swap).
fn replace(tmp: &Path, path: &Path) -> io::Result<()> {
    use nix::errno::Errno;
    use nix::fcntl::{AT_FDCWD, RenameFlags, renameat2};
    // A swap takes any type: a directory (or a symlink) at `path` would be
    // swapped out and the write "succeed". Only a file is swapped; anything
    // else gets rename(2)'s answer, as before.
    if !std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_file()) {
        return std::fs::rename(tmp, path);
    }
    match renameat2(AT_FDCWD, tmp, AT_FDCWD, path, RenameFlags::RENAME_EXCHANGE) {
        Ok(()) => {
            // The old content, under the temp name: a leftover is harmless
            // (a unique `.name.tmp-PID-N`, never reused).
            let _ = std::fs::remove_file(tmp);
            Ok(())
        }
        Err(Errno::ENOENT | Errno::EINVAL | Errno::ENOSYS | Errno::EOPNOTSUPP) => {
            std::fs::rename(tmp, path)
        }
        Err(e) => Err(io::Error::from(e)),
    }
}

/// Why a state dir is not trusted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotPrivate {
    #[error("is not an absolute path")]
    Relative,
    #[error("is not a directory")]
    NotADirectory,
    #[error("is owned by uid {owner}, not {uid} (root): refusing to trust claims in it")]
    Owner { owner: u32, uid: u32 },
    #[error(
        "is group/world writable (mode {mode:04o}): refusing to trust claims in it; chmod 0700 it"
    )]
    Writable { mode: u32 },
}

/// Why a state dir with `meta` is not private to `uid` (root in
/// production), if it is not.
pub fn check_private(meta: &std::fs::Metadata, uid: u32) -> Result<(), NotPrivate> {
    if !meta.is_dir() {
        return Err(NotPrivate::NotADirectory);
    }
    if meta.uid() != uid {
        return Err(NotPrivate::Owner {
            owner: meta.uid(),
            uid,
        });
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(NotPrivate::Writable { mode });
    }
    Ok(())
}

/// Whether ADD finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Adding,
    Attached,
}

/// What the VF looked like before ADD touched it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Original {
    /// Its netdev in the host netns (name, ifindex, MAC, MTU, up, altnames).
    pub link: LinkInfo,
    /// PF-side VF attributes; read only when ADD changes some.
    pub vf: Option<VfState>,
}

/// What ADD was going to change (restored from `original` on release).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct Planned {
    pub vf_settings: Vec<VfSetting>,
    pub mac: Option<Mac>,
    pub mtu: Option<u32>,
    /// The RDMA device to move with the netdev.
    pub rdma_device: Option<String>,
}

/// A VF held by an attachment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Claim {
    pub version: u32,
    pub vf: Target,
    #[serde(rename = "containerID")]
    pub container_id: String,
    pub ifname: String,
    pub netns: String,
    pub network: String,
    pub phase: Phase,
    pub original: Original,
    pub planned: Planned,
    /// The ifindex in the pod netns when it differs from the host one.
    pub pod_ifindex: Option<u32>,
    /// The ADD result (canonical 1.1.0 layout), once attached.
    pub result: Option<serde_json::Value>,
    /// The request's configuration, `CNI_ARGS` and `CNI_PATH`: what a later
    /// takeover or GC needs to release this attachment's IPAM lease.
    pub config: serde_json::Value,
    pub cni_args: String,
    pub cni_path: Vec<PathBuf>,
}

impl Claim {
    pub fn owned_by(&self, container_id: &str, ifname: &str) -> bool {
        self.container_id == container_id && self.ifname == ifname
    }
}

/// A held per-device lock. Dropped, it removes its lock file unless a
/// claim on the device is left: a held device keeps its lock file, a free
/// one leaves none behind, whichever way the call ended.
#[derive(Debug)]
pub struct VfLock {
    flock: Flock<std::fs::File>,
    path: PathBuf,
    /// The device's claim file.
    claim: PathBuf,
}

impl VfLock {
    /// Removes the lock file (while still holding it: later lockers notice
    /// the inode changed and retry on a fresh file).
    fn remove_file(&self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Drop for VfLock {
    /// Runs before the flock is released. Only the file this lock holds is
    /// removed: once it is gone, the path may name the next holder's.
    fn drop(&mut self) {
        let held = self.flock.metadata().map(|m| m.ino()).ok();
        let named = std::fs::metadata(&self.path).map(|m| m.ino()).ok();
        let no_claim = matches!(std::fs::metadata(&self.claim),
            Err(e) if e.kind() == io::ErrorKind::NotFound);
        if held.is_some() && held == named && no_claim {
            self.remove_file();
        }
    }
}

#[derive(Debug, Clone)]
pub struct StateDir {
    root: PathBuf,
}

impl StateDir {
    pub fn new(root: impl Into<PathBuf>) -> StateDir {
        StateDir { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Creates the state dir (0700) when missing, else checks that only
    /// root can write it: owned by root (the user kroce-cni runs as), not
    /// group or world writable. Claims in a directory anyone else can
    /// write would let them choose what a release restores.
    pub fn ensure_private(&self) -> Result<(), StateError> {
        let insecure = |reason: NotPrivate| StateError::Insecure {
            path: self.root.clone(),
            reason,
        };
        if !self.root.is_absolute() {
            return Err(insecure(NotPrivate::Relative));
        }
        let meta = match std::fs::metadata(&self.root) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                create_private_dir(&self.root).map_err(io_err(&self.root))?;
                std::fs::metadata(&self.root).map_err(io_err(&self.root))?
            }
            other => other.map_err(io_err(&self.root))?,
        };
        check_private(&meta, nix::unistd::geteuid().as_raw()).map_err(insecure)
    }

    pub fn claim_path(&self, pci: &DeviceKey) -> PathBuf {
        self.root.join("vf").join(format!("{pci}.json"))
    }

    fn lock_path(&self, pci: &DeviceKey) -> PathBuf {
        self.root.join("locks").join(format!("{pci}.lock"))
    }

    /// Takes the per-VF lock, waiting up to `timeout`.
    pub fn lock_vf(&self, pci: &DeviceKey, timeout: Duration) -> Result<VfLock, StateError> {
        let path = self.lock_path(pci);
        let dir = self.root.join("locks");
        create_private_dir(&dir).map_err(io_err(&dir))?;
        let start = Instant::now();
        loop {
            use std::os::unix::fs::OpenOptionsExt;
            let file = std::fs::OpenOptions::new()
                .mode(0o600)
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
                .map_err(io_err(&path))?;
            match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                Ok(lock) => {
                    // The holder before us may have removed the file: only
                    // a lock on the file the path names now counts.
                    let held = lock.metadata().map(|m| m.ino()).ok();
                    let now = std::fs::metadata(&path).map(|m| m.ino()).ok();
                    if held.is_some() && held == now {
                        return Ok(VfLock {
                            flock: lock,
                            path,
                            claim: self.claim_path(pci),
                        });
                    }
                }
                Err((_, nix::errno::Errno::EWOULDBLOCK)) => {}
                Err((_, e)) => return Err(io_err(&path)(e.into())),
            }
            if start.elapsed() >= timeout {
                return Err(StateError::LockTimeout {
                    key: pci.clone(),
                    waited: start.elapsed(),
                });
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub fn read_claim(&self, pci: &DeviceKey) -> Result<Option<Claim>, StateError> {
        let path = self.claim_path(pci);
        match std::fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b)
                .map(Some)
                .map_err(|e| StateError::Corrupt {
                    path,
                    reason: e.to_string(),
                }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err(&path)(e)),
        }
    }

    pub fn write_claim(&self, claim: &Claim) -> Result<(), StateError> {
        let path = self.claim_path(&claim.vf.key());
        let bytes =
            serde_json::to_vec_pretty(claim).map_err(|e| io_err(&path)(io::Error::other(e)))?;
        write_atomic(&path, &bytes).map_err(io_err(&path))
    }

    pub fn remove_claim(&self, pci: &DeviceKey) -> Result<(), StateError> {
        let path = self.claim_path(pci);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io_err(&path)(e)),
            _ => Ok(()),
        }
    }

    /// Every claim, plus the files that could not be read.
    pub fn claims(&self) -> (Vec<Claim>, Vec<StateError>) {
        let dir = self.root.join("vf");
        let mut claims = Vec::new();
        let mut errors = Vec::new();
        let rd = match std::fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return (claims, errors),
            Err(e) => return (claims, vec![io_err(&dir)(e)]),
        };
        let mut names: Vec<String> = rd
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        for name in names {
            let Some(pci) = name.strip_suffix(".json").and_then(DeviceKey::from_stem) else {
                continue;
            };
            match self.read_claim(&pci) {
                Ok(Some(c)) => claims.push(c),
                Ok(None) => {}
                Err(e) => errors.push(e),
            }
        }
        (claims, errors)
    }

    /// The claim held by `(container_id, ifname)`, looked up by scanning.
    pub fn find_claim(&self, container_id: &str, ifname: &str) -> Option<Claim> {
        self.claims()
            .0
            .into_iter()
            .find(|c| c.owned_by(container_id, ifname))
    }

    /// STATUS: can we create and remove files here?
    pub fn probe_writable(&self) -> Result<(), StateError> {
        let probe = self
            .root
            .join(format!(".status-probe.{}", std::process::id()));
        write_atomic(&probe, b"ok").map_err(io_err(&probe))?;
        std::fs::remove_file(&probe).map_err(io_err(&probe))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_is_exclusive_and_survives_file_removal() {
        let dir = tempfile::tempdir().unwrap();
        let s = StateDir::new(dir.path());
        let pci = DeviceKey::Pci("0000:3b:00.2".parse().unwrap());
        let a = s.lock_vf(&pci, Duration::from_millis(10)).unwrap();
        let e = s.lock_vf(&pci, Duration::from_millis(30)).unwrap_err();
        assert!(matches!(e, StateError::LockTimeout { .. }), "{e}");
        assert!(e.to_string().contains("0000:3b:00.2"));
        a.remove_file();
        drop(a);
        let b = s.lock_vf(&pci, Duration::from_millis(10)).unwrap();
        drop(b);
    }

    /// The lock file goes with the lock when no claim is left, stays when
    /// one is, and a newer holder's file is never removed.
    #[test]
    fn dropped_lock_removes_its_file_unless_a_claim_stays() {
        let dir = tempfile::tempdir().unwrap();
        let s = StateDir::new(dir.path());
        let pci = DeviceKey::Pci("0000:3b:00.2".parse().unwrap());
        let lock_file = s.lock_path(&pci);
        drop(s.lock_vf(&pci, Duration::from_millis(10)).unwrap());
        assert!(!lock_file.exists(), "no claim: the lock file goes");

        let claim = s.claim_path(&pci);
        write_atomic(&claim, b"{}").unwrap();
        drop(s.lock_vf(&pci, Duration::from_millis(10)).unwrap());
        assert!(lock_file.exists(), "a claim stays: so does the lock file");
        std::fs::remove_file(&claim).unwrap();

        let a = s.lock_vf(&pci, Duration::from_millis(10)).unwrap();
        a.remove_file();
        let b = s.lock_vf(&pci, Duration::from_millis(10)).unwrap();
        drop(a);
        assert!(lock_file.exists(), "the next holder's file stays");
        drop(b);
        assert!(!lock_file.exists());
    }

    #[test]
    fn concurrent_lockers_never_overlap() {
        let dir = tempfile::tempdir().unwrap();
        let s = StateDir::new(dir.path());
        let pci = DeviceKey::Pci("0000:3b:00.2".parse().unwrap());
        let inside = std::sync::atomic::AtomicU32::new(0);
        std::thread::scope(|sc| {
            for _ in 0..4 {
                sc.spawn(|| {
                    for _ in 0..20 {
                        let l = s.lock_vf(&pci, Duration::from_secs(10)).unwrap();
                        assert_eq!(inside.fetch_add(1, std::sync::atomic::Ordering::SeqCst), 0);
                        std::thread::sleep(Duration::from_micros(200));
                        inside.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                        l.remove_file();
                    }
                });
            }
        });
    }

    #[test]
    fn files_are_private_and_open_dirs_are_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let s = StateDir::new(dir.path().join("new/state"));
        let me = nix::unistd::geteuid().as_raw();
        s.ensure_private().unwrap();
        let meta = std::fs::metadata(s.root()).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o700);
        write_atomic(&s.root().join("vf/x.json"), b"{}").unwrap();
        let f = std::fs::metadata(s.root().join("vf/x.json")).unwrap();
        assert_eq!(f.mode() & 0o777, 0o600);
        let d = std::fs::metadata(s.root().join("vf")).unwrap();
        assert_eq!(d.mode() & 0o777, 0o700);
        let pci = DeviceKey::Pci("0000:3b:00.2".parse().unwrap());
        drop(s.lock_vf(&pci, Duration::from_millis(10)).unwrap());
        let l = std::fs::metadata(s.root().join("locks")).unwrap();
        assert_eq!(l.mode() & 0o777, 0o700);
        for mode in [0o777, 0o770, 0o722, 0o1777] {
            std::fs::set_permissions(s.root(), std::fs::Permissions::from_mode(mode)).unwrap();
            let e = s.ensure_private().unwrap_err().to_string();
            assert!(
                e.contains(&s.root().display().to_string()) && e.contains("writable"),
                "{mode:o}: {e}"
            );
        }
        std::fs::set_permissions(s.root(), std::fs::Permissions::from_mode(0o755)).unwrap();
        s.ensure_private().unwrap();
        let meta = std::fs::metadata(s.root()).unwrap();
        let e = check_private(&meta, me.wrapping_add(1))
            .unwrap_err()
            .to_string();
        assert!(e.contains("owned by uid"), "{e}");
        let e = StateDir::new("rel/dir").ensure_private().unwrap_err();
        assert!(e.to_string().contains("absolute"), "{e}");
    }

    /// A reader during rewrites sees the old or the new file, whole,
    /// never none (the swap keeps a file at the path at every moment).
    #[test]
    fn rewrites_are_never_missing_or_torn_for_a_reader() {
        use std::os::unix::fs::PermissionsExt;
        use std::sync::atomic::{AtomicBool, Ordering};
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("claim.json");
        let (a, b) = (vec![b'a'; 3000], vec![b'b'; 10]);
        write_atomic(&p, &a).unwrap();
        let done = AtomicBool::new(false);
        let bad = std::thread::scope(|sc| {
            let reader = sc.spawn(|| {
                let mut bad = Vec::new();
                while !done.load(Ordering::Relaxed) {
                    match std::fs::read(&p) {
                        Ok(v) if v == a || v == b => {}
                        Ok(v) => bad.push(format!("torn: {} bytes", v.len())),
                        Err(e) => bad.push(e.to_string()),
                    }
                }
                bad
            });
            for i in 0..400 {
                write_atomic(&p, if i % 2 == 0 { &b } else { &a }).unwrap();
            }
            done.store(true, Ordering::Relaxed);
            reader.join().unwrap()
        });
        assert!(bad.is_empty(), "{:?}", &bad[..bad.len().min(5)]);
        let mode = std::fs::metadata(&p).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    /// A directory where the file should be is an error, as rename(2)
    /// says, not swapped away.
    #[test]
    fn a_directory_in_the_way_is_an_error_and_stays() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("result.json");
        std::fs::create_dir_all(p.join("x")).unwrap();
        let e = write_atomic(&p, b"{}").unwrap_err().to_string();
        assert!(e.contains("result.json"), "{e}");
        assert!(p.join("x").is_dir());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn atomic_write_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a/b.json");
        write_atomic(&p, b"1").unwrap();
        write_atomic(&p, b"2").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"2");
        assert_eq!(std::fs::read_dir(dir.path().join("a")).unwrap().count(), 1);
        let s = StateDir::new(dir.path());
        s.probe_writable().unwrap();
        assert!(s.claims().0.is_empty());
        std::fs::create_dir_all(dir.path().join("vf")).unwrap();
        std::fs::write(dir.path().join("vf/0000:3b:00.2.json"), "{garbage").unwrap();
        let (c, errs) = s.claims();
        assert!(c.is_empty());
        assert!(errs[0].to_string().contains("corrupt"));
    }
}
