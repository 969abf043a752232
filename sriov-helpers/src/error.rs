//! Errors of the host model. Every variant names the path it is about, so an
//! admin reading a log line can `cat` the file that was wrong.

use std::path::PathBuf;

/// A problem reading one file or link of the host model.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write {value:?} to {path}: {source}")]
    Write {
        path: PathBuf,
        value: String,
        #[source]
        source: std::io::Error,
    },
    #[error("malformed {what} in {path}: {value:?}")]
    Malformed {
        path: PathBuf,
        what: &'static str,
        value: String,
    },
    #[error("{path} is a dangling link (target {target})")]
    DanglingLink { path: PathBuf, target: PathBuf },
    #[error("{what} not found: {path}")]
    NotFound { path: PathBuf, what: &'static str },
}

impl HostError {
    /// The path the error is about.
    pub fn path(&self) -> &std::path::Path {
        match self {
            HostError::Read { path, .. }
            | HostError::Write { path, .. }
            | HostError::Malformed { path, .. }
            | HostError::DanglingLink { path, .. }
            | HostError::NotFound { path, .. } => path,
        }
    }

    /// True when the file or device simply is not there (as opposed to
    /// unreadable or malformed): callers use this to tell "gone" from "broken".
    pub fn is_not_found(&self) -> bool {
        match self {
            HostError::NotFound { .. } | HostError::DanglingLink { .. } => true,
            HostError::Read { source, .. } => source.kind() == std::io::ErrorKind::NotFound,
            _ => false,
        }
    }
}

/// Errors of the pure parsers (PCI addresses, CPU lists, VF ranges): no path,
/// but the value and what it should have been.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("invalid PCI address {value:?}: {reason}")]
    PciAddress { value: String, reason: &'static str },
    #[error("invalid CPU list {value:?}: {reason}")]
    CpuList { value: String, reason: String },
    #[error("invalid VF range {value:?}: {reason}")]
    VfRange { value: String, reason: String },
}
