#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Scale: both controller loops over the shared stores against the
//! in-memory API server (which counts every request), for N Nodes x 10
//! RdmaNetworks. Prints: time to converge from empty, requests and writes
//! for one node label change, writes in a quiet period (steady state), and
//! the process's peak RSS.
//!
//! cargo bench -p kroce-controller --features testing --bench scale -- 1000 5000

use kroce_controller::metrics::Metrics;
use kroce_controller::{Context, run, stores};
use kroce_operator::testing::mock::ApiServer;
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

const KROCE: &str = "/apis/kroce.io/v1alpha1";
const CORE: &str = "/api/v1";
const NETWORKS: usize = 10;

fn seed(server: &ApiServer, nodes: usize) {
    let inventory = json!([{"pciAddress": "0000:3b:00.0", "ifName": "ens1f0", "vendor": "15b3",
        "deviceID": "101d", "totalVfs": 127, "numVfs": 0, "numaNode": 0}]);
    for i in 0..nodes {
        let n = format!("node-{i:05}");
        server.insert(
            CORE,
            "nodes",
            json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": n, "uid": format!("uid-{i}"), "labels": {"rdma": "yes"}}}),
        );
        server.insert(
            KROCE,
            "rdmanodestates",
            json!({"apiVersion": "kroce.io/v1alpha1",
            "kind": "RdmaNodeState", "metadata": {"name": n, "generation": 1},
            "spec": {"nodeName": n, "pfs": []},
            "status": {"pfs": inventory, "syncState": "Pending"}}),
        );
    }
    for j in 0..NETWORKS {
        server.insert(
            KROCE,
            "rdmanetworks",
            json!({"apiVersion": "kroce.io/v1alpha1",
            "kind": "RdmaNetwork", "metadata": {"name": format!("net{j}"), "generation": 1},
            "spec": {"nodeSelector": {"rdma": "yes"},
                     "nicSelector": {"pfNames": [format!("ens1f0#{j}-{j}")]},
                     "numVfs": 16, "resourceName": format!("vf{j}")}}),
        );
    }
}

fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap_or(0)
}

fn writes(server: &ApiServer, from: usize) -> usize {
    server.calls()[from..]
        .iter()
        .filter(|c| c.method != "GET")
        .count()
}

async fn quiet(metrics: &Metrics, server: &ApiServer, limit: Duration) -> bool {
    let start = Instant::now();
    let mut last = (usize::MAX, 0, 0);
    let mut still = 0;
    while start.elapsed() < limit {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = (
            server.calls().len(),
            metrics.reconciles.get(),
            metrics.node_reconciles.get(),
        );
        still = if now == last { still + 1 } else { 0 };
        last = now;
        if still >= 10 {
            return true;
        }
    }
    false
}

async fn scenario(nodes: usize) {
    let (client, server) = ApiServer::start();
    seed(&server, nodes);
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
    let started = Instant::now();
    let task = tokio::spawn(run(ctx, shared));
    // Converged: every node has its spec (VF groups of all 10 networks).
    let converged = loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let done = server.list(KROCE, "rdmanodestates").iter().all(|s| {
            s["spec"]["pfs"][0]["vfGroups"]
                .as_array()
                .is_some_and(|g| g.len() == NETWORKS)
        });
        if done {
            break started.elapsed();
        }
        if started.elapsed() > Duration::from_secs(600) {
            panic!("{nodes} nodes did not converge in 10 min");
        }
    };
    let converge_requests = server.calls().len();
    assert!(
        quiet(&metrics, &server, Duration::from_secs(120)).await,
        "never quiet"
    );
    // Steady state: a quiet period writes nothing.
    let before = server.calls().len();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let steady_writes = writes(&server, before);
    // One node label change.
    let (nets, nodes_rec) = (metrics.reconciles.get(), metrics.node_reconciles.get());
    let before = server.calls().len();
    server.update(CORE, "nodes", "", "node-00007", |n| {
        n["metadata"]["labels"]["team"] = json!("a");
    });
    assert!(
        quiet(&metrics, &server, Duration::from_secs(60)).await,
        "never quiet"
    );
    let label_requests = server.calls().len() - before;
    let label_writes = writes(&server, before);
    let (nets2, nodes2) = (metrics.reconciles.get(), metrics.node_reconciles.get());
    task.abort();
    println!(
        "{nodes} nodes x {NETWORKS} networks: converged in {:.2} s ({converge_requests} requests); \
         one node label change: {label_requests} requests, {label_writes} writes, {} node and {} \
         network reconciles; quiet 5 s: {steady_writes} writes; peak RSS {} MiB (whole process, \
         mock API server included)",
        converged.as_secs_f64(),
        nodes2 - nodes_rec,
        nets2 - nets,
        peak_rss_kib() / 1024,
    );
}

fn main() {
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let sizes = if sizes.is_empty() { vec![1000] } else { sizes };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    for n in sizes {
        rt.block_on(scenario(n));
    }
}
