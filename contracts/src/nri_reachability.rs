//! "Can kroce reach NRI?" — for the node agent's condition and `doctor`,
//! and kroce-nri's start-up: one check, so both say the same thing.
//!
//! [`nri_reachable`] connects: a runtime with NRI enabled listens on the
//! socket. The runtime logs an unregistered connection that closes as an
//! error, so do not poll it in a tight loop; [`socket_problem`] only looks at
//! the file (kroce-nri's start-up uses it).

use std::io;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

/// What the admin can do when NRI is not reachable.
pub const ADMIN_HINT: &str = "RDMA containers need a large RLIMIT_MEMLOCK. Either enable NRI in the \
container runtime so kroce can set it per container — containerd >= 1.7.7: under \
[plugins.\"io.containerd.nri.v1.nri\"] set disable = false (the default from containerd 2.0), \
CRI-O >= 1.29: under [crio.nri] set enable_nri = true; then restart the runtime — or raise it for \
every container: set LimitMEMLOCK=infinity for the runtime service (systemctl edit containerd or \
crio, [Service] LimitMEMLOCK=infinity, then systemctl restart it).";

/// Why NRI is or is not reachable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reachability {
    Reachable,
    /// No socket: NRI disabled, runtime too old, or runtime down.
    Missing,
    /// A socket file nobody listens on (runtime stopped, stale socket).
    Refused,
    PermissionDenied,
    NotASocket,
    Other(String),
}

/// The result of [`nri_reachable`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NriStatus {
    pub socket: PathBuf,
    pub reachability: Reachability,
}

impl NriStatus {
    pub fn is_reachable(&self) -> bool {
        self.reachability == Reachability::Reachable
    }

    /// One line for a condition message or a doctor table.
    pub fn message(&self) -> String {
        let socket = self.socket.display();
        match &self.reachability {
            Reachability::Reachable => format!("NRI is reachable at {socket}"),
            Reachability::Missing => format!(
                "NRI socket {socket} does not exist: NRI is disabled, the runtime is too old, or it is not running"
            ),
            Reachability::Refused => {
                format!(
                    "nothing listens on NRI socket {socket}: the runtime is not running or NRI is disabled"
                )
            }
            Reachability::PermissionDenied => {
                format!("no permission to connect to NRI socket {socket}")
            }
            Reachability::NotASocket => format!("{socket} is not a unix socket"),
            Reachability::Other(err) => format!("cannot connect to NRI socket {socket}: {err}"),
        }
    }

    /// The admin hint, when there is something to do.
    pub fn hint(&self) -> Option<&'static str> {
        (!self.is_reachable()).then_some(ADMIN_HINT)
    }
}

/// Checks whether an NRI runtime listens on `socket`.
pub fn nri_reachable(socket: &Path) -> NriStatus {
    let reachability = match UnixStream::connect(socket) {
        Ok(_) => Reachability::Reachable,
        Err(err) => classify(socket, &err),
    };
    NriStatus {
        socket: socket.to_owned(),
        reachability,
    }
}

/// What is wrong with `socket` judging by the file alone, without connecting
/// (a connection that never registers is logged as an error by containerd):
/// `None` when a unix socket is there. Cannot tell a live socket from a
/// stale one; the plugin's connection attempts will.
pub fn socket_problem(socket: &Path) -> Option<NriStatus> {
    use std::os::unix::fs::FileTypeExt;
    let reachability = match std::fs::metadata(socket) {
        Ok(meta) if meta.file_type().is_socket() => return None,
        Ok(_) => Reachability::NotASocket,
        Err(err) => match err.kind() {
            io::ErrorKind::NotFound => Reachability::Missing,
            io::ErrorKind::PermissionDenied => Reachability::PermissionDenied,
            _ => Reachability::Other(err.to_string()),
        },
    };
    Some(NriStatus {
        socket: socket.to_owned(),
        reachability,
    })
}

/// For checks that repeat (the node agent's, every pass): a unix socket at
/// `socket` counts as reachable, judged without connecting, because
/// containerd logs each connection that closes unregistered as an error.
/// A stale socket of a stopped runtime passes here; kroce-nri's own
/// connection attempts (and its status file) tell that case.
pub fn nri_socket_status(socket: &Path) -> NriStatus {
    socket_problem(socket).unwrap_or_else(|| NriStatus {
        socket: socket.to_owned(),
        reachability: Reachability::Reachable,
    })
}

fn classify(socket: &Path, err: &io::Error) -> Reachability {
    use std::os::unix::fs::FileTypeExt;
    // connect(2) says ECONNREFUSED for a regular file; tell the admin what it is.
    if let Ok(meta) = std::fs::metadata(socket)
        && !meta.file_type().is_socket()
    {
        return Reachability::NotASocket;
    }
    match err.kind() {
        io::ErrorKind::NotFound => Reachability::Missing,
        io::ErrorKind::ConnectionRefused => Reachability::Refused,
        io::ErrorKind::PermissionDenied => Reachability::PermissionDenied,
        _ => Reachability::Other(err.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_socket_gives_the_hint() {
        let dir = tempfile::tempdir().unwrap();
        let status = nri_reachable(&dir.path().join("nri.sock"));
        assert_eq!(status.reachability, Reachability::Missing);
        assert!(!status.is_reachable());
        let hint = status.hint().unwrap();
        assert!(hint.contains("containerd >= 1.7.7"));
        assert!(hint.contains("CRI-O >= 1.29"));
        assert!(hint.contains("LimitMEMLOCK=infinity"));
        assert!(status.message().contains("nri.sock"));
    }

    #[test]
    fn listening_socket_is_reachable() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nri.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let status = nri_reachable(&path);
        assert!(status.is_reachable(), "{}", status.message());
        assert_eq!(status.hint(), None);
    }

    #[test]
    fn stale_socket_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nri.sock");
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        let status = nri_reachable(&path);
        assert_eq!(status.reachability, Reachability::Refused);
        assert!(status.hint().is_some());
    }

    #[test]
    fn socket_problem_looks_at_the_file_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nri.sock");
        assert_eq!(
            socket_problem(&path).map(|s| s.reachability),
            Some(Reachability::Missing)
        );
        std::fs::write(&path, b"").unwrap();
        assert_eq!(
            socket_problem(&path).map(|s| s.reachability),
            Some(Reachability::NotASocket)
        );
        std::fs::remove_file(&path).unwrap();
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        listener.set_nonblocking(true).unwrap();
        assert_eq!(socket_problem(&path), None);
        // Nothing connected to the listener.
        assert!(matches!(
            listener.accept(),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock
        ));
    }

    #[test]
    fn regular_file_is_not_reachable() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nri.sock");
        std::fs::write(&path, b"").unwrap();
        let status = nri_reachable(&path);
        assert_eq!(status.reachability, Reachability::NotASocket);
        assert!(status.hint().is_some());
    }
}
