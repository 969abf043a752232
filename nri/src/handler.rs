//! Answers the runtime's requests on the NRI Plugin service.
//!
//! Bytes in, bytes out, no I/O besides the [`MemlockRequests`] lookup. The
//! plugin must never be the reason a container fails to start, so every
//! failure of ours (bad request file, undecodable request, ...) is logged
//! and answered with an empty adjustment rather than an error status, which
//! the runtime would turn into a failed container creation.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use prost::Message;

use crate::cni_requests::MemlockRequests;
use crate::memlock::Memlock;
use crate::network::{PodFacts, PodNetworkHook};
use crate::policy::{self, Action, ContainerFacts, Decision};
use crate::proto::{PLUGIN_SERVICE, api};
use crate::runtime::{RuntimeLimits, RuntimeLimitsError};
use crate::status::{self, CappedRequest, NoStatus, STATUS_VERSION, StatusFile, StatusSink};
use crate::ttrpc::{Reply, code};

/// Event-mask bit of an NRI event: `1 << (event - 1)`.
pub const fn event_bit(event: api::Event) -> i32 {
    1 << (event as i32 - 1)
}

/// Without network attachment we only need to see container creation.
pub const SUBSCRIBED_EVENTS: i32 = event_bit(api::Event::CreateContainer);
/// With it, the pod sandbox lifecycle too.
pub const NETWORK_EVENTS: i32 = event_bit(api::Event::RunPodSandbox)
    | event_bit(api::Event::StopPodSandbox)
    | event_bit(api::Event::RemovePodSandbox);

/// Plugin-service methods we accept and answer with an empty (default) reply
/// if the runtime sends them although we did not subscribe.
const IGNORED_METHODS: &[&str] = &[
    "RunPodSandbox",
    "UpdatePodSandbox",
    "PostUpdatePodSandbox",
    "StopPodSandbox",
    "RemovePodSandbox",
    "PostCreateContainer",
    "StartContainer",
    "PostStartContainer",
    "UpdateContainer",
    "PostUpdateContainer",
    "StopContainer",
    "RemoveContainer",
    "ValidateContainerAdjustment",
];

/// Something the session may want to know besides the reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    Configured {
        runtime_name: String,
        runtime_version: String,
    },
    /// The runtime announced it is going down; expect the connection to close.
    Shutdown,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handled {
    pub reply: Reply,
    pub notice: Option<Notice>,
}

impl Handled {
    fn reply(reply: Reply) -> Self {
        Handled {
            reply,
            notice: None,
        }
    }
}

/// The memlock plugin's request handler.
#[derive(Debug)]
pub struct Handler<R> {
    default: Memlock,
    requests: R,
    /// What is known about the runtime of the current connection, and what
    /// had to be capped; written to `sink` whenever it changes.
    state: Mutex<StatusFile>,
    sink: Box<dyn StatusSink>,
    /// VF network attachment of DRA claims at the pod lifecycle events
    /// (shared with the worker threads that run them).
    network: Option<Arc<dyn PodNetworkHook>>,
    /// The runtime's NRI request timeout from Configure, in ms (0: not said).
    request_timeout_ms: AtomicU64,
}

/// The attach (RunPodSandbox) or release (StopPodSandbox, RemovePodSandbox)
/// of one pod's DRA network: blocking work (netlink, IPAM exec, a VF lock)
/// owning all it needs, so it can run on a worker thread.
#[derive(Debug, Clone)]
pub struct PodJob {
    hook: Arc<dyn PodNetworkHook>,
    method: &'static str,
    pub facts: PodFacts,
}

impl PodJob {
    /// RunPodSandbox: its failure fails the sandbox.
    pub fn is_attach(&self) -> bool {
        self.method == "RunPodSandbox"
    }

    pub fn method(&self) -> &'static str {
        self.method
    }

    /// Runs it (blocking) and gives the reply. An attach that fails fails the
    /// sandbox (the runtime then fails it): a pod without the network its
    /// claim asked for is worse than a retried one. A release never fails:
    /// what is left is logged and retried at the next event.
    pub fn run(&self) -> (Reply, usize) {
        let facts = &self.facts;
        if self.is_attach() {
            match self.hook.attach(facts) {
                Ok(0) => (Reply::Ok(Vec::new()), 0),
                Ok(n) => {
                    tracing::info!(pod = %format!("{}/{}", facts.namespace, facts.name), attached = n, "VFs attached");
                    (Reply::Ok(Vec::new()), n)
                }
                Err(e) => {
                    tracing::error!(error = %e, "network attachment failed; the sandbox fails");
                    (Reply::error(code::INTERNAL, e.to_string()), 0)
                }
            }
        } else {
            for e in self.hook.release(facts) {
                tracing::warn!(method = self.method, sandbox = %facts.sandbox_id, error = %e, "VF not released (retried at the next pod event)");
            }
            (Reply::Ok(Vec::new()), 0)
        }
    }

    /// The sandbox's netns, opened before an attach: kept while the attach
    /// runs, so that a late attach can still be undone after the runtime
    /// removed the netns path (see [`PodJob::roll_back`]).
    pub fn hold_netns(&self) -> Option<kroce_cni::netns::Netns> {
        if !self.is_attach() {
            return None;
        }
        kroce_cni::netns::Netns::open(self.facts.netns.as_deref()?).ok()
    }

    /// Undoes an attach whose answer the runtime never got (it came after
    /// the deadline, or the connection was gone): the sandbox failed.
    /// `held`: from [`PodJob::hold_netns`].
    pub fn roll_back(&self, held: Option<&kroce_cni::netns::Netns>) {
        let facts = &self.facts;
        let errors = self.hook.roll_back(facts, held);
        if errors.is_empty() {
            tracing::warn!(sandbox = %facts.sandbox_id, pod = %format!("{}/{}", facts.namespace, facts.name), "late attachment rolled back: the runtime had already failed the sandbox");
        }
        for e in errors {
            tracing::warn!(sandbox = %facts.sandbox_id, error = %e, "late attachment not fully rolled back (retried at the next pod event)");
        }
    }
}

impl<R: MemlockRequests> Handler<R> {
    /// `default` applies to RDMA containers with no explicit request
    /// (`--default-memlock`); `requests` finds kroce-cni's per-sandbox requests.
    pub fn new(default: Memlock, requests: R) -> Self {
        Handler {
            default,
            requests,
            state: Mutex::new(StatusFile {
                version: STATUS_VERSION,
                ..Default::default()
            }),
            sink: Box::new(NoStatus),
            network: None,
            request_timeout_ms: AtomicU64::new(0),
        }
    }

    /// The runtime's NRI request timeout, when its Configure said.
    pub fn runtime_request_timeout(&self) -> Option<Duration> {
        match self.request_timeout_ms.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(Duration::from_millis(ms)),
        }
    }

    /// The pod network work a request asks for (RunPodSandbox, Stop-,
    /// RemovePodSandbox, or their StateChange form, with a pod, when network
    /// attachment is on), for the caller to run off its read loop; `None`:
    /// answer it with [`Handler::handle`].
    pub fn pod_job(&self, service: &str, method: &str, payload: &[u8]) -> Option<PodJob> {
        if service == PLUGIN_SERVICE && self.network.is_some() {
            let pod_method = match method {
                "RunPodSandbox" | "StopPodSandbox" | "RemovePodSandbox" => {
                    // All three requests are `{PodSandbox pod = 1}`.
                    match api::RunPodSandboxRequest::decode(payload) {
                        Ok(req) => req.pod.map(|p| (pod_method_name(method), p)),
                        Err(_) => None, // answered (an error) by handle
                    }
                }
                "StateChange" => api::StateChangeEvent::decode(payload)
                    .ok()
                    .and_then(|e| match e.event() {
                        api::Event::RunPodSandbox => e.pod.map(|p| ("RunPodSandbox", p)),
                        api::Event::StopPodSandbox => e.pod.map(|p| ("StopPodSandbox", p)),
                        api::Event::RemovePodSandbox => e.pod.map(|p| ("RemovePodSandbox", p)),
                        _ => None,
                    }),
                _ => None,
            };
            if let (Some((m, pod)), Some(hook)) = (pod_method, &self.network) {
                return Some(PodJob {
                    hook: hook.clone(),
                    method: m,
                    facts: PodFacts::from_nri(&pod),
                });
            }
        }
        None
    }

    /// Attaches DRA-prepared VFs at RunPodSandbox and releases them at
    /// StopPodSandbox/RemovePodSandbox through `hook`.
    pub fn with_network(mut self, hook: Box<dyn PodNetworkHook>) -> Self {
        self.network = Some(Arc::from(hook));
        self
    }

    /// The events this handler subscribes to.
    pub fn events(&self) -> i32 {
        match self.network {
            Some(_) => SUBSCRIBED_EVENTS | NETWORK_EVENTS,
            None => SUBSCRIBED_EVENTS,
        }
    }

    /// Keeps the status (runtime limits, capped requests) in `sink`.
    pub fn with_status(mut self, sink: Box<dyn StatusSink>) -> Self {
        self.sink = sink;
        self
    }

    pub fn default_memlock(&self) -> Memlock {
        self.default
    }

    /// The runtime's limits as last observed (`None`: unknown).
    pub fn runtime_limits(&self) -> Option<RuntimeLimits> {
        self.state().runtime
    }

    fn state(&self) -> MutexGuard<'_, StatusFile> {
        // Nothing can be left half-updated in a plain struct; keep going.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Writes the status; a failure is logged, never fatal.
    fn publish(&self, state: &mut StatusFile) {
        state.updated_at = status::now_unix();
        if let Err(err) = self.sink.write(state) {
            tracing::warn!(error = %err, "cannot write the status file; the node agent and doctor will not see the runtime's limits");
        }
    }

    /// A new connection: what the runtime at its other end can grant.
    /// Forgets the previous connection's runtime and capped requests.
    pub fn runtime_connected(&self, observed: Result<RuntimeLimits, RuntimeLimitsError>) {
        let mut state = self.state();
        *state = StatusFile {
            version: STATUS_VERSION,
            ..Default::default()
        };
        match observed {
            Ok(limits) => {
                if limits.can_raise() {
                    tracing::info!(
                        runtime_pid = limits.pid,
                        memlock_hard = %limits.memlock_hard,
                        "the runtime can raise RLIMIT_MEMLOCK (CAP_SYS_RESOURCE)"
                    );
                } else {
                    let why = if limits.cap_sys_resource {
                        "it runs in a user namespace"
                    } else {
                        "it lacks CAP_SYS_RESOURCE"
                    };
                    tracing::warn!(
                        runtime_pid = limits.pid,
                        memlock_hard = %limits.memlock_hard,
                        "the runtime cannot raise RLIMIT_MEMLOCK above its hard limit {} ({why}); larger requests will be capped at it. Raise the runtime's limit (systemd: LimitMEMLOCK=infinity) to grant them",
                        limits.memlock_hard
                    );
                }
                state.runtime = Some(limits);
            }
            Err(err) => {
                tracing::warn!(error = %err, "cannot read the runtime's capabilities and memlock limit; limits are sent as requested");
                state.runtime_error = Some(err.to_string());
            }
        }
        self.publish(&mut state);
    }

    /// Handles one ttrpc request.
    pub fn handle(&self, service: &str, method: &str, payload: &[u8]) -> Handled {
        if service != PLUGIN_SERVICE {
            return Handled::reply(Reply::error(
                code::UNIMPLEMENTED,
                format!("service {service:?} is not served here"),
            ));
        }
        match method {
            "Configure" => self.configure(payload),
            "Synchronize" => Handled::reply(Reply::Ok(synchronize(payload).encode_to_vec())),
            "CreateContainer" => {
                let response = match api::CreateContainerRequest::decode(payload) {
                    Ok(request) => self.create_container(&request),
                    Err(err) => {
                        tracing::error!(error = %err, "undecodable CreateContainer request; container left as is");
                        api::CreateContainerResponse::default()
                    }
                };
                Handled::reply(Reply::Ok(response.encode_to_vec()))
            }
            "Shutdown" => {
                tracing::info!("runtime is shutting down");
                Handled {
                    reply: Reply::Ok(api::Empty {}.encode_to_vec()),
                    notice: Some(Notice::Shutdown),
                }
            }
            "RunPodSandbox" | "StopPodSandbox" | "RemovePodSandbox" if self.network.is_some() => {
                // All three requests are `{PodSandbox pod = 1}`.
                match api::RunPodSandboxRequest::decode(payload) {
                    Ok(req) => Handled::reply(self.pod_event(method, req.pod.as_ref())),
                    Err(err) => Handled::reply(Reply::error(
                        code::INVALID_ARGUMENT,
                        format!("undecodable {method} request: {err}"),
                    )),
                }
            }
            "StateChange" => {
                // Older runtimes send the pod lifecycle as state changes.
                let event = api::StateChangeEvent::decode(payload).ok();
                let method = match event.as_ref().map(|e| e.event()) {
                    Some(api::Event::RunPodSandbox) => Some("RunPodSandbox"),
                    Some(api::Event::StopPodSandbox) => Some("StopPodSandbox"),
                    Some(api::Event::RemovePodSandbox) => Some("RemovePodSandbox"),
                    _ => None,
                };
                match (method, &self.network) {
                    (Some(m), Some(_)) => {
                        let pod = event.as_ref().and_then(|e| e.pod.as_ref());
                        match self.pod_event(m, pod) {
                            Reply::Ok(_) => {
                                Handled::reply(Reply::Ok(api::Empty {}.encode_to_vec()))
                            }
                            err => Handled::reply(err),
                        }
                    }
                    _ => Handled::reply(Reply::Ok(api::Empty {}.encode_to_vec())),
                }
            }
            m if IGNORED_METHODS.contains(&m) => {
                tracing::debug!(method = m, "unsubscribed event; ignored");
                // An empty payload decodes as the default of every response type.
                Handled::reply(Reply::Ok(Vec::new()))
            }
            other => Handled::reply(Reply::error(
                code::UNIMPLEMENTED,
                format!("method {other:?} of {PLUGIN_SERVICE} is not implemented"),
            )),
        }
    }

    fn configure(&self, payload: &[u8]) -> Handled {
        let (runtime_name, runtime_version) = match api::ConfigureRequest::decode(payload) {
            Ok(req) => {
                self.request_timeout_ms.store(
                    u64::try_from(req.request_timeout).unwrap_or(0),
                    Ordering::Relaxed,
                );
                (req.runtime_name, req.runtime_version)
            }
            Err(err) => {
                // Nothing in it is needed to subscribe; carry on.
                tracing::warn!(error = %err, "undecodable Configure request; subscribing anyway");
                (String::new(), String::new())
            }
        };
        tracing::info!(
            runtime = %runtime_name,
            version = %runtime_version,
            request_timeout_ms = self.request_timeout_ms.load(Ordering::Relaxed),
            dra_network = self.network.is_some(),
            "configured; subscribing to CreateContainer{}",
            if self.network.is_some() {
                ", RunPodSandbox, StopPodSandbox, RemovePodSandbox"
            } else {
                ""
            }
        );
        {
            let mut state = self.state();
            state.runtime_name.clone_from(&runtime_name);
            state.runtime_version.clone_from(&runtime_version);
            self.publish(&mut state);
        }
        let response = api::ConfigureResponse {
            events: self.events(),
            request_timeout: 0,
        };
        Handled {
            reply: Reply::Ok(response.encode_to_vec()),
            notice: Some(Notice::Configured {
                runtime_name,
                runtime_version,
            }),
        }
    }

    /// A pod lifecycle event for the network step, run here (see
    /// [`PodJob::run`]); the session runs them off its read loop instead.
    fn pod_event(&self, method: &str, pod: Option<&api::PodSandbox>) -> Reply {
        let Some(net) = &self.network else {
            return Reply::Ok(Vec::new());
        };
        let Some(pod) = pod else {
            tracing::warn!(
                method,
                "pod event without a pod; nothing to attach or release"
            );
            return Reply::Ok(Vec::new());
        };
        PodJob {
            hook: net.clone(),
            method: pod_method_name(method),
            facts: PodFacts::from_nri(pod),
        }
        .run()
        .0
    }

    /// The adjustment for a container being created. Never fails.
    pub fn create_container(
        &self,
        request: &api::CreateContainerRequest,
    ) -> api::CreateContainerResponse {
        let Some(container) = request.container.as_ref() else {
            tracing::warn!("CreateContainer without a container; nothing to adjust");
            return api::CreateContainerResponse::default();
        };
        let decision = self.decide(container, request.pod.as_ref());
        api::CreateContainerResponse {
            adjust: Some(decision.adjustment()),
            update: Vec::new(),
            evict: Vec::new(),
        }
    }

    /// The policy decision for a container, with the CNI request and the
    /// requests of the DRA claims it holds looked up, and everything logged.
    pub fn decide(&self, container: &api::Container, pod: Option<&api::PodSandbox>) -> Decision {
        let facts = ContainerFacts::from_nri(container, pod);
        let cni_request = if facts.sandbox_id.is_empty() {
            None
        } else {
            match self.requests.lookup(&facts.sandbox_id) {
                Ok(found) => found,
                Err(err) => {
                    tracing::warn!(container = %facts.id, error = %err, "memlock request file skipped");
                    None
                }
            }
        };
        let mut dra_requests = BTreeMap::new();
        for uid in &facts.dra_claims {
            match self.requests.lookup_claim(uid) {
                Ok(Some(m)) => {
                    dra_requests.insert(uid.clone(), m);
                }
                Ok(None) => {}
                Err(err) => {
                    tracing::warn!(container = %facts.id, claim = %uid, error = %err, "DRA memlock request file skipped");
                }
            }
        }
        let runtime = self.runtime_limits();
        let decision = policy::decide_for_runtime(
            &facts,
            cni_request,
            &dra_requests,
            self.default,
            runtime.as_ref(),
        );
        for warning in &decision.warnings {
            tracing::warn!(container = %facts.id, "{warning}");
        }
        let name = pod
            .filter(|p| !p.name.is_empty())
            .map(|p| format!("{}/{}", p.namespace, p.name))
            .unwrap_or_default();
        match decision.action {
            Action::Untouched => {
                tracing::debug!(container = %facts.id, pod = %name, "no RDMA devices; untouched");
            }
            Action::Set(limit) => tracing::info!(
                container = %facts.id,
                pod = %name,
                container_name = %container.name,
                memlock = %limit,
                evidence = ?decision.evidence,
                "setting RLIMIT_MEMLOCK"
            ),
            Action::Capped { requested, granted } => {
                tracing::warn!(
                    container = %facts.id,
                    pod = %name,
                    container_name = %container.name,
                    requested = %requested,
                    granted = %granted,
                    runtime_pid = runtime.map(|r| r.pid),
                    evidence = ?decision.evidence,
                    "RLIMIT_MEMLOCK capped at the runtime's hard limit {granted} (requested {requested}): the runtime cannot raise it"
                );
                let mut state = self.state();
                state.capped_count += 1;
                state.last_capped = Some(CappedRequest {
                    container: facts.id.clone(),
                    pod: name.clone(),
                    requested,
                    granted,
                    at: status::now_unix(),
                });
                self.publish(&mut state);
            }
            Action::AlreadySufficient { existing, wanted } => tracing::info!(
                container = %facts.id,
                pod = %name,
                soft = existing.soft,
                hard = existing.hard,
                wanted = %wanted,
                "RLIMIT_MEMLOCK in the spec already suffices"
            ),
        }
        decision
    }
}

fn pod_method_name(method: &str) -> &'static str {
    match method {
        "RunPodSandbox" => "RunPodSandbox",
        "StopPodSandbox" => "StopPodSandbox",
        _ => "RemovePodSandbox",
    }
}

/// Accepts the runtime's state. We keep none; echoing `more` is what the
/// runtime requires while it splits a large sync over several messages.
fn synchronize(payload: &[u8]) -> api::SynchronizeResponse {
    match api::SynchronizeRequest::decode(payload) {
        Ok(req) => {
            tracing::info!(
                pods = req.pods.len(),
                containers = req.containers.len(),
                more = req.more,
                "synchronized"
            );
            api::SynchronizeResponse {
                update: Vec::new(),
                more: req.more,
            }
        }
        Err(err) => {
            tracing::warn!(error = %err, "undecodable Synchronize request");
            api::SynchronizeResponse::default()
        }
    }
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::network::AttachError;

    fn handler() -> Handler<BTreeMap<String, Memlock>> {
        let mut requests = BTreeMap::new();
        requests.insert("sb-cni".to_owned(), Memlock::Bytes(1 << 30));
        Handler::new(Memlock::Unlimited, requests)
    }

    fn ok_payload(h: Handled) -> Vec<u8> {
        match h.reply {
            Reply::Ok(p) => p,
            Reply::Err { code, message } => panic!("error {code}: {message}"),
        }
    }

    #[test]
    fn event_mask_is_bit_three_for_create_container() {
        assert_eq!(SUBSCRIBED_EVENTS, 0b1000);
        assert_eq!(event_bit(api::Event::RunPodSandbox), 1);
        assert_eq!(event_bit(api::Event::ValidateContainerAdjustment), 1 << 13);
    }

    #[test]
    fn configure_subscribes_and_reports_runtime() {
        let req = api::ConfigureRequest {
            runtime_name: "containerd".into(),
            runtime_version: "2.1.0".into(),
            ..Default::default()
        };
        let h = handler().handle(PLUGIN_SERVICE, "Configure", &req.encode_to_vec());
        assert_eq!(
            h.notice,
            Some(Notice::Configured {
                runtime_name: "containerd".into(),
                runtime_version: "2.1.0".into()
            })
        );
        let resp = api::ConfigureResponse::decode(ok_payload(h).as_slice()).unwrap();
        assert_eq!(resp.events, 8);
    }

    #[test]
    fn synchronize_echoes_more() {
        for more in [true, false] {
            let req = api::SynchronizeRequest {
                more,
                ..Default::default()
            };
            let h = handler().handle(PLUGIN_SERVICE, "Synchronize", &req.encode_to_vec());
            let resp = api::SynchronizeResponse::decode(ok_payload(h).as_slice()).unwrap();
            assert_eq!(resp.more, more);
            assert!(resp.update.is_empty());
        }
    }

    #[test]
    fn create_container_uses_the_cni_request_of_the_sandbox() {
        let h = Handler::new(Memlock::Bytes(0), handler().requests);
        let req = api::CreateContainerRequest {
            pod: Some(api::PodSandbox {
                id: "sb-cni".into(),
                ..Default::default()
            }),
            container: Some(api::Container {
                id: "c".into(),
                pod_sandbox_id: "sb-cni".into(),
                ..Default::default()
            }),
        };
        let resp = h.create_container(&req);
        let adj = resp.adjust.unwrap();
        assert_eq!(adj.rlimits.len(), 1);
        assert_eq!(adj.rlimits[0].hard, 1 << 30);
    }

    /// Every container whose env names a claim gets the claim's request
    /// (looked up by UID), whatever its sandbox; one without it does not.
    #[test]
    fn create_container_uses_the_dra_claims_it_holds() {
        let uid = "6c1d3e0a-0000-4000-8000-000000000001";
        let mut requests = BTreeMap::new();
        requests.insert(uid.to_owned(), Memlock::Bytes(4 << 20));
        let h = Handler::new(Memlock::Unlimited, requests);
        let req = |id: &str, env: Vec<String>| api::CreateContainerRequest {
            pod: Some(api::PodSandbox {
                id: "sb-dra".into(),
                ..Default::default()
            }),
            container: Some(api::Container {
                id: id.into(),
                pod_sandbox_id: "sb-dra".into(),
                env,
                ..Default::default()
            }),
        };
        let env = vec![format!(
            "{}=default/rdma",
            kroce_contracts::dra::claim_env(uid)
        )];
        for id in ["c1", "c2"] {
            let adj = h.create_container(&req(id, env.clone())).adjust.unwrap();
            assert_eq!(adj.rlimits.len(), 1, "{id}");
            assert_eq!(
                (adj.rlimits[0].soft, adj.rlimits[0].hard),
                (4 << 20, 4 << 20)
            );
        }
        let adj = h
            .create_container(&req("sidecar", vec!["PATH=/bin".into()]))
            .adjust
            .unwrap();
        assert!(adj.rlimits.is_empty(), "holds no claim: untouched");
    }

    #[test]
    fn capped_requests_are_logged_and_recorded_in_the_status() {
        let sink = std::sync::Arc::new(crate::status::MemoryStatus::default());
        let h = handler().with_status(Box::new(sink.clone()));
        let limits = RuntimeLimits {
            pid: 4321,
            cap_sys_resource: false,
            initial_user_namespace: true,
            memlock_soft: Memlock::Bytes(8 << 20),
            memlock_hard: Memlock::Bytes(8 << 20),
        };
        h.runtime_connected(Ok(limits));
        let written = sink.last().unwrap();
        assert_eq!(written.runtime, Some(limits));
        assert_eq!(written.last_capped, None);

        let req = api::CreateContainerRequest {
            pod: Some(api::PodSandbox {
                id: "sb".into(),
                name: "rdma-app".into(),
                namespace: "default".into(),
                ..Default::default()
            }),
            container: Some(api::Container {
                id: "ctr-1".into(),
                pod_sandbox_id: "sb".into(),
                annotations: [("kroce.io/rdma-devices.rdma_vf".to_owned(), "x".to_owned())].into(),
                ..Default::default()
            }),
        };
        let adj = h.create_container(&req).adjust.unwrap();
        assert_eq!(
            (adj.rlimits[0].soft, adj.rlimits[0].hard),
            (8 << 20, 8 << 20),
            "capped at the runtime's hard limit, not unlimited"
        );
        let written = sink.last().unwrap();
        let capped = written.last_capped.unwrap();
        assert_eq!(
            (capped.container.as_str(), capped.pod.as_str()),
            ("ctr-1", "default/rdma-app")
        );
        assert_eq!(
            (capped.requested, capped.granted),
            (Memlock::Unlimited, Memlock::Bytes(8 << 20))
        );
        assert_eq!(written.capped_count, 1);

        // A new connection to a runtime that can raise: nothing capped any more.
        h.runtime_connected(Ok(RuntimeLimits {
            cap_sys_resource: true,
            ..limits
        }));
        assert_eq!(sink.last().unwrap().last_capped, None);
        let adj = h.create_container(&req).adjust.unwrap();
        assert_eq!(adj.rlimits[0].hard, u64::MAX);

        // Unknown limits: as requested, and the reason kept.
        h.runtime_connected(Err(RuntimeLimitsError::PidNotVisible));
        let written = sink.last().unwrap();
        assert_eq!(written.runtime, None);
        assert!(written.runtime_error.unwrap().contains("hostPID"));
        assert_eq!(
            h.create_container(&req).adjust.unwrap().rlimits[0].hard,
            u64::MAX
        );
    }

    #[test]
    fn undecodable_create_container_gets_an_empty_adjustment_not_an_error() {
        let h = handler().handle(PLUGIN_SERVICE, "CreateContainer", &[0xff, 0xff, 0xff]);
        let resp = api::CreateContainerResponse::decode(ok_payload(h).as_slice()).unwrap();
        assert!(resp.adjust.is_none_or(|a| a.rlimits.is_empty()));
    }

    #[test]
    fn unknown_methods_and_services_are_unimplemented() {
        let h = handler().handle(PLUGIN_SERVICE, "Frobnicate", &[]);
        assert!(
            matches!(h.reply, Reply::Err { code: code::UNIMPLEMENTED, ref message } if message.contains("Frobnicate"))
        );
        let h = handler().handle("other.Service", "Configure", &[]);
        assert!(matches!(
            h.reply,
            Reply::Err {
                code: code::UNIMPLEMENTED,
                ..
            }
        ));
        // Known but unsubscribed: an empty, successful reply.
        let h = handler().handle(PLUGIN_SERVICE, "StartContainer", &[]);
        assert_eq!(h.reply, Reply::Ok(Vec::new()));
    }

    #[derive(Debug, Default)]
    struct RecordingNetwork {
        calls: Mutex<Vec<(String, String)>>,
        fail_attach: bool,
    }

    impl PodNetworkHook for std::sync::Arc<RecordingNetwork> {
        fn attach(&self, pod: &PodFacts) -> Result<usize, AttachError> {
            self.calls
                .lock()
                .unwrap()
                .push(("attach".into(), pod.uid.clone()));
            if self.fail_attach {
                Err(AttachError::Cni {
                    pod: pod.uid.clone(),
                    device: "0000:3b:00.2".into(),
                    ifname: "net1".into(),
                    message: "boom".into(),
                    left: Vec::new(),
                })
            } else {
                Ok(1)
            }
        }

        fn release(&self, pod: &PodFacts) -> Vec<crate::network::ReleaseFailure> {
            self.calls
                .lock()
                .unwrap()
                .push(("release".into(), pod.uid.clone()));
            vec![crate::network::ReleaseFailure::HostNetns(
                std::io::Error::other("left over"),
            )]
        }
    }

    fn pod_request(uid: &str) -> Vec<u8> {
        api::RunPodSandboxRequest {
            pod: Some(api::PodSandbox {
                id: "sb".into(),
                uid: uid.into(),
                ..Default::default()
            }),
        }
        .encode_to_vec()
    }

    #[test]
    fn pod_lifecycle_goes_to_the_network_step() {
        let net = std::sync::Arc::new(RecordingNetwork::default());
        let h = handler().with_network(Box::new(net.clone()));
        let resp = api::ConfigureResponse::decode(
            ok_payload(h.handle(PLUGIN_SERVICE, "Configure", &[])).as_slice(),
        )
        .unwrap();
        assert_eq!(resp.events, SUBSCRIBED_EVENTS | NETWORK_EVENTS);
        assert_eq!(resp.events, 0b1111);
        ok_payload(h.handle(PLUGIN_SERVICE, "RunPodSandbox", &pod_request("p1")));
        // Release problems are logged, never fail Stop/Remove.
        ok_payload(h.handle(PLUGIN_SERVICE, "StopPodSandbox", &pod_request("p1")));
        ok_payload(h.handle(PLUGIN_SERVICE, "RemovePodSandbox", &pod_request("p1")));
        // The StateChange form of older runtimes.
        let ev = api::StateChangeEvent {
            event: api::Event::RunPodSandbox as i32,
            pod: Some(api::PodSandbox {
                uid: "p2".into(),
                ..Default::default()
            }),
            container: None,
        };
        ok_payload(h.handle(PLUGIN_SERVICE, "StateChange", &ev.encode_to_vec()));
        let calls: Vec<(String, String)> = net.calls.lock().unwrap().clone();
        let want: Vec<(String, String)> = [
            ("attach", "p1"),
            ("release", "p1"),
            ("release", "p1"),
            ("attach", "p2"),
        ]
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
        assert_eq!(calls, want);
    }

    #[test]
    fn a_failed_attach_fails_the_sandbox() {
        let net = std::sync::Arc::new(RecordingNetwork {
            fail_attach: true,
            ..Default::default()
        });
        let h = handler().with_network(Box::new(net.clone()));
        let r = h
            .handle(PLUGIN_SERVICE, "RunPodSandbox", &pod_request("p1"))
            .reply;
        assert!(
            matches!(&r, Reply::Err { code: code::INTERNAL, message } if message.contains("0000:3b:00.2")),
            "{r:?}"
        );
        // Without the network step the same request is ignored.
        let plain = handler();
        assert_eq!(
            plain
                .handle(PLUGIN_SERVICE, "RunPodSandbox", &pod_request("p1"))
                .reply,
            Reply::Ok(Vec::new())
        );
        let resp = api::ConfigureResponse::decode(
            ok_payload(plain.handle(PLUGIN_SERVICE, "Configure", &[])).as_slice(),
        )
        .unwrap();
        assert_eq!(resp.events, SUBSCRIBED_EVENTS);
    }

    #[test]
    fn pod_events_become_jobs_for_the_session_and_nothing_else_does() {
        let net = std::sync::Arc::new(RecordingNetwork::default());
        let h = handler().with_network(Box::new(net.clone()));
        let cfg = api::ConfigureRequest {
            request_timeout: 2000,
            ..Default::default()
        };
        ok_payload(h.handle(PLUGIN_SERVICE, "Configure", &cfg.encode_to_vec()));
        assert_eq!(
            h.runtime_request_timeout(),
            Some(std::time::Duration::from_secs(2))
        );
        let job = h
            .pod_job(PLUGIN_SERVICE, "RunPodSandbox", &pod_request("p1"))
            .unwrap();
        assert!(job.is_attach());
        assert_eq!(job.facts.uid, "p1");
        let stop = h
            .pod_job(PLUGIN_SERVICE, "StopPodSandbox", &pod_request("p1"))
            .unwrap();
        assert!(!stop.is_attach());
        let ev = api::StateChangeEvent {
            event: api::Event::RemovePodSandbox as i32,
            pod: Some(api::PodSandbox::default()),
            container: None,
        };
        let removed = h
            .pod_job(PLUGIN_SERVICE, "StateChange", &ev.encode_to_vec())
            .unwrap();
        assert_eq!(removed.method(), "RemovePodSandbox");
        // Nothing ran yet: the session runs them.
        assert!(net.calls.lock().unwrap().is_empty());
        assert_eq!(job.run(), (Reply::Ok(Vec::new()), 1));
        // Memlock answers, undecodable requests and a plugin without the
        // network step are answered by `handle`, inline.
        assert!(h.pod_job(PLUGIN_SERVICE, "CreateContainer", &[]).is_none());
        assert!(
            h.pod_job(PLUGIN_SERVICE, "RunPodSandbox", b"\xff")
                .is_none()
        );
        assert!(
            handler()
                .pod_job(PLUGIN_SERVICE, "RunPodSandbox", &pod_request("p1"))
                .is_none()
        );
    }

    #[test]
    fn shutdown_is_noticed() {
        let h = handler().handle(PLUGIN_SERVICE, "Shutdown", &[]);
        assert_eq!(h.notice, Some(Notice::Shutdown));
    }
}
