//! Network namespaces as values: an open handle (path + fd), liveness, and
//! running a short closure inside one on a helper thread (so the caller's
//! thread never changes namespace).

use nix::sched::{CloneFlags, setns};
use nix::sys::stat::fstat;
use nix::sys::statfs::{NSFS_MAGIC, fstatfs};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

#[derive(Debug)]
pub struct Netns {
    path: PathBuf,
    fd: OwnedFd,
    /// (st_dev, st_ino): equal values are the same namespace.
    id: (u64, u64),
}

fn ctx(path: &Path, e: impl Into<io::Error>) -> io::Error {
    let e = e.into();
    io::Error::new(e.kind(), format!("netns {}: {e}", path.display()))
}

impl Netns {
    /// Opens a netns file (`/run/netns/x`, `/proc/<pid>/ns/net`). Refuses a
    /// path that is not a namespace (an unmounted bind-mount target).
    pub fn open(path: &Path) -> io::Result<Netns> {
        let file = std::fs::File::open(path).map_err(|e| ctx(path, e))?;
        let fs = fstatfs(&file).map_err(|e| ctx(path, e))?;
        if fs.filesystem_type() != NSFS_MAGIC {
            return Err(ctx(
                path,
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "not a network namespace (nsfs)",
                ),
            ));
        }
        let st = fstat(&file).map_err(|e| ctx(path, e))?;
        Ok(Netns {
            path: path.to_path_buf(),
            fd: file.into(),
            id: (st.st_dev, st.st_ino),
        })
    }

    /// The calling thread's netns.
    pub fn current() -> io::Result<Netns> {
        Netns::open(Path::new("/proc/thread-self/ns/net"))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// (st_dev, st_ino) of the namespace file.
    pub fn id(&self) -> (u64, u64) {
        self.id
    }

    pub fn same_as(&self, other: &Netns) -> bool {
        self.id == other.id
    }

    /// Whether the calling thread is in this namespace.
    pub fn is_current(&self) -> bool {
        Netns::current().map(|c| c.same_as(self)).unwrap_or(false)
    }

    /// Runs `f` with its thread in this namespace. Sockets created in `f`
    /// stay bound to this namespace after it returns.
    pub fn run_in<T: Send>(&self, f: impl FnOnce() -> io::Result<T> + Send) -> io::Result<T> {
        if self.is_current() {
            return f();
        }
        std::thread::scope(|s| {
            s.spawn(|| {
                setns(self.fd(), CloneFlags::CLONE_NEWNET).map_err(|e| ctx(&self.path, e))?;
                f()
            })
            .join()
            .map_err(|_| io::Error::other("netns helper thread panicked"))?
        })
    }
}

/// Whether `path` still names a live network namespace.
pub fn is_alive(path: &Path) -> bool {
    Netns::open(path).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn current_is_alive_and_plain_files_are_not() {
        let cur = Netns::current().unwrap();
        assert!(cur.is_current());
        assert!(cur.same_as(&Netns::current().unwrap()));
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("ns");
        std::fs::write(&f, "").unwrap();
        let e = Netns::open(&f).unwrap_err();
        assert!(e.to_string().contains("not a network namespace"), "{e}");
        assert!(!is_alive(&dir.path().join("gone")));
    }
}
