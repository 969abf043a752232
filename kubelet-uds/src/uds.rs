//! Edge: gRPC over unix sockets — binding the plugin socket with a tight
//! mode, and dialing a socket as a tonic client.

use hyper_util::rt::TokioIo;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::net::{UnixListener, UnixStream};
use tonic::transport::{Channel, Endpoint, Uri};

/// Plugin sockets: only root (the kubelet) may connect.
pub const SOCKET_MODE: u32 = 0o600;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum UdsError {
    #[error("cannot bind {path}: {source}")]
    Bind {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot connect to {path}: {message}")]
    Connect { path: PathBuf, message: String },
}

/// Identity of a file: (device, inode, ctime ns). Tells "our socket" from a
/// new file with the same name.
pub type FileId = (u64, u64, i64);

pub fn file_id(path: &Path) -> Option<FileId> {
    let m = std::fs::symlink_metadata(path).ok()?;
    Some((m.dev(), m.ino(), m.ctime() * 1_000_000_000 + m.ctime_nsec()))
}

/// Binds a listening socket at `path` with mode 0600. It is bound under a
/// temporary name, given its mode, then renamed into place, so it is never
/// reachable with a looser mode. A stale file at `path` is replaced.
pub fn bind(path: &Path) -> Result<(UnixListener, FileId), UdsError> {
    let fail = |source| UdsError::Bind {
        path: path.to_path_buf(),
        source,
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(format!(".{name}.{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let listener = UnixListener::bind(&tmp).map_err(fail)?;
    let placed = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(SOCKET_MODE))
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&tmp);
        return Err(fail(e));
    }
    let id = file_id(path).ok_or_else(|| fail(std::io::ErrorKind::NotFound.into()))?;
    Ok((listener, id))
}

/// A tonic channel over the unix socket at `path` (connected now).
pub async fn connect(path: &Path) -> Result<Channel, UdsError> {
    let fail = |message: String| UdsError::Connect {
        path: path.to_path_buf(),
        message,
    };
    // The URI is required by tonic but unused: the connector dials the socket.
    let endpoint = Endpoint::try_from("http://localhost").map_err(|e| fail(e.to_string()))?;
    let target = path.to_path_buf();
    let connecting = endpoint.connect_with_connector(tower::service_fn(move |_: Uri| {
        let target = target.clone();
        async move { UnixStream::connect(target).await.map(TokioIo::new) }
    }));
    match tokio::time::timeout(CONNECT_TIMEOUT, connecting).await {
        Ok(Ok(ch)) => Ok(ch),
        Ok(Err(e)) => Err(fail(describe(&e))),
        Err(_) => Err(fail("timed out".into())),
    }
}

/// The error and its causes, each once: tonic's transport error already
/// prints its source, so appending the chain blindly said everything twice.
fn describe(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cur = s.source();
    }
    out
}
