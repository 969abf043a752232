#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Scale: the shipped `kroce-controller run` (its own process, plain
//! flags) against the in-memory API server served over HTTP (which counts
//! every request), for N Nodes x 10 RdmaNetworks. Prints: time to converge
//! from empty, requests and writes for one node label change, writes in a
//! quiet period (steady state), and the controller's peak RSS.
//!
//! cargo bench -p kroce-controller --features testing --bench scale -- 1000 5000
//! (KROCE_BIN_DIR: take kroce-controller from there, e.g. target/release.)
//!
//! `-- rollout [N]` instead: the drain planner through a simulated fleet
//! rollout (`kroce_controller::drain::simulate_rollout`, simulated clock):
//! N nodes (default 5,000), each holding VFs that a `numVfs` change
//! removes, each agent answering 2 to 5 minutes after its drain starts;
//! prints the time to roll the fleet at budgets 1, 10% and 25% (also with
//! 5 nodes whose PodDisruptionBudget never allows the eviction), and
//! asserts the peak number of cordoned nodes never exceeds the budget.

use kroce_operator::testing::mock::ApiServer;
use serde_json::json;
use std::process::{Child, Command, Stdio};
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

fn peak_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
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

/// No write for 3 s (reads go on: a network waiting for agents re-checks
/// every 30 s, which at 5,000 nodes overlaps the next one).
async fn quiet(server: &ApiServer, limit: Duration) -> bool {
    let start = Instant::now();
    let mut last = usize::MAX;
    let mut still = 0;
    while start.elapsed() < limit {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = server.calls().iter().filter(|c| c.method != "GET").count();
        still = if now == last { still + 1 } else { 0 };
        last = now;
        if still >= 15 {
            return true;
        }
    }
    false
}

fn controller_bin() -> std::path::PathBuf {
    std::env::var_os("KROCE_BIN_DIR").map_or_else(
        || env!("CARGO_BIN_EXE_kroce-controller").into(),
        |d| std::path::PathBuf::from(d).join("kroce-controller"),
    )
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn scenario(nodes: usize) {
    let server = ApiServer::default();
    seed(&server, nodes);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let serving = tokio::spawn(server.clone().serve_http(listener));
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: m\n  cluster:\n    server: http://127.0.0.1:{port}\nusers:\n- name: u\n  user: {{}}\ncontexts:\n- name: c\n  context:\n    cluster: m\n    user: u\n    namespace: kroce-system\ncurrent-context: c\n"
        ),
    )
    .unwrap();
    // A free port for the controller's /metrics (reconcile counters).
    let metrics_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = format!("127.0.0.1:{metrics_port}");
    let started = Instant::now();
    let child = Killed(
        Command::new(controller_bin())
            .args(["run", "--leader-election=false", "--listen", &listen])
            .env("KUBECONFIG", &kubeconfig)
            .env("KROCE_LOG_LEVEL", "warn")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let pid = child.0.id();
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
    eprintln!(
        "{nodes} nodes: converged in {:.2} s, {converge_requests} requests",
        converged.as_secs_f64()
    );
    // Quiet: no write for 3 s (status writes of admission included).
    let settle_started = Instant::now();
    let settled = quiet(&server, Duration::from_secs(600)).await;
    let settle_time = started.elapsed();
    if !settled {
        eprintln!(
            "{nodes} nodes: not quiet {:.0} s after converging",
            settle_started.elapsed().as_secs_f64()
        );
    }
    let settle_requests = server.calls().len();
    let status_writes = server
        .calls()
        .iter()
        .filter(|c| {
            c.method == "PATCH" && c.path.contains("rdmanodestates") && c.path.ends_with("/status")
        })
        .count();
    if std::env::var_os("KROCE_BENCH_DETAIL").is_some() {
        let mut by: std::collections::BTreeMap<String, usize> = Default::default();
        for c in &server.calls()[..] {
            // The kind (and subresource), not the object's name.
            let parts: Vec<&str> = c.path.split('/').collect();
            let kind = parts
                .iter()
                .rev()
                .find(|p| p.ends_with('s') && !p.starts_with("node-") && **p != "status")
                .copied()
                .unwrap_or("?");
            let sub = if c.path.ends_with("/status") {
                "/status"
            } else {
                ""
            };
            let watch = if c.query.contains("watch") {
                " watch"
            } else {
                ""
            };
            let key = format!("{} {kind}{sub}{watch}", c.method);
            *by.entry(key).or_default() += 1;
        }
        let mut v: Vec<_> = by.into_iter().collect();
        v.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
        for (k, n) in v.iter().take(15) {
            eprintln!("{n:>7} {k}");
        }
    }
    // Steady state: a quiet period writes nothing.
    let before = server.calls().len();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let steady_writes = writes(&server, before);
    // One node label change.
    let counters_before = reconcile_counters(metrics_port).await;
    let before = server.calls().len();
    server.update(CORE, "nodes", "", "node-00007", |n| {
        n["metadata"]["labels"]["team"] = json!("a");
    });
    assert!(quiet(&server, Duration::from_secs(60)).await, "never quiet");
    let label_requests = server.calls().len() - before;
    let label_writes = writes(&server, before);
    let counters_after = reconcile_counters(metrics_port).await;
    let (node_reconciles, network_reconciles) = (
        counters_after.0 - counters_before.0,
        counters_after.1 - counters_before.1,
    );
    let rss = peak_rss_kib(pid);
    drop(child);
    serving.abort();
    println!(
        "{nodes} nodes x {NETWORKS} networks: converged in {:.2} s ({converge_requests} requests); quiet after {:.1} s ({settle_requests} requests, of \
         which {status_writes} node state status writes); one node label change: {node_reconciles} node and \
         {network_reconciles} network reconciles (in the window: {label_requests} requests, \
         {label_writes} writes); quiet 5 s: {steady_writes} writes; controller peak RSS {} MiB",
        converged.as_secs_f64(),
        settle_time.as_secs_f64(),
        rss / 1024,
    );
}

/// (node reconciles, network reconciles) from the controller's /metrics.
async fn reconcile_counters(port: u16) -> (u64, u64) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut c = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    c.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut body = String::new();
    c.read_to_string(&mut body).await.unwrap();
    let value = |name: &str| -> u64 {
        body.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or_else(|| panic!("{name} not in /metrics:\n{body}")) as u64
    };
    (
        value("kroce_node_reconciles_total"),
        value("kroce_reconciles_total"),
    )
}

fn human(secs: i64) -> String {
    let (d, h, m) = (secs / 86_400, secs % 86_400 / 3600, secs % 3600 / 60);
    if d > 0 {
        format!("{d} d {h:02} h {m:02} min")
    } else {
        format!("{h} h {m:02} min")
    }
}

fn rollout(nodes: usize) {
    use kroce_controller::drain::{Rollout, simulate_rollout};
    println!(
        "rollout of {nodes} nodes, each drain 2-5 min until the agent reports its VFs free, \
         --drain-timeout-seconds=1800:"
    );
    println!(
        "| budget | nodes at once | fleet time | with 5 stuck nodes (timed out) | peak cordoned | peak unschedulable | planner rounds | wall time |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for budget in ["1", "10%", "25%"] {
        let base = Rollout {
            nodes,
            budget: budget.parse().unwrap(),
            timeout: std::time::Duration::from_secs(1800),
            // 2 to 5 minutes, spread over the fleet.
            drain_secs: |i| 120 + (i as i64 * 37) % 181,
            stuck: Default::default(),
            cordoned: Default::default(),
        };
        let started = Instant::now();
        let clean = simulate_rollout(&base);
        let stuck = simulate_rollout(&Rollout {
            stuck: (0..5).map(|k| k * nodes / 5 + 1).collect(),
            ..base.clone()
        });
        let wall = started.elapsed();
        for r in [&clean, &stuck] {
            assert!(
                r.peak_cordoned <= r.limit && r.peak_unavailable <= r.limit,
                "budget {budget}: {r:?}"
            );
        }
        assert_eq!(clean.drained, nodes);
        assert_eq!((stuck.drained, stuck.timed_out.len()), (nodes - 5, 5));
        println!(
            "| {budget} | {} | {} | {} ({}) | {} | {} | {} | {:.1} s |",
            clean.limit,
            human(clean.seconds),
            human(stuck.seconds),
            stuck.timed_out.len(),
            clean.peak_cordoned.max(stuck.peak_cordoned),
            clean.peak_unavailable.max(stuck.peak_unavailable),
            clean.rounds,
            wall.as_secs_f64(),
        );
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let sizes: Vec<usize> = args.iter().filter_map(|a| a.parse().ok()).collect();
    if args.iter().any(|a| a == "rollout") {
        rollout(sizes.first().copied().unwrap_or(5000));
        return;
    }
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
