//! The cluster side, shaped like kube-rs's controller-rs: a [`Context`],
//! [`reconcile`] per `RdmaNetwork` (with a finalizer), [`error_policy`],
//! status through server-side apply, events, metrics.
//!
//! Two loops over one set of shared reflector stores ([`stores`]): the
//! network loop writes each network's attachment definitions, status and
//! admission runs; the node loop ([`node`]) is the only writer of a node's
//! `RdmaNodeState` spec and its device plugin ConfigMap key. Both plan with
//! the pure functions of [`kroce_operator::plan`] and write only what
//! differs from the store.

pub mod admission;
mod device_class;
pub mod drain;
pub mod leader;
pub mod metrics;
pub mod node;
pub mod reboot;
pub mod stores;
mod sync;
pub mod wake;

#[cfg(test)]
mod admission_tests;
#[cfg(test)]
mod loop_tests;
#[cfg(test)]
mod test_world;
#[cfg(test)]
mod tests;

use futures::StreamExt;
use kroce_operator::crd::RdmaNetwork;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Client, Resource, ResourceExt};
use metrics::Metrics;
use std::sync::Arc;
use std::time::Duration;

pub use kroce_operator::names::{FINALIZER, MANAGER};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {}", api_error_text(.0))]
    Kube(#[from] kube::Error),
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
    #[error("cannot encode the device plugin config: {0}")]
    Yaml(#[from] serde_saphyr::SerializeError),
    #[error("cannot encode {what}: {source}")]
    Json {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("admission: {0}")]
    Admission(String),
    #[error("{0}")]
    Stores(#[from] stores::StoreError),
    /// Not a failure: the reconcile waits for another loop (a deleting
    /// network for the node loop to drop its VFs).
    #[error("{0}")]
    Pending(String),
}

impl Error {
    /// Label for the failures metric.
    pub fn metric_reason(&self) -> String {
        match self {
            Error::Kube(kube::Error::Api(s)) => format!("Api{}", s.code),
            Error::Kube(_) => "Kube".into(),
            Error::Finalizer(_) => "Finalizer".into(),
            Error::Yaml(_) | Error::Json { .. } => "Encode".into(),
            Error::Admission(_) => "Admission".into(),
            Error::Stores(_) => "Stores".into(),
            Error::Pending(_) => "Pending".into(),
        }
    }
}

/// A kube error as people read it: kube's own `Display` of an API error
/// appends the whole `Status` as a Rust debug dump, which must not reach
/// events, conditions or logs.
pub fn api_error_text(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) if s.reason.is_empty() => format!("{} (HTTP {})", s.message, s.code),
        kube::Error::Api(s) => format!("{} ({}, HTTP {})", s.message, s.reason, s.code),
        other => other.to_string(),
    }
}

#[cfg(test)]
#[test]
fn api_errors_read_without_a_debug_dump() {
    let status = kube::core::Status::failure("pods \"p\" is forbidden", "Forbidden").with_code(403);
    let e = Error::Kube(kube::Error::Api(status.boxed()));
    let text = e.to_string();
    assert_eq!(
        text,
        "Kubernetes API: pods \"p\" is forbidden (Forbidden, HTTP 403)"
    );
    assert!(!text.contains("Status {"), "{text}");
}

/// What every reconcile shares.
#[derive(Clone)]
pub struct Context {
    pub client: Client,
    /// Namespace of the device plugin ConfigMap (the operator's own).
    pub namespace: String,
    /// Name of the shared device plugin ConfigMap.
    pub configmap: String,
    pub recorder: Recorder,
    /// Who publishes events (for those created without the recorder).
    pub reporter: Reporter,
    pub metrics: Arc<Metrics>,
    /// Perftest admission flags (test namespace, image, clock).
    pub admission: admission::AdmissionSettings,
    /// What the shared watches hold: every read of a reconcile.
    pub stores: stores::Stores,
    /// The cluster plan shared by concurrent network reconciles.
    pub plans: sync::SharedPlan,
}

/// The Events API refuses notes over 1 kB; keep a margin.
const MAX_EVENT_NOTE: usize = 1000;

/// `note` cut to what the Events API takes, on a character boundary.
fn event_note(mut note: String) -> String {
    if note.len() > MAX_EVENT_NOTE {
        let mut cut = MAX_EVENT_NOTE;
        while !note.is_char_boundary(cut) {
            cut -= 1;
        }
        note.truncate(cut);
    }
    note
}

#[cfg(test)]
#[test]
fn event_notes_are_cut_on_a_character_boundary() {
    assert_eq!(event_note("short".into()), "short");
    let long = "é".repeat(MAX_EVENT_NOTE); // 2 bytes each
    let cut = event_note(long);
    assert!(cut.len() <= MAX_EVENT_NOTE && cut.len() >= MAX_EVENT_NOTE - 1);
    assert!(cut.chars().all(|c| c == 'é'));
}

impl Context {
    /// Publishes an event about `regarding`; a failure is logged, never
    /// returned: events are for people, reconciling goes on without them.
    pub(crate) async fn event(
        &self,
        regarding: &k8s_openapi::api::core::v1::ObjectReference,
        type_: kube::runtime::events::EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let ev = kube::runtime::events::Event {
            type_,
            reason: reason.into(),
            note: Some(event_note(note)),
            action: action.into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&ev, regarding).await {
            tracing::warn!(error = %e, object = ?regarding.name, reason, "cannot publish event");
        }
    }

    /// [`Context::event`] for a one-off (a node's taint or label changing):
    /// created directly, not kept by the recorder, which holds every event
    /// it publishes for minutes to count repeats (at a 5,000-node rollout,
    /// 35 MiB of events that never repeat).
    pub(crate) async fn event_once(
        &self,
        regarding: &k8s_openapi::api::core::v1::ObjectReference,
        type_: kube::runtime::events::EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        use k8s_openapi::api::events::v1::Event as K8sEvent;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
        let now = k8s_openapi::jiff::Timestamp::now();
        let namespace = regarding.namespace.as_deref().unwrap_or("default");
        let ev = K8sEvent {
            action: Some(action.into()),
            reason: Some(reason.into()),
            event_time: Some(MicroTime(now)),
            regarding: Some(regarding.clone()),
            note: Some(event_note(note)),
            metadata: ObjectMeta {
                namespace: Some(namespace.to_string()),
                name: Some(format!(
                    "{}.{:x}",
                    regarding.name.as_deref().unwrap_or(MANAGER),
                    now.as_nanosecond()
                )),
                ..Default::default()
            },
            reporting_controller: Some(self.reporter.controller.clone()),
            reporting_instance: Some(
                self.reporter
                    .instance
                    .clone()
                    .unwrap_or_else(|| self.reporter.controller.clone()),
            ),
            type_: Some(
                match type_ {
                    kube::runtime::events::EventType::Normal => "Normal",
                    kube::runtime::events::EventType::Warning => "Warning",
                }
                .into(),
            ),
            ..Default::default()
        };
        let api: Api<K8sEvent> = Api::namespaced(self.client.clone(), namespace);
        if let Err(e) = api.create(&Default::default(), &ev).await {
            tracing::warn!(error = %e, object = ?regarding.name, reason, "cannot publish event");
        }
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("namespace", &self.namespace)
            .field("configmap", &self.configmap)
            .finish()
    }
}

impl Context {
    pub fn new(
        client: Client,
        namespace: &str,
        configmap: &str,
        metrics: Arc<Metrics>,
        stores: stores::Stores,
    ) -> Self {
        let reporter = Reporter {
            controller: MANAGER.into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        Context {
            recorder: Recorder::new(client.clone(), reporter.clone()),
            reporter,
            client,
            namespace: namespace.to_string(),
            configmap: configmap.to_string(),
            metrics,
            admission: admission::AdmissionSettings::default(),
            stores,
            plans: Default::default(),
        }
    }
}

pub async fn reconcile(net: Arc<RdmaNetwork>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.stores.ready().await?;
    let _timer = ctx.metrics.start();
    let api: Api<RdmaNetwork> = Api::all(ctx.client.clone());
    tracing::info!(network = %net.name_any(), "reconciling");
    finalizer(&api, FINALIZER, net, |event| async {
        match event {
            Finalizer::Apply(n) => sync::apply(&n, &ctx).await,
            Finalizer::Cleanup(n) => sync::cleanup(&n, &ctx).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)))
}

pub fn error_policy(net: Arc<RdmaNetwork>, error: &Error, ctx: Arc<Context>) -> Action {
    if let Error::Pending(why) = error {
        tracing::info!(network = %net.name_any(), "{why}");
        return Action::requeue(Duration::from_secs(2));
    }
    tracing::warn!(network = %net.name_any(), %error, "reconcile failed");
    ctx.metrics.failed(&error.metric_reason());
    Action::requeue(Duration::from_secs(30))
}

/// What of an `RdmaNetwork` the network loop acts on: its spec
/// (generation), deletion and finalizers; not its own status writes.
fn network_fingerprint(n: &RdmaNetwork) -> u64 {
    let m = n.meta();
    stores::hash_of(&(
        m.generation,
        m.deletion_timestamp.as_ref().map(|t| t.0.to_string()),
        &m.finalizers,
    ))
}

/// What of a Node the node loop plans from: its labels (and uid: a node
/// re-created under the same name owns a new state).
fn node_fingerprint(n: &k8s_openapi::api::core::v1::Node) -> u64 {
    stores::hash_of(&(&n.metadata.uid, &n.metadata.labels))
}

/// Network reconciles at once: each plans from a snapshot of every node,
/// so memory grows with this times the cluster; two keep the CPU busy.
const NETWORK_CONCURRENCY: u16 = 2;
/// Node reconciles at once: each is one node's plan and at most two writes.
const NODE_CONCURRENCY: u16 = 16;

/// Why [`run`] stopped before SIGTERM.
#[derive(Debug, thiserror::Error)]
pub enum LoopsError {
    #[error(
        "cannot list rdmanetworks.kroce.io ({}); are the CRDs installed (kroce-controller crd | kubectl apply -f -)?",
        api_error_text(.0)
    )]
    NoNetworkApi(#[source] kube::Error),
    #[error("the shared watches ended")]
    WatchesEnded,
}

/// Runs both loops until SIGTERM, over one watch per kind.
pub async fn run(ctx: Context, shared: stores::Shared) -> Result<(), LoopsError> {
    let client = ctx.client.clone();
    let networks: Api<RdmaNetwork> = Api::all(client.clone());
    if let Err(e) = networks
        .list(&kube::api::ListParams::default().limit(1))
        .await
    {
        return Err(LoopsError::NoNetworkApi(e));
    }
    let stores::Shared {
        stores,
        nodes,
        networks: [networks_a, networks_b],
        states: [states_a, states_b],
        test_pods,
        driver,
    } = shared;
    let config = kube::runtime::controller::Config::default().debounce(Duration::from_secs(1));
    let ctx = Arc::new(ctx);
    // Network loop: its own spec changes; a node state change wakes only
    // the networks that state carries; a test pod change only its network.
    let network_loop = Controller::for_shared_stream(
        stores::changed_only(networks_a, network_fingerprint),
        stores.networks.clone(),
    )
    .with_config(config.clone().concurrency(NETWORK_CONCURRENCY))
    .watches_shared_stream(states_a, {
        let wakes = Arc::new(wake::StateWakes::default());
        move |s| {
            wakes
                .networks(&s)
                .into_iter()
                .map(|n| ObjectRef::<RdmaNetwork>::new(&n))
                .collect::<Vec<_>>()
        }
    })
    .watches_shared_stream(test_pods, |p| {
        p.labels()
            .get(kroce_operator::names::ADMISSION_NETWORK_LABEL)
            .map(|n| ObjectRef::<RdmaNetwork>::new(n))
    })
    .shutdown_on_signal()
    .run(reconcile, error_policy, ctx.clone())
    .for_each(|r| async move {
        if let Err(e) = r {
            tracing::debug!(error = %e, "network loop");
        }
    });
    // Node loop: a Node event is that node; a state change is its node; a
    // network change is the nodes it selects or is on.
    let (node_store, state_store) = (stores.nodes.clone(), stores.states.clone());
    let node_loop = Controller::for_shared_stream(
        stores::changed_only(nodes, node_fingerprint),
        stores.nodes.clone(),
    )
    .with_config(config.concurrency(NODE_CONCURRENCY))
    .watches_shared_stream(
        stores::changed_only(states_b, wake::node_fingerprint),
        |s| {
            Some(ObjectRef::<k8s_openapi::api::core::v1::Node>::new(
                &s.name_any(),
            ))
        },
    )
    .watches_shared_stream(
        stores::changed_only(networks_b, network_fingerprint),
        move |net| {
            node::nodes_of_network(&net, &node_store.state(), &state_store.state())
                .into_iter()
                .map(|n| ObjectRef::<k8s_openapi::api::core::v1::Node>::new(&n))
                .collect::<Vec<_>>()
        },
    )
    .shutdown_on_signal()
    .run(node::reconcile_node, node::error_policy, ctx)
    .for_each(|r| async move {
        if let Err(e) = r {
            tracing::debug!(error = %e, "node loop");
        }
    });
    tokio::select! {
        _ = driver => Err(LoopsError::WatchesEnded),
        _ = futures::future::join(network_loop, node_loop) => Ok(()),
        // The loops' graceful shutdown would also wait out every requeue
        // still scheduled (up to 300 s): in-flight reconciles get this long.
        _ = async {
            signalled().await;
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        } => {
            tracing::info!("shutting down: requeued work left for the next leader");
            Ok(())
        }
    }
}

/// How long in-flight reconciles get after SIGTERM (the kubelet's default
/// grace period is 30 s).
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// SIGTERM (kubelet) or Ctrl-C: what `shutdown_on_signal` stops the loops
/// on, and what ends leading.
pub async fn signalled() {
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
