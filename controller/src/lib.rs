//! The cluster side, shaped like kube-rs's controller-rs: a [`Context`],
//! [`reconcile`] per `RdmaNetwork` (with a finalizer), [`error_policy`],
//! status through server-side apply, events, metrics.
//!
//! Every reconcile plans the whole cluster with the pure functions of
//! [`kroce_operator::plan`] (the benchmark shows 1,000 nodes x 4 networks is cheap)
//! and writes only what differs: node state specs, the device plugin's
//! ConfigMap, this network's attachment definitions and its status.

pub mod admission;
pub mod drain;
pub mod leader;
pub mod metrics;
mod sync;

#[cfg(test)]
mod admission_tests;
#[cfg(test)]
mod tests;

use futures::StreamExt;
use kroce_operator::crd::RdmaNetwork;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
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
    pub metrics: Arc<Metrics>,
    /// Perftest admission flags (test namespace, image, clock).
    pub admission: admission::AdmissionSettings,
}

/// The Events API refuses notes over 1 kB; keep a margin.
const MAX_EVENT_NOTE: usize = 1000;

/// Every RdmaNodeState, by name (= node name).
pub(crate) async fn list_node_states(
    ctx: &Context,
) -> Result<std::collections::BTreeMap<String, kroce_operator::crd::RdmaNodeState>, kube::Error> {
    Ok(
        Api::<kroce_operator::crd::RdmaNodeState>::all(ctx.client.clone())
            .list(&kube::api::ListParams::default())
            .await?
            .items
            .into_iter()
            .map(|s| (s.name_any(), s))
            .collect(),
    )
}

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
    pub fn new(client: Client, namespace: &str, configmap: &str, metrics: Arc<Metrics>) -> Self {
        let reporter = Reporter {
            controller: MANAGER.into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        Context {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            namespace: namespace.to_string(),
            configmap: configmap.to_string(),
            metrics,
            admission: admission::AdmissionSettings::default(),
        }
    }
}

pub async fn reconcile(net: Arc<RdmaNetwork>, ctx: Arc<Context>) -> Result<Action, Error> {
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
    tracing::warn!(network = %net.name_any(), %error, "reconcile failed");
    ctx.metrics.failed(&error.metric_reason());
    Action::requeue(Duration::from_secs(30))
}

/// Runs the controller until SIGTERM. Node and node-state changes requeue
/// every network (any of them may select the node).
pub async fn run(ctx: Context) -> anyhow::Result<()> {
    let client = ctx.client.clone();
    let networks: Api<RdmaNetwork> = Api::all(client.clone());
    if let Err(e) = networks
        .list(&kube::api::ListParams::default().limit(1))
        .await
    {
        anyhow::bail!(
            "cannot list rdmanetworks.kroce.io ({}); are the CRDs installed (kroce-operator crd | kubectl apply -f -)?",
            api_error_text(&e)
        );
    }
    let controller = Controller::new(networks, watcher::Config::default().any_semantic())
        .with_config(kube::runtime::controller::Config::default().debounce(Duration::from_secs(1)));
    let store = controller.store();
    let all = move || {
        store
            .state()
            .iter()
            .map(|n| ObjectRef::from_obj(&**n))
            .collect::<Vec<_>>()
    };
    let all2 = all.clone();
    controller
        .watches(
            Api::<k8s_openapi::api::core::v1::Node>::all(client.clone()),
            watcher::Config::default().any_semantic(),
            move |_| all(),
        )
        .watches(
            Api::<kroce_operator::crd::RdmaNodeState>::all(client.clone()),
            watcher::Config::default().any_semantic(),
            move |_| all2(),
        )
        .shutdown_on_signal()
        .run(reconcile, error_policy, Arc::new(ctx))
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "controller stream");
            }
        })
        .await;
    Ok(())
}
