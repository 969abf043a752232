//! The node loop: one reconcile per Node, the only writer of that node's
//! `RdmaNodeState` spec and of its key in the device plugin ConfigMap. It
//! plans that node alone (its labels, its inventory, the networks in the
//! store): a Node event costs O(networks), never a pass over the cluster,
//! and no two reconciles ever write the same node spec.

use super::{Context, Error, MANAGER};
use crate::sync::networks_changed;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kroce_operator::crd::{RdmaNetwork, RdmaNodeState, RdmaNodeStateSpec};
use kroce_operator::names::MANAGED_BY_LABEL;
use kroce_operator::plan::device_plugin::config_key;
use kroce_operator::plan::merge::Desired;
use kroce_operator::plan::{NetworkInput, NodeInput, NodePlan, plan_node, validate_network};
use kube::api::{ObjectMeta, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Api, Resource, ResourceExt};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The networks a node is planned against: valid, not being deleted (a
/// deleting network's VFs go first; its finalizer waits for that).
pub fn live_networks(networks: &[Arc<RdmaNetwork>]) -> Vec<NetworkInput> {
    networks
        .iter()
        .filter(|n| n.meta().deletion_timestamp.is_none())
        .filter(|n| validate_network(&n.name_any(), &n.spec).is_ok())
        .map(|n| NetworkInput {
            name: n.name_any(),
            spec: n.spec.clone(),
        })
        .collect()
}

/// The planning input of one node: its labels and, once its agent has
/// reported (a node may have no PF at all), its inventory.
pub fn node_input(name: &str, node: &Node, state: Option<&RdmaNodeState>) -> NodeInput {
    let inventory = state
        .and_then(|s| s.status.as_ref())
        .filter(|s| {
            !s.pfs.is_empty() || s.last_sync_time.is_some() || s.observed_generation.is_some()
        })
        .map(|s| s.pfs.clone());
    NodeInput {
        labels: node.labels().clone(),
        name: name.to_string(),
        inventory,
    }
}

/// The spec to write for this node, if one is due: nodes nothing selects
/// get no object; ones that had one are emptied.
pub fn spec_to_write(np: &NodePlan, current: Option<&RdmaNodeState>) -> Option<RdmaNodeStateSpec> {
    let desired = match (&np.desired, current) {
        (Desired::Spec(s), Some(_)) => Some(s.clone()),
        (Desired::Spec(s), None) if !s.pfs.is_empty() || !np.selected.is_empty() => Some(s.clone()),
        (Desired::AwaitInventory, None) => Some(RdmaNodeStateSpec {
            node_name: np.node.clone(),
            ..Default::default()
        }),
        _ => None,
    }?;
    (current.map(|c| &c.spec) != Some(&desired)).then_some(desired)
}

/// This node's key of the device plugin ConfigMap: `Some(yaml)` to set,
/// `None` to leave out.
pub fn configmap_value(
    np: &NodePlan,
    state: Option<&RdmaNodeState>,
    previous: Option<&str>,
) -> Result<Option<String>, Error> {
    match &np.device_plugin {
        Some(cfg) if !np.selected.is_empty() || state.is_some() => {
            // Pools appear only once the node state carrying them is applied.
            let spec = match &np.desired {
                Desired::Spec(s) => Some(s),
                _ => None,
            };
            Ok(
                match super::admission::advertised_pools(cfg, spec, state, previous) {
                    Some(c) => Some(c.to_yaml()?),
                    None => None,
                },
            )
        }
        Some(_) => Ok(None),
        // Conflict or no inventory yet: keep what the node had.
        None => Ok(previous.map(str::to_string)),
    }
}

pub async fn reconcile_node(node: Arc<Node>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.stores.ready().await?;
    ctx.metrics.node_reconciles.inc();
    let name = node.name_any();
    let stores = &ctx.stores;
    let networks = stores.networks.state();
    let state = stores.state(&name);
    let np = plan_node(
        &node_input(&name, &node, state.as_deref()),
        &live_networks(&networks),
    );
    if let Some(spec) = spec_to_write(&np, state.as_deref()) {
        write_spec(&ctx, &node, state.as_deref(), spec).await?;
    }
    write_configmap_key(&ctx, &np, state.as_deref()).await?;
    crate::reboot::write_pending_label(&ctx, &node, state.as_deref()).await?;
    Ok(Action::await_change())
}

async fn write_spec(
    ctx: &Context,
    node: &Node,
    current: Option<&RdmaNodeState>,
    spec: RdmaNodeStateSpec,
) -> Result<(), Error> {
    let name = node.name_any();
    let mut obj = RdmaNodeState::new(&name, spec);
    obj.metadata.labels = Some(BTreeMap::from([(
        MANAGED_BY_LABEL.to_string(),
        MANAGER.to_string(),
    )]));
    // Owned by the Node: deleting the node garbage-collects its state.
    obj.metadata.owner_references = node.uid().map(|uid| {
        vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: name.clone(),
            uid,
            ..Default::default()
        }]
    });
    Api::<RdmaNodeState>::all(ctx.client.clone())
        .patch(
            &name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&obj),
        )
        .await?;
    ctx.metrics.node_writes.inc();
    // One event, on the node state, naming the networks whose VFs there
    // changed: per-network events would be networks x nodes of them in a
    // rollout (50,000 for 5,000 nodes x 10 networks).
    let changed = networks_changed(current.map(|c| &c.spec), &obj.spec);
    let note = format!(
        "node {name}: RdmaNodeState {} for {} ({} PFs)",
        if current.is_some() {
            "updated"
        } else {
            "created"
        },
        if changed.is_empty() {
            "no network".to_string()
        } else {
            format!("network {}", changed.join(", "))
        },
        obj.spec.pfs.len()
    );
    ctx.event(
        &obj.object_ref(&()),
        EventType::Normal,
        "Applied",
        "Applied",
        note,
    )
    .await;
    Ok(())
}

/// Sets (or removes) only this node's key, with a merge patch: nodes never
/// write over each other's keys, and nothing is sent when the store
/// already holds the value.
async fn write_configmap_key(
    ctx: &Context,
    np: &NodePlan,
    state: Option<&RdmaNodeState>,
) -> Result<(), Error> {
    let key = config_key(&np.node);
    let existing = ctx.stores.configmap(&ctx.namespace, &ctx.configmap);
    let previous = existing
        .as_ref()
        .and_then(|c| c.data.as_ref())
        .and_then(|d| d.get(&key))
        .map(String::as_str);
    let wanted = configmap_value(np, state, previous)?;
    if existing.is_some() && wanted.as_deref() == previous {
        return Ok(());
    }
    let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let pp = PatchParams {
        field_manager: Some(MANAGER.into()),
        ..Default::default()
    };
    if existing.is_none() {
        // Created once, by whichever node comes first; then keys only.
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(ctx.configmap.clone()),
                namespace: Some(ctx.namespace.clone()),
                labels: Some(BTreeMap::from([(
                    MANAGED_BY_LABEL.to_string(),
                    MANAGER.to_string(),
                )])),
                ..Default::default()
            },
            ..Default::default()
        };
        let mut v = serde_json::to_value(&cm).map_err(|source| Error::Json {
            what: "ConfigMap",
            source,
        })?;
        v["apiVersion"] = "v1".into();
        v["kind"] = "ConfigMap".into();
        // Not forced: the labels are all this owns; keys are merge-patched.
        // The device plugin pods mount it: it exists even with no keys.
        api.patch(
            &ctx.configmap,
            &PatchParams::apply(MANAGER),
            &Patch::Apply(&v),
        )
        .await?;
        ctx.metrics.node_writes.inc();
        if wanted.is_none() {
            return Ok(());
        }
    }
    let body = serde_json::json!({ "data": { key: wanted } });
    api.patch(&ctx.configmap, &pp, &Patch::Merge(&body)).await?;
    ctx.metrics.node_writes.inc();
    Ok(())
}

/// The Nodes a network change replans: those its node selector matches now,
/// and those whose state carries it (it may have stopped matching them).
pub fn nodes_of_network(
    net: &RdmaNetwork,
    nodes: &[Arc<Node>],
    states: &[Arc<RdmaNodeState>],
) -> Vec<String> {
    let name = net.name_any();
    let mut out: Vec<String> = nodes
        .iter()
        .filter(|n| kroce_operator::plan::merge::selects(&net.spec, n.labels()))
        .map(|n| n.name_any())
        .collect();
    out.extend(
        states
            .iter()
            .filter(|s| carries(&s.spec, &name))
            .map(|s| s.name_any()),
    );
    out.sort();
    out.dedup();
    out
}

/// Whether a node state spec has VFs or soft devices of `network`.
/// Whether `network` is to blame for `conflict`: a conflict must never
/// change what an admitted network already has, so when the node's current
/// spec carries some of the conflict's networks and not others, only those
/// it does not carry (the newcomers) are. When it carries all or none of
/// them (both new, or an edit made two running networks clash), all are.
pub fn blamed(
    conflict: &kroce_operator::plan::merge::Conflict,
    current: Option<&RdmaNodeStateSpec>,
    network: &str,
) -> bool {
    if !conflict.networks.iter().any(|n| n == network) {
        return false;
    }
    let carried = |n: &str| current.is_some_and(|s| carries(s, n));
    let held = conflict.networks.iter().filter(|n| carried(n)).count();
    held == 0 || held == conflict.networks.len() || !carried(network)
}

/// The networks whose admission decides a node's taint or label. A node in
/// conflict keeps its last good state, marks included: only the networks
/// its current spec carries count (a newcomer that cannot be applied must
/// not take the node away from the networks already on it); `None` when
/// it carries none (the marks stay as they are).
pub fn gating_networks<'a>(
    plan: &'a NodePlan,
    current: Option<&RdmaNodeStateSpec>,
) -> Option<Vec<&'a String>> {
    if plan.desired != Desired::KeepLastGood {
        return Some(plan.selected.iter().collect());
    }
    let carried: Vec<&String> = plan
        .selected
        .iter()
        .filter(|n| current.is_some_and(|s| carries(s, n)))
        .collect();
    (!carried.is_empty()).then_some(carried)
}

pub fn carries(spec: &RdmaNodeStateSpec, network: &str) -> bool {
    spec.pfs
        .iter()
        .any(|p| p.vf_groups.iter().any(|g| g.network == network))
        || spec.soft_devices.iter().any(|g| g.network == network)
}

/// The networks a node state is about: a change to it can change their
/// status (ready nodes).
pub fn networks_of_state(s: &RdmaNodeState) -> Vec<String> {
    let mut out: Vec<String> = s
        .spec
        .pfs
        .iter()
        .flat_map(|p| p.vf_groups.iter().map(|g| g.network.clone()))
        .chain(s.spec.soft_devices.iter().map(|g| g.network.clone()))
        .collect();
    out.sort();
    out.dedup();
    out
}

pub fn error_policy(node: Arc<Node>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(node = %node.name_any(), %error, "node reconcile failed");
    ctx.metrics.failed(&error.metric_reason());
    Action::requeue(std::time::Duration::from_secs(30))
}
