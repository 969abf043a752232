#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The compiled plugin driven like a runtime drives it: CNI_* environment,
//! config on stdin, run inside the bed's host netns, Debian's host-local as
//! the IPAM delegate. PF-side attributes and RDMA go through the real
//! netlink backends here, so configs that need SR-IOV must fail cleanly.

use kroce_cni::testing::testbed::run_in_netns;
use kroce_cni::testing::{TestBed, skip_without_netns};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::path::Path;

const BIN: &str = env!("CARGO_BIN_EXE_kroce-cni");

fn run(bed: &TestBed, env: &HashMap<String, String>, cfg: &Value) -> kroce_cni::testing::BinOutput {
    bed.run_binary(Path::new(BIN), env, &serde_json::to_vec(cfg).unwrap())
        .unwrap()
}

#[test]
fn add_check_del_in_each_spec_version() {
    if skip_without_netns("add_check_del_in_each_spec_version") {
        return;
    }
    let bed = TestBed::new(1).unwrap();
    let before = bed.host.links().unwrap();
    for version in ["1.1.0", "1.0.0", "0.4.0"] {
        let cfg = bed.config(json!({"cniVersion": version, "mtu": 9000, "memlock": "unlimited"}));
        let out = run(&bed, &bed.env("ADD", "c1", "net1"), &cfg);
        assert_eq!(out.code, 0, "{version}: {} {}", out.stdout, out.stderr);
        let r = out.json();
        assert_eq!(r["cniVersion"], version);
        assert_eq!(r["interfaces"][0]["name"], "net1");
        assert_eq!(r["interfaces"][0]["mac"], "02:00:3b:00:02:42");
        // host-local hands out addresses round-robin.
        let addr = r["ips"][0]["address"].as_str().unwrap().to_string();
        assert!(
            addr.starts_with("10.77.0.") && addr.ends_with("/24"),
            "{addr}"
        );
        match version {
            "1.1.0" => {
                assert_eq!(r["interfaces"][0]["mtu"], 9000);
                assert_eq!(r["interfaces"][0]["pciID"], bed.vf_pci(0));
            }
            "0.4.0" => assert_eq!(r["ips"][0]["version"], "4"),
            _ => assert!(r["interfaces"][0].get("mtu").is_none()),
        }
        // RDMA netlink does not exist here: "auto" warns and goes on; the
        // runtime's memlock limit is reported when low.
        assert!(out.stderr.contains("RDMA netns mode"), "{}", out.stderr);
        let net1 = bed.pod.link("net1").unwrap();
        assert_eq!((net1.mtu, net1.up), (9000, true));
        assert_eq!(bed.pod.addresses("net1").unwrap(), vec![addr]);
        let mut check = cfg.clone();
        check["prevResult"] = r.clone();
        let out = run(&bed, &bed.env("CHECK", "c1", "net1"), &check);
        assert_eq!(
            (out.code, out.stdout.as_str()),
            (0, ""),
            "{version} CHECK: {}",
            out.stderr
        );
        let mut del = cfg.clone();
        del["prevResult"] = r;
        for _ in 0..2 {
            let out = run(&bed, &bed.env("DEL", "c1", "net1"), &del);
            assert_eq!(
                (out.code, out.stdout.as_str()),
                (0, ""),
                "{version} DEL: {}",
                out.stderr
            );
            assert_eq!(bed.host.links().unwrap(), before, "{version}");
            assert!(bed.leases().is_empty());
            assert!(bed.state_files().is_empty(), "{:?}", bed.state_files());
        }
    }
}

/// ADD checks the memlock limit of the runtime (the plugin's parent, here
/// this test process), never the plugin's own (no container inherits it);
/// DEL logs the release of the VF at info.
#[test]
fn add_warns_about_the_runtime_only_and_del_logs_the_release() {
    if skip_without_netns("add_warns_about_the_runtime_only_and_del_logs_the_release") {
        return;
    }
    let bed = TestBed::new(1).unwrap();
    let logs = tempfile::tempdir().unwrap();
    let log_file = logs.path().join("kroce-cni.log");
    // The log file is the installer's (the runtime's environment), not the
    // config's.
    let with_log = |cmd: &str| {
        let mut env = bed.env(cmd, "c1", "net1");
        env.insert(
            kroce_contracts::cni_env::LOG_FILE.into(),
            log_file.display().to_string(),
        );
        env
    };
    let cfg = bed.config(json!({
        "cniVersion": "1.1.0", "memlock": "unlimited", "logLevel": "info"
    }));
    let out = run(&bed, &with_log("ADD"), &cfg);
    assert_eq!(out.code, 0, "{} {}", out.stdout, out.stderr);
    let log = std::fs::read_to_string(&log_file).unwrap();
    for text in [&out.stderr, &log] {
        assert!(
            !text.contains("pid self") && !text.contains("(kroce-cni)"),
            "a warning about the plugin's own limit:\n{text}"
        );
    }
    let runtime = kroce_cni::memlock::read_limit(Path::new("/proc"), "self").unwrap();
    if runtime.soft != kroce_cni::memlock::Memlock::Unlimited {
        let pid = format!("RLIMIT_MEMLOCK of pid {} ", std::process::id());
        assert!(
            out.stderr.contains(&pid),
            "runtime not checked: {}",
            out.stderr
        );
    }

    let out = run(&bed, &with_log("DEL"), &cfg);
    assert_eq!((out.code, out.stdout.as_str()), (0, ""), "{}", out.stderr);
    let log = std::fs::read_to_string(&log_file).unwrap();
    let line = format!(
        "released VF {} (host netdev ens1f0v0) of container c1, net1 in netns {}",
        bed.vf_pci(0),
        bed.pod.path.display()
    );
    let released: Vec<&str> = log.lines().filter(|l| l.contains(&line)).collect();
    assert_eq!(released.len(), 1, "{line} not logged once:\n{log}");
    assert!(
        released[0].contains(" info DEL c1/net1: "),
        "{}",
        released[0]
    );
    assert!(bed.state_files().is_empty(), "{:?}", bed.state_files());
}

#[test]
fn debian_host_device_fails_a_repeated_del_and_we_do_not() {
    if skip_without_netns("debian_host_device_fails_a_repeated_del_and_we_do_not") {
        return;
    }
    let bed = TestBed::new(1).unwrap();
    let hd = json!({"cniVersion": "1.0.0", "name": "kroce-test", "type": "host-device", "device": "ens1f0v0",
        "ipam": bed.config(json!({}))["ipam"].clone()});
    let host_device = Path::new("/usr/lib/cni/host-device");
    let bytes = serde_json::to_vec(&hd).unwrap();
    let mut codes = Vec::new();
    for cmd in ["ADD", "DEL", "DEL"] {
        let out = run_in_netns(
            &bed.host.path,
            host_device,
            &bed.env(cmd, "hd", "net1"),
            &bytes,
        )
        .unwrap();
        codes.push((out.code, out.stdout));
    }
    assert_eq!(codes[0].0, 0);
    assert_eq!(codes[1].0, 0);
    assert_ne!(codes[2].0, 0, "host-device's second DEL: {:?}", codes[2]);
    assert!(codes[2].1.contains("Link not found"), "{:?}", codes[2]);
    // host-device's DEL leaves the netdev in the host; ours, same situation:
    let cfg = bed.config(json!({}));
    assert_eq!(run(&bed, &bed.env("ADD", "c1", "net1"), &cfg).code, 0);
    for _ in 0..2 {
        assert_eq!(run(&bed, &bed.env("DEL", "c1", "net1"), &cfg).code, 0);
    }
}

#[test]
fn pf_attributes_without_sriov_fail_before_any_change() {
    if skip_without_netns("pf_attributes_without_sriov_fail_before_any_change") {
        return;
    }
    let bed = TestBed::new(1).unwrap();
    let before = bed.host.links().unwrap();
    // No PF netdev at all in this host netns.
    let out = run(
        &bed,
        &bed.env("ADD", "c1", "net1"),
        &bed.config(json!({"vlan": 100})),
    );
    assert_eq!(out.json()["code"], 102, "{}", out.stdout);
    assert!(out.stdout.contains("ens1f0"), "{}", out.stdout);
    // A PF stand-in that is no PF: it reports no VFs.
    bed.host
        .ip(&[
            "link", "add", "ens1f0", "type", "veth", "peer", "name", "pfpeer",
        ])
        .unwrap();
    let before_pf = bed.host.links().unwrap();
    let out = run(
        &bed,
        &bed.env("ADD", "c1", "net1"),
        &bed.config(json!({"spoofchk": "off"})),
    );
    assert_eq!(out.json()["code"], 102, "{}", out.stdout);
    assert!(out.stdout.contains("reports no VF 0"), "{}", out.stdout);
    assert_eq!(bed.host.links().unwrap(), before_pf);
    assert_eq!(before.len() + 2, before_pf.len());
    assert!(bed.leases().is_empty());
    assert!(bed.state_files().is_empty(), "{:?}", bed.state_files());
    // rdma: true needs the RDMA netns mode, which this kernel cannot tell.
    let out = run(
        &bed,
        &bed.env("ADD", "c1", "net1"),
        &bed.config(json!({"rdma": true})),
    );
    assert_eq!(out.json()["code"], 103, "{}", out.stdout);
}

/// (what, environment, stdin, expected code, text the message must hold)
type Case = (String, HashMap<String, String>, Vec<u8>, u64, &'static str);

#[test]
fn bad_input_gets_the_right_code_and_changes_nothing() {
    if skip_without_netns("bad_input_gets_the_right_code_and_changes_nothing") {
        return;
    }
    let bed = TestBed::new(1).unwrap();
    let before = bed.host.links().unwrap();
    let good = bed.config(json!({}));
    let env = bed.env("ADD", "c1", "net1");
    let bin = Path::new(BIN);
    let mut cases: Vec<Case> = vec![
        (
            "malformed JSON".into(),
            env.clone(),
            b"{\"cniVersion\":".to_vec(),
            6,
            "decode",
        ),
        (
            "unknown cniVersion".into(),
            env.clone(),
            serde_json::to_vec(&bed.config(json!({"cniVersion": "0.3.1"}))).unwrap(),
            1,
            "0.3.1",
        ),
        (
            "future cniVersion".into(),
            env.clone(),
            serde_json::to_vec(&bed.config(json!({"cniVersion": "2.0.0"}))).unwrap(),
            1,
            "2.0.0",
        ),
    ];
    for missing in ["CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"] {
        let mut e = env.clone();
        e.remove(missing);
        cases.push((
            format!("missing {missing}"),
            e,
            serde_json::to_vec(&good).unwrap(),
            4,
            missing,
        ));
    }
    let mut e = env.clone();
    e.remove("CNI_PATH");
    cases.push((
        "missing CNI_PATH".into(),
        e,
        serde_json::to_vec(&good).unwrap(),
        4,
        "CNI_PATH",
    ));
    for bad in ["eth0/x", "averyveryverylongname", "a b"] {
        let mut e = env.clone();
        e.insert("CNI_IFNAME".into(), bad.into());
        cases.push((
            format!("IFNAME {bad}"),
            e,
            serde_json::to_vec(&good).unwrap(),
            4,
            "CNI_IFNAME",
        ));
    }
    for (k, v) in [
        ("vlan", json!(4095)),
        ("vlanQoS", json!(8)),
        ("vlanProto", json!("802.1x")),
        ("mac", json!("ff:ff:ff:ff:ff:ff")),
        ("mtu", json!(10)),
        ("spoofchk", json!("maybe")),
        ("trust", json!("maybe")),
        ("link_state", json!("up")),
        ("min_tx_rate", json!(-1)),
        ("max_tx_rate", json!("fast")),
        ("rdma", json!("sometimes")),
        ("memlock", json!("-5")),
        ("logLevel", json!("chatty")),
        ("deviceID", json!("../../../../etc")),
        ("ipam", json!({"type": "/bin/sh"})),
    ] {
        let msg_key = if k == "ipam" { "ipam.type" } else { k };
        cases.push((
            format!("{k}={v}"),
            env.clone(),
            serde_json::to_vec(&bed.config(json!({ k: v }))).unwrap(),
            7,
            msg_key,
        ));
    }
    let mut e = env.clone();
    e.insert("CNI_ARGS".into(), "MAC=zz".into());
    cases.push((
        "CNI_ARGS MAC".into(),
        e,
        serde_json::to_vec(&good).unwrap(),
        7,
        "CNI_ARGS MAC",
    ));
    for (what, env, stdin, code, needle) in cases {
        let out = bed.run_binary(bin, &env, &stdin).unwrap();
        assert_ne!(out.code, 0, "{what}");
        let j = out.json();
        assert_eq!(j["code"].as_u64(), Some(code), "{what}: {}", out.stdout);
        let msg = j["msg"].as_str().unwrap_or_default();
        assert!(msg.contains(needle), "{what}: {msg}");
        assert!(j["cniVersion"].is_string(), "{what}: {}", out.stdout);
        assert_eq!(bed.host.links().unwrap(), before, "{what}");
        assert!(bed.leases().is_empty(), "{what}");
        assert!(
            bed.state_files().is_empty(),
            "{what}: {:?}",
            bed.state_files()
        );
    }
}

/// The whole of one plugin run, for assertion messages.
fn shown(out: &kroce_cni::testing::BinOutput) -> String {
    format!(
        "exit code {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        out.code, out.stdout, out.stderr
    )
}

#[test]
fn version_status_and_gc() {
    if skip_without_netns("version_status_and_gc") {
        return;
    }
    let bed = TestBed::new(1).unwrap();
    let mut env = bed.root_env();
    env.insert("CNI_COMMAND".to_string(), "VERSION".to_string());
    let out = bed
        .run_binary(Path::new(BIN), &env, br#"{"cniVersion":"1.0.0"}"#)
        .unwrap();
    assert_eq!(out.code, 0, "VERSION: {}", shown(&out));
    assert_eq!(
        out.json()["supportedVersions"],
        json!(["0.4.0", "1.0.0", "1.1.0"]),
        "VERSION: {}",
        shown(&out)
    );

    env.insert("CNI_COMMAND".into(), "STATUS".into());
    env.insert("CNI_PATH".into(), "/usr/lib/cni".into());
    let cfg = bed.config(json!({"cniVersion": "1.1.0"}));
    let out = run(&bed, &env, &cfg);
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (0, ""),
        "STATUS: {}",
        shown(&out)
    );
    // A state dir that cannot be made (the installer's env) is "not
    // available"; the old config key is refused by name.
    let mut bad = env.clone();
    bad.insert(
        kroce_contracts::cni_env::STATE_DIR.into(),
        "/dev/null/kroce".into(),
    );
    let out = run(&bed, &bad, &bed.config(json!({"cniVersion": "1.1.0"})));
    assert_eq!(
        out.json()["code"],
        50,
        "STATUS, bad state dir: {}",
        shown(&out)
    );
    assert!(out.stdout.contains("/dev/null/kroce"), "{}", shown(&out));
    let out = run(
        &bed,
        &env,
        &bed.config(json!({"cniVersion": "1.1.0", "stateDir": "/dev/null/kroce"})),
    );
    assert_eq!(
        out.json()["code"],
        7,
        "STATUS, stateDir key: {}",
        shown(&out)
    );
    assert!(out.stdout.contains("stateDir"), "{}", shown(&out));
    let out = run(
        &bed,
        &env,
        &bed.config(json!({"cniVersion": "1.1.0", "ipam": {"type": "no-such-ipam"}})),
    );
    assert_eq!(out.json()["code"], 50, "STATUS, no IPAM: {}", shown(&out));
    assert!(out.stdout.contains("no-such-ipam"), "{}", shown(&out));

    let cfg = bed.config(json!({"cniVersion": "1.1.0"}));
    let out = run(&bed, &bed.env("ADD", "c1", "net1"), &cfg);
    assert_eq!(out.code, 0, "ADD: {}", shown(&out));
    env.insert("CNI_COMMAND".into(), "GC".into());
    let mut gc = cfg.clone();
    gc["cni.dev/valid-attachments"] = json!([{"containerID": "c1", "ifname": "net1"}]);
    let out = run(&bed, &env, &gc);
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (0, ""),
        "GC, c1 valid: {}",
        shown(&out)
    );
    assert!(
        bed.pod.link("net1").is_some(),
        "valid attachment kept: {}",
        shown(&out)
    );
    gc["cni.dev/valid-attachments"] = json!([]);
    let out = run(&bed, &env, &gc);
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (0, ""),
        "GC, none valid: {}",
        shown(&out)
    );
    assert!(bed.pod.link("net1").is_none(), "{}", shown(&out));
    assert!(bed.host.link("ens1f0v0").is_some(), "{}", shown(&out));
    assert!(
        bed.leases().is_empty(),
        "{:?} {}",
        bed.leases(),
        shown(&out)
    );
}
