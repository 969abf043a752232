//! Edge: the two gRPC services — `pluginregistration.Registration` on the
//! registration socket (what the kubelet's plugin watcher calls) and
//! `k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin` on the service socket.

use crate::api::{self, dra, registration};
use crate::claims::ClaimRef;
use crate::driver::DRIVER_NAME;
use crate::driver_state::DriverState;
use futures::future::join_all;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

/// The last NotifyRegistrationStatus the kubelet sent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RegistrationState {
    pub registered: bool,
    pub error: String,
    /// How many times the kubelet has notified (re-registrations count).
    pub notifications: u64,
}

#[derive(Debug, Clone)]
pub struct RegistrationService {
    endpoint: PathBuf,
    state: watch::Sender<RegistrationState>,
}

impl RegistrationService {
    /// `endpoint`: the DRA service socket, as the kubelet must dial it.
    pub fn new(endpoint: PathBuf, state: watch::Sender<RegistrationState>) -> Self {
        RegistrationService { endpoint, state }
    }
}

/// What GetInfo answers.
pub fn plugin_info(endpoint: &std::path::Path) -> registration::PluginInfo {
    registration::PluginInfo {
        r#type: api::PLUGIN_TYPE.into(),
        name: DRIVER_NAME.into(),
        endpoint: endpoint.display().to_string(),
        supported_versions: vec![api::DRA_V1_SERVICE.into()],
    }
}

#[tonic::async_trait]
impl registration::registration_server::Registration for RegistrationService {
    async fn get_info(
        &self,
        _: Request<registration::InfoRequest>,
    ) -> Result<Response<registration::PluginInfo>, Status> {
        // The first step of the kubelet's registration: seen at info so a
        // registration that goes no further is visible in the log.
        tracing::info!(driver = DRIVER_NAME, endpoint = %self.endpoint.display(), "the kubelet asked for plugin info (registration)");
        Ok(Response::new(plugin_info(&self.endpoint)))
    }

    async fn notify_registration_status(
        &self,
        request: Request<registration::RegistrationStatus>,
    ) -> Result<Response<registration::RegistrationStatusResponse>, Status> {
        let st = request.into_inner();
        if st.plugin_registered {
            tracing::info!(driver = DRIVER_NAME, "registered with the kubelet");
        } else {
            tracing::error!(driver = DRIVER_NAME, error = %st.error, "the kubelet refused the registration");
        }
        self.state.send_modify(|s| {
            s.registered = st.plugin_registered;
            s.error = st.error;
            s.notifications += 1;
        });
        Ok(Response::new(registration::RegistrationStatusResponse {}))
    }
}

#[derive(Debug, Clone)]
pub struct DraService {
    state: Arc<DriverState>,
}

impl DraService {
    pub fn new(state: Arc<DriverState>) -> Self {
        DraService { state }
    }
}

fn claim_ref(c: dra::Claim) -> ClaimRef {
    ClaimRef {
        namespace: c.namespace,
        name: c.name,
        uid: c.uid,
    }
}

#[tonic::async_trait]
impl dra::dra_plugin_server::DraPlugin for DraService {
    /// The claims of one call run in parallel (their checkpoint changes
    /// share a write); a failed claim gets its error in its entry and the
    /// others go on (the kubelet retries the failed ones).
    async fn node_prepare_resources(
        &self,
        request: Request<dra::NodePrepareResourcesRequest>,
    ) -> Result<Response<dra::NodePrepareResourcesResponse>, Status> {
        let claims = request.into_inner().claims.into_iter().map(claim_ref);
        let answers = join_all(claims.map(|claim| async move {
            let r = self.state.prepare(&claim).await;
            (claim, r)
        }))
        .await;
        let mut out = dra::NodePrepareResourcesResponse::default();
        for (claim, r) in answers {
            let entry = match r {
                Ok(devices) => {
                    let names: Vec<String> = devices
                        .iter()
                        .map(|d| format!("{}/{}", d.pool, d.device))
                        .collect();
                    tracing::info!(claim = %claim, devices = ?names, "prepared");
                    dra::NodePrepareResourceResponse {
                        devices: devices
                            .into_iter()
                            .map(|d| dra::Device {
                                request_names: d.request_names,
                                pool_name: d.pool,
                                device_name: d.device,
                                cdi_device_ids: d.cdi_device_ids,
                            })
                            .collect(),
                        error: String::new(),
                    }
                }
                Err(e) => {
                    tracing::warn!(claim = %claim, error = %e, "prepare failed");
                    dra::NodePrepareResourceResponse {
                        devices: Vec::new(),
                        error: e.to_string(),
                    }
                }
            };
            out.claims.insert(claim.uid, entry);
        }
        Ok(Response::new(out))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<dra::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<dra::NodeUnprepareResourcesResponse>, Status> {
        let claims = request.into_inner().claims.into_iter().map(claim_ref);
        let answers = join_all(claims.map(|claim| async move {
            let r = self.state.unprepare(&claim).await;
            (claim, r)
        }))
        .await;
        let mut out = dra::NodeUnprepareResourcesResponse::default();
        for (claim, r) in answers {
            let error = match r {
                Ok(()) => {
                    tracing::info!(claim = %claim, "unprepared");
                    String::new()
                }
                Err(e) => {
                    tracing::warn!(claim = %claim, error = %e, "unprepare failed");
                    e.to_string()
                }
            };
            out.claims
                .insert(claim.uid, dra::NodeUnprepareResourceResponse { error });
        }
        Ok(Response::new(out))
    }
}

/// `v1alpha1.DRAResourceHealth` on the DRA service socket: the kubelet
/// turns it into `allocatedResourcesStatus` in the pod's status. The health
/// is the one the slices carry: a device tainted unhealthy (a VF whose link
/// is down) is UNHEALTHY, every other published device HEALTHY.
#[derive(Debug, Clone)]
pub struct HealthService {
    state: Arc<DriverState>,
    resend: std::time::Duration,
}

/// The kubelet marks a device Unknown when it hears nothing about it for a
/// while (its health timeout, 30 s by default at the time of writing):
/// the full list goes out at least this often, and at once on any change.
pub const HEALTH_RESEND: std::time::Duration = std::time::Duration::from_secs(10);

impl HealthService {
    pub fn new(state: Arc<DriverState>) -> Self {
        HealthService::with_resend(state, HEALTH_RESEND)
    }

    pub fn with_resend(state: Arc<DriverState>, resend: std::time::Duration) -> Self {
        HealthService { state, resend }
    }
}

/// Pure: every published device's health, by device name.
pub fn device_health(
    inventory: &crate::driver_state::Inventory,
) -> Vec<(String, api::health::HealthStatus)> {
    inventory
        .values()
        .map(|p| {
            let unhealthy = p
                .device
                .taints
                .iter()
                .flatten()
                .any(|t| t.key == crate::slice::UNHEALTHY_TAINT);
            let h = if unhealthy {
                api::health::HealthStatus::Unhealthy
            } else {
                api::health::HealthStatus::Healthy
            };
            (p.device.name.clone(), h)
        })
        .collect()
}

fn health_response(
    node: &str,
    health: &[(String, api::health::HealthStatus)],
) -> api::health::NodeWatchResourcesResponse {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    api::health::NodeWatchResourcesResponse {
        devices: health
            .iter()
            .map(|(name, h)| api::health::DeviceHealth {
                device: Some(api::health::DeviceIdentifier {
                    pool_name: node.to_string(),
                    device_name: name.clone(),
                }),
                health: *h as i32,
                last_updated_time: now,
            })
            .collect(),
    }
}

type Health = Vec<(String, api::health::HealthStatus)>;
type HealthStream = std::pin::Pin<
    Box<dyn futures::Stream<Item = Result<api::health::NodeWatchResourcesResponse, Status>> + Send>,
>;

fn log_changes(before: Option<&Health>, now: &Health) {
    let Some(before) = before else { return };
    for (name, h) in now {
        if let Some((_, b)) = before.iter().find(|(n, _)| n == name)
            && b != h
        {
            tracing::info!(device = %name, health = h.as_str_name(), "device health changed");
        }
    }
}

#[tonic::async_trait]
impl api::health::dra_resource_health_server::DraResourceHealth for HealthService {
    type NodeWatchResourcesStream = HealthStream;

    async fn node_watch_resources(
        &self,
        _: Request<api::health::NodeWatchResourcesRequest>,
    ) -> Result<Response<HealthStream>, Status> {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let state = self.state.clone();
        let resend = self.resend;
        tracing::info!(
            driver = DRIVER_NAME,
            "the kubelet is watching device health"
        );
        tokio::spawn(async move {
            let node = state.node().to_string();
            let mut inventory = state.watch_inventory();
            let mut last: Option<Health> = None;
            loop {
                let health = device_health(&inventory.borrow_and_update());
                log_changes(last.as_ref(), &health);
                if tx.send(Ok(health_response(&node, &health))).await.is_err() {
                    return;
                }
                last = Some(health);
                // Next: a scan whose health differs, or the resend time.
                let resend_at = tokio::time::sleep(resend);
                tokio::pin!(resend_at);
                loop {
                    tokio::select! {
                        r = inventory.changed() => {
                            if r.is_err() {
                                return;
                            }
                            if last.as_ref() != Some(&device_health(&inventory.borrow())) {
                                break;
                            }
                        }
                        () = &mut resend_at => break,
                        () = tx.closed() => return,
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}
