//! The binary: `discover` on a fixture host, `--help`, and a bad config at
//! start failing with a clear message instead of running.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use kroce_device_plugin::testing::scratch_dir;
use sriov_helpers::fixture::{FixtureHost, PfSpec};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_kroce-device-plugin");

fn fixture() -> (tempfile::TempDir, FixtureHost) {
    let dir = scratch_dir("kroce-host-").unwrap();
    let mut fx = FixtureHost::at(dir.path()).unwrap();
    fx.populate_connectx6dx_pair().unwrap();
    fx.add_rxe("rxe0", "eth9").unwrap();
    (dir, fx)
}

fn write_config(dir: &std::path::Path) -> std::path::PathBuf {
    let p = dir.join("config.yaml");
    std::fs::write(
        &p,
        "pools:\n- resourceName: vf\n  selectors: {devices: [\"101e\"], numaNodes: [1]}\n- resourceName: soft\n  selectors: {ifNames: [eth9]}\n",
    )
    .unwrap();
    p
}

/// Issue 25: an rxe made on a VF's netdev (as on QEMU's igb VFs, where the
/// VF has no RDMA device of its own) is shown as that VF's RDMA device,
/// with its char devices and RoCE v2 GID index, not as a separate soft device.
#[test]
fn discover_shows_an_rxe_on_a_vf_netdev_as_the_vfs_rdma_device() {
    let dir = scratch_dir("kroce-host-").unwrap();
    let mut fx = FixtureHost::at(dir.path()).unwrap();
    fx.add_numa_node(0, "0-1").unwrap();
    fx.add_numa_node(1, "2-3").unwrap();
    fx.add_rdma_cm().unwrap();
    let pf: sriov_helpers::PciAddress = "0000:01:00.0".parse().unwrap();
    fx.add_pf(PfSpec::igb("0000:01:00.0", "eth0", Some(1), 2))
        .unwrap();
    let netdev = fx.add_rxe_on_vf("rxe0", &pf, 1).unwrap();
    fx.add_ipv4_gid("rxe0", 2, std::net::Ipv4Addr::new(10, 0, 0, 7), &netdev)
        .unwrap();
    let vf1 = fx.vf_address(&pf, 1).unwrap().to_string();
    let work = scratch_dir("kroce-cli-").unwrap();
    let cfg = work.path().join("config.yaml");
    std::fs::write(
        &cfg,
        "pools:\n- resourceName: vf\n  selectors: {vendors: [\"8086\"], devices: [\"10ca\"], isRdma: true}\n",
    )
    .unwrap();
    let run = |json: bool| {
        let mut cmd = Command::new(BIN);
        cmd.arg("discover");
        if json {
            cmd.arg("--json");
        }
        let out = cmd
            .arg("--host-root")
            .arg(fx.path())
            .arg("--config")
            .arg(&cfg)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let table = run(false);
    let line = table
        .lines()
        .find(|l| l.starts_with(&vf1))
        .unwrap_or_else(|| panic!("{vf1} missing:\n{table}"));
    assert!(
        line.contains(" rxe0 ") && line.contains("rdma/vf"),
        "{table}"
    );
    assert!(!table.lines().any(|l| l.starts_with("rxe0")), "{table}");
    let v: serde_json::Value = serde_json::from_str(&run(true)).unwrap();
    let devices = v["devices"].as_array().unwrap();
    // PF and two VFs; no separate soft device.
    assert_eq!(devices.len(), 3, "{v:#}");
    let row = devices
        .iter()
        .find(|d| d["device"]["id"] == vf1.as_str())
        .unwrap();
    assert_eq!(row["pool"], "rdma/vf");
    assert_eq!(row["device"]["kind"], "vf");
    assert_eq!(row["device"]["numa"], 1);
    assert_eq!(row["device"]["driver"], "igbvf");
    let rdma = &row["device"]["rdma"];
    assert_eq!(rdma["name"], "rxe0", "{row:#}");
    assert_eq!(rdma["charDevices"][0]["name"], "uverbs0", "{row:#}");
    assert_eq!(rdma["charDevices"][1]["name"], "umad0", "{row:#}");
    assert_eq!(rdma["roceV2Gid"][0], 3, "{row:#}");
    assert_eq!(row["health"]["state"], "Healthy", "{row:#}");
    // VF 0 has no RDMA device: not in an isRdma pool.
    let vf0 = fx.vf_address(&pf, 0).unwrap().to_string();
    let row0 = devices
        .iter()
        .find(|d| d["device"]["id"] == vf0.as_str())
        .unwrap();
    assert!(
        row0["device"]["rdma"].is_null() && row0["pool"].is_null(),
        "{row0:#}"
    );
}

#[test]
fn discover_table_and_json() {
    let (_d, fx) = fixture();
    let work = scratch_dir("kroce-cli-").unwrap();
    let cfg = write_config(work.path());
    let out = Command::new(BIN)
        .args(["discover", "--host-root"])
        .arg(fx.path())
        .arg("--config")
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8(out.stdout).unwrap();
    let line = |id: &str| {
        table
            .lines()
            .find(|l| l.starts_with(id))
            .unwrap_or_else(|| panic!("{id} missing:\n{table}"))
            .to_string()
    };
    assert!(table.starts_with("DEVICE"), "{table}");
    assert!(line("0000:86:00.2").contains("rdma/vf"), "{table}");
    assert!(line("0000:86:00.2").contains("ens2f0v0"), "{table}");
    assert!(line("0000:3b:00.2").ends_with("healthy"), "{table}");
    assert!(!line("0000:3b:00.2").contains("rdma/"), "{table}");
    assert!(line("rxe0").contains("rdma/soft"), "{table}");

    let out = Command::new(BIN)
        .args(["discover", "--json", "--host-root"])
        .arg(fx.path())
        .arg("--config")
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let devices = v["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 19);
    let vf = devices
        .iter()
        .find(|d| d["device"]["id"] == "0000:86:00.2")
        .unwrap();
    assert_eq!(vf["pool"], "rdma/vf");
    assert_eq!(vf["device"]["numa"], 1);
    assert_eq!(vf["health"]["state"], "Healthy");
}

#[test]
fn bad_config_at_start_is_an_error_naming_pool_and_field() {
    let (_d, fx) = fixture();
    let work = scratch_dir("kroce-cli-").unwrap();
    let cfg = work.path().join("bad.yaml");
    std::fs::write(
        &cfg,
        "pools:\n- resourceName: vf\n  selectors: {numaNode: [0]}\n",
    )
    .unwrap();
    let out = Command::new(BIN)
        .arg("--host-root")
        .arg(fx.path())
        .arg("--config")
        .arg(&cfg)
        .arg("--kubelet-dir")
        .arg(work.path().join("kubelet"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("pool 0 (rdma/vf): selectors.numaNode: unknown field"),
        "{err}"
    );
}

#[test]
fn help_names_every_root_flag() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    for flag in [
        "--config",
        "--host-root",
        "--sysfs-root",
        "--dev-root",
        "--kubelet-dir",
        "--devinfo-dir",
        "--cdi-dir",
        "--cdi",
        "--log-level",
        "--pod-resources-socket",
        "discover",
    ] {
        assert!(help.contains(flag), "{flag} missing from --help:\n{help}");
    }
}

/// Kernel events drive rescans; `--rescan-ms` is the slow safety rescan,
/// 30 s by default, 100 ms .. 1 h.
#[test]
fn rescan_ms_is_a_safety_interval_with_a_range() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    let at = help.find("--rescan-ms").expect("--rescan-ms in --help");
    let entry = &help[at..help[at..].find("\n\n").map_or(help.len(), |e| at + e)];
    assert!(entry.contains("[default: 30000]"), "{entry}");
    for bad in ["50", "3600001"] {
        let out = Command::new(BIN)
            .args(["--rescan-ms", bad, "discover"])
            .output()
            .unwrap();
        assert!(!out.status.success(), "--rescan-ms {bad} accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--rescan-ms") && err.contains(bad), "{err}");
    }
}

/// `KROCE_LOG_LEVEL=debug` is debug for kroce's crates, not for h2, hyper
/// and tower (one registration used to print ~90 lines of HTTP/2 frames).
/// Runs the real binary against the kubelet stand-ins until SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debug_level_is_for_kroce_crates_only() {
    use kroce_device_plugin::testing::{KubeletStandIn, PodResourcesStandIn};
    use std::time::Duration;
    let (_d, fx) = fixture();
    let work = scratch_dir("kroce-cli-").unwrap();
    let cfg = write_config(work.path());
    let kubelet_dir = work.path().join("kubelet");
    std::fs::create_dir_all(&kubelet_dir).unwrap();
    let kubelet = KubeletStandIn::start(&kubelet_dir).await.unwrap();
    let pr_sock = work.path().join("pod-resources/kubelet.sock");
    let mut pods = PodResourcesStandIn::start(&pr_sock).await.unwrap();
    let stderr_path = work.path().join("stderr");
    let child = std::process::Command::new(BIN)
        .env("KROCE_LOG_LEVEL", "debug")
        .env_remove("RUST_LOG")
        .arg("--host-root")
        .arg(fx.path())
        .arg("--config")
        .arg(&cfg)
        .arg("--kubelet-dir")
        .arg(&kubelet_dir)
        .arg("--pod-resources-socket")
        .arg(&pr_sock)
        .arg("--devinfo-dir")
        .arg(work.path().join("devinfo"))
        .args(["--rescan-ms", "200"])
        .stderr(std::fs::File::create(&stderr_path).unwrap())
        .spawn()
        .unwrap();
    kubelet
        .wait_devices("rdma/vf", Duration::from_secs(10), "VF list", |d| {
            d.len() == 8
        })
        .await
        .unwrap();
    // A few PodResources rounds too.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let status = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let out = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let log = std::fs::read_to_string(&stderr_path).unwrap();
    assert!(out.status.success(), "{:?}\n{log}", out.status);
    assert!(log.contains("DEBUG"), "no kroce debug line:\n{log}");
    assert!(log.contains("ListAndWatch stream opened"), "{log}");
    // Event sockets need no privilege: the short tick asked for is kept.
    assert!(
        log.lines().any(|l| l.contains("watching the host")
            && l.contains("kernel_events=true")
            && l.contains("rescan_ms=200")),
        "{log}"
    );
    let foreign: Vec<&str> = log
        .lines()
        .filter(|l| {
            ["h2::", "hyper", "tower", "tonic::"]
                .iter()
                .any(|c| l.contains(c))
        })
        .collect();
    assert!(
        foreign.is_empty(),
        "{} lines from other crates:\n{}",
        foreign.len(),
        foreign.join("\n")
    );
    pods.stop().await;
    kubelet.stop().await;
}

/// `discover` takes "held by a pod" from PodResources too: a VF whose netdev
/// moved into a running pod is healthy, a free one without netdev is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discover_asks_pod_resources_what_pods_hold() {
    use kroce_device_plugin::testing::PodResourcesStandIn;
    let (_d, fx) = fixture();
    fx.remove_netdev("ens2f0v0").unwrap();
    fx.remove_netdev("ens2f0v1").unwrap();
    let work = scratch_dir("kroce-cli-").unwrap();
    let cfg = write_config(work.path());
    let sock = work.path().join("pod-resources/kubelet.sock");
    let mut pods = PodResourcesStandIn::start(&sock).await.unwrap();
    pods.run_pod("p", "rdma/vf", &["0000:86:00.2"]);
    let mut cmd = Command::new(BIN);
    cmd.args(["discover", "--json", "--host-root"])
        .arg(fx.path())
        .arg("--config")
        .arg(&cfg)
        .arg("--kubelet-dir")
        .arg(work.path().join("kubelet"))
        .arg("--pod-resources-socket")
        .arg(&sock);
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .unwrap()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let health = |id: &str| {
        v["devices"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["device"]["id"] == id)
            .unwrap()["health"]["state"]
            .clone()
    };
    assert_eq!(health("0000:86:00.2"), "Healthy");
    assert_eq!(health("0000:86:00.3"), "Unhealthy");
    pods.stop().await;
}
