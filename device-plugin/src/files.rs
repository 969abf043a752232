//! Edge: the files the plugin writes (device-info, CDI specs). Written
//! atomically (temp file + rename) so a reader never sees half a file, with
//! mode 0644: readable by the CNI and the runtime, writable only by us.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

pub const FILE_MODE: u32 = 0o644;
pub const DIR_MODE: u32 = 0o755;

#[derive(Debug, thiserror::Error)]
#[error("cannot {action} {path}: {source}")]
pub struct FileError {
    pub action: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

fn err(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> FileError {
    let path = path.to_path_buf();
    move |source| FileError {
        action,
        path,
        source,
    }
}

pub fn ensure_dir(dir: &Path) -> Result<(), FileError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(dir)
        .map_err(err("create directory", dir))
}

/// Writes `content` to `path` atomically with mode 0644, creating the directory.
pub fn write_atomic(path: &Path, content: &[u8]) -> Result<(), FileError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    ensure_dir(dir)?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(FILE_MODE)
            .open(&tmp)
            .map_err(err("create", &tmp))?;
        // Exact mode whatever the umask.
        f.set_permissions(std::fs::Permissions::from_mode(FILE_MODE))
            .map_err(err("set mode of", &tmp))?;
        f.write_all(content).map_err(err("write", &tmp))?;
        f.sync_all().map_err(err("sync", &tmp))?;
        std::fs::rename(&tmp, path).map_err(err("rename into place", path))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Removes a file; a file already gone is not an error.
pub fn remove(path: &Path) -> Result<(), FileError> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(err("remove", path)(e)),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_mode_and_idempotent_remove() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("sub/dir/x.json");
        write_atomic(&p, b"{}").unwrap();
        write_atomic(&p, b"{\"a\":1}").unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "{\"a\":1}");
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644);
        assert_eq!(std::fs::read_dir(p.parent().unwrap()).unwrap().count(), 1);
        remove(&p).unwrap();
        remove(&p).unwrap();
        assert!(!p.exists());
    }
}
