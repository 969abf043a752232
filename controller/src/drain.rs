//! Draining nodes whose VFs must go but are held by pods
//! (`--drain-held-vfs`, off by default).
//!
//! The agent never pulls a VF from under a pod: it reports the holders in
//! `status.heldVfs` (and the `VfsHeld` condition). With draining on, the
//! controller takes one such node at a time: it marks it with the
//! [`DRAIN_ANNOTATION`], cordons it (unless it was already unschedulable),
//! and evicts (policy/v1 Eviction, so PodDisruptionBudgets hold) only the
//! pods the agent named. Once the agent reports no held VFs at the current
//! spec, the mark goes and the node is uncordoned, but only if kroce
//! cordoned it. Turning the flag off releases a node mid-drain the same way.
//!
//! [`plan_drain`] is the pure decision over plain data; [`step`] lists,
//! plans and acts; [`run`] repeats it.

use super::{Context, Error};
use k8s_openapi::api::core::v1::{Node, Pod};
use kroce_operator::crd::RdmaNodeState;
use kube::api::{EvictParams, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Api, Resource, ResourceExt};
use std::collections::BTreeSet;
use std::time::Duration;

/// On a node kroce is draining; the value says whether kroce cordoned it.
pub use kroce_operator::names::DRAIN_ANNOTATION;
/// kroce set `spec.unschedulable`: it clears it when done.
pub const CORDONED_BY_KROCE: &str = "cordoned";
/// The node was unschedulable already: left so when done.
pub const ALREADY_CORDONED: &str = "already-cordoned";
/// How often the drain looks at the node states.
pub const DRAIN_INTERVAL: Duration = Duration::from_secs(15);

/// A node as the drain sees it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DrainNode {
    pub name: String,
    pub unschedulable: bool,
    /// Value of [`DRAIN_ANNOTATION`], if set.
    pub mark: Option<String>,
    /// From its `RdmaNodeState`; `None` when it has none.
    pub state: Option<HeldReport>,
}

/// What the agent last reported about held VFs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HeldReport {
    /// The report is about the current spec (`observedGeneration ==
    /// generation`); an older one says nothing about what must go now.
    pub current: bool,
    /// `namespace/name` of the pods holding VFs that must go, sorted, once each.
    pub pods: Vec<String>,
    /// Held VFs without a pod kroce can name (netdev moved away, other
    /// driver, pods not listable): eviction cannot free them.
    pub unnamed: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DrainAction {
    /// Mark the node (cordoning it if `cordon`) and evict `pods`.
    Start {
        node: String,
        cordon: bool,
        pods: Vec<String>,
    },
    /// Drain under way: evict the pods still named.
    Evict { node: String, pods: Vec<String> },
    /// Done (or abandoned): drop the mark; clear `spec.unschedulable` if `uncordon`.
    Finish {
        node: String,
        uncordon: bool,
        why: String,
    },
    /// Needs a drain kroce will not start now; `why` says so.
    Wait { node: String, why: String },
}

/// A `namespace/name` a Eviction can be addressed to (DNS-1123 names).
pub fn parse_pod_ref(s: &str) -> Option<(&str, &str)> {
    let (ns, name) = s.split_once('/')?;
    let ok = |p: &str| {
        !p.is_empty()
            && p.len() <= 253
            && p.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
    };
    (ok(ns) && ok(name)).then_some((ns, name))
}

impl HeldReport {
    /// From a node state's status and generation.
    pub fn from_state(s: &RdmaNodeState) -> HeldReport {
        let Some(st) = &s.status else {
            return HeldReport::default();
        };
        let mut pods = BTreeSet::new();
        let mut unnamed = Vec::new();
        for h in &st.held_vfs {
            let named: Vec<&String> = h
                .pods
                .iter()
                .filter(|p| parse_pod_ref(p).is_some())
                .collect();
            if named.is_empty() {
                unnamed.push(h.reason.clone());
            }
            pods.extend(named.into_iter().cloned());
        }
        HeldReport {
            current: st.observed_generation.is_some()
                && st.observed_generation == s.metadata.generation,
            pods: pods.into_iter().collect(),
            unnamed,
        }
    }
}

/// Decides, for every node, what the drain does this round. At most one
/// node is drained at a time: none starts while another carries the mark.
pub fn plan_drain(nodes: &[DrainNode], enabled: bool) -> Vec<DrainAction> {
    let mut sorted: Vec<&DrainNode> = nodes.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    let mut actions = Vec::new();
    let mut draining: Option<&str> = None;
    for n in sorted.iter().filter(|n| n.mark.is_some()) {
        let uncordon = n.mark.as_deref() == Some(CORDONED_BY_KROCE);
        let finish = |why: &str| DrainAction::Finish {
            node: n.name.clone(),
            uncordon,
            why: why.to_string(),
        };
        match &n.state {
            _ if !enabled => actions.push(finish("draining is off (--drain-held-vfs=false)")),
            None => actions.push(finish("the node has no RdmaNodeState any more")),
            Some(s) if s.current && s.pods.is_empty() => {
                actions.push(finish("no pod holds a VF that must go"));
            }
            Some(s) => {
                if !s.pods.is_empty() {
                    actions.push(DrainAction::Evict {
                        node: n.name.clone(),
                        pods: s.pods.clone(),
                    });
                }
                // A stale report: wait for the agent, still draining.
                draining.get_or_insert(&n.name);
            }
        }
    }
    for n in sorted.iter().filter(|n| n.mark.is_none()) {
        let Some(s) = &n.state else { continue };
        if !s.current {
            continue;
        }
        if s.pods.is_empty() {
            if !s.unnamed.is_empty() {
                actions.push(DrainAction::Wait {
                    node: n.name.clone(),
                    why: format!("held VFs without a pod to evict: {}", s.unnamed.join("; ")),
                });
            }
            continue;
        }
        if !enabled {
            continue;
        }
        match draining {
            Some(other) => actions.push(DrainAction::Wait {
                node: n.name.clone(),
                why: format!("node {other} is being drained; one node at a time"),
            }),
            None => {
                draining = Some(&n.name);
                actions.push(DrainAction::Start {
                    node: n.name.clone(),
                    cordon: !n.unschedulable,
                    pods: s.pods.clone(),
                });
            }
        }
    }
    actions
}

async fn node_event(ctx: &Context, node: &Node, type_: EventType, reason: &str, note: String) {
    ctx.event(&node.object_ref(&()), type_, reason, reason, note)
        .await;
}

/// Evicts each pod; gone already is fine, a PodDisruptionBudget refusal
/// (429) waits for the next round. Returns one line per pod.
async fn evict(ctx: &Context, pods: &[String], errors: &mut Vec<kube::Error>) -> Vec<String> {
    let mut out = Vec::new();
    for p in pods {
        let Some((ns, name)) = parse_pod_ref(p) else {
            continue;
        };
        let api: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
        match api.evict(name, &EvictParams::default()).await {
            Ok(_) => out.push(format!("evicted {p}")),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(kube::Error::Api(s)) if s.code == 429 => {
                out.push(format!("eviction of {p} refused for now: {}", s.message));
            }
            Err(e) => errors.push(e),
        }
    }
    out
}

/// One round: nodes and node states from the stores, plan, act. Every
/// action is tried; the first error is returned after the rest ran.
pub async fn step(ctx: &Context, enabled: bool) -> Result<Vec<DrainAction>, Error> {
    let nodes = ctx.stores.nodes();
    let states = ctx.stores.states_by_name();
    let views: Vec<DrainNode> = nodes
        .iter()
        .map(|n| DrainNode {
            name: n.name_any(),
            unschedulable: n
                .spec
                .as_ref()
                .and_then(|s| s.unschedulable)
                .unwrap_or(false),
            mark: n.annotations().get(DRAIN_ANNOTATION).cloned(),
            state: states.get(&n.name_any()).map(|s| HeldReport::from_state(s)),
        })
        .collect();
    let actions = plan_drain(&views, enabled);
    let api: Api<Node> = Api::all(ctx.client.clone());
    let pp = PatchParams::default();
    let mut errors = Vec::new();
    for a in &actions {
        let node_name = match a {
            DrainAction::Start { node, .. }
            | DrainAction::Evict { node, .. }
            | DrainAction::Finish { node, .. }
            | DrainAction::Wait { node, .. } => node,
        };
        let Some(node) = nodes.iter().find(|n| n.name_any() == *node_name) else {
            continue;
        };
        match a {
            DrainAction::Start { cordon, pods, .. } => {
                let mark = if *cordon {
                    CORDONED_BY_KROCE
                } else {
                    ALREADY_CORDONED
                };
                let mut patch = serde_json::json!({
                    "metadata": {"annotations": {DRAIN_ANNOTATION: mark}}
                });
                if *cordon {
                    patch["spec"] = serde_json::json!({"unschedulable": true});
                }
                if let Err(e) = api.patch(node_name, &pp, &Patch::Merge(&patch)).await {
                    errors.push(e);
                    continue;
                }
                let evicted = evict(ctx, pods, &mut errors).await;
                node_event(
                    ctx,
                    node,
                    EventType::Warning,
                    "DrainingHeldVfs",
                    format!(
                        "{}; pods hold VFs that must go: {}",
                        if *cordon {
                            "cordoned"
                        } else {
                            "already unschedulable"
                        },
                        if evicted.is_empty() {
                            pods.join(", ")
                        } else {
                            evicted.join(", ")
                        }
                    ),
                )
                .await;
            }
            DrainAction::Evict { pods, .. } => {
                let evicted = evict(ctx, pods, &mut errors).await;
                if !evicted.is_empty() {
                    node_event(
                        ctx,
                        node,
                        EventType::Normal,
                        "EvictingHeldVfs",
                        evicted.join(", "),
                    )
                    .await;
                }
            }
            DrainAction::Finish { uncordon, why, .. } => {
                let mut patch = serde_json::json!({
                    "metadata": {"annotations": {DRAIN_ANNOTATION: null}}
                });
                if *uncordon {
                    patch["spec"] = serde_json::json!({"unschedulable": null});
                }
                if let Err(e) = api.patch(node_name, &pp, &Patch::Merge(&patch)).await {
                    errors.push(e);
                    continue;
                }
                node_event(
                    ctx,
                    node,
                    EventType::Normal,
                    "DrainFinished",
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
            DrainAction::Wait { why, .. } => {
                tracing::info!(node = %node_name, %why, "not draining");
            }
        }
    }
    match errors.into_iter().next() {
        Some(e) => Err(e.into()),
        None => Ok(actions),
    }
}

/// Repeats [`step`] every [`DRAIN_INTERVAL`]. Off, it runs once (releasing
/// any node an earlier run left marked) and then idles.
pub async fn run(ctx: Context, enabled: bool) -> anyhow::Result<()> {
    loop {
        match step(&ctx, enabled).await {
            Ok(actions) => {
                for a in actions
                    .iter()
                    .filter(|a| !matches!(a, DrainAction::Wait { .. }))
                {
                    tracing::info!(action = ?a, "drain");
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "drain round failed");
                ctx.metrics.failed("Drain");
            }
        }
        if !enabled {
            std::future::pending::<()>().await;
        }
        tokio::time::sleep(DRAIN_INTERVAL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, pods: &[&str]) -> DrainNode {
        DrainNode {
            name: name.into(),
            state: Some(HeldReport {
                current: true,
                pods: pods.iter().map(|p| p.to_string()).collect(),
                unnamed: vec![],
            }),
            ..Default::default()
        }
    }

    #[test]
    fn one_node_at_a_time_and_only_the_named_pods() {
        let nodes = [
            node("n2", &["team-a/b-0"]),
            node("n1", &["team-a/a-0", "team-b/a-1"]),
            node("n3", &[]),
        ];
        let a = plan_drain(&nodes, true);
        assert_eq!(
            a,
            [
                DrainAction::Start {
                    node: "n1".into(),
                    cordon: true,
                    pods: vec!["team-a/a-0".into(), "team-b/a-1".into()],
                },
                DrainAction::Wait {
                    node: "n2".into(),
                    why: "node n1 is being drained; one node at a time".into()
                },
            ]
        );
        // Off: nothing starts.
        assert!(plan_drain(&nodes, false).is_empty());
    }

    #[test]
    fn a_drain_continues_then_finishes_and_uncordons_only_what_kroce_cordoned() {
        let mut n1 = node("n1", &["team-a/a-0"]);
        n1.mark = Some(CORDONED_BY_KROCE.into());
        n1.unschedulable = true;
        let n2 = node("n2", &["team-a/b-0"]);
        assert_eq!(
            plan_drain(&[n1.clone(), n2.clone()], true),
            [
                DrainAction::Evict {
                    node: "n1".into(),
                    pods: vec!["team-a/a-0".into()]
                },
                DrainAction::Wait {
                    node: "n2".into(),
                    why: "node n1 is being drained; one node at a time".into()
                },
            ]
        );
        // The agent has not re-reported since the spec changed: keep waiting.
        let mut stale = n1.clone();
        stale.state = Some(HeldReport {
            current: false,
            ..Default::default()
        });
        assert!(matches!(
            plan_drain(&[stale, n2.clone()], true)[..],
            [DrainAction::Wait { .. }]
        ));
        // Nothing held at the current spec: done, and n2's turn comes in
        // the same round (n1 is released first).
        n1.state = Some(HeldReport {
            current: true,
            ..Default::default()
        });
        let a = plan_drain(&[n2.clone(), n1.clone()], true);
        assert!(
            matches!(
                &a[..],
                [
                    DrainAction::Finish { node: f, uncordon: true, .. },
                    DrainAction::Start { node: s, .. },
                ] if f == "n1" && s == "n2"
            ),
            "{a:?}"
        );
        // A node that was cordoned before kroce came stays cordoned.
        n1.mark = Some(ALREADY_CORDONED.into());
        assert!(matches!(
            &plan_drain(&[n1.clone()], true)[..],
            [DrainAction::Finish {
                uncordon: false,
                ..
            }]
        ));
        // Turning draining off releases a node mid-drain.
        let mut mid = node("n1", &["team-a/a-0"]);
        mid.mark = Some(CORDONED_BY_KROCE.into());
        assert!(matches!(
            &plan_drain(&[mid.clone()], false)[..],
            [DrainAction::Finish { uncordon: true, .. }]
        ));
        // And so does a node state that went away.
        mid.state = None;
        assert!(matches!(
            &plan_drain(&[mid], true)[..],
            [DrainAction::Finish { .. }]
        ));
    }

    #[test]
    fn an_unschedulable_node_is_not_cordoned_again_and_unnamed_holders_wait() {
        let mut n = node("n1", &["team-a/a-0"]);
        n.unschedulable = true;
        assert!(matches!(
            &plan_drain(&[n], true)[..],
            [DrainAction::Start { cordon: false, .. }]
        ));
        let mut u = node("n1", &[]);
        if let Some(s) = u.state.as_mut() {
            s.unnamed = vec!["VF 5 (0000:3b:00.7) has no netdev in the host namespace".into()];
        }
        let a = plan_drain(&[u], true);
        assert!(
            matches!(&a[..], [DrainAction::Wait { why, .. }] if why.contains("VF 5")),
            "{a:?}"
        );
    }

    #[test]
    fn held_report_names_only_addressable_pods() {
        let mut s = RdmaNodeState::new("n1", Default::default());
        s.metadata.generation = Some(3);
        s.status = Some(kroce_operator::crd::RdmaNodeStateStatus {
            observed_generation: Some(3),
            held_vfs: vec![
                kroce_operator::crd::HeldVf {
                    pods: vec!["team-a/a-0".into(), "team-a/a-0".into()],
                    reason: "VF 1 held".into(),
                    ..Default::default()
                },
                kroce_operator::crd::HeldVf {
                    pods: vec!["unknown pods (cannot list pods on this node: 403)".into()],
                    reason: "VF 2 held by unknown pods".into(),
                    ..Default::default()
                },
            ],
            ..Default::default()
        });
        let r = HeldReport::from_state(&s);
        assert!(r.current);
        assert_eq!(r.pods, ["team-a/a-0"]);
        assert_eq!(r.unnamed, ["VF 2 held by unknown pods"]);
        s.metadata.generation = Some(4);
        assert!(!HeldReport::from_state(&s).current);
        assert_eq!(parse_pod_ref("a/b"), Some(("a", "b")));
        assert_eq!(parse_pod_ref("a/"), None);
        assert_eq!(parse_pod_ref("A/b"), None);
    }

    use crate::metrics::Metrics;
    use kroce_operator::testing::mock::ApiServer;
    use serde_json::{Value, json};
    use std::sync::Arc;

    const CORE: &str = "/api/v1";
    const KROCE: &str = "/apis/kroce.io/v1alpha1";

    fn held_state(node: &str, pods: &[&str]) -> Value {
        json!({
            "apiVersion": "kroce.io/v1alpha1", "kind": "RdmaNodeState",
            "metadata": {"name": node, "generation": 2},
            "spec": {"nodeName": node, "pfs": []},
            "status": {
                "observedGeneration": 2, "syncState": "InProgress",
                "heldVfs": [{"pf": "0000:3b:00.0", "index": 1, "pciAddress": "0000:3b:00.3",
                             "pods": pods, "reason": "VF 1 (0000:3b:00.3) held"}]
            }
        })
    }

    fn pod(ns: &str, name: &str, node: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": ns}, "spec": {"nodeName": node}})
    }

    fn node_obj(server: &ApiServer, name: &str) -> Value {
        server.get(CORE, "nodes", "", name).unwrap()
    }

    fn is_cordoned(n: &Value) -> bool {
        n["spec"]["unschedulable"] == json!(true)
    }

    #[tokio::test]
    async fn drains_one_node_at_a_time_against_the_api() {
        let (client, server) = ApiServer::start();
        let ctx = Context::new(
            client,
            "kroce-system",
            "kroce-device-plugin",
            Arc::new(Metrics::default()),
            crate::test_world::snapshot(&ApiServer::default()),
        );
        server.insert(
            CORE,
            "nodes",
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}),
        );
        // n2 was cordoned by an admin before.
        server.insert(
            CORE,
            "nodes",
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n2"},
                                             "spec": {"unschedulable": true}}),
        );
        server.insert(KROCE, "rdmanodestates", held_state("n1", &["team-a/a-0"]));
        server.insert(KROCE, "rdmanodestates", held_state("n2", &["team-a/b-0"]));
        for (ns, name, node) in [
            ("team-a", "a-0", "n1"),
            ("team-a", "web", "n1"),
            ("team-a", "b-0", "n2"),
        ] {
            server.insert(CORE, "pods", pod(ns, name, node));
        }

        // Off: nothing happens to anyone.
        step(&ctx, false).await.unwrap();
        assert!(!is_cordoned(&node_obj(&server, "n1")));
        assert!(server.get(CORE, "pods", "team-a", "a-0").is_some());

        // On: n1 is cordoned and marked, only its holding pod is evicted; n2 waits.
        step(&crate::test_world::fresh(&ctx, &server), true)
            .await
            .unwrap();
        let n1 = node_obj(&server, "n1");
        assert!(is_cordoned(&n1), "{n1}");
        assert_eq!(
            n1["metadata"]["annotations"][DRAIN_ANNOTATION],
            CORDONED_BY_KROCE
        );
        assert!(
            server.get(CORE, "pods", "team-a", "a-0").is_none(),
            "holder evicted"
        );
        assert!(
            server.get(CORE, "pods", "team-a", "web").is_some(),
            "bystander kept"
        );
        assert!(
            server.get(CORE, "pods", "team-a", "b-0").is_some(),
            "n2 waits its turn"
        );
        assert!(
            node_obj(&server, "n2")["metadata"]["annotations"]
                .get(DRAIN_ANNOTATION)
                .is_none()
        );
        assert!(
            server
                .requests()
                .iter()
                .any(|r| r == "POST /api/v1/namespaces/team-a/pods/a-0/eviction"),
            "{:?}",
            server.requests()
        );

        // The agent has not re-reported: the eviction is repeated (the pod is
        // already gone, which is fine) and n1 stays cordoned.
        step(&crate::test_world::fresh(&ctx, &server), true)
            .await
            .unwrap();
        assert!(is_cordoned(&node_obj(&server, "n1")));

        // The agent now reports nothing held: n1 is uncordoned and unmarked,
        // and in the same round (n1 released first) n2's turn comes, where a
        // PodDisruptionBudget refuses the eviction for now.
        if let Ok(mut r) = server.refuse_eviction.lock() {
            r.push("team-a/b-0".into());
        }
        server.edit(KROCE, "rdmanodestates", "", "n1", |o| {
            o["status"]["heldVfs"] = json!([]);
            o["status"]["syncState"] = "Succeeded".into();
        });
        let actions = step(&crate::test_world::fresh(&ctx, &server), true)
            .await
            .unwrap();
        assert!(
            matches!(&actions[0], DrainAction::Finish { node, uncordon: true, .. } if node == "n1"),
            "{actions:?}"
        );
        let n1 = node_obj(&server, "n1");
        assert!(!is_cordoned(&n1), "{n1}");
        assert!(
            n1["metadata"]["annotations"]
                .get(DRAIN_ANNOTATION)
                .is_none(),
            "{n1}"
        );

        let n2 = node_obj(&server, "n2");
        assert_eq!(
            n2["metadata"]["annotations"][DRAIN_ANNOTATION],
            ALREADY_CORDONED
        );
        assert!(
            server.get(CORE, "pods", "team-a", "b-0").is_some(),
            "PDB holds it"
        );
        // The budget allows it later; the agent reports clean; n2 stays
        // unschedulable as the admin left it.
        if let Ok(mut r) = server.refuse_eviction.lock() {
            r.clear();
        }
        step(&crate::test_world::fresh(&ctx, &server), true)
            .await
            .unwrap();
        assert!(server.get(CORE, "pods", "team-a", "b-0").is_none());
        server.edit(KROCE, "rdmanodestates", "", "n2", |o| {
            o["status"]["heldVfs"] = json!([]);
        });
        step(&crate::test_world::fresh(&ctx, &server), true)
            .await
            .unwrap();
        let n2 = node_obj(&server, "n2");
        assert!(is_cordoned(&n2), "admin's cordon kept: {n2}");
        assert!(
            n2["metadata"]["annotations"]
                .get(DRAIN_ANNOTATION)
                .is_none()
        );
        assert!(
            server
                .requests()
                .iter()
                .any(|r| r.starts_with("POST /apis/events.k8s.io/v1/namespaces/default/events")),
            "drain changes are published as events"
        );
    }
}
