//! Runs the plugin: loads the config, rescans the host on kernel events
//! (rtnetlink, uevents), inotify events and a slow safety tick, publishes
//! snapshots, keeps one gRPC server per pool
//! running and registered, reloads the config live, and cleans up on exit.

use crate::cdi;
use crate::config::{self, Config, Format, PluginConfigError};
use crate::device_info;
use crate::files::{self, AtomicFileError};
use crate::host_view::{self, HostView};
use crate::in_use::{InUse, Source};
use crate::inventory::{self, Memory};
use crate::kernel_events::{self, Interest};
use crate::kubelet_checkpoint;
use crate::pod_resources::{self, PodResourcesClient};
use crate::pool_server::PoolTask;
use crate::resource_name::ResourceName;
use crate::shared::Shared;
use crate::snapshot::Snapshot;
use crate::watcher::{self, WatchError};
use sriov_helpers::HostRoot;
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub const DEFAULT_KUBELET_DIR: &str = "/var/lib/kubelet/device-plugins";
pub const DEFAULT_DEVINFO_DIR: &str = "/var/run/k8s.cni.cncf.io/devinfo/dp";
pub const DEFAULT_CDI_DIR: &str = "/var/run/cdi";
pub const DEFAULT_CONFIG: &str = "/etc/kroce/device-plugin/config.yaml";
pub const DEFAULT_POD_RESOURCES_SOCKET: &str = pod_resources::DEFAULT_SOCKET;
/// How long after Allocate a device counts as held even though the kubelet
/// does not list it yet (it records an allocation after Allocate returns).
pub const DEFAULT_ALLOCATION_GRACE: Duration = Duration::from_secs(5);
/// Kernel events drive rescans; this safety tick only catches what no event
/// announces (and anything an event socket dropped).
pub const DEFAULT_RESCAN: Duration = Duration::from_secs(30);
/// Without kernel events sysfs (which sends no inotify events) is probed at
/// least this often, as before events existed.
pub const FALLBACK_RESCAN: Duration = Duration::from_secs(1);
/// How often PodResources is asked what pods hold, on its own: a deleted
/// pod's device-info files go within this, not at the next safety rescan.
pub const DEFAULT_POD_RESOURCES_POLL: Duration = Duration::from_secs(1);
/// A full scan even when the probe saw no change (GID tables, link targets).
const FULL_SCAN_EVERY: Duration = Duration::from_secs(10);
/// Editors and ConfigMap swaps write in bursts: wait this long before reading.
const CONFIG_DEBOUNCE: Duration = Duration::from_millis(100);
const POOL_STOP_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone)]
pub struct Options {
    pub host_root: HostRoot,
    pub kubelet_dir: PathBuf,
    pub devinfo_dir: PathBuf,
    pub cdi_dir: PathBuf,
    /// Return CDI device names (and write CDI specs) instead of device specs.
    pub cdi: bool,
    pub config_path: PathBuf,
    /// The safety rescan tick. Without kernel events at most
    /// [`FALLBACK_RESCAN`].
    pub rescan_interval: Duration,
    /// Rescan on rtnetlink link/address events and kernel uevents. Off (or
    /// when the sockets cannot be opened): the tick alone, at most
    /// [`FALLBACK_RESCAN`] apart.
    pub kernel_events: bool,
    /// How much work the plugin did, for tests, benches and debugging.
    pub counters: Arc<Counters>,
    /// The kubelet's PodResources socket: which devices running pods hold.
    pub pod_resources_socket: PathBuf,
    /// How often what pods hold is read on its own (PodResources, else the
    /// checkpoint); a change rescans at once.
    pub pod_resources_poll: Duration,
    pub allocation_grace: Duration,
}

impl Options {
    /// The real node's defaults for everything but the config path.
    pub fn new(host_root: HostRoot, config_path: PathBuf) -> Options {
        Options {
            host_root,
            kubelet_dir: DEFAULT_KUBELET_DIR.into(),
            devinfo_dir: DEFAULT_DEVINFO_DIR.into(),
            cdi_dir: DEFAULT_CDI_DIR.into(),
            cdi: false,
            config_path,
            rescan_interval: DEFAULT_RESCAN,
            kernel_events: true,
            counters: Arc::default(),
            pod_resources_socket: DEFAULT_POD_RESOURCES_SOCKET.into(),
            pod_resources_poll: DEFAULT_POD_RESOURCES_POLL,
            allocation_grace: DEFAULT_ALLOCATION_GRACE,
        }
    }
}

/// Work done since start.
#[derive(Debug, Default)]
pub struct Counters {
    /// Probes of the host by the tick (cheap: no full scan unless changed).
    pub probes: AtomicU64,
    /// Full host scans, whatever triggered them.
    pub scans: AtomicU64,
    /// Kernel events that concerned us (each wakes a rescan; bursts coalesce).
    pub kernel_events: AtomicU64,
    /// Reads of what pods hold on the PodResources poll (not those of rescans).
    pub in_use_polls: AtomicU64,
}

impl Counters {
    pub fn probes(&self) -> u64 {
        self.probes.load(Ordering::Relaxed)
    }
    pub fn scans(&self) -> u64 {
        self.scans.load(Ordering::Relaxed)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Config(#[from] PluginConfigError),
    #[error(transparent)]
    Watch(#[from] WatchError),
    #[error(transparent)]
    Dir(#[from] AtomicFileError),
}

/// Runs until `shutdown` completes, then stops every pool, removes its
/// sockets and the CDI specs and device-info files of devices no pod holds
/// (those of held devices stay: their containers may restart while no
/// plugin runs). Fails only at start (bad initial config, unwatchable
/// directories).
pub async fn run(opts: Options, shutdown: impl Future<Output = ()>) -> Result<(), RunError> {
    // The operator writes this node's config only once an RdmaNetwork selects
    // the node; until then serve no pools and wait for the file to appear.
    let (config_text, config) = match config::load(&opts.config_path) {
        Ok(loaded) => loaded,
        Err(PluginConfigError::Read { path, source })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            tracing::warn!(path = %path.display(), "no config yet; serving no pools until it appears");
            (String::new(), Config { pools: Vec::new() })
        }
        Err(e) => return Err(e.into()),
    };
    files::ensure_dir(&opts.kubelet_dir)?;
    let config_dir = match opts.config_path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let dev_dir = opts.host_root.dev_infiniband();
    let (triggers, watch_task) = watcher::spawn(&opts.kubelet_dir, &config_dir, Some(&dev_dir))?;
    let (interest_tx, interest_rx) = watch::channel(Interest::default());
    // Opened here, in the network namespace `run` is called in (the host's).
    let events = if opts.kernel_events {
        match kernel_events::spawn(interest_rx) {
            Ok(l) => Some(l),
            Err(e) => {
                tracing::warn!(error = %e, rescan_ms = FALLBACK_RESCAN.as_millis() as u64, "no kernel events; falling back to a fast rescan tick");
                None
            }
        }
    } else {
        None
    };
    let rescan_every = match events {
        Some(_) => opts.rescan_interval,
        None => opts.rescan_interval.min(FALLBACK_RESCAN),
    };
    let kernel_changed = events.as_ref().map(|l| l.changed.clone());
    let (snap_tx, snap_rx) = watch::channel(Arc::new(Snapshot::default()));
    let shared = Arc::new(Shared::new(snap_rx, opts.cdi, opts.devinfo_dir.clone()));
    let (kubelet_tx, _) = watch::channel(0u64);
    tracing::info!(
        config = %opts.config_path.display(),
        pools = config.pools.len(),
        kubelet_dir = %opts.kubelet_dir.display(),
        cdi = opts.cdi,
        pod_resources = %opts.pod_resources_socket.display(),
        "starting"
    );
    let pod_resources = PodResourcesClient::new(&opts.pod_resources_socket);
    let mut r = Reconciler {
        opts,
        config,
        config_text,
        rejected: None,
        memory: Memory::default(),
        shared,
        snap_tx,
        kubelet_tx,
        pools: BTreeMap::new(),
        cdi_written: BTreeMap::new(),
        pod_resources,
        pod_resources_error: None,
        our_resources: BTreeSet::new(),
        host_errors: BTreeSet::new(),
        last_probe: None,
        last_full: tokio::time::Instant::now(),
        interest_tx,
    };
    tracing::info!(
        kernel_events = events.is_some(),
        rescan_ms = rescan_every.as_millis() as u64,
        "watching the host"
    );
    let mut tick = tokio::time::interval(rescan_every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut poll = tokio::time::interval(r.opts.pod_resources_poll);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is immediate: the start-up scan covers it.
    poll.tick().await;
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            _ = tick.tick() => r.tick().await,
            _ = poll.tick() => r.poll_in_use().await,
            _ = notified(kernel_changed.as_deref()) => {
                if let Some(l) = &events {
                    r.opts.counters.kernel_events.store(l.relevant.load(Ordering::Relaxed), Ordering::Relaxed);
                }
                r.rescan().await
            }
            _ = triggers.dev_dir.notified() => r.rescan().await,
            _ = triggers.kubelet_dir.notified() => r.kubelet_tx.send_modify(|n| *n += 1),
            _ = triggers.config_dir.notified() => {
                tokio::time::sleep(CONFIG_DEBOUNCE).await;
                if r.reload() {
                    r.rescan().await;
                }
            }
        }
    }
    watch_task.abort();
    drop(events);
    r.shutdown().await;
    Ok(())
}

/// Waits on `n`, or forever when there is none.
async fn notified(n: Option<&tokio::sync::Notify>) {
    match n {
        Some(n) => n.notified().await,
        None => std::future::pending().await,
    }
}

#[derive(Debug)]
struct PoolHandle {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

#[derive(Debug)]
struct Reconciler {
    opts: Options,
    config: Config,
    config_text: String,
    /// The last config text rejected (not logged again until it changes).
    rejected: Option<String>,
    memory: Memory,
    shared: Arc<Shared>,
    snap_tx: watch::Sender<Arc<Snapshot>>,
    kubelet_tx: watch::Sender<u64>,
    pools: BTreeMap<ResourceName, PoolHandle>,
    cdi_written: BTreeMap<ResourceName, cdi::Spec>,
    pod_resources: PodResourcesClient,
    /// The last PodResources failure logged (not logged again until it changes).
    pod_resources_error: Option<String>,
    /// Every pool served since start: whose device-info files are ours.
    our_resources: BTreeSet<ResourceName>,
    host_errors: BTreeSet<String>,
    /// Host probe taken just before the last full scan, the in-use
    /// fingerprint it used and the allocation generation it saw.
    last_probe: Option<(u64, u64, u64)>,
    last_full: tokio::time::Instant,
    /// Which netdevs kernel events are about that concern us (from the last scan).
    interest_tx: watch::Sender<Interest>,
}

impl Reconciler {
    /// Re-reads the config file; true when a new valid config was taken.
    fn reload(&mut self) -> bool {
        let path = &self.opts.config_path;
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) => {
                let msg = e.to_string();
                if self.rejected.as_deref() != Some(&msg) {
                    tracing::warn!(path = %path.display(), error = %e, "cannot read config; keeping the last good one");
                    self.rejected = Some(msg);
                }
                return false;
            }
        };
        if text == self.config_text || self.rejected.as_deref() == Some(&text) {
            return false;
        }
        match config::parse(&text, Format::detect(Some(path), &text)) {
            Ok(c) => {
                tracing::info!(path = %path.display(), pools = c.pools.len(), "config reloaded");
                self.config = c;
                self.config_text = text;
                self.rejected = None;
                true
            }
            Err(e) => {
                tracing::error!(path = %path.display(), error = %e, "new config rejected; keeping the last good one");
                self.rejected = Some(text);
                false
            }
        }
    }

    /// Which devices pods hold: from PodResources, else (with a warning) the
    /// kubelet checkpoint, else unknown. Plus this process's allocations the
    /// kubelet's answer may not show yet.
    async fn in_use(&mut self) -> InUse {
        let grace = self.opts.allocation_grace;
        let asked = Instant::now();
        match self.pod_resources.list().await {
            Ok(kubelet) => {
                tracing::debug!(socket = %self.pod_resources.path().display(), held = %held_summary(&kubelet), "PodResources listed");
                if self.pod_resources_error.take().is_some() {
                    tracing::info!(socket = %self.pod_resources.path().display(), "PodResources answers again; in-use devices come from it");
                }
                let pending = self.shared.allocations().pending(Some(asked), grace);
                InUse {
                    source: Source::PodResources,
                    kubelet,
                    pending,
                }
            }
            Err(e) => {
                let msg = e.to_string();
                let asked = Instant::now();
                let checkpoint = kubelet_checkpoint::try_read(&self.opts.kubelet_dir);
                // Warned once per distinct failure (the poll asks every second).
                if self.pod_resources_error.as_deref() != Some(&msg) {
                    let path = self.opts.kubelet_dir.join(kubelet_checkpoint::FILE_NAME);
                    if checkpoint.is_some() {
                        tracing::warn!(error = %e, checkpoint = %path.display(), "cannot list pod resources; in-use devices come from the kubelet checkpoint, which keeps a deleted pod's devices until the kubelet's next allocation");
                    } else {
                        tracing::warn!(error = %e, checkpoint = %path.display(), "cannot list pod resources and no readable kubelet checkpoint; only this plugin's own allocations count as in use, and no device-info file or CDI spec is removed");
                    }
                    self.pod_resources_error = Some(msg);
                }
                let mut book = self.shared.allocations();
                match checkpoint {
                    Some(kubelet) => InUse {
                        source: Source::Checkpoint,
                        kubelet,
                        pending: book.pending(Some(asked), grace),
                    },
                    None => InUse::unknown(book.pending(None, grace)),
                }
            }
        }
    }

    /// The periodic check: a cheap probe of the host and the in-use list,
    /// and a full scan only when either changed (or every [`FULL_SCAN_EVERY`]).
    async fn tick(&mut self) {
        let in_use = self.in_use().await;
        let generation = self.shared.allocations().generation();
        let root = self.opts.host_root.clone();
        self.opts.counters.probes.fetch_add(1, Ordering::Relaxed);
        let probe = tokio::task::spawn_blocking(move || host_view::probe(&root, &[])).await;
        match probe {
            Ok(p)
                if Some((p, fingerprint(&in_use), generation)) == self.last_probe
                    && self.last_full.elapsed() < FULL_SCAN_EVERY => {}
            _ => self.rescan_with(in_use).await,
        }
    }

    /// PodResources on its own short interval: when what pods hold changed
    /// (a pod deleted, or started), rescan now, so a released device's
    /// device-info file goes (and its health follows) without waiting for
    /// the safety rescan. Nothing else is read when nothing changed.
    async fn poll_in_use(&mut self) {
        self.opts
            .counters
            .in_use_polls
            .fetch_add(1, Ordering::Relaxed);
        let in_use = self.in_use().await;
        if self
            .last_probe
            .is_some_and(|(_, seen, _)| seen == fingerprint(&in_use))
        {
            return;
        }
        tracing::debug!(
            source = in_use.source.as_str(),
            "what pods hold changed; rescanning"
        );
        self.rescan_with(in_use).await;
    }

    async fn rescan(&mut self) {
        let in_use = self.in_use().await;
        self.rescan_with(in_use).await;
    }

    /// A full scan: rebuilds the snapshot and publishes it when it changed,
    /// then brings the files in line with what pods hold.
    async fn rescan_with(&mut self, in_use: InUse) {
        // Read before the scan: an Allocate during it shows in the next tick.
        let generation = self.shared.allocations().generation();
        let root = self.opts.host_root.clone();
        self.opts.counters.scans.fetch_add(1, Ordering::Relaxed);
        let scanned = tokio::task::spawn_blocking(move || {
            // Probe first: a change during the scan shows in the next probe.
            let probe = host_view::probe(&root, &[]);
            (probe, HostView::scan(&root))
        })
        .await;
        let (probe, view) = match scanned {
            Ok(x) => x,
            Err(e) => {
                tracing::error!(error = %e, "host scan failed");
                return;
            }
        };
        self.last_probe = Some((probe, fingerprint(&in_use), generation));
        self.last_full = tokio::time::Instant::now();
        self.log_host_errors(&view);
        let candidates = inventory::candidates(&view, &mut self.memory);
        let interest = Interest::new(
            candidates.iter().flat_map(|c| {
                c.netdev
                    .as_ref()
                    .map(|n| n.name.as_str())
                    .into_iter()
                    .chain(c.pf_name.as_deref())
            }),
            &view.host,
        );
        self.interest_tx.send_if_modified(|i| {
            let changed = *i != interest;
            *i = interest;
            changed
        });
        let snap = Snapshot::build(&self.config, candidates, &|r, id| {
            in_use.holds(r.as_str(), id)
        });
        let prev = self.shared.latest();
        let changed = *prev != snap;
        if changed {
            log_changes(&prev, &snap);
        }
        // Specs go out before the snapshot that lets Allocate name them.
        if self.opts.cdi {
            self.write_cdi_specs(&snap);
        }
        // An Allocate during the scan wrote its device-info file after
        // `in_use` was read: what the book holds now counts too, or the tidy
        // would remove that file before the CNI reads it (seen in the VM
        // tier, where a scan takes seconds).
        let in_use = in_use.with_pending(
            self.shared
                .allocations()
                .pending(None, self.opts.allocation_grace),
        );
        self.reconcile_files(&snap, &in_use);
        if changed {
            self.snap_tx.send_replace(Arc::new(snap));
        }
        self.reconcile_pools().await;
    }

    /// Device-info files and CDI specs follow what pods hold: a held
    /// device's files are kept (and a missing device-info file re-written),
    /// a released device's removed. Nothing is removed when nobody can say
    /// what is held.
    fn reconcile_files(&mut self, snap: &Snapshot, in_use: &InUse) {
        for ps in &snap.pools {
            self.our_resources.insert(ps.pool.resource.clone());
        }
        if in_use.can_restore() {
            self.restore_device_info(snap, in_use);
        }
        if in_use.can_release() {
            self.remove_released_device_info(snap, in_use);
            self.remove_released_cdi_specs(in_use);
        }
    }

    fn restore_device_info(&self, snap: &Snapshot, in_use: &InUse) {
        for ps in &snap.pools {
            let res = &ps.pool.resource;
            for id in in_use.held(res.as_str()) {
                let Some(info) = ps
                    .devices
                    .get(id)
                    .and_then(|d| device_info::for_candidate(&d.candidate))
                else {
                    continue;
                };
                let path = self.opts.devinfo_dir.join(device_info::file_name(res, id));
                if path.exists() {
                    continue;
                }
                let json = info.to_bytes();
                match files::write_atomic(&path, &json) {
                    Ok(()) => {
                        tracing::info!(resource = %res, device = id, path = %path.display(), "re-wrote the device-info file of a device a pod holds")
                    }
                    Err(e) => {
                        tracing::warn!(resource = %res, device = id, error = %e, "cannot re-write device-info file")
                    }
                }
            }
        }
    }

    fn remove_released_device_info(&self, snap: &Snapshot, in_use: &InUse) {
        let Ok(rd) = std::fs::read_dir(&self.opts.devinfo_dir) else {
            return;
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some((res, id)) = device_info_owner(&name, &self.our_resources, snap, in_use)
            else {
                continue;
            };
            if in_use.holds(res.as_str(), &id) {
                continue;
            }
            match files::remove(&e.path()) {
                Ok(()) => {
                    tracing::info!(resource = %res, device = %id, source = in_use.source.as_str(), "removed the device-info file of a device no pod holds")
                }
                Err(e) => {
                    tracing::warn!(resource = %res, device = %id, error = %e, "cannot remove device-info file")
                }
            }
        }
    }

    /// Removes `kroce.io-*.json` CDI specs this process does not keep
    /// written for a pool and no pod needs (a removed pool, an old run, CDI
    /// mode turned off).
    fn remove_released_cdi_specs(&self, in_use: &InUse) {
        let Ok(rd) = std::fs::read_dir(&self.opts.cdi_dir) else {
            return;
        };
        let mut keep: BTreeSet<String> = self.cdi_written.keys().map(cdi::file_name).collect();
        let held = in_use
            .kubelet
            .iter()
            .filter(|(_, ids)| !ids.is_empty())
            .map(|(r, _)| r.as_str())
            .chain(in_use.pending.iter().map(|(r, _)| r.as_str()));
        keep.extend(
            held.filter_map(|r| ResourceName::parse(r).ok())
                .map(|r| cdi::file_name(&r)),
        );
        let prefix = format!("{}-", crate::resource_name::VENDOR_DOMAIN);
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.starts_with(&prefix) || !name.ends_with(".json") || keep.contains(&name) {
                continue;
            }
            match files::remove(&e.path()) {
                Ok(()) => {
                    tracing::info!(path = %e.path().display(), "removed a CDI spec no pod needs")
                }
                Err(err) => tracing::warn!(error = %err, "cannot remove CDI spec"),
            }
        }
    }

    fn log_host_errors(&mut self, view: &HostView) {
        let now: BTreeSet<String> = view.host.errors.iter().map(|e| e.to_string()).collect();
        for e in now.difference(&self.host_errors) {
            tracing::warn!(error = %e, "host scan problem");
        }
        self.host_errors = now;
    }

    fn write_cdi_specs(&mut self, snap: &Snapshot) {
        let mut present = BTreeSet::new();
        for ps in &snap.pools {
            let res = &ps.pool.resource;
            present.insert(res.clone());
            let path = self.opts.cdi_dir.join(cdi::file_name(res));
            match cdi::spec_for_pool_on(ps, &self.opts.host_root.dev_infiniband()) {
                // Rewritten when it changed or someone removed it (e.g. the
                // previous plugin pod cleaning up after a rolling update).
                Some(spec) if self.cdi_written.get(res) != Some(&spec) || !path.exists() => {
                    let json = serde_json::to_vec_pretty(&spec).unwrap_or_default();
                    match files::write_atomic(&path, &json) {
                        Ok(()) => {
                            self.cdi_written.insert(res.clone(), spec);
                        }
                        Err(e) => {
                            tracing::error!(resource = %res, error = %e, "cannot write CDI spec")
                        }
                    }
                }
                None if self.cdi_written.contains_key(res) => {
                    // No devices: no spec to keep written. Whether the file
                    // goes depends on what pods hold (reconcile_files).
                    self.cdi_written.remove(res);
                }
                _ => {}
            }
        }
        // Pools gone from the config: same.
        self.cdi_written.retain(|r, _| present.contains(r));
    }

    /// One running pool task per configured pool.
    async fn reconcile_pools(&mut self) {
        let wanted: BTreeSet<ResourceName> = self
            .config
            .pools
            .iter()
            .map(|p| p.resource.clone())
            .collect();
        let removed: Vec<ResourceName> = self
            .pools
            .keys()
            .filter(|r| !wanted.contains(*r))
            .cloned()
            .collect();
        for res in removed {
            if let Some(h) = self.pools.remove(&res) {
                stop_pool(&res, h).await;
            }
            // Its files go with the next rescan, unless a pod holds them.
        }
        for res in wanted {
            if self.pools.contains_key(&res) {
                continue;
            }
            let (stop, stop_rx) = watch::channel(false);
            let task = PoolTask {
                resource: res.clone(),
                shared: self.shared.clone(),
                kubelet_dir: self.opts.kubelet_dir.clone(),
                kubelet_events: self.kubelet_tx.subscribe(),
                stop: stop_rx,
            };
            let task = tokio::spawn(task.run());
            self.pools.insert(res, PoolHandle { stop, task });
        }
    }

    /// Stops every pool, then removes the device-info files and CDI specs
    /// of devices no pod holds. A held device's files stay: its containers
    /// may restart before the next plugin runs, and the kubelet does not call
    /// Allocate again for them. Keeps going past failures.
    async fn shutdown(mut self) {
        tracing::info!("shutting down");
        let pools = std::mem::take(&mut self.pools);
        for (res, h) in pools {
            stop_pool(&res, h).await;
        }
        let in_use = self.in_use().await;
        if !in_use.can_release() {
            tracing::warn!(
                "cannot tell which devices pods hold; leaving every device-info file and CDI spec in place"
            );
        }
        // No spec is kept written once the pools stop: only held ones stay.
        self.cdi_written.clear();
        let snap = self.shared.latest();
        self.reconcile_files(&snap, &in_use);
    }
}

/// `rdma/vf=[0000:3b:00.2 0000:3b:00.3] nvidia.com/gpu=[…]`, for the debug log.
fn held_summary(a: &pod_resources::Assigned) -> String {
    let parts: Vec<String> = a
        .iter()
        .map(|(r, ids)| {
            let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
            format!("{r}=[{}]", ids.join(" "))
        })
        .collect();
    if parts.is_empty() {
        "nothing".into()
    } else {
        parts.join(" ")
    }
}

/// A fingerprint of what pods hold, for the cheap periodic check.
fn fingerprint(in_use: &InUse) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    in_use.hash(&mut h);
    h.finish()
}

/// The pool and device ID a device-info file name belongs to, when it is
/// one of ours: `<prefix of a pool we served>-<id>-device.json` with an ID
/// that pool knows, a pod holds, or that looks like a PCI address (a device
/// gone since). The longest matching prefix wins (`rdma/vf` vs `rdma/vf-x`).
fn device_info_owner(
    name: &str,
    ours: &BTreeSet<ResourceName>,
    snap: &Snapshot,
    in_use: &InUse,
) -> Option<(ResourceName, String)> {
    let stem = name.strip_suffix("-device.json")?;
    if name.starts_with('.') {
        return None;
    }
    let mut best: Option<(usize, &ResourceName, &str)> = None;
    for res in ours {
        let prefix = format!("{}-", res.device_info_prefix());
        let Some(id) = stem.strip_prefix(prefix.as_str()) else {
            continue;
        };
        let known = snap.pool(res).is_some_and(|p| p.devices.contains_key(id))
            || in_use.holds(res.as_str(), id)
            || looks_like_pci_id(id);
        if known && best.is_none_or(|(len, _, _)| prefix.len() > len) {
            best = Some((prefix.len(), res, id));
        }
    }
    best.map(|(_, r, id)| (r.clone(), id.to_string()))
}

/// `0000:3b:00.2` or a share of one, `0000:3b:00.0-7`.
fn looks_like_pci_id(id: &str) -> bool {
    let base = match id.rsplit_once('-') {
        Some((b, n)) if !n.is_empty() && n.bytes().all(|c| c.is_ascii_digit()) => b,
        _ => id,
    };
    base.parse::<sriov_helpers::PciAddress>().is_ok()
}

async fn stop_pool(res: &ResourceName, h: PoolHandle) {
    let _ = h.stop.send(true);
    let abort = h.task.abort_handle();
    if tokio::time::timeout(POOL_STOP_TIMEOUT, h.task)
        .await
        .is_err()
    {
        tracing::warn!(resource = %res, "pool did not stop in time; aborted");
        abort.abort();
    }
}

/// Logs pools appearing, devices added or removed, and health changes (once
/// per underlying device, not per share).
fn log_changes(prev: &Snapshot, next: &Snapshot) {
    for ps in &next.pools {
        let res = &ps.pool.resource;
        let healthy = ps
            .devices
            .values()
            .filter(|d| d.health.is_healthy())
            .count();
        let Some(old) = prev.pool(res) else {
            // One line, naming every unhealthy device (not each share) and why.
            let unhealthy = unhealthy_devices(ps);
            if unhealthy.is_empty() {
                tracing::info!(resource = %res, devices = ps.devices.len(), healthy, "pool ready");
            } else {
                tracing::warn!(resource = %res, devices = ps.devices.len(), healthy, unhealthy = %unhealthy.join("; "), "pool ready; some devices are unhealthy");
            }
            continue;
        };
        let added = ps
            .devices
            .keys()
            .filter(|k| !old.devices.contains_key(*k))
            .count();
        let removed = old
            .devices
            .keys()
            .filter(|k| !ps.devices.contains_key(*k))
            .count();
        if added + removed > 0 {
            tracing::info!(resource = %res, added, removed, devices = ps.devices.len(), healthy, "devices changed");
        }
        let mut seen = BTreeSet::new();
        for d in ps.devices.values() {
            if !seen.insert(d.candidate.id.as_str()) {
                continue;
            }
            let Some(o) = old.devices.get(&d.id) else {
                continue;
            };
            if o.health == d.health {
                continue;
            }
            if d.health.is_healthy() {
                tracing::info!(resource = %res, device = %d.candidate.id, "device healthy again");
            } else {
                tracing::warn!(resource = %res, device = %d.candidate.id, reasons = ?d.health.reasons(), "device unhealthy");
            }
        }
    }
}

/// `<device>: <reason>, <reason>` per unhealthy underlying device.
fn unhealthy_devices(ps: &crate::snapshot::PoolSnapshot) -> Vec<String> {
    let mut seen = BTreeSet::new();
    ps.devices
        .values()
        .filter(|d| !d.health.is_healthy() && seen.insert(d.candidate.id.as_str()))
        .map(|d| format!("{}: {}", d.candidate.id, d.health.reasons().join(", ")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Format, parse};
    use crate::testing::CapturedLogs;

    #[test]
    fn device_info_files_are_ours_only_with_a_pool_prefix_and_a_device_id() {
        let vf = ResourceName::parse("vf").unwrap();
        let vfx = ResourceName::parse("vf-x").unwrap();
        let ours: BTreeSet<ResourceName> = [vf.clone(), vfx.clone()].into();
        let none = InUse::unknown(BTreeSet::new());
        let snap = Snapshot::default();
        let owner = |name: &str| device_info_owner(name, &ours, &snap, &none);
        assert_eq!(
            owner("rdma-vf-0000:3b:00.2-device.json"),
            Some((vf.clone(), "0000:3b:00.2".into()))
        );
        // The longer pool name wins; its ID is not "x-0000:…" of rdma/vf.
        assert_eq!(
            owner("rdma-vf-x-0000:3b:00.2-device.json"),
            Some((vfx, "0000:3b:00.2".into()))
        );
        // Shares of a shared HCA.
        assert_eq!(
            owner("rdma-vf-0000:3b:00.0-7-device.json"),
            Some((vf, "0000:3b:00.0-7".into()))
        );
        // Another plugin's files, temp files and unknown IDs are left alone.
        assert_eq!(owner("intel.com-sriov-0000:3b:00.2-device.json"), None);
        assert_eq!(owner(".rdma-vf-0000:3b:00.2-device.json.tmp-1"), None);
        assert_eq!(owner("rdma-vf-whatever-device.json"), None);
    }

    #[test]
    fn start_up_names_unhealthy_devices_in_one_line() {
        let (_dir, fx) = crate::testing::connectx_pair();
        fx.remove_netdev("ens1f0v1").unwrap();
        fx.set_operstate("ens2f0v3", "down").unwrap();
        let cfg = parse(
            "pools:\n- resourceName: vf\n  selectors: {devices: [\"101e\"]}\n- resourceName: hca\n  mode: shared\n  sharedCount: 3\n  selectors: {devices: [\"101d\"]}\n",
            Format::Yaml,
        )
        .unwrap();
        let c = inventory::candidates(&HostView::scan(&fx.root()), &mut Memory::default());
        let snap = Snapshot::build(&cfg, c, &|_, _| false);
        let out = CapturedLogs::default();
        let subscriber = out.subscriber(tracing::Level::INFO);
        tracing::subscriber::with_default(subscriber, || {
            log_changes(&Snapshot::default(), &snap);
        });
        let text = out.text();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        let vf = lines.iter().find(|l| l.contains("rdma/vf")).unwrap();
        assert!(vf.contains("WARN"), "{vf}");
        assert!(
            vf.contains(
                "0000:3b:00.3: netdev ens1f0v1 is gone; 0000:86:00.5: netdev ens2f0v3 is down"
            ),
            "{vf}"
        );
        assert!(vf.contains("healthy=14"), "{vf}");
        let hca = lines.iter().find(|l| l.contains("rdma/hca")).unwrap();
        assert!(hca.contains("INFO") && !hca.contains("unhealthy"), "{hca}");
    }
}
