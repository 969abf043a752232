//! The agent's Kubernetes loop: watch this node's `RdmaNodeState`, apply it
//! on change and every `resync` (drift repair), report status through
//! server-side apply, only when it changed. API errors are logged and
//! retried at the next change or resync, never fatal. [`run_with`] is the
//! loop over given host edges and a shutdown future (tests drive it on
//! fixture hosts).

use super::apply::{Agent, AgentConfig};
use super::dcb::{Dcb, NetlinkDcb, SocketTransport};
use super::holders::{NETWORK_STATUS_ANNOTATION, PodSnapshot, VfHolders};
use super::links::{LinkControl, RtnetlinkLinks};
use super::vfs::{SysfsVfControl, VfControl};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kroce_operator::crd::conditions::stamp_transitions;
use kroce_operator::crd::{RdmaNodeState, RdmaNodeStateStatus};
use kube::api::{ListParams, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
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
}

/// Agent metrics: passes, changes made (drift repairs after the first),
/// failed passes.
#[derive(Debug, Default, Clone)]
pub struct AgentMetrics {
    pub passes: Counter,
    pub changes: Counter,
    pub failed: Counter,
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

/// Holders when the pod list could not be read: every VF counts as held, so
/// nothing is pulled from under a pod we cannot see.
#[derive(Debug)]
struct Unknown(String);

impl VfHolders for Unknown {
    fn holders(&self, _vf: &str) -> Vec<String> {
        vec![format!(
            "unknown pods (cannot list pods on this node: {})",
            self.0
        )]
    }
}

async fn holders(pods: &Api<Pod>, node: &str) -> Box<dyn VfHolders> {
    let lp = ListParams::default().fields(&format!("spec.nodeName={node}"));
    match pods.list(&lp).await {
        Ok(list) => {
            let live: Vec<(String, String, String)> = list
                .items
                .iter()
                .filter(|p| {
                    !matches!(
                        p.status.as_ref().and_then(|s| s.phase.as_deref()),
                        Some("Succeeded") | Some("Failed")
                    )
                })
                .filter_map(|p| {
                    let a = p.annotations().get(NETWORK_STATUS_ANNOTATION)?;
                    Some((p.namespace().unwrap_or_default(), p.name_any(), a.clone()))
                })
                .collect();
            Box::new(PodSnapshot::from_pods(
                live.iter()
                    .map(|(n, p, a)| (n.as_str(), p.as_str(), a.as_str())),
            ))
        }
        Err(e) => Box::new(Unknown(e.to_string())),
    }
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
}

impl std::fmt::Debug for HostEdges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostEdges").finish_non_exhaustive()
    }
}

/// The `node-agent` loop on the real host (sysfs writes, rtnetlink, DCB
/// netlink) until SIGTERM.
pub async fn run(client: Client, cfg: RunConfig, metrics: AgentMetrics) -> anyhow::Result<()> {
    let edges = HostEdges {
        vfs: Arc::new(SysfsVfControl {
            root: cfg.agent.root.clone(),
            timeout: cfg.vf_write_timeout,
        }),
        links: Arc::new(RtnetlinkLinks::new()?),
        dcb: Arc::new(NetlinkDcb::new(SocketTransport::new()?)),
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

/// The loop itself, over the given edges, until `shutdown` completes.
pub async fn run_with(
    client: Client,
    cfg: RunConfig,
    edges: HostEdges,
    metrics: AgentMetrics,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let api: Api<RdmaNodeState> = Api::all(client.clone());
    let pods: Api<Pod> = Api::all(client.clone());
    let HostEdges { vfs, links, dcb } = edges;
    let agent_cfg = Arc::new(cfg.agent.clone());
    let wake = Arc::new(tokio::sync::Notify::new());
    let w = wake.clone();
    let wc = watcher::Config::default().fields(&format!("metadata.name={}", cfg.node_name));
    let watch_api = api.clone();
    let _watch = AbortOnDrop(tokio::spawn(async move {
        // Backoff: a failing watch is retried in moments, not in a tight loop.
        let mut stream = watcher(watch_api, wc).default_backoff().boxed();
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(_) => w.notify_one(),
                Err(e) => tracing::warn!(error = %e, "watch of RdmaNodeState"),
            }
        }
    }));
    tokio::pin!(shutdown);
    let mut checks = cfg.checks.clone();
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
        let Some(state) = state else {
            tokio::select! {
                _ = wake.notified() => continue,
                _ = tokio::time::sleep(cfg.resync) => continue,
                _ = &mut shutdown => return Ok(()),
            }
        };
        let prev = state.status.clone().unwrap_or_default();
        let holders = holders(&pods, &cfg.node_name).await;
        let spec = state.spec.clone();
        let managed = prev.managed_pfs.clone();
        let (a, v, l, d) = (agent_cfg.clone(), vfs.clone(), links.clone(), dcb.clone());
        let outcome = tokio::task::spawn_blocking(move || {
            let agent = Agent {
                config: &a,
                vfs: &*v,
                links: &*l,
                dcb: &*d,
            };
            agent.apply(&spec, &managed, &*holders)
        })
        .await?;
        metrics.passes.inc();
        metrics.changes.inc_by(outcome.changes.len() as u64);
        for c in &outcome.changes {
            tracing::info!(change = %c, "applied");
        }
        let mut status = outcome.status;
        if status.sync_state == kroce_operator::crd::SyncState::Failed {
            metrics.failed.inc();
        }
        status.observed_generation = state.metadata.generation;
        if let Some(c) = checks.as_mut() {
            let extra = c.conditions_now(&state.spec, &status);
            status.conditions.extend(extra);
        }
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        stamp_transitions(&prev.conditions, &mut status.conditions, &now);
        if !same_report(&prev, &status) {
            status.last_sync_time = Some(now);
            let body = serde_json::json!({
                "apiVersion": "kroce.io/v1alpha1",
                "kind": "RdmaNodeState",
                "status": status,
            });
            if let Err(e) = api
                .patch_status(
                    &cfg.node_name,
                    &PatchParams::apply(AGENT_MANAGER).force(),
                    &Patch::Apply(&body),
                )
                .await
            {
                tracing::warn!(error = %e, "cannot report status");
            }
        }
        tokio::select! {
            _ = wake.notified() => {}
            _ = tokio::time::sleep(cfg.resync) => {}
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
        assert_eq!(Unknown("x".into()).holders("0000:3b:00.2").len(), 1);
    }
}
