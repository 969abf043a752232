#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The compiled binary: `apply` configures a fixture host from a spec file
//! without Kubernetes.

use sriov_helpers::fixture::FixtureHost;
use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kroce-node-agent"))
}

#[test]
fn apply_pins_irqs_on_a_fixture_host_and_reports_json() {
    let host = FixtureHost::connectx6dx_pair().unwrap();
    let spec = host.path().join("state.yaml");
    std::fs::write(
        &spec,
        "spec:\n  nodeName: n1\n  pfs:\n  - pciAddress: \"0000:86:00.0\"\n    ifName: ens2f0\n    numVfs: 8\n    irqAffinity:\n      reservedCpus: \"16-17\"\n",
    )
    .unwrap();
    let out = bin()
        .args(["apply", "--spec-file"])
        .arg(&spec)
        .arg("--host-root")
        .arg(host.path())
        .arg("--configfs")
        .arg(host.path().join("configfs"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{stderr}\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status["syncState"], "Succeeded");
    assert_eq!(status["configuredPfs"], 1);
    let placed = status["irqPlacement"].as_array().unwrap();
    assert!(!placed.is_empty());
    for p in placed {
        let cpu: u32 = p["cpus"].as_str().unwrap().parse().unwrap();
        assert!((18..=31).contains(&cpu), "{p}");
        let file = host
            .path()
            .join(format!("proc/irq/{}/smp_affinity_list", p["irq"]));
        assert_eq!(
            std::fs::read_to_string(file).unwrap().trim(),
            cpu.to_string()
        );
    }
    assert!(stderr.contains("changed: IRQ"), "{stderr}");
}

#[test]
fn apply_with_a_bad_spec_exits_2_and_names_the_field() {
    let host = FixtureHost::connectx6dx_pair().unwrap();
    let spec = host.path().join("state.yaml");
    std::fs::write(
        &spec,
        "nodeName: n1\npfs:\n- pciAddress: \"0000:99:00.0\"\n  ifName: x\n  numVfs: 4\n",
    )
    .unwrap();
    let out = bin()
        .args(["apply", "--spec-file"])
        .arg(&spec)
        .arg("--host-root")
        .arg(host.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        status["lastError"]
            .as_str()
            .unwrap()
            .contains("spec.pfs[0].pciAddress"),
        "{status}"
    );
    // Nothing was written.
    let numvfs = host
        .path()
        .join("sys/bus/pci/devices/0000:3b:00.0/sriov_numvfs");
    assert_eq!(std::fs::read_to_string(numvfs).unwrap().trim(), "8");
}

/// Issue 24: `apply` records under the host root which PFs it changed and
/// their VF count before (root-owned, 0600), and a spec without the PF puts
/// that count back; `--managed` no longer resets anything.
#[test]
fn apply_records_what_it_changed_and_a_release_restores_it() {
    use std::os::unix::fs::PermissionsExt;
    let host = FixtureHost::connectx6dx_pair().unwrap();
    let numvfs = host
        .path()
        .join("sys/bus/pci/devices/0000:3b:00.0/sriov_numvfs");
    let run = |spec: &str, extra: &[&str]| {
        let file = host.path().join("state.yaml");
        std::fs::write(&file, spec).unwrap();
        bin()
            .args(["apply", "--vf-wait-seconds", "1", "--spec-file"])
            .arg(&file)
            .arg("--host-root")
            .arg(host.path())
            .arg("--configfs")
            .arg(host.path().join("configfs"))
            .args(extra)
            .output()
            .unwrap()
    };
    let out = run(
        "nodeName: n1\npfs:\n- pciAddress: \"0000:3b:00.0\"\n  ifName: ens1f0\n  numVfs: 4\n",
        &[],
    );
    // A plain file: it changes, no kernel makes VFs (their old entries stay).
    assert!(
        out.status.code().is_some(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read_to_string(&numvfs).unwrap().trim(), "4");
    let record = host
        .path()
        .join("var/lib/kroce/node-agent/changed-pfs.json");
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&record).unwrap()).unwrap();
    assert_eq!(r["numVfsBefore"]["0000:3b:00.0"], 8, "{r}");
    let mode = std::fs::metadata(&record).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);

    // The PF leaves the spec: back to 8, the record forgets it; ens2f0,
    // named in the ignored --managed, is untouched.
    let out = run("nodeName: n1\npfs: []\n", &["--managed", "0000:86:00.0"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("--managed is ignored"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&numvfs).unwrap().trim(), "8");
    let other = host
        .path()
        .join("sys/bus/pci/devices/0000:86:00.0/sriov_numvfs");
    assert_eq!(std::fs::read_to_string(other).unwrap().trim(), "8");
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&record).unwrap()).unwrap();
    assert!(r["numVfsBefore"].as_object().unwrap().is_empty(), "{r}");
}
