//! The two loops over the shared stores, against the in-memory API server:
//! what a change costs (reconciles, requests, writes), who writes node
//! specs, and that steady state writes nothing.

use crate::metrics::Metrics;
use crate::test_world::{fresh, node_pass, snapshot};
use crate::{Context, reconcile, run, stores};
use kroce_operator::crd::RdmaNetwork;
use kroce_operator::testing::mock::ApiServer;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

const KROCE: &str = "/apis/kroce.io/v1alpha1";
const CORE: &str = "/api/v1";

fn inventory() -> Value {
    json!([{"pciAddress": "0000:3b:00.0", "ifName": "ens1f0", "vendor": "15b3",
            "deviceID": "101d", "totalVfs": 127, "numVfs": 0, "numaNode": 0}])
}

/// `nodes` nodes labelled `rdma=yes` with reported inventory, and
/// `networks` networks, each selecting a pool `rdma=yes` + its own label
/// value so that each network owns exactly one VF range.
fn cluster(server: &ApiServer, nodes: usize, networks: usize) {
    for i in 0..nodes {
        let n = format!("n{i}");
        server.insert(
            CORE,
            "nodes",
            json!({"apiVersion": "v1", "kind": "Node",
                   "metadata": {"name": n, "uid": format!("uid-{i}"), "labels": {"rdma": "yes"}}}),
        );
        server.insert(
            KROCE,
            "rdmanodestates",
            json!({"apiVersion": "kroce.io/v1alpha1", "kind": "RdmaNodeState",
                   "metadata": {"name": n, "generation": 1}, "spec": {"nodeName": n, "pfs": []},
                   "status": {"pfs": inventory(), "syncState": "Pending"}}),
        );
    }
    for j in 0..networks {
        server.insert(
            KROCE,
            "rdmanetworks",
            json!({"apiVersion": "kroce.io/v1alpha1", "kind": "RdmaNetwork",
                   "metadata": {"name": format!("net{j}"), "generation": 1},
                   "spec": {"nodeSelector": {"rdma": "yes"},
                            "nicSelector": {"pfNames": [format!("ens1f0#{j}-{j}")]},
                            "numVfs": 16, "resourceName": format!("vf{j}")}}),
        );
    }
}

fn ctx(client: kube::Client, server: &ApiServer) -> Context {
    Context::new(
        client,
        "kroce-system",
        "kroce-device-plugin",
        Arc::new(Metrics::default()),
        snapshot(server),
    )
}

fn writes(server: &ApiServer, from: usize) -> Vec<String> {
    server.calls()[from..]
        .iter()
        .filter(|c| c.method != "GET")
        .map(|c| format!("{} {}", c.method, c.path))
        .collect()
}

/// A network reconcile never writes a node spec or the ConfigMap: those
/// have one writer, the node loop, so two networks reconciled at once
/// (one from a stale store) can no longer write a stale plan over a newer
/// one. (The old reconcile wrote every node's spec from its own LISTs.)
#[tokio::test]
async fn a_network_reconcile_writes_no_node_spec_even_from_a_stale_store() {
    let (client, server) = ApiServer::start();
    cluster(&server, 2, 2);
    let ctx = ctx(client, &server);
    // Converge: finalizers, then the node loop, then the status.
    for name in ["net0", "net1"] {
        let net: RdmaNetwork =
            serde_json::from_value(server.get(KROCE, "rdmanetworks", "", name).unwrap()).unwrap();
        reconcile(Arc::new(net), fresh(&ctx, &server))
            .await
            .unwrap();
    }
    node_pass(&ctx, &server).await;
    let state = server.get(KROCE, "rdmanodestates", "", "n0").unwrap();
    assert_eq!(state["spec"]["pfs"][0]["numVfs"], 16, "{state}");
    // A stale view: net1 had VF 1 when this store was taken, then it
    // changed to VFs 1-2 and the node loop applied that.
    let stale = fresh(&ctx, &server);
    server.edit(KROCE, "rdmanetworks", "", "net1", |n| {
        n["spec"]["nicSelector"]["pfNames"] = json!(["ens1f0#1-2"]);
    });
    let net0: RdmaNetwork =
        serde_json::from_value(server.get(KROCE, "rdmanetworks", "", "net0").unwrap()).unwrap();
    node_pass(&ctx, &server).await;
    let before = server.calls().len();
    // net0's reconcile runs from the stale store...
    reconcile(Arc::new(net0), stale).await.unwrap();
    let w = writes(&server, before);
    assert!(
        w.iter().all(|c| {
            // Admission marks live in the status (their own manager).
            (!c.contains("rdmanodestates") || c.ends_with("/status")) && !c.contains("configmaps")
        }),
        "a network reconcile wrote node state: {w:?}"
    );
    // ...and the newer plan stands.
    let state = server.get(KROCE, "rdmanodestates", "", "n0").unwrap();
    assert_eq!(
        state["spec"]["pfs"][0]["vfGroups"][1]["vfRange"], "1-2",
        "{state}"
    );
}

/// Steady state: once converged, reconciling every network and every node
/// again writes nothing at all.
#[tokio::test]
async fn a_converged_cluster_writes_nothing_on_resync() {
    let (client, server) = ApiServer::start();
    cluster(&server, 3, 3);
    let ctx = ctx(client, &server);
    for _ in 0..3 {
        for j in 0..3 {
            let name = format!("net{j}");
            let net: RdmaNetwork =
                serde_json::from_value(server.get(KROCE, "rdmanetworks", "", &name).unwrap())
                    .unwrap();
            reconcile(Arc::new(net), fresh(&ctx, &server))
                .await
                .unwrap();
        }
        node_pass(&ctx, &server).await;
    }
    let before = server.calls().len();
    for j in 0..3 {
        let name = format!("net{j}");
        let net: RdmaNetwork =
            serde_json::from_value(server.get(KROCE, "rdmanetworks", "", &name).unwrap()).unwrap();
        reconcile(Arc::new(net), fresh(&ctx, &server))
            .await
            .unwrap();
    }
    node_pass(&ctx, &server).await;
    let w = writes(&server, before);
    assert!(w.is_empty(), "steady state wrote: {w:?}");
    // Nor does a network or node reconcile LIST anything: reads come from
    // the stores.
    let lists: Vec<String> = server.calls()[before..]
        .iter()
        .filter(|c| c.method == "GET")
        .map(|c| format!("{} {}?{}", c.method, c.path, c.query))
        .filter(|c| {
            c.contains("rdmanodestates")
                || c.contains("/nodes")
                || c.contains("rdmanetworks?")
                || c.contains("network-attachment-definitions?")
        })
        .collect();
    assert!(lists.is_empty(), "reconciles listed: {lists:?}");
}

/// Both loops running over their own stores against a fresh server with
/// `nodes` x `networks`.
fn running(
    nodes: usize,
    networks: usize,
) -> (
    ApiServer,
    Arc<Metrics>,
    tokio::task::JoinHandle<Result<(), crate::LoopsError>>,
) {
    let (client, server) = ApiServer::start();
    cluster(&server, nodes, networks);
    let metrics = Arc::new(Metrics::default());
    let shared = stores::start(
        &client,
        "kroce-system",
        "kroce-device-plugin",
        "kroce-perftest",
    )
    .unwrap();
    let ctx = Context::new(
        client,
        "kroce-system",
        "kroce-device-plugin",
        metrics.clone(),
        shared.stores.clone(),
    );
    (server, metrics, tokio::spawn(run(ctx, shared)))
}

/// The running loops: one Node label change costs one node reconcile and
/// no network reconcile (the old controller requeued every network on
/// every Node event, and each of those listed and wrote the whole cluster).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_node_event_is_one_node_reconcile_and_no_network_reconcile() {
    let (server, metrics, task) = running(20, 10);
    // Converged: every network Ready or waiting on agents, node specs out,
    // and a quiet second.
    let settled = |m: &Metrics| {
        (
            m.reconciles.get(),
            m.node_reconciles.get(),
            m.node_writes.get(),
        )
    };
    let mut last = settled(&metrics);
    let mut quiet = 0;
    for _ in 0..300 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = settled(&metrics);
        quiet = if now == last { quiet + 1 } else { 0 };
        last = now;
        if quiet >= 25 && now.2 > 0 {
            break;
        }
    }
    assert!(quiet >= 25, "never settled: {last:?}");
    let (nets_before, nodes_before, _) = last;
    let calls_before = server.calls().len();
    server.update(CORE, "nodes", "", "n7", |n| {
        n["metadata"]["labels"]["team"] = json!("a");
    });
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (nets_after, nodes_after, _) = settled(&metrics);
    task.abort();
    assert_eq!(
        nodes_after - nodes_before,
        1,
        "node reconciles for one Node event"
    );
    assert_eq!(
        nets_after - nets_before,
        0,
        "network reconciles for one Node event"
    );
    let requests = server.calls().len() - calls_before;
    assert!(requests <= 2, "{requests} API requests for one Node event");
}

/// Admission writes one network's entry into a node state: that wakes
/// that network, not every network on the node (which, per write, made a
/// rollout cost nodes x networks x networks reconciles), and no node
/// reconcile (no node plan reads admission).
#[tokio::test]
async fn one_networks_admission_entry_wakes_only_that_network() {
    let (server, metrics, task) = running(20, 10);
    let settled = |m: &Metrics| (m.reconciles.get(), m.node_reconciles.get());
    let mut last = settled(&metrics);
    let mut quiet = 0;
    for _ in 0..300 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = settled(&metrics);
        quiet = if now == last { quiet + 1 } else { 0 };
        last = now;
        let has_entries = server.list(KROCE, "rdmanodestates").iter().all(|s| {
            s["status"]["admission"]
                .as_array()
                .is_some_and(|a| a.len() == 10)
        });
        if quiet >= 25 && has_entries {
            break;
        }
    }
    assert!(quiet >= 25, "never settled: {last:?}");
    let (nets_before, nodes_before) = last;
    server.update(KROCE, "rdmanodestates", "", "n7", |s| {
        let entries = s["status"]["admission"].as_array_mut().expect("entries");
        let e = entries
            .iter_mut()
            .find(|e| e["network"] == "net3")
            .expect("net3's entry");
        e["message"] = json!("poked");
    });
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (nets_after, nodes_after) = settled(&metrics);
    task.abort();
    assert_eq!(nodes_after - nodes_before, 0, "node reconciles");
    let woken = nets_after - nets_before;
    // net3, and net3 again when it writes its entry back.
    assert!((1..=2).contains(&woken), "{woken} network reconciles");
}

/// Issue 22: the node loop mirrors the agent's `RdmaNetnsModePending` /
/// `RebootRequired` as the node label, writes it only when it changes, and
/// removes it when the condition clears.
#[tokio::test]
async fn the_netns_mode_pending_label_follows_the_agents_condition() {
    use kroce_operator::names::{NETNS_MODE_PENDING_LABEL, NETNS_MODE_PENDING_VALUE};
    let (client, server) = ApiServer::start();
    cluster(&server, 2, 1);
    let ctx = ctx(client, &server);
    node_pass(&ctx, &server).await;
    let label = |n: &str| {
        server.get(CORE, "nodes", "", n).unwrap()["metadata"]["labels"]
            .get(NETNS_MODE_PENDING_LABEL)
            .cloned()
    };
    assert_eq!(label("n0"), None);
    let condition = |status: &str, reason: &str| {
        json!([{"type": "RdmaNetnsModePending", "status": status, "reason": reason,
                "message": "the kernel refuses (EBUSY)"}])
    };
    server.edit(KROCE, "rdmanodestates", "", "n0", |o| {
        o["status"]["conditions"] = condition("True", "RebootRequired");
    });
    // Pending, but for another reason: no label.
    server.edit(KROCE, "rdmanodestates", "", "n1", |o| {
        o["status"]["conditions"] = condition("True", "Unreadable");
    });
    node_pass(&ctx, &server).await;
    assert_eq!(label("n0"), Some(json!(NETNS_MODE_PENDING_VALUE)));
    assert_eq!(label("n1"), None);
    assert_eq!(
        server.get(CORE, "nodes", "", "n0").unwrap()["metadata"]["labels"]["rdma"],
        "yes",
        "other labels kept"
    );
    // Steady state: no Node write.
    let from = server.calls().len();
    node_pass(&ctx, &server).await;
    assert!(
        !writes(&server, from).iter().any(|w| w.contains("/nodes/")),
        "{:?}",
        writes(&server, from)
    );
    // The mode went live: the label goes.
    server.edit(KROCE, "rdmanodestates", "", "n0", |o| {
        o["status"]["conditions"] = condition("False", "Applied");
    });
    node_pass(&ctx, &server).await;
    assert_eq!(label("n0"), None);
}
