//! Runs the plugin: loads the config, rescans the host on a tick and on
//! inotify events, publishes snapshots, keeps one gRPC server per pool
//! running and registered, reloads the config live, and cleans up on exit.

use crate::cdi;
use crate::config::{self, Config, ConfigError, Format};
use crate::files::{self, FileError};
use crate::host_view::{self, HostView};
use crate::inventory::{self, Memory};
use crate::kubelet_checkpoint;
use crate::pool_server::PoolTask;
use crate::resource_name::ResourceName;
use crate::shared::Shared;
use crate::snapshot::Snapshot;
use crate::watcher::{self, WatchError};
use sriov_helpers::HostRoot;
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub const DEFAULT_KUBELET_DIR: &str = "/var/lib/kubelet/device-plugins";
pub const DEFAULT_DEVINFO_DIR: &str = "/var/run/k8s.cni.cncf.io/devinfo/dp";
pub const DEFAULT_CDI_DIR: &str = "/var/run/cdi";
pub const DEFAULT_CONFIG: &str = "/etc/kroce/device-plugin/config.yaml";
/// sysfs sends no inotify events, so its state is probed this often.
pub const DEFAULT_RESCAN: Duration = Duration::from_secs(1);
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
    pub rescan_interval: Duration,
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
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Watch(#[from] WatchError),
    #[error(transparent)]
    Dir(#[from] FileError),
}

/// Runs until `shutdown` completes, then stops every pool and removes the
/// sockets, CDI specs and device-info files it created. Fails only at start
/// (bad initial config, unwatchable directories).
pub async fn run(opts: Options, shutdown: impl Future<Output = ()>) -> Result<(), RunError> {
    // The operator writes this node's config only once an RdmaNetwork selects
    // the node; until then serve no pools and wait for the file to appear.
    let (config_text, config) = match config::load(&opts.config_path) {
        Ok(loaded) => loaded,
        Err(ConfigError::Read { path, source })
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
    let (snap_tx, snap_rx) = watch::channel(Arc::new(Snapshot::default()));
    let shared = Arc::new(Shared::new(snap_rx, opts.cdi, opts.devinfo_dir.clone()));
    let (kubelet_tx, _) = watch::channel(0u64);
    tracing::info!(
        config = %opts.config_path.display(),
        pools = config.pools.len(),
        kubelet_dir = %opts.kubelet_dir.display(),
        cdi = opts.cdi,
        "starting"
    );
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
        host_errors: BTreeSet::new(),
        last_probe: None,
        last_full: tokio::time::Instant::now(),
    };
    let mut tick = tokio::time::interval(r.opts.rescan_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            _ = tick.tick() => r.tick().await,
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
    r.shutdown().await;
    Ok(())
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
    host_errors: BTreeSet<String>,
    /// Probe taken just before the last full scan.
    last_probe: Option<u64>,
    last_full: tokio::time::Instant,
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

    /// The periodic check: a cheap probe, and a full scan only when it
    /// changed (or every [`FULL_SCAN_EVERY`]).
    async fn tick(&mut self) {
        let root = self.opts.host_root.clone();
        let checkpoint = self.opts.kubelet_dir.join(kubelet_checkpoint::FILE_NAME);
        let probe =
            tokio::task::spawn_blocking(move || host_view::probe(&root, &[&checkpoint])).await;
        match probe {
            Ok(p) if Some(p) == self.last_probe && self.last_full.elapsed() < FULL_SCAN_EVERY => {}
            _ => self.rescan().await,
        }
    }

    /// A full scan: rebuilds the snapshot and publishes it when it changed.
    async fn rescan(&mut self) {
        let root = self.opts.host_root.clone();
        let kubelet_dir = self.opts.kubelet_dir.clone();
        let scanned = tokio::task::spawn_blocking(move || {
            let checkpoint = kubelet_dir.join(kubelet_checkpoint::FILE_NAME);
            // Probe first: a change during the scan shows in the next probe.
            let probe = host_view::probe(&root, &[&checkpoint]);
            (
                probe,
                HostView::scan(&root),
                kubelet_checkpoint::read(&kubelet_dir),
            )
        })
        .await;
        let (probe, view, checkpoint) = match scanned {
            Ok(x) => x,
            Err(e) => {
                tracing::error!(error = %e, "host scan failed");
                return;
            }
        };
        self.last_probe = Some(probe);
        self.last_full = tokio::time::Instant::now();
        self.log_host_errors(&view);
        let candidates = inventory::candidates(&view, &mut self.memory);
        let snap = {
            let mut book = self.shared.allocations();
            book.observe(&candidates);
            let in_use = |r: &ResourceName, id: &str| {
                book.is_handed_out(r, id)
                    || checkpoint.get(r.as_str()).is_some_and(|s| s.contains(id))
            };
            Snapshot::build(&self.config, candidates, &in_use)
        };
        let prev = self.shared.latest();
        let changed = *prev != snap;
        if changed {
            log_changes(&prev, &snap);
        }
        // Specs go out before the snapshot that lets Allocate name them.
        if self.opts.cdi {
            self.write_cdi_specs(&snap);
        }
        if changed {
            self.snap_tx.send_replace(Arc::new(snap));
        }
        self.reconcile_pools().await;
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
            match cdi::spec_for_pool(ps) {
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
                    self.remove_cdi_spec(res);
                }
                _ => {}
            }
        }
        let gone: Vec<ResourceName> = self
            .cdi_written
            .keys()
            .filter(|r| !present.contains(*r))
            .cloned()
            .collect();
        for res in gone {
            self.remove_cdi_spec(&res);
        }
    }

    fn remove_cdi_spec(&mut self, res: &ResourceName) {
        let path = self.opts.cdi_dir.join(cdi::file_name(res));
        if let Err(e) = files::remove(&path) {
            tracing::warn!(resource = %res, error = %e, "cannot remove CDI spec");
        }
        self.cdi_written.remove(res);
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
            for p in self.shared.allocations().take_devinfo_files(Some(&res)) {
                let _ = files::remove(&p);
            }
            if self.cdi_written.contains_key(&res) {
                self.remove_cdi_spec(&res);
            }
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

    /// Stops every pool, then removes what the plugin wrote. Keeps going
    /// past failures.
    async fn shutdown(mut self) {
        tracing::info!("shutting down");
        let pools = std::mem::take(&mut self.pools);
        for (res, h) in pools {
            stop_pool(&res, h).await;
        }
        let written: Vec<ResourceName> = self.cdi_written.keys().cloned().collect();
        for res in written {
            self.remove_cdi_spec(&res);
        }
        for p in self.shared.allocations().take_devinfo_files(None) {
            if let Err(e) = files::remove(&p) {
                tracing::warn!(error = %e, "cannot remove device-info file");
            }
        }
    }
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
            tracing::info!(resource = %res, devices = ps.devices.len(), healthy, "pool ready");
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
