#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The chart's alert rules and Grafana dashboard against a real Prometheus
//! (Debian's `prometheus` 2.42, the package ci/setup.sh installs for
//! promtool) scraping the shipped `kroce-node-agent` (`KROCE_BIN_DIR`, the
//! release build) that serves a fixture host: two ConnectX-6 Dx PFs whose
//! sysfs counters this test bumps, an `ethtool` stand-in printing the
//! per-priority pause and PHY discard counters it bumps, and the real CRD
//! server (`crd_server`) holding the node's RdmaNodeState with two VF pools
//! and two admission results.
//!
//! The first PF gets a pause storm, ECN that does not keep up, discards,
//! out_of_buffer, port and transport errors and link flaps; one of its
//! pools loses a VF's netdev; one network's admission failed. Every alert
//! of the chart must fire in Prometheus' `/api/v1/alerts` within its `for`
//! (a test copy of the rules with the same expressions and thresholds and
//! `for: 5s`), and nothing may fire for the second PF (normal traffic), the
//! healthy pools or the admitted network. Then every dashboard panel's
//! PromQL, variables substituted, must return data from that Prometheus.
//! Prints which alert fired after how long.
//!
//! Skipped (and said) without `prometheus` (`KROCE_PROMETHEUS` or PATH) or
//! the CRD server's peers; with `CI` set that is a failure.

#[allow(dead_code)]
mod crd_server;

use kroce_operator::crd::{NetworkAdmission, RdmaNodeState, RdmaNodeStateSpec};
use kroce_operator::names::{ADMISSION_MANAGER, MANAGER};
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};
use sriov_helpers::fixture::FixtureHost;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const NODE: &str = "prom-node";
/// `for` of every rule in the test copy.
const FOR_SECS: u64 = 5;
/// From a counter starting to move to the alert firing, beyond `for`: the
/// agent's pass (1 s), the scrape (1 s), two samples for a rate, the rule
/// evaluation (1 s), with room for a loaded CI machine.
const SLACK_SECS: u64 = 25;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `prometheus` from `KROCE_PROMETHEUS` or PATH; `None` after saying why
/// the test skips; in CI (env `CI`) a failure.
fn prometheus() -> Option<PathBuf> {
    let found = match std::env::var_os("KROCE_PROMETHEUS") {
        Some(p) => Some(PathBuf::from(p)).filter(|p| p.is_file()),
        None => std::env::var_os("PATH").and_then(|path| {
            std::env::split_paths(&path)
                .map(|d| d.join("prometheus"))
                .find(|p| p.is_file())
        }),
    };
    if found.is_none() {
        let why =
            "no prometheus (KROCE_PROMETHEUS or PATH; Debian's `prometheus` package, ci/setup.sh)";
        if std::env::var_os("CI").is_some() {
            panic!("CI must run the real Prometheus test, but {why}");
        }
        eprintln!("skipped: {why}");
    }
    found
}

/// The shipped `kroce-node-agent`: in `KROCE_BIN_DIR` (CI: the release
/// build), else next to this test's executable (`<target>/<profile>/`).
fn node_agent() -> PathBuf {
    let dir = match std::env::var_os("KROCE_BIN_DIR") {
        Some(d) => PathBuf::from(d),
        None => {
            let exe = std::env::current_exe().unwrap();
            exe.parent().and_then(Path::parent).unwrap().to_path_buf()
        }
    };
    let p = dir.join("kroce-node-agent");
    assert!(
        p.is_file(),
        "{} not found: `cargo build --release -p kroce-node-agent` and point KROCE_BIN_DIR at <target>/release",
        p.display()
    );
    p
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Kills the child (and waits) when the test ends, however it ends.
struct Killed(Child, &'static str, PathBuf);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Killed {
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.2).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        format!(
            "--- {} log ({}):\n{}",
            self.1,
            self.2.display(),
            lines[lines.len().saturating_sub(40)..].join("\n")
        )
    }

    fn assert_running(&mut self) {
        if let Some(st) = self.0.try_wait().unwrap() {
            panic!("{} exited ({st}):\n{}", self.1, self.log_tail());
        }
    }
}

fn spawn(mut cmd: Command, name: &'static str, log: PathBuf) -> Killed {
    let f = std::fs::File::create(&log).unwrap();
    let child = cmd
        .stdin(Stdio::null())
        .stdout(f.try_clone().unwrap())
        .stderr(f)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {name}: {e}"));
    Killed(child, name, log)
}

/// A plain HTTP/1.0 GET on loopback: (status, body).
fn http_get(port: u16, path_and_query: &str) -> std::io::Result<(u16, String)> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "GET {path_and_query} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n"
    )?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Ok((status, body.to_string()))
}

fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `/api/v1/<what>` as JSON `data`, panicking with Prometheus' error.
fn prom_api(port: u16, what: &str) -> Value {
    let (status, body) = http_get(port, &format!("/api/v1/{what}")).unwrap();
    let v: Value = serde_json::from_str(&body)
        .unwrap_or_else(|e| panic!("/api/v1/{what}: {e}: HTTP {status} {body}"));
    assert_eq!(v["status"], "success", "/api/v1/{what}: {body}");
    v["data"].clone()
}

fn query(port: u16, promql: &str) -> Vec<Value> {
    prom_api(port, &format!("query?query={}", url_encode(promql)))["result"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// The rules file as Helm renders it with the chart's default thresholds
/// (values.yaml), every `for` replaced by `for_`: the expressions stay
/// exactly the chart's.
fn test_rules(for_: &str) -> String {
    let chart = repo().join("charts/kroce");
    let text = std::fs::read_to_string(chart.join("files/kroce-rules.yaml")).unwrap();
    let values: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(chart.join("values.yaml")).unwrap())
            .unwrap();
    let alerts = &values["alerts"];
    let mut out = String::new();
    let mut in_comment = false;
    for line in text.lines() {
        let t = line.trim_start();
        if in_comment || t.starts_with("{{- /*") {
            in_comment = !t.contains("*/");
            continue;
        }
        // `{{- $a := ... -}}`, `{{- $runbook := ... -}}`.
        if t.starts_with("{{-") {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    let out = out.replace(
        "{{ $runbook | quote }}",
        "\"kroce-node-agent doctor (test copy)\"",
    );
    let re = regex::Regex::new(r"\{\{ \$a\.(\w+)\.(\w+) \}\}").unwrap();
    let out = re.replace_all(&out, |c: &regex::Captures| {
        if &c[2] == "for" {
            return for_.to_string();
        }
        match &alerts[&c[1]][&c[2]] {
            Value::Number(n) => n.to_string(),
            v => panic!("values.yaml alerts.{}.{}: not a number: {v}", &c[1], &c[2]),
        }
    });
    let out = out.replace("{{\"{{\"}}", "\u{0}");
    assert!(
        !out.contains("{{"),
        "a template action the test copy does not know:\n{out}"
    );
    out.replace('\u{0}', "{{")
}

/// Counter name -> per second.
type Rates = Vec<(&'static str, f64)>;

/// One port's counters, as values growing at a rate per second.
#[derive(Clone)]
struct Port {
    /// sysfs `ports/1/counters` of the RDMA device.
    counters: PathBuf,
    hw_counters: PathBuf,
    /// The `ethtool -S` text file for the netdev.
    ethtool: PathBuf,
    /// Where files are written before they are renamed into place.
    scratch: PathBuf,
    /// name -> per second, for counters, hw_counters and ethtool.
    port_rates: Rates,
    hw_rates: Rates,
    ethtool_rates: Rates,
}

impl Port {
    /// Writes every counter at `secs` seconds, each file replaced at once
    /// (written in `scratch`, then renamed: the agent never reads half a
    /// number, nor a temp file in a counter directory).
    fn write(&self, secs: f64) -> std::io::Result<()> {
        let put = |dir: &Path, name: &str, text: String| {
            let tmp = self.scratch.join(name);
            std::fs::write(&tmp, text)?;
            std::fs::rename(&tmp, dir.join(name))
        };
        for (n, r) in &self.port_rates {
            put(&self.counters, n, format!("{}\n", (r * secs) as u64))?;
        }
        for (n, r) in &self.hw_rates {
            put(&self.hw_counters, n, format!("{}\n", (r * secs) as u64))?;
        }
        let mut text = String::from("NIC statistics:\n");
        for (n, r) in &self.ethtool_rates {
            text.push_str(&format!("     {n}: {}\n", (r * secs) as u64));
        }
        let (dir, name) = (
            self.ethtool.parent().unwrap(),
            self.ethtool.file_name().unwrap().to_str().unwrap(),
        );
        put(dir, name, text)
    }
}

/// Counters of a healthy port under load: 50 Gb/s each way, a few pause
/// frames with many more CNPs, nothing dropped, no errors.
fn normal_rates() -> (Rates, Rates, Rates) {
    (
        vec![
            ("port_xmit_data", 50e9 / 32.0),
            ("port_rcv_data", 50e9 / 32.0),
            ("port_xmit_discards", 0.0),
            ("port_rcv_errors", 0.0),
            ("symbol_error", 0.0),
            ("link_error_recovery", 0.0),
            ("link_downed", 0.0),
        ],
        vec![
            // Four CNPs per pause frame: ECN acts before PFC (and the storm's
            // 10/s takes over the rate windows within seconds).
            ("np_ecn_marked_roce_packets", 400.0),
            ("np_cnp_sent", 200.0),
            ("rp_cnp_handled", 200.0),
            ("out_of_buffer", 1.0),
            ("out_of_sequence", 0.0),
            ("packet_seq_err", 0.0),
            ("local_ack_timeout_err", 0.0),
        ],
        vec![
            ("rx_prio3_pause", 50.0),
            ("tx_prio3_pause", 20.0),
            ("rx_prio3_pause_duration", 5_000.0),
            ("tx_prio3_pause_duration", 2_000.0),
            ("rx_pause_ctrl_phy", 50.0),
            ("rx_discards_phy", 0.0),
            ("tx_discards_phy", 0.0),
        ],
    )
}

/// Counters of a port in trouble: every alert's condition, well past its
/// default threshold. Far past: `rate(x[5m])` of a series younger than
/// its window divides the increase it has by the whole window (Prometheus
/// extrapolates a series' start by half a scrape interval at most), so a
/// fresh series crosses `threshold` after `window x threshold / rate`
/// seconds; these rates make that about 3 s (paused time, which cannot
/// exceed 1 s per second, takes 30 s).
fn storm_rates() -> (Rates, Rates, Rates) {
    (
        vec![
            ("port_xmit_data", 5e9 / 32.0),
            ("port_rcv_data", 5e9 / 32.0),
            ("port_xmit_discards", 1000.0),
            ("port_rcv_errors", 20.0),
            ("symbol_error", 20.0),
            ("link_error_recovery", 0.0),
            // Two flaps a few seconds apart.
            ("link_downed", 0.5),
        ],
        vec![
            ("np_ecn_marked_roce_packets", 10.0),
            ("np_cnp_sent", 10.0),
            // Far fewer CNPs handled than pause frames received.
            ("rp_cnp_handled", 10.0),
            ("out_of_buffer", 1000.0),
            ("out_of_sequence", 0.0),
            ("packet_seq_err", 0.0),
            ("local_ack_timeout_err", 100.0),
        ],
        vec![
            // Paused by the switch and pausing it back: a storm both ways.
            ("rx_prio3_pause", 20_000.0),
            ("tx_prio3_pause", 100_000.0),
            ("rx_prio3_pause_duration", 100_000.0),
            // Pausing its peer all the time.
            ("tx_prio3_pause_duration", 1_000_000.0),
            ("rx_pause_ctrl_phy", 20_000.0),
            ("rx_discards_phy", 1000.0),
            ("tx_discards_phy", 0.0),
        ],
    )
}

/// An alert to expect: its name, the labels that pick the instance, and
/// how long its fresh series need to cross the threshold (see
/// [`storm_rates`]) before `for` starts.
struct Expected {
    alert: &'static str,
    labels: Vec<(&'static str, String)>,
    young_series_secs: u64,
}

fn alert_matches(a: &Value, name: &str, labels: &[(&str, String)]) -> bool {
    a["labels"]["alertname"] == name
        && labels
            .iter()
            .all(|(k, v)| a["labels"][*k].as_str() == Some(v.as_str()))
}

fn admission(network: &str, passed: bool, bw: f64) -> NetworkAdmission {
    use kroce_admission::lifecycle::{AdmissionPhase, AdmissionRecord, AdmittedAt, NodeAdmission};
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    NetworkAdmission {
        network: network.into(),
        phase: if passed { "Admitted" } else { "Failed" }.into(),
        schedulable: passed,
        state: NodeAdmission {
            phase: if passed {
                AdmissionPhase::Admitted {
                    at: AdmittedAt {
                        at: now - 60,
                        generation: 1,
                        without_test: false,
                    },
                }
            } else {
                // Its retry was due an hour ago and never happened (a
                // controller that is down): KroceNodeAdmissionOverdue.
                AdmissionPhase::Failed {
                    at: now - 3_700,
                    retry_at: now - 3_600,
                    generation: 1,
                    peer: Some("peer-node".into()),
                    reason: format!("bandwidth {bw} Gb/s < 80 Gb/s"),
                }
            },
            failures: u32::from(!passed),
            last_result: Some(Box::new(AdmissionRecord {
                run_id: format!("run-{network}"),
                peer: "peer-node".into(),
                finished_at: now - 60,
                passed,
                measurement: Some(kroce_admission::thresholds::Measurement {
                    bandwidth_gbps: Some(bw),
                    latency_avg_us: Some(2.1),
                    latency_p99_us: Some(3.4),
                    port_rate_gbps: Some(100.0),
                }),
                message: if passed {
                    format!("bandwidth {bw} Gb/s")
                } else {
                    format!("bandwidth {bw} Gb/s < 80 Gb/s")
                },
            })),
            waiting: None,
            retest_due: None,
        },
        ..Default::default()
    }
}

/// The node's RdmaNodeState (controller's apply) and its admission entries
/// (admission's apply), on the real CRD server.
fn write_node_state(srv: &crd_server::CrdServer) {
    let spec: RdmaNodeStateSpec = serde_json::from_value(json!({
        "nodeName": NODE,
        "pfs": [
            {"pciAddress": "0000:3b:00.0", "ifName": "ens1f0", "numVfs": 8,
             "vfGroups": [{"network": "net-a", "resourceName": "kroce.io/net_a", "vfRange": "0-3"},
                          {"network": "net-b", "resourceName": "kroce.io/net_b", "vfRange": "4-7"}]},
            {"pciAddress": "0000:86:00.0", "ifName": "ens2f0", "numVfs": 8,
             "vfGroups": [{"network": "net-c", "resourceName": "kroce.io/net_c", "vfRange": "0-7"}]}
        ]
    }))
    .unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let api: Api<RdmaNodeState> = Api::all(srv.client().await);
        let obj = RdmaNodeState::new(NODE, spec);
        api.patch(
            NODE,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&obj),
        )
        .await
        .unwrap();
        let entries = vec![
            admission("net-a", true, 95.5),
            admission("net-b", false, 41.0),
        ];
        let body = json!({"apiVersion": "kroce.io/v1alpha1", "kind": "RdmaNodeState",
            "status": {"admission": entries, "admissionPhase": "Failed"}});
        api.patch_status(
            NODE,
            &PatchParams::apply(ADMISSION_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
        .unwrap();
    });
}

#[test]
fn alerts_fire_on_injected_counters_and_every_dashboard_panel_has_data() {
    let Some(prom_bin) = prometheus() else { return };
    let Some(srv) = crd_server::server() else {
        return;
    };
    let node_agent = node_agent();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();

    // The host: two PFs with 8 VFs each, a VF of pool net-a held by a pod
    // (a kroce-cni claim), the CNI state dir present (else every VF counts
    // as held).
    let fx = FixtureHost::connectx6dx_pair().unwrap();
    let host = sriov_helpers::Host::scan(&fx.root());
    let pf_dev = |pci: &str| -> String {
        host.rdma
            .values()
            .find(|r| r.pci.as_ref().map(|p| p.to_string()).as_deref() == Some(pci))
            .map(|r| r.name.clone())
            .unwrap_or_else(|| panic!("no RDMA device for {pci}"))
    };
    let (dev1, dev2) = (pf_dev("0000:3b:00.0"), pf_dev("0000:86:00.0"));
    let vf0 = fx
        .vf_address(&"0000:3b:00.0".parse().unwrap(), 0)
        .unwrap()
        .to_string();
    let claims = fx.path().join("var/lib/cni/kroce/vf");
    std::fs::create_dir_all(&claims).unwrap();
    std::fs::write(
        claims.join(format!("{vf0}.json")),
        json!({"containerID": "c0ffee", "network": "net-a",
               "cniArgs": "K8S_POD_NAMESPACE=team;K8S_POD_NAME=trainer-0"})
        .to_string(),
    )
    .unwrap();
    let ethtool_dir = d.join("ethtool");
    std::fs::create_dir_all(&ethtool_dir).unwrap();
    let ethtool = d.join("ethtool.sh");
    std::fs::write(
        &ethtool,
        format!(
            "#!/bin/sh\n# ethtool -S <ifname>: the test's counters for it\nexec cat '{}'/\"$2\".txt\n",
            ethtool_dir.display()
        ),
    )
    .unwrap();
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&ethtool, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let port = |dev: &str, netdev: &str, rates: (Rates, Rates, Rates)| {
        let base = fx
            .path()
            .join(format!("sys/class/infiniband/{dev}/ports/1"));
        let p = Port {
            counters: base.join("counters"),
            hw_counters: base.join("hw_counters"),
            ethtool: ethtool_dir.join(format!("{netdev}.txt")),
            scratch: d.join("scratch"),
            port_rates: rates.0,
            hw_rates: rates.1,
            ethtool_rates: rates.2,
        };
        std::fs::create_dir_all(&p.counters).unwrap();
        std::fs::create_dir_all(&p.scratch).unwrap();
        std::fs::create_dir_all(&p.hw_counters).unwrap();
        p
    };
    // Both ports start with normal traffic; the first turns to a storm later.
    let normal1 = port(&dev1, "ens1f0", normal_rates());
    let (port_rates, hw_rates, ethtool_rates) = storm_rates();
    let storm1 = Port {
        port_rates,
        hw_rates,
        ethtool_rates,
        ..normal1.clone()
    };
    let normal2 = port(&dev2, "ens2f0", normal_rates());
    normal1.write(0.0).unwrap();
    normal2.write(0.0).unwrap();
    // kroce-nri's status: a runtime (pid 812, alive in the fixture's /proc)
    // without CAP_SYS_RESOURCE whose 8 MiB hard limit capped two requests:
    // KroceNriMemlockCapped.
    std::fs::create_dir_all(fx.path().join("proc/812")).unwrap();
    std::fs::write(
        fx.path().join("var/lib/cni/kroce/nri-status.json"),
        json!({"version": 1, "updatedAt": 1, "runtimeName": "containerd", "runtimeVersion": "2.1.9",
               "runtime": {"pid": 812, "capSysResource": false, "initialUserNamespace": true,
                           "memlockSoft": "8388608", "memlockHard": "8388608"},
               "lastCapped": {"container": "ctr-1", "pod": "team/trainer-0", "requested": "unlimited",
                              "granted": "8388608", "at": 1},
               "cappedCount": 2})
        .to_string(),
    )
    .unwrap();

    write_node_state(srv);

    // The shipped node agent, a pass a second.
    let agent_port = free_port();
    let mut cmd = Command::new(&node_agent);
    cmd.args(["run", "--node-name", NODE, "--resync-seconds", "1"])
        .args(["--listen", &format!("127.0.0.1:{agent_port}")])
        .arg("--host-root")
        .arg(fx.path())
        .arg("--configfs")
        .arg(d.join("configfs"))
        .args(["--pod-resources-socket=", "--vf-wait-seconds", "1"])
        .arg("--ethtool")
        .arg(&ethtool)
        .env("KUBECONFIG", &srv.kubeconfig)
        .env("RUST_LOG", "info")
        .env_remove("KROCE_LOG_LEVEL")
        .env_remove("KUBERNETES_SERVICE_HOST");
    let mut agent = spawn(cmd, "kroce-node-agent", d.join("agent.log"));

    // Counters move from here on: normal traffic on both ports.
    let start = Instant::now();
    let storm_at: Arc<std::sync::Mutex<Option<f64>>> = Default::default();
    let stop = Arc::new(AtomicBool::new(false));
    let bumper = {
        let (stop, storm_at) = (stop.clone(), storm_at.clone());
        let (normal1, storm1, normal2) = (normal1.clone(), storm1.clone(), normal2.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let t = start.elapsed().as_secs_f64();
                let storm = *storm_at.lock().unwrap();
                let written = normal2.write(t).and_then(|()| match storm {
                    // Storm counters continue from where normal ones were.
                    Some(s) => write_mixed(&normal1, &storm1, s, t),
                    None => normal1.write(t),
                });
                // The test ended (its directory is gone).
                if written.is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        })
    };

    // The agent serves the counters and pool gauges of its passes.
    let deadline = Instant::now() + Duration::from_secs(60);
    let metrics = loop {
        agent.assert_running();
        if let Ok((200, body)) = http_get(agent_port, "/metrics")
            && body.contains("kroce_vf_pool_vfs")
            && body.contains("kroce_rdma_pause_frames_total")
            && body.contains("kroce_admission_phase")
        {
            break body;
        }
        assert!(
            Instant::now() < deadline,
            "the agent's /metrics never had the pool, pause and admission families:\n{}",
            agent.log_tail()
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    assert!(
        metrics.contains("kroce_rdma_pause_duration_microseconds_total{"),
        "{metrics}"
    );
    // The claimed VF counts as allocated in its pool.
    let allocated = format!(
        "kroce_vf_pool_vfs{{node=\"{NODE}\",network=\"net-a\",pool=\"kroce.io/net_a\",pf=\"0000:3b:00.0\",device=\"{dev1}\",state=\"allocated\"}} 1\n"
    );
    assert!(
        metrics.contains(&allocated),
        "no `{allocated}` in\n{metrics}"
    );
    let version = Command::new(&prom_bin).arg("--version").output().unwrap();
    eprintln!(
        "{}",
        String::from_utf8_lossy(&version.stdout)
            .lines()
            .next()
            .unwrap_or_default()
    );

    // Prometheus: scrape and evaluate every second, the test copy of the rules.
    let rules = d.join("kroce-rules.yaml");
    std::fs::write(&rules, test_rules(&format!("{FOR_SECS}s"))).unwrap();
    let prom_port = free_port();
    let config = d.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files: ['{}']\n\
             scrape_configs:\n  - job_name: kroce-node\n    static_configs:\n      - targets: ['127.0.0.1:{agent_port}']\n",
            rules.display()
        ),
    )
    .unwrap();
    let mut cmd = Command::new(&prom_bin);
    cmd.arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", d.join("tsdb").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"));
    let mut prom = spawn(cmd, "prometheus", d.join("prometheus.log"));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        prom.assert_running();
        if let Ok((200, _)) = http_get(prom_port, "/-/ready") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "prometheus not ready:\n{}",
            prom.log_tail()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let groups = prom_api(prom_port, "rules");
    let loaded: BTreeSet<String> = groups["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap().iter())
        .map(|r| r["name"].as_str().unwrap().to_string())
        .collect();
    assert!(
        loaded.len() >= 11,
        "rules loaded: {loaded:?}\n{}",
        prom.log_tail()
    );

    // A few seconds of normal traffic scraped: nothing may fire but the
    // failed admission and the pool whose VF lost its netdev (both true
    // from the start) — the VF goes now.
    let vf5 = fx.vf_address(&"0000:3b:00.0".parse().unwrap(), 5).unwrap();
    // What a driver that lost the VF's netdev leaves: no net/ entry.
    std::fs::remove_dir_all(
        fx.path()
            .join(format!("sys/bus/pci/devices/{vf5}/net/ens1f0v5")),
    )
    .unwrap();
    fx.remove_netdev("ens1f0v5").unwrap();
    let vf_gone_at = start.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_secs(FOR_SECS + 5));
    let early: Vec<String> = prom_api(prom_port, "alerts")["alerts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["state"] == "firing")
        .filter(|a| {
            !matches!(
                a["labels"]["alertname"].as_str(),
                Some(
                    "KroceNodeAdmissionFailed"
                        | "KroceNodeAdmissionOverdue"
                        | "KroceNriMemlockCapped"
                        | "KroceVfUnhealthy"
                )
            )
        })
        .map(|a| a["labels"].to_string())
        .collect();
    assert!(early.is_empty(), "alerts on normal traffic: {early:?}");

    // The storm on the first port.
    let storm_start = start.elapsed().as_secs_f64();
    *storm_at.lock().unwrap() = Some(storm_start);
    let n1 = |extra: &[(&'static str, &str)]| {
        let mut l = vec![("node", NODE.to_string()), ("device", dev1.clone())];
        l.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
        l
    };
    let expected = [
        Expected {
            alert: "KroceRdmaPfcPauseStorm",
            labels: n1(&[("direction", "tx"), ("priority", "3")]),
            young_series_secs: 4,
        },
        Expected {
            alert: "KroceRdmaPauseWithoutEcn",
            labels: n1(&[("port", "1")]),
            young_series_secs: 4,
        },
        Expected {
            alert: "KroceRdmaPhyDiscards",
            labels: n1(&[("counter", "rx_discards_phy")]),
            young_series_secs: 4,
        },
        Expected {
            alert: "KroceRdmaPhyDiscards",
            labels: n1(&[("counter", "port_xmit_discards")]),
            young_series_secs: 4,
        },
        Expected {
            alert: "KroceRdmaOutOfBuffer",
            labels: n1(&[]),
            young_series_secs: 4,
        },
        Expected {
            alert: "KroceRdmaPhysicalErrors",
            labels: n1(&[("counter", "symbol_error")]),
            young_series_secs: 4,
        },
        Expected {
            alert: "KroceRdmaPortRcvErrors",
            labels: n1(&[]),
            young_series_secs: 4,
        },
        Expected {
            alert: "KroceRdmaTransportRetries",
            labels: n1(&[("counter", "local_ack_timeout_err")]),
            young_series_secs: 4,
        },
        Expected {
            alert: "KroceRdmaLinkFlapping",
            labels: n1(&[]),
            young_series_secs: 4,
        },
        Expected {
            alert: "KroceRdmaPausedTime",
            labels: n1(&[("direction", "tx"), ("priority", "3")]),
            young_series_secs: 30,
        },
        Expected {
            alert: "KroceVfUnhealthy",
            labels: vec![("pool", "kroce.io/net_b".into()), ("node", NODE.into())],
            young_series_secs: 0,
        },
        Expected {
            alert: "KroceNodeAdmissionFailed",
            labels: vec![("network", "net-b".into()), ("node", NODE.into())],
            young_series_secs: 0,
        },
        Expected {
            alert: "KroceNodeAdmissionOverdue",
            labels: vec![("network", "net-b".into()), ("node", NODE.into())],
            young_series_secs: 0,
        },
        Expected {
            alert: "KroceNriMemlockCapped",
            labels: vec![("node", NODE.into())],
            young_series_secs: 0,
        },
    ];
    // Every alert name of the chart is expected once at least.
    let names: BTreeSet<String> = expected.iter().map(|e| e.alert.to_string()).collect();
    assert_eq!(names, loaded, "the test provokes every alert of the chart");

    let mut fired: BTreeMap<usize, f64> = BTreeMap::new();
    let mut last = Value::Null;
    let deadline = Instant::now() + Duration::from_secs(30 + FOR_SECS + SLACK_SECS + 20);
    while fired.len() < expected.len() && Instant::now() < deadline {
        agent.assert_running();
        prom.assert_running();
        last = prom_api(prom_port, "alerts");
        let now = start.elapsed().as_secs_f64();
        for (i, e) in expected.iter().enumerate() {
            if fired.contains_key(&i) {
                continue;
            }
            let on = last["alerts"]
                .as_array()
                .unwrap()
                .iter()
                .any(|a| a["state"] == "firing" && alert_matches(a, e.alert, &e.labels));
            if on {
                fired.insert(i, now);
            }
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    stop.store(true, Ordering::Relaxed);
    bumper.join().unwrap();

    // Which alert fired after how long (from the storm; the pool and
    // admission alerts from when their condition began).
    eprintln!("alert fired after (for: {FOR_SECS}s, scrape and evaluation 1s):");
    let mut late = Vec::new();
    for (i, e) in expected.iter().enumerate() {
        let began = match e.alert {
            "KroceVfUnhealthy" => vf_gone_at,
            // Written before the agent started.
            "KroceNodeAdmissionFailed" | "KroceNodeAdmissionOverdue" | "KroceNriMemlockCapped" => {
                0.0
            }
            _ => storm_start,
        };
        match fired.get(&i) {
            Some(t) => {
                let after = t - began;
                eprintln!("  {:<28} {:?}: {after:.1}s", e.alert, e.labels);
                if after > (e.young_series_secs + FOR_SECS + SLACK_SECS) as f64 {
                    late.push(format!("{} after {after:.1}s", e.alert));
                }
            }
            None => {
                eprintln!("  {:<28} {:?}: NOT FIRING", e.alert, e.labels);
                late.push(format!("{} never fired", e.alert));
            }
        }
    }
    assert!(
        late.is_empty(),
        "{late:?}\nalerts: {last:#}\n{}\n{}",
        agent.log_tail(),
        prom.log_tail()
    );

    // Nothing fires for what was not provoked: the second port, the healthy
    // pools, the admitted network. Pending counts too.
    let all = prom_api(prom_port, "alerts");
    let stray: Vec<String> = all["alerts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| {
            a["labels"]["device"] == dev2.as_str()
                || a["labels"]["netdev"] == "ens2f0"
                || matches!(
                    a["labels"]["pool"].as_str(),
                    Some("kroce.io/net_a" | "kroce.io/net_c")
                )
                || a["labels"]["network"] == "net-a"
                || a["labels"]["network"] == "net-c"
        })
        .map(|a| format!("{} {}", a["state"], a["labels"]))
        .collect();
    assert!(
        stray.is_empty(),
        "alerts for what was not provoked: {stray:?}"
    );
    let unexpected: Vec<String> = all["alerts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["state"] == "firing")
        .filter(|a| !expected.iter().any(|e| a["labels"]["alertname"] == e.alert))
        .map(|a| a["labels"].to_string())
        .collect();
    assert!(unexpected.is_empty(), "{unexpected:?}");

    // Every dashboard panel's PromQL, its variables set as a user would
    // (all devices and ports of the node), returns data.
    let dash: Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("charts/kroce/files/kroce-dashboard.json")).unwrap(),
    )
    .unwrap();
    let subst = |e: &str| {
        e.replace("$__rate_interval", "15s")
            .replace("$node", NODE)
            .replace("$device", ".*")
            .replace("$port", ".*")
    };
    let mut empty = Vec::new();
    let mut panels = 0;
    for p in dash["panels"].as_array().unwrap() {
        let Some(targets) = p["targets"].as_array() else {
            continue;
        };
        panels += 1;
        for t in targets {
            let expr = subst(t["expr"].as_str().unwrap());
            let result = query(prom_port, &expr);
            eprintln!(
                "panel {} {}: {} series",
                p["title"],
                t["refId"],
                result.len()
            );
            if result.is_empty() {
                empty.push(format!("{} {}: {expr}", p["title"], t["refId"]));
            }
        }
    }
    // The variables' label_values(query, label): their label on data.
    for v in dash["templating"]["list"].as_array().unwrap() {
        let Some(q) = v["query"]["query"].as_str() else {
            continue;
        };
        let inner = q
            .strip_prefix("label_values(")
            .and_then(|r| r.strip_suffix(')'))
            .unwrap();
        let (expr, label) = inner.rsplit_once(',').unwrap();
        let label = label.trim();
        let result = query(prom_port, &subst(expr));
        let values: BTreeSet<&str> = result
            .iter()
            .filter_map(|r| r["metric"][label].as_str())
            .collect();
        eprintln!("variable {}: {values:?}", v["name"]);
        if values.is_empty() {
            empty.push(format!("variable {}: {q}", v["name"]));
        }
    }
    assert!(panels >= 14, "{panels} panels");
    assert!(
        empty.is_empty(),
        "queries without data:\n{}",
        empty.join("\n")
    );
}

/// The first port: its normal counters up to `storm_at` seconds, then
/// growing at the storm's rates (counters never go back).
fn write_mixed(normal: &Port, storm: &Port, storm_at: f64, t: f64) -> std::io::Result<()> {
    let mix = |n: &[(&'static str, f64)], s: &[(&'static str, f64)]| -> Rates {
        n.iter()
            .map(|(name, r)| {
                let sr = s.iter().find(|(m, _)| m == name).map_or(*r, |(_, v)| *v);
                // value(t) = r*storm_at + sr*(t - storm_at) = rate * t.
                (*name, (r * storm_at + sr * (t - storm_at)) / t.max(1e-9))
            })
            .collect()
    };
    Port {
        port_rates: mix(&normal.port_rates, &storm.port_rates),
        hw_rates: mix(&normal.hw_rates, &storm.hw_rates),
        ethtool_rates: mix(&normal.ethtool_rates, &storm.ethtool_rates),
        ..normal.clone()
    }
    .write(t)
}
