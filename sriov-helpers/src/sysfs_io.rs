//! Small readers over sysfs-style files: trimmed text, parsed numbers, link
//! targets. Every error names the path.

use crate::error::HostError;
use std::path::{Path, PathBuf};

pub(crate) fn read_string(path: &Path) -> Result<String, HostError> {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .map_err(|source| {
            if source.kind() == std::io::ErrorKind::NotFound {
                HostError::NotFound {
                    path: path.to_path_buf(),
                    what: "file",
                }
            } else {
                HostError::Read {
                    path: path.to_path_buf(),
                    source,
                }
            }
        })
}

/// Reads a file that may legitimately be absent (e.g. `sriov_totalvfs` on a VF).
pub(crate) fn read_optional(path: &Path) -> Result<Option<String>, HostError> {
    match read_string(path) {
        Ok(s) => Ok(Some(s)),
        Err(HostError::NotFound { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

pub(crate) fn parse_hex_u16(path: &Path, what: &'static str) -> Result<u16, HostError> {
    let s = read_string(path)?;
    let digits = s.strip_prefix("0x").unwrap_or(&s);
    u16::from_str_radix(digits, 16).map_err(|_| HostError::Malformed {
        path: path.to_path_buf(),
        what,
        value: s,
    })
}

pub(crate) fn parse_hex_u32(path: &Path, what: &'static str) -> Result<u32, HostError> {
    let s = read_string(path)?;
    let digits = s.strip_prefix("0x").unwrap_or(&s);
    u32::from_str_radix(digits, 16).map_err(|_| HostError::Malformed {
        path: path.to_path_buf(),
        what,
        value: s,
    })
}

pub(crate) fn parse_num<T: std::str::FromStr>(
    path: &Path,
    what: &'static str,
) -> Result<T, HostError> {
    let s = read_string(path)?;
    s.parse::<T>().map_err(|_| HostError::Malformed {
        path: path.to_path_buf(),
        what,
        value: s,
    })
}

pub(crate) fn parse_optional_num<T: std::str::FromStr>(
    path: &Path,
    what: &'static str,
) -> Result<Option<T>, HostError> {
    match read_optional(path)? {
        None => Ok(None),
        Some(s) => s.parse::<T>().map(Some).map_err(|_| HostError::Malformed {
            path: path.to_path_buf(),
            what,
            value: s,
        }),
    }
}

/// The final path component of a symlink's target (`driver` -> `mlx5_core`).
/// `Ok(None)` when the link does not exist; an error when it dangles.
pub(crate) fn link_name(path: &Path) -> Result<Option<String>, HostError> {
    let target = match std::fs::read_link(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(HostError::Read {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    if !path.exists() {
        return Err(HostError::DanglingLink {
            path: path.to_path_buf(),
            target,
        });
    }
    match target.file_name() {
        Some(n) if target.ends_with(n) && n != ".." => Ok(Some(n.to_string_lossy().into_owned())),
        _ => Ok(canonical(path)?
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())),
    }
}

/// Sorted names of the entries of a directory; `Ok(vec![])` when it is absent.
pub(crate) fn dir_names(path: &Path) -> Result<Vec<String>, HostError> {
    let rd = match std::fs::read_dir(path) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(HostError::Read {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    let mut names = Vec::new();
    for entry in rd {
        let entry = entry.map_err(|source| HostError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        names.push(entry.file_name().to_string_lossy().into_owned());
    }
    names.sort();
    Ok(names)
}

/// Canonical path of a sysfs entry (following the class/bus symlinks into
/// `sys/devices`), with dangling links reported as such.
pub(crate) fn canonical(path: &Path) -> Result<PathBuf, HostError> {
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

pub(crate) fn write_string(path: &Path, value: &str) -> Result<(), HostError> {
    std::fs::write(path, value).map_err(|source| HostError::Write {
        path: path.to_path_buf(),
        value: value.to_string(),
        source,
    })
}
