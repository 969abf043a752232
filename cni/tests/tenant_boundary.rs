#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The tenant boundary (issue 19): what a namespace admin writes into a
//! NetworkAttachmentDefinition (the CNI network config), or what a state
//! file says, never makes kroce-cni run a program, write a file of its
//! choosing, move a link that is not the VF, or touch another VF. One test
//! per attack; each failed on the code before the fix. Real netns, veth VF
//! stand-ins, Debian's host-local; needs root (CI: must run, not skip).

use kroce_cni::protocol::code;
use kroce_cni::testing::{Faults, TestBed, skip_without_netns};
use serde_json::{Value, json};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

const BIN: &str = env!("CARGO_BIN_EXE_kroce-cni");

fn run(
    bed: &TestBed,
    env: &std::collections::HashMap<String, String>,
    cfg: &Value,
) -> kroce_cni::testing::BinOutput {
    bed.run_binary(Path::new(BIN), env, &serde_json::to_vec(cfg).unwrap())
        .unwrap()
}

/// A directory anyone can write (a pod's emptyDir as seen from the host).
fn tenant_dir() -> tempfile::TempDir {
    let d = tempfile::Builder::new()
        .prefix("kroce-tenant-")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    d
}

/// A program that leaves `marker` behind when anything runs it, and
/// answers like a CNI plugin so nothing else fails first.
fn payload(dir: &Path, name: &str, marker: &Path) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(
        &p,
        format!(
            "#!/bin/sh\necho \"payload ran as $(id -u) cmd=$CNI_COMMAND\" >> {}\n\
             echo '{{\"cniVersion\":\"1.0.0\",\"supportedVersions\":[\"0.4.0\",\"1.0.0\",\"1.1.0\"]}}'\n",
            marker.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

/// A genuine claim on VF 0 (ADD then DEL of `c0` with `extra` config),
/// made stale: held by container `victim` in a netns that is gone.
fn stale_claim(bed: &TestBed, extra: Value) -> Value {
    let mut kit = bed.kit();
    let mut cfg = bed.config(extra);
    cfg["rdma"] = json!(false);
    bed.call(
        &mut kit,
        &Faults::none(),
        &bed.env("ADD", "c0", "net1"),
        &cfg,
    )
    .ok();
    let path = claim_path(bed.state.path(), bed);
    let mut claim: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    bed.call(
        &mut kit,
        &Faults::none(),
        &bed.env("DEL", "c0", "net1"),
        &cfg,
    )
    .ok();
    assert!(!path.exists(), "DEL left {}", path.display());
    claim["containerID"] = json!("victim");
    claim["netns"] = json!(format!("/run/netns/kroce-gone-{}", std::process::id()));
    claim
}

fn claim_path(state: &Path, bed: &TestBed) -> PathBuf {
    state.join("vf").join(format!("{}.json", bed.vf_pci(0)))
}

fn plant(state: &Path, bed: &TestBed, claim: &Value) {
    let p = claim_path(state, bed);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(&p, serde_json::to_vec_pretty(claim).unwrap()).unwrap();
}

fn marker_text(marker: &Path) -> String {
    std::fs::read_to_string(marker).unwrap_or_default()
}

/// Gives the bed's VF back whatever the ADD under test did.
fn cleanup(bed: &TestBed, cfg: &Value, cid: &str) {
    let _ = run(bed, &bed.env("DEL", cid, "net1"), cfg);
}

/// The reproduction: `stateDir` names a tenant-writable directory
/// holding a planted stale claim whose `ipam.type` is an absolute path.
/// The next ADD of that VF took the claim over and ran the program as root.
#[test]
fn planted_claim_in_a_tenant_state_dir_never_runs() {
    if skip_without_netns("planted_claim_in_a_tenant_state_dir_never_runs") {
        return;
    }
    let bed = TestBed::new(1).unwrap();
    let tenant = tenant_dir();
    let marker = tenant.path().join("marker");
    let prog = payload(tenant.path(), "payload.sh", &marker);
    let mut claim = stale_claim(&bed, json!({}));
    claim["config"]["ipam"]["type"] = json!(prog);
    claim["cniPath"] = json!([tenant.path()]);
    plant(tenant.path(), &bed, &claim);

    let cfg = bed.config(json!({"stateDir": tenant.path()}));
    let out = run(&bed, &bed.env("ADD", "attacker", "net1"), &cfg);
    let ran = marker_text(&marker);
    cleanup(&bed, &cfg, "attacker");
    assert!(ran.is_empty(), "the planted program ran: {ran}");
    assert_ne!(out.code, 0, "a config with stateDir was accepted");
    assert_eq!(out.json()["code"], code::INVALID_CONFIG, "{}", out.stdout);
    assert!(out.json()["msg"].as_str().unwrap().contains("stateDir"));
}

/// Even in the installer's state dir, a claim's recorded IPAM plugin is
/// never what runs: an absolute `ipam.type` there is not executed.
#[test]
fn a_claims_recorded_ipam_program_never_runs() {
    if skip_without_netns("a_claims_recorded_ipam_program_never_runs") {
        return;
    }
    let bed = TestBed::new(1).unwrap();
    let tenant = tenant_dir();
    let marker = tenant.path().join("marker");
    let prog = payload(tenant.path(), "payload.sh", &marker);
    let mut claim = stale_claim(&bed, json!({}));
    claim["config"]["ipam"]["type"] = json!(prog);
    plant(bed.state.path(), &bed, &claim);

    let cfg = bed.config(json!({}));
    let out = run(&bed, &bed.env("ADD", "next", "net1"), &cfg);
    let ran = marker_text(&marker);
    cleanup(&bed, &cfg, "next");
    assert!(ran.is_empty(), "the claim's program ran: {ran}");
    // The VF itself is released and handed on.
    assert_eq!(out.code, 0, "{} {}", out.stdout, out.stderr);
}

/// A claim's recorded `CNI_PATH` is never searched: the runtime's is.
#[test]
fn a_claims_recorded_cni_path_is_never_searched() {
    if skip_without_netns("a_claims_recorded_cni_path_is_never_searched") {
        return;
    }
    let bed = TestBed::new(1).unwrap();
    let tenant = tenant_dir();
    let marker = tenant.path().join("marker");
    payload(tenant.path(), "host-local", &marker);
    let mut claim = stale_claim(&bed, json!({}));
    claim["cniPath"] = json!([tenant.path()]);
    plant(bed.state.path(), &bed, &claim);

    let cfg = bed.config(json!({}));
    let out = run(&bed, &bed.env("ADD", "next", "net1"), &cfg);
    let ran = marker_text(&marker);
    cleanup(&bed, &cfg, "next");
    assert!(ran.is_empty(), "the claim's CNI_PATH was searched: {ran}");
    assert_eq!(out.code, 0, "{} {}", out.stdout, out.stderr);
}

/// A state dir others can write is refused, naming it, before anything.
#[test]
fn a_world_writable_state_dir_is_refused() {
    if skip_without_netns("a_world_writable_state_dir_is_refused") {
        return;
    }
    let bed = TestBed::new(1).unwrap();
    std::fs::set_permissions(bed.state.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let cfg = bed.config(json!({}));
    let before = bed.host.links().unwrap();
    let out = run(&bed, &bed.env("ADD", "c1", "net1"), &cfg);
    let moved = bed.pod.link("net1").is_some();
    cleanup(&bed, &cfg, "c1");
    assert!(!moved, "ADD went on in a world-writable state dir");
    assert_ne!(out.code, 0);
    let msg = out.json()["msg"].as_str().unwrap_or_default().to_string();
    assert!(
        msg.contains(&bed.state.path().display().to_string()) && msg.contains("writable"),
        "{msg}"
    );
    assert_eq!(bed.host.links().unwrap(), before);
}

/// `logFile` made root create any directory and file, even on a DEL of
/// nothing.
#[test]
fn log_file_is_never_created() {
    if skip_without_netns("log_file_is_never_created") {
        return;
    }
    let bed = TestBed::new(1).unwrap();
    let tenant = tenant_dir();
    let target = tenant.path().join("new/dir/file");
    let cfg = bed.config(json!({"logFile": target}));
    let out = run(&bed, &bed.env("DEL", "nobody", "net1"), &cfg);
    assert!(
        !tenant.path().join("new").exists(),
        "logFile created {}",
        target.display()
    );
    assert_eq!(out.json()["code"], code::INVALID_CONFIG, "{}", out.stdout);
    assert!(out.json()["msg"].as_str().unwrap().contains("logFile"));
}

/// A veth in the bed's host netns that is not any VF.
fn victim_link(bed: &TestBed) -> String {
    let name = format!("kvic{}", std::process::id() % 100_000);
    bed.host
        .ip(&[
            "link", "add", &name, "type", "veth", "peer", "name", "kvicpeer",
        ])
        .unwrap();
    name
}

/// VF 0's device dir in the bed's fixture sysfs.
fn vf0_dir(bed: &TestBed) -> PathBuf {
    std::fs::canonicalize(
        bed.fixture
            .path()
            .join("sys/bus/pci/devices")
            .join(bed.vf_pci(0)),
    )
    .unwrap()
}

/// sysfs says VF 0's netdev is `victim` (a host link that is no VF):
/// ADD moved whatever link that name resolves to.
#[test]
fn a_sysfs_netdev_name_cannot_move_a_link_that_is_not_the_vf() {
    if skip_without_netns("a_sysfs_netdev_name_cannot_move_a_link_that_is_not_the_vf") {
        return;
    }
    let bed = TestBed::new(1).unwrap();
    let victim = victim_link(&bed);
    let dir = vf0_dir(&bed);
    std::fs::rename(dir.join("net/ens1f0v0"), dir.join("net").join(&victim)).unwrap();
    let cfg = bed.config(json!({}));
    let out = run(&bed, &bed.env("ADD", "c1", "net1"), &cfg);
    let still_home = bed.host.link(&victim).is_some();
    cleanup(&bed, &cfg, "c1");
    assert!(still_home, "ADD moved {victim}, which is not the VF");
    assert!(bed.pod.link("net1").is_none());
    assert_ne!(out.code, 0, "{}", out.stdout);
    assert!(out.stdout.contains(&victim), "{}", out.stdout);
}

/// Same, with the name's `device` link pointing at another VF.
#[test]
fn a_netdev_of_another_vf_is_not_moved() {
    if skip_without_netns("a_netdev_of_another_vf_is_not_moved") {
        return;
    }
    let bed = TestBed::new(1).unwrap();
    let victim = victim_link(&bed);
    let dir = vf0_dir(&bed);
    std::fs::rename(dir.join("net/ens1f0v0"), dir.join("net").join(&victim)).unwrap();
    // class/net/<victim> -> VF 1's netdev dir (its `device` is VF 1).
    let vf1 = std::fs::canonicalize(
        bed.fixture
            .path()
            .join("sys/bus/pci/devices")
            .join(bed.vf_pci(1))
            .join("net/ens1f0v1"),
    )
    .unwrap();
    std::os::unix::fs::symlink(&vf1, bed.fixture.path().join("sys/class/net").join(&victim))
        .unwrap();
    let cfg = bed.config(json!({}));
    let out = run(&bed, &bed.env("ADD", "c1", "net1"), &cfg);
    let still_home = bed.host.link(&victim).is_some();
    cleanup(&bed, &cfg, "c1");
    assert!(still_home, "ADD moved {victim}, VF 1's netdev by sysfs");
    assert_ne!(out.code, 0, "{}", out.stdout);
}

/// A claim saying VF 0 is VF 3 of the other PF: release restored its
/// "original" PF-side settings there.
#[test]
fn a_forged_claim_cannot_touch_another_vf() {
    if skip_without_netns("a_forged_claim_cannot_touch_another_vf") {
        return;
    }
    let bed = TestBed::new(1).unwrap();
    let mut claim = stale_claim(&bed, json!({"vlan": 100}));
    assert!(
        !claim["planned"]["vfSettings"]
            .as_array()
            .unwrap()
            .is_empty(),
        "{claim}"
    );
    claim["vf"]["pfIfname"] = json!("ens2f0");
    claim["vf"]["vfIndex"] = json!(3);
    plant(bed.state.path(), &bed, &claim);

    let mut kit = bed.kit();
    let other = kit.vf.state("ens2f0", 3).unwrap();
    let other_set = kroce_cni::vf_attrs::VfSetting::Vlan {
        vlan: 200,
        qos: 0,
        proto: kroce_cni::vf_attrs::VlanProto::Dot1Q,
    };
    kit.vf
        .vfs
        .get_mut(&("ens2f0".into(), 3))
        .unwrap()
        .apply(&other_set);
    let other = {
        let mut o = other;
        o.apply(&other_set);
        o
    };
    let cfg = bed.config(json!({"rdma": false}));
    let r = bed.call(
        &mut kit,
        &Faults::none(),
        &bed.env("ADD", "next", "net1"),
        &cfg,
    );
    let after = kit.vf.state("ens2f0", 3).unwrap();
    bed.call(
        &mut kit,
        &Faults::none(),
        &bed.env("DEL", "next", "net1"),
        &cfg,
    )
    .ok();
    assert_eq!(after, other, "the forged claim changed VF 3 of ens2f0");
    r.ok();
}

/// A forged claim on a soft RDMA device naming another host link's
/// ifindex: release matched soft devices on the ifindex alone and renamed,
/// re-addressed and re-MTU'd whatever link had it.
#[test]
fn a_soft_claim_cannot_touch_a_link_by_its_ifindex() {
    if skip_without_netns("a_soft_claim_cannot_touch_a_link_by_its_ifindex") {
        return;
    }
    let mut bed = TestBed::new(0).unwrap();
    bed.host
        .ip(&[
            "link", "add", "kup0", "type", "veth", "peer", "name", "kup0p",
        ])
        .unwrap();
    bed.host
        .ip(&[
            "link", "add", "kvf0", "link", "kup0", "type", "macvlan", "mode", "bridge",
        ])
        .unwrap();
    bed.host
        .ip(&["link", "set", "kvf0", "address", "02:00:00:00:5f:01"])
        .unwrap();
    bed.fixture.add_rxe("rxe_t0", "kvf0").unwrap();
    let victim = victim_link(&bed);
    let before = bed.host.link(&victim).unwrap();

    let soft =
        json!({"deviceID": "rxe_t0", "rdma": false, "mtu": 1400, "mac": "02:aa:bb:cc:dd:05"});
    let mut kit = bed.kit();
    let cfg = bed.config(soft.clone());
    bed.call(
        &mut kit,
        &Faults::none(),
        &bed.env("ADD", "c0", "net1"),
        &cfg,
    )
    .ok();
    let path = bed.state.path().join("vf/rxe_t0.json");
    let mut claim: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    bed.call(
        &mut kit,
        &Faults::none(),
        &bed.env("DEL", "c0", "net1"),
        &cfg,
    )
    .ok();
    claim["containerID"] = json!("victim");
    claim["netns"] = json!(format!("/run/netns/kroce-gone-{}", std::process::id()));
    claim["original"]["link"]["index"] = json!(before.ifindex);
    std::fs::write(&path, serde_json::to_vec_pretty(&claim).unwrap()).unwrap();

    let r = bed.call(
        &mut kit,
        &Faults::none(),
        &bed.env("ADD", "next", "net1"),
        &cfg,
    );
    let after = bed.host.link(&victim);
    bed.call(
        &mut kit,
        &Faults::none(),
        &bed.env("DEL", "next", "net1"),
        &cfg,
    )
    .ok();
    assert_eq!(
        after,
        Some(before),
        "the forged soft claim changed {victim}"
    );
    r.ok();
}
