//! Edge: the files the plugin writes (device-info, CDI specs), through
//! kroce's one atomic write ([`kroce_contracts::atomic_file`]: temp file,
//! fsync, rename, directory fsync) so a reader never sees half a file, with
//! mode 0644 ([`Modes::SHARED`]): readable by the CNI and the runtime,
//! writable only by us.

use kroce_contracts::atomic_file::{self, Modes};
use std::path::{Path, PathBuf};

pub use kroce_contracts::atomic_file::{AtomicFileError, remove};

pub fn ensure_dir(dir: &Path) -> Result<(), AtomicFileError> {
    atomic_file::ensure_dir(dir, Modes::SHARED.dir)
}

/// Writes `content` to `path` atomically with mode 0644, creating the
/// directory.
pub fn write_atomic(path: &Path, content: &[u8]) -> Result<(), AtomicFileError> {
    atomic_file::write(path, content, Modes::SHARED)
}

/// Writes every `(path, content)` atomically with mode 0644, all or
/// nothing, with one group fsync ([`atomic_file::write_all`]).
pub fn write_atomic_all(writes: &[(PathBuf, Vec<u8>)]) -> Result<(), AtomicFileError> {
    atomic_file::write_all(writes, Modes::SHARED)
}
