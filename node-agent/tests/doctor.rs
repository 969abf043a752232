#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `kroce-node-agent doctor` against fixture hosts: a healthy host passes
//! (exit 0), a failing check fails the run (exit 1), NRI reachability is
//! a check of its own, bad input names the file.

use sriov_helpers::fixture::FixtureHost;
use sriov_helpers::{Host, PciAddress};
use std::net::Ipv4Addr;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn write(path: &Path, content: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, content).unwrap();
}

const OPEN_RULESET: &str = "*filter\n:INPUT DROP [0:0]\n:OUTPUT ACCEPT [0:0]\n-A INPUT -p udp -m udp --dport 4791 -j ACCEPT\nCOMMIT\n";

struct Healthy {
    fx: FixtureHost,
    net_state: PathBuf,
    ruleset: PathBuf,
    vf_rdma: String,
}

/// A ConnectX pair with ECN on priority 3, PFC on 3 only, a VF address
/// with its RoCE v2 GID, and a container runtime with unlimited memlock.
fn healthy() -> Healthy {
    let fx = FixtureHost::connectx6dx_pair().unwrap();
    for pf in ["ens1f0", "ens2f0"] {
        for side in ["roce_np", "roce_rp"] {
            write(
                &fx.path()
                    .join(format!("sys/class/net/{pf}/ecn/{side}/enable/3")),
                "1\n",
            );
        }
    }
    write(&fx.path().join("proc/1/comm"), "systemd\n");
    write(&fx.path().join("proc/812/comm"), "containerd\n");
    write(
        &fx.path().join("proc/812/limits"),
        "Max locked memory         unlimited            unlimited            bytes\n",
    );
    let vf: PciAddress = "0000:3b:00.2".parse().unwrap();
    let vf_rdma = Host::scan(&fx.root())
        .rdma_of_pci(&vf)
        .unwrap()
        .name
        .clone();
    fx.add_ipv4_gid(&vf_rdma, 2, Ipv4Addr::new(10, 0, 0, 5), "ens1f0v0")
        .unwrap();
    let net_state = fx.path().join("net-state.json");
    std::fs::write(
        &net_state,
        r#"{"ipv4": {"ens1f0v0": ["10.0.0.5"]}, "pfcEnabled": {"ens1f0": [3], "ens2f0": [3]}}"#,
    )
    .unwrap();
    let ruleset = fx.path().join("rules.txt");
    std::fs::write(&ruleset, OPEN_RULESET).unwrap();
    Healthy {
        fx,
        net_state,
        ruleset,
        vf_rdma,
    }
}

fn doctor(h: &Healthy, nri: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kroce-node-agent"))
        .arg("doctor")
        .arg("--host-root")
        .arg(h.fx.path())
        .arg("--net-state")
        .arg(&h.net_state)
        .arg("--firewall-ruleset")
        .arg(&h.ruleset)
        .arg("--nri-socket")
        .arg(nri)
        .args(extra)
        .output()
        .unwrap()
}

fn checks(out: &Output) -> Vec<serde_json::Value> {
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    v["checks"].as_array().unwrap().clone()
}

fn find<'a>(cs: &'a [serde_json::Value], name: &str, subject: &str) -> &'a serde_json::Value {
    cs.iter()
        .find(|c| c["name"] == name && c["subject"] == subject)
        .unwrap_or_else(|| panic!("no {name}/{subject} in {cs:#?}"))
}

#[test]
fn healthy_host_passes_with_nri_reachable() {
    let h = healthy();
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("nri.sock");
    let _nri = UnixListener::bind(&sock).unwrap();
    let out = doctor(&h, &sock, &["--json"]);
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let cs = checks(&out);
    assert!(cs.iter().all(|c| c["status"] != "fail"), "{cs:#?}");
    let gid = find(&cs, "roce-v2-gid", "ens1f0");
    assert_eq!(gid["status"], "pass");
    assert!(
        gid["evidence"]
            .as_str()
            .unwrap()
            .contains(&format!("{} port 1 GID index 3", h.vf_rdma)),
        "{gid}"
    );
    assert_eq!(find(&cs, "memlock", "node")["status"], "pass");
    assert_eq!(find(&cs, "nri", "node")["status"], "pass");
    // The table for people: one row per check and a summary.
    let table = doctor(&h, &sock, &[]);
    assert!(table.status.success());
    let text = String::from_utf8(table.stdout).unwrap();
    assert!(text.starts_with("STATUS"), "{text}");
    assert!(text.contains("nri") && text.contains("0 fail,"), "{text}");
}

#[test]
fn a_dead_port_fails_the_run() {
    let h = healthy();
    let pf_rdma = Host::scan(&h.fx.root())
        .rdma_of_pci(&"0000:86:00.0".parse().unwrap())
        .unwrap()
        .name
        .clone();
    h.fx.set_port_state(&pf_rdma, "1: DOWN").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = doctor(&h, &dir.path().join("nri.sock"), &["--json"]);
    assert_eq!(out.status.code(), Some(1));
    let cs = checks(&out);
    let link = find(&cs, "link", "ens2f0");
    assert_eq!(link["status"], "fail");
    assert!(
        link["evidence"].as_str().unwrap().contains("DOWN"),
        "{link}"
    );
    assert!(link["hint"].is_string());
    assert_eq!(find(&cs, "link", "ens1f0")["status"], "pass");
    // No NRI socket, but the runtime's memlock suffices: a warning with the way out.
    let nri = find(&cs, "nri", "node");
    assert_eq!(nri["status"], "warn");
    assert!(
        nri["hint"]
            .as_str()
            .unwrap()
            .contains("LimitMEMLOCK=infinity")
    );
}

#[test]
fn small_memlock_without_nri_fails_and_with_nri_warns() {
    let h = healthy();
    write(
        &h.fx.path().join("proc/812/limits"),
        "Max locked memory         8388608              8388608              bytes\n",
    );
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("nri.sock");
    let out = doctor(&h, &sock, &["--json"]);
    assert_eq!(out.status.code(), Some(1));
    let cs = checks(&out);
    assert_eq!(find(&cs, "memlock", "node")["status"], "fail");
    assert_eq!(find(&cs, "nri", "node")["status"], "fail");
    let _nri = UnixListener::bind(&sock).unwrap();
    let out = doctor(&h, &sock, &["--json"]);
    assert!(out.status.success());
    let cs = checks(&out);
    let m = find(&cs, "memlock", "node");
    assert_eq!(m["status"], "warn");
    assert!(m["evidence"].as_str().unwrap().contains("kroce-nri"), "{m}");
}

#[test]
fn bad_input_names_the_file_or_flag() {
    let h = healthy();
    let out = Command::new(env!("CARGO_BIN_EXE_kroce-node-agent"))
        .args(["doctor", "--host-root"])
        .arg(h.fx.path())
        .args(["--net-state", "/nonexistent/net.json"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/net.json"), "{err}");
    std::fs::write(&h.net_state, "{\"ipv4\": 5}").unwrap();
    let out = doctor(&h, Path::new("/nonexistent.sock"), &[]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("net-state.json") && err.contains("NetState"),
        "{err}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_kroce-node-agent"))
        .args(["doctor", "--roce-priority", "9"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--roce-priority"));
}
