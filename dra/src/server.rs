//! Edge: the two gRPC services — `pluginregistration.Registration` on the
//! registration socket (what the kubelet's plugin watcher calls) and
//! `k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin` on the service socket.

use crate::api::{self, dra, registration};
use crate::claims::ClaimRef;
use crate::driver::DRIVER_NAME;
use crate::driver_state::DriverState;
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
    /// Claims one by one; a failed claim gets its error in its entry and
    /// the others go on (the kubelet retries the failed ones).
    async fn node_prepare_resources(
        &self,
        request: Request<dra::NodePrepareResourcesRequest>,
    ) -> Result<Response<dra::NodePrepareResourcesResponse>, Status> {
        let mut out = dra::NodePrepareResourcesResponse::default();
        for c in request.into_inner().claims {
            let claim = claim_ref(c);
            let entry = match self.state.prepare(&claim).await {
                Ok(devices) => dra::NodePrepareResourceResponse {
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
                },
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
        let mut out = dra::NodeUnprepareResourcesResponse::default();
        for c in request.into_inner().claims {
            let claim = claim_ref(c);
            let error = match self.state.unprepare(&claim).await {
                Ok(()) => String::new(),
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
