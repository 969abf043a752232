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

/// Writes `content` to `path` atomically with mode 0644 (temp file,
/// fsync, rename), creating the directory.
pub fn write_atomic(path: &Path, content: &[u8]) -> Result<(), FileError> {
    write_atomic_all(&[(path.to_path_buf(), content.to_vec())])
}

/// Writes every `(path, content)` atomically with mode 0644, all or nothing:
/// the temp files are written first, fsynced at once (one thread each: the
/// filesystem's journal commits them together, so N files cost about one
/// fsync instead of N in a row), then renamed into place. On a failure
/// nothing new is left: temp files and files already renamed are removed.
pub fn write_atomic_all(writes: &[(PathBuf, Vec<u8>)]) -> Result<(), FileError> {
    let mut temps: Vec<(std::fs::File, PathBuf)> = Vec::with_capacity(writes.len());
    let cleanup = |temps: &[(std::fs::File, PathBuf)]| {
        for (_, t) in temps {
            let _ = std::fs::remove_file(t);
        }
    };
    for (i, (path, content)) in writes.iter().enumerate() {
        let r = (|| {
            let dir = path.parent().unwrap_or(Path::new("."));
            ensure_dir(dir)?;
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let tmp = dir.join(format!(".{name}.tmp-{}-{i}", std::process::id()));
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(FILE_MODE)
                .open(&tmp)
                .map_err(err("create", &tmp))?;
            temps.push((f.try_clone().map_err(err("open", &tmp))?, tmp.clone()));
            f.set_permissions(std::fs::Permissions::from_mode(FILE_MODE))
                .map_err(err("set mode of", &tmp))?;
            f.write_all(content).map_err(err("write", &tmp))
        })();
        if let Err(e) = r {
            cleanup(&temps);
            return Err(e);
        }
    }
    let synced: Vec<Result<(), FileError>> = if let [(f, t)] = temps.as_slice() {
        vec![f.sync_all().map_err(err("sync", t))]
    } else {
        std::thread::scope(|sc| {
            let handles: Vec<_> = temps
                .iter()
                .map(|(f, t)| sc.spawn(move || f.sync_all().map_err(err("sync", t))))
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(FileError {
                            action: "sync",
                            path: PathBuf::new(),
                            source: std::io::Error::other("fsync thread panicked"),
                        })
                    })
                })
                .collect()
        })
    };
    if let Some(e) = synced.into_iter().find_map(Result::err) {
        cleanup(&temps);
        return Err(e);
    }
    for (i, ((_, tmp), (path, _))) in temps.iter().zip(writes).enumerate() {
        if let Err(e) = std::fs::rename(tmp, path).map_err(err("rename into place", path)) {
            for (p, _) in &writes[..i] {
                let _ = std::fs::remove_file(p);
            }
            cleanup(&temps[i..]);
            return Err(e);
        }
    }
    Ok(())
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

    #[test]
    fn write_all_is_all_or_nothing() {
        let d = tempfile::tempdir().unwrap();
        let ok = vec![
            (d.path().join("cdi/a.json"), b"a".to_vec()),
            (d.path().join("devinfo/b.json"), b"bb".to_vec()),
            (d.path().join("cdi/c.json"), b"ccc".to_vec()),
        ];
        write_atomic_all(&ok).unwrap();
        for (p, c) in &ok {
            assert_eq!(&std::fs::read(p).unwrap(), c);
            let mode = std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o644);
        }
        assert_eq!(std::fs::read_dir(d.path().join("cdi")).unwrap().count(), 2);
        // The last one cannot be made (its parent is a file): none is left,
        // not even the ones before it, and the error names the path.
        std::fs::write(d.path().join("blocker"), b"").unwrap();
        let bad = vec![
            (d.path().join("new/x.json"), b"x".to_vec()),
            (d.path().join("blocker/y.json"), b"y".to_vec()),
        ];
        let e = write_atomic_all(&bad).unwrap_err().to_string();
        assert!(e.contains("blocker"), "{e}");
        assert_eq!(std::fs::read_dir(d.path().join("new")).unwrap().count(), 0);
        // A rename that fails (target is a non-empty directory) after others
        // went into place: those are removed again.
        std::fs::create_dir_all(d.path().join("busy/z.json/inner")).unwrap();
        let late = vec![
            (d.path().join("late/1.json"), b"1".to_vec()),
            (d.path().join("busy/z.json"), b"z".to_vec()),
        ];
        let e = write_atomic_all(&late).unwrap_err().to_string();
        assert!(e.contains("z.json"), "{e}");
        assert_eq!(std::fs::read_dir(d.path().join("late")).unwrap().count(), 0);
        assert_eq!(std::fs::read_dir(d.path().join("busy")).unwrap().count(), 1);
    }
}
