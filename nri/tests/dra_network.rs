#![allow(clippy::unwrap_used, clippy::expect_used)]
//! DRA network attachment in real network namespaces: kroce-nri's
//! PodNetwork runs kroce-cni's ADD/DEL in-process against veth stand-ins
//! for the VF netdevs (kroce-cni's test bed: fixture sysfs, a private
//! "host" netns, a pod netns, Debian's host-local IPAM) with recording
//! PF/RDMA backends. Needs root.

use kroce_cni::protocol::{CniEnv, CniError};
use kroce_cni::testing::testbed::CNI_BIN_DIR;
use kroce_cni::testing::{Faults, Kit, RecordingRdma, TestBed, skip_without_netns};
use kroce_contracts::network_attach::{self, AttachRequest, AttachResult, DeviceAttach};
use kroce_netlink::rdma::RdmaNetnsMode;
use kroce_nri::network::{CniOptions, CniRunner, PodFacts, PodNetwork};
use serde_json::{Value, json};
use std::cell::RefCell;
use std::collections::HashMap;

/// kroce-cni through the bed: its host netns is the node's, its kit's
/// backends wrapped by `faults`.
struct BedCni<'a> {
    bed: &'a TestBed,
    kit: RefCell<Kit>,
    faults: RefCell<Faults>,
}

impl CniRunner for BedCni<'_> {
    fn run(&self, env: &CniEnv, config: &Value) -> Result<Option<Value>, CniError> {
        let mut m = HashMap::new();
        m.insert("CNI_COMMAND".to_string(), env.command.as_str().to_string());
        m.insert(
            "CNI_CONTAINERID".into(),
            env.container_id.clone().unwrap_or_default(),
        );
        if let Some(n) = &env.netns {
            m.insert("CNI_NETNS".into(), n.display().to_string());
        }
        m.insert("CNI_IFNAME".into(), env.ifname.clone().unwrap_or_default());
        m.insert(
            "CNI_PATH".into(),
            std::env::join_paths(&env.path)
                .unwrap()
                .to_string_lossy()
                .into_owned(),
        );
        m.insert("CNI_ARGS".into(), env.args.to_env_string());
        let faults = self.faults.borrow().clone();
        self.bed
            .call(&mut self.kit.borrow_mut(), &faults, &m, config)
            .result
    }

    fn host_netns(&self) -> std::io::Result<kroce_cni::netns::Netns> {
        self.bed.host.open()
    }
}

fn rdma_of(bed: &TestBed, i: u32) -> String {
    kroce_cni::vf::resolve(&bed.fixture.root(), bed.vf_pci(i).parse().unwrap())
        .unwrap()
        .rdma
        .unwrap()
}

fn device(bed: &TestBed, i: u32, extra: Value) -> DeviceAttach {
    let mut d = json!({
        "device": format!("vf-{i}"),
        "pool": "node-a",
        "request": "vf",
        "pciAddress": bed.vf_pci(i),
        "netdev": format!("ens1f0v{i}"),
        "rdmaDevice": rdma_of(bed, i),
        "ipam": {
            "type": "host-local",
            "dataDir": bed.ipam_data.path(),
            "ranges": [[{"subnet": "10.77.0.0/24", "gateway": "10.77.0.1"}]],
        },
    });
    for (k, v) in extra.as_object().unwrap() {
        d[k] = v.clone();
    }
    serde_json::from_value(d).unwrap()
}

fn write_request(bed: &TestBed, uid: &str, devices: Vec<DeviceAttach>) {
    let dir = network_attach::dir(bed.state.path());
    std::fs::create_dir_all(&dir).unwrap();
    let r = AttachRequest {
        version: network_attach::FILE_VERSION,
        claim_uid: uid.into(),
        claim_namespace: "ns".into(),
        claim_name: format!("claim-{uid}"),
        pod_uids: vec!["pod-1".into()],
        devices,
    };
    std::fs::write(
        network_attach::request_path(&dir, uid).unwrap(),
        serde_json::to_vec(&r).unwrap(),
    )
    .unwrap();
}

fn setup(bed: &TestBed) -> PodNetwork<BedCni<'_>> {
    let mut kit = bed.kit();
    let host = bed.host.open().unwrap();
    let mut rdma = RecordingRdma::new(Ok(RdmaNetnsMode::Exclusive));
    for i in 0..2 {
        rdma = rdma.with_device(&rdma_of(bed, i), 7 + i, &host);
    }
    kit.rdma = rdma;
    PodNetwork::new(
        CniOptions {
            state_dir: bed.state.path().to_path_buf(),
            host_root: Some(bed.fixture.path().to_path_buf()),
            cni_path: vec![CNI_BIN_DIR.into()],
        },
        BedCni {
            bed,
            kit: RefCell::new(kit),
            faults: RefCell::new(Faults::none()),
        },
    )
}

fn pod(bed: &TestBed) -> PodFacts {
    PodFacts {
        sandbox_id: "sb1".into(),
        uid: "pod-1".into(),
        namespace: "ns".into(),
        name: "p".into(),
        netns: Some(bed.pod.path.clone()),
    }
}

/// host-local's leases of the DRA network.
fn leases(bed: &TestBed) -> Vec<String> {
    let dir = bed.ipam_data.path().join(network_attach::CNI_NETWORK_NAME);
    let mut out: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.parse::<std::net::IpAddr>().is_ok())
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

fn result_of(bed: &TestBed, uid: &str) -> Option<AttachResult> {
    let p = network_attach::result_path(&network_attach::dir(bed.state.path()), uid).unwrap();
    std::fs::read(p)
        .ok()
        .map(|b| serde_json::from_slice(&b).unwrap())
}

#[test]
fn attach_then_release_leaves_the_host_as_before() {
    if skip_without_netns("attach_then_release_leaves_the_host_as_before") {
        return;
    }
    let bed = TestBed::new(2).unwrap();
    write_request(
        &bed,
        "u-1",
        vec![device(
            &bed,
            0,
            json!({"vlan": 100, "mtu": 9000, "mac": "02:aa:bb:cc:dd:01", "rdma": true}),
        )],
    );
    write_request(&bed, "u-2", vec![device(&bed, 1, json!({}))]);
    let net = setup(&bed);
    let host_before = bed.host.links().unwrap();
    let pf_before = net_pf(&net);
    let files_before = bed.state_files();

    assert_eq!(net.attach(&pod(&bed)).unwrap(), 2);
    let net1 = bed.pod.link("net1").expect("net1 in the pod");
    assert_eq!(
        (net1.mac.as_str(), net1.mtu, net1.up),
        ("02:aa:bb:cc:dd:01", 9000, true)
    );
    assert!(bed.pod.link("net2").is_some(), "second claim's VF is net2");
    assert!(bed.host.link("ens1f0v0").is_none() && bed.host.link("ens1f0v1").is_none());
    let vf0 = net.cni_kit(|k| k.vf.state("ens1f0", 0).unwrap());
    assert_eq!(vf0.vlan, 100);
    let host_id = bed.host.open().unwrap().id();
    let pod_id = bed.pod.open().unwrap().id();
    assert_eq!(
        net.cni_kit(|k| k.rdma.netns_of(&rdma_of(&bed, 0))),
        Some(pod_id)
    );
    let addrs = bed.pod.addresses("net1").unwrap();
    assert_eq!(leases(&bed).len(), 2);
    let r1 = result_of(&bed, "u-1").expect("result of claim u-1");
    assert_eq!(r1.pod_uid, "pod-1");
    assert_eq!(r1.sandbox_id, "sb1");
    assert_eq!(r1.devices.len(), 1);
    assert_eq!(r1.devices[0].interface_name, "net1");
    assert_eq!(
        r1.devices[0]
            .hardware_address
            .map(|m| m.to_string())
            .as_deref(),
        Some("02:aa:bb:cc:dd:01")
    );
    assert!(
        r1.devices[0].ips[0].starts_with("10.77.0.") && addrs.contains(&r1.devices[0].ips[0]),
        "{:?} vs {addrs:?}",
        r1.devices[0].ips
    );
    assert_eq!(
        result_of(&bed, "u-2").unwrap().devices[0].interface_name,
        "net2"
    );

    let errors = net.release(&pod(&bed));
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(bed.host.links().unwrap(), host_before);
    assert_eq!(net_pf(&net), pf_before);
    assert_eq!(
        net.cni_kit(|k| k.rdma.netns_of(&rdma_of(&bed, 0))),
        Some(host_id)
    );
    assert!(leases(&bed).is_empty(), "{:?}", leases(&bed));
    assert_eq!(bed.pod.links().unwrap().len(), 1, "only lo left in the pod");
    assert!(result_of(&bed, "u-1").is_none() && result_of(&bed, "u-2").is_none());
    assert_eq!(bed.state_files(), files_before);
    // Idempotent: released again, nothing to do and nothing wrong.
    assert!(net.release(&pod(&bed)).is_empty());
    // A pod with no request is untouched.
    let other = PodFacts {
        uid: "pod-2".into(),
        sandbox_id: "sb2".into(),
        ..pod(&bed)
    };
    assert_eq!(net.attach(&other).unwrap(), 0);
    assert!(bed.pod.link("net1").is_none());
}

/// Issue 21: an attach that missed its deadline ends after the runtime
/// failed the sandbox and removed its netns path (containerd does so right
/// after the failure). Its rollback, given the netns handle opened before
/// the attach, still gets the VF out: back in the host netns as before, no
/// claim, lease or result left. Without the handle the DEL cannot enter the
/// netns by its path and the VF dies with it (a veth; a real VF would be
/// left to the kernel under its pod name).
#[test]
fn a_late_attach_is_undone_after_the_runtime_removed_the_sandbox_netns() {
    if skip_without_netns("a_late_attach_is_undone_after_the_runtime_removed_the_sandbox_netns") {
        return;
    }
    let bed = TestBed::new(1).unwrap();
    write_request(&bed, "u-1", vec![device(&bed, 0, json!({"mtu": 4000}))]);
    let net = setup(&bed);
    let host_before = bed.host.links().unwrap();
    let files_before = bed.state_files();

    let held = kroce_cni::netns::Netns::open(&bed.pod.path).unwrap();
    assert_eq!(net.attach(&pod(&bed)).unwrap(), 1);
    // The runtime removes the sandbox's netns path meanwhile.
    let name = bed.pod.path.file_name().unwrap().to_owned();
    let out = std::process::Command::new("ip")
        .args(["netns", "del"])
        .arg(&name)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(!kroce_cni::netns::is_alive(&bed.pod.path));

    let errors = net.roll_back(&pod(&bed), Some(&held));
    assert!(errors.is_empty(), "{errors:?}");
    drop(held);
    assert_eq!(
        bed.host.links().unwrap(),
        host_before,
        "the VF is back as before"
    );
    assert!(leases(&bed).is_empty(), "{:?}", leases(&bed));
    assert!(result_of(&bed, "u-1").is_none());
    assert_eq!(bed.state_files(), files_before);
}

#[test]
fn a_fault_at_each_step_leaves_the_host_as_before() {
    if skip_without_netns("a_fault_at_each_step_leaves_the_host_as_before") {
        return;
    }
    let bed = TestBed::new(2).unwrap();
    // Two VFs: a fault on the second rolls back the first one's ADD too.
    write_request(
        &bed,
        "u-1",
        vec![
            device(
                &bed,
                0,
                json!({"vlan": 100, "mtu": 9000, "mac": "02:aa:bb:cc:dd:01", "rdma": true}),
            ),
            device(&bed, 1, json!({"vlan": 200, "rdma": true})),
        ],
    );
    let net = setup(&bed);
    let host_before = bed.host.links().unwrap();
    let pf_before = net_pf(&net);
    let files_before = bed.state_files();
    let host_id = bed.host.open().unwrap().id();

    let faults = [
        ("vf.set", 0),
        ("vf.set", 2),
        ("links.del_altname", 0),
        ("links.move_to", 0),
        ("links.set_mac", 0),
        ("links.set_mtu", 0),
        ("links.set_up", 0),
        ("rdma.move_device", 0),
        ("ipam.add", 0),
        ("links.add_address", 0),
        ("links.add_route", 0),
        // The second VF's steps, after the first is in the pod.
        ("links.move_to", 1),
        ("links.set_up", 1),
        ("rdma.move_device", 1),
        ("ipam.add", 1),
    ];
    let mut fired = 0;
    for (op, nth) in faults {
        let f = Faults::fail_at(op, nth);
        net.set_faults(f.clone());
        let r = net.attach(&pod(&bed));
        if !f.fired() {
            // Steps the plan does not have (no routes configured).
            assert!(
                op == "links.add_route",
                "{op}#{nth}: fault not reached ({r:?})"
            );
            assert_eq!(r.unwrap(), 2);
            assert!(net.release(&pod(&bed)).is_empty());
            continue;
        }
        let e = r.unwrap_err().to_string();
        fired += 1;
        assert!(e.contains("(rolled back)"), "{op}#{nth}: {e}");
        assert_eq!(
            bed.host.links().unwrap(),
            host_before,
            "{op}#{nth}: host differs ({e})"
        );
        assert_eq!(
            bed.pod.links().unwrap().len(),
            1,
            "{op}#{nth}: pod not empty"
        );
        assert_eq!(net_pf(&net), pf_before, "{op}#{nth}: PF side not restored");
        for i in 0..2 {
            assert_eq!(
                net.cni_kit(|k| k.rdma.netns_of(&rdma_of(&bed, i))),
                Some(host_id),
                "{op}#{nth}: RDMA device {i} not back"
            );
        }
        assert!(
            leases(&bed).is_empty(),
            "{op}#{nth}: lease leaked {:?}",
            leases(&bed)
        );
        assert!(
            result_of(&bed, "u-1").is_none(),
            "{op}#{nth}: result written"
        );
        assert_eq!(bed.state_files(), files_before, "{op}#{nth}: state left");
    }
    assert!(fired >= 13, "only {fired} faults reached");

    // The result cannot be written (its path is a directory): rolled back.
    net.set_faults(Faults::none());
    let result_path =
        network_attach::result_path(&network_attach::dir(bed.state.path()), "u-1").unwrap();
    std::fs::create_dir_all(result_path.join("x")).unwrap();
    let e = net.attach(&pod(&bed)).unwrap_err().to_string();
    assert!(
        e.contains("u-1.result.json") && e.contains("(rolled back)"),
        "{e}"
    );
    assert_eq!(bed.host.links().unwrap(), host_before);
    assert!(leases(&bed).is_empty());
    std::fs::remove_dir_all(&result_path).unwrap();

    // And with no fault it works on the same host afterwards.
    assert_eq!(net.attach(&pod(&bed)).unwrap(), 2);
    assert!(net.release(&pod(&bed)).is_empty());
    assert_eq!(bed.host.links().unwrap(), host_before);
    assert_eq!(bed.state_files(), files_before);
}

#[test]
fn a_bad_request_changes_nothing() {
    if skip_without_netns("a_bad_request_changes_nothing") {
        return;
    }
    let bed = TestBed::new(1).unwrap();
    // An MTU kroce-cni refuses for this VF stand-in is caught by its
    // validation before any change; a name clash before kroce-cni runs.
    write_request(
        &bed,
        "u-1",
        vec![device(&bed, 0, json!({"interfaceName": "rdma0"}))],
    );
    write_request(
        &bed,
        "u-2",
        vec![device(&bed, 0, json!({"interfaceName": "rdma0"}))],
    );
    let net = setup(&bed);
    let host_before = bed.host.links().unwrap();
    let e = net.attach(&pod(&bed)).unwrap_err().to_string();
    assert!(
        e.contains("\"rdma0\"") && e.contains("claim-u-1") && e.contains("claim-u-2"),
        "{e}"
    );
    assert_eq!(bed.host.links().unwrap(), host_before);
    std::fs::remove_file(
        network_attach::request_path(&network_attach::dir(bed.state.path()), "u-2").unwrap(),
    )
    .unwrap();
    // No netns for the sandbox (host network): refused, nothing changed.
    let hostnet = PodFacts {
        netns: None,
        ..pod(&bed)
    };
    let e = net.attach(&hostnet).unwrap_err().to_string();
    assert!(e.contains("no network namespace"), "{e}");
    assert_eq!(bed.host.links().unwrap(), host_before);
    // A bad VLAN in the request: kroce-cni's parser names it.
    write_request(&bed, "u-1", vec![device(&bed, 0, json!({"vlan": 4095}))]);
    let e = net.attach(&pod(&bed)).unwrap_err().to_string();
    assert!(e.contains("vlan") && e.contains("4095"), "{e}");
    assert_eq!(bed.host.links().unwrap(), host_before);
    assert!(leases(&bed).is_empty());
}

/// Helpers over the runner's kit.
trait KitAccess {
    fn cni_kit<T>(&self, f: impl FnOnce(&Kit) -> T) -> T;
    fn set_faults(&self, f: Faults);
}

impl KitAccess for PodNetwork<BedCni<'_>> {
    fn cni_kit<T>(&self, f: impl FnOnce(&Kit) -> T) -> T {
        f(&self.cni().kit.borrow())
    }

    fn set_faults(&self, f: Faults) {
        *self.cni().faults.borrow_mut() = f;
    }
}

fn net_pf(net: &PodNetwork<BedCni<'_>>) -> Vec<kroce_cni::vf_attrs::VfState> {
    net.cni_kit(|k| (0..2).map(|i| k.vf.state("ens1f0", i).unwrap()).collect())
}
