//! The agent's small file edges: IRQ affinity, ECN switches, RDMA-CM
//! configfs, irqbalance detection. Each error names its path.

use std::io;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
#[error("{path}: {source}")]
pub struct HostFileError {
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

fn ctx(path: &Path) -> impl FnOnce(io::Error) -> HostFileError + '_ {
    move |source| HostFileError {
        path: path.to_path_buf(),
        source,
    }
}

pub fn read_trimmed(path: &Path) -> Result<String, HostFileError> {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .map_err(ctx(path))
}

/// Writes `value` unless the file already reads back as `value`; returns
/// whether it wrote. The file must exist (sysfs/configfs never create
/// attributes on write; a missing one means the driver does not offer it).
pub fn ensure_value(path: &Path, value: &str) -> Result<bool, HostFileError> {
    let current = read_trimmed(path)?;
    if current == value {
        return Ok(false);
    }
    std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)
        .and_then(|mut f| io::Write::write_all(&mut f, value.as_bytes()))
        .map_err(ctx(path))?;
    Ok(true)
}

/// True when a process named `irqbalance` runs (scan of `<proc>/*/comm`).
pub fn irqbalance_running(proc_root: &Path) -> bool {
    let Ok(rd) = std::fs::read_dir(proc_root) else {
        return false;
    };
    rd.flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .any(|e| {
            std::fs::read_to_string(e.path().join("comm"))
                .map(|c| c.trim() == "irqbalance")
                .unwrap_or(false)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ensure_value_writes_only_on_difference_and_needs_the_file() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("enable");
        std::fs::write(&p, "0\n").unwrap();
        assert!(ensure_value(&p, "1").unwrap());
        assert!(!ensure_value(&p, "1").unwrap());
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "1");
        let e = ensure_value(&d.path().join("absent"), "1").unwrap_err();
        assert!(e.to_string().contains("absent"));
    }

    #[test]
    fn irqbalance_found_by_comm() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("1")).unwrap();
        std::fs::write(d.path().join("1/comm"), "systemd\n").unwrap();
        std::fs::create_dir_all(d.path().join("self")).unwrap();
        assert!(!irqbalance_running(d.path()));
        std::fs::create_dir_all(d.path().join("812")).unwrap();
        std::fs::write(d.path().join("812/comm"), "irqbalance\n").unwrap();
        assert!(irqbalance_running(d.path()));
    }
}
