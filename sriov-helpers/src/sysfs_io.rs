//! Small readers over sysfs-style files: trimmed text, parsed numbers, link
//! targets. Every error names the path.
//!
//! A scan reads a dozen files per device, so per-device reads go through a
//! [`SysDir`]: the device directory is opened once (following its class or
//! bus link once) and its files are opened relative to that descriptor. An
//! absolute path would walk ~15 components and the symlink again for every
//! file; on a 512-VF host that walk was most of the scan time.

use crate::error::HostError;
use rustix::fs::{AtFlags, CWD as AT_FDCWD, Dir, Mode, OFlags, openat, readlinkat, statat};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

/// Syscalls issued through this layer on this thread (tests and benches
/// hold a scan to a budget with it; see `fixture::count_sysfs_syscalls`).
#[cfg(any(test, feature = "testing"))]
mod counter {
    use std::cell::Cell;
    thread_local! {
        static SYSCALLS: Cell<u64> = const { Cell::new(0) };
    }
    pub(crate) fn add(n: u64) {
        SYSCALLS.with(|c| c.set(c.get() + n));
    }
    pub(crate) fn get() -> u64 {
        SYSCALLS.with(Cell::get)
    }
}
#[cfg(not(any(test, feature = "testing")))]
mod counter {
    #[inline(always)]
    pub(crate) fn add(_: u64) {}
}
pub(crate) use counter::add as add_syscalls;
use counter::add as count;
#[cfg(any(test, feature = "testing"))]
pub(crate) use counter::get as syscalls;

/// Runs `f` (on a helper thread) and returns the syscalls it issued there,
/// for the caller to add to its own thread's count.
pub(crate) fn counted<T>(f: impl FnOnce() -> T) -> (T, u64) {
    #[cfg(any(test, feature = "testing"))]
    {
        let before = syscalls();
        let out = f();
        (out, syscalls() - before)
    }
    #[cfg(not(any(test, feature = "testing")))]
    {
        (f(), 0)
    }
}

fn not_found_or_read(path: &Path, source: std::io::Error, what: &'static str) -> HostError {
    if source.kind() == std::io::ErrorKind::NotFound {
        HostError::NotFound {
            path: path.to_path_buf(),
            what,
        }
    } else {
        HostError::Read {
            path: path.to_path_buf(),
            source,
        }
    }
}

const RDONLY: OFlags = OFlags::RDONLY.union(OFlags::CLOEXEC);
const DIRECTORY: OFlags = RDONLY.union(OFlags::DIRECTORY);

/// One open, one read, one close: sysfs and procfs serve an attribute (at
/// most a page) in a single read, so a short read is the end;
/// `read_to_string` would add an fstat and a probe read per file.
fn read_small_at(dir: BorrowedFd<'_>, name: &Path) -> std::io::Result<String> {
    count(1);
    let fd = openat(dir, name, RDONLY, Mode::empty())?;
    count(1); // the close on drop
    // Uninitialised: zeroing a page per attribute was 7% of a scan.
    let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 4096];
    let mut out = Vec::new();
    loop {
        count(1);
        let (read, _) = rustix::io::read(&fd, &mut buf)?;
        let n = read.len();
        out.extend_from_slice(read);
        if n < buf.len() {
            break;
        }
    }
    String::from_utf8(out).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

fn link_at(dir: BorrowedFd<'_>, name: &Path) -> std::io::Result<PathBuf> {
    use std::os::unix::ffi::OsStringExt;
    count(1);
    let target = readlinkat(dir, name, Vec::with_capacity(256))?;
    Ok(PathBuf::from(std::ffi::OsString::from_vec(
        target.into_bytes(),
    )))
}

/// Whether `name` exists, following links.
fn exists_at(dir: BorrowedFd<'_>, name: &Path) -> bool {
    count(1);
    statat(dir, name, AtFlags::empty()).is_ok()
}

fn open_dir_at(dir: BorrowedFd<'_>, name: &Path) -> std::io::Result<OwnedFd> {
    count(2); // open and close
    Ok(openat(dir, name, DIRECTORY, Mode::empty())?)
}

fn dir_names_at(dir: BorrowedFd<'_>, name: &Path) -> std::io::Result<Vec<String>> {
    // openat, getdents64 until it returns 0 (twice for a small directory),
    // close: rustix reads the descriptor as it is (libc's fdopendir would
    // add an fstat and two fcntl).
    count(4);
    let d = Dir::new(openat(dir, name, DIRECTORY, Mode::empty())?)?;
    let mut names = Vec::new();
    for entry in d {
        let entry = entry?;
        let n = entry.file_name().to_bytes();
        if n == b"." || n == b".." {
            continue;
        }
        names.push(String::from_utf8_lossy(n).into_owned());
    }
    names.sort();
    Ok(names)
}

/// An open sysfs directory (see the module docs). Paths in errors are the
/// directory's path as given joined with the file name.
#[derive(Debug)]
pub(crate) struct SysDir {
    fd: OwnedFd,
    path: PathBuf,
}

impl SysDir {
    /// Opens `path`, following links. A dangling link is reported as such;
    /// `what` names the entry when nothing is there.
    pub(crate) fn open(path: &Path, what: &'static str) -> Result<SysDir, HostError> {
        Self::open_in(AT_FDCWD, path, path.to_path_buf(), what)
    }

    /// Opens the subdirectory `name`.
    pub(crate) fn subdir(&self, name: &str, what: &'static str) -> Result<SysDir, HostError> {
        Self::open_in(self.fd.as_fd(), Path::new(name), self.join(name), what)
    }

    fn open_in(
        dir: BorrowedFd<'_>,
        name: &Path,
        path: PathBuf,
        what: &'static str,
    ) -> Result<SysDir, HostError> {
        match open_dir_at(dir, name) {
            Ok(fd) => Ok(SysDir { fd, path }),
            Err(source) if source.kind() == std::io::ErrorKind::NotFound => {
                match link_at(dir, name) {
                    Ok(target) => Err(HostError::DanglingLink { path, target }),
                    Err(_) => Err(HostError::NotFound { path, what }),
                }
            }
            Err(source) => Err(HostError::Read { path, source }),
        }
    }

    pub(crate) fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    pub(crate) fn read_string(&self, name: &str) -> Result<String, HostError> {
        read_small_at(self.fd.as_fd(), Path::new(name))
            .map(|s| s.trim().to_string())
            .map_err(|e| not_found_or_read(&self.join(name), e, "file"))
    }

    /// A file that may legitimately be absent (e.g. `sriov_totalvfs` on a VF).
    pub(crate) fn read_optional(&self, name: &str) -> Result<Option<String>, HostError> {
        optional(self.read_string(name))
    }

    /// Raw text, `None` on any error (attributes the kernel refuses to read,
    /// e.g. `carrier` of a down link, attributes of an empty GID slot).
    pub(crate) fn read_lossy(&self, name: &str) -> Option<String> {
        read_small_at(self.fd.as_fd(), Path::new(name)).ok()
    }

    pub(crate) fn parse_hex_u16(&self, name: &str, what: &'static str) -> Result<u16, HostError> {
        let s = self.read_string(name)?;
        u16::from_str_radix(strip_0x(&s), 16).map_err(|_| malformed(self.join(name), what, s))
    }

    pub(crate) fn parse_hex_u32(&self, name: &str, what: &'static str) -> Result<u32, HostError> {
        let s = self.read_string(name)?;
        u32::from_str_radix(strip_0x(&s), 16).map_err(|_| malformed(self.join(name), what, s))
    }

    pub(crate) fn parse_optional_num<T: std::str::FromStr>(
        &self,
        name: &str,
        what: &'static str,
    ) -> Result<Option<T>, HostError> {
        match self.read_optional(name)? {
            None => Ok(None),
            Some(s) => s
                .parse::<T>()
                .map(Some)
                .map_err(|_| malformed(self.join(name), what, s)),
        }
    }

    /// The raw target of a link.
    pub(crate) fn read_link(&self, name: &str) -> Result<PathBuf, HostError> {
        link_at(self.fd.as_fd(), Path::new(name)).map_err(|source| HostError::Read {
            path: self.join(name),
            source,
        })
    }

    /// The final path component of a symlink's target (`driver` ->
    /// `mlx5_core`). `Ok(None)` when the link does not exist; an error when
    /// it dangles.
    pub(crate) fn link_name(&self, name: &str) -> Result<Option<String>, HostError> {
        let target = match link_at(self.fd.as_fd(), Path::new(name)) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(HostError::Read {
                    path: self.join(name),
                    source,
                });
            }
        };
        if !exists_at(self.fd.as_fd(), Path::new(name)) {
            return Err(HostError::DanglingLink {
                path: self.join(name),
                target,
            });
        }
        match target.file_name() {
            Some(n) if target.ends_with(n) && n != ".." => {
                Ok(Some(n.to_string_lossy().into_owned()))
            }
            _ => Ok(canonical(&self.join(name))?
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())),
        }
    }

    /// Sorted entry names of the subdirectory `name` (`"."` for this one);
    /// `Ok(vec![])` when it is absent.
    pub(crate) fn dir_names(&self, name: &str) -> Result<Vec<String>, HostError> {
        match dir_names_at(self.fd.as_fd(), Path::new(name)) {
            Ok(n) => Ok(n),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(source) => Err(HostError::Read {
                path: self.join(name),
                source,
            }),
        }
    }
}

fn optional(r: Result<String, HostError>) -> Result<Option<String>, HostError> {
    match r {
        Ok(s) => Ok(Some(s)),
        Err(HostError::NotFound { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

fn malformed(path: PathBuf, what: &'static str, value: String) -> HostError {
    HostError::Malformed { path, what, value }
}

fn strip_0x(s: &str) -> &str {
    s.strip_prefix("0x").unwrap_or(s)
}

/// A file's text, trimmed (by absolute path: for one-off reads).
pub(crate) fn read_string(path: &Path) -> Result<String, HostError> {
    read_small_at(AT_FDCWD, path)
        .map(|s| s.trim().to_string())
        .map_err(|e| not_found_or_read(path, e, "file"))
}

pub(crate) fn parse_num<T: std::str::FromStr>(
    path: &Path,
    what: &'static str,
) -> Result<T, HostError> {
    let s = read_string(path)?;
    s.parse::<T>()
        .map_err(|_| malformed(path.to_path_buf(), what, s))
}

/// Sorted names of the entries of a directory; `Ok(vec![])` when it is absent.
pub(crate) fn dir_names(path: &Path) -> Result<Vec<String>, HostError> {
    match dir_names_at(AT_FDCWD, path) {
        Ok(n) => Ok(n),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(source) => Err(HostError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Canonical path of a sysfs entry (following the class/bus symlinks into
/// `sys/devices`), with dangling links reported as such. Costly (a readlink
/// per component): for the odd link whose target does not end in a name.
pub(crate) fn canonical(path: &Path) -> Result<PathBuf, HostError> {
    count(path.components().count() as u64 + 4);
    std::fs::canonicalize(path).map_err(|source| {
        if source.kind() == std::io::ErrorKind::NotFound {
            match std::fs::read_link(path) {
                Ok(target) => HostError::DanglingLink {
                    path: path.to_path_buf(),
                    target,
                },
                Err(_) => HostError::NotFound {
                    path: path.to_path_buf(),
                    what: "sysfs entry",
                },
            }
        } else {
            HostError::Read {
                path: path.to_path_buf(),
                source,
            }
        }
    })
}

/// Whether `path` is a directory, following links.
pub(crate) fn is_dir(path: &Path) -> bool {
    count(1);
    path.is_dir()
}

pub(crate) fn write_string(path: &Path, value: &str) -> Result<(), HostError> {
    std::fs::write(path, value).map_err(|source| HostError::Write {
        path: path.to_path_buf(),
        value: value.to_string(),
        source,
    })
}
