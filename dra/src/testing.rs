//! Stand-ins for tests and benches (feature `testing`): the kubelet's DRA
//! side ([`KubeletDraStandIn`]), an in-memory claim store
//! ([`InMemoryClaims`], claims written as the scheduler writes their
//! allocation, see [`allocated_claim`]) and a [`RecordingPublisher`].
//!
//! [`KubeletDraStandIn`] behaves like the kubelet's plugin watcher and DRA
//! manager: it looks for sockets in `<kubelet>/plugins_registry`, calls
//! GetInfo on each new one, checks the type (`DRAPlugin`) and versions
//! (`v1.DRAPlugin`), dials the endpoint and answers
//! NotifyRegistrationStatus; a socket that goes away is deregistered.
//! Prepare and unprepare go over the endpoint's unix socket.
//!
//! [`SlowCheckpoint`] is a checkpoint store in memory that counts its
//! writes and takes as long as a slow disk's fsync.
//!
//! [`PluginRig`] is the node the plugin tests share: a fixture host, the
//! plugin's options into a scratch dir, the claim store and the publisher.

use crate::api::{self, dra, registration};
use crate::claims::{ClaimError, ClaimRef, ClaimSource};
use crate::config::{CONFIG_API_VERSION, CONFIG_KIND, ConfigSource};
use crate::driver::{DRIVER_NAME, PLUGINS_REGISTRY};
use crate::plugin::{Options, Plugin};
use crate::prepare::{CdiDevice, Paths};
use crate::publish::{Existing, PublishError, SlicePublisher, existing_of};
use crate::sharing::SharingRules;
use crate::slice::Sharing;
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationConfiguration, DeviceAllocationResult, DeviceClaim,
    DeviceRequest, DeviceRequestAllocationResult, ExactDeviceRequest, OpaqueDeviceConfiguration,
    ResourceClaim, ResourceClaimSpec, ResourceClaimStatus, ResourceSlice,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use kroce_kubelet_uds::uds::{self, FileId};
use sriov_helpers::fixture::FixtureHost;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A checkpoint store in memory: every save takes `delay` (a slow disk's
/// write + fsync, on the blocking pool like the file's) and is recorded.
#[derive(Debug, Default)]
pub struct SlowCheckpoint {
    delay: Duration,
    saved: Mutex<Vec<crate::checkpoint::Checkpoint>>,
    failing: Mutex<bool>,
    path: PathBuf,
}

impl SlowCheckpoint {
    pub fn new(delay: Duration) -> Self {
        SlowCheckpoint {
            delay,
            path: PathBuf::from("slow-checkpoint"),
            ..Default::default()
        }
    }

    /// Every checkpoint saved so far, oldest first.
    pub fn saved(&self) -> Vec<crate::checkpoint::Checkpoint> {
        lock(&self.saved).clone()
    }

    /// Saves fail (after the delay) until set back.
    pub fn set_failing(&self, fail: bool) {
        *lock(&self.failing) = fail;
    }
}

impl crate::checkpoint::CheckpointStore for SlowCheckpoint {
    fn load(&self) -> Result<crate::checkpoint::Checkpoint, crate::checkpoint::CheckpointError> {
        Ok(lock(&self.saved).last().cloned().unwrap_or_default())
    }

    fn save(
        &self,
        cp: &crate::checkpoint::Checkpoint,
    ) -> Result<(), crate::checkpoint::CheckpointError> {
        std::thread::sleep(self.delay);
        if *lock(&self.failing) {
            return Err(crate::checkpoint::CheckpointError::Lost {
                path: self.path.clone(),
                message: "disk full (test)".into(),
            });
        }
        lock(&self.saved).push(cp.clone());
        Ok(())
    }

    fn path(&self) -> &Path {
        &self.path
    }
}

/// Claims as the API server would return them.
#[derive(Debug, Default)]
pub struct InMemoryClaims {
    claims: Mutex<BTreeMap<(String, String), ResourceClaim>>,
    gets: Mutex<u64>,
    delay: Mutex<Duration>,
}

impl InMemoryClaims {
    pub fn insert(&self, rc: ResourceClaim) {
        let key = (
            rc.metadata.namespace.clone().unwrap_or_default(),
            rc.metadata.name.clone().unwrap_or_default(),
        );
        lock(&self.claims).insert(key, rc);
    }

    pub fn remove(&self, namespace: &str, name: &str) {
        lock(&self.claims).remove(&(namespace.to_string(), name.to_string()));
    }

    /// Every GET takes this long from now on (a slow API server).
    pub fn set_delay(&self, d: Duration) {
        *lock(&self.delay) = d;
    }

    /// GETs served so far.
    pub fn gets(&self) -> u64 {
        *lock(&self.gets)
    }
}

#[tonic::async_trait]
impl ClaimSource for InMemoryClaims {
    async fn get(&self, claim: &ClaimRef) -> Result<ResourceClaim, ClaimError> {
        let delay = *lock(&self.delay);
        // Even a zero sleep waits for the timer wheel's next tick (~1 ms).
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        *lock(&self.gets) += 1;
        lock(&self.claims)
            .get(&(claim.namespace.clone(), claim.name.clone()))
            .cloned()
            .ok_or_else(|| ClaimError::NotFound {
                claim: claim.to_string(),
            })
    }
}

/// One opaque config entry for [`allocated_claim`].
#[derive(Debug, Clone)]
pub struct ConfigEntry {
    pub source: ConfigSource,
    pub requests: Vec<String>,
    pub driver: String,
    pub parameters: serde_json::Value,
}

/// An opaque config entry of this driver for every request: `fields` (a
/// JSON object; anything else adds nothing) beside the config's apiVersion
/// and kind.
pub fn driver_config(source: ConfigSource, fields: serde_json::Value) -> ConfigEntry {
    let mut parameters = serde_json::json!({"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND});
    if let (Some(p), serde_json::Value::Object(f)) = (parameters.as_object_mut(), fields) {
        p.extend(f);
    }
    ConfigEntry {
        source,
        requests: vec![],
        driver: DRIVER_NAME.into(),
        parameters,
    }
}

/// The container paths of a CDI device's nodes, and whether they hold what
/// every RDMA claim needs: a uverbs device and rdma_cm.
pub fn rdma_device_nodes(d: &CdiDevice) -> (Vec<&str>, bool) {
    let nodes: Vec<&str> = d
        .container_edits
        .device_nodes
        .iter()
        .map(|n| n.path.as_str())
        .collect();
    let ok = nodes
        .iter()
        .any(|n| n.starts_with("/dev/infiniband/uverbs"))
        && nodes.contains(&"/dev/infiniband/rdma_cm");
    (nodes, ok)
}

/// A ResourceClaim after scheduling: `spec.devices.requests` naming class
/// `class`, and `status.allocation.devices` with one result per
/// `(request, device)` in pool `node` of `driver`, and the configs copied
/// from class and claim.
pub fn allocated_claim(
    claim: &ClaimRef,
    driver: &str,
    node: &str,
    devices: &[(&str, &str)],
    configs: &[ConfigEntry],
) -> ResourceClaim {
    let mut requests: Vec<String> = devices.iter().map(|(r, _)| r.to_string()).collect();
    requests.dedup();
    ResourceClaim {
        metadata: ObjectMeta {
            namespace: Some(claim.namespace.clone()),
            name: Some(claim.name.clone()),
            uid: Some(claim.uid.clone()),
            ..Default::default()
        },
        spec: Some(ResourceClaimSpec {
            devices: Some(DeviceClaim {
                requests: Some(
                    requests
                        .iter()
                        .map(|r| DeviceRequest {
                            name: r.clone(),
                            exactly: Some(ExactDeviceRequest {
                                device_class_name: "rdma-vf.kroce.io".into(),
                                ..Default::default()
                            }),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
        }),
        status: Some(ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results: Some(
                        devices
                            .iter()
                            .map(|(r, d)| DeviceRequestAllocationResult {
                                request: r.to_string(),
                                driver: driver.to_string(),
                                pool: node.to_string(),
                                device: d.to_string(),
                                ..Default::default()
                            })
                            .collect(),
                    ),
                    config: Some(
                        configs
                            .iter()
                            .map(|c| DeviceAllocationConfiguration {
                                source: match c.source {
                                    ConfigSource::FromClass => "FromClass",
                                    ConfigSource::FromClaim => "FromClaim",
                                }
                                .into(),
                                requests: (!c.requests.is_empty()).then(|| c.requests.clone()),
                                opaque: Some(OpaqueDeviceConfiguration {
                                    driver: c.driver.clone(),
                                    parameters: RawExtension(c.parameters.clone()),
                                }),
                            })
                            .collect(),
                    ),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
    }
}

/// Stores slices in memory, like the API server would.
#[derive(Debug, Default)]
pub struct RecordingPublisher {
    stored: Mutex<BTreeMap<String, Vec<ResourceSlice>>>,
    writes: Mutex<u64>,
    fail: Mutex<bool>,
    /// Bumped on every change to the store (a watch's events).
    changed: watch::Sender<u64>,
}

impl RecordingPublisher {
    /// The node's slices as stored.
    pub fn slices(&self, node: &str) -> Vec<ResourceSlice> {
        lock(&self.stored).get(node).cloned().unwrap_or_default()
    }

    /// Successful publications so far.
    pub fn writes(&self) -> u64 {
        *lock(&self.writes)
    }

    /// Makes publications fail (API server down) or work again.
    pub fn set_failing(&self, fail: bool) {
        *lock(&self.fail) = fail;
    }

    /// Deletes the node's slices, as the kubelet does when it starts.
    pub fn delete_all(&self, node: &str) {
        lock(&self.stored).remove(node);
        self.changed.send_modify(|n| *n += 1);
    }
}

#[tonic::async_trait]
impl SlicePublisher for RecordingPublisher {
    async fn existing(&self, node: &str) -> Result<Existing, PublishError> {
        Ok(existing_of(&self.slices(node)))
    }

    async fn publish(&self, node: &str, slices: Vec<ResourceSlice>) -> Result<(), PublishError> {
        if *lock(&self.fail) {
            return Err(PublishError::Api {
                action: "apply",
                name: node.to_string(),
                message: "stand-in API server is failing".into(),
            });
        }
        lock(&self.stored).insert(node.to_string(), slices);
        *lock(&self.writes) += 1;
        self.changed.send_modify(|n| *n += 1);
        Ok(())
    }

    fn changes(&self, _node: &str) -> futures::stream::BoxStream<'static, ()> {
        use futures::StreamExt;
        tokio_stream::wrappers::WatchStream::from_changes(self.changed.subscribe())
            .map(|_| ())
            .boxed()
    }
}

/// A plugin the stand-in registered.
#[derive(Debug, Clone)]
pub struct Registered {
    pub socket: PathBuf,
    pub info: registration::PluginInfo,
    id: FileId,
    channel: Channel,
}

#[derive(Debug, Default)]
struct State {
    /// By driver name.
    plugins: BTreeMap<String, Registered>,
    /// GetInfo answers received, in order.
    infos: Vec<registration::PluginInfo>,
    /// Sockets refused, with the reason sent back.
    refused: Vec<(PathBuf, String)>,
}

/// The kubelet's DRA side. Drop or [`KubeletDraStandIn::stop`] ends it.
#[derive(Debug)]
pub struct KubeletDraStandIn {
    registry: PathBuf,
    state: Arc<Mutex<State>>,
    changed: watch::Sender<u64>,
    task: Option<JoinHandle<()>>,
}

impl KubeletDraStandIn {
    /// Watches `<kubelet_dir>/plugins_registry` (created if missing).
    pub fn start(kubelet_dir: &Path) -> std::io::Result<KubeletDraStandIn> {
        let registry = kubelet_dir.join(PLUGINS_REGISTRY);
        std::fs::create_dir_all(&registry)?;
        let (changed, _) = watch::channel(0);
        let mut k = KubeletDraStandIn {
            registry,
            state: Arc::default(),
            changed,
            task: None,
        };
        k.spawn();
        Ok(k)
    }

    fn spawn(&mut self) {
        let registry = self.registry.clone();
        let state = self.state.clone();
        let changed = self.changed.clone();
        self.task = Some(tokio::spawn(async move {
            loop {
                scan_registry(&registry, &state, &changed).await;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }));
    }

    /// A kubelet restart: every registration is forgotten; the new kubelet
    /// finds the sockets still in the registry dir and registers them again.
    pub fn restart(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
        lock(&self.state).plugins.clear();
        self.changed.send_modify(|n| *n += 1);
        self.spawn();
    }

    pub fn stop(mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }

    pub fn registered(&self, driver: &str) -> Option<Registered> {
        lock(&self.state).plugins.get(driver).cloned()
    }

    /// Every GetInfo answer so far.
    pub fn infos(&self) -> Vec<registration::PluginInfo> {
        lock(&self.state).infos.clone()
    }

    pub fn refused(&self) -> Vec<(PathBuf, String)> {
        lock(&self.state).refused.clone()
    }

    /// Waits for `check` to hold, re-checking on every change and every 20 ms.
    pub async fn wait_for<T>(
        &self,
        timeout: Duration,
        what: &str,
        check: impl Fn(&KubeletDraStandIn) -> Option<T>,
    ) -> Result<T, String> {
        let mut rx = self.changed.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(v) = check(self) {
                return Ok(v);
            }
            if tokio::time::Instant::now() >= deadline {
                let st = lock(&self.state);
                return Err(format!(
                    "timed out after {timeout:?} waiting for {what}; registered: {:?}; refused: {:?}",
                    st.plugins.keys().collect::<Vec<_>>(),
                    st.refused
                ));
            }
            let _ = tokio::time::timeout(Duration::from_millis(20), rx.changed()).await;
        }
    }

    /// Waits for the `n`-th GetInfo (1-based) and a registration of `driver`.
    pub async fn wait_registered(&self, driver: &str, n: usize) -> Result<Registered, String> {
        self.wait_for(
            Duration::from_secs(10),
            &format!("registration #{n} of {driver}"),
            |k| {
                (k.infos().iter().filter(|i| i.name == driver).count() >= n)
                    .then(|| k.registered(driver))
                    .flatten()
            },
        )
        .await
    }

    fn client(
        &self,
        driver: &str,
    ) -> Result<dra::dra_plugin_client::DraPluginClient<Channel>, String> {
        self.registered(driver)
            .map(|r| dra::dra_plugin_client::DraPluginClient::new(r.channel))
            .ok_or_else(|| format!("driver {driver} is not registered"))
    }

    /// NodePrepareResources, as the kubelet calls it before a pod's sandbox.
    pub async fn prepare(
        &self,
        driver: &str,
        claims: &[ClaimRef],
    ) -> Result<dra::NodePrepareResourcesResponse, String> {
        let req = dra::NodePrepareResourcesRequest {
            claims: claims.iter().map(to_claim).collect(),
        };
        self.client(driver)?
            .node_prepare_resources(req)
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| s.to_string())
    }

    /// [`Self::prepare`] of one claim for kroce's driver.
    pub async fn prepare_claim(
        &self,
        claim: &ClaimRef,
    ) -> Result<dra::NodePrepareResourcesResponse, String> {
        self.prepare(DRIVER_NAME, std::slice::from_ref(claim)).await
    }

    /// [`Self::unprepare`] of one claim for kroce's driver.
    pub async fn unprepare_claim(
        &self,
        claim: &ClaimRef,
    ) -> Result<dra::NodeUnprepareResourcesResponse, String> {
        self.unprepare(DRIVER_NAME, std::slice::from_ref(claim))
            .await
    }

    /// NodeUnprepareResources, as the kubelet calls it after a pod is gone.
    pub async fn unprepare(
        &self,
        driver: &str,
        claims: &[ClaimRef],
    ) -> Result<dra::NodeUnprepareResourcesResponse, String> {
        let req = dra::NodeUnprepareResourcesRequest {
            claims: claims.iter().map(to_claim).collect(),
        };
        self.client(driver)?
            .node_unprepare_resources(req)
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| s.to_string())
    }
}

impl Drop for KubeletDraStandIn {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

fn to_claim(c: &ClaimRef) -> dra::Claim {
    dra::Claim {
        namespace: c.namespace.clone(),
        uid: c.uid.clone(),
        name: c.name.clone(),
    }
}

/// One pass of the plugin watcher: deregister sockets that went away or
/// were replaced, register new ones.
async fn scan_registry(registry: &Path, state: &Arc<Mutex<State>>, changed: &watch::Sender<u64>) {
    let gone: Vec<String> = lock(state)
        .plugins
        .iter()
        .filter(|(_, r)| uds::file_id(&r.socket) != Some(r.id))
        .map(|(k, _)| k.clone())
        .collect();
    if !gone.is_empty() {
        let mut st = lock(state);
        for k in gone {
            st.plugins.remove(&k);
        }
        changed.send_modify(|n| *n += 1);
    }
    let Ok(rd) = std::fs::read_dir(registry) else {
        return;
    };
    for e in rd.flatten() {
        let path = e.path();
        let is_socket = e
            .file_type()
            .map(|t| std::os::unix::fs::FileTypeExt::is_socket(&t))
            .unwrap_or(false);
        // The kubelet skips dot files (our temporary bind names are dot files).
        if !is_socket || e.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let Some(id) = uds::file_id(&path) else {
            continue;
        };
        let known = lock(state)
            .plugins
            .values()
            .any(|r| r.socket == path && r.id == id)
            || lock(state).refused.iter().any(|(p, _)| *p == path);
        if known {
            continue;
        }
        if let Some(r) = register(&path, id, state).await {
            lock(state).plugins.insert(r.info.name.clone(), r);
        }
        changed.send_modify(|n| *n += 1);
    }
}

async fn register(path: &Path, id: FileId, state: &Arc<Mutex<State>>) -> Option<Registered> {
    let channel = uds::connect(path).await.ok()?;
    let mut reg = registration::registration_client::RegistrationClient::new(channel);
    let info = reg
        .get_info(registration::InfoRequest {})
        .await
        .ok()?
        .into_inner();
    lock(state).infos.push(info.clone());
    let refuse = |why: String| registration::RegistrationStatus {
        plugin_registered: false,
        error: why,
    };
    let problem = if info.r#type != api::PLUGIN_TYPE {
        Some(format!("unsupported plugin type {:?}", info.r#type))
    } else if !info
        .supported_versions
        .iter()
        .any(|v| v == api::DRA_V1_SERVICE)
    {
        Some(format!(
            "none of the versions {:?} is supported",
            info.supported_versions
        ))
    } else if info.name.is_empty() {
        Some("empty driver name".into())
    } else {
        None
    };
    if let Some(why) = problem {
        let _ = reg.notify_registration_status(refuse(why.clone())).await;
        lock(state).refused.push((path.to_path_buf(), why));
        return None;
    }
    // Like the kubelet: the endpoint is dialed before saying "registered".
    let endpoint = if info.endpoint.is_empty() {
        path.to_path_buf()
    } else {
        PathBuf::from(&info.endpoint)
    };
    let service = match uds::connect(&endpoint).await {
        Ok(c) => c,
        Err(e) => {
            let _ = reg.notify_registration_status(refuse(e.to_string())).await;
            return None;
        }
    };
    reg.notify_registration_status(registration::RegistrationStatus {
        plugin_registered: true,
        error: String::new(),
    })
    .await
    .ok()?;
    Some(Registered {
        socket: path.to_path_buf(),
        info,
        id,
        channel: service,
    })
}

/// The node a plugin test runs on, in a [`scratch_dir`]: a ConnectX-6 Dx
/// pair ([`FixtureHost::populate_connectx6dx_pair`]) under `host/`, and
/// [`Options`] for node `node` with the kubelet dir, the state dir and the
/// CDI, device-info and memlock outputs under the same dir (no
/// network-attach requests: set `opts.paths.network_dir` for those),
/// rescanning every 100 ms. The claim store and the publisher start empty.
#[derive(Debug)]
pub struct PluginRig {
    pub root: PathBuf,
    pub fx: FixtureHost,
    pub opts: Options,
    pub claims: Arc<InMemoryClaims>,
    pub publisher: Arc<RecordingPublisher>,
    _dir: tempfile::TempDir,
}

impl PluginRig {
    pub fn new(node: &str) -> std::io::Result<PluginRig> {
        let dir = scratch_dir("kroce-dra-")?;
        let root = dir.path().to_path_buf();
        let mut fx = FixtureHost::at(&root.join("host"))?;
        fx.populate_connectx6dx_pair()?;
        let opts = Options {
            node: node.into(),
            kubelet_dir: root.join("kubelet"),
            host_root: fx.root(),
            paths: Paths {
                cdi_dir: root.join("cdi"),
                devinfo_dir: root.join("devinfo"),
                memlock_dir: Some(root.join("memlock")),
                network_dir: None,
                dev_infiniband: Some(fx.root().dev_infiniband()),
            },
            state_dir: root.join("state"),
            rescan: Duration::from_millis(100),
        };
        Ok(PluginRig {
            root,
            fx,
            opts,
            claims: Arc::default(),
            publisher: Arc::default(),
            _dir: dir,
        })
    }

    /// The plugin over the rig, no shared HCAs.
    pub async fn plugin(&self) -> Result<Plugin, String> {
        self.plugin_with(Arc::new(Sharing::default())).await
    }

    /// The plugin over the rig, sharing HCAs as `sharing` says.
    pub async fn plugin_with(&self, sharing: Arc<dyn SharingRules>) -> Result<Plugin, String> {
        Plugin::start_with(
            self.opts.clone(),
            sharing,
            self.claims.clone(),
            self.publisher.clone(),
        )
        .await
        .map_err(|e| e.to_string())
    }

    /// The kubelet stand-in and the plugin ([`Self::plugin_with`]), once
    /// the stand-in has registered the plugin.
    pub async fn registered_with(
        &self,
        sharing: Arc<dyn SharingRules>,
    ) -> Result<(KubeletDraStandIn, Plugin), String> {
        let kubelet = KubeletDraStandIn::start(&self.opts.kubelet_dir).map_err(|e| {
            format!(
                "kubelet stand-in at {}: {e}",
                self.opts.kubelet_dir.display()
            )
        })?;
        let plugin = self.plugin_with(sharing).await?;
        kubelet.wait_registered(DRIVER_NAME, 1).await?;
        Ok((kubelet, plugin))
    }

    /// [`Self::registered_with`] no shared HCAs.
    pub async fn registered(&self) -> Result<(KubeletDraStandIn, Plugin), String> {
        self.registered_with(Arc::new(Sharing::default())).await
    }

    /// Claim `default/<name>` allocated `devices` (`(request, device)`) of
    /// this node's pool with `configs`, in the claim store.
    pub fn claim(
        &self,
        name: &str,
        uid: &str,
        devices: &[(&str, &str)],
        configs: &[ConfigEntry],
    ) -> ClaimRef {
        self.claim_edited(name, uid, devices, configs, |_| {})
    }

    /// [`Self::claim`] changed by `edit` before it is stored.
    pub fn claim_edited(
        &self,
        name: &str,
        uid: &str,
        devices: &[(&str, &str)],
        configs: &[ConfigEntry],
        edit: impl FnOnce(&mut ResourceClaim),
    ) -> ClaimRef {
        let c = ClaimRef {
            namespace: "default".into(),
            name: name.into(),
            uid: uid.into(),
        };
        let mut rc = allocated_claim(&c, DRIVER_NAME, &self.opts.node, devices, configs);
        edit(&mut rc);
        self.claims.insert(rc);
        c
    }

    /// Every file in the rig's subdirs `dirs` (e.g. `["cdi", "devinfo"]`),
    /// sorted; a missing dir has none.
    pub fn files(&self, dirs: &[&str]) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for d in dirs {
            if let Ok(rd) = std::fs::read_dir(self.root.join(d)) {
                out.extend(rd.flatten().map(|e| e.path()));
            }
        }
        out.sort();
        out
    }
}

/// A temp dir on tmpfs when there is one (fixture hosts are many small files).
pub fn scratch_dir(prefix: &str) -> std::io::Result<tempfile::TempDir> {
    sriov_helpers::fixture::scratch_dir(prefix)
}

/// [`FixtureHost::many`] (`pfs` ConnectX-6 Dx PFs with `vfs` VFs each,
/// over two NUMA nodes) laid out at `dir`, e.g. a [`scratch_dir`]: the
/// bench-size host is thousands of files.
///
/// [`FixtureHost::many`]: sriov_helpers::fixture::FixtureHost::many
pub fn many_at(
    dir: &Path,
    pfs: u32,
    vfs: u32,
) -> std::io::Result<sriov_helpers::fixture::FixtureHost> {
    use sriov_helpers::fixture::{FixtureHost, PfSpec};
    let mut h = FixtureHost::at(dir)?;
    h.add_numa_node(0, "0-31")?;
    h.add_numa_node(1, "32-63")?;
    h.add_rdma_cm()?;
    for i in 0..pfs {
        let mut spec = PfSpec::connectx6dx(
            &format!("0000:{:02x}:00.0", 0x10 + i * 2),
            &format!("ens{}f0", i + 1),
            Some(i % 2),
            vfs,
        );
        spec.total_vfs = vfs.max(spec.total_vfs);
        spec.vf_offset = 1;
        h.add_pf(spec)?;
    }
    Ok(h)
}
