//! What one network reconcile writes: its attachment definitions (or,
//! `frontend: dra`, its DeviceClass: [`super::device_class`]), its
//! status, events (node specs and the ConfigMap are the node loop's).

use super::{Context, Error, MANAGER};
use k8s_openapi::api::core::v1::Node;
use kroce_operator::crd::conditions::stamp_transitions;
use kroce_operator::crd::{
    Condition, Frontend, RdmaNetwork, RdmaNetworkStatus, RdmaNodeState, RdmaNodeStateSpec,
    SyncState,
};
use kroce_operator::names::{MANAGED_BY_LABEL, NETWORK_LABEL};
use kroce_operator::plan::nad::{NetworkAttachmentDefinition, attachment_definition};
use kroce_operator::plan::{ClusterPlan, NetworkInput, NodeInput, plan_cluster_without_pools};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Api, Resource, ResourceExt};
use std::collections::BTreeMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// What a reconcile reads, from the shared stores (never a LIST).
pub(crate) struct World {
    pub networks: Vec<Arc<RdmaNetwork>>,
    pub nodes: Vec<Arc<Node>>,
    pub states: BTreeMap<String, Arc<RdmaNodeState>>,
}

pub(crate) fn world(ctx: &Context) -> World {
    World {
        networks: ctx.stores.networks(),
        nodes: ctx.stores.nodes(),
        states: ctx.stores.states_by_name(),
    }
}

/// The plan another running reconcile made from the same objects:
/// concurrent reconciles share it (at thousands of nodes a plan is tens of
/// MiB). Held weakly, so nothing stays once no reconcile uses it.
#[derive(Default, Clone, Debug)]
pub struct SharedPlan(Arc<Mutex<Option<LastPlan>>>);

/// The inputs' hash and the plan made from them.
type LastPlan = (u64, Weak<ClusterPlan>);

impl SharedPlan {
    pub(crate) fn get(&self, world: &World) -> Arc<ClusterPlan> {
        let key = plan_inputs_key(world);
        if let Ok(g) = self.0.lock()
            && let Some((k, w)) = g.as_ref()
            && *k == key
            && let Some(plan) = w.upgrade()
        {
            return plan;
        }
        let plan = Arc::new(plan_world(world));
        if let Ok(mut g) = self.0.lock() {
            *g = Some((key, Arc::downgrade(&plan)));
        }
        plan
    }
}

/// Feeds serialized bytes straight into a hasher (no buffer).
struct HashWrite<'a>(&'a mut DefaultHasher);

impl std::io::Write for HashWrite<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A hash of everything [`plan_world`] reads.
fn plan_inputs_key(world: &World) -> u64 {
    let mut h = DefaultHasher::new();
    for n in &world.networks {
        n.name_any().hash(&mut h);
        n.meta().deletion_timestamp.is_some().hash(&mut h);
        let _ = serde_json::to_writer(HashWrite(&mut h), &n.spec);
    }
    for n in &world.nodes {
        n.name_any().hash(&mut h);
        n.labels().hash(&mut h);
    }
    for (name, s) in &world.states {
        name.hash(&mut h);
        if let Some(st) = &s.status {
            st.last_sync_time.is_some().hash(&mut h);
            st.observed_generation.is_some().hash(&mut h);
            let _ = serde_json::to_writer(HashWrite(&mut h), &st.pfs);
        }
    }
    h.finish()
}

pub(crate) fn plan_world(world: &World) -> ClusterPlan {
    let networks: Vec<NetworkInput> = world
        .networks
        .iter()
        .filter(|n| n.meta().deletion_timestamp.is_none())
        .map(|n| NetworkInput {
            name: n.name_any(),
            spec: n.spec.clone(),
        })
        .collect();
    let nodes: Vec<NodeInput> = world
        .nodes
        .iter()
        .map(|n| {
            let name = n.name_any();
            // Known once the agent has reported (a node may have no PF at all).
            let inventory = world
                .states
                .get(&name)
                .and_then(|s| s.status.as_ref())
                .filter(|s| {
                    !s.pfs.is_empty()
                        || s.last_sync_time.is_some()
                        || s.observed_generation.is_some()
                })
                .map(|s| s.pfs.clone());
            NodeInput {
                labels: n.labels().clone(),
                name,
                inventory,
            }
        })
        .collect();
    // Pools are the node loop's (plan_node): this plan reports.
    plan_cluster_without_pools(&nodes, &networks)
}

/// An event on `net` (reason doubles as the action).
async fn publish(ctx: &Context, net: &RdmaNetwork, type_: EventType, reason: &str, note: String) {
    ctx.event(&net.object_ref(&()), type_, reason, reason, note)
        .await;
}

/// Networks whose VF groups or soft devices differ between two node state
/// specs; the networks of `new` when only PF-level settings changed.
pub(crate) fn networks_changed(
    old: Option<&RdmaNodeStateSpec>,
    new: &RdmaNodeStateSpec,
) -> Vec<String> {
    use std::collections::BTreeSet;
    let groups = |s: &RdmaNodeStateSpec| -> BTreeMap<String, String> {
        let mut m: BTreeMap<String, String> = BTreeMap::new();
        for p in &s.pfs {
            for g in &p.vf_groups {
                let e = m.entry(g.network.clone()).or_default();
                e.push_str(&format!("{}:{:?};", p.pci_address, g));
            }
        }
        for g in &s.soft_devices {
            let e = m.entry(g.network.clone()).or_default();
            e.push_str(&format!("{g:?};"));
        }
        m
    };
    let before = old.map(groups).unwrap_or_default();
    let after = groups(new);
    let names: BTreeSet<&String> = before.keys().chain(after.keys()).collect();
    let changed: Vec<String> = names
        .into_iter()
        .filter(|n| before.get(*n) != after.get(*n))
        .cloned()
        .collect();
    if changed.is_empty() {
        after.into_keys().collect()
    } else {
        changed
    }
}

/// What applying a network's attachment definitions ran into.
#[derive(Debug, Default)]
struct NadOutcome {
    changes: Vec<String>,
    /// Listed in `networkNamespaces` but not in the cluster.
    missing_namespaces: Vec<String>,
    /// The NetworkAttachmentDefinition CRD (Multus) is not installed.
    crd_missing: bool,
}

fn is_missing_namespace(e: &kube::Error, ns: &str) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404
        && (s.details.as_ref().is_some_and(|d| d.kind == "namespaces")
            || s.message.contains(&format!("namespaces \"{ns}\" not found"))))
}

fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// Label values (and so `kroce.io/network=<name>` selectors) are at most 63
/// characters; a longer name can have no attachment definitions.
const MAX_LABEL_VALUE: usize = 63;

/// This network's attachment definitions: applied in each listed
/// namespace, deleted from namespaces no longer listed.
async fn sync_nads(ctx: &Context, net: &RdmaNetwork, keep: bool) -> Result<NadOutcome, Error> {
    let name = net.name_any();
    let mut out = NadOutcome::default();
    let all: Api<NetworkAttachmentDefinition> = Api::all(ctx.client.clone());
    let existing: Vec<Arc<NetworkAttachmentDefinition>> = if name.len() > MAX_LABEL_VALUE {
        // Such a network (admitted before the CRD refused long names)
        // could never get one, and its deletion must not fail on it.
        Vec::new()
    } else if let Some(watched) = ctx.stores.nads_of(&name) {
        watched
    } else {
        // The watch has not listed: the kind may not be served (no
        // Multus), which only the API's answer tells.
        let lp = ListParams::default().labels(&format!("{NETWORK_LABEL}={name}"));
        match all.list(&lp).await {
            Ok(l) => l.items.into_iter().map(Arc::new).collect(),
            // "404 page not found": nothing serves the kind.
            Err(e) if is_not_found(&e) => {
                out.crd_missing = true;
                return Ok(out);
            }
            Err(e) => return Err(e.into()),
        }
    };
    let wanted: Vec<&String> = if keep {
        net.spec.network_namespaces.iter().collect()
    } else {
        Vec::new()
    };
    let pp = PatchParams::apply(MANAGER).force();
    for ns in &wanted {
        let nad = attachment_definition(&name, &net.spec, ns);
        let current = existing
            .iter()
            .find(|e| e.namespace().as_deref() == Some(ns.as_str()));
        let same = current.is_some_and(|c| {
            c.spec == nad.spec
                && c.annotations()
                    .get(kroce_operator::plan::nad::RESOURCE_ANNOTATION)
                    == nad
                        .annotations()
                        .get(kroce_operator::plan::nad::RESOURCE_ANNOTATION)
        });
        if same {
            continue;
        }
        let api: Api<NetworkAttachmentDefinition> = Api::namespaced(ctx.client.clone(), ns);
        match api.patch(&name, &pp, &Patch::Apply(&nad)).await {
            Ok(_) => out
                .changes
                .push(format!("NetworkAttachmentDefinition {ns}/{name} applied")),
            // The other namespaces still get theirs; the status says which not.
            Err(e) if is_missing_namespace(&e, ns) => out.missing_namespaces.push(ns.to_string()),
            Err(e) if is_not_found(&e) => {
                out.crd_missing = true;
                return Ok(out);
            }
            Err(e) => return Err(e.into()),
        }
    }
    for e in &existing {
        let Some(ns) = e.namespace() else { continue };
        if wanted.iter().any(|w| **w == ns) {
            continue;
        }
        let api: Api<NetworkAttachmentDefinition> = Api::namespaced(ctx.client.clone(), &ns);
        match api.delete(&e.name_any(), &DeleteParams::default()).await {
            Ok(_) => out.changes.push(format!(
                "NetworkAttachmentDefinition {ns}/{} deleted",
                e.name_any()
            )),
            // Already gone is fine: cleanup never fails on absent state.
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(out)
}

/// The attachment problems in the network's status: `Degraded` (and so
/// not `Ready`) with a reason that says what to do.
fn attachment_problems(status: &mut RdmaNetworkStatus, nads: &NadOutcome) {
    let problem = if nads.crd_missing {
        Some((
            NAD_CRD_MISSING,
            "the NetworkAttachmentDefinition CRD (network-attachment-definitions.k8s.cni.cncf.io) \
             is not installed: install Multus (or its CRD); pods cannot attach to this network \
             until then"
                .to_string(),
        ))
    } else if !nads.missing_namespaces.is_empty() {
        Some((
            NAMESPACE_NOT_FOUND,
            format!(
                "spec.networkNamespaces: namespace {} not found; no NetworkAttachmentDefinition \
                 there (the other namespaces have theirs)",
                nads.missing_namespaces.join(", ")
            ),
        ))
    } else {
        None
    };
    if let Some((reason, message)) = problem {
        degrade(status, reason, message);
    }
}

/// `Degraded` (and so not `Ready`) for `reason`. Other degradations keep
/// their reason; the message gets this one too.
pub(crate) fn degrade(status: &mut RdmaNetworkStatus, reason: &str, message: String) {
    for c in status.conditions.iter_mut() {
        match c.type_.as_str() {
            "Degraded" if c.is_true() => {
                c.message = format!("{}; {message}", c.message);
            }
            "Degraded" | "Ready" => {
                let generation = c.observed_generation;
                *c = Condition::new(
                    &c.type_.clone(),
                    c.type_ == "Degraded",
                    reason,
                    message.clone(),
                );
                c.observed_generation = generation;
            }
            _ => {}
        }
    }
}

/// `Degraded` reasons for attachment problems.
pub(crate) const NAD_CRD_MISSING: &str = "NetworkAttachmentDefinitionCrdMissing";
pub(crate) const NAMESPACE_NOT_FOUND: &str = "NamespaceNotFound";

/// Retry while the NAD CRD is missing: the time it has been missing,
/// between 15 s and 5 min (doubling, without a counter to keep).
fn crd_missing_retry(previous: Option<&RdmaNetworkStatus>, now: &str) -> Duration {
    use k8s_openapi::jiff::Timestamp;
    let since = previous
        .and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_ == "Degraded" && c.reason == NAD_CRD_MISSING)
        })
        .and_then(|c| c.last_transition_time.as_deref())
        .and_then(|t| t.parse::<Timestamp>().ok());
    let elapsed = match (since, now.parse::<Timestamp>()) {
        (Some(since), Ok(now)) => {
            Duration::from_secs(now.as_second().saturating_sub(since.as_second()).max(0) as u64)
        }
        _ => Duration::ZERO,
    };
    elapsed.clamp(Duration::from_secs(15), Duration::from_secs(300))
}

/// Condition type (and `Ready` reason) when admission tests cannot run.
pub(crate) const ADMISSION_BLOCKED: &str = "AdmissionBlocked";

/// Why perftest admission can never run for `net`, when it cannot: testing
/// is on, the network selects a single node (no peer to test against) and
/// that node is not admitted. Says what the node's gate holds it at.
fn admission_blocked(
    net: &RdmaNetwork,
    plan: &ClusterPlan,
    states: &BTreeMap<String, std::sync::Arc<RdmaNodeState>>,
) -> Option<String> {
    let spec = kroce_operator::crd::AdmissionSpec::of(net.spec.admission.as_ref());
    if !spec.enabled {
        return None;
    }
    let name = net.name_any();
    let mut selected = plan.nodes.iter().filter(|n| n.selected.contains(&name));
    let (Some(only), None) = (selected.next(), selected.next()) else {
        return None;
    };
    let admitted = states.get(&only.node).is_some_and(|s| {
        crate::admission::marks::entries_of(s)
            .iter()
            .any(|e| e.network == name && e.schedulable)
    });
    if admitted {
        return None;
    }
    let gate = match spec.gate {
        kroce_operator::crd::AdmissionGate::Taint => format!(
            "it keeps taint {}:NoSchedule",
            kroce_admission::lifecycle::UNREADY_TAINT_KEY
        ),
        kroce_operator::crd::AdmissionGate::Label => format!(
            "it does not get label {}=true",
            kroce_admission::lifecycle::READY_LABEL_KEY
        ),
    };
    Some(format!(
        "admission cannot run: perftests need a peer and nodeSelector selects only node {} \
         (gate: {}, so {gate} and serves no RDMA pods); select a second node, or set \
         spec.admission.enabled: false",
        only.node,
        match spec.gate {
            kroce_operator::crd::AdmissionGate::Taint => "taint",
            kroce_operator::crd::AdmissionGate::Label => "label",
        }
    ))
}

/// The network's status from the plan and the node states.
pub(crate) fn network_status(
    net: &RdmaNetwork,
    plan: &ClusterPlan,
    states: &BTreeMap<String, std::sync::Arc<RdmaNodeState>>,
) -> RdmaNetworkStatus {
    let name = net.name_any();
    let matched: Vec<&str> = plan.matched_nodes(&name).map(|n| n.node.as_str()).collect();
    let ready = matched
        .iter()
        .filter(|node| {
            states.get(**node).is_some_and(|s| {
                let applied = s.status.as_ref().is_some_and(|st| {
                    st.sync_state == SyncState::Succeeded
                        && st.observed_generation.is_some()
                        && st.observed_generation == s.metadata.generation
                });
                let carries = s
                    .spec
                    .pfs
                    .iter()
                    .any(|p| p.vf_groups.iter().any(|g| g.network == name))
                    || s.spec.soft_devices.iter().any(|g| g.network == name);
                applied && carries
            })
        })
        .count() as u32;
    // Only the conflicts this network is to blame for: a network already
    // running on the node stays Ready while a newcomer clashes with it.
    let conflicts: Vec<String> = plan
        .conflicts_of(&name)
        .filter(|c| crate::node::blamed(c, states.get(&c.node).map(|s| &s.spec), &name))
        .map(|c| c.message.clone())
        .collect();
    let invalid = plan.invalid.get(&name);
    let mut conditions = Vec::new();
    let degraded = if let Some(errs) = invalid {
        let msg: Vec<String> = errs.iter().map(ToString::to_string).collect();
        Condition::new("Degraded", true, "InvalidSpec", msg.join("; "))
    } else if !conflicts.is_empty() {
        Condition::new(
            "Degraded",
            true,
            "Conflict",
            format!(
                "{} (the nodes keep their last good state: the networks already on them are untouched)",
                conflicts.join("; ")
            ),
        )
    } else {
        Condition::new("Degraded", false, "NoConflicts", "")
    };
    let matched_n = matched.len() as u32;
    let is_degraded = degraded.is_true();
    let blocked = admission_blocked(net, plan, states);
    conditions.push(if is_degraded {
        Condition::new(
            "Ready",
            false,
            &degraded.reason.clone(),
            degraded.message.clone(),
        )
    } else if matched_n == 0 {
        let selected = plan
            .nodes
            .iter()
            .filter(|n| n.selected.contains(&name))
            .count();
        // Say which selector came up empty: the nodes' labels or their NICs.
        let message = if selected == 0 {
            let labels: Vec<String> = net
                .spec
                .node_selector
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            format!("nodeSelector {{{}}} matches no node", labels.join(", "))
        } else {
            format!(
                "none of the {selected} nodes nodeSelector selects has a PF that nicSelector \
                 matches (or their agents have not reported yet)"
            )
        };
        Condition::new("Ready", false, "NoMatchingNodes", message)
    } else if let Some(why) = &blocked {
        Condition::new(
            "Ready",
            false,
            ADMISSION_BLOCKED,
            format!("{ready}/{matched_n} nodes configured; {why}"),
        )
    } else if ready == matched_n {
        Condition::new(
            "Ready",
            true,
            "AllNodesReady",
            format!("{ready}/{matched_n} nodes configured"),
        )
    } else {
        Condition::new(
            "Ready",
            false,
            "NodesNotReady",
            format!("{ready}/{matched_n} nodes configured"),
        )
    });
    conditions.push(if !is_degraded && matched_n > 0 && ready < matched_n {
        Condition::new(
            "Progressing",
            true,
            "NodesConfiguring",
            format!("{} nodes still configuring", matched_n - ready),
        )
    } else {
        Condition::new("Progressing", false, "Settled", "")
    });
    conditions.push(degraded);
    conditions.push(match blocked {
        Some(why) => Condition::new(ADMISSION_BLOCKED, true, "NoPeer", why),
        None => Condition::new(ADMISSION_BLOCKED, false, "NotBlocked", ""),
    });
    for c in &mut conditions {
        c.observed_generation = net.metadata.generation;
    }
    RdmaNetworkStatus {
        observed_generation: net.metadata.generation,
        conditions,
        matched_nodes: matched_n,
        ready_nodes: ready,
        drain: None,
    }
}

async fn patch_status(
    ctx: &Context,
    net: &RdmaNetwork,
    mut status: RdmaNetworkStatus,
) -> Result<bool, Error> {
    let previous = net.status.clone().unwrap_or_default();
    let now = jiff_now();
    stamp_transitions(&previous.conditions, &mut status.conditions, &now);
    // `status.drain` is the drain loop's (field manager kroce-drain): not
    // compared, and never sent (sending it would take its ownership).
    status.drain = previous.drain.clone();
    if previous == status {
        return Ok(false);
    }
    status.drain = None;
    let api: Api<RdmaNetwork> = Api::all(ctx.client.clone());
    let body = serde_json::json!({
        "apiVersion": "kroce.io/v1alpha1",
        "kind": "RdmaNetwork",
        "status": status,
    });
    api.patch_status(
        &net.name_any(),
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await?;
    Ok(true)
}

/// RFC 3339 "now", as condition timestamps want it.
pub(crate) fn jiff_now() -> String {
    k8s_openapi::jiff::Timestamp::now().to_string()
}

pub(crate) async fn apply(net: &RdmaNetwork, ctx: &Context) -> Result<Action, Error> {
    // Node specs and the device plugin's keys are the node loop's: this
    // reconcile plans only to report (status, admission) and writes the
    // network's own objects.
    let world = world(ctx);
    let plan = ctx.plans.get(&world);
    let name = net.name_any();
    ctx.metrics.conflicts.set(
        plan.nodes
            .iter()
            .filter(|n| !n.conflicts.is_empty())
            .count() as i64,
    );
    let valid = !plan.invalid.contains_key(&name);
    let dra = net.spec.frontend == Frontend::Dra;
    // An invalid spec keeps its existing attachment definitions (and
    // DeviceClass) untouched. A DRA network has a DeviceClass instead of
    // attachment definitions (left over ones go; no Multus needed).
    let (nads, class) = if valid {
        let mut nads = sync_nads(ctx, net, !dra).await?;
        if dra {
            nads.crd_missing = false;
        }
        let class = super::device_class::sync(ctx, net, &world, &plan, dra).await?;
        (nads, class)
    } else {
        Default::default()
    };
    let mut status = network_status(net, &plan, &world.states);
    attachment_problems(&mut status, &nads);
    if let Some((reason, message)) = &class.problem {
        degrade(&mut status, reason, message.clone());
    }
    let degraded = status
        .conditions
        .iter()
        .find(|c| (c.type_ == "Degraded" || c.type_ == ADMISSION_BLOCKED) && c.is_true())
        .cloned();
    let changed_status = patch_status(ctx, net, status).await?;
    for c in nads.changes.iter().chain(&class.changes) {
        publish(ctx, net, EventType::Normal, "Applied", c.clone()).await;
    }
    if let Some(d) = degraded
        && changed_status
    {
        publish(ctx, net, EventType::Warning, &d.reason, d.message).await;
    }
    let wake = super::admission::reconcile_network(ctx, net, &plan).await?;
    let mut wake = wake.min(Duration::from_secs(300));
    if nads.crd_missing {
        wake = wake.min(crd_missing_retry(net.status.as_ref(), &jiff_now()));
    }
    Ok(Action::requeue(wake))
}

pub(crate) async fn cleanup(net: &RdmaNetwork, ctx: &Context) -> Result<Action, Error> {
    // Attachment definitions first (pods can no longer name the network),
    // then the node states without this network (the agents remove its VFs).
    let nads = sync_nads(ctx, net, false).await?;
    let mut changes = nads.changes;
    // Also namespaces listed in the spec whose NAD lost its label (none
    // when nothing serves the kind).
    let listed = if nads.crd_missing {
        &[][..]
    } else {
        &net.spec.network_namespaces[..]
    };
    for ns in listed {
        let api: Api<NetworkAttachmentDefinition> = Api::namespaced(ctx.client.clone(), ns);
        let found = match api.get_opt(&net.name_any()).await {
            Ok(found) => found,
            Err(e) if is_not_found(&e) => None,
            Err(e) => return Err(e.into()),
        };
        if let Some(nad) = found
            && nad.labels().get(MANAGED_BY_LABEL).map(String::as_str) == Some(MANAGER)
        {
            match api.delete(&net.name_any(), &DeleteParams::default()).await {
                Ok(_) => changes.push(format!(
                    "NetworkAttachmentDefinition {ns}/{} deleted",
                    net.name_any()
                )),
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    let world = world(ctx);
    let plan = ctx.plans.get(&world);
    let class = super::device_class::sync(ctx, net, &world, &plan, false).await?;
    changes.extend(class.changes);
    super::admission::cleanup_network(ctx, net, &plan).await?;
    for c in &changes {
        publish(ctx, net, EventType::Normal, "Cleanup", c.clone()).await;
    }
    // The node loop drops the network's VFs from every node (it plans
    // without deleting networks); the finalizer stays until it has.
    let name = net.name_any();
    let carrying: Vec<String> = world
        .states
        .values()
        .filter(|s| crate::node::carries(&s.spec, &name))
        .map(|s| s.name_any())
        .collect();
    if !carrying.is_empty() {
        return Err(Error::Pending(format!(
            "waiting for {} node states to drop the network ({}{})",
            carrying.len(),
            carrying
                .iter()
                .take(3)
                .cloned()
                .collect::<Vec<_>>()
                .join(", "),
            if carrying.len() > 3 { ", ..." } else { "" }
        )));
    }
    Ok(Action::await_change())
}

#[cfg(test)]
mod shared_plan_tests {
    use super::*;

    fn world(label: &str) -> World {
        let net: RdmaNetwork = serde_json::from_value(serde_json::json!({
            "apiVersion": "kroce.io/v1alpha1", "kind": "RdmaNetwork",
            "metadata": {"name": "fast"},
            "spec": {"nodeSelector": {"rdma": "yes"}, "nicSelector": {"pfNames": ["ens1f0"]},
                     "numVfs": 4, "resourceName": "vf"}}))
        .unwrap();
        let node: Node = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "n1", "labels": {"rdma": label}}}))
        .unwrap();
        World {
            networks: vec![Arc::new(net)],
            nodes: vec![Arc::new(node)],
            states: BTreeMap::new(),
        }
    }

    #[test]
    fn concurrent_reconciles_share_a_plan_until_an_input_changes() {
        let plans = SharedPlan::default();
        let a = plans.get(&world("yes"));
        let b = plans.get(&world("yes"));
        assert!(Arc::ptr_eq(&a, &b), "same inputs, one plan");
        assert_eq!(a.nodes[0].selected, ["fast"]);
        let c = plans.get(&world("no"));
        assert!(!Arc::ptr_eq(&a, &c), "a label changed");
        assert!(c.nodes[0].selected.is_empty());
        // Nothing is kept once no reconcile holds the plan.
        let weak = Arc::downgrade(&c);
        drop((a, b, c));
        assert!(weak.upgrade().is_none());
    }
}
