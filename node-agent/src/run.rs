//! The agent's Kubernetes loop: watch this node's `RdmaNodeState`, apply it
//! when its spec changes and every `resync` (drift repair), report status
//! through server-side apply only when what it found changed (or the
//! `heartbeat` is due). Its own reports do not wake it. API errors are logged and
//! retried at the next change or resync, never fatal. [`run_with`] is the
//! loop over given host edges and a shutdown future (tests drive it on
//! fixture hosts).

use super::apply::{Agent, AgentConfig};
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
    fn list(&self) -> BoxFuture<'_, Result<Vec<PodDevices>, String>>;
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
) -> anyhow::Result<()> {
    let edges = HostEdges {
        vfs: Arc::new(SysfsVfControl::new(
            cfg.agent.root.clone(),
            cfg.vf_write_timeout,
        )),
        links: Arc::new(NetlinkLinks::new()),
        dcb: Arc::new(NetlinkDcb::new(route_socket()?)),
        record,
        netns_mode,
        reboot,
        pod_resources,
    };
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
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

/// The loop itself, over the given edges, until `shutdown` completes.
pub async fn run_with(
    client: Client,
    cfg: RunConfig,
    edges: HostEdges,
    metrics: AgentMetrics,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let api: Api<RdmaNodeState> = Api::all(client.clone());
    let HostEdges {
        vfs,
        links,
        dcb,
        record,
        netns_mode,
        reboot,
        pod_resources,
    } = edges;
    let agent_cfg = Arc::new(cfg.agent.clone());
    let wake = Arc::new(tokio::sync::Notify::new());
    let w = wake.clone();
    let wc = watcher::Config::default().fields(&format!("metadata.name={}", cfg.node_name));
    let watch_api = api.clone();
    let spec_watch = SpecWatch::default();
    let sw = spec_watch.clone();
    let _watch = AbortOnDrop(tokio::spawn(async move {
        // Backoff: a failing watch is retried in moments, not in a tight loop.
        let mut stream = watcher(watch_api, wc).default_backoff().boxed();
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(ev) => {
                    if sw.wakes(&ev) {
                        w.notify_one();
                    }
                }
                Err(e) => tracing::warn!(error = %e, "watch of RdmaNodeState"),
            }
        }
    }));
    tokio::pin!(shutdown);
    let clock = Clock::start();
    let mut checks = match cfg.checks.clone() {
        Some(c) => ChecksSlot::Idle(Box::new(c)),
        None => ChecksSlot::None,
    };
    let mut written: Option<Written> = None;
    // (IRQs pending at the last pass, the wait before the next).
    let mut irq_wait: Option<(usize, Duration)> = None;
    loop {
        let state = match api.get_opt(&cfg.node_name).await {
            Ok(Some(state)) => Some(state),
            Ok(None) => {
                tracing::info!(node = %cfg.node_name, "no RdmaNodeState yet (no RdmaNetwork selects this node)");
                None
            }
            // An API server restart must not restart every agent: try again
            // at the next change or resync.
            Err(e) => {
                tracing::warn!(node = %cfg.node_name, error = %e, "cannot read RdmaNodeState");
                None
            }
        };
        spec_watch.read(state.as_ref());
        let Some(state) = state else {
            tokio::select! {
                _ = wake.notified() => continue,
                _ = tokio::time::sleep(cfg.resync) => continue,
                _ = &mut shutdown => return Ok(()),
            }
        };
        let stored = state.status.clone().unwrap_or_default();
        // What this report is compared with: the last one written to this
        // object, else (first pass, or a new object) what it holds.
        let uid = state.metadata.uid.clone();
        let last = match &written {
            Some(w) if w.uid == uid => Some(w),
            _ => None,
        };
        let prev = last.map_or(&stored, |w| &w.status).clone();
        let holders = holders(&cfg.holders, pod_resources.as_deref()).await;
        let held = holders.clone();
        let spec = state.spec.clone();
        let (a, v, l, d, r, nm) = (
            agent_cfg.clone(),
            vfs.clone(),
            links.clone(),
            dcb.clone(),
            record.clone(),
            netns_mode.clone(),
        );
        let mut pass = tokio::task::spawn_blocking(move || {
            let agent = Agent {
                config: &a,
                vfs: &*v,
                links: &*l,
                dcb: &*d,
                record: &*r,
                netns_mode: &*nm,
            };
            agent.apply(&spec, &holders)
        });
        // A new spec whose pass takes a while (VFs appear within minutes)
        // is reported InProgress for its generation first, not left under
        // the last generation's Succeeded.
        let new_generation = prev.observed_generation != state.metadata.generation;
        let outcome = tokio::select! {
            r = &mut pass => r?,
            _ = tokio::time::sleep(cfg.progress_after), if new_generation => {
                let mut st = prev.clone();
                st.sync_state = SyncState::InProgress;
                st.observed_generation = state.metadata.generation;
                st.last_error = None;
                st.last_sync_time = Some(k8s_openapi::jiff::Timestamp::now().to_string());
                tracing::info!(generation = ?state.metadata.generation, "applying a new spec");
                if report(&api, &cfg.node_name, &st).await {
                    written = Some(Written {
                        uid: uid.clone(),
                        status: st,
                        at: tokio::time::Instant::now(),
                    });
                }
                pass.await?
            }
        };
        let last = match &written {
            Some(w) if w.uid == uid => Some(w),
            _ => None,
        };
        let prev = last.map_or(&stored, |w| &w.status).clone();
        metrics.passes.inc();
        metrics.changes.inc_by(outcome.changes.len() as u64);
        for c in &outcome.changes {
            tracing::info!(change = %c, "applied");
        }
        for (reason, message) in &outcome.problems {
            tracing::warn!(node = %cfg.node_name, %reason, "{message}");
        }
        let mut status = outcome.status;
        if status.sync_state == SyncState::Failed {
            metrics.failed.inc();
        }
        status.observed_generation = state.metadata.generation;
        let extra = checks
            .run(&state.spec, &status, clock.now_ms(), cfg.checks_timeout)
            .await;
        let kept: Vec<Condition> = prev
            .conditions
            .iter()
            .filter(|c| super::node_checks::is_check_condition(&c.type_))
            .filter(|c| match &extra {
                // The checks did not finish: all they said last time.
                None => true,
                // Congestion needs two snapshots: until then, the last word.
                Some(e) => {
                    c.type_ == kroce_admission::counters::CONDITION_TYPE
                        && !e.iter().any(|n| n.type_ == c.type_)
                }
            })
            .cloned()
            .collect();
        metrics.state.set(super::state_metrics::render(
            &cfg.node_name,
            &state.spec,
            &status,
            &held,
            &stored.admission,
        ));
        status.conditions.extend(extra.unwrap_or_default());
        status.conditions.extend(kept);
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
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        stamp_transitions(&prev.conditions, &mut status.conditions, &now);
        let heartbeat_due = last.is_none_or(|w| w.at.elapsed() >= cfg.heartbeat);
        if !same_report(&prev, &status) || heartbeat_due {
            status.last_sync_time = Some(now);
            // Not recorded as written on failure: the next pass sends it again.
            if report(&api, &cfg.node_name, &status).await {
                written = Some(Written {
                    uid,
                    status,
                    at: tokio::time::Instant::now(),
                });
            }
        }
        irq_wait = match (outcome.irqs_pending, irq_wait) {
            (0, _) => None,
            (n, Some((m, w))) if n == m => Some((n, (w * 2).min(cfg.resync))),
            (n, _) => Some((n, cfg.irq_recheck.min(cfg.resync))),
        };
        let next = irq_wait.map_or(cfg.resync, |(_, w)| w);
        tokio::select! {
            _ = wake.notified() => {}
            _ = tokio::time::sleep(next) => {}
            _ = &mut shutdown => return Ok(()),
        }
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
