//! The binary: `discover` on a fixture host, `--help`, and a bad config at
//! start failing with a clear message instead of running.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use kroce_device_plugin::testing::scratch_dir;
use sriov_helpers::fixture::FixtureHost;
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
        "discover",
    ] {
        assert!(help.contains(flag), "{flag} missing from --help:\n{help}");
    }
}
