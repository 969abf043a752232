//! The one atomic file write every kroce component uses for a file another
//! process reads (device-info and CDI specs, kroce-cni's claims and memlock
//! requests, kroce-nri's status, the DRA checkpoint): a reader sees the old
//! file or the new one, whole, never half of one and never none; after a
//! crash the file is the old one or the new one, never empty.
//!
//! How: the content goes to a temp file in the target's directory (a unique
//! name, `.<name>.tmp-<pid>-<n>`, created exclusively, so two writers never
//! share one), which is fsynced, renamed over the target, and then the
//! directory is fsynced (the rename itself is only durable once the
//! directory is). A write that fails leaves no temp file behind.
//!
//! [`TempFile`] is the first half alone, for kroce-cni's claims, which it
//! swaps into place without an fsync (see `kroce_cni::state::write_atomic`).
//!
//! [`write_all`] writes several files together, all or nothing, with their
//! fsyncs running at once and one fsync per directory at the end (the
//! "group fsync": N files cost about one fsync, not N in a row).

use std::collections::BTreeSet;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// The mode of written files and of the directories created for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Modes {
    pub file: u32,
    pub dir: u32,
}

impl Modes {
    /// Files other components read (device-info, CDI specs): 0644 in
    /// 0755 directories, readable by the CNI and the runtime, writable only
    /// by us.
    pub const SHARED: Modes = Modes {
        file: 0o644,
        dir: 0o755,
    };
    /// Root's own state (kroce-cni's state dir): 0600 in 0700 directories.
    pub const PRIVATE: Modes = Modes {
        file: 0o600,
        dir: 0o700,
    };
}

/// A file operation that failed, with the path it was about.
#[derive(Debug, thiserror::Error)]
#[error("cannot {action} {path}: {source}")]
pub struct AtomicFileError {
    pub action: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

fn err(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> AtomicFileError {
    let path = path.to_path_buf();
    move |source| AtomicFileError {
        action,
        path,
        source,
    }
}

/// Creates `dir` and its missing parents, each new one with mode `mode`.
pub fn ensure_dir(dir: &Path, mode: u32) -> Result<(), AtomicFileError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(dir)
        .map_err(err("create directory", dir))
}

/// Removes a file; a file already gone is not an error.
pub fn remove(path: &Path) -> Result<(), AtomicFileError> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(err("remove", path)(e)),
        _ => Ok(()),
    }
}

/// Writes `content` to `path` atomically and durably (see the module doc),
/// creating the directory.
pub fn write(path: &Path, content: &[u8], modes: Modes) -> Result<(), AtomicFileError> {
    write_all(&[(path, content)], modes)
}

/// Writes every `(path, content)` atomically, all or nothing: the temp
/// files are written first, fsynced at once (one thread each: the
/// filesystem's journal commits them together), then renamed into place,
/// then each directory is fsynced once. On a failure nothing new is left:
/// temp files and files already renamed are removed.
pub fn write_all<P: AsRef<Path>, C: AsRef<[u8]>>(
    writes: &[(P, C)],
    modes: Modes,
) -> Result<(), AtomicFileError> {
    write_all_with(&RealSync, writes, modes)
}

/// The two fsyncs, apart so a test can see them and make them fail.
trait Fsync: std::marker::Sync {
    fn file(&self, f: &File) -> std::io::Result<()>;
    fn dir(&self, dir: &Path) -> std::io::Result<()>;
}

#[derive(Debug)]
struct RealSync;

impl Fsync for RealSync {
    fn file(&self, f: &File) -> std::io::Result<()> {
        f.sync_all()
    }
    fn dir(&self, dir: &Path) -> std::io::Result<()> {
        File::open(dir)?.sync_all()
    }
}

/// Tells temp files of one process apart (several threads may write the
/// same target).
static NEXT_TEMP: AtomicU64 = AtomicU64::new(0);

/// Creates a new temp file next to `path` with mode `mode`.
fn create_temp(path: &Path, dir: &Path, mode: u32) -> Result<(File, PathBuf), AtomicFileError> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let pid = std::process::id();
    loop {
        let n = NEXT_TEMP.fetch_add(1, Ordering::Relaxed);
        let tmp = dir.join(format!(".{name}.tmp-{pid}-{n}"));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)
        {
            Ok(f) => return Ok((f, tmp)),
            // A leftover of a process that had our pid: another name.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(err("create", &tmp)(e)),
        }
    }
}

/// A temp file next to a target, created as [`write`] creates its own
/// (unique name, exclusive, the file mode), for a writer that puts it in
/// place another way ([`TempFile::place_with`]). Removed on drop unless
/// placed.
#[derive(Debug)]
pub struct TempFile {
    file: File,
    path: PathBuf,
    target: PathBuf,
    placed: bool,
}

impl TempFile {
    /// Creates the temp file for `target` (and the directory, `modes.dir`).
    pub fn create(target: &Path, modes: Modes) -> Result<TempFile, AtomicFileError> {
        let dir = target.parent().unwrap_or(Path::new("."));
        ensure_dir(dir, modes.dir)?;
        let (file, path) = create_temp(target, dir, modes.file)?;
        let tmp = TempFile {
            file,
            path,
            target: target.to_path_buf(),
            placed: false,
        };
        tmp.file
            .set_permissions(std::fs::Permissions::from_mode(modes.file))
            .map_err(err("set mode of", &tmp.path))?;
        Ok(tmp)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn write_all(&mut self, content: &[u8]) -> Result<(), AtomicFileError> {
        self.file
            .write_all(content)
            .map_err(err("write", &self.path))
    }

    /// Puts the file at its target with `place(temp, target)`; the temp
    /// file is removed when that fails (and left to `place` when it works).
    pub fn place_with(
        mut self,
        place: impl FnOnce(&Path, &Path) -> std::io::Result<()>,
    ) -> Result<(), AtomicFileError> {
        place(&self.path, &self.target).map_err(err("rename into place", &self.target))?;
        self.placed = true;
        Ok(())
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.placed {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn write_all_with<P: AsRef<Path>, C: AsRef<[u8]>>(
    sync: &dyn Fsync,
    writes: &[(P, C)],
    modes: Modes,
) -> Result<(), AtomicFileError> {
    let mut temps: Vec<(File, PathBuf)> = Vec::with_capacity(writes.len());
    let cleanup = |temps: &[(File, PathBuf)]| {
        for (_, t) in temps {
            let _ = std::fs::remove_file(t);
        }
    };
    for (path, content) in writes {
        let path = path.as_ref();
        let r = (|| {
            let dir = path.parent().unwrap_or(Path::new("."));
            ensure_dir(dir, modes.dir)?;
            let (mut f, tmp) = create_temp(path, dir, modes.file)?;
            temps.push((f.try_clone().map_err(err("open", &tmp))?, tmp.clone()));
            // The mode asked for, whatever the umask took away.
            f.set_permissions(std::fs::Permissions::from_mode(modes.file))
                .map_err(err("set mode of", &tmp))?;
            f.write_all(content.as_ref()).map_err(err("write", &tmp))
        })();
        if let Err(e) = r {
            cleanup(&temps);
            return Err(e);
        }
    }
    let synced: Vec<Result<(), AtomicFileError>> = if let [(f, t)] = temps.as_slice() {
        vec![sync.file(f).map_err(err("sync", t))]
    } else {
        std::thread::scope(|sc| {
            let handles: Vec<_> = temps
                .iter()
                .map(|(f, t)| sc.spawn(move || sync.file(f).map_err(err("sync", t))))
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(AtomicFileError {
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
    // Undoes the renames done so far and removes the temps not renamed.
    let undo = |renamed: usize| {
        for (p, _) in &writes[..renamed] {
            let _ = std::fs::remove_file(p.as_ref());
        }
        cleanup(&temps[renamed..]);
    };
    for (i, ((_, tmp), (path, _))) in temps.iter().zip(writes).enumerate() {
        let path = path.as_ref();
        if let Err(e) = std::fs::rename(tmp, path).map_err(err("rename into place", path)) {
            undo(i);
            return Err(e);
        }
    }
    let dirs: BTreeSet<&Path> = writes
        .iter()
        .map(|(p, _)| p.as_ref().parent().unwrap_or(Path::new(".")))
        .collect();
    for dir in dirs {
        if let Err(e) = sync.dir(dir).map_err(err("sync directory", dir)) {
            undo(writes.len());
            return Err(e);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::sync::Mutex;

    fn write_atomic(path: &Path, content: &[u8]) -> Result<(), AtomicFileError> {
        write(path, content, Modes::SHARED)
    }

    fn write_atomic_all(writes: &[(PathBuf, Vec<u8>)]) -> Result<(), AtomicFileError> {
        write_all(writes, Modes::SHARED)
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

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
    fn private_modes_for_file_and_new_dirs() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("state/vf/x.json");
        write(&p, b"{}", Modes::PRIVATE).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&p), 0o600);
        assert_eq!(mode(&d.path().join("state")), 0o700);
        assert_eq!(mode(&d.path().join("state/vf")), 0o700);
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

    /// Records the fsyncs and fails the one it is told to.
    #[derive(Debug, Default)]
    struct Recording {
        files: Mutex<usize>,
        dirs: Mutex<Vec<PathBuf>>,
        fail_file: bool,
        fail_dir: bool,
    }

    impl Fsync for Recording {
        fn file(&self, f: &File) -> std::io::Result<()> {
            *self.files.lock().unwrap() += 1;
            if self.fail_file {
                return Err(std::io::Error::other("injected file fsync failure"));
            }
            f.sync_all()
        }
        fn dir(&self, dir: &Path) -> std::io::Result<()> {
            self.dirs.lock().unwrap().push(dir.to_path_buf());
            if self.fail_dir {
                return Err(std::io::Error::other("injected directory fsync failure"));
            }
            RealSync.dir(dir)
        }
    }

    /// Every file is fsynced, then each directory once, after the renames
    /// (the rename is durable only then).
    #[test]
    fn files_then_each_directory_once_are_fsynced() {
        let d = tempfile::tempdir().unwrap();
        let rec = Recording::default();
        let writes = [
            (d.path().join("cdi/a.json"), b"a".to_vec()),
            (d.path().join("cdi/b.json"), b"b".to_vec()),
            (d.path().join("devinfo/c.json"), b"c".to_vec()),
        ];
        write_all_with(&rec, &writes, Modes::SHARED).unwrap();
        assert_eq!(*rec.files.lock().unwrap(), 3);
        assert_eq!(
            *rec.dirs.lock().unwrap(),
            [d.path().join("cdi"), d.path().join("devinfo")]
        );
        let one = Recording::default();
        write_all_with(&one, &[(d.path().join("x"), b"x")], Modes::SHARED).unwrap();
        assert_eq!(*one.dirs.lock().unwrap(), [d.path().to_path_buf()]);
    }

    /// A write that fails at any step leaves no temp file, and the target
    /// keeps its old content when the failure came before the rename.
    #[test]
    fn a_failed_write_leaves_no_temp_file() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("status.json");
        write_atomic(&p, b"old").unwrap();
        let fail_file = Recording {
            fail_file: true,
            ..Recording::default()
        };
        let e = write_all_with(&fail_file, &[(&p, b"new")], Modes::SHARED).unwrap_err();
        assert!(e.to_string().contains("injected file fsync"), "{e}");
        assert_eq!(std::fs::read(&p).unwrap(), b"old");
        assert_eq!(names(d.path()), ["status.json"]);
        let fail_dir = Recording {
            fail_dir: true,
            ..Recording::default()
        };
        let e = write_all_with(&fail_dir, &[(&p, b"new")], Modes::SHARED).unwrap_err();
        assert!(e.to_string().contains("sync directory"), "{e}");
        assert!(
            e.to_string().contains(&d.path().display().to_string()),
            "{e}"
        );
        assert!(names(d.path()).iter().all(|n| !n.contains(".tmp-")));
        // A write error (the target is a directory): no temp either.
        let busy = d.path().join("busy");
        std::fs::create_dir_all(busy.join("inner")).unwrap();
        assert!(write_atomic(&busy, b"x").is_err());
        assert!(names(d.path()).iter().all(|n| !n.contains(".tmp-")));
    }

    /// A reader during rewrites sees the old or the new file, whole, never
    /// none.
    #[test]
    fn a_reader_never_sees_a_half_written_or_missing_file() {
        use std::sync::atomic::AtomicBool;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("claim.json");
        let (a, b) = (vec![b'a'; 64 * 1024], vec![b'b'; 10]);
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
            for i in 0..200 {
                write_atomic(&p, if i % 2 == 0 { &b } else { &a }).unwrap();
            }
            done.store(true, Ordering::Relaxed);
            reader.join().unwrap()
        });
        assert!(bad.is_empty(), "{:?}", &bad[..bad.len().min(5)]);
        assert_eq!(names(dir.path()), ["claim.json"]);
    }

    /// Temp files left by a dead writer with our pid (the names this
    /// process would use next) are neither reused nor touched.
    #[test]
    fn a_leftover_temp_name_is_skipped_not_reused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("status.json");
        let next = NEXT_TEMP.load(Ordering::Relaxed);
        let pid = std::process::id();
        let stale: Vec<PathBuf> = (next..next + 64)
            .map(|n| dir.path().join(format!(".status.json.tmp-{pid}-{n}")))
            .collect();
        for s in &stale {
            std::fs::write(s, b"someone else's").unwrap();
        }
        write_atomic(&p, b"ours").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"ours");
        for s in &stale {
            assert_eq!(std::fs::read(s).unwrap(), b"someone else's");
        }
        assert_eq!(names(dir.path()).len(), 65);
    }

    /// A temp file not placed (an error on the way) is removed; one placed
    /// is its placer's.
    #[test]
    fn a_temp_file_not_placed_is_removed() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("vf/claim.json");
        let mut t = TempFile::create(&p, Modes::PRIVATE).unwrap();
        t.write_all(b"half").unwrap();
        assert!(t.path().exists());
        drop(t);
        assert!(names(&d.path().join("vf")).is_empty());
        let t = TempFile::create(&p, Modes::PRIVATE).unwrap();
        let e = t
            .place_with(|_, _| Err(std::io::Error::other("no")))
            .unwrap_err();
        assert!(e.to_string().contains("claim.json"), "{e}");
        assert!(names(&d.path().join("vf")).is_empty());
        let mut t = TempFile::create(&p, Modes::PRIVATE).unwrap();
        t.write_all(b"whole").unwrap();
        t.place_with(|tmp, target| std::fs::rename(tmp, target))
            .unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"whole");
        assert_eq!(names(&d.path().join("vf")), ["claim.json"]);
    }
}
