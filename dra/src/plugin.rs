//! Edge: the running plugin — the DRA service socket, the registration
//! socket (re-created when it disappears, e.g. the kubelet's
//! `plugins_registry` was wiped), the host rescan that feeds prepare and
//! the ResourceSlices, and a clean stop that removes both sockets.

use crate::api::{
    dra::dra_plugin_server::DraPluginServer,
    health::dra_resource_health_server::DraResourceHealthServer,
    registration::registration_server::RegistrationServer,
};
use crate::checkpoint;
use crate::claims::ClaimSource;
use crate::driver::{self, DRIVER_NAME};
use crate::driver_state::DriverState;
use crate::facts::HostFacts;
use crate::prepare::Paths;
use crate::publish::SlicePublisher;
use crate::server::{DraService, HealthService, RegistrationService, RegistrationState};
use crate::sharing::SharingRules;
use crate::slice::{self, Pool, Sharing};
use futures::{FutureExt, StreamExt};
use inotify::{Inotify, WatchMask};
use kroce_contracts::atomic_file::{self, AtomicFileError, Modes};
use kroce_inventory::inventory::Memory;
use kroce_kubelet_uds::grpc_uds;
use kroce_kubelet_uds::uds::{self, FileId, UdsError};
use sriov_helpers::HostRoot;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

pub const DEFAULT_STATE_DIR: &str = "/var/lib/kroce/dra";
pub const DEFAULT_CDI_DIR: &str = "/var/run/cdi";
pub const DEFAULT_DEVINFO_DIR: &str = "/var/run/k8s.cni.cncf.io/devinfo/dra";
/// Beside kroce-cni's memlock dir, not in it: the CNI garbage-collects
/// files there whose sandbox is gone, and claims are no sandboxes. kroce-nri
/// reads `<its state dir>/dra-memlock`: the same directory by default.
pub const DEFAULT_MEMLOCK_DIR: &str = kroce_contracts::memlock_file::DEFAULT_DRA_DIR;
pub const DEFAULT_RESCAN: Duration = Duration::from_secs(5);

#[derive(Debug, Clone)]
pub struct Options {
    pub node: String,
    pub kubelet_dir: PathBuf,
    pub host_root: HostRoot,
    pub paths: Paths,
    pub state_dir: PathBuf,
    pub rescan: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error(transparent)]
    Checkpoint(#[from] checkpoint::CheckpointError),
    #[error(transparent)]
    Socket(#[from] UdsError),
    #[error(transparent)]
    Dir(#[from] AtomicFileError),
}

/// A gRPC server on a unix socket until stopped.
#[derive(Debug)]
pub struct Serving {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
    pub path: PathBuf,
    pub id: FileId,
}

impl Serving {
    pub fn start(
        path: &Path,
        router: tonic::transport::server::Router,
    ) -> Result<Serving, UdsError> {
        let (listener, id) = uds::bind(path)?;
        let (stop, mut stop_rx) = watch::channel(false);
        let task = tokio::spawn(async move {
            let shutdown = async move {
                let _ = stop_rx.wait_for(|s| *s).await;
            };
            if let Err(e) = router
                // The kubelet's plugin watcher sends the percent-encoded
                // socket path as `:authority`, which h2 refuses: every
                // connection goes through the pump that replaces it.
                .serve_with_incoming_shutdown(grpc_uds::incoming(listener), shutdown)
                .await
            {
                tracing::error!(error = %e, "gRPC server failed");
            }
        });
        Ok(Serving {
            stop,
            task,
            path: path.to_path_buf(),
            id,
        })
    }

    /// Our socket is still the file at its path.
    pub fn in_place(&self) -> bool {
        uds::file_id(&self.path) == Some(self.id)
    }

    /// Stops (a server busy after 2 s is aborted) and removes the socket if
    /// it is still ours.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let abort = self.task.abort_handle();
        if tokio::time::timeout(Duration::from_secs(2), self.task)
            .await
            .is_err()
        {
            abort.abort();
        }
        if uds::file_id(&self.path) == Some(self.id) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// The running plugin. [`Plugin::stop`] ends it.
#[derive(Debug)]
pub struct Plugin {
    pub state: Arc<DriverState>,
    pub registration: watch::Receiver<RegistrationState>,
    /// Registration sockets bound so far (1 + re-creations).
    pub registration_binds: watch::Receiver<u64>,
    stop: Arc<Notify>,
    task: JoinHandle<()>,
}

impl Plugin {
    /// Opens the checkpoint, scans the host, serves the DRA service and
    /// then the registration socket (the kubelet dials the service as soon
    /// as it sees the registration), and keeps slices and sockets current.
    pub async fn start(
        opts: Options,
        claims: Arc<dyn ClaimSource>,
        publisher: Arc<dyn SlicePublisher>,
    ) -> Result<Plugin, PluginError> {
        Plugin::start_with(opts, Arc::new(Sharing::default()), claims, publisher).await
    }

    /// [`Plugin::start`] with shared HCAs as `sharing` says at each rescan.
    pub async fn start_with(
        opts: Options,
        sharing: Arc<dyn SharingRules>,
        claims: Arc<dyn ClaimSource>,
        publisher: Arc<dyn SlicePublisher>,
    ) -> Result<Plugin, PluginError> {
        atomic_file::ensure_dir(&opts.state_dir, Modes::SHARED.dir)?;
        let state = Arc::new(DriverState::open(
            &opts.node,
            opts.paths.clone(),
            claims,
            opts.state_dir.join(checkpoint::FILE_NAME),
        )?);
        // A failed first scan publishes nothing; the rescan tick tries again.
        let (facts, memory) = scan(&opts.host_root, Memory::default())
            .await
            .unwrap_or_default();
        let in_use = state.in_use().await;
        state.set_inventory(slice::devices_with(&facts, &in_use, &sharing.current()));

        let service_path = driver::service_socket(&opts.kubelet_dir);
        let registry = opts.kubelet_dir.join(driver::PLUGINS_REGISTRY);
        if let Some(dir) = service_path.parent() {
            atomic_file::ensure_dir(dir, Modes::SHARED.dir)?;
        }
        atomic_file::ensure_dir(&registry, Modes::SHARED.dir)?;
        let service = Serving::start(
            &service_path,
            tonic::transport::Server::builder()
                .add_service(DraPluginServer::new(DraService::new(state.clone())))
                .add_service(DraResourceHealthServer::new(HealthService::new(
                    state.clone(),
                ))),
        )?;
        let (reg_tx, reg_rx) = watch::channel(RegistrationState::default());
        let reg_path = driver::registration_socket(&opts.kubelet_dir);
        let bind_registration = {
            let reg_tx = reg_tx.clone();
            let service_path = service_path.clone();
            move |path: &Path| {
                Serving::start(
                    path,
                    tonic::transport::Server::builder().add_service(RegistrationServer::new(
                        RegistrationService::new(service_path.clone(), reg_tx.clone()),
                    )),
                )
            }
        };
        let registration = bind_registration(&reg_path)?;
        tracing::info!(
            driver = DRIVER_NAME,
            node = %opts.node,
            devices = state.inventory().len(),
            service = %service_path.display(),
            registration = %reg_path.display(),
            "DRA plugin serving; waiting for the kubelet to register it"
        );
        let (binds_tx, binds_rx) = watch::channel(1u64);
        let registry_events = Arc::new(Notify::new());
        let watcher = watch_dir(&registry, registry_events.clone());
        let stop = Arc::new(Notify::new());
        let task = tokio::spawn(run(
            opts,
            state.clone(),
            publisher,
            sharing,
            memory,
            service,
            registration,
            Box::new(bind_registration),
            binds_tx,
            registry_events,
            watcher,
            stop.clone(),
        ));
        Ok(Plugin {
            state,
            registration: reg_rx,
            registration_binds: binds_rx,
            stop,
            task,
        })
    }

    /// Stops serving and removes both sockets (the kubelet deregisters the
    /// driver); prepared claims stay in the checkpoint.
    pub async fn stop(self) {
        self.stop.notify_one();
        let _ = self.task.await;
    }
}

/// [`HostFacts::scan`] on the blocking pool: a sysfs walk (thousands of
/// reads on a big host) must not stall the async workers that answer the
/// kubelet. `memory` goes in and comes back; `None`: the scan panicked
/// (its memory is lost; nothing is published from it).
async fn scan(root: &HostRoot, mut memory: Memory) -> Option<(HostFacts, Memory)> {
    let root = root.clone();
    tokio::task::spawn_blocking(move || {
        let facts = HostFacts::scan(&root, &mut memory);
        (facts, memory)
    })
    .await
    .inspect_err(|e| tracing::error!(error = %e, "host scan failed"))
    .ok()
}

type Binder = Box<dyn Fn(&Path) -> Result<Serving, UdsError> + Send + Sync>;

/// inotify on the registry dir; `None` (the tick covers it) when it cannot.
fn watch_dir(dir: &Path, events: Arc<Notify>) -> Option<JoinHandle<()>> {
    let inotify = Inotify::init().ok()?;
    let mask = WatchMask::CREATE
        | WatchMask::DELETE
        | WatchMask::MOVED_FROM
        | WatchMask::MOVED_TO
        | WatchMask::DELETE_SELF;
    if let Err(e) = inotify.watches().add(dir, mask) {
        tracing::info!(path = %dir.display(), error = %e, "not watching the registry dir; the rescan tick covers it");
        return None;
    }
    let mut stream = inotify.into_event_stream(vec![0u8; 4096]).ok()?;
    Some(tokio::spawn(async move {
        while let Some(ev) = stream.next().await {
            if ev.is_ok() {
                events.notify_one();
            }
        }
    }))
}

#[allow(clippy::too_many_arguments)]
async fn run(
    opts: Options,
    state: Arc<DriverState>,
    publisher: Arc<dyn SlicePublisher>,
    sharing: Arc<dyn SharingRules>,
    mut memory: Memory,
    service: Serving,
    mut registration: Serving,
    bind_registration: Binder,
    binds: watch::Sender<u64>,
    registry_events: Arc<Notify>,
    watcher: Option<JoinHandle<()>>,
    stop: Arc<Notify>,
) {
    let reg_path = driver::registration_socket(&opts.kubelet_dir);
    let registry = opts.kubelet_dir.join(driver::PLUGINS_REGISTRY);
    let mut pool: Option<Pool> = None;
    // The highest generation we wrote: a pool read back after its slices
    // were deleted goes on from there, never backwards.
    let mut last_generation = 0i64;
    let mut tick = tokio::time::interval(opts.rescan);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut api_changes = publisher.changes(&opts.node);
    loop {
        let rescan = tokio::select! {
            _ = stop.notified() => break,
            _ = registry_events.notified() => false,
            _ = tick.tick() => true,
            Some(()) = api_changes.next() => {
                // One pass for a burst (our own apply of several slices
                // arrives as several events).
                while let Some(Some(())) = api_changes.next().now_or_never() {}
                // Our slices changed in the API (deleted by a restarting
                // kubelet, by hand, ...): read them again and converge.
                // Events of our own writes land here too; reading back the
                // same content writes nothing.
                if let Some(p) = pool.take() {
                    last_generation = last_generation.max(p.generation());
                }
                true
            }
        };
        if !registration.in_place() {
            // Gone (or replaced): the kubelet only learns of us from a new
            // socket in its registry dir.
            let _ = atomic_file::ensure_dir(&registry, Modes::SHARED.dir);
            match bind_registration(&reg_path) {
                Ok(new) => {
                    tracing::info!(path = %reg_path.display(), "registration socket re-created");
                    let old = std::mem::replace(&mut registration, new);
                    old.stop().await;
                    binds.send_modify(|n| *n += 1);
                }
                Err(e) => tracing::warn!(error = %e, "cannot re-create the registration socket"),
            }
        }
        if !rescan {
            continue;
        }
        let Some((facts, m)) = scan(&opts.host_root, std::mem::take(&mut memory)).await else {
            continue;
        };
        memory = m;
        for e in &facts.errors {
            tracing::debug!(error = %e, "host scan");
        }
        let in_use = state.in_use().await;
        let published = slice::devices_with(&facts, &in_use, &sharing.current());
        let devices = published.iter().map(|p| p.device.clone()).collect();
        state.set_inventory(published);
        if pool.is_none() {
            match publisher.existing(&opts.node).await {
                Ok(e) => {
                    if e.generation < last_generation && e.devices.is_none() {
                        tracing::info!(node = %opts.node, generation = last_generation, "this node's ResourceSlices are gone from the API; publishing them again");
                    }
                    let generation = e.generation.max(last_generation);
                    let devices = e.devices.filter(|_| e.generation == generation);
                    pool = Some(Pool::resume(&opts.node, generation, devices));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read this node's ResourceSlices; retrying");
                    continue;
                }
            }
        }
        let Some(p) = pool.as_mut() else { continue };
        if let Some(slices) = p.update(devices) {
            let generation = p.generation();
            match publisher.publish(&opts.node, slices).await {
                Ok(()) => {
                    tracing::info!(driver = DRIVER_NAME, generation, "ResourceSlices published")
                }
                Err(e) => {
                    tracing::warn!(error = %e, "publishing ResourceSlices failed; retrying");
                    p.invalidate();
                }
            }
        }
    }
    if let Some(w) = watcher {
        w.abort();
    }
    registration.stop().await;
    service.stop().await;
}
