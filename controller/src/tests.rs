//! Reconcile scenarios against the in-memory API server.

use super::{Context, FINALIZER, error_policy, reconcile};
use crate::metrics::Metrics;
use crate::test_world::{fresh, node_pass};
use kroce_operator::crd::{RdmaNetwork, RdmaNodeState};
use kroce_operator::testing::mock::ApiServer;
use serde_json::{Value, json};
use std::sync::Arc;

const KROCE: &str = "/apis/kroce.io/v1alpha1";
const CORE: &str = "/api/v1";
const NADS: &str = "/apis/k8s.cni.cncf.io/v1";

fn node(name: &str, labels: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}})
}

fn inventory() -> Value {
    json!([
        {"pciAddress": "0000:3b:00.0", "ifName": "ens1f0", "vendor": "15b3", "deviceID": "101d",
         "totalVfs": 127, "numVfs": 0, "numaNode": 0},
        {"pciAddress": "0000:86:00.0", "ifName": "ens2f0", "vendor": "15b3", "deviceID": "101d",
         "totalVfs": 127, "numVfs": 0, "numaNode": 1}
    ])
}

fn node_state_with_inventory(name: &str) -> Value {
    json!({
        "apiVersion": "kroce.io/v1alpha1", "kind": "RdmaNodeState",
        "metadata": {"name": name},
        "spec": {"nodeName": name, "pfs": []},
        "status": {"pfs": inventory(), "syncState": "Pending"}
    })
}

fn network(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "kroce.io/v1alpha1", "kind": "RdmaNetwork",
           "metadata": {"name": name}, "spec": spec})
}

fn setup() -> (Arc<Context>, ApiServer) {
    let (client, server) = ApiServer::start();
    let ctx = Context::new(
        client,
        "kroce-system",
        "kroce-device-plugin",
        Arc::new(Metrics::default()),
        crate::test_world::snapshot(&server),
    );
    (Arc::new(ctx), server)
}

async fn reconcile_named(ctx: &Arc<Context>, server: &ApiServer, name: &str) {
    let v = server
        .get(KROCE, "rdmanetworks", "", name)
        .unwrap_or_else(|| panic!("no network {name}"));
    let net: RdmaNetwork = serde_json::from_value(v).unwrap();
    match reconcile(Arc::new(net), fresh(ctx, server)).await {
        // A deleting network waits for the node loop (below).
        Ok(_) | Err(crate::Error::Finalizer(_)) if is_deleting(server, name) => {}
        r => {
            r.unwrap();
        }
    }
    // The node loop follows what changed, then the network sees it.
    node_pass(ctx, server).await;
    if let Some(v) = server.get(KROCE, "rdmanetworks", "", name) {
        let net: RdmaNetwork = serde_json::from_value(v).unwrap();
        reconcile(Arc::new(net), fresh(ctx, server)).await.unwrap();
    }
}

fn is_deleting(server: &ApiServer, name: &str) -> bool {
    server
        .get(KROCE, "rdmanetworks", "", name)
        .is_some_and(|v| !v["metadata"]["deletionTimestamp"].is_null())
}

/// First pass adds the finalizer, the second applies (as the watch would).
async fn reconcile_twice(ctx: &Arc<Context>, server: &ApiServer, name: &str) {
    reconcile_named(ctx, server, name).await;
    reconcile_named(ctx, server, name).await;
}

fn fast_and_bulk(server: &ApiServer) {
    server.insert(CORE, "nodes", node("n1", json!({"rdma": "yes"})));
    server.insert(CORE, "nodes", node("n2", json!({"rdma": "yes"})));
    server.insert(CORE, "nodes", node("n3", json!({})));
    server.insert(KROCE, "rdmanodestates", node_state_with_inventory("n1"));
    server.insert(
        KROCE,
        "rdmanetworks",
        network(
            "fast",
            json!({
                "nodeSelector": {"rdma": "yes"},
                "nicSelector": {"pfNames": ["ens1f0#0-3"]},
                "numVfs": 8, "resourceName": "vf", "mtu": 9000, "vlan": 100,
                "memlock": "unlimited",
                "ipam": {"type": "host-local", "subnet": "10.56.0.0/24"},
                "networkNamespaces": ["team-a", "team-b"]
            }),
        ),
    );
    server.insert(
        KROCE,
        "rdmanetworks",
        network(
            "bulk",
            json!({
                "nodeSelector": {"rdma": "yes"},
                "nicSelector": {"pfNames": ["ens1f0#4-7"]},
                "numVfs": 8, "networkNamespaces": ["team-a"]
            }),
        ),
    );
}

fn state(server: &ApiServer, name: &str) -> Option<RdmaNodeState> {
    server
        .get(KROCE, "rdmanodestates", "", name)
        .map(|v| serde_json::from_value(v).unwrap())
}

fn net_status(server: &ApiServer, name: &str) -> Value {
    server.get(KROCE, "rdmanetworks", "", name).unwrap()["status"].clone()
}

fn condition(status: &Value, t: &str) -> Value {
    status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == t)
        .cloned()
        .unwrap_or_else(|| panic!("no {t} in {status}"))
}

#[tokio::test]
async fn creates_node_states_attachment_definitions_and_device_plugin_config() {
    let (ctx, server) = setup();
    fast_and_bulk(&server);
    reconcile_twice(&ctx, &server, "fast").await;

    let net = server.get(KROCE, "rdmanetworks", "", "fast").unwrap();
    assert_eq!(net["metadata"]["finalizers"], json!([FINALIZER]));

    // n1: both networks merged on ens1f0 with disjoint ranges, owned by its Node.
    let n1 = state(&server, "n1").unwrap();
    assert_eq!(n1.spec.pfs.len(), 1);
    let pf = &n1.spec.pfs[0];
    assert_eq!(
        (pf.pci_address.as_str(), pf.num_vfs, pf.mtu),
        ("0000:3b:00.0", 8, Some(9000))
    );
    let groups: Vec<(&str, &str, &str)> = pf
        .vf_groups
        .iter()
        .map(|g| {
            (
                g.network.as_str(),
                g.resource_name.as_str(),
                g.vf_range.as_str(),
            )
        })
        .collect();
    assert_eq!(
        groups,
        [("bulk", "rdma/bulk", "4-7"), ("fast", "rdma/vf", "0-3")]
    );
    let owner = &n1.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!((owner.kind.as_str(), owner.name.as_str()), ("Node", "n1"));
    assert!(owner.uid.starts_with("uid-n1"));
    // n2 has no inventory yet: an empty state for its agent to report into.
    assert!(state(&server, "n2").unwrap().spec.pfs.is_empty());
    // n3 is selected by nothing.
    assert!(state(&server, "n3").is_none());

    // No pools before the agent has applied n1's state (they follow below).
    let cm = server
        .get(CORE, "configmaps", "kroce-system", "kroce-device-plugin")
        .unwrap();
    assert!(cm["data"].get("n1.yaml").is_none(), "{cm}");

    // Attachment definitions in both namespaces (bulk's come with its own reconcile).
    for ns in ["team-a", "team-b"] {
        let nad = server
            .get(NADS, "network-attachment-definitions", ns, "fast")
            .unwrap_or_else(|| panic!("no NAD in {ns}"));
        assert_eq!(
            nad["metadata"]["annotations"]["k8s.v1.cni.cncf.io/resourceName"],
            "rdma/vf"
        );
        let cfg: Value = serde_json::from_str(nad["spec"]["config"].as_str().unwrap()).unwrap();
        assert_eq!(cfg["type"], "kroce-cni");
        assert_eq!(cfg["vlan"], 100);
        assert_eq!(cfg["mtu"], 9000);
        assert_eq!(cfg["ipam"]["type"], "host-local");
    }
    assert!(
        server
            .get(NADS, "network-attachment-definitions", "team-a", "bulk")
            .is_none()
    );

    // Status: one matched node, not ready yet.
    let st = net_status(&server, "fast");
    assert_eq!(st["matchedNodes"], 1);
    assert_eq!(st["readyNodes"], 0);
    assert_eq!(condition(&st, "Progressing")["status"], "True");
    assert_eq!(condition(&st, "Degraded")["status"], "False");
    assert_eq!(condition(&st, "Ready")["status"], "False");
    assert!(
        server
            .requests()
            .iter()
            .any(|r| r.starts_with("POST /apis/events.k8s.io/v1/namespaces/default/events")),
        "no event published: {:?}",
        server.requests()
    );

    // The agent reports n1 applied: the network becomes Ready.
    server.edit(KROCE, "rdmanodestates", "", "n1", |o| {
        let generation = o["metadata"]["generation"].clone();
        o["status"]["observedGeneration"] = generation;
        o["status"]["syncState"] = "Succeeded".into();
    });
    reconcile_named(&ctx, &server, "fast").await;
    let st = net_status(&server, "fast");
    assert_eq!(st["readyNodes"], 1);
    assert_eq!(condition(&st, "Ready")["status"], "True");
    assert_eq!(condition(&st, "Progressing")["status"], "False");

    // Applied: the device plugin's pools for n1, none yet for n2.
    let cm = server
        .get(CORE, "configmaps", "kroce-system", "kroce-device-plugin")
        .unwrap();
    let yaml = cm["data"]["n1.yaml"].as_str().unwrap();
    let cfg: kroce_operator::plan::DevicePluginConfig = serde_saphyr::from_str(yaml).unwrap();
    let pools: Vec<(&str, Vec<&str>, Option<&str>)> = cfg
        .pools
        .iter()
        .map(|p| {
            (
                p.resource_name.as_str(),
                p.selectors.pf_names.iter().map(String::as_str).collect(),
                p.memlock.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        pools,
        [
            ("rdma/bulk", vec!["ens1f0#4-7"], None),
            ("rdma/vf", vec!["ens1f0#0-3"], Some("unlimited"))
        ]
    );
    assert!(cm["data"].get("n2.yaml").is_none());

    // A quiet reconcile writes nothing.
    let before = server.requests().len();
    reconcile_named(&ctx, &server, "fast").await;
    let writes: Vec<String> = server.requests()[before..]
        .iter()
        .filter(|r| !r.starts_with("GET"))
        .cloned()
        .collect();
    assert!(writes.is_empty(), "{writes:?}");
}

#[tokio::test]
async fn conflict_keeps_last_good_state_and_degrades_only_the_newcomer() {
    let (ctx, server) = setup();
    fast_and_bulk(&server);
    reconcile_twice(&ctx, &server, "fast").await;
    let good = state(&server, "n1").unwrap().spec;
    let cm_before = server
        .get(CORE, "configmaps", "kroce-system", "kroce-device-plugin")
        .unwrap()["data"]["n1.yaml"]
        .clone();
    // "wide" claims ens1f0 with a different VF count.
    server.insert(
        KROCE,
        "rdmanetworks",
        network(
            "wide",
            json!({"nodeSelector": {"rdma": "yes"}, "nicSelector": {"pfNames": ["ens1f0"]}, "numVfs": 16}),
        ),
    );
    reconcile_twice(&ctx, &server, "wide").await;
    assert_eq!(
        state(&server, "n1").unwrap().spec,
        good,
        "n1 keeps its last good state"
    );
    let cm_after = server
        .get(CORE, "configmaps", "kroce-system", "kroce-device-plugin")
        .unwrap()["data"]["n1.yaml"]
        .clone();
    assert_eq!(cm_after, cm_before);
    let d = condition(&net_status(&server, "wide"), "Degraded");
    assert_eq!(d["status"], "True");
    assert_eq!(d["reason"], "Conflict");
    let msg = d["message"].as_str().unwrap();
    assert!(msg.contains("wide") && msg.contains("8 vs 16"), "{msg}");
    assert!(msg.contains("bulk") || msg.contains("fast"), "{msg}");
    // The networks already on the node are not to blame (issue 24 item 8):
    // they stay Ready, only the newcomer is Degraded.
    reconcile_named(&ctx, &server, "fast").await;
    let d = condition(&net_status(&server, "fast"), "Degraded");
    assert_eq!(d["status"], "False", "{d}");
    assert_ne!(
        condition(&net_status(&server, "fast"), "Ready")["reason"],
        "Conflict"
    );
    assert_eq!(ctx.metrics.conflicts.get(), 1);
    // Removing the conflicting network frees the node again.
    server.edit(KROCE, "rdmanetworks", "", "wide", |o| {
        o["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:09Z".into();
    });
    reconcile_named(&ctx, &server, "wide").await;
    assert!(server.get(KROCE, "rdmanetworks", "", "wide").is_none());
    reconcile_named(&ctx, &server, "fast").await;
    assert_eq!(
        condition(&net_status(&server, "fast"), "Degraded")["status"],
        "False"
    );
}

#[tokio::test]
async fn deletion_removes_attachment_definitions_and_vf_groups_then_the_finalizer() {
    let (ctx, server) = setup();
    fast_and_bulk(&server);
    reconcile_twice(&ctx, &server, "fast").await;
    reconcile_twice(&ctx, &server, "bulk").await;
    assert!(
        server
            .get(NADS, "network-attachment-definitions", "team-a", "bulk")
            .is_some()
    );
    // n1's agent applied both networks: both pools advertised.
    server.edit(KROCE, "rdmanodestates", "", "n1", |o| {
        o["status"]["observedGeneration"] = o["metadata"]["generation"].clone();
        o["status"]["syncState"] = "Succeeded".into();
    });
    reconcile_named(&ctx, &server, "bulk").await;
    let cm = server
        .get(CORE, "configmaps", "kroce-system", "kroce-device-plugin")
        .unwrap();
    assert!(cm["data"]["n1.yaml"].as_str().unwrap().contains("rdma/vf"));
    // kubectl delete: the API server only marks it while the finalizer is there.
    server.edit(KROCE, "rdmanetworks", "", "fast", |o| {
        o["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:09Z".into();
    });
    reconcile_named(&ctx, &server, "fast").await;
    for ns in ["team-a", "team-b"] {
        assert!(
            server
                .get(NADS, "network-attachment-definitions", ns, "fast")
                .is_none(),
            "{ns}"
        );
    }
    assert!(
        server
            .get(NADS, "network-attachment-definitions", "team-a", "bulk")
            .is_some()
    );
    let n1 = state(&server, "n1").unwrap();
    let groups: Vec<&str> = n1.spec.pfs[0]
        .vf_groups
        .iter()
        .map(|g| g.network.as_str())
        .collect();
    assert_eq!(groups, ["bulk"]);
    let cm = server
        .get(CORE, "configmaps", "kroce-system", "kroce-device-plugin")
        .unwrap();
    assert!(!cm["data"]["n1.yaml"].as_str().unwrap().contains("rdma/vf"));
    assert!(
        server.get(KROCE, "rdmanetworks", "", "fast").is_none(),
        "finalizer removed, object gone"
    );
    // A second cleanup of state already gone does not fail.
    let gone: RdmaNetwork = serde_json::from_value(network(
        "fast",
        json!({"nicSelector": {"pfNames": ["ens1f0"]}, "numVfs": 8, "networkNamespaces": ["team-a"]}),
    ))
    .unwrap();
    let mut gone = gone;
    gone.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
    ));
    gone.metadata.finalizers = Some(vec![FINALIZER.into()]);
    let r = super::sync::cleanup(&gone, &ctx).await;
    assert!(r.is_ok(), "{r:?}");
}

#[tokio::test]
async fn invalid_spec_is_degraded_naming_the_field_and_creates_nothing() {
    let (ctx, server) = setup();
    server.insert(CORE, "nodes", node("n1", json!({})));
    server.insert(KROCE, "rdmanodestates", node_state_with_inventory("n1"));
    server.insert(
        KROCE,
        "rdmanetworks",
        network(
            "odd",
            json!({"nicSelector": {"pfNames": ["ens1f0"]}, "numVfs": 8, "vlanQoS": 3,
                   "networkNamespaces": ["team-a"]}),
        ),
    );
    reconcile_twice(&ctx, &server, "odd").await;
    let d = condition(&net_status(&server, "odd"), "Degraded");
    assert_eq!(d["reason"], "InvalidSpec");
    assert!(
        d["message"].as_str().unwrap().contains("spec.vlanQoS"),
        "{d}"
    );
    assert!(
        server
            .get(NADS, "network-attachment-definitions", "team-a", "odd")
            .is_none()
    );
    assert!(state(&server, "n1").unwrap().spec.pfs.is_empty());
}

#[tokio::test]
async fn api_errors_go_through_error_policy_and_count_by_reason() {
    let (ctx, server) = setup();
    // The network is not in the store: the finalizer patch gets a 404.
    let net: RdmaNetwork = serde_json::from_value(network(
        "ghost",
        json!({"nicSelector": {"pfNames": ["ens1f0"]}, "numVfs": 8}),
    ))
    .unwrap();
    let net = Arc::new(net);
    let err = reconcile(net.clone(), ctx.clone()).await.unwrap_err();
    let _ = error_policy(net, &err, ctx.clone());
    let mut reg = prometheus_client::registry::Registry::default();
    ctx.metrics.register(&mut reg);
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &reg).unwrap();
    assert!(
        out.contains("kroce_reconcile_failures_total{reason=\"Finalizer\"} 1"),
        "{out}"
    );
    assert!(out.contains("kroce_reconciles_total 1"), "{out}");
    drop(server);
}

/// The kind e2e's soft-RoCE network, exactly as `e2e/kind/run.sh` applies it.
fn kind_rxe_network() -> Value {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../e2e/kind/rdmanetwork-rxe.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    serde_saphyr::from_str(&text).unwrap()
}

#[tokio::test]
async fn soft_device_network_from_the_kind_e2e_reaches_ready() {
    let (ctx, server) = setup();
    server.insert(
        CORE,
        "nodes",
        node("kind-worker", json!({"kroce.io/e2e": "true"})),
    );
    server.insert(
        CORE,
        "nodes",
        node("kind-worker2", json!({"kroce.io/e2e": "true"})),
    );
    // kind-worker's agent has reported: no SR-IOV PF at all.
    server.insert(
        KROCE,
        "rdmanodestates",
        json!({
            "apiVersion": "kroce.io/v1alpha1", "kind": "RdmaNodeState",
            "metadata": {"name": "kind-worker"},
            "spec": {"nodeName": "kind-worker", "pfs": []},
            "status": {"pfs": [], "syncState": "Succeeded", "lastSyncTime": "2026-01-01T00:00:00Z"}
        }),
    );
    server.insert(KROCE, "rdmanetworks", kind_rxe_network());
    reconcile_twice(&ctx, &server, "rxe").await;

    // Both nodes get the soft devices, no PF, no VF: kind-worker2 without
    // waiting for its agent's inventory.
    for n in ["kind-worker", "kind-worker2"] {
        let s = state(&server, n).unwrap_or_else(|| panic!("no state for {n}"));
        assert!(s.spec.pfs.is_empty(), "{n}: {:?}", s.spec);
        assert_eq!(s.spec.soft_devices.len(), 1, "{n}");
        assert_eq!(s.spec.soft_devices[0].if_names, ["kvf0", "kvf1"]);
        assert_eq!(s.spec.soft_devices[0].resource_name, "rdma/vf");
    }
    let nad = server
        .get(NADS, "network-attachment-definitions", "default", "rxe")
        .unwrap();
    assert_eq!(
        nad["metadata"]["annotations"]["k8s.v1.cni.cncf.io/resourceName"],
        "rdma/vf"
    );
    let st = net_status(&server, "rxe");
    assert_eq!(st["matchedNodes"], 2);
    assert_eq!(condition(&st, "Degraded")["status"], "False");
    assert_eq!(condition(&st, "Ready")["status"], "False");

    // Both agents find their rxe devices and report the spec applied.
    for n in ["kind-worker", "kind-worker2"] {
        server.edit(KROCE, "rdmanodestates", "", n, |o| {
            let generation = o["metadata"]["generation"].clone();
            o["status"] = json!({"observedGeneration": generation, "syncState": "Succeeded",
                                 "lastSyncTime": "2026-01-01T00:01:00Z"});
        });
    }
    reconcile_named(&ctx, &server, "rxe").await;
    // Applied: the device plugin now advertises the rxe devices by ifNames.
    let cm = server
        .get(CORE, "configmaps", "kroce-system", "kroce-device-plugin")
        .unwrap();
    for key in ["kind-worker.yaml", "kind-worker2.yaml"] {
        let cfg: kroce_operator::plan::DevicePluginConfig = serde_saphyr::from_str(
            cm["data"][key]
                .as_str()
                .unwrap_or_else(|| panic!("no {key}: {cm}")),
        )
        .unwrap();
        assert_eq!(cfg.pools.len(), 1, "{key}");
        let p = &cfg.pools[0];
        assert_eq!(p.resource_name, "rdma/vf");
        assert_eq!(p.selectors.if_names, ["kvf0", "kvf1"]);
        assert_eq!(p.selectors.is_rdma, Some(true));
        assert!(p.selectors.pf_names.is_empty() && p.selectors.vendors.is_empty());
    }
    let st = net_status(&server, "rxe");
    assert_eq!(st["readyNodes"], 2);
    assert_eq!(condition(&st, "Ready")["status"], "True");
}

const EVENTS: &str = "/apis/events.k8s.io/v1";

/// `(regarding name, type, reason, note)` of every event recorded.
fn events(server: &ApiServer) -> Vec<(String, String, String, String)> {
    server
        .list(EVENTS, "events")
        .iter()
        .map(|e| {
            let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
            (
                s(&e["regarding"]["name"]),
                s(&e["type"]),
                s(&e["reason"]),
                s(&e["note"]),
            )
        })
        .collect()
}

/// A namespace in networkNamespaces that does not exist: the others get
/// their attachment definition, the network says which one is missing in
/// a condition and a Warning event, and the reconcile does not fail.
#[tokio::test]
async fn a_missing_namespace_is_a_condition_and_the_rest_are_reconciled() {
    let (ctx, server) = setup();
    fast_and_bulk(&server);
    *server.namespaces.lock().unwrap() = Some(
        ["team-a", "kroce-system", "default"]
            .into_iter()
            .map(String::from)
            .collect(),
    );
    reconcile_twice(&ctx, &server, "fast").await;
    assert!(
        server
            .get(NADS, "network-attachment-definitions", "team-a", "fast")
            .is_some()
    );
    assert!(state(&server, "n1").is_some(), "node states still applied");
    let st = net_status(&server, "fast");
    let d = condition(&st, "Degraded");
    assert_eq!(d["status"], "True", "{st}");
    assert_eq!(d["reason"], "NamespaceNotFound");
    let msg = d["message"].as_str().unwrap();
    assert!(
        msg.contains("team-b") && msg.contains("spec.networkNamespaces"),
        "{msg}"
    );
    assert_eq!(condition(&st, "Ready")["status"], "False");
    let ev = events(&server);
    assert!(
        ev.iter().any(|(on, t, r, note)| on == "fast"
            && t == "Warning"
            && r == "NamespaceNotFound"
            && note.contains("team-b")),
        "{ev:#?}"
    );
    // Once the namespace exists, the next reconcile clears it.
    *server.namespaces.lock().unwrap() = None;
    reconcile_named(&ctx, &server, "fast").await;
    assert!(
        server
            .get(NADS, "network-attachment-definitions", "team-b", "fast")
            .is_some()
    );
    let st = net_status(&server, "fast");
    assert_eq!(condition(&st, "Degraded")["status"], "False", "{st}");
}

/// Without Multus' NetworkAttachmentDefinition CRD the API server answers
/// a bare "404 page not found": Degraded naming what to install, a
/// Warning event, a retry that backs off, and deletion still completes.
#[tokio::test]
async fn a_missing_nad_crd_is_degraded_naming_multus_and_backs_off() {
    let (ctx, server) = setup();
    fast_and_bulk(&server);
    server
        .unserved
        .lock()
        .unwrap()
        .insert("network-attachment-definitions".into());
    reconcile_named(&ctx, &server, "fast").await; // finalizer
    let net: RdmaNetwork =
        serde_json::from_value(server.get(KROCE, "rdmanetworks", "", "fast").unwrap()).unwrap();
    let action = reconcile(Arc::new(net), ctx.clone()).await.unwrap();
    assert_eq!(
        action,
        kube::runtime::controller::Action::requeue(std::time::Duration::from_secs(15))
    );
    let st = net_status(&server, "fast");
    let d = condition(&st, "Degraded");
    assert_eq!(d["reason"], "NetworkAttachmentDefinitionCrdMissing", "{st}");
    assert!(d["message"].as_str().unwrap().contains("Multus"), "{d}");
    assert!(state(&server, "n1").is_some(), "node states still applied");
    let ev = events(&server);
    assert!(
        ev.iter().any(|(on, t, r, note)| on == "fast"
            && t == "Warning"
            && r == "NetworkAttachmentDefinitionCrdMissing"
            && note.contains("Multus")),
        "{ev:#?}"
    );
    // Missing for a while: the retry grows (to at most 5 minutes).
    server.edit(KROCE, "rdmanetworks", "", "fast", |o| {
        for c in o["status"]["conditions"].as_array_mut().unwrap() {
            c["lastTransitionTime"] = "2020-01-01T00:00:00Z".into();
        }
    });
    let net: RdmaNetwork =
        serde_json::from_value(server.get(KROCE, "rdmanetworks", "", "fast").unwrap()).unwrap();
    let later = reconcile(Arc::new(net), ctx.clone()).await.unwrap();
    // Longer than the first retry (the ordinary resync may come sooner
    // than the 5 minute cap).
    assert!(
        later != action
            && later
                != kube::runtime::controller::Action::requeue(std::time::Duration::from_secs(15)),
        "{later:?}"
    );
    // Deletion does not hang on the missing kind.
    server.edit(KROCE, "rdmanetworks", "", "fast", |o| {
        o["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:09Z".into();
    });
    reconcile_named(&ctx, &server, "fast").await;
    assert_deleted(&server, "fast");
}

/// A network named with more than 63 characters (admitted before the CRD
/// refused such names) can still be deleted: no label selector is built
/// from its name.
#[tokio::test]
async fn a_network_with_a_long_name_can_be_deleted() {
    let (ctx, server) = setup();
    let long = "n".repeat(70);
    server.insert(CORE, "nodes", node("n1", json!({})));
    server.insert(
        KROCE,
        "rdmanetworks",
        json!({"apiVersion": "kroce.io/v1alpha1", "kind": "RdmaNetwork",
               "metadata": {"name": long, "finalizers": [FINALIZER],
                            "deletionTimestamp": "2026-01-01T00:00:09Z"},
               "spec": {"nicSelector": {"pfNames": ["ens1f0"]}, "numVfs": 4,
                        "networkNamespaces": ["team-a"]}}),
    );
    reconcile_named(&ctx, &server, &long).await;
    assert_deleted(&server, &long);
}

/// The network is gone, or its finalizer is (deletion can complete).
fn assert_deleted(server: &ApiServer, name: &str) {
    let gone = server.get(KROCE, "rdmanetworks", "", name);
    assert!(
        gone.as_ref().is_none_or(|o| o["metadata"]["finalizers"]
            .as_array()
            .is_none_or(|f| f.is_empty())),
        "{gone:?}"
    );
}

/// A node state change is recorded once, on the node state, naming the
/// networks whose VFs changed there (not every network on the node).
#[tokio::test]
async fn node_state_events_go_to_the_network_that_changed() {
    let (ctx, server) = setup();
    fast_and_bulk(&server);
    reconcile_twice(&ctx, &server, "fast").await;
    reconcile_twice(&ctx, &server, "bulk").await;
    let name_of = |e: &Value| {
        e["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let before: Vec<String> = server.list(EVENTS, "events").iter().map(name_of).collect();
    // The admin narrows bulk; fast's reconcile (a node watch) runs first.
    server.edit(KROCE, "rdmanetworks", "", "bulk", |o| {
        o["spec"]["nicSelector"]["pfNames"] = json!(["ens1f0#4-5"]);
    });
    // A fresh recorder (a restarted operator): kube's recorder folds
    // repeats of one event into a series instead of recording new ones.
    let ctx = Arc::new(Context::new(
        ctx.client.clone(),
        "kroce-system",
        "kroce-device-plugin",
        Arc::new(Metrics::default()),
        crate::test_world::snapshot(&server),
    ));
    reconcile_named(&ctx, &server, "fast").await;
    let new: Vec<_> = server
        .list(EVENTS, "events")
        .iter()
        .filter(|e| !before.contains(&name_of(e)))
        .map(|e| {
            let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
            (
                s(&e["regarding"]["name"]),
                s(&e["type"]),
                s(&e["reason"]),
                s(&e["note"]),
            )
        })
        .collect();
    let about_n1: Vec<_> = new
        .iter()
        .filter(|(_, _, _, note)| note.contains("node n1: RdmaNodeState updated"))
        .collect();
    assert_eq!(about_n1.len(), 1, "{new:#?}");
    let (on, _, _, note) = about_n1[0];
    assert_eq!(on, "n1", "{about_n1:#?}");
    assert!(
        note.contains("network bulk") && !note.contains("fast"),
        "{note}"
    );
}

const RESOURCE: &str = "/apis/resource.k8s.io/v1";

/// `fast` of [`fast_and_bulk`] as a DRA network (no attachment
/// definition namespaces: the spec refuses them with DRA), or back.
fn make_fast_dra(server: &ApiServer, frontend: &str) {
    server.edit(KROCE, "rdmanetworks", "", "fast", |o| {
        o["spec"]["frontend"] = frontend.into();
        o["spec"]["networkNamespaces"] = if frontend == "dra" {
            json!([])
        } else {
            json!(["team-a", "team-b"])
        };
    });
}

/// Whether a DeviceClass CEL selector accepts a device as kroce-dra
/// publishes it (unqualified attributes under the driver's domain).
fn cel_selects(expression: &str, d: &k8s_openapi::api::resource::v1::Device) -> bool {
    let mut attrs: std::collections::BTreeMap<String, serde_json::Map<String, Value>> =
        Default::default();
    for (k, v) in d.attributes.iter().flatten() {
        let (domain, id) = k
            .rsplit_once('/')
            .unwrap_or((kroce_contracts::dra::DRIVER_NAME, k));
        let val = match (&v.string, v.int, v.bool) {
            (Some(s), _, _) => json!(s),
            (_, Some(i), _) => json!(i),
            (_, _, Some(b)) => json!(b),
            _ => json!(v.version),
        };
        attrs
            .entry(domain.to_string())
            .or_default()
            .insert(id.to_string(), val);
    }
    let device = json!({"driver": kroce_contracts::dra::DRIVER_NAME, "attributes": attrs});
    let program = cel::Program::compile(expression).unwrap();
    let mut ctx = cel::Context::default();
    ctx.add_variable("device", device).unwrap();
    match program.execute(&ctx) {
        Ok(cel::Value::Bool(b)) => b,
        other => panic!("{expression} on {}: {other:?}", d.name),
    }
}

/// The devices kroce-dra publishes for a host like the mock's n1 (the same
/// ConnectX-6 Dx pair: ens1f0 at 0000:3b:00.0, ens2f0 at 0000:86:00.0).
fn published_devices() -> Vec<k8s_openapi::api::resource::v1::Device> {
    let fx = sriov_helpers::fixture::FixtureHost::connectx6dx_pair().unwrap();
    let facts = kroce_dra::facts::HostFacts::scan(
        &fx.root(),
        &mut kroce_device_plugin::inventory::Memory::default(),
    );
    kroce_dra::slice::devices(&facts, &Default::default())
        .into_iter()
        .map(|p| p.device)
        .collect()
}

#[tokio::test]
async fn dra_network_gets_a_device_class_instead_of_a_pool_and_attachment_definitions() {
    let (ctx, server) = setup();
    fast_and_bulk(&server);
    make_fast_dra(&server, "dra");
    reconcile_twice(&ctx, &server, "fast").await;
    reconcile_twice(&ctx, &server, "bulk").await;
    server.edit(KROCE, "rdmanodestates", "", "n1", |o| {
        o["status"]["observedGeneration"] = o["metadata"]["generation"].clone();
        o["status"]["syncState"] = "Succeeded".into();
    });
    reconcile_named(&ctx, &server, "fast").await;

    // The VFs are configured as before: fast's group is in n1's spec.
    let n1 = state(&server, "n1").unwrap();
    let groups: Vec<(&str, &str)> = n1.spec.pfs[0]
        .vf_groups
        .iter()
        .map(|g| (g.network.as_str(), g.vf_range.as_str()))
        .collect();
    assert_eq!(groups, [("bulk", "4-7"), ("fast", "0-3")]);
    // No device plugin pool and no attachment definitions for fast.
    let cm = server
        .get(CORE, "configmaps", "kroce-system", "kroce-device-plugin")
        .unwrap();
    let cfg: kroce_operator::plan::DevicePluginConfig =
        serde_saphyr::from_str(cm["data"]["n1.yaml"].as_str().unwrap()).unwrap();
    let pools: Vec<&str> = cfg.pools.iter().map(|p| p.resource_name.as_str()).collect();
    assert_eq!(pools, ["rdma/bulk"]);
    for ns in ["team-a", "team-b"] {
        assert!(
            server
                .get(NADS, "network-attachment-definitions", ns, "fast")
                .is_none(),
            "{ns}"
        );
    }
    assert!(
        server
            .get(NADS, "network-attachment-definitions", "team-a", "bulk")
            .is_some()
    );

    // The DeviceClass: labelled as fast's, selecting exactly fast's VFs
    // (0-3 of ens1f0) among what kroce-dra publishes for such a host.
    let dc = server
        .get(RESOURCE, "deviceclasses", "", "fast")
        .expect("DeviceClass fast");
    assert_eq!(dc["metadata"]["labels"]["kroce.io/network"], "fast");
    let expr = dc["spec"]["selectors"][0]["cel"]["expression"]
        .as_str()
        .unwrap();
    let selected: Vec<String> = published_devices()
        .iter()
        .filter(|d| cel_selects(expr, d))
        .map(|d| d.name.clone())
        .collect();
    assert_eq!(
        selected,
        [
            "vf-0000-3b-00-2",
            "vf-0000-3b-00-3",
            "vf-0000-3b-00-4",
            "vf-0000-3b-00-5"
        ],
        "{expr}"
    );
    // Its opaque config is what kroce-dra's own parser accepts.
    let opaque = &dc["spec"]["config"][0]["opaque"];
    assert_eq!(opaque["driver"], kroce_contracts::dra::DRIVER_NAME);
    let parsed = kroce_dra::config::parse(&opaque["parameters"], "DeviceClass fast").unwrap();
    assert_eq!((parsed.vlan, parsed.mtu), (Some(100), Some(9000)));
    assert_eq!(parsed.ipam.as_ref().unwrap()["type"], "host-local");
    assert_eq!(parsed.memlock.unwrap().to_string(), "unlimited");

    let st = net_status(&server, "fast");
    assert_eq!(condition(&st, "Degraded")["status"], "False", "{st}");
    assert_eq!(condition(&st, "Ready")["status"], "True", "{st}");

    // A quiet reconcile writes nothing (the class is compared, not re-applied).
    let before = server.requests().len();
    reconcile_named(&ctx, &server, "fast").await;
    let writes: Vec<String> = server.requests()[before..]
        .iter()
        .filter(|r| !r.starts_with("GET"))
        .cloned()
        .collect();
    assert!(writes.is_empty(), "{writes:?}");
    // Nor does any reconcile ask the API for a class: the watch holds
    // fast's, and bulk (no DRA) has none to delete.
    reconcile_named(&ctx, &server, "bulk").await;
    let asked: Vec<String> = server.requests()[before..]
        .iter()
        .filter(|r| r.contains("/deviceclasses"))
        .cloned()
        .collect();
    assert!(asked.is_empty(), "{asked:?}");

    // A spec change reaches the class.
    server.edit(KROCE, "rdmanetworks", "", "fast", |o| {
        o["spec"]["vlan"] = 200.into();
    });
    reconcile_named(&ctx, &server, "fast").await;
    let dc = server.get(RESOURCE, "deviceclasses", "", "fast").unwrap();
    assert_eq!(dc["spec"]["config"][0]["opaque"]["parameters"]["vlan"], 200);
}

#[tokio::test]
async fn leaving_dra_or_deleting_the_network_removes_its_device_class() {
    let (ctx, server) = setup();
    fast_and_bulk(&server);
    make_fast_dra(&server, "dra");
    reconcile_twice(&ctx, &server, "fast").await;
    assert!(server.get(RESOURCE, "deviceclasses", "", "fast").is_some());
    // Back to the device plugin: attachment definitions, no class.
    make_fast_dra(&server, "devicePlugin");
    reconcile_named(&ctx, &server, "fast").await;
    assert!(server.get(RESOURCE, "deviceclasses", "", "fast").is_none());
    assert!(
        server
            .get(NADS, "network-attachment-definitions", "team-a", "fast")
            .is_some()
    );
    // And to DRA again: the attachment definitions go, the class returns.
    make_fast_dra(&server, "dra");
    reconcile_named(&ctx, &server, "fast").await;
    assert!(
        server
            .get(NADS, "network-attachment-definitions", "team-a", "fast")
            .is_none()
    );
    assert!(server.get(RESOURCE, "deviceclasses", "", "fast").is_some());
    // Deleted: the class goes with it.
    server.edit(KROCE, "rdmanetworks", "", "fast", |o| {
        o["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:09Z".into();
    });
    reconcile_named(&ctx, &server, "fast").await;
    assert!(server.get(RESOURCE, "deviceclasses", "", "fast").is_none());
    assert!(server.get(KROCE, "rdmanetworks", "", "fast").is_none());
}

#[tokio::test]
async fn a_foreign_device_class_of_the_same_name_is_left_alone_and_degrades() {
    let (ctx, server) = setup();
    fast_and_bulk(&server);
    make_fast_dra(&server, "dra");
    let foreign = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": "fast"},
        "spec": {"selectors": [{"cel": {"expression": "device.driver == \"gpu.example.com\""}}]}
    });
    server.insert(RESOURCE, "deviceclasses", foreign.clone());
    reconcile_twice(&ctx, &server, "fast").await;
    let dc = server.get(RESOURCE, "deviceclasses", "", "fast").unwrap();
    assert_eq!(dc["spec"], foreign["spec"]);
    let d = condition(&net_status(&server, "fast"), "Degraded");
    assert_eq!(d["status"], "True");
    assert_eq!(d["reason"], "DeviceClassNameTaken");
    assert!(
        d["message"].as_str().unwrap().contains("DeviceClass fast"),
        "{d}"
    );
    // Deleting the network leaves it too.
    server.edit(KROCE, "rdmanetworks", "", "fast", |o| {
        o["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:09Z".into();
    });
    reconcile_named(&ctx, &server, "fast").await;
    assert!(server.get(KROCE, "rdmanetworks", "", "fast").is_none());
    assert!(server.get(RESOURCE, "deviceclasses", "", "fast").is_some());
}

#[tokio::test]
async fn dra_without_resource_api_or_multus_says_what_is_missing() {
    let (ctx, server) = setup();
    fast_and_bulk(&server);
    make_fast_dra(&server, "dra");
    for kind in ["deviceclasses", "network-attachment-definitions"] {
        server.unserved.lock().unwrap().insert(kind.into());
    }
    reconcile_twice(&ctx, &server, "fast").await;
    let d = condition(&net_status(&server, "fast"), "Degraded");
    // Multus is not needed for DRA: only the resource API is named.
    assert_eq!(d["reason"], "DeviceClassApiNotServed", "{d}");
    assert!(d["message"].as_str().unwrap().contains("1.34"), "{d}");
    assert!(!d["message"].as_str().unwrap().contains("Multus"), "{d}");
}

#[tokio::test]
async fn a_dra_class_that_would_reach_another_dra_networks_vfs_is_not_written() {
    let (ctx, server) = setup();
    fast_and_bulk(&server);
    make_fast_dra(&server, "dra");
    // n3 (not rdma=yes) carries "edge" on the same PF address and VFs.
    server.edit(CORE, "nodes", "", "n3", |o| {
        o["metadata"]["labels"] = json!({"edge": "yes"});
    });
    server.insert(KROCE, "rdmanodestates", node_state_with_inventory("n3"));
    server.insert(
        KROCE,
        "rdmanetworks",
        network(
            "edge",
            json!({"nodeSelector": {"edge": "yes"}, "nicSelector": {"pfNames": ["ens1f0#0-3"]},
                   "numVfs": 8, "frontend": "dra"}),
        ),
    );
    reconcile_twice(&ctx, &server, "edge").await;
    reconcile_twice(&ctx, &server, "fast").await;
    for net in ["fast", "edge"] {
        let d = condition(&net_status(&server, net), "Degraded");
        assert_eq!(d["reason"], "DeviceClassOverlap", "{net}: {d}");
        let msg = d["message"].as_str().unwrap();
        assert!(msg.contains("PF 0000:3b:00.0 VF 0"), "{net}: {msg}");
        assert!(
            server.get(RESOURCE, "deviceclasses", "", net).is_none(),
            "{net}"
        );
    }
    // Disjoint ranges, n3's VFs 0-3 now a device plugin network's (the DRA
    // plugin leaves those out): both classes are written.
    server.edit(KROCE, "rdmanetworks", "", "edge", |o| {
        o["spec"]["nicSelector"]["pfNames"] = json!(["ens1f0#4-7"]);
    });
    server.insert(
        KROCE,
        "rdmanetworks",
        network(
            "local",
            json!({"nodeSelector": {"edge": "yes"}, "nicSelector": {"pfNames": ["ens1f0#0-3"]},
                   "numVfs": 8}),
        ),
    );
    reconcile_twice(&ctx, &server, "local").await;
    reconcile_named(&ctx, &server, "edge").await;
    reconcile_named(&ctx, &server, "fast").await;
    for net in ["fast", "edge"] {
        assert!(
            server.get(RESOURCE, "deviceclasses", "", net).is_some(),
            "{net}: {}",
            net_status(&server, net)
        );
    }
}

/// Issue 24 item 13: a nodeSelector that matches no node says so, not
/// that no PF matches nicSelector.
#[tokio::test]
async fn a_node_selector_matching_no_node_says_so() {
    let (ctx, server) = setup();
    fast_and_bulk(&server);
    server.insert(
        KROCE,
        "rdmanetworks",
        network(
            "lonely",
            json!({"nodeSelector": {"rdma": "nowhere"}, "nicSelector": {"pfNames": ["ens2f0"]},
                   "numVfs": 4}),
        ),
    );
    server.insert(
        KROCE,
        "rdmanetworks",
        network(
            "nonic",
            json!({"nodeSelector": {"rdma": "yes"}, "nicSelector": {"pfNames": ["ens9f0"]},
                   "numVfs": 4}),
        ),
    );
    reconcile_twice(&ctx, &server, "lonely").await;
    reconcile_twice(&ctx, &server, "nonic").await;
    let r = condition(&net_status(&server, "lonely"), "Ready");
    assert_eq!(r["reason"], "NoMatchingNodes");
    assert_eq!(r["message"], "nodeSelector {rdma=nowhere} matches no node");
    let r = condition(&net_status(&server, "nonic"), "Ready");
    let msg = r["message"].as_str().unwrap();
    assert!(
        msg.contains("none of the 2 nodes nodeSelector selects has a PF that nicSelector matches"),
        "{msg}"
    );
}
