#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The shipped binary's `doctor --baseline save|compare` against a fixture
//! host: unchanged counters compare clean (exit 0); counters that move
//! during the compare (symbol errors from zero, a pause storm) and a
//! perftest bandwidth drop exit 1 naming the port, the counter and the
//! network; a bad baseline file exits 2 naming it.

use sriov_helpers::Host;
use sriov_helpers::fixture::FixtureHost;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn write(path: &Path, content: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, content).unwrap();
}

/// The PF RDMA devices of the fixture, with a port's counters written.
fn with_counters(fx: &FixtureHost) -> Vec<String> {
    let host = Host::scan(&fx.root());
    let mut devs = Vec::new();
    for pf in host.pfs() {
        let Some(dev) = host.rdma_of_pci(&pf.address) else {
            continue;
        };
        let port = fx
            .path()
            .join(format!("sys/class/infiniband/{}/ports/1", dev.name));
        for (name, v) in [
            ("symbol_error", 0),
            ("link_error_recovery", 0),
            ("port_rcv_errors", 0),
            ("port_xmit_discards", 0),
            ("port_xmit_data", 1000),
            ("port_rcv_data", 1000),
        ] {
            write(&port.join("counters").join(name), &format!("{v}\n"));
        }
        write(&port.join("hw_counters/np_cnp_sent"), "0\n");
        devs.push(dev.name.clone());
    }
    assert!(!devs.is_empty(), "fixture has PF RDMA devices");
    devs
}

/// A fake `ethtool -S`: constant pause counters, unless `<dir>/moving`
/// exists; then each call adds 10000 pause frames and 50 symbol errors on
/// every fixture port (the NIC's counters moving while the doctor samples).
fn fake_ethtool(dir: &Path, fx: &FixtureHost) -> PathBuf {
    let p = dir.join("ethtool");
    let body = format!(
        r#"#!/bin/sh
d={dir}
n=$(cat $d/pause 2>/dev/null || echo 0)
if [ -e $d/moving ]; then
  n=$((n + 10000)); echo $n > $d/pause
  for f in {fx}/sys/class/infiniband/*/ports/1/counters/symbol_error; do
    echo $(( $(cat $f) + 50 )) > $f
  done
fi
printf 'NIC statistics:\n     rx_prio3_pause: %s\n     tx_prio3_pause: 0\n     rx_discards_phy: 0\n' $n
"#,
        dir = dir.display(),
        fx = fx.path().display()
    );
    std::fs::write(&p, body).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

/// `kubectl get rdmanodestate n1 -o json` with one network's last run.
fn node_state(dir: &Path, bandwidth: f64, passed: bool) -> PathBuf {
    use kroce_admission::lifecycle::AdmissionRecord;
    use kroce_admission::thresholds::Measurement;
    use kroce_operator::crd::{NetworkAdmission, RdmaNodeStateStatus};
    let mut a = NetworkAdmission {
        network: "rdma-a".into(),
        phase: "Admitted".into(),
        ..Default::default()
    };
    a.state.last_result = Some(Box::new(AdmissionRecord {
        run_id: format!("r-{bandwidth}"),
        peer: "n2".into(),
        finished_at: 1_764_633_600,
        passed,
        measurement: Some(Measurement {
            bandwidth_gbps: Some(bandwidth),
            latency_avg_us: Some(2.0),
            latency_p99_us: Some(3.0),
            port_rate_gbps: Some(100.0),
        }),
        message: String::new(),
    }));
    let status = RdmaNodeStateStatus {
        admission: vec![a],
        ..Default::default()
    };
    let obj = serde_json::json!({
        "apiVersion": "kroce.io/v1alpha1",
        "kind": "RdmaNodeState",
        "metadata": {"name": "n1"},
        "status": status,
    });
    let p = dir.join(format!("node-state-{bandwidth}.json"));
    std::fs::write(&p, serde_json::to_string_pretty(&obj).unwrap()).unwrap();
    p
}

fn doctor(fx: &FixtureHost, ethtool: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kroce-node-agent"))
        .arg("doctor")
        .arg("--host-root")
        .arg(fx.path())
        .arg("--baseline-ethtool")
        .arg(ethtool)
        .args(["--baseline-interval-seconds", "1"])
        .args(extra)
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn save_then_compare_flags_moved_counters_and_a_bandwidth_drop() {
    let fx = FixtureHost::connectx6dx_pair().unwrap();
    let devs = with_counters(&fx);
    let dir = tempfile::tempdir().unwrap();
    let ethtool = fake_ethtool(dir.path(), &fx);
    let good = node_state(dir.path(), 97.0, true);
    let slow = node_state(dir.path(), 70.0, false);
    let good = good.to_str().unwrap();

    let o = doctor(&fx, &ethtool, &["--baseline", "save", "--node-state", good]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    // Default file: under the agent's state dir in the host root.
    let file = fx
        .path()
        .join("var/lib/kroce/node-agent/counters-baseline.json");
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(saved["version"], 1);
    assert_eq!(saved["perftest"][0]["bandwidthGbps"], 97.0);
    assert_eq!(
        saved["ports"][0]["rates"]["port/symbol_error"], 0.0,
        "{saved}"
    );
    assert!(
        text(&o).contains("saved a counters baseline of"),
        "{}",
        text(&o)
    );

    // Nothing moved: clean.
    let o = doctor(
        &fx,
        &ethtool,
        &["--baseline", "compare", "--node-state", good],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        text(&o).contains("0 regression(s) against the baseline"),
        "{}",
        text(&o)
    );

    // The NIC's counters move while compare samples; perftest got slower.
    std::fs::write(dir.path().join("moving"), "").unwrap();
    let o = doctor(
        &fx,
        &ethtool,
        &[
            "--baseline",
            "compare",
            "--node-state",
            slow.to_str().unwrap(),
        ],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let out = text(&o);
    for want in [
        format!("REGRESSION {} port 1: port/symbol_error at", devs[0]),
        format!("REGRESSION {} port 1: pause/rx_prio3_pause at", devs[0]),
        "REGRESSION network rdma-a: perftest bandwidth 70.00 Gb/s, 97.00 in the baseline (27.8% lower)".to_string(),
    ] {
        assert!(out.contains(&want), "{want:?} not in\n{out}");
    }
    // --json: the same findings for a script.
    let o = doctor(&fx, &ethtool, &["--baseline", "compare", "--json"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["regressions"].as_u64().unwrap() >= 2, "{v}");
    assert!(
        v["findings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["kind"] == "errorRateFromZero" && f["counter"] == "port/symbol_error"),
        "{v}"
    );
}

#[test]
fn a_bad_or_missing_baseline_file_exits_2_naming_it() {
    let fx = FixtureHost::connectx6dx_pair().unwrap();
    with_counters(&fx);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("old.json");
    std::fs::write(&file, r#"{"version":0,"ports":[]}"#).unwrap();
    let o = doctor(
        &fx,
        Path::new(""),
        &[
            "--baseline",
            "compare",
            "--baseline-file",
            file.to_str().unwrap(),
        ],
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&format!("{}: field `version` is 0", file.display())),
        "{err}"
    );
    let missing = dir.path().join("none.json");
    let o = doctor(
        &fx,
        Path::new(""),
        &[
            "--baseline",
            "compare",
            "--baseline-file",
            missing.to_str().unwrap(),
        ],
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("none.json"),
        "{}",
        text(&o)
    );
}
