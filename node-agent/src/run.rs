//! The agent's Kubernetes loop: watch this node's `RdmaNodeState`, apply it
//! when its spec changes and every `resync` (drift repair), report status
//! through server-side apply only when what it found changed (or the
//! `heartbeat` is due). Its own reports do not wake it. API errors are logged and
//! retried at the next change or resync, never fatal. [`run_with`] is the
//! loop over given host edges and a shutdown future (tests drive it on
//! fixture hosts).

use super::apply::{Agent, AgentConfig, ApplyOutcome};
use super::dcb::{Dcb, NetlinkDcb, route_socket};
use super::holders::{Holder, HolderSources, NodeHolders};
use super::links::{LinkControl, NetlinkLinks};
use super::pf_record::PfRecord;
use super::vfs::{SysfsVfControl, VfControl};
use futures::StreamExt;
use futures::future::BoxFuture;
use kroce_operator::crd::conditions::stamp_transitions;
use kroce_operator::crd::{
    Condition, RdmaNodeState, RdmaNodeStateSpec, RdmaNodeStateStatus, SyncState,
};
use kube::api::{Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use std::sync::Arc;
use std::time::Duration;

pub use kroce_operator::names::AGENT_MANAGER;

#[derive(Debug, Clone)]
pub struct RunConfig {
    pub node_name: String,
    pub agent: AgentConfig,
    pub resync: Duration,
    pub vf_write_timeout: Duration,
    /// NRI, doctor and counter conditions added to each report.
    pub checks: Option<super::node_checks::NodeChecks>,
    /// The node checks of one pass may take this long; then their last
    /// conditions are kept and the pass goes on.
    pub checks_timeout: Duration,
    /// An unchanged report is written again (a new `lastSyncTime`) at the
    /// first pass this long after the last write, so a stale
    /// `lastSyncTime` means the agent is not running.
    pub heartbeat: Duration,
    /// The node's records of who holds which VF.
    pub holders: HolderSources,
    /// While some IRQs wait for their device to open, the next pass comes
    /// after this (if sooner than `resync`), to pin them soon after; the
    /// wait doubles (up to `resync`) while the same number stays pending, so
    /// VFs that no pod ever opens do not keep the agent busy.
    pub irq_recheck: Duration,
    /// A pass for a new spec generation still running after this reports
    /// `InProgress` for that generation first (VF creation can take
    /// minutes).
    pub progress_after: Duration,
}

/// Agent metrics: passes, changes made (drift repairs after the first),
/// failed passes; and the last pass's VF pool and admission gauges
/// (`state_metrics`, served as extra families).
#[derive(Debug, Default, Clone)]
pub struct AgentMetrics {
    pub passes: Counter,
    pub changes: Counter,
    pub failed: Counter,
    pub state: super::state_metrics::StateMetrics,
}

impl AgentMetrics {
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "kroce_agent_passes",
            "Apply passes run",
            self.passes.clone(),
        );
        r.register(
            "kroce_agent_changes",
            "Host changes made (first apply and drift repair)",
            self.changes.clone(),
        );
        r.register(
            "kroce_agent_failed_passes",
            "Apply passes that ended Failed",
            self.failed.clone(),
        );
    }
}

/// The devices the kubelet assigned to one container through a device
/// plugin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodDevices {
    /// `namespace/name`.
    pub pod: String,
    pub resource: String,
    pub device_ids: Vec<String>,
}

/// The kubelet's PodResources `List`, behind a trait (tests answer from
/// memory).
pub trait PodResourcesSource: Send + Sync {
    fn list(&self) -> BoxFuture<'_, Result<Vec<PodDevices>, PodResourcesListError>>;
}

/// A PodResources `List` that got no answer: the socket it went to.
#[derive(Debug, thiserror::Error)]
pub enum PodResourcesListError {
    #[error(transparent)]
    Connect(#[from] kroce_device_plugin::uds::UdsError),
    #[error("PodResources List on {} timed out after {timeout:?}", path.display())]
    Timeout {
        path: std::path::PathBuf,
        timeout: Duration,
    },
    /// The kubelet's gRPC status: its code's name and message.
    #[error("PodResources List on {}: {code}: {message}", path.display())]
    Status {
        path: std::path::PathBuf,
        code: String,
        message: String,
    },
}

/// Who holds which VF this pass: the node's records (CNI claims, DRA
/// checkpoint) and the kubelet's PodResources. Never the pods' own
/// annotations: a pod author writes those.
async fn holders(
    sources: &HolderSources,
    pod_resources: Option<&dyn PodResourcesSource>,
) -> NodeHolders {
    let src = sources.clone();
    let mut h = tokio::task::spawn_blocking(move || NodeHolders::read(&src))
        .await
        .unwrap_or_else(|e| NodeHolders {
            unknown: vec![format!("reading the node's VF claims failed: {e}")],
            ..Default::default()
        });
    if let Some(pr) = pod_resources {
        match pr.list().await {
            Ok(list) => {
                for d in list {
                    for id in &d.device_ids {
                        // VF device IDs are PCI addresses.
                        if let Ok(pci) = id.parse::<sriov_helpers::PciAddress>() {
                            h.add(
                                &pci.to_string(),
                                Holder {
                                    pod: Some(d.pod.clone()),
                                    what: format!("kubelet PodResources, {}", d.resource),
                                },
                            );
                        }
                    }
                }
            }
            Err(e) => h
                .unknown
                .push(format!("cannot read the kubelet's PodResources: {e}")),
        }
    }
    for u in &h.unknown {
        tracing::warn!(problem = %u, "VF holders unknown: every VF counts as held");
    }
    h
}

/// Status equality that ignores the sync timestamp.
fn same_report(a: &RdmaNodeStateStatus, b: &RdmaNodeStateStatus) -> bool {
    let mut a = a.clone();
    let mut b = b.clone();
    a.last_sync_time = None;
    b.last_sync_time = None;
    // Admission is the controller's (another field manager), never the agent's.
    for s in [&mut a, &mut b] {
        s.admission.clear();
        s.admission_phase = None;
    }
    a == b
}

/// The host edges the loop drives; [`run`] builds the real ones, tests
/// pass fakes over a fixture host.
#[derive(Clone)]
pub struct HostEdges {
    pub vfs: Arc<dyn VfControl>,
    pub links: Arc<dyn LinkControl>,
    pub dcb: Arc<dyn Dcb>,
    pub record: Arc<dyn PfRecord>,
    pub netns_mode: Arc<dyn crate::netns_mode::NetnsModeHost>,
    /// `None` without `--allow-host-reboot`: the agent never reboots.
    pub reboot: Option<Arc<dyn crate::reboot::HostReboot>>,
    /// `None`: no kubelet PodResources (its socket not configured).
    pub pod_resources: Option<Arc<dyn PodResourcesSource>>,
}

impl std::fmt::Debug for HostEdges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostEdges").finish_non_exhaustive()
    }
}

/// The `node-agent` loop on the real host (sysfs writes, rtnetlink, DCB
/// netlink) until SIGTERM.
pub async fn run(
    client: Client,
    cfg: RunConfig,
    record: Arc<dyn PfRecord>,
    netns_mode: Arc<dyn crate::netns_mode::NetnsModeHost>,
    reboot: Option<Arc<dyn crate::reboot::HostReboot>>,
    pod_resources: Option<Arc<dyn PodResourcesSource>>,
    metrics: AgentMetrics,
) -> Result<(), AgentRunError> {
    let edges = HostEdges {
        vfs: Arc::new(SysfsVfControl::new(
            cfg.agent.root.clone(),
            cfg.vf_write_timeout,
        )),
        links: Arc::new(NetlinkLinks::new()),
        dcb: Arc::new(NetlinkDcb::new(
            route_socket().map_err(AgentRunError::DcbSocket)?,
        )),
        record,
        netns_mode,
        reboot,
        pod_resources,
    };
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(AgentRunError::Signal)?;
    let terminated = async move {
        term.recv().await;
    };
    run_with(client, cfg, edges, metrics, terminated).await
}

/// Stops the watch task when the loop returns.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// `(metadata.uid, metadata.generation, reboot request)`: which object,
/// which spec (the API server bumps the generation on spec changes only),
/// and the controller's reboot request (an annotation: no generation bump).
type SpecKey = (Option<String>, Option<i64>, Option<String>);

/// What the watch of this node's `RdmaNodeState` wakes the loop for: an
/// object or spec other than the one the loop last read (shared: the loop
/// records what it read). Status-only updates, the agent's own reports
/// included, wake nothing: they would make every report cause one more
/// pass.
#[derive(Debug, Clone, Default)]
struct SpecWatch {
    read: Arc<std::sync::Mutex<Option<SpecKey>>>,
}

impl SpecWatch {
    fn key(o: &RdmaNodeState) -> SpecKey {
        (
            o.metadata.uid.clone(),
            o.metadata.generation,
            crate::reboot::requested(o).map(str::to_string),
        )
    }

    /// The loop read this object (`None`: there is none).
    fn read(&self, o: Option<&RdmaNodeState>) {
        if let Ok(mut r) = self.read.lock() {
            *r = o.map(Self::key);
        }
    }

    /// True when `ev` should wake the loop.
    fn wakes(&self, ev: &watcher::Event<RdmaNodeState>) -> bool {
        match ev {
            watcher::Event::Apply(o) | watcher::Event::InitApply(o) => self
                .read
                .lock()
                .map_or(true, |r| r.as_ref() != Some(&Self::key(o))),
            watcher::Event::Delete(_) => true,
            watcher::Event::Init | watcher::Event::InitDone => false,
        }
    }
}

/// Milliseconds since the epoch for counter snapshots: the wall clock at
/// start plus monotonic (tokio) time since, so rates do not jump with the
/// wall clock, and tests with paused time control them.
#[derive(Debug, Clone, Copy)]
struct Clock {
    epoch_ms: u64,
    start: tokio::time::Instant,
}

impl Clock {
    fn start() -> Self {
        Clock {
            epoch_ms: super::counters::now_ms(),
            start: tokio::time::Instant::now(),
        }
    }

    fn now_ms(&self) -> u64 {
        let since = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.epoch_ms.saturating_add(since)
    }
}

/// The node checks between passes. They scan the host, walk `/proc` and
/// run `ethtool`, so they run on the blocking pool with a timeout; a run
/// that outlives it is kept here (a thread cannot be stopped) and no new
/// one starts until it ends.
#[derive(Debug)]
enum ChecksSlot {
    None,
    Idle(Box<super::node_checks::NodeChecks>),
    Running(tokio::task::JoinHandle<(super::node_checks::NodeChecks, Vec<Condition>)>),
}

impl ChecksSlot {
    /// This pass's check conditions, `None` when the checks did not finish
    /// (the caller keeps the last reported ones).
    async fn run(
        &mut self,
        spec: &RdmaNodeStateSpec,
        status: &RdmaNodeStateStatus,
        taken_at_ms: u64,
        timeout: Duration,
    ) -> Option<Vec<Condition>> {
        let mut checks = match std::mem::replace(self, ChecksSlot::None) {
            ChecksSlot::None => return Some(Vec::new()),
            ChecksSlot::Idle(c) => *c,
            ChecksSlot::Running(h) if h.is_finished() => match h.await {
                // Its conditions are an earlier pass's: run again.
                Ok((c, _)) => c,
                Err(e) => {
                    tracing::error!(error = %e, "node checks failed; no more node conditions");
                    return Some(Vec::new());
                }
            },
            ChecksSlot::Running(h) => {
                tracing::warn!(
                    "node checks of an earlier pass still running; their conditions are kept"
                );
                *self = ChecksSlot::Running(h);
                return None;
            }
        };
        let (spec, status) = (spec.clone(), status.clone());
        let mut h = tokio::task::spawn_blocking(move || {
            let c = checks.conditions(&spec, &status, super::doctor::live_ipv4(), taken_at_ms);
            (checks, c)
        });
        match tokio::time::timeout(timeout, &mut h).await {
            Ok(Ok((c, conditions))) => {
                *self = ChecksSlot::Idle(Box::new(c));
                Some(conditions)
            }
            Ok(Err(e)) => {
                tracing::error!(error = %e, "node checks failed; no more node conditions");
                Some(Vec::new())
            }
            Err(_) => {
                tracing::error!(
                    timeout = ?timeout,
                    "node checks (host scan, /proc, ethtool) did not finish in time; their conditions are kept"
                );
                *self = ChecksSlot::Running(h);
                None
            }
        }
    }
}

/// The last report this loop wrote, to compare the next one with (not the
/// stored object: a report must not be rewritten for how the API server
/// serializes it).
#[derive(Debug)]
struct Written {
    uid: Option<String>,
    status: RdmaNodeStateStatus,
    at: tokio::time::Instant,
}

/// Writes `status` by server-side apply; whether it was written.
async fn report(api: &Api<RdmaNodeState>, node: &str, status: &RdmaNodeStateStatus) -> bool {
    let body = serde_json::json!({
        "apiVersion": "kroce.io/v1alpha1",
        "kind": "RdmaNodeState",
        "status": status,
    });
    match api
        .patch_status(
            node,
            &PatchParams::apply(AGENT_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
    {
        Ok(_) => true,
        Err(e) => {
            tracing::warn!(error = %e, "cannot report status");
            false
        }
    }
}

/// Why the agent loop stopped before its shutdown. API errors never stop
/// it: they are logged and retried at the next change or resync.
#[derive(Debug, thiserror::Error)]
pub enum AgentRunError {
    #[error("cannot open the rtnetlink socket for DCB: {0}")]
    DcbSocket(#[source] std::io::Error),
    #[error("cannot wait for SIGTERM: {0}")]
    Signal(#[source] std::io::Error),
    #[error("node {node}: the apply pass ended abnormally: {source}")]
    Pass {
        node: String,
        #[source]
        source: tokio::task::JoinError,
    },
    /// The other blocking task of a pass (the reboot request).
    #[error("a blocking task of the agent loop ended abnormally: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// The loop itself, over the given edges, until `shutdown` completes.
pub async fn run_with(
    client: Client,
    cfg: RunConfig,
    edges: HostEdges,
    metrics: AgentMetrics,
    shutdown: impl Future<Output = ()>,
) -> Result<(), AgentRunError> {
    let api: Api<RdmaNodeState> = Api::all(client.clone());
    let wake = Arc::new(tokio::sync::Notify::new());
    let spec_watch = SpecWatch::default();
    let _watch = watch_spec(
        api.clone(),
        &cfg.node_name,
        spec_watch.clone(),
        wake.clone(),
    );
    tokio::pin!(shutdown);
    let mut agent = AgentLoop::new(api, cfg, edges, metrics);
    loop {
        let state = read_state(&agent.api, &agent.cfg.node_name).await;
        spec_watch.read(state.as_ref());
        let next = match state {
            Some(state) => agent.pass(state).await?,
            None => agent.cfg.resync,
        };
        tokio::select! {
            _ = wake.notified() => {}
            _ = tokio::time::sleep(next) => {}
            _ = &mut shutdown => return Ok(()),
        }
    }
}

/// Watches this node's `RdmaNodeState` and wakes the loop for what
/// `spec_watch` says is new; stops when the guard is dropped.
fn watch_spec(
    api: Api<RdmaNodeState>,
    node: &str,
    spec_watch: SpecWatch,
    wake: Arc<tokio::sync::Notify>,
) -> AbortOnDrop {
    let wc = watcher::Config::default().fields(&format!("metadata.name={node}"));
    AbortOnDrop(tokio::spawn(async move {
        // Backoff: a failing watch is retried in moments, not in a tight loop.
        let mut stream = watcher(api, wc).default_backoff().boxed();
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(ev) => {
                    if spec_watch.wakes(&ev) {
                        wake.notify_one();
                    }
                }
                Err(e) => tracing::warn!(error = %e, "watch of RdmaNodeState"),
            }
        }
    }))
}

/// This node's `RdmaNodeState`; `None` when there is none or it cannot be
/// read.
async fn read_state(api: &Api<RdmaNodeState>, node: &str) -> Option<RdmaNodeState> {
    match api.get_opt(node).await {
        Ok(Some(state)) => Some(state),
        Ok(None) => {
            tracing::info!(node = %node, "no RdmaNodeState yet (no RdmaNetwork selects this node)");
            None
        }
        // An API server restart must not restart every agent: try again
        // at the next change or resync.
        Err(e) => {
            tracing::warn!(node = %node, error = %e, "cannot read RdmaNodeState");
            None
        }
    }
}

/// What the loop keeps from one pass to the next.
struct AgentLoop {
    api: Api<RdmaNodeState>,
    cfg: Arc<RunConfig>,
    agent_cfg: Arc<AgentConfig>,
    edges: HostEdges,
    metrics: AgentMetrics,
    clock: Clock,
    checks: ChecksSlot,
    written: Option<Written>,
    /// (IRQs pending at the last pass, the wait before the next).
    irq_wait: Option<(usize, Duration)>,
}

impl AgentLoop {
    fn new(
        api: Api<RdmaNodeState>,
        cfg: RunConfig,
        edges: HostEdges,
        metrics: AgentMetrics,
    ) -> Self {
        let checks = match cfg.checks.clone() {
            Some(c) => ChecksSlot::Idle(Box::new(c)),
            None => ChecksSlot::None,
        };
        AgentLoop {
            api,
            agent_cfg: Arc::new(cfg.agent.clone()),
            cfg: Arc::new(cfg),
            edges,
            metrics,
            clock: Clock::start(),
            checks,
            written: None,
            irq_wait: None,
        }
    }

    /// The last report written to the object `uid`.
    fn last_written(&self, uid: &Option<String>) -> Option<&Written> {
        self.written.as_ref().filter(|w| w.uid == *uid)
    }

    /// What this report is compared with: the last one written to this
    /// object, else (first pass, or a new object) what it holds.
    fn previous(&self, uid: &Option<String>, stored: &RdmaNodeStateStatus) -> RdmaNodeStateStatus {
        self.last_written(uid).map_or(stored, |w| &w.status).clone()
    }

    /// One pass over `state`: apply, add the node checks and the reboot
    /// request, report. Returns how long to wait before the next pass.
    async fn pass(&mut self, state: RdmaNodeState) -> Result<Duration, AgentRunError> {
        let (cfg, metrics) = (self.cfg.clone(), self.metrics.clone());
        let reboot = self.edges.reboot.clone();
        let stored = state.status.clone().unwrap_or_default();
        let uid = state.metadata.uid.clone();
        let holders = holders(&cfg.holders, self.edges.pod_resources.as_deref()).await;
        let held = holders.clone();
        let outcome = self.apply(&state, &stored, holders).await?;
        let prev = self.previous(&uid, &stored);
        log_outcome(&cfg.node_name, &metrics, &outcome);
        let mut status = outcome.status;
        if status.sync_state == SyncState::Failed {
            metrics.failed.inc();
        }
        status.observed_generation = state.metadata.generation;
        self.add_node_checks(&state, &stored, &prev, &held, &mut status)
            .await;
        // The controller's reboot request (--reboot-for-rdma-mode), on what
        // this pass found: asked at most once per boot.
        let requested = crate::reboot::requested(&state).map(str::to_string);
        let required = crate::reboot::reboot_required(&status.conditions);
        if requested.is_some() && required {
            let host = reboot.clone();
            let r = requested.clone();
            let asked = tokio::task::spawn_blocking(move || {
                crate::reboot::act(host.as_deref(), r.as_deref(), required)
            })
            .await?;
            if let Some(boot) = &asked.asked {
                tracing::warn!(node = %cfg.node_name, boot = %boot, "asked the host to reboot (RDMA netns mode)");
                metrics.changes.inc();
            }
            if let (Some(note), None) = (&asked.note, &asked.asked) {
                tracing::info!(node = %cfg.node_name, "reboot request: {note}");
            }
            crate::reboot::note_on(&mut status.conditions, &asked);
        }
        self.report_if_changed(uid, &prev, status).await;
        self.irq_wait = next_irq_wait(outcome.irqs_pending, self.irq_wait, &cfg);
        Ok(self.irq_wait.map_or(cfg.resync, |(_, w)| w))
    }

    /// Runs the apply pass on the blocking pool. A new spec whose pass
    /// takes a while (VFs appear within minutes) is reported InProgress for
    /// its generation first, not left under the last generation's
    /// Succeeded.
    async fn apply(
        &mut self,
        state: &RdmaNodeState,
        stored: &RdmaNodeStateStatus,
        holders: NodeHolders,
    ) -> Result<ApplyOutcome, AgentRunError> {
        let uid = state.metadata.uid.clone();
        let prev = self.previous(&uid, stored);
        let mut pass = self.spawn_pass(state.spec.clone(), holders);
        let new_generation = prev.observed_generation != state.metadata.generation;
        let finished = tokio::select! {
            r = &mut pass => r,
            _ = tokio::time::sleep(self.cfg.progress_after), if new_generation => {
                tracing::info!(generation = ?state.metadata.generation, "applying a new spec");
                self.write(uid, in_progress(&prev, state.metadata.generation)).await;
                pass.await
            }
        };
        finished.map_err(|source| AgentRunError::Pass {
            node: self.cfg.node_name.clone(),
            source,
        })
    }

    fn spawn_pass(
        &self,
        spec: RdmaNodeStateSpec,
        holders: NodeHolders,
    ) -> tokio::task::JoinHandle<ApplyOutcome> {
        let e = &self.edges;
        let (a, v, l, d, r, nm) = (
            self.agent_cfg.clone(),
            e.vfs.clone(),
            e.links.clone(),
            e.dcb.clone(),
            e.record.clone(),
            e.netns_mode.clone(),
        );
        tokio::task::spawn_blocking(move || {
            let agent = Agent {
                config: &a,
                vfs: &*v,
                links: &*l,
                dcb: &*d,
                record: &*r,
                netns_mode: &*nm,
            };
            agent.apply(&spec, &holders)
        })
    }

    /// The node checks' conditions, and those of the last report they did
    /// not replace; the pool and admission gauges of this pass.
    async fn add_node_checks(
        &mut self,
        state: &RdmaNodeState,
        stored: &RdmaNodeStateStatus,
        prev: &RdmaNodeStateStatus,
        held: &NodeHolders,
        status: &mut RdmaNodeStateStatus,
    ) {
        let extra = self
            .checks
            .run(
                &state.spec,
                status,
                self.clock.now_ms(),
                self.cfg.checks_timeout,
            )
            .await;
        let kept = kept_check_conditions(&prev.conditions, extra.as_deref());
        self.metrics.state.set(super::state_metrics::render(
            &self.cfg.node_name,
            &state.spec,
            status,
            held,
            &stored.admission,
        ));
        status.conditions.extend(extra.unwrap_or_default());
        status.conditions.extend(kept);
    }

    /// Stamps the condition transitions and writes `status` when it differs
    /// from `prev` or the heartbeat is due.
    async fn report_if_changed(
        &mut self,
        uid: Option<String>,
        prev: &RdmaNodeStateStatus,
        mut status: RdmaNodeStateStatus,
    ) {
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        stamp_transitions(&prev.conditions, &mut status.conditions, &now);
        let heartbeat_due = self
            .last_written(&uid)
            .is_none_or(|w| w.at.elapsed() >= self.cfg.heartbeat);
        if !same_report(prev, &status) || heartbeat_due {
            status.last_sync_time = Some(now);
            self.write(uid, status).await;
        }
    }

    /// Writes `status`, remembered as written only when it was: the next
    /// pass sends it again on failure.
    async fn write(&mut self, uid: Option<String>, status: RdmaNodeStateStatus) {
        if report(&self.api, &self.cfg.node_name, &status).await {
            self.written = Some(Written {
                uid,
                status,
                at: tokio::time::Instant::now(),
            });
        }
    }
}

/// Counts the pass and logs what it changed and what went wrong.
fn log_outcome(node: &str, metrics: &AgentMetrics, outcome: &ApplyOutcome) {
    metrics.passes.inc();
    metrics.changes.inc_by(outcome.changes.len() as u64);
    for c in &outcome.changes {
        tracing::info!(change = %c, "applied");
    }
    for (reason, message) in &outcome.problems {
        tracing::warn!(node = %node, %reason, "{message}");
    }
}

/// The report written while a new generation's pass still runs: the last
/// one, InProgress for that generation.
fn in_progress(prev: &RdmaNodeStateStatus, generation: Option<i64>) -> RdmaNodeStateStatus {
    let mut st = prev.clone();
    st.sync_state = SyncState::InProgress;
    st.observed_generation = generation;
    st.last_error = None;
    st.last_sync_time = Some(k8s_openapi::jiff::Timestamp::now().to_string());
    st
}

/// The node-check conditions of the last report kept in this one: all of
/// them when the checks did not finish (`extra` is `None`), else only a
/// congestion condition the checks did not give yet (it needs two
/// snapshots: until then, the last word).
fn kept_check_conditions(prev: &[Condition], extra: Option<&[Condition]>) -> Vec<Condition> {
    prev.iter()
        .filter(|c| super::node_checks::is_check_condition(&c.type_))
        .filter(|c| match extra {
            None => true,
            Some(e) => {
                c.type_ == kroce_admission::counters::CONDITION_TYPE
                    && !e.iter().any(|n| n.type_ == c.type_)
            }
        })
        .cloned()
        .collect()
}

/// The wait before the next pass while IRQs are pending: `irq_recheck`,
/// doubled (up to `resync`) while the same number stays pending.
fn next_irq_wait(
    pending: usize,
    last: Option<(usize, Duration)>,
    cfg: &RunConfig,
) -> Option<(usize, Duration)> {
    match (pending, last) {
        (0, _) => None,
        (n, Some((m, w))) if n == m => Some((n, (w * 2).min(cfg.resync))),
        (n, _) => Some((n, cfg.irq_recheck.min(cfg.resync))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_comparison_ignores_only_the_timestamp() {
        let a = RdmaNodeStateStatus {
            last_sync_time: Some("t1".into()),
            ..Default::default()
        };
        let mut b = a.clone();
        b.last_sync_time = Some("t2".into());
        assert!(same_report(&a, &b));
        b.configured_pfs = 1;
        assert!(!same_report(&a, &b));
        // The controller's admission entries are not the agent's to report.
        let mut c = a.clone();
        c.admission_phase = Some("Admitted".into());
        c.admission.push(Default::default());
        assert!(same_report(&a, &c));
    }

    /// `ethtool -S` that blocks its thread for a while, as a wedged driver does.
    struct SlowEthtool(Duration);

    impl crate::counters::EthtoolSource for SlowEthtool {
        fn stats(&self, _ifname: &str) -> Result<Option<String>, crate::counters::EthtoolError> {
            std::thread::sleep(self.0);
            Ok(None)
        }
    }

    /// Issue 11: node checks that outlive their timeout do not hold the
    /// pass (the loop keeps their last conditions), and no second run
    /// starts on top of one still going.
    #[test]
    fn node_checks_past_their_timeout_do_not_hold_the_pass() {
        use crate::node_checks::{NodeChecks, NodeChecksConfig};
        let fx = sriov_helpers::fixture::FixtureHost::connectx6dx_pair().unwrap();
        let dir = tempfile::tempdir().unwrap();
        // Per netdev: the fixture host's two PFs make a run take twice this.
        let slow = Duration::from_millis(500);
        let checks = NodeChecks::new(
            NodeChecksConfig {
                nri_socket: dir.path().join("nri.sock"),
                nri_status: dir.path().join("nri-status.json"),
                congestion: kroce_admission::counters::CongestionLimits {
                    max_pause_frames_per_sec: 1000.0,
                    max_discards_per_sec: 100.0,
                },
            },
            crate::counters::Counters {
                root: fx.root(),
                node: "n1".into(),
                scope: crate::counters::CounterScope::Pfs,
                ethtool: Arc::new(SlowEthtool(slow)),
            },
        );
        // Real time: the timeout races a real blocking thread.
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut slot = ChecksSlot::Idle(Box::new(checks));
            let (spec, status) = (RdmaNodeStateSpec::default(), RdmaNodeStateStatus::default());
            let timeout = Duration::from_millis(100);
            let t = std::time::Instant::now();
            assert!(slot.run(&spec, &status, 1, timeout).await.is_none());
            assert!(t.elapsed() < slow, "{:?}", t.elapsed());
            assert!(matches!(slot, ChecksSlot::Running(_)));
            // Still running: this pass skips them at once.
            let t = std::time::Instant::now();
            assert!(slot.run(&spec, &status, 2, timeout).await.is_none());
            assert!(t.elapsed() < Duration::from_millis(50), "{:?}", t.elapsed());
            // Once it has ended, the next pass runs them again (with a
            // timeout they can meet).
            tokio::time::sleep(slow * 4).await;
            let conditions = slot.run(&spec, &status, 3, slow * 8).await;
            let conditions = conditions.expect("the checks ran");
            assert!(
                conditions
                    .iter()
                    .any(|c| c.type_ == crate::node_checks::NRI_CONDITION),
                "{conditions:#?}"
            );
            assert!(matches!(slot, ChecksSlot::Idle(_)));
        });
    }
}
