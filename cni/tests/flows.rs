#![allow(clippy::unwrap_used, clippy::expect_used)]
//! ADD/CHECK/DEL/GC in-process against real netns, real veth VF stand-ins,
//! real host-local IPAM and recording PF/RDMA backends. Needs root.

use kroce_cni::protocol::code;
use kroce_cni::testing::{
    Faults, NetnsGuard, RecordingRdma, RecordingVfConfig, TestBed, hex, skip_without_netns,
};
use kroce_cni::vf_attrs::{LinkState, VfSetting, VlanProto};
use kroce_netlink::rdma::RdmaNetnsMode;
use kroce_netlink::route;
use serde_json::{Value, json};

/// The RDMA device the fixture gives VF `i` of ens1f0.
fn rdma_of(bed: &TestBed, i: u32) -> String {
    let root = bed.fixture.root();
    kroce_cni::vf::resolve(&root, bed.vf_pci(i).parse().unwrap())
        .unwrap()
        .rdma
        .unwrap()
}

fn full_config(bed: &TestBed) -> Value {
    bed.config(json!({
        "mac": "02:aa:bb:cc:dd:01",
        "mtu": 9000,
        "vlan": 100, "vlanQoS": 3, "vlanProto": "802.1Q",
        "spoofchk": "off", "trust": "on", "link_state": "enable",
        "min_tx_rate": 100, "max_tx_rate": 1000,
        "rdma": true,
        "memlock": "unlimited"
    }))
}

fn kit_with_rdma(bed: &TestBed) -> kroce_cni::testing::Kit {
    let mut kit = bed.kit();
    kit.rdma = RecordingRdma::new(Ok(RdmaNetnsMode::Exclusive)).with_device(
        &rdma_of(bed, 0),
        7,
        &bed.host.open().unwrap(),
    );
    kit
}

#[test]
fn add_check_del_round_trip() {
    if skip_without_netns("add_check_del_round_trip") {
        return;
    }
    let bed = TestBed::new(2).unwrap();
    let mut kit = kit_with_rdma(&bed);
    let dev = rdma_of(&bed, 0);
    let host_before = bed.host.links().unwrap();
    let pf_before = kit.vf.state("ens1f0", 0).unwrap();
    let cfg = full_config(&bed);

    let r = bed
        .call(
            &mut kit,
            &Faults::none(),
            &bed.env("ADD", "c1", "net1"),
            &cfg,
        )
        .ok()
        .unwrap();
    assert_eq!(r["cniVersion"], "1.0.0");
    assert_eq!(r["interfaces"][0]["name"], "net1");
    assert_eq!(r["interfaces"][0]["mac"], "02:aa:bb:cc:dd:01");
    assert_eq!(
        r["interfaces"][0]["sandbox"],
        bed.pod.path.display().to_string()
    );
    assert!(
        r["interfaces"][0].get("pciID").is_none(),
        "1.0.0 has no pciID"
    );
    assert_eq!(r["ips"][0]["address"], "10.77.0.2/24");
    assert_eq!(r["ips"][0]["interface"], 0);

    // The pod, as iproute2 sees it.
    let net1 = bed.pod.link("net1").expect("net1 in pod");
    assert_eq!(net1.mac, "02:aa:bb:cc:dd:01");
    assert_eq!(net1.mtu, 9000);
    assert!(net1.up);
    assert!(
        net1.altnames.is_empty(),
        "the host altname must not follow: {:?}",
        net1.altnames
    );
    assert_eq!(bed.pod.addresses("net1").unwrap(), vec!["10.77.0.2/24"]);
    let routes = bed.pod.routes("net1").unwrap();
    assert!(
        routes.contains(&"10.78.0.0/16 via 10.77.0.1".to_string()),
        "{routes:?}"
    );
    assert!(bed.host.link("ens1f0v0").is_none());

    // The PF side: each setting one message, in order, bytes as the kernel
    // expects them.
    let st = kit.vf.state("ens1f0", 0).unwrap();
    assert_eq!((st.vlan, st.qos, st.proto), (100, 3, VlanProto::Dot1Q));
    assert_eq!(st.mac.to_string(), "02:aa:bb:cc:dd:01");
    assert_eq!((st.min_tx_rate, st.max_tx_rate), (100, 1000));
    assert_eq!(
        (st.spoofchk, st.trust, st.link_state),
        (Some(false), Some(true), Some(LinkState::Enable))
    );
    assert_eq!(kit.vf.sent.len(), 6);
    assert_eq!(
        hex(&kit.vf.sent[1].payload),
        "00 00 00 00 04 00 00 00 00 00 00 00 00 00 00 00 18 00 16 00 14 00 01 00 10 00 02 00 \
         00 00 00 00 64 00 00 00 03 00 00 00"
    );
    // RDMA: moved into the pod netns with SET{DEV_INDEX 7, NET_NS_FD}.
    assert_eq!(kit.rdma.netns_of(&dev), Some(bed.pod.open().unwrap().id()));
    let set = kit
        .rdma
        .sent
        .iter()
        .find(|s| s.msg_type == (5 << 10) + 2)
        .expect("RDMA SET sent");
    assert_eq!(&set.payload[..8], &[8, 0, 1, 0, 7, 0, 0, 0]);
    assert_eq!(&set.payload[8..12], &[8, 0, 68, 0]);

    // Records.
    assert_eq!(bed.leases(), vec!["10.77.0.2"]);
    let ml: Value =
        serde_json::from_slice(&std::fs::read(bed.state.path().join("memlock/c1.json")).unwrap())
            .unwrap();
    assert_eq!(ml["memlock"], "unlimited");
    assert_eq!(ml["containerID"], "c1");
    assert_eq!(ml["ifname"], "net1");
    assert_eq!(ml["network"], "kroce-test");
    assert_eq!(ml["netns"], bed.pod.path.display().to_string());

    // CHECK passes, and catches a changed MAC.
    let mut check_cfg = cfg.clone();
    check_cfg["prevResult"] = r.clone();
    bed.call(
        &mut kit,
        &Faults::none(),
        &bed.env("CHECK", "c1", "net1"),
        &check_cfg,
    )
    .ok();
    bed.pod
        .ip(&["link", "set", "net1", "address", "02:aa:bb:cc:dd:99"])
        .unwrap();
    let e = bed
        .call(
            &mut kit,
            &Faults::none(),
            &bed.env("CHECK", "c1", "net1"),
            &check_cfg,
        )
        .err();
    assert_eq!(e.code, code::CHECK_FAILED);
    assert!(e.msg.contains("MAC"), "{e}");
    bed.pod.ip(&["addr", "flush", "dev", "net1"]).unwrap();
    bed.pod
        .ip(&["link", "set", "net1", "address", "02:aa:bb:cc:dd:01"])
        .unwrap();
    let e = bed
        .call(
            &mut kit,
            &Faults::none(),
            &bed.env("CHECK", "c1", "net1"),
            &check_cfg,
        )
        .err();
    assert!(e.msg.contains("10.77.0.2/24"), "{e}");

    // DEL: the host is exactly as before, twice.
    for _ in 0..2 {
        bed.call(
            &mut kit,
            &Faults::none(),
            &bed.env("DEL", "c1", "net1"),
            &cfg,
        )
        .ok();
        assert_eq!(bed.host.links().unwrap(), host_before);
        assert_eq!(bed.pod.links().unwrap().len(), 1, "only lo left in the pod");
        assert_eq!(kit.vf.state("ens1f0", 0).unwrap(), pf_before);
        assert_eq!(kit.rdma.netns_of(&dev), Some(bed.host.open().unwrap().id()));
        assert!(bed.leases().is_empty());
        assert!(bed.state_files().is_empty(), "{:?}", bed.state_files());
    }
}

/// Every ADD step fails once (injected, or real for memlock); each time the
/// host ends exactly as before and the lease is released.
#[test]
fn rollback_at_every_step() {
    if skip_without_netns("rollback_at_every_step") {
        return;
    }
    let bed = TestBed::new(1).unwrap();
    let mut kit = kit_with_rdma(&bed);
    let dev = rdma_of(&bed, 0);
    let cfg = full_config(&bed);
    let host_before = bed.host.links().unwrap();
    let pf_before = kit.vf.state("ens1f0", 0).unwrap();
    let host_id = bed.host.open().unwrap().id();

    // The plan's steps, each mapped to the backend call that carries it.
    let conf =
        kroce_cni::config::parse(&serde_json::to_vec(&cfg).unwrap(), &Default::default()).unwrap();
    let vf = kroce_cni::vf::Target::Vf(
        kroce_cni::vf::resolve(&bed.fixture.root(), bed.vf_pci(0).parse().unwrap()).unwrap(),
    );
    let (plan, _) =
        kroce_cni::plan::plan_add(&conf, "net1", &vf, Some(Ok(RdmaNetnsMode::Exclusive))).unwrap();
    use kroce_cni::plan::Step;
    let steps = plan.steps();
    assert_eq!(steps.len(), 16, "{steps:?}");
    for step in steps {
        let (faults, memlock_file) = match step {
            Step::VfSetting(i) => (Faults::fail_at("vf.set", i), false),
            Step::DropAltnames => (Faults::fail_at("links.del_altname", 0), false),
            Step::MoveToPod => (Faults::fail_at("links.move_to", 0), false),
            Step::SetMac => (Faults::fail_at("links.set_mac", 0), false),
            Step::SetMtu => (Faults::fail_at("links.set_mtu", 0), false),
            Step::LinkUp => (Faults::fail_at("links.set_up", 0), false),
            Step::MoveRdma => (Faults::fail_at("rdma.move_device", 0), false),
            Step::RecreateRdma => (Faults::fail_at("rdma.add_link", 0), false),
            Step::IpamAdd => (Faults::fail_at("ipam.add", 0), false),
            Step::Addresses => (Faults::fail_at("links.add_address", 0), false),
            Step::Routes => (Faults::fail_at("links.add_route", 0), false),
            // A real failure: the memlock dir is a file.
            Step::RecordMemlock => (Faults::none(), true),
        };
        if memlock_file {
            std::fs::write(bed.state.path().join("memlock"), "not a dir").unwrap();
        }
        let r = bed.call(&mut kit, &faults, &bed.env("ADD", "c1", "net1"), &cfg);
        let e = r.err();
        assert!(
            memlock_file || faults.fired(),
            "{step:?}: fault not reached ({e})"
        );
        assert!(e.details.is_none(), "{step:?}: rollback incomplete: {e}");
        assert_eq!(
            bed.host.links().unwrap(),
            host_before,
            "{step:?}: host differs after rollback ({e})"
        );
        assert_eq!(bed.pod.links().unwrap().len(), 1, "{step:?}: pod not empty");
        assert_eq!(
            kit.vf.state("ens1f0", 0).unwrap(),
            pf_before,
            "{step:?}: PF side not restored"
        );
        assert_eq!(
            kit.rdma.netns_of(&dev),
            Some(host_id),
            "{step:?}: RDMA device not back"
        );
        assert!(
            bed.leases().is_empty(),
            "{step:?}: lease leaked {:?}",
            bed.leases()
        );
        if memlock_file {
            std::fs::remove_file(bed.state.path().join("memlock")).unwrap();
        }
        assert!(
            bed.state_files().is_empty(),
            "{step:?}: state left {:?}",
            bed.state_files()
        );
    }
    // And with no fault it works on the same host afterwards.
    bed.call(
        &mut kit,
        &Faults::none(),
        &bed.env("ADD", "c1", "net1"),
        &cfg,
    )
    .ok();
    bed.call(
        &mut kit,
        &Faults::none(),
        &bed.env("DEL", "c1", "net1"),
        &cfg,
    )
    .ok();
    assert_eq!(bed.host.links().unwrap(), host_before);
}

/// The RDMA requests recorded since `from`: every one (lookup dump and
/// move) sent from a thread inside `source` on a socket opened there, and
/// exactly one move, out of `source`, answered by the kernel model.
fn assert_rdma_sent_from(
    kit: &kroce_cni::testing::Kit,
    from: usize,
    source: (u64, u64),
    what: &str,
) {
    // The netns mode (SYS_GET) is a host-wide question, asked where the
    // plugin runs.
    let calls: Vec<_> = kit.rdma.calls[from..]
        .iter()
        .filter(|c| c.sent.msg_type != (5 << 10) + 6)
        .collect();
    assert!(!calls.is_empty(), "{what}: no RDMA request");
    for c in &calls {
        assert_eq!(
            (c.thread_netns, c.socket_netns),
            (source, source),
            "{what}: RDMA request {:#x} not sent from the source netns: {c:?}",
            c.sent.msg_type
        );
    }
    let moves: Vec<_> = calls
        .iter()
        .filter(|c| c.sent.msg_type == (5 << 10) + 2)
        .collect();
    assert_eq!(moves.len(), 1, "{what}: {moves:?}");
    assert_eq!(moves[0].device_netns, Some(source), "{what}");
    assert_eq!(moves[0].errno, None, "{what}: the kernel refused the move");
}

/// The kernel moves an RDMA device only when the sending thread is in the
/// device's current netns (rdma_dev_change_netns): ADD sends from the host
/// netns, DEL, rollback and GC from the pod netns, on real netns.
#[test]
fn rdma_moves_are_sent_from_the_source_netns() {
    if skip_without_netns("rdma_moves_are_sent_from_the_source_netns") {
        return;
    }
    let bed = TestBed::new(1).unwrap();
    // Like the binary: the plugin's own thread is in the host netns.
    bed.host
        .open()
        .unwrap()
        .run_in(|| {
            rdma_flows_from_the_host(&bed);
            Ok(())
        })
        .unwrap();
}

fn rdma_flows_from_the_host(bed: &TestBed) {
    let mut kit = kit_with_rdma(bed);
    let dev = rdma_of(bed, 0);
    let host = bed.host.open().unwrap().id();
    let pod = bed.pod.open().unwrap().id();
    let cfg = bed.config(json!({"rdma": true, "cniVersion": "1.1.0"}));
    let back_home = |kit: &kroce_cni::testing::Kit, what: &str| {
        assert_eq!(
            kit.rdma.netns_of(&dev),
            Some(host),
            "{what}: RDMA device not back"
        );
    };

    // ADD, then DEL.
    let mark = kit.rdma.calls.len();
    bed.call(
        &mut kit,
        &Faults::none(),
        &bed.env("ADD", "c1", "net1"),
        &cfg,
    )
    .ok();
    assert_rdma_sent_from(&kit, mark, host, "ADD");
    assert_eq!(kit.rdma.netns_of(&dev), Some(pod));
    let mark = kit.rdma.calls.len();
    bed.call(
        &mut kit,
        &Faults::none(),
        &bed.env("DEL", "c1", "net1"),
        &cfg,
    )
    .ok();
    assert_rdma_sent_from(&kit, mark, pod, "DEL");
    back_home(&kit, "DEL");

    // Rollback: IPAM fails after the device moved.
    bed.call(
        &mut kit,
        &Faults::none(),
        &bed.env("ADD", "c2", "net1"),
        &cfg,
    )
    .ok();
    bed.call(
        &mut kit,
        &Faults::none(),
        &bed.env("DEL", "c2", "net1"),
        &cfg,
    )
    .ok();
    let faults = Faults::fail_at("ipam.add", 0);
    let before_add = kit.rdma.calls.len();
    let e = bed
        .call(&mut kit, &faults, &bed.env("ADD", "c3", "net1"), &cfg)
        .err();
    assert!(faults.fired(), "{e}");
    assert!(e.details.is_none(), "rollback incomplete: {e}");
    let rollback_from = kit.rdma.calls[before_add..]
        .iter()
        .position(|c| c.sent.msg_type == (5 << 10) + 2)
        .map(|i| before_add + i + 1)
        .unwrap();
    assert_rdma_sent_from(&kit, rollback_from, pod, "rollback");
    back_home(&kit, "rollback");

    // GC of a stale attachment.
    bed.call(
        &mut kit,
        &Faults::none(),
        &bed.env("ADD", "c4", "net1"),
        &cfg,
    )
    .ok();
    assert_eq!(kit.rdma.netns_of(&dev), Some(pod));
    let mut gc_cfg = cfg.clone();
    gc_cfg["cni.dev/valid-attachments"] = json!([]);
    let mut env_gc = std::collections::HashMap::new();
    env_gc.insert("CNI_COMMAND".to_string(), "GC".to_string());
    env_gc.insert("CNI_PATH".to_string(), "/usr/lib/cni".to_string());
    let mark = kit.rdma.calls.len();
    bed.call(&mut kit, &Faults::none(), &env_gc, &gc_cfg).ok();
    assert_rdma_sent_from(&kit, mark, pod, "GC");
    back_home(&kit, "GC");
    assert!(bed.state_files().is_empty(), "{:?}", bed.state_files());
}

/// IFLA_VF_RATE carries both rates: a config with only `max_tx_rate`
/// keeps the VF's current min rate (as iproute2 does), DEL puts both back,
/// and a max below the kept min is refused before any change.
#[test]
fn max_rate_alone_keeps_the_current_min_rate() {
    if skip_without_netns("max_rate_alone_keeps_the_current_min_rate") {
        return;
    }
    let bed = TestBed::new(1).unwrap();
    let mut kit = bed.kit();
    kit.vf
        .vfs
        .get_mut(&("ens1f0".to_string(), 0))
        .unwrap()
        .min_tx_rate = 100;
    kit.vf
        .vfs
        .get_mut(&("ens1f0".to_string(), 0))
        .unwrap()
        .max_tx_rate = 1000;
    let pf_before = kit.vf.state("ens1f0", 0).unwrap();
    let host_before = bed.host.links().unwrap();

    let low = bed.config(json!({"rdma": false, "max_tx_rate": 50}));
    let e = bed
        .call(
            &mut kit,
            &Faults::none(),
            &bed.env("ADD", "c1", "net1"),
            &low,
        )
        .err();
    assert_eq!(e.code, code::INVALID_CONFIG, "{e}");
    assert!(
        e.msg.contains("max_tx_rate 50") && e.msg.contains("min_tx_rate 100"),
        "{e}"
    );
    assert!(kit.vf.sent.is_empty(), "{:?}", kit.vf.sent);
    assert_eq!(bed.host.links().unwrap(), host_before);
    assert!(bed.state_files().is_empty(), "{:?}", bed.state_files());

    let cfg = bed.config(json!({"rdma": false, "max_tx_rate": 500}));
    bed.call(
        &mut kit,
        &Faults::none(),
        &bed.env("ADD", "c1", "net1"),
        &cfg,
    )
    .ok();
    let st = kit.vf.state("ens1f0", 0).unwrap();
    assert_eq!((st.min_tx_rate, st.max_tx_rate), (100, 500));
    assert_eq!(kit.vf.sent.len(), 1);
    // IFLA_VF_RATE { vf 0, min 100, max 500 } on PF ifindex 4.
    assert_eq!(
        hex(&kit.vf.sent[0].payload[16..]),
        "18 00 16 00 14 00 01 00 10 00 06 00 00 00 00 00 64 00 00 00 f4 01 00 00"
    );
    bed.call(
        &mut kit,
        &Faults::none(),
        &bed.env("DEL", "c1", "net1"),
        &cfg,
    )
    .ok();
    assert_eq!(kit.vf.state("ens1f0", 0).unwrap(), pf_before);
    assert_eq!(bed.host.links().unwrap(), host_before);
}

/// mlx5_core takes 802.1Q VF VLANs only (mlx5e_set_vf_vlan answers
/// EPROTONOSUPPORT): 802.1ad on a ConnectX PF is refused before any change,
/// naming the driver, the PF and the field; another driver's PF gets it.
#[test]
fn dot1ad_on_a_connectx_pf_is_refused_before_any_change() {
    if skip_without_netns("dot1ad_on_a_connectx_pf_is_refused_before_any_change") {
        return;
    }
    let bed = TestBed::new(1).unwrap();
    let mut kit = kit_with_rdma(&bed);
    let host_before = bed.host.links().unwrap();
    let pf_before = kit.vf.state("ens1f0", 0).unwrap();
    let cfg = bed.config(json!({
        "rdma": true, "mac": "02:aa:bb:cc:dd:01", "spoofchk": "off",
        "vlan": 100, "vlanProto": "802.1ad", "memlock": "1Gi"
    }));
    let e = bed
        .call(
            &mut kit,
            &Faults::none(),
            &bed.env("ADD", "c1", "net1"),
            &cfg,
        )
        .err();
    assert_eq!(e.code, code::UNSUPPORTED_FIELD, "{e}");
    for needle in [
        "vlanProto",
        "802.1ad",
        "mlx5_core",
        "ens1f0",
        "0000:3b:00.0",
    ] {
        assert!(e.msg.contains(needle), "{needle}: {e}");
    }
    assert!(kit.vf.sent.is_empty(), "PF touched: {:?}", kit.vf.sent);
    assert!(
        kit.rdma.moves().is_empty(),
        "RDMA touched: {:?}",
        kit.rdma.calls
    );
    assert_eq!(kit.vf.state("ens1f0", 0).unwrap(), pf_before);
    assert_eq!(bed.host.links().unwrap(), host_before);
    assert_eq!(bed.pod.links().unwrap().len(), 1);
    assert!(bed.leases().is_empty());
    assert!(bed.state_files().is_empty(), "{:?}", bed.state_files());

    // The same PF bound to a driver that takes 802.1ad (ice): sent as
    // IFLA_VF_VLAN_LIST with the 802.1ad ethertype.
    let driver_link = bed
        .fixture
        .root()
        .pci_devices()
        .join("0000:3b:00.0")
        .join("driver");
    let mlx5 = std::fs::read_link(&driver_link).unwrap();
    let ice = mlx5.with_file_name("ice");
    std::fs::create_dir_all(driver_link.parent().unwrap().join(&ice)).unwrap();
    std::fs::remove_file(&driver_link).unwrap();
    std::os::unix::fs::symlink(&ice, &driver_link).unwrap();
    bed.call(
        &mut kit,
        &Faults::none(),
        &bed.env("ADD", "c1", "net1"),
        &cfg,
    )
    .ok();
    let st = kit.vf.state("ens1f0", 0).unwrap();
    assert_eq!((st.vlan, st.proto), (100, VlanProto::Dot1Ad));
    assert!(
        kit.vf.sent.iter().any(|s| hex(&s.payload)
            .ends_with("18 00 0c 00 14 00 01 00 00 00 00 00 64 00 00 00 00 00 00 00 88 a8 00 00")),
        "{:?}",
        kit.vf.sent
    );
    bed.call(
        &mut kit,
        &Faults::none(),
        &bed.env("DEL", "c1", "net1"),
        &cfg,
    )
    .ok();
    assert_eq!(kit.vf.state("ens1f0", 0).unwrap(), pf_before);
    assert_eq!(bed.host.links().unwrap(), host_before);
}

#[test]
fn del_after_netns_deleted_and_del_without_cache() {
    if skip_without_netns("del_after_netns_deleted_and_del_without_cache") {
        return;
    }
    let mut bed = TestBed::new(1).unwrap();
    let mut kit = bed.kit();
    let cfg = bed.config(json!({"vlan": 7, "rdma": false}));
    // DEL of something never added.
    bed.call(
        &mut kit,
        &Faults::none(),
        &bed.env("DEL", "never", "net1"),
        &cfg,
    )
    .ok();
    bed.call(
        &mut kit,
        &Faults::none(),
        &bed.env("ADD", "c1", "net1"),
        &cfg,
    )
    .ok();
    assert_eq!(kit.vf.state("ens1f0", 0).unwrap().vlan, 7);
    assert_eq!(bed.leases().len(), 1);
    // The pod goes away under us; the veth stand-in dies with it (a real VF
    // would return to the host).
    bed.pod.delete().unwrap();
    let mut env = bed.env("DEL", "c1", "net1");
    env.remove("CNI_NETNS");
    bed.call(&mut kit, &Faults::none(), &env, &cfg).ok();
    assert_eq!(
        kit.vf.state("ens1f0", 0).unwrap().vlan,
        0,
        "PF-side VLAN reverted"
    );
    assert!(bed.leases().is_empty());
    assert!(bed.state_files().is_empty(), "{:?}", bed.state_files());
    bed.call(&mut kit, &Faults::none(), &env, &cfg).ok();
}

#[test]
fn vf_back_from_a_dead_netns_is_restored_by_del() {
    if skip_without_netns("vf_back_from_a_dead_netns_is_restored_by_del") {
        return;
    }
    let mut bed = TestBed::new(1).unwrap();
    let mut kit = bed.kit();
    let cfg = bed.config(json!({"mac": "02:aa:00:00:00:05", "mtu": 4000, "rdma": false}));
    let before = bed.host.links().unwrap();
    bed.call(
        &mut kit,
        &Faults::none(),
        &bed.env("ADD", "c1", "net1"),
        &cfg,
    )
    .ok();
    // What the kernel does with a physical netdev when its netns dies:
    // back to the host, renamed when the name is taken.
    bed.pod
        .ip(&[
            "link",
            "set",
            "net1",
            "netns",
            &bed.host.name,
            "name",
            "dev7",
        ])
        .unwrap();
    bed.pod.delete().unwrap();
    bed.sysfs_alias("dev7", 0).unwrap();
    // An altname equal to the original name blocks a plain rename back.
    bed.host
        .ip(&[
            "link", "property", "add", "dev", "dev7", "altname", "ens1f0v0",
        ])
        .unwrap();
    bed.call(
        &mut kit,
        &Faults::none(),
        &bed.env("DEL", "c1", "net1"),
        &cfg,
    )
    .ok();
    assert_eq!(
        bed.host.links().unwrap(),
        before,
        "name, MAC, MTU, altname and down state restored"
    );
    assert!(bed.leases().is_empty());
}

#[test]
fn old_pods_del_leaves_the_new_holder_alone() {
    if skip_without_netns("old_pods_del_leaves_the_new_holder_alone") {
        return;
    }
    let mut bed = TestBed::new(1).unwrap();
    let mut kit = bed.kit();
    let cfg = bed.config(json!({"vlan": 10, "rdma": false}));
    bed.call(
        &mut kit,
        &Faults::none(),
        &bed.env("ADD", "old", "net1"),
        &cfg,
    )
    .ok();
    // The old pod dies; its VF returns to the host.
    bed.pod
        .ip(&["link", "set", "net1", "netns", &bed.host.name])
        .unwrap();
    bed.pod.delete().unwrap();
    bed.sysfs_alias("net1", 0).unwrap();
    // A new pod gets the VF (the old, dead claim is taken over).
    let new_pod =
        NetnsGuard::create(&format!("kcn{}", kroce_cni::testing::testbed::unique_tag())).unwrap();
    let mut env_new = bed.env("ADD", "new", "net1");
    env_new.insert("CNI_NETNS".into(), new_pod.path.display().to_string());
    let r = bed.call(&mut kit, &Faults::none(), &env_new, &cfg);
    assert!(
        r.warnings.iter().any(|w| w.contains("stale")),
        "{:?}",
        r.warnings
    );
    r.ok();
    assert_eq!(
        bed.leases().len(),
        1,
        "the old lease went with the takeover"
    );
    let held = new_pod.link("net1").unwrap();
    // The old pod's late DEL.
    let mut env_old = bed.env("DEL", "old", "net1");
    env_old.remove("CNI_NETNS");
    bed.call(&mut kit, &Faults::none(), &env_old, &cfg).ok();
    assert_eq!(
        new_pod.link("net1").unwrap(),
        held,
        "the new pod's VF is untouched"
    );
    assert_eq!(
        kit.vf.state("ens1f0", 0).unwrap().vlan,
        10,
        "PF side untouched"
    );
    assert_eq!(bed.leases().len(), 1);
    let mut env_del = bed.env("DEL", "new", "net1");
    env_del.insert("CNI_NETNS".into(), new_pod.path.display().to_string());
    bed.call(&mut kit, &Faults::none(), &env_del, &cfg).ok();
    assert!(bed.host.link("ens1f0v0").is_some());
    assert_eq!(kit.vf.state("ens1f0", 0).unwrap().vlan, 0);
    assert!(bed.leases().is_empty());
    assert!(bed.state_files().is_empty(), "{:?}", bed.state_files());
}

#[test]
fn two_adds_race_for_one_vf() {
    if skip_without_netns("two_adds_race_for_one_vf") {
        return;
    }
    let bed = TestBed::new(1).unwrap();
    let pods: Vec<NetnsGuard> = (0..2)
        .map(|i| {
            NetnsGuard::create(&format!(
                "kcr{i}{}",
                kroce_cni::testing::testbed::unique_tag()
            ))
            .unwrap()
        })
        .collect();
    let cfg = bed.config(json!({"rdma": false}));
    let results: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = pods
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let bed = &bed;
                let cfg = &cfg;
                s.spawn(move || {
                    let mut kit = bed.kit();
                    let mut env = bed.env("ADD", &format!("racer{i}"), "net1");
                    env.insert("CNI_NETNS".into(), p.path.display().to_string());
                    bed.call(&mut kit, &Faults::none(), &env, cfg).result
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let winners: Vec<usize> = (0..2).filter(|i| results[*i].is_ok()).collect();
    assert_eq!(winners.len(), 1, "{results:?}");
    let w = winners[0];
    let loser = results[1 - w].as_ref().unwrap_err();
    assert_eq!(loser.code, code::TRY_AGAIN, "{loser}");
    assert!(loser.msg.contains(&format!("racer{w}")), "{loser}");
    assert!(pods[w].link("net1").is_some());
    assert!(pods[1 - w].link("net1").is_none());
    assert_eq!(bed.leases().len(), 1, "the loser never reached IPAM");
}

#[test]
fn gc_releases_attachments_not_listed() {
    if skip_without_netns("gc_releases_attachments_not_listed") {
        return;
    }
    let bed = TestBed::new(2).unwrap();
    let mut kit = bed.kit();
    let pod_b =
        NetnsGuard::create(&format!("kcb{}", kroce_cni::testing::testbed::unique_tag())).unwrap();
    let cfg_a = bed.config(json!({"rdma": false, "memlock": "1Gi"}));
    let cfg_b = bed.config(
        json!({"rdma": false, "memlock": "2Gi", "deviceID": bed.vf_pci(1), "spoofchk": "off"}),
    );
    let before = bed.host.links().unwrap();
    bed.call(
        &mut kit,
        &Faults::none(),
        &bed.env("ADD", "a", "net1"),
        &cfg_a,
    )
    .ok();
    let mut env_b = bed.env("ADD", "b", "net1");
    env_b.insert("CNI_NETNS".into(), pod_b.path.display().to_string());
    bed.call(&mut kit, &Faults::none(), &env_b, &cfg_b).ok();
    assert_eq!(bed.leases().len(), 2);

    let mut gc_cfg = bed.config(json!({"cniVersion": "1.1.0", "rdma": false}));
    let mut env_gc = std::collections::HashMap::new();
    env_gc.insert("CNI_COMMAND".to_string(), "GC".to_string());
    env_gc.insert("CNI_PATH".to_string(), "/usr/lib/cni".to_string());
    let e = bed.call(&mut kit, &Faults::none(), &env_gc, &gc_cfg).err();
    assert_eq!(e.code, code::INVALID_CONFIG, "no list, no GC: {e}");
    gc_cfg["cni.dev/valid-attachments"] = json!([{"containerID": "a", "ifname": "net1"}]);
    bed.call(&mut kit, &Faults::none(), &env_gc, &gc_cfg).ok();

    assert!(bed.pod.link("net1").is_some(), "a is valid and stays");
    assert!(pod_b.link("net1").is_none(), "b is released");
    assert!(bed.host.link("ens1f0v1").is_some());
    assert_eq!(
        kit.vf.state("ens1f0", 1).unwrap().spoofchk,
        Some(true),
        "b's PF side reverted"
    );
    assert_eq!(bed.leases(), vec!["10.77.0.2"]);
    assert!(bed.state.path().join("memlock/a.json").exists());
    assert!(!bed.state.path().join("memlock/b.json").exists());
    bed.call(
        &mut kit,
        &Faults::none(),
        &bed.env("DEL", "a", "net1"),
        &cfg_a,
    )
    .ok();
    assert_eq!(bed.host.links().unwrap(), before);
    assert!(bed.state_files().is_empty(), "{:?}", bed.state_files());
}

/// libcni >= 1.2 sends `"cni.dev/valid-attachments": null` when no
/// attachment is valid: that is an empty list (everything of this network
/// goes), while an absent key still refuses.
#[test]
fn gc_with_null_valid_attachments_releases_everything() {
    if skip_without_netns("gc_with_null_valid_attachments_releases_everything") {
        return;
    }
    let bed = TestBed::new(1).unwrap();
    let mut kit = bed.kit();
    let before = bed.host.links().unwrap();
    let pf_before = kit.vf.state("ens1f0", 0).unwrap();
    let cfg = bed.config(json!({"rdma": false, "memlock": "1Gi", "vlan": 12}));
    bed.call(
        &mut kit,
        &Faults::none(),
        &bed.env("ADD", "a", "net1"),
        &cfg,
    )
    .ok();
    assert_eq!(bed.leases().len(), 1);
    assert!(bed.state.path().join("memlock/a.json").exists());

    let mut gc_cfg = bed.config(json!({"cniVersion": "1.1.0", "rdma": false}));
    let mut env_gc = std::collections::HashMap::new();
    env_gc.insert("CNI_COMMAND".to_string(), "GC".to_string());
    env_gc.insert("CNI_PATH".to_string(), "/usr/lib/cni".to_string());
    let e = bed.call(&mut kit, &Faults::none(), &env_gc, &gc_cfg).err();
    assert_eq!(e.code, code::INVALID_CONFIG, "absent key: {e}");
    assert!(
        bed.pod.link("net1").is_some(),
        "a refused GC touches nothing"
    );
    gc_cfg["cni.dev/valid-attachments"] = Value::Null;
    let r = bed.call(&mut kit, &Faults::none(), &env_gc, &gc_cfg);
    assert!(r.result.is_ok(), "null is an empty list: {:?}", r.result);

    assert!(bed.pod.link("net1").is_none(), "a is stale and released");
    assert_eq!(bed.host.links().unwrap(), before);
    assert_eq!(kit.vf.state("ens1f0", 0).unwrap(), pf_before);
    assert!(bed.leases().is_empty(), "{:?}", bed.leases());
    assert!(bed.state_files().is_empty(), "{:?}", bed.state_files());
}

#[test]
fn altname_that_collides_in_the_pod_does_not_break_add() {
    if skip_without_netns("altname_that_collides_in_the_pod_does_not_break_add") {
        return;
    }
    let bed = TestBed::new(1).unwrap();
    let mut kit = bed.kit();
    // Something in the pod already uses the VF's udev altname: the kernel
    // refuses to move a netdev whose altname exists in the target.
    bed.pod
        .ip(&[
            "link",
            "add",
            "enp59s0f0v0",
            "type",
            "veth",
            "peer",
            "name",
            "x0",
        ])
        .unwrap();
    let naive = bed.host.ip(&[
        "link",
        "set",
        "ens1f0v0",
        "netns",
        &bed.pod.name,
        "name",
        "net9",
    ]);
    assert!(naive.is_err(), "this kernel accepted an altname collision");
    let cfg = bed.config(json!({"rdma": false}));
    let before = bed.host.links().unwrap();
    bed.call(
        &mut kit,
        &Faults::none(),
        &bed.env("ADD", "c1", "net1"),
        &cfg,
    )
    .ok();
    assert!(bed.pod.link("net1").unwrap().altnames.is_empty());
    bed.call(
        &mut kit,
        &Faults::none(),
        &bed.env("DEL", "c1", "net1"),
        &cfg,
    )
    .ok();
    assert_eq!(
        bed.host.links().unwrap(),
        before,
        "altname back on the host"
    );
}

#[test]
fn refusals_touch_nothing() {
    if skip_without_netns("refusals_touch_nothing") {
        return;
    }
    let bed = TestBed::new(1).unwrap();
    let mut kit = bed.kit();
    let before = bed.host.links().unwrap();
    bed.pod
        .ip(&["link", "add", "net1", "type", "veth", "peer", "name", "y0"])
        .unwrap();
    let cases: Vec<(Value, &str, u32, &str)> = vec![
        (json!({}), "net1", code::IFNAME_IN_USE, "already exists"),
        (
            json!({"deviceID": "0000:3b:00.0"}),
            "net2",
            code::VF_LOOKUP,
            "not a VF",
        ),
        (
            json!({"deviceID": "0000:3b:1f.7"}),
            "net2",
            code::VF_LOOKUP,
            "not found",
        ),
        (
            json!({"deviceID": bed.vf_pci(1)}),
            "net2",
            code::VF_LOOKUP,
            "not in the host netns",
        ),
        (
            json!({"deviceID": null}),
            "net2",
            code::INVALID_CONFIG,
            "no VF given",
        ),
        (
            json!({"deviceID": null, "runtimeConfig": {"CNIDeviceInfoFile": "/nonexistent/x.json"}}),
            "net2",
            code::INVALID_CONFIG,
            "CNIDeviceInfoFile",
        ),
        (json!({"rdma": true}), "net2", code::RDMA, "mode"),
        (
            json!({"ipam": {"type": "no-such-ipam"}}),
            "net2",
            code::IPAM,
            "no-such-ipam",
        ),
    ];
    kit.rdma = RecordingRdma::new(Err("EPROTONOSUPPORT".into()));
    for (extra, ifname, want, needle) in cases {
        let e = bed
            .call(
                &mut kit,
                &Faults::none(),
                &bed.env("ADD", "c1", ifname),
                &bed.config(extra.clone()),
            )
            .err();
        assert_eq!(e.code, want, "{extra}: {e}");
        assert!(e.msg.contains(needle), "{extra}: {e}");
        assert_eq!(bed.host.links().unwrap(), before, "{extra}");
        assert!(bed.leases().is_empty(), "{extra}");
        assert!(
            bed.state_files().is_empty(),
            "{extra}: {:?}",
            bed.state_files()
        );
        assert!(kit.vf.sent.is_empty(), "{extra}: PF touched");
    }
}

#[test]
fn device_info_file_and_rdma_auto_without_rdma_netlink() {
    if skip_without_netns("device_info_file_and_rdma_auto_without_rdma_netlink") {
        return;
    }
    let bed = TestBed::new(1).unwrap();
    let mut kit = bed.kit();
    kit.rdma = RecordingRdma::new(Err("EPROTONOSUPPORT".into()));
    let info = std::path::PathBuf::from(format!("{}-devinfo.json", bed.state.path().display()));
    std::fs::write(
        &info,
        format!(
            r#"{{"type":"pci","version":"1.1.0","pci":{{"pci-address":"{}","pf-pci-address":"0000:3b:00.0","rdma-device":"mlx5_1"}}}}"#,
            bed.vf_pci(0)
        ),
    )
    .unwrap();
    let cfg = bed.config(json!({"deviceID": null, "cniVersion": "1.1.0",
        "runtimeConfig": {"CNIDeviceInfoFile": info.display().to_string()}}));
    let r = bed.call(
        &mut kit,
        &Faults::none(),
        &bed.env("ADD", "c1", "net1"),
        &cfg,
    );
    assert!(
        r.warnings.iter().any(|w| w.contains("RDMA netns mode")),
        "{:?}",
        r.warnings
    );
    let res = r.ok().unwrap();
    assert_eq!(res["cniVersion"], "1.1.0");
    assert_eq!(res["interfaces"][0]["pciID"], bed.vf_pci(0));
    assert_eq!(res["interfaces"][0]["mtu"], 1500);
    bed.call(
        &mut kit,
        &Faults::none(),
        &bed.env("DEL", "c1", "net1"),
        &cfg,
    )
    .ok();
    std::fs::remove_file(&info).unwrap();
}

#[test]
fn memlock_limit_of_the_runtime_is_checked() {
    if skip_without_netns("memlock_limit_of_the_runtime_is_checked") {
        return;
    }
    let bed = TestBed::new(1).unwrap();
    let mut kit = bed.kit();
    let own = kroce_cni::memlock::read_limit(std::path::Path::new("/proc"), "self").unwrap();
    let cfg = bed.config(json!({"rdma": false, "memlock": "unlimited"}));
    let r = bed.call(
        &mut kit,
        &Faults::none(),
        &bed.env("ADD", "c1", "net1"),
        &cfg,
    );
    let warned = r.warnings.iter().any(|w| w.contains("RLIMIT_MEMLOCK"));
    assert_eq!(
        warned,
        own.soft != kroce_cni::memlock::Memlock::Unlimited,
        "{:?}",
        r.warnings
    );
    r.ok();
    bed.call(
        &mut kit,
        &Faults::none(),
        &bed.env("DEL", "c1", "net1"),
        &cfg,
    )
    .ok();
}

/// The real PF-side implementation against this kernel: a veth is no PF, so
/// it reports no VFs, and a well-formed VF request is parsed by the kernel
/// and refused with EOPNOTSUPP (a malformed one would be EINVAL/ERANGE).
#[test]
fn real_pf_backend_messages_are_accepted_by_the_kernel() {
    if skip_without_netns("real_pf_backend_messages_are_accepted_by_the_kernel") {
        return;
    }
    use kroce_cni::vf_config::{RtnlVfConfig, VfConfig, VfConfigError};
    let bed = TestBed::new(0).unwrap();
    bed.host
        .ip(&[
            "link", "add", "pfstand", "type", "veth", "peer", "name", "pfpeer",
        ])
        .unwrap();
    let mut real = RtnlVfConfig::new(Some(bed.host.open().unwrap()));
    match real.get("pfstand", 0) {
        Err(VfConfigError::NoSuchVf { listed: 0, .. }) => {}
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        real.get("nope0", 0),
        Err(VfConfigError::PfGone { .. })
    ));
    let mac = "02:00:00:00:00:01".parse().unwrap();
    for s in [
        VfSetting::Mac { mac },
        VfSetting::Vlan {
            vlan: 5,
            qos: 1,
            proto: VlanProto::Dot1Q,
        },
        VfSetting::Vlan {
            vlan: 5,
            qos: 1,
            proto: VlanProto::Dot1Ad,
        },
        VfSetting::Rate { min: 0, max: 100 },
        VfSetting::Spoofchk { on: true },
        VfSetting::Trust { on: true },
        VfSetting::LinkState {
            state: LinkState::Auto,
        },
    ] {
        let e = real.set("pfstand", 0, &s).unwrap_err();
        let errno = match &e {
            VfConfigError::Netlink { source, .. } => source.errno(),
            _ => None,
        };
        assert_eq!(errno, Some(nix::errno::Errno::EOPNOTSUPP), "{s}: {e}");
    }
    // Control: a truncated IFLA_VF_MAC is rejected by the policy, not by the
    // missing driver op.
    let ns = bed.host.open().unwrap();
    let mut sock =
        kroce_netlink::NlSocket::open_in(&ns, nix::sys::socket::SockProtocol::NetlinkRoute)
            .unwrap();
    let idx = route::parse_link(&sock.request(&route::get_link_by_name("pfstand")).unwrap()[0])
        .unwrap()
        .index;
    let mut bad = kroce_netlink::MsgBuilder::new(route::RTM_SETLINK, 5)
        .family_header(&route::ifinfomsg(idx, 0, 0));
    bad.begin_nest(route::IFLA_VFINFO_LIST)
        .begin_nest(route::IFLA_VF_INFO)
        .attr(route::IFLA_VF_MAC, &[0u8; 10])
        .end_nest()
        .end_nest();
    let e = sock.request(&bad).unwrap_err();
    assert_ne!(e.errno(), Some(nix::errno::Errno::EOPNOTSUPP), "{e}");
}

#[test]
fn real_rdma_backend_reports_a_missing_rdma_stack() {
    use kroce_cni::rdma::{NetlinkRdma, RdmaControl, RdmaError};
    match NetlinkRdma::new(None).netns_mode() {
        Err(RdmaError::Unavailable { source, .. }) => {
            assert_eq!(
                source.errno(),
                Some(nix::errno::Errno::EPROTONOSUPPORT),
                "{source}"
            );
        }
        Ok(mode) => println!("this host has an RDMA stack: netns mode {mode:?}"),
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn chained_add_keeps_the_previous_result() {
    if skip_without_netns("chained_add_keeps_the_previous_result") {
        return;
    }
    let bed = TestBed::new(1).unwrap();
    let mut kit = bed.kit();
    let mut cfg = bed.config(json!({"rdma": false, "cniVersion": "1.1.0"}));
    cfg["prevResult"] = json!({
        "cniVersion": "1.1.0",
        "interfaces": [{"name": "eth0", "mac": "02:00:00:00:00:aa", "sandbox": bed.pod.path.display().to_string()}],
        "ips": [{"address": "192.168.5.9/24", "gateway": "192.168.5.1", "interface": 0}],
        "dns": {"nameservers": ["192.168.5.1"]}
    });
    let r = bed
        .call(
            &mut kit,
            &Faults::none(),
            &bed.env("ADD", "c1", "net1"),
            &cfg,
        )
        .ok()
        .unwrap();
    assert_eq!(r["interfaces"][0]["name"], "eth0");
    assert_eq!(r["interfaces"][1]["name"], "net1");
    assert_eq!(r["ips"][0]["interface"], 0);
    assert_eq!(r["ips"][1]["interface"], 1);
    assert_eq!(r["ips"][1]["address"], "10.77.0.2/24");
    assert_eq!(r["dns"]["nameservers"][0], "192.168.5.1");
    // CHECK with that chained result looks at our interface only.
    let mut check = cfg.clone();
    check["prevResult"] = r;
    bed.call(
        &mut kit,
        &Faults::none(),
        &bed.env("CHECK", "c1", "net1"),
        &check,
    )
    .ok();
    bed.call(
        &mut kit,
        &Faults::none(),
        &bed.env("DEL", "c1", "net1"),
        &cfg,
    )
    .ok();
    assert!(bed.leases().is_empty());
}

/// A bed with a soft RDMA device `rxe_t0` over a real macvlan `kvf0` in the
/// host netns (the kind e2e's rxe-over-macvlan "VF").
fn soft_bed() -> TestBed {
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
    bed
}

/// The kind path (an rxe over a macvlan, attached by name). The real
/// kernel deletes the rxe when its netdev leaves the host netns (seen on
/// Linux 7.3 in the VM tier: ADD then failed with code 103): ADD makes it
/// again over net1 in the pod, DEL over kvf0 on the host, and while it is
/// gone from the host's sysfs the netdev is still found by ifindex and MAC.
#[test]
fn soft_device_add_check_del_round_trip() {
    if skip_without_netns("soft_device_add_check_del_round_trip") {
        return;
    }
    use kroce_netlink::rdma::new_link;
    let bed = soft_bed();
    let host_id = bed.host.open().unwrap().id();
    let pod_id = bed.pod.open().unwrap().id();
    let mut kit = bed.kit();
    kit.rdma = RecordingRdma::new(Ok(RdmaNetnsMode::Exclusive))
        .with_soft_device("rxe_t0", 3, &bed.host.open().unwrap(), "kvf0")
        .unwrap();
    let host_before = bed.host.links().unwrap();
    let cfg = bed.config(json!({
        "cniVersion": "1.1.0",
        "deviceID": "rxe_t0",
        "mac": "02:aa:bb:cc:dd:05",
        "mtu": 1400,
        "rdma": true,
        "memlock": "unlimited"
    }));

    let r = bed
        .call(
            &mut kit,
            &Faults::none(),
            &bed.env("ADD", "s1", "net1"),
            &cfg,
        )
        .ok()
        .unwrap();
    assert_eq!(r["interfaces"][0]["name"], "net1");
    assert!(
        r["interfaces"][0].get("pciID").is_none(),
        "a soft device has no PCI address: {r}"
    );
    assert_eq!(r["ips"][0]["address"], "10.77.0.2/24");
    let net1 = bed.pod.link("net1").expect("net1 in pod");
    assert_eq!(net1.mac, "02:aa:bb:cc:dd:05");
    assert_eq!(net1.mtu, 1400);
    assert!(net1.up);
    assert_eq!(bed.pod.addresses("net1").unwrap(), vec!["10.77.0.2/24"]);
    assert!(bed.host.link("kvf0").is_none());
    // No PF side at all; the rxe made again over net1 from inside the pod.
    assert!(kit.vf.sent.is_empty(), "{:?}", kit.vf.sent);
    let made = kit.rdma.creations();
    assert_eq!(made.len(), 1, "{made:?}");
    assert_eq!(
        made[0].sent.payload,
        new_link("rxe_t0", "rxe", "net1").payload()
    );
    assert_eq!(made[0].thread_netns, pod_id);
    assert_eq!(kit.rdma.netns_of("rxe_t0"), Some(pod_id));
    assert!(kit.rdma.moves().is_empty(), "a dead device is never moved");
    // The kernel deleted the host's rxe_t0: its sysfs entry went with it.
    let gone = bed.fixture.root().class_infiniband().join("rxe_t0");
    let kept = bed.fixture.root().class_infiniband().join(".rxe_t0.kept");
    std::fs::rename(&gone, &kept).unwrap();
    // Claim and lock keyed by the device name.
    let files = bed.state_files();
    assert!(files.iter().any(|f| f == "vf/rxe_t0.json"), "{files:?}");
    assert!(files.iter().any(|f| f == "locks/rxe_t0.lock"), "{files:?}");
    assert_eq!(bed.leases(), vec!["10.77.0.2"]);

    // A second attachment of the same device is refused while s1 lives.
    let e = bed
        .call(
            &mut kit,
            &Faults::none(),
            &bed.env("ADD", "s2", "net2"),
            &cfg,
        )
        .err();
    assert_eq!(e.code, code::TRY_AGAIN, "{e}");
    assert!(e.msg.contains("soft RDMA device rxe_t0"), "{e}");

    let mut check_cfg = cfg.clone();
    check_cfg["prevResult"] = r.clone();
    bed.call(
        &mut kit,
        &Faults::none(),
        &bed.env("CHECK", "s1", "net1"),
        &check_cfg,
    )
    .ok();

    for _ in 0..2 {
        bed.call(
            &mut kit,
            &Faults::none(),
            &bed.env("DEL", "s1", "net1"),
            &cfg,
        )
        .ok();
        assert_eq!(bed.host.links().unwrap(), host_before);
        assert_eq!(bed.pod.links().unwrap().len(), 1, "only lo left in the pod");
        assert_eq!(kit.rdma.netns_of("rxe_t0"), Some(host_id));
        assert!(bed.leases().is_empty());
        assert!(bed.state_files().is_empty(), "{:?}", bed.state_files());
    }
    let made = kit.rdma.creations();
    assert_eq!(made.len(), 2, "made again once on the host: {made:?}");
    assert_eq!(
        made[1].sent.payload,
        new_link("rxe_t0", "rxe", "kvf0").payload()
    );
    assert_eq!(made[1].thread_netns, host_id);
    std::fs::rename(&kept, &gone).unwrap();
}

#[test]
fn soft_device_rollback_on_failure() {
    if skip_without_netns("soft_device_rollback_on_failure") {
        return;
    }
    let bed = soft_bed();
    let mut kit = bed.kit();
    let host_before = bed.host.links().unwrap();
    let cfg = bed.config(json!({"deviceID": "rxe_t0", "mtu": 1400, "rdma": false}));
    let e = bed
        .call(
            &mut kit,
            &Faults::fail_at("ipam.add", 0),
            &bed.env("ADD", "s1", "net1"),
            &cfg,
        )
        .err();
    assert_ne!(e.code, 0, "{e}");
    assert_eq!(bed.host.links().unwrap(), host_before);
    assert_eq!(bed.pod.links().unwrap().len(), 1);
    assert!(bed.leases().is_empty());
    assert!(bed.state_files().is_empty(), "{:?}", bed.state_files());
}

#[test]
fn soft_device_refusals_change_nothing() {
    if skip_without_netns("soft_device_refusals_change_nothing") {
        return;
    }
    let bed = soft_bed();
    let mut kit = bed.kit();
    let host_before = bed.host.links().unwrap();
    let cases = [
        (
            json!({"deviceID": "rxe_t0", "vlan": 100}),
            code::INVALID_CONFIG,
            "vlan",
        ),
        (
            json!({"deviceID": "rxe_t0", "max_tx_rate": 10}),
            code::INVALID_CONFIG,
            "max_tx_rate",
        ),
        (
            json!({"deviceID": "../rxe_t0"}),
            code::INVALID_CONFIG,
            "deviceID",
        ),
        (json!({"deviceID": ".."}), code::INVALID_CONFIG, "deviceID"),
        (json!({"deviceID": "rxe_gone"}), code::VF_LOOKUP, "rxe_gone"),
    ];
    for (extra, want, field) in cases {
        let cfg = bed.config(extra.clone());
        let e = bed
            .call(
                &mut kit,
                &Faults::none(),
                &bed.env("ADD", "s1", "net1"),
                &cfg,
            )
            .err();
        assert_eq!(e.code, want, "{extra}: {e}");
        assert!(e.msg.contains(field), "{extra}: {e}");
        if extra.get("vlan").is_some() || extra.get("max_tx_rate").is_some() {
            assert!(e.msg.contains("soft RDMA device"), "{extra}: {e}");
        }
        assert_eq!(bed.host.links().unwrap(), host_before);
        assert!(bed.state_files().is_empty(), "{:?}", bed.state_files());
        assert!(bed.leases().is_empty());
    }
}

#[test]
fn soft_device_gc_releases_stale_attachment() {
    if skip_without_netns("soft_device_gc_releases_stale_attachment") {
        return;
    }
    let bed = soft_bed();
    let mut kit = bed.kit();
    let host_before = bed.host.links().unwrap();
    let cfg = bed.config(json!({"cniVersion": "1.1.0", "deviceID": "rxe_t0", "rdma": false}));
    bed.call(
        &mut kit,
        &Faults::none(),
        &bed.env("ADD", "s1", "net1"),
        &cfg,
    )
    .ok();
    assert!(bed.pod.link("net1").is_some());

    let mut gc_cfg = bed.config(json!({"cniVersion": "1.1.0", "rdma": false}));
    gc_cfg["cni.dev/valid-attachments"] = json!([]);
    let mut env_gc = std::collections::HashMap::new();
    env_gc.insert("CNI_COMMAND".to_string(), "GC".to_string());
    env_gc.insert("CNI_PATH".to_string(), "/usr/lib/cni".to_string());
    bed.call(&mut kit, &Faults::none(), &env_gc, &gc_cfg).ok();
    assert_eq!(bed.host.links().unwrap(), host_before);
    assert!(bed.pod.link("net1").is_none());
    assert!(bed.leases().is_empty());
    assert!(bed.state_files().is_empty(), "{:?}", bed.state_files());
}

/// Where in `journal` the first entry equal to `op` is.
fn at(journal: &[String], op: &str) -> usize {
    journal
        .iter()
        .position(|j| j == op)
        .unwrap_or_else(|| panic!("{op} not in {journal:?}"))
}

/// host-local does not need the link: it runs (its own process) while the
/// VF moves into the pod on ADD and out of it on DEL. A `dhcp` delegate
/// runs DHCP on the pod's interface, so it starts only once the VF is
/// there (ADD) and after it left (DEL), as before.
#[test]
fn ipam_runs_while_the_vf_moves_unless_it_needs_the_link() {
    if skip_without_netns("ipam_runs_while_the_vf_moves_unless_it_needs_the_link") {
        return;
    }
    let bed = TestBed::new(1).unwrap();
    let mut kit = kit_with_rdma(&bed);
    let cfg = bed.config(json!({}));

    let add = Faults::none();
    bed.call(&mut kit, &add, &bed.env("ADD", "c1", "net1"), &cfg)
        .ok()
        .unwrap();
    let j = add.journal();
    assert!(
        at(&j, "ipam.start.ADD") < at(&j, "links.move_to")
            && at(&j, "links.move_to") < at(&j, "ipam.done.ADD"),
        "{j:?}"
    );
    assert_eq!(bed.pod.addresses("net1").unwrap(), vec!["10.77.0.2/24"]);
    let del = Faults::none();
    bed.call(&mut kit, &del, &bed.env("DEL", "c1", "net1"), &cfg)
        .ok();
    let j = del.journal();
    assert!(
        at(&j, "ipam.start.DEL") < at(&j, "links.move_to")
            && at(&j, "links.move_to") < at(&j, "ipam.done.DEL"),
        "{j:?}"
    );
    assert!(bed.leases().is_empty(), "{:?}", bed.leases());

    // A stand-in `dhcp` (only its place in the order is under test).
    let bin = tempfile::tempdir().unwrap();
    let dhcp = bin.path().join("dhcp");
    std::fs::write(
        &dhcp,
        "#!/bin/sh\ncat >/dev/null\ncase \"$CNI_COMMAND\" in\n\
         VERSION) echo '{\"cniVersion\":\"1.0.0\",\"supportedVersions\":[\"0.4.0\",\"1.0.0\"]}';;\n\
         ADD) echo '{\"cniVersion\":\"1.0.0\",\"ips\":[{\"address\":\"10.79.0.5/24\"}]}';;\n\
         esac\n",
    )
    .unwrap();
    std::fs::set_permissions(&dhcp, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let cfg = bed.config(json!({"ipam": {"type": "dhcp"}}));
    let env = |cmd| {
        let mut e = bed.env(cmd, "c2", "net1");
        let path = format!("{}:{}", bin.path().display(), e["CNI_PATH"]);
        e.insert("CNI_PATH".into(), path);
        e
    };
    let add = Faults::none();
    bed.call(&mut kit, &add, &env("ADD"), &cfg).ok().unwrap();
    let j = add.journal();
    assert!(at(&j, "links.move_to") < at(&j, "ipam.start.ADD"), "{j:?}");
    assert_eq!(bed.pod.addresses("net1").unwrap(), vec!["10.79.0.5/24"]);
    let del = Faults::none();
    bed.call(&mut kit, &del, &env("DEL"), &cfg).ok();
    let j = del.journal();
    assert!(at(&j, "links.move_to") < at(&j, "ipam.start.DEL"), "{j:?}");
}

/// An IPAM plugin removed after ADD (a package upgrade gone wrong): DEL
/// still gives the VF back (the lease it gave stays in its store, with a
/// warning) instead of keeping the VF claimed for every later ADD.
#[test]
fn del_without_its_ipam_plugin_still_frees_the_vf() {
    if skip_without_netns("del_without_its_ipam_plugin_still_frees_the_vf") {
        return;
    }
    let bed = TestBed::new(1).unwrap();
    let mut kit = kit_with_rdma(&bed);
    let before = bed.host.links().unwrap();
    let bin = tempfile::tempdir().unwrap();
    let real = std::path::Path::new(&bed.env("ADD", "c", "n")["CNI_PATH"]).join("host-local");
    std::os::unix::fs::symlink(&real, bin.path().join("vanishing-ipam")).unwrap();
    let mut ipam = bed.config(json!({}))["ipam"].clone();
    ipam["type"] = json!("vanishing-ipam");
    let cfg = bed.config(json!({ "ipam": ipam }));
    let env = |cmd| {
        let mut e = bed.env(cmd, "c1", "net1");
        e.insert("CNI_PATH".into(), bin.path().display().to_string());
        e
    };
    bed.call(&mut kit, &Faults::none(), &env("ADD"), &cfg)
        .ok()
        .unwrap();
    std::fs::remove_file(bin.path().join("vanishing-ipam")).unwrap();
    let del = bed.call(&mut kit, &Faults::none(), &env("DEL"), &cfg);
    assert!(
        del.warnings.iter().any(|w| w.contains("vanishing-ipam")),
        "{:?}",
        del.warnings
    );
    del.ok();
    assert_eq!(bed.host.links().unwrap(), before);
    assert!(bed.state_files().is_empty(), "{:?}", bed.state_files());
    // The VF is free for the next pod.
    bed.call(
        &mut kit,
        &Faults::none(),
        &bed.env("ADD", "c2", "net1"),
        &bed.config(json!({})),
    )
    .ok()
    .unwrap();
}

/// igb as measured in the VM tier (`RecordingVfConfig::igb`): with `mac`
/// set, DEL restored the PF side first and left an admin MAC with trust off,
/// after which igb refused the VF netdev's own MAC (EADDRNOTAVAIL): DEL
/// failed for good and the claim stayed. Now the PF-side MAC is cleared
/// first, the netdev gets its own MAC back, and the PF reports it again.
#[test]
fn igb_del_with_mac_restores_everything_and_frees_the_vf() {
    if skip_without_netns("igb_del_with_mac_restores_everything_and_frees_the_vf") {
        return;
    }
    let bed = TestBed::new(1).unwrap();
    let mut kit = bed.kit();
    let igb = Faults::none();
    let own = "02:00:3b:00:02:42".parse().unwrap();
    kit.vf = RecordingVfConfig::igb(&[("ens1f0", 4, 8), ("ens2f0", 5, 8)], &[own], igb.clone());
    let pf_before = kit.vf.state("ens1f0", 0).unwrap();
    let host_before = bed.host.links().unwrap();
    let cfg = bed.config(json!({
        "mac": "0a:55:c2:28:c8:90", "vlan": 100, "vlanQoS": 3,
        "spoofchk": "off", "trust": "on", "max_tx_rate": 100, "rdma": false
    }));
    bed.call(&mut kit, &igb, &bed.env("ADD", "c1", "net1"), &cfg)
        .ok()
        .expect("ADD");
    let during = kit.vf.state("ens1f0", 0).unwrap();
    assert_eq!(during.mac.to_string(), "0a:55:c2:28:c8:90");
    for _ in 0..2 {
        let r = bed.call(&mut kit, &igb, &bed.env("DEL", "c1", "net1"), &cfg);
        assert!(r.result.is_ok(), "DEL: {:?}", r.result.err());
    }
    assert_eq!(kit.vf.state("ens1f0", 0).unwrap(), pf_before);
    assert!(!igb.vf_mac_locked(), "an admin MAC is left on the VF");
    assert_eq!(bed.host.links().unwrap(), host_before);
    assert!(
        bed.state_files().iter().all(|f| !f.contains("vf/")),
        "{:?}",
        bed.state_files()
    );
}

/// igb learns the VF's own MAC over the VF-PF mailbox, and igbvf ignores
/// a timed-out mailbox: the netdev has its MAC back, the PF does not (and
/// the VF would get no unicast). DEL sees it and sets the MAC once more.
#[test]
fn igb_del_sets_the_vf_mac_again_when_the_pf_missed_it() {
    if skip_without_netns("igb_del_sets_the_vf_mac_again_when_the_pf_missed_it") {
        return;
    }
    let bed = TestBed::new(1).unwrap();
    let mut kit = bed.kit();
    let igb = Faults::none();
    let own: kroce_cni::addr::Mac = "02:00:3b:00:02:42".parse().unwrap();
    kit.vf = RecordingVfConfig::igb(&[("ens1f0", 4, 8), ("ens2f0", 5, 8)], &[own], igb.clone());
    let pf_before = kit.vf.state("ens1f0", 0).unwrap();
    let cfg = bed.config(json!({"mac": "0a:55:c2:28:c8:90", "trust": "on", "rdma": false}));
    bed.call(&mut kit, &igb, &bed.env("ADD", "c1", "net1"), &cfg)
        .ok()
        .expect("ADD");
    igb.lose_vf_mac_learns(own, 1);
    let r = bed.call(&mut kit, &igb, &bed.env("DEL", "c1", "net1"), &cfg);
    assert!(r.result.is_ok(), "DEL: {:?}", r.result.err());
    assert_eq!(kit.vf.state("ens1f0", 0).unwrap(), pf_before);
}

/// igb refuses a link state (EOPNOTSUPP), 802.1ad and a min rate: the
/// rollback restores only what was changed (the link state never was) and
/// leaves no admin MAC behind (the VF can still set its own MAC).
#[test]
fn igb_refusals_roll_back_only_what_changed() {
    if skip_without_netns("igb_refusals_roll_back_only_what_changed") {
        return;
    }
    let bed = TestBed::new(1).unwrap();
    let own = "02:00:3b:00:02:42".parse().unwrap();
    for extra in [
        json!({"link_state": "enable"}),
        json!({"vlanProto": "802.1ad"}),
        json!({"min_tx_rate": 10, "max_tx_rate": 100}),
    ] {
        let mut kit = bed.kit();
        let igb = Faults::none();
        kit.vf = RecordingVfConfig::igb(&[("ens1f0", 4, 8), ("ens2f0", 5, 8)], &[own], igb.clone());
        let pf_before = kit.vf.state("ens1f0", 0).unwrap();
        let host_before = bed.host.links().unwrap();
        let mut cfg = bed.config(json!({"mac": "0a:55:c2:28:c8:91", "vlan": 100, "rdma": false}));
        for (k, v) in extra.as_object().unwrap() {
            cfg[k] = v.clone();
        }
        let e = bed
            .call(&mut kit, &igb, &bed.env("ADD", "c1", "net1"), &cfg)
            .err();
        // (802.1ad: the fixture's PF driver is mlx5_core, refused up front.)
        assert!(matches!(e.code, code::VF_CONFIG | 2), "{extra}: {e}");
        assert!(e.details.is_none(), "{extra}: rollback incomplete: {e}");
        assert_eq!(kit.vf.state("ens1f0", 0).unwrap(), pf_before, "{extra}");
        assert!(
            !igb.vf_mac_locked(),
            "{extra}: an admin MAC is left on the VF"
        );
        assert_eq!(bed.host.links().unwrap(), host_before, "{extra}");
        assert!(
            bed.state_files().iter().all(|f| !f.contains("vf/")),
            "{extra}: {:?}",
            bed.state_files()
        );
    }
}

/// A bed with an igb PF (QEMU's 82576: VFs without an RDMA device of their
/// own) whose VF 0 netdev `eth1v0` is a real veth in the host netns carrying
/// a soft-RoCE device `rxe_vf0` (`rdma link add rxe_vf0 type rxe netdev
/// eth1v0`), as in the VM tier. Returns the bed and the VF's PCI address.
fn rxe_on_vf_bed() -> (TestBed, String) {
    let mut bed = TestBed::new(0).unwrap();
    bed.fixture
        .add_pf(sriov_helpers::fixture::PfSpec::igb(
            "0000:81:00.0",
            "eth1",
            Some(1),
            1,
        ))
        .unwrap();
    let pf = "0000:81:00.0".parse().unwrap();
    let vf = bed.fixture.vf_address(&pf, 0).unwrap().to_string();
    assert_eq!(
        bed.fixture.add_rxe_on_vf("rxe_vf0", &pf, 0).unwrap(),
        "eth1v0"
    );
    bed.host
        .ip(&[
            "link", "add", "eth1v0", "type", "veth", "peer", "name", "eth1p0",
        ])
        .unwrap();
    (bed, vf)
}

fn rxe_kernel(bed: &TestBed, mode: RdmaNetnsMode) -> RecordingRdma {
    RecordingRdma::new(Ok(mode))
        .with_soft_device("rxe_vf0", 4, &bed.host.open().unwrap(), "eth1v0")
        .unwrap()
}

/// Issue 25 2(c): the kernel deletes an rxe when its netdev leaves the netns.
/// ADD of the VF makes it again over net1 from inside the pod netns (moved
/// there when the kernel made it in the host netns), DEL makes it again on
/// the host over the original netdev name; `rdma: auto` sees it as the VF's
/// RDMA device. Before: ADD succeeded without RDMA and the rxe was gone.
#[test]
fn rxe_on_a_vf_is_made_again_in_the_pod_and_back_on_the_host() {
    if skip_without_netns("rxe_on_a_vf_is_made_again_in_the_pod_and_back_on_the_host") {
        return;
    }
    use kroce_netlink::rdma::{RDMA_NLDEV_CMD_SET, new_link, nldev_type};
    for (policy, made_on_host, mode) in [
        (json!("auto"), false, RdmaNetnsMode::Exclusive),
        (json!(true), true, RdmaNetnsMode::Exclusive),
        (json!("auto"), false, RdmaNetnsMode::Shared),
    ] {
        let (bed, vf) = rxe_on_vf_bed();
        let host_id = bed.host.open().unwrap().id();
        let pod_id = bed.pod.open().unwrap().id();
        let mut kit = bed.kit();
        kit.rdma = rxe_kernel(&bed, mode);
        if made_on_host {
            kit.rdma.created_in = Some(host_id);
        }
        let host_before = bed.host.links().unwrap();
        let cfg = bed.config(json!({"deviceID": vf, "rdma": policy}));
        let r = bed.call(
            &mut kit,
            &Faults::none(),
            &bed.env("ADD", "c1", "net1"),
            &cfg,
        );
        assert!(
            r.warnings.iter().all(|w| !w.contains("rxe_vf0")),
            "{:?}",
            r.warnings
        );
        r.ok().expect("ADD");
        let want = if made_on_host { host_id } else { pod_id };
        let made = kit.rdma.creations();
        assert_eq!(made.len(), 1, "{policy}: {made:?}");
        assert_eq!(
            made[0].sent.payload,
            new_link("rxe_vf0", "rxe", "net1").payload(),
            "{policy}"
        );
        assert_eq!(
            made[0].thread_netns, pod_id,
            "sent from inside the pod netns"
        );
        assert!(made[0].errno.is_none(), "{made:?}");
        let at = kit.rdma.netns_of("rxe_vf0");
        if mode == RdmaNetnsMode::Exclusive {
            assert_eq!(at, Some(pod_id), "{policy}: rxe_vf0 in the pod netns");
        } else {
            assert_eq!(at, Some(want), "{policy}: rxe_vf0 exists (shared mode)");
        }
        let moves = kit.rdma.moves().len();
        assert_eq!(
            moves,
            usize::from(made_on_host),
            "moved only when made on the host"
        );
        for _ in 0..2 {
            let r = bed.call(
                &mut kit,
                &Faults::none(),
                &bed.env("DEL", "c1", "net1"),
                &cfg,
            );
            assert!(r.result.is_ok(), "DEL: {:?}", r.result.err());
        }
        assert_eq!(bed.host.links().unwrap(), host_before);
        assert_eq!(
            kit.rdma.netns_of("rxe_vf0"),
            Some(host_id),
            "{policy}: back on the host"
        );
        let made = kit.rdma.creations();
        assert_eq!(made.len(), 2, "{made:?}");
        assert_eq!(
            made[1].sent.payload,
            new_link("rxe_vf0", "rxe", "eth1v0").payload()
        );
        assert_eq!(made[1].thread_netns, host_id);
        // Nothing moved the dead device back first.
        assert_eq!(
            kit.rdma
                .calls
                .iter()
                .filter(|c| c.sent.msg_type == nldev_type(RDMA_NLDEV_CMD_SET))
                .count(),
            moves
        );
        assert!(bed.state_files().iter().all(|f| !f.contains("vf/")));
    }
}

/// With `rdma: false` the kernel still deletes the rxe at the move: ADD says
/// so, DEL makes it again on the host.
#[test]
fn rxe_on_a_vf_with_rdma_false_is_warned_and_made_again_at_del() {
    if skip_without_netns("rxe_on_a_vf_with_rdma_false_is_warned_and_made_again_at_del") {
        return;
    }
    let (bed, vf) = rxe_on_vf_bed();
    let host_id = bed.host.open().unwrap().id();
    let mut kit = bed.kit();
    kit.rdma = rxe_kernel(&bed, RdmaNetnsMode::Exclusive);
    let cfg = bed.config(json!({"deviceID": vf, "rdma": false}));
    let r = bed.call(
        &mut kit,
        &Faults::none(),
        &bed.env("ADD", "c1", "net1"),
        &cfg,
    );
    assert!(
        r.warnings
            .iter()
            .any(|w| w.contains("rxe_vf0") && w.contains(&vf)),
        "{:?}",
        r.warnings
    );
    r.ok().expect("ADD");
    assert_eq!(kit.rdma.netns_of("rxe_vf0"), None);
    let r = bed.call(
        &mut kit,
        &Faults::none(),
        &bed.env("DEL", "c1", "net1"),
        &cfg,
    );
    assert!(r.result.is_ok(), "DEL: {:?}", r.result.err());
    assert_eq!(kit.rdma.netns_of("rxe_vf0"), Some(host_id));
}

/// The recreate in the pod fails: ADD fails with code 103 naming the VF and
/// the rxe and what to do; the rollback gives the VF back and makes the rxe
/// again on the host.
#[test]
fn rxe_recreate_failure_rolls_back_and_restores_the_rxe_on_the_host() {
    if skip_without_netns("rxe_recreate_failure_rolls_back_and_restores_the_rxe_on_the_host") {
        return;
    }
    let (bed, vf) = rxe_on_vf_bed();
    let host_id = bed.host.open().unwrap().id();
    let mut kit = bed.kit();
    kit.rdma = rxe_kernel(&bed, RdmaNetnsMode::Exclusive);
    let host_before = bed.host.links().unwrap();
    let cfg = bed.config(json!({"deviceID": vf, "rdma": "auto"}));
    let faults = Faults::fail_at("rdma.add_link", 0);
    let e = bed
        .call(&mut kit, &faults, &bed.env("ADD", "c1", "net1"), &cfg)
        .err();
    assert!(faults.fired());
    assert_eq!(e.code, code::RDMA, "{e}");
    for part in [vf.as_str(), "rxe_vf0", "rdma: false"] {
        assert!(e.msg.contains(part), "{part}: {e}");
    }
    assert_eq!(bed.host.links().unwrap(), host_before);
    assert_eq!(kit.rdma.netns_of("rxe_vf0"), Some(host_id));
    assert!(bed.state_files().iter().all(|f| !f.contains("vf/")));
    assert!(bed.leases().is_empty());
}

/// Issue 25: a soft-device ADD moved the netdev of a VF whose claim was
/// stale. The VF's claim (here from a pod whose netns died, the netdev back
/// on the host) makes a soft-device ADD over that netdev refuse, before
/// anything moves.
#[test]
fn soft_device_add_honours_the_vfs_claim() {
    if skip_without_netns("soft_device_add_honours_the_vfs_claim") {
        return;
    }
    let (mut bed, vf) = rxe_on_vf_bed();
    let mut kit = bed.kit();
    kit.rdma = RecordingRdma::new(Ok(RdmaNetnsMode::Exclusive));
    let cfg = bed.config(json!({"deviceID": vf, "rdma": false}));
    bed.call(
        &mut kit,
        &Faults::none(),
        &bed.env("ADD", "c1", "net1"),
        &cfg,
    )
    .ok()
    .expect("ADD");
    bed.pod
        .ip(&[
            "link",
            "set",
            "net1",
            "netns",
            &bed.host.name,
            "name",
            "eth1v0",
        ])
        .unwrap();
    bed.pod.delete().unwrap();
    let other =
        NetnsGuard::create(&format!("kco{}", kroce_cni::testing::testbed::unique_tag())).unwrap();
    let host_before = bed.host.links().unwrap();
    let mut env = bed.env("ADD", "c2", "net1");
    env.insert("CNI_NETNS".into(), other.path.display().to_string());
    let soft = bed.config(json!({"deviceID": "rxe_vf0", "rdma": false}));
    let e = bed.call(&mut kit, &Faults::none(), &env, &soft).err();
    assert_eq!(e.code, code::TRY_AGAIN, "{e}");
    for part in [vf.as_str(), "rxe_vf0", "eth1v0", "c1", "dead netns"] {
        assert!(e.msg.contains(part), "{part}: {e}");
    }
    assert_eq!(bed.host.links().unwrap(), host_before, "nothing moved");
    assert!(other.links().unwrap().iter().all(|l| l.name != "net1"));
}
