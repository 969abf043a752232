#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `doctor` against fixture hosts: a healthy ConnectX host passes, and each
//! check fails on the damage it is about.

use kroce_admission::doctor::{
    CheckResult, DoctorError, DoctorOptions, DoctorReport, MemlockLimit, NetState, Status, names,
    run,
};
use sriov_helpers::fixture::{FixtureHost, LinkLayer, PfSpec};
use sriov_helpers::{Host, PciAddress};
use std::net::Ipv4Addr;
use std::path::Path;

fn write(path: &Path, content: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, content).unwrap();
}

/// What the fixture host lacks for a healthy RoCE node: ECN enabled on
/// priority 3 for both PFs, and a few ordinary processes in proc.
fn healthy() -> FixtureHost {
    let fx = FixtureHost::connectx6dx_pair().unwrap();
    for pf in ["ens1f0", "ens2f0"] {
        set_ecn(&fx, pf, "roce_np", 3, "1");
        set_ecn(&fx, pf, "roce_rp", 3, "1");
        // Other priorities exist too, off.
        set_ecn(&fx, pf, "roce_np", 0, "0");
    }
    for (pid, comm) in [(1, "systemd"), (812, "kubelet"), (901, "containerd")] {
        write(
            &fx.path().join(format!("proc/{pid}/comm")),
            &format!("{comm}\n"),
        );
    }
    write(&fx.path().join("proc/self/comm"), "doctor\n");
    fx.add_ipv4_gid("mlx5_1", 2, Ipv4Addr::new(10, 0, 0, 5), "ens1f0v0")
        .unwrap();
    fx
}

fn set_ecn(fx: &FixtureHost, pf: &str, side: &str, prio: u8, v: &str) {
    write(
        &fx.path()
            .join(format!("sys/class/net/{pf}/ecn/{side}/enable/{prio}")),
        &format!("{v}\n"),
    );
}

fn set_mtu(fx: &FixtureHost, ifname: &str, mtu: u32) {
    write(
        &fx.path().join(format!("sys/class/net/{ifname}/mtu")),
        &format!("{mtu}\n"),
    );
}

const OPEN_RULESET: &str = "*filter\n:INPUT DROP [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n-A INPUT -i lo -j ACCEPT\n-A INPUT -p udp -m udp --dport 4791 -j ACCEPT\nCOMMIT\n";
const DROP_RULESET: &str = "*filter\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n-A INPUT -p udp -m udp --dport 4791 -j DROP\nCOMMIT\n";

fn good_net() -> NetState {
    let mut n = NetState::default();
    n.ipv4
        .insert("ens1f0v0".into(), vec![Ipv4Addr::new(10, 0, 0, 5)]);
    n.pfc_enabled.insert("ens1f0".into(), vec![3]);
    n.pfc_enabled.insert("ens2f0".into(), vec![3]);
    n.memlock = Some(MemlockLimit::Unlimited);
    n.firewall_ruleset = Some(OPEN_RULESET.into());
    n
}

fn check<'a>(r: &'a DoctorReport, name: &str, subject: &str) -> &'a CheckResult {
    r.checks
        .iter()
        .find(|c| c.name == name && c.subject == subject)
        .unwrap_or_else(|| panic!("no {name} check for {subject}:\n{}", r.render_table()))
}

fn doctor(fx: &FixtureHost, net: &NetState) -> DoctorReport {
    run(&fx.root(), net, &DoctorOptions::default()).unwrap()
}

#[test]
fn healthy_connectx_host_passes_every_check_it_can_judge() {
    let fx = healthy();
    let r = doctor(&fx, &good_net());
    let table = r.render_table();
    assert_eq!(r.count(Status::Fail), 0, "{table}");
    assert_eq!(r.count(Status::Warn), 0, "{table}");
    // Six per-PF checks for two PFs, three node-wide.
    assert_eq!(r.checks.len(), 15, "{table}");
    let gid = check(&r, names::ROCE_V2_GID, "ens1f0");
    assert_eq!(gid.status, Status::Pass);
    assert!(
        gid.evidence.contains("10.0.0.5: mlx5_1 port 1 GID index 3"),
        "{}",
        gid.evidence
    );
    // ens2f0's VFs have no address here.
    assert_eq!(check(&r, names::ROCE_V2_GID, "ens2f0").status, Status::Skip);
    let link = check(&r, names::LINK, "ens1f0");
    assert!(
        link.evidence.contains("9 ports") && link.evidence.contains("and 8 VFs"),
        "{}",
        link.evidence
    );
    let mtu = check(&r, names::MTU, "ens1f0");
    assert!(
        mtu.evidence.contains("MTU 9000 -> RoCE 4096 (ens1f0)"),
        "{}",
        mtu.evidence
    );
    assert!(
        mtu.evidence.contains("MTU 1500 -> RoCE 1024 (8 netdevs)"),
        "{}",
        mtu.evidence
    );
    let irq = check(&r, names::IRQ_NUMA, "ens2f0");
    assert!(irq.evidence.contains("16-31"), "{}", irq.evidence);
    assert_eq!(
        check(&r, names::ECN, "ens1f0").evidence,
        "roce_np/enable/3=1, roce_rp/enable/3=1"
    );
    assert_eq!(check(&r, names::PFC, "ens2f0").status, Status::Pass);
    assert_eq!(check(&r, names::IRQBALANCE, "node").status, Status::Pass);
    assert_eq!(check(&r, names::UDP_4791, "node").status, Status::Pass);
    assert_eq!(check(&r, names::MEMLOCK, "node").status, Status::Pass);
    assert_eq!(r.worst(), Status::Skip);
}

#[test]
fn link_down_and_infiniband_fail() {
    let fx = healthy();
    fx.set_port_state("mlx5_3", "1: DOWN").unwrap();
    let r = doctor(&fx, &good_net());
    let c = check(&r, names::LINK, "ens1f0");
    assert_eq!(c.status, Status::Fail);
    assert!(
        c.evidence.contains("mlx5_3 (ens1f0v2) port 1 state DOWN"),
        "{}",
        c.evidence
    );
    assert!(c.hint.as_deref().unwrap().contains("ACTIVE"));
    assert_eq!(check(&r, names::LINK, "ens2f0").status, Status::Pass);

    let mut fx = FixtureHost::new().unwrap();
    fx.add_numa_node(0, "0-7").unwrap();
    let mut spec = PfSpec::connectx6dx("0000:5e:00.0", "ib0", Some(0), 1);
    spec.link_layer = LinkLayer::InfiniBand;
    fx.add_pf(spec).unwrap();
    let r = doctor(&fx, &NetState::default());
    let c = check(&r, names::LINK, "ib0");
    assert_eq!(c.status, Status::Fail);
    assert!(
        c.evidence.contains("link layer InfiniBand (not RoCE)"),
        "{}",
        c.evidence
    );
}

#[test]
fn missing_roce_v2_gid_fails_and_reports_non_default_indexes() {
    let fx = healthy();
    // The second VF has an address but the kernel has no GID for it.
    let mut net = good_net();
    net.ipv4
        .insert("ens1f0v1".into(), vec![Ipv4Addr::new(10, 0, 0, 6)]);
    let r = doctor(&fx, &net);
    let c = check(&r, names::ROCE_V2_GID, "ens1f0");
    assert_eq!(c.status, Status::Fail);
    assert!(
        c.evidence
            .contains("ens1f0v1 10.0.0.6: no RoCE v2 GID on mlx5_2"),
        "{}",
        c.evidence
    );
    assert!(c.hint.as_deref().unwrap().contains("never a fixed one"));

    // A GID at an unusual index is found and reported as it is.
    fx.add_ipv4_gid("mlx5_2", 6, Ipv4Addr::new(10, 0, 0, 6), "ens1f0v1")
        .unwrap();
    let r = doctor(&fx, &net);
    let c = check(&r, names::ROCE_V2_GID, "ens1f0");
    assert_eq!(c.status, Status::Pass, "{}", c.evidence);
    assert!(
        c.evidence.contains("10.0.0.6: mlx5_2 port 1 GID index 7"),
        "{}",
        c.evidence
    );
}

#[test]
fn mtu_mismatches_fail_and_header_step_down_warns() {
    let fx = healthy();
    set_mtu(&fx, "ens1f0", 1500);
    set_mtu(&fx, "ens1f0v3", 9000);
    let r = doctor(&fx, &good_net());
    let c = check(&r, names::MTU, "ens1f0");
    assert_eq!(c.status, Status::Fail);
    assert!(
        c.evidence
            .contains("VF ens1f0v3 MTU 9000 > PF ens1f0 MTU 1500"),
        "{}",
        c.evidence
    );

    let fx = healthy();
    set_mtu(&fx, "ens2f0", 4096);
    let r = doctor(&fx, &good_net());
    let c = check(&r, names::MTU, "ens2f0");
    assert_eq!(c.status, Status::Warn);
    assert!(
        c.evidence
            .contains("ens2f0 MTU 4096 gives RoCE MTU 2048, not 4096"),
        "{}",
        c.evidence
    );
    assert!(c.evidence.contains("MTU >= 4192"), "{}", c.evidence);

    // An observed active MTU that disagrees with the netdev.
    let fx = healthy();
    let mut net = good_net();
    net.active_mtu.insert("mlx5_0".into(), 1024);
    let r = doctor(&fx, &net);
    let c = check(&r, names::MTU, "ens1f0");
    assert_eq!(c.status, Status::Fail);
    assert!(
        c.evidence
            .contains("mlx5_0 active MTU 1024 but ens1f0 MTU 9000 gives 4096"),
        "{}",
        c.evidence
    );
    net.active_mtu.insert("mlx5_0".into(), 4096);
    assert_eq!(
        check(&doctor(&fx, &net), names::MTU, "ens1f0").status,
        Status::Pass
    );

    // Too small for any RoCE MTU.
    let fx = healthy();
    set_mtu(&fx, "ens2f0v0", 300);
    let c = doctor(&fx, &good_net());
    let c = check(&c, names::MTU, "ens2f0");
    assert_eq!(c.status, Status::Fail);
    assert!(
        c.evidence.contains("ens2f0v0 MTU 300 is below 352 bytes"),
        "{}",
        c.evidence
    );
}

#[test]
fn pfc_off_on_the_roce_priority_fails_extra_priorities_warn() {
    let fx = healthy();
    let mut net = good_net();
    net.pfc_enabled.insert("ens1f0".into(), vec![]);
    net.pfc_enabled.insert("ens2f0".into(), vec![4, 3, 3]);
    let r = doctor(&fx, &net);
    let c = check(&r, names::PFC, "ens1f0");
    assert_eq!(c.status, Status::Fail);
    assert_eq!(
        c.evidence,
        "PFC is off on RoCE priority 3 (enabled on: none)"
    );
    let c = check(&r, names::PFC, "ens2f0");
    assert_eq!(c.status, Status::Warn);
    assert!(c.evidence.contains("also on 4"), "{}", c.evidence);
    // Another RoCE priority configured.
    let r = run(
        &fx.root(),
        &net,
        &DoctorOptions {
            roce_priority: 4,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(
        check(&r, names::PFC, "ens2f0")
            .evidence
            .contains("also on 3")
    );
    // Not provided: skipped, not guessed.
    net.pfc_enabled.clear();
    assert_eq!(
        check(&doctor(&fx, &net), names::PFC, "ens1f0").status,
        Status::Skip
    );
}

#[test]
fn ecn_off_missing_or_garbled_fails_with_the_file() {
    let fx = healthy();
    set_ecn(&fx, "ens1f0", "roce_rp", 3, "0");
    set_ecn(&fx, "ens2f0", "roce_np", 3, "yes");
    let r = doctor(&fx, &good_net());
    let c = check(&r, names::ECN, "ens1f0");
    assert_eq!(c.status, Status::Fail);
    assert_eq!(c.evidence, "roce_rp/enable/3=0");
    let c = check(&r, names::ECN, "ens2f0");
    assert_eq!(c.status, Status::Fail);
    assert!(
        c.evidence.contains("ecn/roce_np/enable/3 holds \"yes\""),
        "{}",
        c.evidence
    );
    // Priority 5 was never written.
    let r = run(
        &fx.root(),
        &good_net(),
        &DoctorOptions {
            roce_priority: 5,
            ..Default::default()
        },
    )
    .unwrap();
    let c = check(&r, names::ECN, "ens1f0");
    assert_eq!(c.status, Status::Fail);
    assert!(c.evidence.contains("roce_np/enable/5"), "{}", c.evidence);
    // No ecn directory at all: the driver has none.
    let fx = FixtureHost::connectx6dx_pair().unwrap();
    assert_eq!(
        check(&doctor(&fx, &good_net()), names::ECN, "ens1f0").status,
        Status::Skip
    );
}

#[test]
fn irqs_off_their_numa_node_fail_but_the_control_vector_is_ignored() {
    let fx = healthy();
    let host = Host::scan(&fx.root());
    let vf: PciAddress = "0000:3b:00.2".parse().unwrap();
    let irqs = host.pci[&vf].msi_irqs.clone();
    assert!(irqs.len() >= 2);
    // The control vector elsewhere is fine.
    write(
        &fx.path()
            .join(format!("proc/irq/{}/smp_affinity_list", irqs[0])),
        "16-31\n",
    );
    assert_eq!(
        check(&doctor(&fx, &good_net()), names::IRQ_NUMA, "ens1f0").status,
        Status::Pass
    );
    // A data vector on the other node is not.
    write(
        &fx.path()
            .join(format!("proc/irq/{}/smp_affinity_list", irqs[1])),
        "16-31\n",
    );
    let r = doctor(&fx, &good_net());
    let c = check(&r, names::IRQ_NUMA, "ens1f0");
    assert_eq!(c.status, Status::Fail);
    assert_eq!(
        c.evidence,
        format!(
            "IRQ {} of 0000:3b:00.2 on CPUs 16-31, local CPUs 0-15",
            irqs[1]
        )
    );
    assert_eq!(check(&r, names::IRQ_NUMA, "ens2f0").status, Status::Pass);

    let fx = FixtureHost::unknown_numa().unwrap();
    let r = doctor(&fx, &NetState::default());
    let c = check(&r, names::IRQ_NUMA, "enp5s0f0np0");
    assert_eq!(c.status, Status::Warn);
    assert!(
        c.evidence.contains("firmware reports no NUMA node"),
        "{}",
        c.evidence
    );
}

#[test]
fn memlock_irqbalance_and_firewall() {
    let fx = healthy();
    let mut net = good_net();
    net.memlock = Some(MemlockLimit::Bytes(8 * 1024 * 1024));
    net.firewall_ruleset = Some(DROP_RULESET.into());
    write(&fx.path().join("proc/4321/comm"), "irqbalance\n");
    let r = doctor(&fx, &net);
    let m = check(&r, names::MEMLOCK, "node");
    assert_eq!(m.status, Status::Fail);
    assert_eq!(
        m.evidence,
        "memlock 8 MiB < required 64 MiB: RDMA memory registration will fail"
    );
    let i = check(&r, names::IRQBALANCE, "node");
    assert_eq!(i.status, Status::Warn);
    assert!(i.evidence.contains("pid 4321"), "{}", i.evidence);
    assert!(
        i.hint
            .as_deref()
            .unwrap()
            .contains("IRQBALANCE_BANNED_CPULIST")
    );
    // Hardware RoCE bypasses netfilter: a warning only.
    let f = check(&r, names::UDP_4791, "node");
    assert_eq!(f.status, Status::Warn);
    assert!(f.evidence.contains("line 4"), "{}", f.evidence);

    // With a soft-RoCE device the same ruleset breaks RDMA.
    let mut fx = healthy();
    fx.add_rxe("rxe0", "eth0").unwrap();
    let r = doctor(&fx, &net);
    assert_eq!(check(&r, names::UDP_4791, "node").status, Status::Fail);
    // The rxe device is checked on its own; it has no DCQCN.
    assert_eq!(check(&r, names::ECN, "eth0").status, Status::Skip);
    assert_eq!(check(&r, names::LINK, "eth0").status, Status::Pass);

    // Not provided: skipped.
    let r = doctor(&fx, &NetState::default());
    assert_eq!(check(&r, names::MEMLOCK, "node").status, Status::Skip);
    assert_eq!(check(&r, names::UDP_4791, "node").status, Status::Skip);
    // Enough, but finite.
    net.memlock = Some(MemlockLimit::Bytes(128 * 1024 * 1024));
    assert_eq!(
        check(&doctor(&fx, &net), names::MEMLOCK, "node").status,
        Status::Pass
    );
}

#[test]
fn no_rdma_devices_broken_hosts_and_pf_filters() {
    let fx = FixtureHost::new().unwrap();
    let r = doctor(&fx, &NetState::default());
    assert_eq!(check(&r, names::DEVICES, "node").status, Status::Fail);
    assert_eq!(r.worst(), Status::Fail);

    let (fx, broken) = FixtureHost::broken().unwrap();
    let r = doctor(&fx, &good_net());
    let scan = check(&r, names::HOST_SCAN, "node");
    assert_eq!(scan.status, Status::Warn);
    assert!(
        scan.evidence.contains(&broken.dangling_vf.to_string()) || scan.evidence.contains("more"),
        "{}",
        scan.evidence
    );
    // The rest still ran.
    assert_eq!(check(&r, names::LINK, "ens1f0").status, Status::Pass);

    let fx = healthy();
    let only = DoctorOptions {
        pf_names: vec!["ens2f0".into()],
        ..Default::default()
    };
    let r = run(&fx.root(), &good_net(), &only).unwrap();
    assert!(
        r.checks
            .iter()
            .all(|c| c.subject == "ens2f0" || c.subject == "node")
    );
    let none = DoctorOptions {
        pf_names: vec!["nope0".into()],
        ..Default::default()
    };
    let r = run(&fx.root(), &good_net(), &none).unwrap();
    assert!(check(&r, names::DEVICES, "node").evidence.contains("nope0"));

    let e = run(
        &fx.root(),
        &good_net(),
        &DoctorOptions {
            roce_priority: 8,
            ..Default::default()
        },
    )
    .unwrap_err();
    assert_eq!(e, DoctorError::BadPriority(8));
}

#[test]
fn table_and_json_output() {
    let fx = healthy();
    set_ecn(&fx, "ens1f0", "roce_rp", 3, "0");
    let r = doctor(&fx, &good_net());
    let t = r.render_table();
    println!("{t}");
    let lines: Vec<&str> = t.lines().collect();
    assert!(lines[0].starts_with("STATUS CHECK"), "{t}");
    assert!(lines[0].ends_with("EVIDENCE"), "{t}");
    let fail_at = lines
        .iter()
        .position(|l| l.starts_with("FAIL") && l.contains("ecn"))
        .unwrap();
    assert!(
        lines[fail_at + 1]
            .trim_start()
            .starts_with("hint: enable ECN"),
        "{t}"
    );
    // No hint lines under passes.
    for (i, l) in lines.iter().enumerate() {
        if l.starts_with("PASS") {
            assert!(!lines[i + 1].trim_start().starts_with("hint:"), "{t}");
        }
    }
    assert_eq!(*lines.last().unwrap(), "1 fail, 0 warn, 13 pass, 1 skip");
    let json = r.to_json().unwrap();
    assert!(json.contains("\"status\": \"fail\""), "{json}");
    let back: DoctorReport = serde_json::from_str(&json).unwrap();
    assert_eq!(back, r);
}
