//! What one reconcile writes: node state specs, the device plugin
//! ConfigMap, attachment definitions, the network's status, events.

use super::{Context, Error, MANAGER};
use crate::crd::conditions::stamp_transitions;
use crate::crd::{
    Condition, RdmaNetwork, RdmaNetworkStatus, RdmaNodeState, RdmaNodeStateSpec, SyncState,
};
use crate::plan::device_plugin::config_key;
use crate::plan::merge::Desired;
use crate::plan::nad::{
    MANAGED_BY_LABEL, NETWORK_LABEL, NetworkAttachmentDefinition, attachment_definition,
};
use crate::plan::{ClusterPlan, NetworkInput, NodeInput, plan_cluster};
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DeleteParams, ListParams, ObjectMeta, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Api, Resource, ResourceExt};
use std::collections::BTreeMap;
use std::time::Duration;

/// Everything listed once per reconcile.
struct World {
    networks: Vec<RdmaNetwork>,
    nodes: Vec<Node>,
    states: BTreeMap<String, RdmaNodeState>,
}

async fn list_world(ctx: &Context) -> Result<World, Error> {
    let lp = ListParams::default();
    let networks = Api::<RdmaNetwork>::all(ctx.client.clone())
        .list(&lp)
        .await?
        .items;
    let nodes = Api::<Node>::all(ctx.client.clone()).list(&lp).await?.items;
    let states = super::list_node_states(ctx).await?;
    Ok(World {
        networks,
        nodes,
        states,
    })
}

fn plan_world(world: &World) -> ClusterPlan {
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
    plan_cluster(&nodes, &networks)
}

async fn publish(ctx: &Context, net: &RdmaNetwork, type_: EventType, reason: &str, note: String) {
    ctx.event(&net.object_ref(&()), type_, reason, reason, note)
        .await;
}

/// Applies node state specs and the device plugin ConfigMap for the whole
/// plan; returns one line per change.
async fn sync_nodes(
    ctx: &Context,
    world: &World,
    plan: &ClusterPlan,
) -> Result<Vec<String>, Error> {
    let api: Api<RdmaNodeState> = Api::all(ctx.client.clone());
    let pp = PatchParams::apply(MANAGER).force();
    let mut changes = Vec::new();
    for np in &plan.nodes {
        let current = world.states.get(&np.node);
        let desired = match (&np.desired, current) {
            (Desired::Spec(s), Some(_)) => Some(s.clone()),
            // Nodes nothing selects get no object; ones that had one are emptied above.
            (Desired::Spec(s), None) if !s.pfs.is_empty() || !np.selected.is_empty() => {
                Some(s.clone())
            }
            (Desired::AwaitInventory, None) => Some(RdmaNodeStateSpec {
                node_name: np.node.clone(),
                ..Default::default()
            }),
            _ => None,
        };
        let Some(spec) = desired else { continue };
        if current.is_some_and(|c| c.spec == spec) {
            continue;
        }
        let node = world.nodes.iter().find(|n| n.name_any() == np.node);
        let mut obj = RdmaNodeState::new(&np.node, spec);
        obj.metadata.labels = Some(BTreeMap::from([(
            MANAGED_BY_LABEL.to_string(),
            MANAGER.to_string(),
        )]));
        // Owned by the Node: deleting the node garbage-collects its state.
        obj.metadata.owner_references = node.and_then(|n| {
            Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: n.name_any(),
                uid: n.uid()?,
                ..Default::default()
            }])
        });
        api.patch(&np.node, &pp, &Patch::Apply(&obj)).await?;
        changes.push(format!(
            "node {}: RdmaNodeState {} ({} PFs)",
            np.node,
            if current.is_some() {
                "updated"
            } else {
                "created"
            },
            obj.spec.pfs.len()
        ));
    }
    // The device plugin's pools, one key per node.
    let cms: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let existing = cms.get_opt(&ctx.configmap).await?;
    let old: BTreeMap<String, String> = existing
        .as_ref()
        .and_then(|c| c.data.clone())
        .unwrap_or_default();
    let mut data = BTreeMap::new();
    for np in &plan.nodes {
        let key = config_key(&np.node);
        match (&np.device_plugin, old.get(&key)) {
            (Some(cfg), prev) => {
                if !np.selected.is_empty() || world.states.contains_key(&np.node) {
                    // Pools appear only once the node state carrying them is applied.
                    let spec = match &np.desired {
                        Desired::Spec(s) => Some(s),
                        _ => None,
                    };
                    let state = world.states.get(&np.node);
                    let prev = prev.map(String::as_str);
                    if let Some(c) = super::admission::advertised_pools(cfg, spec, state, prev) {
                        data.insert(key, c.to_yaml()?);
                    }
                }
            }
            // Conflict or no inventory yet: keep what the node had.
            (None, Some(prev)) => {
                data.insert(key, prev.clone());
            }
            (None, None) => {}
        }
    }
    if existing.is_none() || old != data {
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
            data: Some(data),
            ..Default::default()
        };
        let mut v = serde_json::to_value(&cm).map_err(|source| Error::Json {
            what: "ConfigMap",
            source,
        })?;
        v["apiVersion"] = "v1".into();
        v["kind"] = "ConfigMap".into();
        cms.patch(&ctx.configmap, &pp, &Patch::Apply(&v)).await?;
        changes.push(format!(
            "ConfigMap {}/{} updated",
            ctx.namespace, ctx.configmap
        ));
    }
    Ok(changes)
}

/// This network's attachment definitions: applied in each listed
/// namespace, deleted from namespaces no longer listed.
async fn sync_nads(ctx: &Context, net: &RdmaNetwork, keep: bool) -> Result<Vec<String>, Error> {
    let name = net.name_any();
    let mut changes = Vec::new();
    let all: Api<NetworkAttachmentDefinition> = Api::all(ctx.client.clone());
    let lp = ListParams::default().labels(&format!("{NETWORK_LABEL}={name}"));
    let existing = all.list(&lp).await?.items;
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
                && c.annotations().get(crate::plan::nad::RESOURCE_ANNOTATION)
                    == nad.annotations().get(crate::plan::nad::RESOURCE_ANNOTATION)
        });
        if same {
            continue;
        }
        let api: Api<NetworkAttachmentDefinition> = Api::namespaced(ctx.client.clone(), ns);
        api.patch(&name, &pp, &Patch::Apply(&nad)).await?;
        changes.push(format!("NetworkAttachmentDefinition {ns}/{name} applied"));
    }
    for e in &existing {
        let Some(ns) = e.namespace() else { continue };
        if wanted.iter().any(|w| **w == ns) {
            continue;
        }
        let api: Api<NetworkAttachmentDefinition> = Api::namespaced(ctx.client.clone(), &ns);
        match api.delete(&e.name_any(), &DeleteParams::default()).await {
            Ok(_) => changes.push(format!(
                "NetworkAttachmentDefinition {ns}/{} deleted",
                e.name_any()
            )),
            // Already gone is fine: cleanup never fails on absent state.
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(changes)
}

/// The network's status from the plan and the node states.
pub(crate) fn network_status(
    net: &RdmaNetwork,
    plan: &ClusterPlan,
    states: &BTreeMap<String, RdmaNodeState>,
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
    let conflicts: Vec<String> = plan
        .conflicts_of(&name)
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
                "{} (affected nodes keep their last good state)",
                conflicts.join("; ")
            ),
        )
    } else {
        Condition::new("Degraded", false, "NoConflicts", "")
    };
    let matched_n = matched.len() as u32;
    let is_degraded = degraded.is_true();
    conditions.push(if is_degraded {
        Condition::new(
            "Ready",
            false,
            &degraded.reason.clone(),
            degraded.message.clone(),
        )
    } else if matched_n == 0 {
        Condition::new(
            "Ready",
            false,
            "NoMatchingNodes",
            "no node has a PF that nicSelector matches (or no agent has reported yet)",
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
    for c in &mut conditions {
        c.observed_generation = net.metadata.generation;
    }
    RdmaNetworkStatus {
        observed_generation: net.metadata.generation,
        conditions,
        matched_nodes: matched_n,
        ready_nodes: ready,
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
    if previous == status {
        return Ok(false);
    }
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
    let world = list_world(ctx).await?;
    let plan = plan_world(&world);
    let name = net.name_any();
    ctx.metrics.conflicts.set(
        plan.nodes
            .iter()
            .filter(|n| !n.conflicts.is_empty())
            .count() as i64,
    );
    let mut changes = sync_nodes(ctx, &world, &plan).await?;
    let valid = !plan.invalid.contains_key(&name);
    // An invalid spec keeps its existing attachment definitions untouched.
    if valid {
        changes.extend(sync_nads(ctx, net, true).await?);
    }
    let status = network_status(net, &plan, &world.states);
    let degraded = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Degraded" && c.is_true())
        .cloned();
    let changed_status = patch_status(ctx, net, status).await?;
    for c in &changes {
        publish(ctx, net, EventType::Normal, "Applied", c.clone()).await;
    }
    if let Some(d) = degraded
        && changed_status
    {
        publish(ctx, net, EventType::Warning, &d.reason, d.message).await;
    }
    let wake = super::admission::reconcile_network(ctx, net, &plan).await?;
    Ok(Action::requeue(wake.min(Duration::from_secs(300))))
}

pub(crate) async fn cleanup(net: &RdmaNetwork, ctx: &Context) -> Result<Action, Error> {
    // Attachment definitions first (pods can no longer name the network),
    // then the node states without this network (the agents remove its VFs).
    let mut changes = sync_nads(ctx, net, false).await?;
    // Also namespaces listed in the spec whose NAD lost its label.
    for ns in &net.spec.network_namespaces {
        let api: Api<NetworkAttachmentDefinition> = Api::namespaced(ctx.client.clone(), ns);
        if let Some(nad) = api.get_opt(&net.name_any()).await?
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
    let world = list_world(ctx).await?;
    let plan = plan_world(&world);
    changes.extend(sync_nodes(ctx, &world, &plan).await?);
    super::admission::cleanup_network(ctx, net, &plan).await?;
    for c in &changes {
        publish(ctx, net, EventType::Normal, "Cleanup", c.clone()).await;
    }
    Ok(Action::await_change())
}
