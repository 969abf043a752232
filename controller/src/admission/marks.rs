//! What admission records and marks: `status.admission[]` entries on the
//! node state (own field manager), the taint and ready label on the Node.

/// The condition in each `status.admission[]` entry.
pub const ADMITTED_CONDITION: &str = "Admitted";

use super::events::node_event_once;
use super::world::World;
use crate::{Context, Error};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use k8s_openapi::api::core::v1::Node;
use kroce_admission::lifecycle::{
    self, AdmissionPhase, NodeAdmission, READY_LABEL_KEY, UNREADY_TAINT_KEY,
};
use kroce_operator::crd::admission::{AdmissionResult, NetworkAdmission, rfc3339};
use kroce_operator::crd::conditions::stamp_transitions;
use kroce_operator::crd::{AdmissionGate, Condition, RdmaNodeState};
use kroce_operator::names::ADMISSION_MANAGER;
use kroce_operator::plan::ClusterPlan;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};
use serde_json::json;
use std::collections::BTreeMap;

pub(crate) fn entries_of(state: &RdmaNodeState) -> &[NetworkAdmission] {
    state
        .status
        .as_ref()
        .map_or(&[], |s| s.admission.as_slice())
}

/// The state machine's record of a node for a network (Pending when none
/// or unreadable).
pub(crate) fn stored(entries: &[NetworkAdmission], network: &str) -> NodeAdmission {
    entries
        .iter()
        .find(|e| e.network == network)
        .map(record)
        .unwrap_or_default()
}

pub(crate) fn record(e: &NetworkAdmission) -> NodeAdmission {
    e.state.clone()
}

pub(crate) fn phase_name(p: &AdmissionPhase) -> &'static str {
    match p {
        AdmissionPhase::Pending => "Pending",
        AdmissionPhase::Testing { .. } => "Testing",
        AdmissionPhase::Admitted { .. } => "Admitted",
        AdmissionPhase::Failed { .. } => "Failed",
    }
}

/// The status entry for one network from the state machine's record.
pub fn entry_for(
    network: &str,
    adm: &NodeAdmission,
    previous: Option<&NetworkAdmission>,
    now: &str,
) -> NetworkAdmission {
    let last = adm.last_result.as_deref().map(AdmissionResult::from_record);
    let (status, reason, message) = match &adm.phase {
        AdmissionPhase::Admitted { at } if at.without_test => (
            true,
            "AdmittedWithoutTest",
            "admission testing is disabled: admitted on configuration alone".to_string(),
        ),
        AdmissionPhase::Admitted { .. } => (
            true,
            "PerftestsPassed",
            last.as_ref().map(|l| l.message.clone()).unwrap_or_default(),
        ),
        AdmissionPhase::Testing {
            run,
            previously_admitted,
        } => (
            previously_admitted.is_some(),
            if previously_admitted.is_some() {
                "Retesting"
            } else {
                "Testing"
            },
            format!(
                "perftests against {} (run {}, deadline {})",
                run.peer_of(run.subjects.first().map_or("", String::as_str)),
                run.id,
                rfc3339(run.deadline)
            ),
        ),
        AdmissionPhase::Failed {
            reason, retry_at, ..
        } => (
            false,
            "PerftestsFailed",
            format!("{reason} (retry at {})", rfc3339(*retry_at)),
        ),
        AdmissionPhase::Pending => (
            false,
            "Pending",
            adm.waiting
                .clone()
                .unwrap_or_else(|| "waiting for a test run".into()),
        ),
    };
    let mut conditions = vec![Condition::new(ADMITTED_CONDITION, status, reason, message)];
    stamp_transitions(
        previous.map_or(&[], |p| p.conditions.as_slice()),
        &mut conditions,
        now,
    );
    let message = adm.waiting.clone().or_else(|| match &adm.phase {
        AdmissionPhase::Failed { reason, .. } => Some(reason.clone()),
        _ => None,
    });
    NetworkAdmission {
        network: network.to_string(),
        phase: phase_name(&adm.phase).into(),
        schedulable: lifecycle::is_ready(&adm.phase),
        message,
        last_result: last.map(Box::new),
        conditions,
        state: adm.clone(),
    }
}

/// `Admitted` when every network admits the node; otherwise the phase
/// that needs attention first.
pub fn summary_phase(entries: &[NetworkAdmission]) -> String {
    for p in ["Failed", "Testing", "Pending"] {
        if entries.iter().any(|e| e.phase == p) {
            return p.into();
        }
    }
    if entries.is_empty() {
        "NotSelected".into()
    } else {
        "Admitted".into()
    }
}

/// (taint wanted, label wanted) for a node: ready when every selecting
/// network admits it; the taint while not ready if any of them gates by
/// taint, the label once ready if any gates by label.
pub fn desired_marks(
    selected: &[String],
    gates: &BTreeMap<String, AdmissionGate>,
    entries: &[NetworkAdmission],
) -> (bool, bool) {
    if selected.is_empty() {
        return (false, false);
    }
    let ready = selected
        .iter()
        .all(|n| entries.iter().any(|e| e.network == *n && e.schedulable));
    let uses = |g: AdmissionGate| {
        selected
            .iter()
            .any(|n| gates.get(n).copied().unwrap_or_default() == g)
    };
    (
        uses(AdmissionGate::Taint) && !ready,
        uses(AdmissionGate::Label) && ready,
    )
}

/// Why a node's marks change, for the event: an event must say what
/// happened (a gate switched from taint to label is not an admission).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MarkWhy {
    /// Every network deciding the node admits it.
    Admitted,
    /// Some network deciding the node has not admitted it (named).
    NotAdmitted(Vec<String>),
    /// No network selects the node any more.
    Deselected,
}

impl MarkWhy {
    pub fn of(gating: &[String], entries: &[NetworkAdmission]) -> MarkWhy {
        if gating.is_empty() {
            return MarkWhy::Deselected;
        }
        let waiting: Vec<String> = gating
            .iter()
            .filter(|n| !entries.iter().any(|e| e.network == **n && e.schedulable))
            .cloned()
            .collect();
        if waiting.is_empty() {
            MarkWhy::Admitted
        } else {
            MarkWhy::NotAdmitted(waiting)
        }
    }
}

/// (reason, note) of the event for a taint (`taint`) or label change to
/// `wanted`.
pub fn mark_event(taint: bool, wanted: bool, why: &MarkWhy) -> (&'static str, String) {
    let what = if taint {
        format!("taint {UNREADY_TAINT_KEY}:NoSchedule")
    } else {
        format!("label {READY_LABEL_KEY}=true")
    };
    let verb = if wanted { "added" } else { "removed" };
    match (why, taint == wanted) {
        // Tainted or unlabelled: the node does not serve RDMA pods.
        (MarkWhy::NotAdmitted(nets), true) => (
            "RdmaUnready",
            format!(
                "{verb} {what}: not admitted by RDMA network(s) {}",
                nets.join(", ")
            ),
        ),
        (MarkWhy::Admitted, false) => (
            "RdmaReady",
            format!("{verb} {what}: admitted by every RDMA network selecting it"),
        ),
        (MarkWhy::Deselected, _) => (
            "RdmaDeselected",
            format!("{verb} {what}: no RDMA network selects the node any more"),
        ),
        // The mark changed only because the gate changed: say so, and what
        // the node's admission is.
        (MarkWhy::NotAdmitted(nets), false) => (
            "RdmaGateChanged",
            format!(
                "{verb} {what}: the admission gate changed (the networks selecting the node \
                 now gate by {}); the node is still not admitted by {}, so it serves no RDMA pods",
                if taint { "label" } else { "taint" },
                nets.join(", ")
            ),
        ),
        (MarkWhy::Admitted, true) => (
            "RdmaGateChanged",
            format!(
                "{verb} {what}: the admission gate changed (the networks selecting the node \
                 now gate by {}); the node stays admitted",
                if taint { "label" } else { "taint" }
            ),
        ),
    }
}

pub(crate) fn has_taint(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == UNREADY_TAINT_KEY))
}

pub(crate) fn has_label(node: &Node) -> bool {
    node.labels().get(READY_LABEL_KEY).map(String::as_str) == Some("true")
}

/// Writes in flight at once: enough to hide the API round trip, few
/// enough not to crowd the API server at rollout.
const WRITES_IN_FLIGHT: usize = 8;

/// Writes each node's `status.admission` that changed (entries of
/// networks no longer selecting the node dropped), then the marks. Every
/// write is tried; the first error is returned. Marks wait until every
/// record is written.
pub(crate) async fn persist_and_mark(
    ctx: &Context,
    plan: &ClusterPlan,
    world: &World,
    entries: Entries<'_>,
) -> Result<(), Error> {
    let selected: BTreeMap<&str, &[String]> = plan
        .nodes
        .iter()
        .map(|n| (n.node.as_str(), n.selected.as_slice()))
        .collect();
    let plans: BTreeMap<&str, &kroce_operator::plan::NodePlan> =
        plan.nodes.iter().map(|n| (n.node.as_str(), n)).collect();
    // Marks are decided now, from the entries as this pass leaves them,
    // and carried out once every record is written.
    let mut wanted = Vec::new();
    for node in &world.nodes {
        let name = node.name_any();
        let current = world.states.get(&name).map(|s| &s.spec);
        let gating: Vec<String> = match plans.get(name.as_str()) {
            None => Vec::new(),
            Some(np) => match crate::node::gating_networks(np, current) {
                Some(g) => g.into_iter().cloned().collect(),
                // In conflict with nothing applied yet: marks stay.
                None => continue,
            },
        };
        let (want_taint, want_label) = desired_marks(&gating, &world.gates, entries.of(&name));
        if want_taint != has_taint(node) || want_label != has_label(node) {
            let why = MarkWhy::of(&gating, entries.of(&name));
            wanted.push((&**node, want_taint, want_label, why));
        }
    }
    let api: Api<RdmaNodeState> = Api::all(ctx.client.clone());
    // Each list is handed to its write and freed when the write is done:
    // at rollout the new entries and the store (filling up as the writes
    // land) are never both whole in memory. Writes start a few at a time
    // (an unstarted write costs kilobytes, times thousands of nodes).
    let mut errors = Vec::new();
    let mut records = changed_records(world, entries.into_changed(), &selected).into_iter();
    let mut running = FuturesUnordered::new();
    loop {
        while running.len() < WRITES_IN_FLIGHT
            && let Some((node, list, phase)) = records.next()
        {
            running.push(write_records(&api, node, list, phase));
        }
        match running.next().await {
            Some(r) => errors.extend(r.err()),
            None => break,
        }
    }
    first_of(errors)?;
    let nodes_api: Api<Node> = Api::all(ctx.client.clone());
    let mut errors = Vec::new();
    let mut wanted = wanted.into_iter();
    let mut running = FuturesUnordered::new();
    loop {
        while running.len() < WRITES_IN_FLIGHT
            && let Some((node, want_taint, want_label, why)) = wanted.next()
        {
            running.push(mark(ctx, &nodes_api, node, want_taint, want_label, why));
        }
        match running.next().await {
            Some(r) => errors.extend(r.err()),
            None => break,
        }
    }
    first_of(errors)
}

/// The first error (every write was tried); the others are logged.
fn first_of(errors: Vec<Error>) -> Result<(), Error> {
    let mut errors = errors.into_iter();
    let first = errors.next();
    for e in errors {
        tracing::warn!(error = %e, "admission write");
    }
    match first {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// The nodes whose `status.admission` differs from what they hold (entries
/// of networks no longer selecting the node dropped): node, list, phase.
/// `changed`: this pass's lists, by node (the others are the stored ones).
fn changed_records<'a>(
    world: &'a World,
    mut changed: BTreeMap<String, Vec<NetworkAdmission>>,
    selected: &BTreeMap<&str, &[String]>,
) -> Vec<(&'a str, Vec<NetworkAdmission>, String)> {
    let mut out = Vec::new();
    for (node, state) in &world.states {
        let sel = selected.get(node.as_str()).copied().unwrap_or(&[]);
        let before = entries_of(state);
        let had_phase = state
            .status
            .as_ref()
            .and_then(|s| s.admission_phase.as_deref());
        let same = |list: &[NetworkAdmission], phase: &str| {
            before == list
                && (had_phase == Some(phase) || (before.is_empty() && had_phase.is_none()))
        };
        let mut list = match changed.remove(node) {
            Some(list) => list,
            // Untouched by this pass: copied only if something must go.
            None if before.iter().all(|e| sel.contains(&e.network))
                && same(before, &summary_phase(before)) =>
            {
                continue;
            }
            None => before.to_vec(),
        };
        list.retain(|e| sel.contains(&e.network));
        let phase = summary_phase(&list);
        if same(&list, &phase) {
            continue;
        }
        out.push((node.as_str(), list, phase));
    }
    out
}

async fn write_records(
    api: &Api<RdmaNodeState>,
    node: &str,
    list: Vec<NetworkAdmission>,
    phase: String,
) -> Result<(), Error> {
    let body = json!({
        "apiVersion": "kroce.io/v1alpha1",
        "kind": "RdmaNodeState",
        "status": {"admission": list, "admissionPhase": phase},
    });
    api.patch_status(
        node,
        &PatchParams::apply(ADMISSION_MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await?;
    Ok(())
}

/// The taint and label of one node as admission wants them, each with its
/// event.
async fn mark(
    ctx: &Context,
    nodes_api: &Api<Node>,
    node: &Node,
    want_taint: bool,
    want_label: bool,
    why: MarkWhy,
) -> Result<(), Error> {
    let name = node.name_any();
    if want_taint != has_taint(node) {
        let mut taints: Vec<serde_json::Value> = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default()
            .into_iter()
            .filter(|t| t.key != UNREADY_TAINT_KEY)
            .map(|t| serde_json::to_value(t).unwrap_or_default())
            .collect();
        if want_taint {
            taints.push(json!({"key": UNREADY_TAINT_KEY, "effect": "NoSchedule"}));
        }
        // resourceVersion: a concurrent taint change fails (409) instead of being lost.
        let patch = json!({
            "metadata": {"resourceVersion": node.resource_version()},
            "spec": {"taints": taints},
        });
        nodes_api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        let (reason, note) = mark_event(true, want_taint, &why);
        node_event_once(ctx, &name, EventType::Normal, reason, note).await;
    }
    if want_label != has_label(node) {
        let value = if want_label {
            json!("true")
        } else {
            json!(null)
        };
        let patch = json!({"metadata": {"labels": {READY_LABEL_KEY: value}}});
        nodes_api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        let (reason, note) = mark_event(false, want_label, &why);
        node_event_once(ctx, &name, EventType::Normal, reason, note).await;
    }
    Ok(())
}

/// Every node's `status.admission` during a pass: what the stores hold,
/// with this pass's changes on top. Only changed nodes are copied: at
/// thousands of nodes a full copy (and rebuilding unchanged entries) was
/// a large part of the controller's memory.
pub(crate) struct Entries<'w> {
    world: &'w World,
    changed: BTreeMap<String, Vec<NetworkAdmission>>,
}

impl<'w> Entries<'w> {
    pub(crate) fn new(world: &'w World) -> Self {
        Entries {
            world,
            changed: BTreeMap::new(),
        }
    }

    pub(crate) fn of(&self, node: &str) -> &[NetworkAdmission] {
        match self.changed.get(node) {
            Some(list) => list,
            None => self.world.states.get(node).map_or(&[], |s| entries_of(s)),
        }
    }

    /// Every entry of every node.
    pub(crate) fn all(&self) -> impl Iterator<Item = &NetworkAdmission> {
        let stored = self
            .world
            .states
            .iter()
            .filter(|(n, _)| !self.changed.contains_key(*n))
            .flat_map(|(_, s)| entries_of(s));
        stored.chain(self.changed.values().flatten())
    }

    /// Records `entry` for its network on `node`.
    pub(crate) fn set(&mut self, node: &str, entry: NetworkAdmission) {
        let list = self.list_mut(node);
        list.retain(|e| e.network != entry.network);
        // Exact: thousands of these lists live through a pass, and doubling
        // left a third of them empty.
        list.reserve_exact(1);
        list.push(entry);
        list.sort_by(|a, b| a.network.cmp(&b.network));
    }

    /// Drops `network`'s entry from every node.
    pub(crate) fn remove_network(&mut self, network: &str) {
        let nodes: Vec<String> = self
            .world
            .states
            .keys()
            .chain(self.changed.keys())
            .filter(|n| self.of(n).iter().any(|e| e.network == network))
            .cloned()
            .collect();
        for n in nodes {
            self.list_mut(&n).retain(|e| e.network != network);
        }
    }

    /// This pass's lists, by node.
    pub(crate) fn into_changed(self) -> BTreeMap<String, Vec<NetworkAdmission>> {
        self.changed
    }

    fn list_mut(&mut self, node: &str) -> &mut Vec<NetworkAdmission> {
        if !self.changed.contains_key(node) {
            let copy = self.of(node).to_vec();
            self.changed.insert(node.to_string(), copy);
        }
        self.changed.entry(node.to_string()).or_default()
    }
}
