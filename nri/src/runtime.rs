//! What the container runtime at the other end of the NRI socket can grant.
//!
//! runc sets a container's rlimits with `prlimit` from the runtime's side
//! (before the container enters its user namespace), so the container
//! starts from the runtime's own `RLIMIT_MEMLOCK`. Raising the hard limit
//! above it needs `CAP_SYS_RESOURCE` in the *initial* user namespace
//! (`do_prlimit` → `capable(CAP_SYS_RESOURCE)`); without it runc fails the
//! container ("error setting rlimit type 8: operation not permitted"). So
//! kroce-nri reads, for the socket's peer (`SO_PEERCRED`), its effective
//! capabilities (`CapEff` in `/proc/<pid>/status`, bit 24), whether it is in
//! the initial user namespace (`/proc/<pid>/uid_map`) and its memlock limits
//! (`Max locked memory` in `/proc/<pid>/limits`), all under a proc root given
//! as a value (tests and the doctor use other roots).

use std::io;
use std::path::{Path, PathBuf};

use crate::memlock::Memlock;

/// `CAP_SYS_RESOURCE` (linux/capability.h).
pub const CAP_SYS_RESOURCE: u32 = 24;
/// The default proc root.
pub const DEFAULT_PROC_ROOT: &str = "/proc";

/// The runtime's side of the memlock question (kroce-nri's status file
/// carries it, so its shape is the contract's).
pub use kroce_contracts::nri_status::RuntimeLimits;

/// Why the runtime's limits are not known.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeLimitsError {
    #[error(
        "the NRI socket's peer pid is not visible in this PID namespace (SO_PEERCRED gave 0): run kroce-nri in the host PID namespace (hostPID: true)"
    )]
    PidNotVisible,
    #[error("SO_PEERCRED on the NRI socket: {0}")]
    PeerCred(io::Error),
    #[error("{path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error("{path}: {detail}")]
    Parse { path: PathBuf, detail: String },
}

/// The pid of the process at the other end of a unix socket (`SO_PEERCRED`).
pub fn peer_pid(stream: &tokio::net::UnixStream) -> Result<u32, RuntimeLimitsError> {
    let cred = stream.peer_cred().map_err(RuntimeLimitsError::PeerCred)?;
    match cred.pid() {
        Some(pid) if pid > 0 => u32::try_from(pid).map_err(|_| RuntimeLimitsError::PidNotVisible),
        _ => Err(RuntimeLimitsError::PidNotVisible),
    }
}

/// Reads the limits of `pid` under `proc_root` (normally `/proc`).
pub fn read(proc_root: &Path, pid: u32) -> Result<RuntimeLimits, RuntimeLimitsError> {
    let dir = proc_root.join(pid.to_string());
    let read = |name: &str| {
        let path = dir.join(name);
        std::fs::read_to_string(&path)
            .map(|text| (path.clone(), text))
            .map_err(|source| RuntimeLimitsError::Read { path, source })
    };
    let (status_path, status) = read("status")?;
    let cap_eff = parse_cap_eff(&status).ok_or_else(|| RuntimeLimitsError::Parse {
        path: status_path,
        detail: "no hexadecimal CapEff line".into(),
    })?;
    let (limits_path, limits) = read("limits")?;
    let (memlock_soft, memlock_hard) =
        parse_memlock_limits(&limits).ok_or_else(|| RuntimeLimitsError::Parse {
            path: limits_path,
            detail: "no readable \"Max locked memory\" line".into(),
        })?;
    // Kernels without user namespaces have no uid_map: everything is initial.
    let initial_user_namespace = match read("uid_map") {
        Ok((_, text)) => is_initial_uid_map(&text),
        Err(RuntimeLimitsError::Read { source, .. })
            if source.kind() == io::ErrorKind::NotFound =>
        {
            true
        }
        Err(err) => return Err(err),
    };
    Ok(RuntimeLimits {
        pid,
        cap_sys_resource: cap_eff & (1 << CAP_SYS_RESOURCE) != 0,
        initial_user_namespace,
        memlock_soft,
        memlock_hard,
    })
}

/// `CapEff:\t000001fffeffffff` → the mask.
pub fn parse_cap_eff(status: &str) -> Option<u64> {
    status.lines().find_map(|line| {
        let rest = line.strip_prefix("CapEff:")?;
        u64::from_str_radix(rest.trim(), 16).ok()
    })
}

/// `Max locked memory  8388608  8388608  bytes` → (soft, hard).
pub fn parse_memlock_limits(limits: &str) -> Option<(Memlock, Memlock)> {
    let line = limits
        .lines()
        .find_map(|l| l.strip_prefix("Max locked memory"))?;
    let mut fields = line.split_whitespace();
    let value = |v: &str| -> Option<Memlock> {
        if v == "unlimited" {
            Some(Memlock::Unlimited)
        } else {
            v.parse::<u64>().ok().map(Memlock::from_rlimit)
        }
    };
    let soft = value(fields.next()?)?;
    let hard = value(fields.next()?)?;
    Some((soft, hard))
}

/// The initial user namespace maps every ID to itself: `0 0 4294967295`.
pub fn is_initial_uid_map(uid_map: &str) -> bool {
    let lines: Vec<Vec<&str>> = uid_map
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|f| !f.is_empty())
        .collect();
    matches!(lines.as_slice(), [only] if only.as_slice() == ["0", "0", "4294967295"])
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn parses_cap_eff_and_bit_24() {
        // This machine's root: everything but CAP_SYS_RESOURCE.
        let status = "Name:\tcontainerd\nCapInh:\t0000000000000000\nCapPrm:\t000001fffeffffff\nCapEff:\t000001fffeffffff\n";
        let eff = parse_cap_eff(status).unwrap();
        assert_eq!(eff & (1 << CAP_SYS_RESOURCE), 0);
        let full = "CapEff:\t000001ffffffffff\n";
        assert_ne!(parse_cap_eff(full).unwrap() & (1 << CAP_SYS_RESOURCE), 0);
        assert_eq!(parse_cap_eff("CapEff:\tzz\n"), None);
        assert_eq!(parse_cap_eff("Name:\tx\n"), None);
    }

    #[test]
    fn parses_memlock_limits() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max open files            1024                 524288               files     \n\
                      Max locked memory         8388608              8388608              bytes     \n";
        assert_eq!(
            parse_memlock_limits(limits),
            Some((Memlock::Bytes(8 * MIB), Memlock::Bytes(8 * MIB)))
        );
        let unlimited =
            "Max locked memory         65536                unlimited            bytes     \n";
        assert_eq!(
            parse_memlock_limits(unlimited),
            Some((Memlock::Bytes(65536), Memlock::Unlimited))
        );
        assert_eq!(parse_memlock_limits("Max open files 1 1 files\n"), None);
        assert_eq!(parse_memlock_limits("Max locked memory lots\n"), None);
    }

    #[test]
    fn initial_uid_map_is_the_full_identity() {
        assert!(is_initial_uid_map("         0          0 4294967295\n"));
        assert!(!is_initial_uid_map("         0     100000      65536\n"));
        assert!(!is_initial_uid_map("0 0 4294967295\n1 1 1\n"));
        assert!(!is_initial_uid_map(""));
    }

    fn fake_proc(
        pid: u32,
        cap_eff: &str,
        memlock: &str,
        uid_map: Option<&str>,
    ) -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join(pid.to_string());
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("status"),
            format!("Name:\tcrio\nCapEff:\t{cap_eff}\n"),
        )
        .unwrap();
        std::fs::write(
            dir.join("limits"),
            format!("Limit Soft Limit Hard Limit Units\nMax locked memory {memlock} bytes\n"),
        )
        .unwrap();
        if let Some(map) = uid_map {
            std::fs::write(dir.join("uid_map"), map).unwrap();
        }
        root
    }

    #[test]
    fn reads_a_proc_root() {
        let root = fake_proc(
            42,
            "000001ffffffffff",
            "unlimited unlimited",
            Some("0 0 4294967295\n"),
        );
        let got = read(root.path(), 42).unwrap();
        assert_eq!(
            got,
            RuntimeLimits {
                pid: 42,
                cap_sys_resource: true,
                initial_user_namespace: true,
                memlock_soft: Memlock::Unlimited,
                memlock_hard: Memlock::Unlimited,
            }
        );
        assert!(got.can_raise());

        // Rootless: the capability is there, but in a user namespace.
        let root = fake_proc(
            7,
            "000001ffffffffff",
            "65536 65536",
            Some("0 1000 1\n1 100000 65536\n"),
        );
        let got = read(root.path(), 7).unwrap();
        assert!(got.cap_sys_resource && !got.initial_user_namespace && !got.can_raise());
        assert_eq!(got.memlock_hard, Memlock::Bytes(65536));

        // No uid_map (no user namespaces in the kernel): initial.
        let root = fake_proc(9, "000001fffeffffff", "8388608 8388608", None);
        let got = read(root.path(), 9).unwrap();
        assert!(got.initial_user_namespace && !got.cap_sys_resource && !got.can_raise());
    }

    #[test]
    fn errors_name_the_file() {
        let root = tempfile::tempdir().unwrap();
        let err = read(root.path(), 5).unwrap_err();
        assert!(err.to_string().contains("5/status"), "{err}");
        let root = fake_proc(6, "nothex", "1 1", None);
        let err = read(root.path(), 6).unwrap_err();
        assert!(
            err.to_string().contains("6/status") && err.to_string().contains("CapEff"),
            "{err}"
        );
        let root = fake_proc(8, "0", "lots lots", None);
        let err = read(root.path(), 8).unwrap_err();
        assert!(err.to_string().contains("8/limits"), "{err}");
    }
}
