#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The in-pod runner: its log judged against thresholds, and the
//! `kroce-perftest-run` binary on a fixture host with stand-in perftest
//! and taskset programs that record their argv.

use kroce_admission::command::PerftestTool;
use kroce_admission::pod_run::{
    ENDPOINT_SECTION, ERROR_SECTION, EndpointReport, endpoint_of, judge, section_marker,
    split_sections,
};
use kroce_admission::thresholds::AdmissionThresholds;
use sriov_helpers::fixture::FixtureHost;
use sriov_helpers::{Host, PciAddress};
use std::net::Ipv4Addr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

const BW_D: &str = "\
---------------------------------------------------------------------------------------
                    RDMA_Write BW Test
 Dual-port       : OFF\t\tDevice         : mlx5_2
 Number of qps   : 4\t\tTransport type : IB
---------------------------------------------------------------------------------------
 #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]
 65536      1696410          0.00               92.61  \t\t   0.176636
---------------------------------------------------------------------------------------
";

/// The runner under test: `KROCE_BIN_DIR/kroce-perftest-run` when set (CI
/// points it at the shipped release build), else this package's build.
fn runner_bin() -> std::path::PathBuf {
    std::env::var_os("KROCE_BIN_DIR").map_or_else(
        || std::path::PathBuf::from(env!("CARGO_BIN_EXE_kroce-perftest-run")),
        |d| std::path::PathBuf::from(d).join("kroce-perftest-run"),
    )
}

fn lat_fixture() -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/fixtures/perftest/ib_read_lat-client-azure-aks.txt");
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn endpoint_json(role: &str, rate: Option<f64>) -> String {
    let mut v = serde_json::json!({
        "role": role, "rdmaDevice": "mlx5_2", "ibPort": 1, "netdev": "net1",
        "gidIndex": 3, "ipv4": "10.56.0.3", "cpus": null
    });
    if let Some(r) = rate {
        v["portRateGbps"] = r.into();
    }
    v.to_string()
}

fn client_log(bw: &str, lat: &str, rate: Option<f64>) -> String {
    format!(
        "{}\n{}\n{}\n{bw}{}\n{lat}",
        section_marker(ENDPOINT_SECTION),
        endpoint_json("client", rate),
        section_marker("ib_write_bw"),
        section_marker("ib_read_lat"),
    )
}

fn judge_with(log: &str, server: Option<&str>, t: AdmissionThresholds) -> (bool, String) {
    let o = judge(
        log,
        server,
        PerftestTool::IbWriteBw,
        PerftestTool::IbReadLat,
        &t,
    );
    (o.passed, o.message)
}

#[test]
fn passing_and_failing_runs_say_which_number_and_by_how_much() {
    let log = client_log(BW_D, &lat_fixture(), Some(100.0));
    let t = AdmissionThresholds {
        min_bandwidth_gbps: Some(90.0),
        max_latency_us: Some(6.0),
        max_p99_latency_us: Some(6.0),
        ..Default::default()
    };
    let (passed, msg) = judge_with(&log, None, t);
    assert!(passed, "{msg}");
    assert!(msg.contains("92.61"), "{msg}");

    let t = AdmissionThresholds {
        min_bandwidth_gbps: Some(100.0),
        max_latency_us: Some(5.0),
        ..Default::default()
    };
    let (passed, msg) = judge_with(&log, None, t);
    assert!(!passed);
    assert!(
        msg.contains("bandwidth 92.61 Gb/s is 7.39 Gb/s (7.4%) below the minimum 100.00 Gb/s"),
        "{msg}"
    );
    assert!(
        msg.contains("average latency 5.50 us is 0.50 us (10.0%) above the maximum 5.00 us"),
        "{msg}"
    );
}

#[test]
fn fraction_is_judged_against_the_slower_port() {
    let log = client_log(BW_D, &lat_fixture(), Some(200.0));
    let server = format!(
        "{}\n{}\n",
        section_marker(ENDPOINT_SECTION),
        endpoint_json("server", Some(100.0))
    );
    let t = AdmissionThresholds {
        min_bandwidth_fraction: Some(0.9),
        ..Default::default()
    };
    // 90% of 200 would fail; of the server's 100 it passes.
    let (passed, msg) = judge_with(&log, None, t.clone());
    assert!(!passed, "{msg}");
    let (passed, msg) = judge_with(&log, Some(&server), t);
    assert!(passed, "{msg}");
    assert!(msg.contains("100 Gb/s port rate"), "{msg}");
}

#[test]
fn broken_logs_are_errors_naming_what_is_wrong() {
    let truncated = client_log(&BW_D[..BW_D.len() - 90], &lat_fixture(), None);
    let (passed, msg) = judge_with(&truncated, None, AdmissionThresholds::default());
    assert!(!passed);
    assert!(
        msg.starts_with("ib_write_bw output:") && msg.contains("line"),
        "{msg}"
    );
    let no_lat = format!("{}\n{BW_D}", section_marker("ib_write_bw"));
    let (passed, msg) = judge_with(&no_lat, None, AdmissionThresholds::default());
    assert!(!passed);
    assert_eq!(msg, "the client log has no ib_read_lat output");
    let err = format!(
        "{}\nib_write_bw failed (exit status: 1): Couldn't connect to 10.56.0.3:18515\n",
        section_marker(ERROR_SECTION)
    );
    let (_, msg) = judge_with(
        &format!("{}{err}", client_log(BW_D, "", None)),
        None,
        AdmissionThresholds::default(),
    );
    assert!(msg.starts_with("client: ib_write_bw failed"), "{msg}");
    let (_, msg) = judge_with("exec format error\n", None, AdmissionThresholds::default());
    assert!(
        msg.contains("not kroce-perftest-run output") && msg.contains("exec format error"),
        "{msg}"
    );
}

// ---- the binary ----

struct Stage {
    fx: FixtureHost,
    bin: PathBuf,
    argv_log: PathBuf,
    device: String,
}

fn script(path: &Path, body: &str) {
    std::fs::write(path, format!("#!/bin/sh\n{body}")).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A ConnectX host whose VF 0000:3b:00.2 has 10.56.0.3 (RoCE v2 GID at
/// index 3), a pod cpuset of 2-5,16-17, and stand-in tools on a private PATH.
fn stage() -> Stage {
    let fx = FixtureHost::connectx6dx_pair().unwrap();
    let host = Host::scan(&fx.root());
    let vf: PciAddress = "0000:3b:00.2".parse().unwrap();
    let device = host.rdma_of_pci(&vf).unwrap().name.clone();
    fx.add_ipv4_gid(&device, 2, Ipv4Addr::new(10, 56, 0, 3), "ens1f0v0")
        .unwrap();
    let proc_self = fx.path().join("proc/self");
    std::fs::create_dir_all(&proc_self).unwrap();
    std::fs::write(
        proc_self.join("status"),
        "Name:\tkroce-perftest-run\nCpus_allowed_list:\t2-5,16-17\n",
    )
    .unwrap();
    let bin = fx.path().join("fakebin");
    std::fs::create_dir_all(&bin).unwrap();
    let argv_log = fx.path().join("argv.log");
    let log = argv_log.display();
    let out_bw = fx.path().join("bw.txt");
    let out_lat = fx.path().join("lat.txt");
    std::fs::write(&out_bw, BW_D).unwrap();
    std::fs::write(&out_lat, lat_fixture()).unwrap();
    script(
        &bin.join("taskset"),
        &format!("echo \"taskset $*\" >> {log}\nshift 2\nexec \"$@\"\n"),
    );
    script(
        &bin.join("ib_write_bw"),
        &format!(
            "echo \"ib_write_bw $*\" >> {log}\nif [ -f {flaky} ]; then rm {flaky}; echo \"Couldn't connect to 10.56.0.9:18515\" >&2; exit 1; fi\ncat {}\n",
            out_bw.display(),
            flaky = fx.path().join("flaky").display()
        ),
    );
    script(
        &bin.join("ib_read_lat"),
        &format!(
            "echo \"ib_read_lat $*\" >> {log}\ncat {}\n",
            out_lat.display()
        ),
    );
    Stage {
        fx,
        bin,
        argv_log,
        device,
    }
}

fn runner(s: &Stage, role: &str) -> Command {
    runner_on(s, role, &s.fx.path().join("sys"))
}

fn runner_on(s: &Stage, role: &str, sys: &Path) -> Command {
    let mut c = Command::new(runner_bin());
    let path = format!(
        "{}:{}",
        s.bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    c.env_clear()
        .env("PATH", path)
        .env(
            "PCIDEVICE_RDMA_VF_INFO",
            format!(
                r#"{{"0000:3b:00.2":{{"pciAddress":"0000:3b:00.2","rdmaDevice":"{}","netdev":"ens1f0v0","numaNode":0}}}}"#,
                s.device
            ),
        )
        .arg(role)
        .arg("--sys-root")
        .arg(sys)
        .arg("--proc-root")
        .arg(s.fx.path().join("proc"))
        .args(["--duration", "5", "--iterations", "1000", "--gid-wait", "0"]);
    c
}

#[test]
fn client_resolves_gid_pins_numa_local_and_prints_judgeable_output() {
    let s = stage();
    let out = runner(&s, "client")
        .args(["--server-ip", "10.56.0.9", "--connect-wait", "5"])
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let argv = std::fs::read_to_string(&s.argv_log).unwrap();
    let lines: Vec<&str> = argv.lines().collect();
    // NUMA 0 (0-15) within the pod's cpuset (2-5,16-17).
    assert_eq!(
        lines[0],
        format!(
            "taskset -c 2-5 ib_write_bw -d {} -i 1 -x 3 -p 18515 -s 65536 -D 5 -q 4 --report_gbits -F 10.56.0.9",
            s.device
        )
    );
    assert_eq!(
        lines[1],
        format!(
            "ib_write_bw -d {} -i 1 -x 3 -p 18515 -s 65536 -D 5 -q 4 --report_gbits -F 10.56.0.9",
            s.device
        )
    );
    assert!(
        lines[3].starts_with(&format!(
            "ib_read_lat -d {} -i 1 -x 3 -p 18516 -s 2 -n 1000 -F 10.56.0.9",
            s.device
        )),
        "{argv}"
    );
    let sections = split_sections(&stdout);
    let ep: EndpointReport = endpoint_of(&sections).unwrap();
    assert_eq!(ep.endpoint.gid_index, 3);
    assert_eq!(ep.endpoint.ipv4, Ipv4Addr::new(10, 56, 0, 3));
    assert_eq!(ep.port_rate_gbps, Some(100.0));
    let t = AdmissionThresholds {
        min_bandwidth_fraction: Some(0.9),
        max_p99_latency_us: Some(6.0),
        ..Default::default()
    };
    let o = judge(
        &stdout,
        None,
        PerftestTool::IbWriteBw,
        PerftestTool::IbReadLat,
        &t,
    );
    assert!(o.passed, "{}", o.message);
}

#[test]
fn client_retries_while_the_server_is_not_listening() {
    let s = stage();
    std::fs::write(s.fx.path().join("flaky"), "").unwrap();
    let out = runner(&s, "client")
        .args(["--server-ip", "10.56.0.9", "--connect-wait", "10"])
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success(), "{stdout}");
    let argv = std::fs::read_to_string(&s.argv_log).unwrap();
    assert_eq!(
        argv.lines()
            .filter(|l| l.starts_with("ib_write_bw"))
            .count(),
        2,
        "{argv}"
    );
    assert!(!split_sections(&stdout)["ib_write_bw"].contains("Couldn't connect"));
}

#[test]
fn server_runs_both_servers_without_an_address() {
    let s = stage();
    let out = runner(&s, "server").output().unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success(), "{stdout}");
    let sections = split_sections(&stdout);
    assert!(sections.contains_key("ib_write_bw") && sections.contains_key("ib_read_lat"));
    let argv = std::fs::read_to_string(&s.argv_log).unwrap();
    for l in argv.lines().filter(|l| l.starts_with("ib_")) {
        assert!(l.ends_with(" -F"), "server passes no address: {l}");
    }
}

#[test]
fn missing_gid_is_an_error_section_naming_the_device() {
    let s = stage();
    let other = s.device.clone();
    let fx2 = FixtureHost::connectx6dx_pair().unwrap();
    // The same device name on a host where the VF has no address.
    let out = runner_on(&s, "server", &fx2.path().join("sys"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let err = &split_sections(&stdout)[ERROR_SECTION];
    assert!(err.contains(&other) && err.contains("RoCE v2 GID"), "{err}");
    assert!(!s.argv_log.exists(), "no perftest ran");
    // No device info at all.
    let out = Command::new(runner_bin())
        .env_clear()
        .arg("server")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stdout).contains("PCIDEVICE_"));
}
