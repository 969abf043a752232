//! Nodes whose RDMA netns mode only a reboot applies: the node label (always)
//! and, behind `--reboot-for-rdma-mode` (off by default), rebooting them
//! within the drain's disruption budget.
//!
//! The node agent reports `RdmaNetnsModePending` with reason
//! `RebootRequired` when the kernel refuses to change the mode while pods'
//! netns exist. The node loop mirrors that as the label
//! [`NETNS_MODE_PENDING_LABEL`]`=`[`NETNS_MODE_PENDING_VALUE`] on the Node
//! ([`pending_label`]), so admins can find (and select) such nodes.
//!
//! With the flag on, each drain round also plans reboots ([`plan_reboot`],
//! pure), nodes in name order, within the same budget as drains
//! (`--drain-max-unavailable`, the networks' `spec.maxUnavailable` for the
//! networks asking for a mode), counting every unschedulable node and the
//! nodes the drain starts in the same round. A node taken is marked
//! ([`REBOOT_ANNOTATION`], [`REBOOT_STARTED_ANNOTATION`]), cordoned (unless
//! unschedulable already) and drained: every pod on it but DaemonSet and
//! static pods is evicted (policy/v1 Eviction: PodDisruptionBudgets hold).
//! Once none is left, the controller asks the agent to reboot the host out
//! of the boot the kubelet reports (`status.nodeInfo.bootID`), by
//! [`REBOOT_REQUEST_ANNOTATION`] on the node's `RdmaNodeState` (the agent
//! reads that object; it has no Node RBAC). The agent asks at most once per
//! boot (`--allow-host-reboot`). When the agent reports the mode live (the
//! condition cleared at the current spec), the marks and the request go
//! and the node is uncordoned if kroce cordoned it.
//!
//! A node not back with its mode within `--drain-timeout-seconds` of the
//! start is released (uncordoned if kroce cordoned it: a node that never
//! came back is NotReady, and tainted so, anyway), marked
//! [`REBOOT_TIMED_OUT_ANNOTATION`] with its spec generation, reported (a
//! `RebootTimedOut` event and its networks' `status.drain.timedOut`) and not
//! tried again until its spec changes.

use super::drain::{
    ALREADY_CORDONED, Budgets, CORDONED_BY_KROCE, DrainNode, DrainPolicy, HeldReport, Scope,
    governing, scope_text,
};
use super::{Context, Error};
use k8s_openapi::api::core::v1::{Node, Pod};
use kroce_operator::crd::network::DRAIN_STATUS_MAX_NAMES;
use kroce_operator::crd::{DrainStatus, RdmaNetnsModeSetting, RdmaNodeState};
pub use kroce_operator::names::{
    NETNS_MODE_PENDING_LABEL, NETNS_MODE_PENDING_VALUE, REBOOT_ANNOTATION,
    REBOOT_REQUEST_ANNOTATION, REBOOT_STARTED_ANNOTATION, REBOOT_TIMED_OUT_ANNOTATION,
};
use kube::api::{ListParams, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// The merge patch that releases a node from its reboot: the marks go,
/// uncordoned if kroce cordoned it, and on a timeout the generation it
/// timed out at.
fn release_patch(uncordon: bool, timed_out: Option<String>) -> serde_json::Value {
    let mut patch = serde_json::json!({
        "metadata": {"annotations": {
            REBOOT_ANNOTATION: null,
            REBOOT_STARTED_ANNOTATION: null,
        }}
    });
    if let Some(generation) = timed_out {
        patch["metadata"]["annotations"][REBOOT_TIMED_OUT_ANNOTATION] = generation.into();
    }
    if uncordon {
        patch["spec"] = serde_json::json!({"unschedulable": null});
    }
    patch
}

/// The value [`NETNS_MODE_PENDING_LABEL`] should have on a node with this
/// state (`None`: absent).
pub fn pending_label(state: Option<&RdmaNodeState>) -> Option<&'static str> {
    state
        .is_some_and(RdmaNodeState::netns_reboot_required)
        .then_some(NETNS_MODE_PENDING_VALUE)
}

/// Sets or removes the label where the Node differs; whether it wrote.
pub async fn write_pending_label(
    ctx: &Context,
    node: &Node,
    state: Option<&RdmaNodeState>,
) -> Result<bool, Error> {
    let want = pending_label(state);
    let have = node
        .labels()
        .get(NETNS_MODE_PENDING_LABEL)
        .map(String::as_str);
    if want == have {
        return Ok(false);
    }
    let name = node.name_any();
    let patch = serde_json::json!({"metadata": {"labels": {NETNS_MODE_PENDING_LABEL: want}}});
    Api::<Node>::all(ctx.client.clone())
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    ctx.metrics.node_writes.inc();
    let note = match want {
        Some(v) => format!(
            "labelled {NETNS_MODE_PENDING_LABEL}={v}: its RDMA netns mode applies only at the \
             next boot"
        ),
        None => format!("{NETNS_MODE_PENDING_LABEL} removed: no reboot required any more"),
    };
    super::drain::node_event(ctx, node, EventType::Normal, "RdmaNetnsModePending", note).await;
    Ok(true)
}

/// What the reboot planner sees of a node's state.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ModeReport {
    /// The report is about the current spec.
    pub current: bool,
    pub generation: Option<i64>,
    /// `RdmaNetnsModePending` / `RebootRequired`.
    pub reboot_required: bool,
    /// [`REBOOT_REQUEST_ANNOTATION`]: the boot the agent was asked to leave.
    pub requested: Option<String>,
    /// Networks asking for a mode (exclusive or shared), sorted: whose
    /// `spec.maxUnavailable` applies and whose `status.drain` reports.
    pub asking: Vec<String>,
}

impl ModeReport {
    pub fn from_state(s: &RdmaNodeState) -> ModeReport {
        let asking: BTreeSet<String> = s
            .spec
            .rdma_netns_modes
            .iter()
            .filter(|r| r.mode != RdmaNetnsModeSetting::Unmanaged)
            .map(|r| r.network.clone())
            .collect();
        ModeReport {
            current: s.reported_current(),
            generation: s.metadata.generation,
            reboot_required: s.netns_reboot_required(),
            requested: s
                .annotations()
                .get(REBOOT_REQUEST_ANNOTATION)
                .filter(|v| !v.is_empty())
                .cloned(),
            asking: asking.into_iter().collect(),
        }
    }
}

/// A node as the reboot planner sees it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RebootNode {
    pub name: String,
    pub unschedulable: bool,
    pub not_ready: bool,
    /// kroce is draining it for held VFs (`kroce.io/drain`).
    pub draining: bool,
    /// [`REBOOT_ANNOTATION`]: whether kroce cordoned it.
    pub mark: Option<String>,
    /// [`REBOOT_STARTED_ANNOTATION`] in Unix seconds.
    pub started: Option<i64>,
    /// [`REBOOT_TIMED_OUT_ANNOTATION`]: the generation it gave up at.
    pub timed_out: Option<i64>,
    /// The kubelet's `status.nodeInfo.bootID`.
    pub boot_id: Option<String>,
    /// Networks its state carries (budget scopes).
    pub networks: Vec<String>,
    pub state: Option<ModeReport>,
}

impl RebootNode {
    pub fn of(n: &Node, state: Option<&RdmaNodeState>) -> RebootNode {
        let d = super::drain::drain_node(n, state);
        let annotation = |k: &str| n.annotations().get(k).cloned();
        RebootNode {
            name: d.name,
            unschedulable: d.unschedulable,
            not_ready: d.not_ready,
            draining: d.mark.is_some(),
            mark: annotation(REBOOT_ANNOTATION),
            started: annotation(REBOOT_STARTED_ANNOTATION)
                .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
                .map(|t| t.as_second()),
            timed_out: annotation(REBOOT_TIMED_OUT_ANNOTATION).and_then(|g| g.parse().ok()),
            boot_id: n
                .status
                .as_ref()
                .and_then(|s| s.node_info.as_ref())
                .map(|i| i.boot_id.clone())
                .filter(|b| !b.is_empty()),
            networks: d.networks,
            state: state.map(ModeReport::from_state),
        }
    }

    /// As the drain's budgets count it; `busy`: unavailable for a reason
    /// the node fields do not show (the drain started it this round).
    fn budget_view(&self, busy: bool) -> DrainNode {
        DrainNode {
            name: self.name.clone(),
            unschedulable: self.unschedulable,
            not_ready: self.not_ready,
            mark: (busy || self.draining || self.mark.is_some()).then(|| "busy".to_string()),
            networks: self.networks.clone(),
            state: self.state.as_ref().map(|s| HeldReport {
                needed_by: s.asking.clone(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RebootAction {
    /// Mark the node (cordoning it if `cordon`), then as [`RebootAction::Drain`].
    Start {
        node: String,
        cordon: bool,
        boot_id: String,
    },
    /// Evict what still runs on the node; once nothing is left, ask its
    /// agent to reboot out of `boot_id`. `stamp`: no readable start time.
    Drain {
        node: String,
        boot_id: String,
        stamp: bool,
    },
    /// Done (or abandoned): drop the marks and the request; uncordon if
    /// `uncordon`.
    Finish {
        node: String,
        uncordon: bool,
        why: String,
    },
    /// Not back with its mode in time: released, `generation` recorded.
    TimedOut {
        node: String,
        uncordon: bool,
        generation: Option<i64>,
        waited: Duration,
        /// Where it got to, for the event.
        stage: String,
    },
    /// Drop a [`REBOOT_TIMED_OUT_ANNOTATION`] that no longer applies.
    Forget { node: String },
    /// Nothing to do now; `why` says so.
    Wait { node: String, why: String },
}

impl RebootAction {
    pub fn node(&self) -> &str {
        match self {
            RebootAction::Start { node, .. }
            | RebootAction::Drain { node, .. }
            | RebootAction::Finish { node, .. }
            | RebootAction::TimedOut { node, .. }
            | RebootAction::Forget { node }
            | RebootAction::Wait { node, .. } => node,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RebootPlan {
    pub actions: Vec<RebootAction>,
    /// Per network asking for a mode: rebooting, waiting and timed-out
    /// nodes, merged into its `status.drain`.
    pub status: BTreeMap<String, DrainStatus>,
}

#[derive(Default)]
struct Tally {
    rebooting: BTreeSet<String>,
    waiting: usize,
    timed_out: BTreeSet<String>,
}

/// Decides, for every node, what the reboot does this round at `now`
/// (Unix seconds). `enabled`: `--reboot-for-rdma-mode`; `policy`: the
/// drain's budgets and timeout; `drain_started`: nodes the drain starts
/// this round (unavailable from now, though the stores do not show it).
pub fn plan_reboot(
    nodes: &[RebootNode],
    enabled: bool,
    policy: &DrainPolicy,
    drain_started: &BTreeSet<String>,
    now: i64,
) -> RebootPlan {
    let mut sorted: Vec<&RebootNode> = nodes.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    let views: Vec<DrainNode> = sorted
        .iter()
        .map(|n| n.budget_view(drain_started.contains(&n.name)))
        .collect();
    let view_refs: Vec<&DrainNode> = views.iter().collect();
    let mut budgets = Budgets::new(&view_refs, policy);
    let timeout = i64::try_from(policy.timeout.as_secs()).unwrap_or(i64::MAX);
    let mut actions = Vec::new();
    let mut tally: BTreeMap<String, Tally> = BTreeMap::new();
    let asking = |n: &RebootNode| -> Vec<String> {
        n.state
            .as_ref()
            .map(|s| s.asking.clone())
            .unwrap_or_default()
    };
    for (n, view) in sorted.iter().zip(&views) {
        let Some(mark) = &n.mark else { continue };
        let uncordon = mark == CORDONED_BY_KROCE;
        let finish = |why: &str| RebootAction::Finish {
            node: n.name.clone(),
            uncordon,
            why: why.to_string(),
        };
        let action = match &n.state {
            _ if !enabled => finish("rebooting is off (--reboot-for-rdma-mode=false)"),
            None => finish("the node has no RdmaNodeState any more"),
            Some(s) if s.current && !s.reboot_required => {
                finish("its agent reports the RDMA netns mode live")
            }
            Some(s) => {
                let rebooted = s.requested.is_some() && s.requested != n.boot_id;
                if let Some(started) = n.started
                    && now.saturating_sub(started) >= timeout
                {
                    for net in asking(n) {
                        tally
                            .entry(net)
                            .or_default()
                            .timed_out
                            .insert(n.name.clone());
                    }
                    let stage = match (&s.requested, rebooted) {
                        (None, _) => "still draining (pods left)",
                        (Some(_), false) => "asked to reboot, not rebooted",
                        (Some(_), true) => "rebooted, the mode not reported live",
                    };
                    RebootAction::TimedOut {
                        node: n.name.clone(),
                        uncordon,
                        generation: s.generation,
                        waited: Duration::from_secs(
                            u64::try_from(now.saturating_sub(started)).unwrap_or(0),
                        ),
                        stage: stage.into(),
                    }
                } else {
                    for net in asking(n) {
                        tally
                            .entry(net)
                            .or_default()
                            .rebooting
                            .insert(n.name.clone());
                    }
                    let wait = |why: String| RebootAction::Wait {
                        node: n.name.clone(),
                        why,
                    };
                    let stamp = n.started.is_none();
                    match (&s.requested, &n.boot_id) {
                        (Some(r), _) if rebooted => wait(format!(
                            "rebooted out of boot {r}: waiting for its agent to report the mode"
                        )),
                        (Some(r), _) => wait(format!("reboot asked (boot {r}): waiting for it")),
                        (None, Some(b)) => RebootAction::Drain {
                            node: n.name.clone(),
                            boot_id: b.clone(),
                            stamp,
                        },
                        (None, None) => wait("its kubelet reports no bootID".into()),
                    }
                }
            }
        };
        let released = matches!(
            action,
            RebootAction::Finish { .. } | RebootAction::TimedOut { .. }
        );
        actions.push(action);
        if released {
            let after = DrainNode {
                mark: (n.draining || drain_started.contains(&n.name)).then(|| "busy".into()),
                unschedulable: n.unschedulable && !uncordon,
                ..view.clone()
            };
            if !after.unavailable() {
                budgets.add(view, policy, -1);
            }
        }
    }
    for (n, view) in sorted.iter().zip(&views) {
        if n.mark.is_some() {
            continue;
        }
        let Some(s) = &n.state else { continue };
        if !s.current {
            continue;
        }
        if !s.reboot_required {
            if n.timed_out.is_some() {
                actions.push(RebootAction::Forget {
                    node: n.name.clone(),
                });
            }
            continue;
        }
        if !enabled {
            continue;
        }
        let wait = |why: String| RebootAction::Wait {
            node: n.name.clone(),
            why,
        };
        if n.timed_out.is_some() && n.timed_out == s.generation {
            for net in &s.asking {
                tally
                    .entry(net.clone())
                    .or_default()
                    .timed_out
                    .insert(n.name.clone());
            }
            actions.push(wait(format!(
                "its reboot timed out at generation {}: skipped until the spec changes (or \
                 {REBOOT_TIMED_OUT_ANNOTATION} is removed)",
                s.generation.unwrap_or_default()
            )));
            continue;
        }
        if n.draining || drain_started.contains(&n.name) {
            actions.push(wait("being drained for held VFs first".into()));
            continue;
        }
        let Some(boot_id) = &n.boot_id else {
            actions.push(wait("its kubelet reports no bootID".into()));
            continue;
        };
        let gov = governing(view, policy);
        // Out of service already: rebooting it makes nothing less available.
        let full = if view.unavailable() {
            None
        } else {
            budgets.full(&gov)
        };
        if let Some(scope) = full {
            for net in &s.asking {
                tally.entry(net.clone()).or_default().waiting += 1;
            }
            actions.push(wait(format!(
                "disruption budget full: {} of {} nodes unavailable ({})",
                budgets.used(scope),
                budgets.limit(scope),
                scope_text(scope, policy)
            )));
            continue;
        }
        if !view.unavailable() {
            budgets.add(view, policy, 1);
        }
        for net in &s.asking {
            tally
                .entry(net.clone())
                .or_default()
                .rebooting
                .insert(n.name.clone());
        }
        actions.push(RebootAction::Start {
            node: n.name.clone(),
            cordon: !n.unschedulable,
            boot_id: boot_id.clone(),
        });
    }
    let status = tally
        .into_iter()
        .map(|(net, t)| {
            let scope = if policy.overrides.contains_key(&net) {
                Scope::Network(net.clone())
            } else {
                Scope::Global
            };
            let names =
                |set: &BTreeSet<String>| set.iter().take(DRAIN_STATUS_MAX_NAMES).cloned().collect();
            let st = DrainStatus {
                max_unavailable: budgets.limit(&scope).try_into().unwrap_or(u32::MAX),
                unavailable_nodes: budgets.used(&scope).try_into().unwrap_or(u32::MAX),
                draining_nodes: t.rebooting.len().try_into().unwrap_or(u32::MAX),
                waiting_nodes: t.waiting.try_into().unwrap_or(u32::MAX),
                timed_out_nodes: t.timed_out.len().try_into().unwrap_or(u32::MAX),
                draining: names(&t.rebooting),
                timed_out: names(&t.timed_out),
            };
            (net, st)
        })
        .collect();
    RebootPlan { actions, status }
}

/// `reboot`'s per-network status folded into the drain's: counts added,
/// names joined (sorted, once each, within the cap); the budget numbers of
/// the later round (the reboot's, which counts the drain's starts) win.
pub fn merge_status(
    drain: &mut BTreeMap<String, DrainStatus>,
    reboot: BTreeMap<String, DrainStatus>,
) {
    for (net, r) in reboot {
        let Some(d) = drain.get_mut(&net) else {
            drain.insert(net, r);
            continue;
        };
        let join = |a: &[String], b: &[String]| -> Vec<String> {
            let set: BTreeSet<&String> = a.iter().chain(b).collect();
            set.into_iter()
                .take(DRAIN_STATUS_MAX_NAMES)
                .cloned()
                .collect()
        };
        d.max_unavailable = r.max_unavailable;
        d.unavailable_nodes = d.unavailable_nodes.max(r.unavailable_nodes);
        d.draining_nodes = d.draining_nodes.saturating_add(r.draining_nodes);
        d.waiting_nodes = d.waiting_nodes.saturating_add(r.waiting_nodes);
        d.timed_out_nodes = d.timed_out_nodes.saturating_add(r.timed_out_nodes);
        d.draining = join(&d.draining, &r.draining);
        d.timed_out = join(&d.timed_out, &r.timed_out);
    }
}

/// Whether a pod goes before a reboot: not a DaemonSet's (it would come
/// back at once, and the agent is one), not a static (mirror) pod, not
/// finished. Terminating pods count: the reboot waits for them.
pub fn evictable(p: &Pod) -> bool {
    let daemon = p
        .owner_references()
        .iter()
        .any(|o| o.kind == "DaemonSet" && o.controller == Some(true));
    let mirror = p.annotations().contains_key("kubernetes.io/config.mirror");
    let done = p
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|ph| ph == "Succeeded" || ph == "Failed");
    !(daemon || mirror || done)
}

/// Pods that must leave `node` before it reboots, `namespace/name`, and
/// of them those not terminating yet (to evict).
async fn pods_on(ctx: &Context, node: &str) -> Result<(Vec<String>, Vec<String>), kube::Error> {
    let api: Api<Pod> = Api::all(ctx.client.clone());
    let pods = api
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await?;
    let mut left = Vec::new();
    let mut evict = Vec::new();
    for p in pods.items.iter().filter(|p| evictable(p)) {
        let name = format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any());
        if p.metadata.deletion_timestamp.is_none() {
            evict.push(name.clone());
        }
        left.push(name);
    }
    left.sort();
    evict.sort();
    Ok((left, evict))
}

/// Sets (`Some`) or removes the request on the node's `RdmaNodeState`.
async fn set_request(ctx: &Context, node: &str, boot_id: Option<&str>) -> Result<(), kube::Error> {
    let patch =
        serde_json::json!({"metadata": {"annotations": {REBOOT_REQUEST_ANNOTATION: boot_id}}});
    match Api::<RdmaNodeState>::all(ctx.client.clone())
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 && boot_id.is_none() => Ok(()),
        Err(e) => Err(e),
    }
}

/// Evicts what is left on `node`; once nothing is, asks its agent.
async fn drain_then_request(
    ctx: &Context,
    node: &Node,
    boot_id: &str,
    started: bool,
    errors: &mut Vec<kube::Error>,
) {
    let name = node.name_any();
    let (left, to_evict) = match pods_on(ctx, &name).await {
        Ok(p) => p,
        Err(e) => {
            errors.push(e);
            return;
        }
    };
    if left.is_empty() {
        if let Err(e) = set_request(ctx, &name, Some(boot_id)).await {
            errors.push(e);
            return;
        }
        super::drain::node_event(
            ctx,
            node,
            EventType::Warning,
            "RebootRequested",
            format!(
                "drained; its node agent is asked to reboot the host out of boot {boot_id} for \
                 its RDMA netns mode ({REBOOT_REQUEST_ANNOTATION} on its RdmaNodeState)"
            ),
        )
        .await;
        return;
    }
    let evicted = super::drain::evict(ctx, &to_evict, errors).await;
    if started || !evicted.is_empty() {
        super::drain::node_event(
            ctx,
            node,
            EventType::Warning,
            "DrainingForReboot",
            format!(
                "its RDMA netns mode applies only at boot; draining before the reboot: {}",
                if evicted.is_empty() {
                    left.join(", ")
                } else {
                    evicted.join(", ")
                }
            ),
        )
        .await;
    }
}

/// Acts on `plan` at `now`; errors are collected, every action is tried.
pub(crate) async fn act(
    ctx: &Context,
    plan: &RebootPlan,
    by_name: &BTreeMap<String, &std::sync::Arc<Node>>,
    timeout: Duration,
    now: i64,
    errors: &mut Vec<kube::Error>,
) {
    let api: Api<Node> = Api::all(ctx.client.clone());
    let pp = PatchParams::default();
    let rfc3339 = super::drain::rfc3339;
    for a in &plan.actions {
        let node_name = a.node();
        let Some(node) = by_name.get(node_name) else {
            continue;
        };
        match a {
            RebootAction::Start {
                cordon, boot_id, ..
            } => {
                let mark = if *cordon {
                    CORDONED_BY_KROCE
                } else {
                    ALREADY_CORDONED
                };
                let mut patch = serde_json::json!({
                    "metadata": {"annotations": {
                        REBOOT_ANNOTATION: mark,
                        REBOOT_STARTED_ANNOTATION: rfc3339(now),
                        REBOOT_TIMED_OUT_ANNOTATION: null,
                    }}
                });
                if *cordon {
                    patch["spec"] = serde_json::json!({"unschedulable": true});
                }
                if let Err(e) = api.patch(node_name, &pp, &Patch::Merge(&patch)).await {
                    errors.push(e);
                    continue;
                }
                drain_then_request(ctx, node, boot_id, true, errors).await;
            }
            RebootAction::Drain { boot_id, stamp, .. } => {
                if *stamp {
                    let patch = serde_json::json!({
                        "metadata": {"annotations": {REBOOT_STARTED_ANNOTATION: rfc3339(now)}}
                    });
                    if let Err(e) = api.patch(node_name, &pp, &Patch::Merge(&patch)).await {
                        errors.push(e);
                    }
                }
                drain_then_request(ctx, node, boot_id, false, errors).await;
            }
            RebootAction::Finish { uncordon, why, .. } => {
                // The request first: a node never keeps one without a mark.
                if let Err(e) = set_request(ctx, node_name, None).await {
                    errors.push(e);
                    continue;
                }
                let patch = release_patch(*uncordon, None);
                if let Err(e) = api.patch(node_name, &pp, &Patch::Merge(&patch)).await {
                    errors.push(e);
                    continue;
                }
                super::drain::node_event(
                    ctx,
                    node,
                    EventType::Normal,
                    "RebootFinished",
                    format!(
                        "{why}; {}",
                        if *uncordon {
                            "uncordoned"
                        } else {
                            "left unschedulable as it was before"
                        }
                    ),
                )
                .await;
            }
            RebootAction::TimedOut {
                uncordon,
                generation,
                waited,
                stage,
                ..
            } => {
                if let Err(e) = set_request(ctx, node_name, None).await {
                    errors.push(e);
                    continue;
                }
                let timed_out = generation.unwrap_or_default().to_string();
                let patch = release_patch(*uncordon, Some(timed_out));
                if let Err(e) = api.patch(node_name, &pp, &Patch::Merge(&patch)).await {
                    errors.push(e);
                    continue;
                }
                super::drain::node_event(
                    ctx,
                    node,
                    EventType::Warning,
                    "RebootTimedOut",
                    format!(
                        "not back with its RDMA netns mode after {} s (--drain-timeout-seconds={}): \
                         {stage}; {} and skipped until its spec changes (or \
                         {REBOOT_TIMED_OUT_ANNOTATION} is removed)",
                        waited.as_secs(),
                        timeout.as_secs(),
                        if *uncordon {
                            "uncordoned"
                        } else {
                            "left unschedulable as it was before"
                        }
                    ),
                )
                .await;
            }
            RebootAction::Forget { .. } => {
                let patch = serde_json::json!({
                    "metadata": {"annotations": {REBOOT_TIMED_OUT_ANNOTATION: null}}
                });
                if let Err(e) = api.patch(node_name, &pp, &Patch::Merge(&patch)).await {
                    errors.push(e);
                }
            }
            RebootAction::Wait { why, .. } => {
                tracing::debug!(node = %node_name, %why, "not rebooting");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kroce_contracts::max_unavailable::MaxUnavailable;

    /// A node whose agent reports a reboot required at generation 2.
    fn pending(name: &str) -> RebootNode {
        RebootNode {
            name: name.into(),
            boot_id: Some(format!("boot-{name}")),
            networks: vec!["fast".into()],
            state: Some(ModeReport {
                current: true,
                generation: Some(2),
                reboot_required: true,
                requested: None,
                asking: vec!["fast".into()],
            }),
            ..Default::default()
        }
    }

    fn quiet(name: &str) -> RebootNode {
        let mut n = pending(name);
        if let Some(s) = n.state.as_mut() {
            s.reboot_required = false;
        }
        n
    }

    fn policy(budget: &str) -> DrainPolicy {
        DrainPolicy {
            enabled: false,
            max_unavailable: budget.parse::<MaxUnavailable>().unwrap(),
            overrides: BTreeMap::new(),
            timeout: Duration::from_secs(600),
        }
    }

    /// Each node's action, by kind and a short detail.
    fn summary(p: &RebootPlan) -> Vec<String> {
        p.actions
            .iter()
            .map(|a| match a {
                RebootAction::Start { node, cordon, .. } => format!("start {node} cordon={cordon}"),
                RebootAction::Drain { node, .. } => format!("drain {node}"),
                RebootAction::Finish { node, uncordon, .. } => {
                    format!("finish {node} uncordon={uncordon}")
                }
                RebootAction::TimedOut { node, stage, .. } => format!("timeout {node}: {stage}"),
                RebootAction::Forget { node } => format!("forget {node}"),
                RebootAction::Wait { node, why } => {
                    format!("wait {node}: {}", why.split(':').next().unwrap_or(why))
                }
            })
            .collect()
    }

    struct Case {
        name: &'static str,
        nodes: Vec<RebootNode>,
        enabled: bool,
        budget: &'static str,
        drain_started: &'static [&'static str],
        now: i64,
        want: &'static [&'static str],
    }

    #[test]
    fn the_reboot_table() {
        let cordoned = |mut n: RebootNode| {
            n.unschedulable = true;
            n
        };
        let marked = |mut n: RebootNode, mark: &str, started: i64| {
            n.mark = Some(mark.into());
            n.started = Some(started);
            n.unschedulable = true;
            n
        };
        let requested = |mut n: RebootNode, boot: &str| {
            if let Some(s) = n.state.as_mut() {
                s.requested = Some(boot.into());
            }
            n
        };
        let cases = vec![
            Case {
                name: "off: nothing starts",
                nodes: vec![pending("n1"), pending("n2")],
                enabled: false,
                budget: "1",
                drain_started: &[],
                now: 0,
                want: &[],
            },
            Case {
                name: "budget 1: the first by name, the rest wait (input order irrelevant)",
                nodes: vec![pending("n3"), pending("n1"), pending("n2"), quiet("n0")],
                enabled: true,
                budget: "1",
                drain_started: &[],
                now: 0,
                want: &[
                    "start n1 cordon=true",
                    "wait n2: disruption budget full",
                    "wait n3: disruption budget full",
                ],
            },
            Case {
                name: "budget 2",
                nodes: vec![pending("n1"), pending("n2"), pending("n3")],
                enabled: true,
                budget: "2",
                drain_started: &[],
                now: 0,
                want: &[
                    "start n1 cordon=true",
                    "start n2 cordon=true",
                    "wait n3: disruption budget full",
                ],
            },
            Case {
                name: "a node cordoned by someone fills the budget but is itself taken without room",
                nodes: vec![
                    pending("n1"),
                    cordoned(quiet("n0")),
                    cordoned(pending("n2")),
                ],
                enabled: true,
                budget: "1",
                drain_started: &[],
                now: 0,
                want: &["wait n1: disruption budget full", "start n2 cordon=false"],
            },
            Case {
                name: "a node the drain starts this round counts, and is not rebooted",
                nodes: vec![pending("n1"), pending("n2")],
                enabled: true,
                budget: "1",
                drain_started: &["n1"],
                now: 0,
                want: &[
                    "wait n1: being drained for held VFs first",
                    "wait n2: disruption budget full",
                ],
            },
            Case {
                name: "mid-reboot: draining, asked, rebooted; each holds its room",
                nodes: vec![
                    marked(pending("n1"), CORDONED_BY_KROCE, 0),
                    requested(marked(pending("n2"), CORDONED_BY_KROCE, 0), "boot-n2"),
                    requested(marked(pending("n3"), CORDONED_BY_KROCE, 0), "boot-old"),
                    pending("n4"),
                ],
                enabled: true,
                budget: "3",
                drain_started: &[],
                now: 100,
                want: &[
                    "drain n1",
                    "wait n2: reboot asked (boot boot-n2)",
                    "wait n3: rebooted out of boot boot-old",
                    "wait n4: disruption budget full",
                ],
            },
            Case {
                name: "back with the mode: released, and the freed room goes to the next",
                nodes: vec![
                    requested(marked(quiet("n1"), CORDONED_BY_KROCE, 0), "boot-old"),
                    requested(marked(quiet("n2"), ALREADY_CORDONED, 0), "boot-old"),
                    pending("n3"),
                ],
                enabled: true,
                budget: "1",
                drain_started: &[],
                now: 100,
                want: &[
                    "finish n1 uncordon=true",
                    "finish n2 uncordon=false",
                    // n2 stays unschedulable as it was before: still full.
                    "wait n3: disruption budget full",
                ],
            },
            Case {
                name: "timeout: released with where it got to, then skipped at that generation",
                nodes: vec![
                    requested(marked(pending("n1"), CORDONED_BY_KROCE, 0), "boot-old"),
                    RebootNode {
                        timed_out: Some(2),
                        ..pending("n2")
                    },
                    RebootNode {
                        timed_out: Some(1),
                        ..pending("n3")
                    },
                ],
                enabled: true,
                budget: "1",
                drain_started: &[],
                now: 600,
                want: &[
                    "timeout n1: rebooted, the mode not reported live",
                    "wait n2: its reboot timed out at generation 2",
                    // A new spec since: tried again (n1's room is free).
                    "start n3 cordon=true",
                ],
            },
            Case {
                name: "turned off mid-reboot: released; a cleared condition forgets the timeout",
                nodes: vec![
                    marked(pending("n1"), CORDONED_BY_KROCE, 0),
                    RebootNode {
                        timed_out: Some(2),
                        ..quiet("n2")
                    },
                ],
                enabled: false,
                budget: "1",
                drain_started: &[],
                now: 0,
                want: &["finish n1 uncordon=true", "forget n2"],
            },
            Case {
                name: "a stale report or no bootID: nothing starts",
                nodes: vec![
                    RebootNode {
                        boot_id: None,
                        ..pending("n1")
                    },
                    {
                        let mut n = pending("n2");
                        if let Some(s) = n.state.as_mut() {
                            s.current = false;
                        }
                        n
                    },
                ],
                enabled: true,
                budget: "2",
                drain_started: &[],
                now: 0,
                want: &["wait n1: its kubelet reports no bootID"],
            },
        ];
        for c in cases {
            let started: BTreeSet<String> = c.drain_started.iter().map(|s| s.to_string()).collect();
            let p = plan_reboot(&c.nodes, c.enabled, &policy(c.budget), &started, c.now);
            assert_eq!(summary(&p), c.want, "{}", c.name);
        }
    }

    #[test]
    fn status_counts_rebooting_waiting_and_timed_out_and_merges_with_the_drain() {
        let mut n1 = pending("n1");
        n1.mark = Some(CORDONED_BY_KROCE.into());
        n1.started = Some(0);
        n1.unschedulable = true;
        let n3 = RebootNode {
            timed_out: Some(2),
            ..pending("n3")
        };
        let p = plan_reboot(
            &[n1, pending("n2"), n3],
            true,
            &policy("1"),
            &BTreeSet::new(),
            10,
        );
        let s = &p.status["fast"];
        assert_eq!(
            (s.draining_nodes, s.waiting_nodes, s.timed_out_nodes),
            (1, 1, 1)
        );
        assert_eq!(s.draining, ["n1"]);
        assert_eq!(s.timed_out, ["n3"]);
        assert_eq!((s.max_unavailable, s.unavailable_nodes), (1, 1));
        let mut drain = BTreeMap::from([(
            "fast".to_string(),
            DrainStatus {
                max_unavailable: 1,
                unavailable_nodes: 1,
                draining_nodes: 1,
                draining: vec!["n0".into()],
                ..Default::default()
            },
        )]);
        merge_status(&mut drain, p.status);
        assert_eq!(drain["fast"].draining, ["n0", "n1"]);
        assert_eq!(drain["fast"].draining_nodes, 2);
        assert_eq!(drain["fast"].timed_out, ["n3"]);
    }

    #[test]
    fn only_pods_that_would_not_come_back_are_evicted() {
        let pod = |v: serde_json::Value| -> Pod { serde_json::from_value(v).unwrap() };
        assert!(evictable(&pod(
            serde_json::json!({"metadata": {"name": "a"}})
        )));
        assert!(!evictable(&pod(
            serde_json::json!({"metadata": {"name": "ds",
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "kroce-node",
                                 "uid": "u", "controller": true}]}})
        )));
        assert!(!evictable(&pod(
            serde_json::json!({"metadata": {"name": "static",
            "annotations": {"kubernetes.io/config.mirror": "x"}}})
        )));
        assert!(!evictable(&pod(
            serde_json::json!({"metadata": {"name": "done"},
            "status": {"phase": "Succeeded"}})
        )));
    }

    #[test]
    fn the_label_follows_the_condition() {
        let mut s = RdmaNodeState::new("n1", Default::default());
        assert_eq!(pending_label(Some(&s)), None);
        assert_eq!(pending_label(None), None);
        s.status = Some(kroce_operator::crd::RdmaNodeStateStatus {
            conditions: vec![kroce_operator::crd::Condition::new(
                "RdmaNetnsModePending",
                true,
                "RebootRequired",
                "",
            )],
            ..Default::default()
        });
        assert_eq!(pending_label(Some(&s)), Some(NETNS_MODE_PENDING_VALUE));
    }

    use crate::drain::{DrainSettings, step_at};
    use crate::metrics::Metrics;
    use crate::test_world::fresh;
    use kroce_operator::testing::mock::ApiServer;
    use serde_json::{Value, json};
    use std::sync::Arc;

    const NOW: i64 = 1_800_000_000;
    const CORE: &str = "/api/v1";
    const KROCE: &str = "/apis/kroce.io/v1alpha1";

    fn mode_state(node: &str, condition: (&str, &str)) -> Value {
        json!({
            "apiVersion": "kroce.io/v1alpha1", "kind": "RdmaNodeState",
            "metadata": {"name": node, "generation": 2},
            "spec": {"nodeName": node, "pfs": [{"pciAddress": "0000:3b:00.0", "ifName": "ens1f0",
                      "numVfs": 2, "vfGroups": [{"network": "fast", "resourceName": "vf",
                                                 "vfRange": "0-1"}]}],
                     "rdmaNetnsModes": [{"network": "fast", "mode": "exclusive"}]},
            "status": {"observedGeneration": 2, "syncState": "Succeeded",
                       "conditions": [{"type": "RdmaNetnsModePending", "status": condition.0,
                                       "reason": condition.1, "message": ""}]}
        })
    }

    fn node_obj(server: &ApiServer, name: &str) -> Value {
        server.get(CORE, "nodes", "", name).unwrap()
    }

    fn annotation(o: &Value, key: &str) -> Value {
        o["metadata"]["annotations"]
            .get(key)
            .cloned()
            .unwrap_or(Value::Null)
    }

    fn cordoned(o: &Value) -> bool {
        o["spec"]["unschedulable"] == json!(true)
    }

    fn request(server: &ApiServer, node: &str) -> Value {
        annotation(
            &server.get(KROCE, "rdmanodestates", "", node).unwrap(),
            REBOOT_REQUEST_ANNOTATION,
        )
    }

    fn events(server: &ApiServer, reason: &str) -> usize {
        server
            .list("/apis/events.k8s.io/v1", "events")
            .iter()
            .filter(|e| e["reason"] == reason)
            .count()
    }

    /// Issue 22: with `--reboot-for-rdma-mode`, a node whose mode needs a
    /// reboot is cordoned and drained within the budget (DaemonSet pods
    /// stay), its agent asked through its node state once nothing is left,
    /// uncordoned when the agent reports the mode live after the reboot;
    /// the next node's turn comes then; one that never comes back with the
    /// mode is released, reported and skipped.
    #[tokio::test]
    async fn reboots_one_node_at_a_time_against_the_api() {
        let (client, server) = ApiServer::start();
        let ctx = crate::Context::new(
            client,
            "kroce-system",
            "kroce-device-plugin",
            Arc::new(Metrics::default()),
            crate::test_world::snapshot(&ApiServer::default()),
        );
        server.insert(
            KROCE,
            "rdmanetworks",
            json!({"apiVersion": "kroce.io/v1alpha1", "kind": "RdmaNetwork",
                   "metadata": {"name": "fast", "generation": 1},
                   "spec": {"nicSelector": {"pfNames": ["ens1f0"]}, "numVfs": 2,
                            "rdmaNetnsMode": "exclusive"}}),
        );
        for n in ["n1", "n2"] {
            server.insert(
                CORE,
                "nodes",
                json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n},
                       "status": {"nodeInfo": {"bootID": format!("{n}-boot-1")}}}),
            );
            server.insert(
                KROCE,
                "rdmanodestates",
                mode_state(n, ("True", "RebootRequired")),
            );
        }
        server.insert(
            CORE,
            "pods",
            json!({"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": "web", "namespace": "team-a"}, "spec": {"nodeName": "n1"}}),
        );
        server.insert(
            CORE,
            "pods",
            json!({"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": "kroce-node-x", "namespace": "kroce-system",
                                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                                                     "name": "kroce-node", "uid": "u",
                                                     "controller": true}]},
                   "spec": {"nodeName": "n1"}}),
        );
        let on = DrainSettings {
            reboot: true,
            ..Default::default()
        };

        // Off (the default): nothing happens.
        step_at(&fresh(&ctx, &server), &DrainSettings::default(), NOW)
            .await
            .unwrap();
        assert!(!cordoned(&node_obj(&server, "n1")));
        assert!(server.get(CORE, "pods", "team-a", "web").is_some());

        // On: n1 is cordoned and drained, the DaemonSet pod stays; n2 waits.
        let plan = step_at(&fresh(&ctx, &server), &on, NOW).await.unwrap();
        assert!(
            plan.reboots.iter().any(|a| matches!(a,
                RebootAction::Wait { node, why } if node == "n2" && why.contains("1 of 1"))),
            "{plan:?}"
        );
        let n1 = node_obj(&server, "n1");
        assert!(cordoned(&n1), "{n1}");
        assert_eq!(annotation(&n1, REBOOT_ANNOTATION), CORDONED_BY_KROCE);
        assert!(
            server.get(CORE, "pods", "team-a", "web").is_none(),
            "evicted"
        );
        assert!(
            server
                .get(CORE, "pods", "kroce-system", "kroce-node-x")
                .is_some(),
            "DaemonSet pod kept"
        );
        assert!(!cordoned(&node_obj(&server, "n2")));
        assert_eq!(request(&server, "n1"), Value::Null, "not before drained");

        // Nothing left: the agent is asked to leave n1's current boot.
        step_at(&fresh(&ctx, &server), &on, NOW + 15).await.unwrap();
        assert_eq!(request(&server, "n1"), "n1-boot-1");
        assert_eq!(events(&server, "RebootRequested"), 1);
        // Asked: waiting, not asked again.
        step_at(&fresh(&ctx, &server), &on, NOW + 30).await.unwrap();
        assert_eq!(events(&server, "RebootRequested"), 1);

        // The host rebooted; the agent reports the mode live: n1 is
        // uncordoned and unmarked, and n2's turn comes in the same round.
        server.edit(CORE, "nodes", "", "n1", |o| {
            o["status"]["nodeInfo"]["bootID"] = "n1-boot-2".into();
        });
        server.edit(KROCE, "rdmanodestates", "", "n1", |o| {
            o["status"]["conditions"][0]["status"] = "False".into();
            o["status"]["conditions"][0]["reason"] = "Applied".into();
        });
        step_at(&fresh(&ctx, &server), &on, NOW + 45).await.unwrap();
        let n1 = node_obj(&server, "n1");
        assert!(!cordoned(&n1), "{n1}");
        assert_eq!(annotation(&n1, REBOOT_ANNOTATION), Value::Null);
        assert_eq!(annotation(&n1, REBOOT_STARTED_ANNOTATION), Value::Null);
        assert_eq!(request(&server, "n1"), Value::Null);
        let n2 = node_obj(&server, "n2");
        assert!(cordoned(&n2), "{n2}");
        // Nothing to evict there: asked at once.
        assert_eq!(request(&server, "n2"), "n2-boot-1");
        step_at(&fresh(&ctx, &server), &on, NOW + 60).await.unwrap();
        let drain =
            server.get(KROCE, "rdmanetworks", "", "fast").unwrap()["status"]["drain"].clone();
        assert_eq!(drain["draining"], json!(["n2"]), "{drain}");

        // n2 never comes back with the mode: released at the timeout,
        // reported, and skipped at this generation.
        let late = NOW + 45 + 1800;
        step_at(&fresh(&ctx, &server), &on, late).await.unwrap();
        let n2 = node_obj(&server, "n2");
        assert!(!cordoned(&n2), "{n2}");
        assert_eq!(annotation(&n2, REBOOT_TIMED_OUT_ANNOTATION), "2");
        assert_eq!(request(&server, "n2"), Value::Null);
        assert_eq!(events(&server, "RebootTimedOut"), 1);
        let drain =
            server.get(KROCE, "rdmanetworks", "", "fast").unwrap()["status"]["drain"].clone();
        assert_eq!(drain["timedOut"], json!(["n2"]), "{drain}");
        step_at(&fresh(&ctx, &server), &on, late + 15)
            .await
            .unwrap();
        assert!(!cordoned(&node_obj(&server, "n2")), "not retried");
    }
}
