//! Kubelet stand-ins for tests, the demo and the benches (feature
//! `testing`): [`KubeletStandIn`] for registration and device plugin calls,
//! [`PodResourcesStandIn`] for the PodResources API.
//!
//! [`KubeletStandIn`]: like the kubelet's device manager it serves `Registration` on
//! `<dir>/kubelet.sock`; on each registration it dials the plugin's socket,
//! asks for its options and follows its ListAndWatch stream, keeping the
//! latest device list per resource. A restart removes every file in the
//! directory (as the kubelet does) and serves again.
//!
//! Also [`scratch_dir`], a temp dir on tmpfs when there is one: fixture
//! hosts are thousands of small files, and a busy disk makes tests crawl.
//! [`veth`]: a real veth behind a fixture VF netdev, in a throwaway netns.

pub mod veth;

use crate::api::{
    self, device_plugin_client::DevicePluginClient, registration_server::Registration,
    registration_server::RegistrationServer,
};
use crate::pod_resources::api as pr;
use crate::uds;
use futures::StreamExt;
use pr::pod_resources_lister_server::{PodResourcesLister, PodResourcesListerServer};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

/// What the stand-in knows about one registered resource.
#[derive(Debug, Clone, Default)]
pub struct PluginView {
    pub endpoint: String,
    pub options: Option<api::DevicePluginOptions>,
    /// The latest ListAndWatch list; `None` until the first one arrives.
    pub devices: Option<Vec<api::Device>>,
    /// ListAndWatch messages received on the current stream.
    pub updates: usize,
    /// The stream ended (plugin stopped serving).
    pub stream_ended: bool,
}

#[derive(Debug, Default)]
struct State {
    registrations: Vec<api::RegisterRequest>,
    plugins: BTreeMap<String, PluginView>,
    followers: BTreeMap<String, JoinHandle<()>>,
    channels: BTreeMap<String, Channel>,
}

#[derive(Debug)]
struct Inner {
    dir: PathBuf,
    state: Mutex<State>,
    /// Bumped on every change, for the `wait_*` helpers.
    changed: watch::Sender<u64>,
}

impl Inner {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn bump(&self) {
        self.changed.send_modify(|n| *n += 1);
    }
}

#[derive(Debug, Clone)]
struct RegistrationService(Arc<Inner>);

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn register(
        &self,
        request: Request<api::RegisterRequest>,
    ) -> Result<Response<api::Empty>, Status> {
        let req = request.into_inner();
        if req.version != api::VERSION {
            return Err(Status::invalid_argument(format!(
                "unsupported version {:?}",
                req.version
            )));
        }
        if req.endpoint.contains('/') || req.resource_name.is_empty() {
            return Err(Status::invalid_argument("bad endpoint or resource name"));
        }
        let inner = self.0.clone();
        let resource = req.resource_name.clone();
        let endpoint = req.endpoint.clone();
        {
            let mut st = inner.state();
            st.registrations.push(req);
            if let Some(old) = st.followers.remove(&resource) {
                old.abort();
            }
            st.plugins.insert(
                resource.clone(),
                PluginView {
                    endpoint: endpoint.clone(),
                    ..Default::default()
                },
            );
        }
        // Like the kubelet: answer first, then dial the plugin.
        let follower = tokio::spawn(follow(inner.clone(), resource.clone(), endpoint));
        inner.state().followers.insert(resource, follower);
        inner.bump();
        Ok(Response::new(api::Empty {}))
    }
}

async fn follow(inner: Arc<Inner>, resource: String, endpoint: String) {
    let path = inner.dir.join(&endpoint);
    let channel = match uds::connect(&path).await {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(%resource, error = %e, "stand-in: cannot dial plugin");
            return;
        }
    };
    inner
        .state()
        .channels
        .insert(resource.clone(), channel.clone());
    let mut client = DevicePluginClient::new(channel);
    let options = client
        .get_device_plugin_options(api::Empty {})
        .await
        .map(Response::into_inner)
        .ok();
    let update = |f: &dyn Fn(&mut PluginView)| {
        if let Some(p) = inner.state().plugins.get_mut(&resource) {
            f(p);
        }
        inner.bump();
    };
    update(&|p| p.options = options);
    let mut stream = match client.list_and_watch(api::Empty {}).await {
        Ok(s) => s.into_inner(),
        Err(e) => {
            tracing::warn!(%resource, error = %e, "stand-in: ListAndWatch failed");
            update(&|p| p.stream_ended = true);
            return;
        }
    };
    while let Some(msg) = stream.next().await {
        match msg {
            Ok(m) => update(&|p| {
                p.devices = Some(m.devices.clone());
                p.updates += 1;
            }),
            Err(_) => break,
        }
    }
    update(&|p| p.stream_ended = true);
}

/// The kubelet stand-in. Drop or [`KubeletStandIn::stop`] ends it.
#[derive(Debug)]
pub struct KubeletStandIn {
    inner: Arc<Inner>,
    server: Option<Serving>,
}

impl KubeletStandIn {
    /// Serves `Registration` on `<dir>/kubelet.sock`.
    pub async fn start(dir: &Path) -> Result<KubeletStandIn, uds::UdsError> {
        let (changed, _) = watch::channel(0);
        let inner = Arc::new(Inner {
            dir: dir.to_path_buf(),
            state: Mutex::new(State::default()),
            changed,
        });
        let mut k = KubeletStandIn {
            inner,
            server: None,
        };
        k.serve()?;
        Ok(k)
    }

    fn serve(&mut self) -> Result<(), uds::UdsError> {
        let svc = RegistrationServer::new(RegistrationService(self.inner.clone()));
        self.server = Some(Serving::start(
            &self.inner.dir.join(api::KUBELET_SOCKET),
            tonic::transport::Server::builder().add_service(svc),
        )?);
        Ok(())
    }

    async fn stop_serving(&mut self) {
        if let Some(server) = self.server.take() {
            server.stop().await;
        }
        let mut st = self.inner.state();
        for (_, f) in std::mem::take(&mut st.followers) {
            f.abort();
        }
        st.channels.clear();
        st.plugins.clear();
    }

    /// A kubelet restart: drop every plugin connection, delete every file
    /// in the directory but the checkpoint, and serve again.
    pub async fn restart(&mut self) -> Result<(), uds::UdsError> {
        self.stop_serving().await;
        if let Ok(rd) = std::fs::read_dir(&self.inner.dir) {
            for e in rd.flatten() {
                if e.file_name() != crate::kubelet_checkpoint::FILE_NAME {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        self.inner.bump();
        self.serve()
    }

    /// A restart that leaves plugin sockets in place (only `kubelet.sock`
    /// is re-created): plugins must notice the new kubelet by itself.
    pub async fn restart_keeping_plugin_sockets(&mut self) -> Result<(), uds::UdsError> {
        self.stop_serving().await;
        let _ = std::fs::remove_file(self.inner.dir.join(api::KUBELET_SOCKET));
        self.inner.bump();
        self.serve()
    }

    pub async fn stop(mut self) {
        self.stop_serving().await;
        let _ = std::fs::remove_file(self.inner.dir.join(api::KUBELET_SOCKET));
    }

    pub fn registrations(&self) -> Vec<api::RegisterRequest> {
        self.inner.state().registrations.clone()
    }

    pub fn plugin(&self, resource: &str) -> Option<PluginView> {
        self.inner.state().plugins.get(resource).cloned()
    }

    /// A client on the plugin's socket, as the kubelet uses it for Allocate.
    pub fn client(&self, resource: &str) -> Option<DevicePluginClient<Channel>> {
        self.inner
            .state()
            .channels
            .get(resource)
            .cloned()
            .map(DevicePluginClient::new)
    }

    /// Waits until `check` returns `Some`, re-checking on every change and
    /// every 50 ms (for conditions outside the stand-in, like files). The
    /// error describes the last state seen.
    pub async fn wait_for<T>(
        &self,
        timeout: Duration,
        what: &str,
        check: impl Fn(&KubeletStandIn) -> Option<T>,
    ) -> Result<T, String> {
        let mut rx = self.inner.changed.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(v) = check(self) {
                return Ok(v);
            }
            if tokio::time::Instant::now() >= deadline {
                let st = self.inner.state();
                return Err(format!(
                    "timed out after {timeout:?} waiting for {what}; registrations: {:?}; plugins: {:?}",
                    st.registrations
                        .iter()
                        .map(|r| &r.resource_name)
                        .collect::<Vec<_>>(),
                    st.plugins
                ));
            }
            let _ = tokio::time::timeout(Duration::from_millis(50), rx.changed()).await;
        }
    }

    /// Waits for the `n`-th registration of `resource` (1-based).
    pub async fn wait_registered(
        &self,
        resource: &str,
        n: usize,
        timeout: Duration,
    ) -> Result<api::RegisterRequest, String> {
        self.wait_for(timeout, &format!("registration #{n} of {resource}"), |k| {
            k.registrations()
                .into_iter()
                .filter(|r| r.resource_name == resource)
                .nth(n - 1)
        })
        .await
    }

    /// Waits until the latest device list of `resource` satisfies `pred`.
    pub async fn wait_devices(
        &self,
        resource: &str,
        timeout: Duration,
        what: &str,
        pred: impl Fn(&[api::Device]) -> bool,
    ) -> Result<Vec<api::Device>, String> {
        self.wait_for(timeout, what, |k| {
            k.plugin(resource)
                .and_then(|p| p.devices)
                .filter(|d| pred(d))
        })
        .await
    }
}

impl Drop for KubeletStandIn {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            server.abort();
        }
        for (_, f) in std::mem::take(&mut self.inner.state().followers) {
            f.abort();
        }
    }
}

/// A stand-in for the kubelet's PodResources API: real gRPC
/// (`v1.PodResourcesLister`) on a unix socket, answering List and Get from
/// the pods the test says are running (as the kubelet lists only pods it
/// runs, a deleted pod leaves the answers).
#[derive(Debug)]
pub struct PodResourcesStandIn {
    pods: Arc<Mutex<BTreeMap<(String, String), pr::PodResources>>>,
    path: PathBuf,
    server: Option<Serving>,
}

#[derive(Debug, Clone)]
struct PodResourcesService(Arc<Mutex<BTreeMap<(String, String), pr::PodResources>>>);

impl PodResourcesService {
    fn pods(&self) -> MutexGuard<'_, BTreeMap<(String, String), pr::PodResources>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[tonic::async_trait]
impl PodResourcesLister for PodResourcesService {
    async fn list(
        &self,
        _: Request<pr::ListPodResourcesRequest>,
    ) -> Result<Response<pr::ListPodResourcesResponse>, Status> {
        Ok(Response::new(pr::ListPodResourcesResponse {
            pod_resources: self.pods().values().cloned().collect(),
        }))
    }

    async fn get_allocatable_resources(
        &self,
        _: Request<pr::AllocatableResourcesRequest>,
    ) -> Result<Response<pr::AllocatableResourcesResponse>, Status> {
        Ok(Response::new(pr::AllocatableResourcesResponse::default()))
    }

    /// Like the kubelet: NotFound for a pod it does not run.
    async fn get(
        &self,
        request: Request<pr::GetPodResourcesRequest>,
    ) -> Result<Response<pr::GetPodResourcesResponse>, Status> {
        let r = request.into_inner();
        match self
            .pods()
            .get(&(r.pod_namespace.clone(), r.pod_name.clone()))
        {
            Some(p) => Ok(Response::new(pr::GetPodResourcesResponse {
                pod_resources: Some(p.clone()),
            })),
            None => Err(Status::not_found(format!(
                "pod {} in namespace {} not found",
                r.pod_name, r.pod_namespace
            ))),
        }
    }
}

impl PodResourcesStandIn {
    /// Serves on `path` (its directory is created), with no pods.
    pub async fn start(path: &Path) -> Result<PodResourcesStandIn, uds::UdsError> {
        if let Some(dir) = path.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        let mut s = PodResourcesStandIn {
            pods: Arc::default(),
            path: path.to_path_buf(),
            server: None,
        };
        s.serve()?;
        Ok(s)
    }

    fn serve(&mut self) -> Result<(), uds::UdsError> {
        let svc = PodResourcesListerServer::new(PodResourcesService(self.pods.clone()));
        self.server = Some(Serving::start(
            &self.path,
            tonic::transport::Server::builder().add_service(svc),
        )?);
        Ok(())
    }

    fn pods(&self) -> MutexGuard<'_, BTreeMap<(String, String), pr::PodResources>> {
        self.pods
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A running pod (namespace `default`, one container `c`) holding
    /// `ids` of `resource`; replaces a pod of the same name.
    pub fn run_pod(&self, name: &str, resource: &str, ids: &[&str]) {
        let pod = pr::PodResources {
            name: name.into(),
            namespace: "default".into(),
            containers: vec![pr::ContainerResources {
                name: "c".into(),
                devices: vec![pr::ContainerDevices {
                    resource_name: resource.into(),
                    device_ids: ids.iter().map(|s| s.to_string()).collect(),
                    topology: None,
                }],
                ..Default::default()
            }],
        };
        self.pods().insert(("default".into(), name.into()), pod);
    }

    /// The pod is deleted: it leaves List at once.
    pub fn delete_pod(&self, name: &str) {
        self.pods()
            .remove(&("default".to_string(), name.to_string()));
    }

    /// Stops answering and removes the socket (kubelet down).
    pub async fn stop(&mut self) {
        if let Some(server) = self.server.take() {
            server.stop().await;
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Drop for PodResourcesStandIn {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            server.abort();
        }
    }
}

/// The health of one device in a list (`None` when absent).
pub fn health_of<'a>(devices: &'a [api::Device], id: &str) -> Option<&'a str> {
    devices
        .iter()
        .find(|d| d.id == id)
        .map(|d| d.health.as_str())
}

/// Moved to the fixture host builder; kept here for the plugin's tests.
pub use sriov_helpers::fixture::scratch_dir;

/// The two-port ConnectX-6 Dx host of [`FixtureHost::connectx6dx_pair`]
/// in a [`scratch_dir`]; keep the dir alive as long as the host.
///
/// [`FixtureHost::connectx6dx_pair`]: sriov_helpers::fixture::FixtureHost::connectx6dx_pair
#[cfg(test)]
pub fn connectx_pair() -> (tempfile::TempDir, sriov_helpers::fixture::FixtureHost) {
    let dir = scratch_dir("kroce-host-").unwrap();
    let mut fx = sriov_helpers::fixture::FixtureHost::at(dir.path()).unwrap();
    fx.populate_connectx6dx_pair().unwrap();
    (dir, fx)
}

/// What a test's code logged: a plain-text tracing subscriber writing into
/// memory, for tests of log lines.
#[derive(Clone, Debug, Default)]
pub struct CapturedLogs(Arc<Mutex<Vec<u8>>>);

impl CapturedLogs {
    /// A subscriber (no colour) writing here, `level` and above.
    pub fn subscriber(&self, level: tracing::Level) -> impl tracing::Subscriber + Send + Sync {
        let writer = self.clone();
        tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(level)
            .finish()
    }

    pub fn text(&self) -> String {
        let bytes = self.0.lock().map(|b| b.clone()).unwrap_or_default();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

impl std::io::Write for CapturedLogs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Ok(mut b) = self.0.lock() {
            b.extend_from_slice(buf);
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A stand-in's gRPC server on a unix socket, until told to stop.
#[derive(Debug)]
struct Serving {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Serving {
    /// Binds `path` and serves `router` on it.
    fn start(
        path: &Path,
        router: tonic::transport::server::Router,
    ) -> Result<Serving, uds::UdsError> {
        let (listener, _) = uds::bind(path)?;
        let (stop, mut stop_rx) = watch::channel(false);
        let task = tokio::spawn(async move {
            let _ = router
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async move {
                    let _ = stop_rx.wait_for(|s| *s).await;
                })
                .await;
        });
        Ok(Serving { stop, task })
    }

    /// Stops gracefully; a server still busy after 2 s is aborted.
    async fn stop(self) {
        let _ = self.stop.send(true);
        let abort = self.task.abort_handle();
        if tokio::time::timeout(Duration::from_secs(2), self.task)
            .await
            .is_err()
        {
            abort.abort();
        }
    }

    /// Stops now (from `Drop`, outside any runtime).
    fn abort(self) {
        let _ = self.stop.send(true);
        self.task.abort();
    }
}
