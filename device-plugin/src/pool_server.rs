//! Edge: the life of one pool's plugin socket. Serve on
//! `<kubelet-dir>/kroce-<resource>.sock`, register with the kubelet (retrying
//! with backoff while it is not up), and start over when the kubelet deletes
//! the socket (it does on every restart) or re-creates `kubelet.sock`.

use crate::api::{self, device_plugin_server::DevicePluginServer};
use crate::grpc_uds;
use crate::registration;
use crate::resource_name::ResourceName;
use crate::server::DevicePluginService;
use crate::shared::Shared;
use crate::uds::{self, FileId};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::UnixListener;
use tokio::sync::watch;

const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// Safety net when no inotify event arrives (events can be lost on overflow).
const RECHECK: Duration = Duration::from_secs(5);
/// How long a stopping server may take to drain before it is aborted.
const DRAIN: Duration = Duration::from_secs(2);

#[derive(Debug)]
pub struct PoolTask {
    pub resource: ResourceName,
    pub shared: Arc<Shared>,
    pub kubelet_dir: PathBuf,
    /// Bumped on every event in the kubelet dir.
    pub kubelet_events: watch::Receiver<u64>,
    /// `true`: stop serving, remove the socket and return.
    pub stop: watch::Receiver<bool>,
}

enum Outcome {
    Stop,
    /// The socket was deleted (kubelet restart): serve again.
    Restart,
    /// Another process replaced the socket (e.g. the next plugin pod during
    /// a rolling update): leave it alone until it is gone.
    Yield,
}

impl PoolTask {
    fn socket(&self) -> PathBuf {
        self.kubelet_dir.join(self.resource.socket_name())
    }

    pub async fn run(mut self) {
        let socket = self.socket();
        'serve: loop {
            if *self.stop.borrow() {
                break;
            }
            let (listener, ours) = match uds::bind(&socket) {
                Ok(x) => x,
                Err(e) => {
                    tracing::error!(resource = %self.resource, error = %e, "cannot serve; retrying");
                    if !self.wait(MAX_BACKOFF).await {
                        break;
                    }
                    continue;
                }
            };
            let (srv_stop, srv_stop_rx) = watch::channel(false);
            let service = DevicePluginService::new(
                self.resource.clone(),
                self.shared.clone(),
                srv_stop_rx.clone(),
            );
            let server = tokio::spawn(serve(listener, service, srv_stop_rx, self.resource.clone()));
            tracing::info!(resource = %self.resource, socket = %socket.display(), "serving");
            let outcome = self.register_until_done(&socket, ours).await;
            let _ = srv_stop.send(true);
            let abort = server.abort_handle();
            if tokio::time::timeout(DRAIN, server).await.is_err() {
                abort.abort();
            }
            match outcome {
                Outcome::Stop => {
                    // Only remove the socket if it is still ours.
                    if uds::file_id(&socket) == Some(ours) {
                        let _ = std::fs::remove_file(&socket);
                    }
                    break;
                }
                Outcome::Restart => {
                    tracing::warn!(resource = %self.resource, "plugin socket was removed (kubelet restart?); serving again");
                }
                Outcome::Yield => {
                    tracing::warn!(resource = %self.resource, socket = %socket.display(), "another process took over the socket; waiting for it to go");
                    while socket.exists() {
                        if !self.wait_event(RECHECK).await {
                            break 'serve;
                        }
                    }
                }
            }
        }
        tracing::info!(resource = %self.resource, "stopped");
    }

    async fn register_until_done(&mut self, socket: &Path, ours: FileId) -> Outcome {
        let kubelet_sock = self.kubelet_dir.join(api::KUBELET_SOCKET);
        let mut registered_with: Option<FileId> = None;
        let mut backoff = FIRST_BACKOFF;
        let mut failures = 0u32;
        loop {
            if *self.stop.borrow() {
                return Outcome::Stop;
            }
            match uds::file_id(socket) {
                Some(id) if id == ours => {}
                None => return Outcome::Restart,
                Some(_) => return Outcome::Yield,
            }
            let kubelet = uds::file_id(&kubelet_sock);
            let mut wait = RECHECK;
            if kubelet.is_none() {
                if failures == 0 {
                    tracing::info!(resource = %self.resource, path = %kubelet_sock.display(), "waiting for the kubelet");
                }
                failures += 1;
            } else if kubelet != registered_with {
                match registration::register(&kubelet_sock, &self.resource).await {
                    Ok(()) => {
                        tracing::info!(resource = %self.resource, attempts = failures + 1, "registered with the kubelet");
                        registered_with = kubelet;
                        backoff = FIRST_BACKOFF;
                        failures = 0;
                    }
                    Err(e) => {
                        failures += 1;
                        // First failure and then every 10th: the kubelet may
                        // be down for minutes.
                        if failures == 1 || failures.is_multiple_of(10) {
                            tracing::warn!(resource = %self.resource, error = %e, attempts = failures, "registration failed; retrying");
                        }
                        wait = backoff;
                        backoff = (backoff * 2).min(MAX_BACKOFF);
                    }
                }
            }
            // A dropped sender means the plugin is going away: stop.
            tokio::select! {
                r = self.stop.changed() => if r.is_err() { return Outcome::Stop },
                r = self.kubelet_events.changed() => if r.is_err() { return Outcome::Stop },
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Waits for a kubelet dir event or `d`; false when stopping.
    async fn wait_event(&mut self, d: Duration) -> bool {
        tokio::select! {
            r = self.stop.changed() => r.is_ok() && !*self.stop.borrow(),
            r = self.kubelet_events.changed() => r.is_ok(),
            _ = tokio::time::sleep(d) => true,
        }
    }

    /// Sleeps `d` unless stopped; false when stopping.
    async fn wait(&mut self, d: Duration) -> bool {
        tokio::select! {
            r = self.stop.changed() => r.is_ok() && !*self.stop.borrow(),
            _ = tokio::time::sleep(d) => true,
        }
    }
}

async fn serve(
    listener: UnixListener,
    service: DevicePluginService,
    mut stop: watch::Receiver<bool>,
    resource: ResourceName,
) {
    let result = tonic::transport::Server::builder()
        .add_service(DevicePluginServer::new(service))
        // Through the `:authority` pump: grpc-go clients dialing the socket
        // path send one h2 would refuse (see grpc_uds).
        .serve_with_incoming_shutdown(grpc_uds::incoming(listener), async move {
            let _ = stop.wait_for(|s| *s).await;
        })
        .await;
    if let Err(e) = result {
        tracing::error!(%resource, error = %e, "gRPC server failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grpc_uds::frames::raw_grpc_calls;
    use crate::snapshot::Snapshot;

    /// grpc-go dialing the socket path sends it percent-encoded as
    /// `:authority`; h2 alone resets such a stream (PROTOCOL_ERROR).
    #[tokio::test]
    async fn serves_a_client_whose_authority_is_the_percent_encoded_socket_path() {
        let dir = tempfile::tempdir().unwrap();
        let (_snap_tx, snap_rx) = watch::channel(Arc::new(Snapshot::default()));
        let (_events_tx, events_rx) = watch::channel(0u64);
        let (stop_tx, stop_rx) = watch::channel(false);
        let task = PoolTask {
            resource: ResourceName::parse("rdma/vf").unwrap(),
            shared: Arc::new(Shared::new(snap_rx, false, dir.path().join("devinfo"))),
            kubelet_dir: dir.path().to_path_buf(),
            kubelet_events: events_rx,
            stop: stop_rx,
        };
        let socket = task.socket();
        let run = tokio::spawn(task.run());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while !socket.exists() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let authority = socket.to_string_lossy().replace('/', "%2F").into_bytes();
        let calls = [
            ("/v1beta1.DevicePlugin/GetDevicePluginOptions", Vec::new()),
            ("/v1beta1.DevicePlugin/GetDevicePluginOptions", Vec::new()),
        ];
        let res = tokio::time::timeout(
            Duration::from_secs(5),
            raw_grpc_calls(&socket, &authority, &calls),
        )
        .await
        .unwrap()
        .unwrap();
        for r in &res {
            assert_eq!(r.reset, None, "{r:?}");
            assert_eq!(r.grpc_status().as_deref(), Some("0"), "{r:?}");
        }
        stop_tx.send(true).unwrap();
        run.await.unwrap();
    }
}
