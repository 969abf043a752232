//! Admission scenarios against the in-memory API server: test pods with
//! the right resources, arguments and pinning; results recorded; the taint
//! removed on pass and kept on fail (with the number that missed); cleanup
//! on timeout; admission disabled admits on configuration alone.

use super::admission::test_nad_name;
use super::{Context, reconcile};
use crate::metrics::Metrics;
use crate::test_world::{fresh, node_pass};
use kroce_admission::pod_run::{ENDPOINT_SECTION, section_marker};
use kroce_operator::crd::{RdmaNetwork, RdmaNodeState};
use kroce_operator::names::{
    ADMISSION_MANAGER, ADMISSION_NETWORK_LABEL, ADMISSION_ROLE_LABEL, ADMISSION_RUN_LABEL,
};
use kroce_operator::testing::mock::ApiServer;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

const KROCE: &str = "/apis/kroce.io/v1alpha1";
const CORE: &str = "/api/v1";
const NADS: &str = "/apis/k8s.cni.cncf.io/v1";
const EVENTS: &str = "/apis/events.k8s.io/v1";
const TEST_NS: &str = "rdma-tests";
const T0: u64 = 1_767_225_600;

const BW: &str = "\
---------------------------------------------------------------------------------------
                    RDMA_Write BW Test
 Dual-port       : OFF\t\tDevice         : mlx5_2
---------------------------------------------------------------------------------------
 #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]
 65536      1696410          0.00               92.61  \t\t   0.176636
---------------------------------------------------------------------------------------
";
const LAT: &str = "\
---------------------------------------------------------------------------------------
                    RDMA_Read Latency Test
---------------------------------------------------------------------------------------
 #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]
 2       1000          5.35           11.78        5.49               5.50           0.18            5.74                   11.78
---------------------------------------------------------------------------------------
";

fn endpoint(role: &str) -> String {
    format!(
        "{}\n{}\n",
        section_marker(ENDPOINT_SECTION),
        json!({"role": role, "rdmaDevice": "mlx5_2", "ibPort": 1, "netdev": "net1",
               "gidIndex": 3, "ipv4": "10.56.0.7", "cpus": "0-1", "portRateGbps": 100.0})
    )
}

fn client_log() -> String {
    format!(
        "{}{}\n{BW}{}\n{LAT}",
        endpoint("client"),
        section_marker("ib_write_bw"),
        section_marker("ib_read_lat")
    )
}

struct Cluster {
    ctx: Arc<Context>,
    server: ApiServer,
    clock: Arc<AtomicU64>,
}

fn inventory() -> Value {
    json!([
        {"pciAddress": "0000:3b:00.0", "ifName": "ens1f0", "vendor": "15b3", "deviceID": "101d",
         "totalVfs": 127, "numVfs": 0, "numaNode": 0}
    ])
}

/// n1 and n2 selected by network `fast` with `admission`; n3 selected by nothing.
fn cluster(admission: Value) -> Cluster {
    let (client, server) = ApiServer::start();
    let mut ctx = Context::new(
        client,
        "kroce-system",
        "kroce-device-plugin",
        Arc::new(Metrics::default()),
        crate::test_world::snapshot(&ApiServer::default()),
    );
    let clock = Arc::new(AtomicU64::new(T0));
    let c = clock.clone();
    ctx.admission.clock = Arc::new(move || c.load(Ordering::SeqCst));
    ctx.admission.test_namespace = TEST_NS.into();
    ctx.admission.perftest_image = "registry.example/kroce-perftest:1".into();
    for (n, labels) in [
        ("n1", json!({"rdma": "yes"})),
        ("n2", json!({"rdma": "yes"})),
        ("n3", json!({})),
    ] {
        server.insert(
            CORE,
            "nodes",
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n, "labels": labels},
                   "spec": {"taints": [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]}}),
        );
    }
    for n in ["n1", "n2"] {
        server.insert(
            KROCE,
            "rdmanodestates",
            json!({"apiVersion": "kroce.io/v1alpha1", "kind": "RdmaNodeState",
                   "metadata": {"name": n}, "spec": {"nodeName": n, "pfs": []},
                   "status": {"pfs": inventory(), "syncState": "Pending"}}),
        );
    }
    let mut spec = json!({
        "nodeSelector": {"rdma": "yes"},
        "nicSelector": {"pfNames": ["ens1f0#0-3"]},
        "numVfs": 8, "resourceName": "vf",
        "ipam": {"type": "whereabouts", "range": "10.56.0.0/24"},
        "networkNamespaces": ["team-a"]
    });
    if !admission.is_null() {
        spec["admission"] = admission;
    }
    server.insert(
        KROCE,
        "rdmanetworks",
        json!({"apiVersion": "kroce.io/v1alpha1", "kind": "RdmaNetwork",
               "metadata": {"name": "fast"}, "spec": spec}),
    );
    Cluster {
        ctx: Arc::new(ctx),
        server,
        clock,
    }
}

impl Cluster {
    async fn reconcile(&self) {
        let v = self.server.get(KROCE, "rdmanetworks", "", "fast").unwrap();
        let net: RdmaNetwork = serde_json::from_value(v).unwrap();
        let deleting = net.metadata.deletion_timestamp.is_some();
        match reconcile(Arc::new(net), fresh(&self.ctx, &self.server)).await {
            // A deleting network waits for the node loop (below).
            Err(crate::Error::Finalizer(_)) if deleting => {}
            r => {
                r.unwrap();
            }
        }
        // The node loop follows (specs and device plugin keys).
        node_pass(&self.ctx, &self.server).await;
        if deleting && let Some(v) = self.server.get(KROCE, "rdmanetworks", "", "fast") {
            let net: RdmaNetwork = serde_json::from_value(v).unwrap();
            reconcile(Arc::new(net), fresh(&self.ctx, &self.server))
                .await
                .unwrap();
        }
    }

    /// The node agents report their specs applied.
    fn agents_synced(&self) {
        for n in ["n1", "n2"] {
            self.server.edit(KROCE, "rdmanodestates", "", n, |o| {
                o["status"]["observedGeneration"] = o["metadata"]["generation"].clone();
                o["status"]["syncState"] = "Succeeded".into();
            });
        }
    }

    fn state(&self, n: &str) -> RdmaNodeState {
        serde_json::from_value(self.server.get(KROCE, "rdmanodestates", "", n).unwrap()).unwrap()
    }

    fn entry(&self, n: &str) -> Value {
        let v = self.server.get(KROCE, "rdmanodestates", "", n).unwrap();
        v["status"]["admission"]
            .as_array()
            .and_then(|a| a.iter().find(|e| e["network"] == "fast").cloned())
            .unwrap_or_else(|| panic!("no admission entry on {n}: {}", v["status"]))
    }

    fn tainted(&self, n: &str) -> bool {
        let node = self.server.get(CORE, "nodes", "", n).unwrap();
        let taints = node["spec"]["taints"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        // The admin's own taint is never touched.
        assert!(
            taints.iter().any(|t| t["key"] == "dedicated"),
            "{n} lost its own taint: {taints:?}"
        );
        taints.iter().any(|t| t["key"] == "kroce.io/rdma-unready")
    }

    fn pods(&self) -> Vec<Value> {
        self.server.list(CORE, "pods")
    }

    fn pod(&self, role: &str) -> Value {
        self.pods()
            .into_iter()
            .find(|p| p["metadata"]["labels"][ADMISSION_ROLE_LABEL] == role)
            .unwrap_or_else(|| panic!("no {role} pod in {:?}", self.pods()))
    }

    fn set_pod(&self, name: &str, f: impl FnOnce(&mut Value)) {
        self.server.edit(CORE, "pods", TEST_NS, name, f);
    }

    fn event_reasons(&self) -> Vec<String> {
        self.server
            .list(EVENTS, "events")
            .iter()
            .map(|e| e["reason"].as_str().unwrap_or("").to_string())
            .collect()
    }

    /// Up to the server pod: synced, reconciled, the server pod created.
    async fn to_server_pod(&self) -> (String, String) {
        self.reconcile().await;
        self.reconcile().await;
        self.agents_synced();
        self.reconcile().await;
        let server = self.pod("server");
        let name = server["metadata"]["name"].as_str().unwrap().to_string();
        let run = server["metadata"]["labels"][ADMISSION_RUN_LABEL]
            .as_str()
            .unwrap()
            .to_string();
        (name, run)
    }

    /// The server pod runs with its test address; the client pod follows.
    async fn to_client_pod(&self) -> (String, String) {
        let (server, _) = self.to_server_pod().await;
        self.set_pod(&server, |p| {
            p["status"] = json!({"phase": "Running"});
            p["metadata"]["annotations"]["k8s.v1.cni.cncf.io/network-status"] = json!(
                format!(r#"[{{"name":"{TEST_NS}/kroce-admission-fast","interface":"net1","ips":["10.56.0.7"]}}]"#)
            );
        });
        self.reconcile().await;
        let client = self.pod("client");
        (
            server,
            client["metadata"]["name"].as_str().unwrap().to_string(),
        )
    }

    async fn finish(&self, server: &str, client: &str, client_log: &str) {
        self.server
            .set_pod_log(TEST_NS, server, &endpoint("server"));
        self.server.set_pod_log(TEST_NS, client, client_log);
        for p in [server, client] {
            self.set_pod(p, |p| p["status"] = json!({"phase": "Succeeded"}));
        }
        self.reconcile().await;
    }
}

fn strs(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn unconfigured_nodes_are_tainted_and_advertise_no_pools() {
    let c = cluster(json!({"minBandwidthGbps": 90}));
    c.reconcile().await;
    c.reconcile().await;
    assert!(c.tainted("n1") && c.tainted("n2"));
    assert!(!c.tainted("n3"), "n3 is selected by nothing");
    assert_eq!(c.entry("n1")["phase"], "Pending");
    assert!(
        c.entry("n1")["message"]
            .as_str()
            .unwrap()
            .contains("waiting for the node agent")
    );
    let cm = c
        .server
        .get(CORE, "configmaps", "kroce-system", "kroce-device-plugin")
        .unwrap();
    assert!(
        cm["data"].get("n1.yaml").is_none(),
        "pools before the node state is applied: {cm}"
    );
    assert!(c.pods().is_empty());
    c.agents_synced();
    c.reconcile().await;
    let cm = c
        .server
        .get(CORE, "configmaps", "kroce-system", "kroce-device-plugin")
        .unwrap();
    assert!(cm["data"]["n1.yaml"].as_str().unwrap().contains("rdma/vf"));
}

#[tokio::test]
async fn test_pods_request_the_resource_whole_cpus_and_run_the_pinning_runner() {
    let c = cluster(
        json!({"minBandwidthGbps": 90, "durationSeconds": 5, "queuePairs": 2,
                           "iterations": 1000, "testTimeoutSeconds": 120}),
    );
    let (server_name, run) = c.to_server_pod().await;
    let server = c.pod("server");
    assert_eq!(server["metadata"]["namespace"], TEST_NS);
    assert_eq!(
        server["metadata"]["labels"][ADMISSION_NETWORK_LABEL],
        "fast"
    );
    assert_eq!(server_name, format!("{run}-server"));
    assert_eq!(
        server["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"],
        test_nad_name("fast")
    );
    // The bootstrap pair: n1 serves, n2 is the client; both judged by one run.
    let terms = &server["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"][0]["matchFields"][0];
    assert_eq!(terms["key"], "metadata.name");
    assert_eq!(terms["values"], json!(["n1"]));
    assert_eq!(
        server["spec"]["tolerations"][0],
        json!({"key": "kroce.io/rdma-unready", "operator": "Exists", "effect": "NoSchedule"})
    );
    let ctr = &server["spec"]["containers"][0];
    assert_eq!(ctr["image"], "registry.example/kroce-perftest:1");
    let res = &ctr["resources"];
    assert_eq!(res["requests"], res["limits"], "Guaranteed QoS");
    assert_eq!(res["limits"]["rdma/vf"], "1");
    assert_eq!(res["limits"]["cpu"], "2", "whole CPUs");
    // Issue 24 item 13: RuntimeDefault seccomp, every capability dropped
    // but IPC_LOCK, no privilege escalation.
    let sc = &ctr["securityContext"];
    assert_eq!(
        sc["capabilities"],
        json!({"drop": ["ALL"], "add": ["IPC_LOCK"]})
    );
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault");
    assert_eq!(
        server["spec"]["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let cmd = strs(&ctr["command"]);
    assert_eq!(cmd[..2], ["kroce-perftest-run", "server"]);
    let joined = cmd.join(" ");
    for want in [
        "--bw-tool ib_write_bw",
        "--duration 5",
        "--qps 2",
        "--size 65536",
        "--lat-tool ib_read_lat",
        "--iterations 1000",
    ] {
        assert!(joined.contains(want), "{want} missing: {joined}");
    }
    assert!(!joined.contains("--server-ip"));
    assert_eq!(server["spec"]["activeDeadlineSeconds"], 120);
    // The test attachment definition, in the test namespace, for the network's resource.
    let nad = c
        .server
        .get(
            NADS,
            "network-attachment-definitions",
            TEST_NS,
            &test_nad_name("fast"),
        )
        .unwrap();
    assert_eq!(
        nad["metadata"]["annotations"]["k8s.v1.cni.cncf.io/resourceName"],
        "rdma/vf"
    );
    assert!(nad["metadata"]["labels"].get("kroce.io/network").is_none());
    for n in ["n1", "n2"] {
        assert_eq!(c.entry(n)["phase"], "Testing");
        assert!(c.tainted(n));
    }
    // No client before the server has its address.
    c.reconcile().await;
    assert_eq!(c.pods().len(), 1);

    let (_, client_name) = c.to_client_pod().await;
    let client = c.pod("client");
    assert_eq!(client_name, format!("{run}-client"));
    let cmd = strs(&client["spec"]["containers"][0]["command"]).join(" ");
    assert!(
        cmd.starts_with("kroce-perftest-run client --server-ip 10.56.0.7"),
        "{cmd}"
    );
    assert_eq!(
        client["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"][0]["matchFields"][0]["values"],
        json!(["n2"])
    );
    // Same options on both sides.
    let server_cmd = strs(&server["spec"]["containers"][0]["command"]);
    let client_cmd = strs(&client["spec"]["containers"][0]["command"]);
    let opts = |v: &[String]| -> Vec<String> {
        v.iter()
            .skip(2)
            .filter(|a| !a.starts_with("10.56"))
            .cloned()
            .collect::<Vec<_>>()
            .join(" ")
            .replace("--server-ip ", "")
            .split(' ')
            .map(str::to_string)
            .collect()
    };
    assert_eq!(opts(&server_cmd), opts(&client_cmd));
}

#[tokio::test]
async fn pass_records_numbers_removes_the_taint_and_deletes_the_pods() {
    let c = cluster(json!({"minBandwidthGbps": 90, "maxP99LatencyUs": 6}));
    let (server, client) = c.to_client_pod().await;
    c.finish(&server, &client, &client_log()).await;
    for (n, peer) in [("n1", "n2"), ("n2", "n1")] {
        let e = c.entry(n);
        assert_eq!(e["phase"], "Admitted");
        assert_eq!(e["schedulable"], true);
        let r = &e["lastResult"];
        assert_eq!(r["passed"], true);
        assert_eq!(r["peer"], peer);
        assert_eq!(r["bandwidthGbps"], 92.61);
        assert_eq!(r["latencyP99Us"], 5.74);
        assert_eq!(r["portRateGbps"], 100.0);
        assert_eq!(r["finishedAt"], "2026-01-01T00:00:00Z");
        assert_eq!(e["conditions"][0]["type"], "Admitted");
        assert_eq!(e["conditions"][0]["status"], "True");
        assert!(!c.tainted(n), "{n} still tainted");
        assert_eq!(
            c.state(n).status.unwrap().admission_phase.as_deref(),
            Some("Admitted")
        );
    }
    assert!(c.pods().is_empty(), "test pods left: {:?}", c.pods());
    let reasons = c.event_reasons();
    for r in ["AdmissionTestStarted", "Admitted", "RdmaReady"] {
        assert!(
            reasons.iter().any(|x| x == r),
            "no {r} event in {reasons:?}"
        );
    }
    // A quiet pass writes nothing.
    let before = c.server.requests().len();
    c.reconcile().await;
    let writes: Vec<String> = c.server.requests()[before..]
        .iter()
        .filter(|r| !r.starts_with("GET"))
        .cloned()
        .collect();
    assert!(writes.is_empty(), "{writes:?}");
}

#[tokio::test]
async fn fail_keeps_the_taint_with_the_number_that_missed() {
    let c = cluster(json!({"minBandwidthGbps": 100, "maxLatencyUs": 6}));
    let (server, client) = c.to_client_pod().await;
    c.finish(&server, &client, &client_log()).await;
    for n in ["n1", "n2"] {
        let e = c.entry(n);
        assert_eq!(e["phase"], "Failed");
        assert!(c.tainted(n));
        let cond = &e["conditions"][0];
        assert_eq!(cond["status"], "False");
        assert_eq!(cond["reason"], "PerftestsFailed");
        let msg = cond["message"].as_str().unwrap();
        assert!(
            msg.contains("bandwidth 92.61 Gb/s is 7.39 Gb/s (7.4%) below the minimum 100.00 Gb/s"),
            "{msg}"
        );
        assert!(
            !msg.contains("latency"),
            "passing numbers are not blamed: {msg}"
        );
        assert!(msg.contains("retry at 2026-01-01T00:01:00Z"), "{msg}");
        assert_eq!(e["lastResult"]["passed"], false);
        assert_eq!(e["lastResult"]["bandwidthGbps"], 92.61);
    }
    assert!(c.pods().is_empty());
    assert!(c.event_reasons().iter().any(|r| r == "AdmissionFailed"));
    // Retried after the backoff, not before.
    c.reconcile().await;
    assert!(c.pods().is_empty());
    c.clock.store(T0 + 61, Ordering::SeqCst);
    c.reconcile().await;
    assert_eq!(c.pods().len(), 1, "retry starts a new run");
}

#[tokio::test]
async fn unparsable_output_fails_naming_the_line() {
    let c = cluster(json!({"minBandwidthGbps": 10}));
    let (server, client) = c.to_client_pod().await;
    let garbled = client_log().replace("92.61", "9x.61");
    c.finish(&server, &client, &garbled).await;
    let msg = c.entry("n2")["message"].as_str().unwrap().to_string();
    assert!(
        msg.contains("ib_write_bw output") && msg.contains("line"),
        "{msg}"
    );
    assert!(c.tainted("n2"));
}

#[tokio::test]
async fn timeout_fails_the_run_and_deletes_its_pods() {
    let c = cluster(json!({"minBandwidthGbps": 90, "testTimeoutSeconds": 60}));
    let (_, _) = c.to_client_pod().await;
    assert_eq!(c.pods().len(), 2);
    c.clock.store(T0 + 59, Ordering::SeqCst);
    c.reconcile().await;
    assert_eq!(c.pods().len(), 2, "not yet");
    c.clock.store(T0 + 60, Ordering::SeqCst);
    c.reconcile().await;
    assert!(
        c.pods().is_empty(),
        "pods left after the timeout: {:?}",
        c.pods()
    );
    for n in ["n1", "n2"] {
        let e = c.entry(n);
        assert_eq!(e["phase"], "Failed");
        assert!(
            e["message"]
                .as_str()
                .unwrap()
                .contains("timed out after 60s"),
            "{e}"
        );
        assert!(c.tainted(n));
    }
    assert!(
        c.event_reasons()
            .iter()
            .any(|r| r == "AdmissionTestTimedOut")
    );
}

#[tokio::test]
async fn a_failed_pod_fails_the_run_with_its_error() {
    let c = cluster(json!({"minBandwidthGbps": 90}));
    let (server, _) = c.to_server_pod().await;
    c.server.set_pod_log(
        TEST_NS,
        &server,
        &format!(
            "{}\nRDMA device mlx5_2 has no RoCE v2 GID for an IPv4 address of net1\n",
            section_marker("error")
        ),
    );
    c.set_pod(&server, |p| p["status"] = json!({"phase": "Failed"}));
    c.reconcile().await;
    let msg = c.entry("n1")["message"].as_str().unwrap().to_string();
    assert!(
        msg.starts_with("server pod: RDMA device mlx5_2 has no RoCE v2 GID"),
        "{msg}"
    );
    assert!(c.pods().is_empty());
}

#[tokio::test]
async fn disabled_admission_admits_on_configuration_alone() {
    for admission in [json!({"enabled": false}), Value::Null] {
        let c = cluster(admission.clone());
        c.reconcile().await;
        c.reconcile().await;
        assert!(c.tainted("n1"), "not configured yet ({admission})");
        c.agents_synced();
        c.reconcile().await;
        for n in ["n1", "n2"] {
            let e = c.entry(n);
            assert_eq!(e["phase"], "Admitted", "{admission}");
            assert_eq!(e["conditions"][0]["reason"], "AdmittedWithoutTest");
            assert!(!c.tainted(n));
        }
        assert!(c.pods().is_empty(), "no test pods when disabled");
    }
}

#[tokio::test]
async fn label_gate_labels_admitted_nodes_instead_of_tainting() {
    let c = cluster(json!({"enabled": false, "gate": "label"}));
    c.reconcile().await;
    c.reconcile().await;
    assert!(!c.tainted("n1"));
    let label = |n: &str| {
        c.server.get(CORE, "nodes", "", n).unwrap()["metadata"]["labels"]
            .get("kroce.io/rdma-ready")
            .cloned()
    };
    assert_eq!(label("n1"), None);
    c.agents_synced();
    c.reconcile().await;
    assert_eq!(label("n1"), Some(json!("true")));
    assert_eq!(label("n3"), None);
}

#[tokio::test]
async fn deleting_the_network_cleans_up_pods_entries_and_marks() {
    let c = cluster(json!({"minBandwidthGbps": 90}));
    c.to_client_pod().await;
    assert_eq!(c.pods().len(), 2);
    c.server.edit(KROCE, "rdmanetworks", "", "fast", |o| {
        o["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:09Z".into();
    });
    c.reconcile().await;
    assert!(c.server.get(KROCE, "rdmanetworks", "", "fast").is_none());
    assert!(c.pods().is_empty());
    assert!(
        c.server
            .get(
                NADS,
                "network-attachment-definitions",
                TEST_NS,
                &test_nad_name("fast")
            )
            .is_none()
    );
    for n in ["n1", "n2"] {
        assert!(!c.tainted(n), "{n} tainted by a network that is gone");
        assert!(c.state(n).status.unwrap().admission.is_empty());
    }
}

#[test]
fn admission_has_its_own_field_manager() {
    assert_ne!(ADMISSION_MANAGER, kroce_operator::names::AGENT_MANAGER);
    assert_ne!(ADMISSION_MANAGER, super::MANAGER);
}

#[tokio::test]
async fn one_pass_writes_every_networks_entry_of_a_node_at_once() {
    let c = cluster(json!({"minBandwidthGbps": 90}));
    // Two more networks on the same nodes (other VFs of the same PF).
    for (name, range) in [("b", "4-5"), ("c", "6-7")] {
        c.server.insert(
            KROCE,
            "rdmanetworks",
            json!({"apiVersion": "kroce.io/v1alpha1", "kind": "RdmaNetwork",
                   "metadata": {"name": name},
                   "spec": {"nodeSelector": {"rdma": "yes"},
                            "nicSelector": {"pfNames": [format!("ens1f0#{range}")]},
                            "numVfs": 8, "resourceName": name,
                            "admission": {"minBandwidthGbps": 90}}}),
        );
    }
    let admission_writes = |from: usize| {
        c.server.calls()[from..]
            .iter()
            .filter(|k| k.method == "PATCH" && k.path.ends_with("/n1/status"))
            .filter(|k| k.query.contains(ADMISSION_MANAGER))
            .count()
    };
    c.reconcile().await; // the finalizer
    let before = c.server.calls().len();
    c.reconcile().await;
    let networks: Vec<String> = c
        .state("n1")
        .status
        .unwrap()
        .admission
        .iter()
        .map(|e| e.network.clone())
        .collect();
    assert_eq!(
        networks,
        ["b", "c", "fast"],
        "one pass records every network"
    );
    assert_eq!(admission_writes(before), 1, "one write for n1");
    // The other networks' own reconciles find nothing left to write.
    let before = c.server.calls().len();
    for name in ["b", "c"] {
        // Twice: the first only adds the finalizer.
        for _ in 0..2 {
            let v = c.server.get(KROCE, "rdmanetworks", "", name).unwrap();
            let net: RdmaNetwork = serde_json::from_value(v).unwrap();
            reconcile(Arc::new(net), fresh(&c.ctx, &c.server))
                .await
                .unwrap();
        }
    }
    assert_eq!(admission_writes(before), 0);
}

#[tokio::test]
async fn another_networks_pass_leaves_a_running_test_alone() {
    let c = cluster(json!({"minBandwidthGbps": 90}));
    let (server_pod, run) = c.to_server_pod().await;
    // b selects other nodes (on these, a change to the PF would rightly
    // restart fast's run).
    c.server.insert(
        KROCE,
        "rdmanetworks",
        json!({"apiVersion": "kroce.io/v1alpha1", "kind": "RdmaNetwork",
               "metadata": {"name": "b"},
               "spec": {"nodeSelector": {"rdma": "other"},
                        "nicSelector": {"pfNames": ["ens1f0#4-5"]},
                        "numVfs": 8, "resourceName": "b",
                        "admission": {"minBandwidthGbps": 90}}}),
    );
    for _ in 0..2 {
        let v = c.server.get(KROCE, "rdmanetworks", "", "b").unwrap();
        let net: RdmaNetwork = serde_json::from_value(v).unwrap();
        reconcile(Arc::new(net), fresh(&c.ctx, &c.server))
            .await
            .unwrap();
    }
    assert!(
        c.server.get(CORE, "pods", TEST_NS, &server_pod).is_some(),
        "network b's pass deleted fast's test pod"
    );
    assert_eq!(c.entry("n1")["phase"], "Testing");
    assert!(c.entry("n1").to_string().contains(&run), "still run {run}");
}

impl Cluster {
    /// One reconcile of network `name` and a node pass.
    async fn reconcile_network(&self, name: &str) {
        let v = self.server.get(KROCE, "rdmanetworks", "", name).unwrap();
        let net: RdmaNetwork = serde_json::from_value(v).unwrap();
        reconcile(Arc::new(net), fresh(&self.ctx, &self.server))
            .await
            .unwrap();
        node_pass(&self.ctx, &self.server).await;
    }

    fn label(&self, n: &str) -> Option<Value> {
        self.server.get(CORE, "nodes", "", n).unwrap()["metadata"]["labels"]
            .get("kroce.io/rdma-ready")
            .cloned()
    }

    fn condition(&self, network: &str, type_: &str) -> Value {
        let v = self.server.get(KROCE, "rdmanetworks", "", network).unwrap();
        v["status"]["conditions"]
            .as_array()
            .and_then(|a| a.iter().find(|c| c["type"] == type_).cloned())
            .unwrap_or_else(|| panic!("no {type_} on {network}: {}", v["status"]))
    }
}

/// Issue 24 item 8: a second network on the same PF and resource is the
/// one in conflict; the admitted network keeps its node (label, no taint,
/// Ready) and only the newcomer is Degraded.
#[tokio::test]
async fn a_conflicting_newcomer_never_takes_the_node_from_an_admitted_network() {
    let c = cluster(json!({"enabled": false, "gate": "label"}));
    c.reconcile().await;
    c.reconcile().await;
    c.agents_synced();
    c.reconcile().await;
    assert_eq!(c.label("n1"), Some(json!("true")));
    let spec_before = c.state("n1").spec;
    // Same PF, same resource, overlapping VFs, the default gate (taint).
    c.server.insert(
        KROCE,
        "rdmanetworks",
        json!({"apiVersion": "kroce.io/v1alpha1", "kind": "RdmaNetwork",
               "metadata": {"name": "second"},
               "spec": {"nodeSelector": {"rdma": "yes"},
                        "nicSelector": {"pfNames": ["ens1f0#0-3"]},
                        "numVfs": 8, "resourceName": "vf"}}),
    );
    for _ in 0..2 {
        c.reconcile_network("second").await;
    }
    c.reconcile().await;
    for n in ["n1", "n2"] {
        assert_eq!(c.label(n), Some(json!("true")), "{n} lost its label");
        assert!(!c.tainted(n), "{n} tainted by a network in conflict");
    }
    assert_eq!(c.state("n1").spec, spec_before, "last good state kept");
    let d = c.condition("second", "Degraded");
    assert_eq!(d["status"], "True");
    assert_eq!(d["reason"], "Conflict");
    assert_eq!(c.condition("fast", "Degraded")["status"], "False");
    assert_eq!(c.condition("fast", "Ready")["status"], "True");
    assert!(
        !c.event_reasons().iter().any(|r| r == "RdmaUnready"),
        "{:?}",
        c.event_reasons()
    );
}

/// Issue 24 item 11: switching the gate from taint to label on a node that
/// is still Pending removes the taint saying so, not "admitted".
#[tokio::test]
async fn a_gate_change_is_not_reported_as_an_admission() {
    let c = cluster(json!({"minBandwidthGbps": 90}));
    c.reconcile().await;
    c.reconcile().await;
    assert!(c.tainted("n1"));
    assert_eq!(c.entry("n1")["phase"], "Pending");
    c.server.edit(KROCE, "rdmanetworks", "", "fast", |o| {
        o["spec"]["admission"]["gate"] = "label".into();
        o["metadata"]["generation"] = 2.into();
    });
    c.reconcile().await;
    assert!(!c.tainted("n1"));
    assert_eq!(c.label("n1"), None, "not admitted: no label");
    let events = c.server.list(EVENTS, "events");
    let gate: Vec<&Value> = events
        .iter()
        .filter(|e| e["reason"] == "RdmaGateChanged")
        .collect();
    assert!(
        !events.iter().any(|e| e["reason"] == "RdmaReady"),
        "{events:?}"
    );
    assert_eq!(gate.len(), 2, "one per node: {events:?}");
    let note = gate[0]["note"].as_str().unwrap();
    assert!(
        note.contains("gate changed") && note.contains("not admitted by fast"),
        "{note}"
    );
}

fn event_notes(c: &Cluster, reason: &str) -> Vec<String> {
    c.server
        .list(EVENTS, "events")
        .iter()
        .filter(|e| e["reason"] == reason)
        .map(|e| e["note"].as_str().unwrap_or("").to_string())
        .collect()
}

/// Issue 24 item 9: a test pod whose image cannot be pulled fails the run
/// at once, naming the pod and the reason, instead of at the timeout.
#[tokio::test]
async fn an_image_that_cannot_be_pulled_fails_the_run_at_once() {
    let c = cluster(json!({"minBandwidthGbps": 90}));
    let (server, _) = c.to_server_pod().await;
    c.set_pod(&server, |p| {
        p["spec"]["nodeName"] = "n1".into();
        p["status"] = json!({"phase": "Pending", "containerStatuses": [{
            "name": "perftest", "image": "registry.example/kroce-perftest:1", "imageID": "",
            "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "ErrImagePull",
                                  "message": "failed to pull: not found"}}}]});
    });
    c.clock.store(T0 + 5, Ordering::SeqCst);
    c.reconcile().await;
    for n in ["n1", "n2"] {
        let e = c.entry(n);
        assert_eq!(e["phase"], "Failed", "{e}");
        let msg = e["conditions"][0]["message"].as_str().unwrap();
        assert!(
            msg.contains(&format!("server pod {server} on node n1"))
                && msg.contains("ErrImagePull")
                && msg.contains("failed to pull: not found")
                && msg.contains("registry.example/kroce-perftest:1"),
            "{msg}"
        );
        assert!(c.tainted(n));
    }
    assert!(c.pods().is_empty(), "pods left: {:?}", c.pods());
    let notes = event_notes(&c, "AdmissionFailed");
    assert!(
        notes
            .iter()
            .any(|n| n.contains("ErrImagePull") && n.contains(&server)),
        "{notes:?}"
    );
}

#[tokio::test]
async fn an_unschedulable_test_pod_fails_the_run_after_a_short_grace() {
    let c = cluster(json!({"minBandwidthGbps": 90}));
    let (server, _) = c.to_server_pod().await;
    c.set_pod(&server, |p| {
        p["status"] = json!({"phase": "Pending", "conditions": [{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
            "message": "0/3 nodes are available: 1 Insufficient rdma/vf."}]});
    });
    c.clock.store(T0 + 10, Ordering::SeqCst);
    c.reconcile().await;
    assert_eq!(c.entry("n1")["phase"], "Testing", "within the grace");
    c.clock.store(T0 + 30, Ordering::SeqCst);
    c.reconcile().await;
    let e = c.entry("n1");
    assert_eq!(e["phase"], "Failed");
    let msg = e["message"].as_str().unwrap();
    assert!(
        msg.contains(&format!("server pod {server} cannot be scheduled"))
            && msg.contains("Insufficient rdma/vf"),
        "{msg}"
    );
}

#[tokio::test]
async fn a_server_without_the_test_attachment_fails_the_run_naming_multus() {
    let c = cluster(json!({"minBandwidthGbps": 90}));
    let (server, _) = c.to_server_pod().await;
    c.set_pod(&server, |p| p["status"] = json!({"phase": "Running"}));
    c.reconcile().await;
    let msg = c.entry("n2")["message"].as_str().unwrap().to_string();
    assert!(
        msg.contains(&server) && msg.contains("Multus") && msg.contains("kroce-admission-fast"),
        "{msg}"
    );
    assert!(c.pods().is_empty());
}

#[tokio::test]
async fn a_missing_attachment_definition_crd_fails_the_run_at_once() {
    let c = cluster(json!({"minBandwidthGbps": 90}));
    c.reconcile().await;
    c.reconcile().await;
    c.agents_synced();
    c.server
        .unserved
        .lock()
        .unwrap()
        .insert("network-attachment-definitions".to_string());
    c.reconcile().await;
    assert!(c.pods().is_empty(), "no pod without its attachment");
    assert_eq!(c.entry("n1")["phase"], "Testing");
    c.clock.store(T0 + 5, Ordering::SeqCst);
    c.reconcile().await;
    let msg = c.entry("n1")["message"].as_str().unwrap().to_string();
    assert_eq!(c.entry("n1")["phase"], "Failed", "{msg}");
    assert!(
        msg.contains("kroce-admission-fast") && msg.contains("install Multus"),
        "{msg}"
    );
}

/// Issue 24 item 9: a network selecting one node says admission cannot
/// run (no peer) and what holds the node, instead of Ready 1/1.
#[tokio::test]
async fn a_single_selected_node_says_admission_cannot_run() {
    let c = cluster(json!({"minBandwidthGbps": 90, "gate": "label"}));
    c.server.edit(CORE, "nodes", "", "n2", |o| {
        o["metadata"]["labels"] = json!({});
    });
    c.reconcile().await;
    c.reconcile().await;
    c.agents_synced();
    c.reconcile().await;
    assert_eq!(c.entry("n1")["phase"], "Pending");
    let blocked = c.condition("fast", "AdmissionBlocked");
    assert_eq!(blocked["status"], "True", "{blocked}");
    let msg = blocked["message"].as_str().unwrap();
    assert!(
        msg.contains("only node n1")
            && msg.contains("gate: label")
            && msg.contains("kroce.io/rdma-ready=true"),
        "{msg}"
    );
    let ready = c.condition("fast", "Ready");
    assert_eq!(ready["status"], "False");
    assert_eq!(ready["reason"], "AdmissionBlocked");
    // A second node lifts it.
    c.server.edit(CORE, "nodes", "", "n2", |o| {
        o["metadata"]["labels"] = json!({"rdma": "yes"});
    });
    c.reconcile().await;
    assert_eq!(c.condition("fast", "AdmissionBlocked")["status"], "False");
}
