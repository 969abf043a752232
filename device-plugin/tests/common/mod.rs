//! A fixture host, a kubelet stand-in and the plugin, all under one temp dir.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use kroce_device_plugin::plugin::{self, Counters, Options, RunError};
use kroce_device_plugin::testing::{KubeletStandIn, PodResourcesStandIn, scratch_dir};
use sriov_helpers::fixture::FixtureHost;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Health and rediscovery must show within this (the issue asks for 1-2 s).
pub const SEEN_WITHIN: Duration = Duration::from_secs(2);
pub const RESCAN: Duration = Duration::from_millis(250);
/// Allocations count as held this long without the kubelet listing them.
pub const GRACE: Duration = Duration::from_millis(300);
pub const VF: &str = "rdma/vf";

pub const VF_CONFIG: &str = "pools:
- resourceName: vf
  memlock: unlimited
  selectors:
    vendors: [\"15b3\"]
    devices: [\"101e\"]
    isRdma: true
";

pub fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("KROCE_LOG_LEVEL")
                .unwrap_or_else(|_| "kroce_device_plugin=debug".into()),
        )
        .with_test_writer()
        .try_init();
}

#[derive(Debug)]
pub struct Harness {
    pub fx: FixtureHost,
    _fx_dir: tempfile::TempDir,
    pub tmp: tempfile::TempDir,
    pub kubelet: Option<KubeletStandIn>,
    pub pod_resources: Option<PodResourcesStandIn>,
    plugin: Option<JoinHandle<Result<(), RunError>>>,
    stop: Option<oneshot::Sender<()>>,
    generation: AtomicU32,
    pub cdi: bool,
    /// The plugin's safety tick ([`RESCAN`] unless a test sets it).
    pub rescan: Duration,
    pub kernel_events: bool,
    /// The plugin's own PodResources poll (the default unless a test sets it).
    pub pod_resources_poll: Duration,
    /// The running plugin's work counters.
    pub counters: Arc<Counters>,
}

impl Harness {
    pub fn kubelet_dir(&self) -> PathBuf {
        self.tmp.path().join("kubelet")
    }
    pub fn devinfo_dir(&self) -> PathBuf {
        self.tmp.path().join("devinfo")
    }
    pub fn cdi_dir(&self) -> PathBuf {
        self.tmp.path().join("cdi")
    }
    pub fn pod_resources_socket(&self) -> PathBuf {
        self.tmp.path().join("pod-resources/kubelet.sock")
    }
    pub fn config_dir(&self) -> PathBuf {
        self.tmp.path().join("config")
    }
    /// The path the plugin is given: a ConfigMap-style link through `..data`.
    pub fn config_path(&self) -> PathBuf {
        self.config_dir().join("config.yaml")
    }

    /// A ConfigMap-style tree and then an update done the way the kubelet
    /// does it: new timestamped dir, `..data_tmp` link, rename over `..data`.
    pub fn write_config(&self, text: &str) {
        let dir = self.config_dir();
        std::fs::create_dir_all(&dir).unwrap();
        let g = self.generation.fetch_add(1, Ordering::SeqCst);
        let stamp = format!("..2025_01_01_00_00_{g:02}.000000000");
        std::fs::create_dir(dir.join(&stamp)).unwrap();
        std::fs::write(dir.join(&stamp).join("config.yaml"), text).unwrap();
        let tmp_link = dir.join("..data_tmp");
        let _ = std::fs::remove_file(&tmp_link);
        std::os::unix::fs::symlink(&stamp, &tmp_link).unwrap();
        let old = std::fs::read_link(dir.join("..data")).ok();
        std::fs::rename(&tmp_link, dir.join("..data")).unwrap();
        if !dir.join("config.yaml").exists() {
            std::os::unix::fs::symlink("..data/config.yaml", dir.join("config.yaml")).unwrap();
        }
        if let Some(old) = old {
            std::fs::remove_dir_all(dir.join(old)).unwrap();
        }
    }

    pub fn options(&self) -> Options {
        Options {
            host_root: self.fx.root(),
            kubelet_dir: self.kubelet_dir(),
            devinfo_dir: self.devinfo_dir(),
            cdi_dir: self.cdi_dir(),
            cdi: self.cdi,
            config_path: self.config_path(),
            rescan_interval: self.rescan,
            kernel_events: self.kernel_events,
            counters: self.counters.clone(),
            pod_resources_socket: self.pod_resources_socket(),
            pod_resources_poll: self.pod_resources_poll,
            allocation_grace: GRACE,
        }
    }

    /// Host, config and directories, nothing running yet.
    pub fn prepare(config: &str, cdi: bool) -> Harness {
        init_logs();
        let fx_dir = scratch_dir("kroce-host-").unwrap();
        let mut fx = FixtureHost::at(fx_dir.path()).unwrap();
        fx.populate_connectx6dx_pair().unwrap();
        let h = Harness {
            fx,
            _fx_dir: fx_dir,
            tmp: scratch_dir("kroce-dp-").unwrap(),
            kubelet: None,
            pod_resources: None,
            plugin: None,
            stop: None,
            generation: AtomicU32::new(0),
            cdi,
            rescan: RESCAN,
            kernel_events: true,
            pod_resources_poll: plugin::DEFAULT_POD_RESOURCES_POLL,
            counters: Arc::default(),
        };
        std::fs::create_dir_all(h.kubelet_dir()).unwrap();
        h.write_config(config);
        h
    }

    /// The kubelet's registration and PodResources stand-ins (no pods).
    pub async fn start_kubelet(&mut self) {
        self.kubelet = Some(KubeletStandIn::start(&self.kubelet_dir()).await.unwrap());
        self.pod_resources = Some(
            PodResourcesStandIn::start(&self.pod_resources_socket())
                .await
                .unwrap(),
        );
    }

    pub fn pods(&self) -> &PodResourcesStandIn {
        self.pod_resources.as_ref().unwrap()
    }

    pub fn start_plugin(&mut self) {
        let (tx, rx) = oneshot::channel::<()>();
        let opts = self.options();
        self.plugin = Some(tokio::spawn(plugin::run(opts, async move {
            let _ = rx.await;
        })));
        self.stop = Some(tx);
    }

    /// Kubelet, then plugin; returns once the VF pool is registered and listed.
    pub async fn start(config: &str, cdi: bool) -> Harness {
        let mut h = Harness::prepare(config, cdi);
        h.start_kubelet().await;
        h.start_plugin();
        h
    }

    pub fn kubelet(&self) -> &KubeletStandIn {
        self.kubelet.as_ref().unwrap()
    }

    /// Stops the plugin and returns what `run` returned.
    pub async fn stop_plugin(&mut self) -> Result<(), RunError> {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        let task = self.plugin.take().unwrap();
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("plugin did not stop within 10 s")
            .unwrap()
    }

    pub async fn shutdown(mut self) {
        if self.plugin.is_some() {
            self.stop_plugin().await.unwrap();
        }
        if let Some(k) = self.kubelet.take() {
            k.stop().await;
        }
        if let Some(mut p) = self.pod_resources.take() {
            p.stop().await;
        }
    }

    pub fn uverbs_of(&self, netdev: &str) -> String {
        // The VF's RDMA device sits under its PCI dir; its uverbs under the same.
        let pci = std::fs::canonicalize(
            self.fx
                .path()
                .join("sys/class/net")
                .join(netdev)
                .join("device"),
        )
        .unwrap();
        let verbs = std::fs::read_dir(pci.join("infiniband_verbs")).unwrap();
        verbs
            .flatten()
            .next()
            .unwrap()
            .file_name()
            .to_string_lossy()
            .into_owned()
    }
}

pub fn files_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}
