#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The host model against fixture hosts laid out like real ConnectX hosts.

use sriov_helpers::fixture::{FixtureHost, LinkLayer, PfSpec};
use sriov_helpers::rdma::roce_v2_gid_index;
use sriov_helpers::{Host, HostRoot, PciAddress};
use std::net::Ipv4Addr;

fn addr(s: &str) -> PciAddress {
    s.parse().unwrap()
}

#[test]
fn connectx_pair_is_read_as_two_pfs_with_eight_vfs_each() {
    let fx = FixtureHost::connectx6dx_pair().unwrap();
    let host = Host::scan(&fx.root());
    assert!(host.errors.is_empty(), "{:?}", host.errors);
    let pfs: Vec<_> = host.pfs().collect();
    assert_eq!(pfs.len(), 2);
    assert_eq!(host.vfs().count(), 16);

    let pf0 = &host.pci[&addr("0000:3b:00.0")];
    assert_eq!(pf0.vendor, 0x15b3);
    assert_eq!(pf0.device, 0x101d);
    assert_eq!(pf0.driver.as_deref(), Some("mlx5_core"));
    assert_eq!(pf0.numa_node, Some(0));
    assert_eq!(pf0.local_cpus.as_ref().unwrap().to_string(), "0-15");
    assert_eq!(pf0.netdevs, vec!["ens1f0"]);
    let sriov = pf0.sriov.as_ref().unwrap();
    assert_eq!(
        (sriov.total_vfs, sriov.num_vfs, sriov.vfs.len()),
        (127, 8, 8)
    );
    // VF offset 2: VF0 is function 2, VF6 wraps onto device 1.
    assert_eq!(sriov.vfs[0], (0, addr("0000:3b:00.2")));
    assert_eq!(sriov.vfs[6], (6, addr("0000:3b:01.0")));

    let vf = &host.pci[&addr("0000:3b:01.0")];
    assert_eq!(vf.device, 0x101e);
    let of = vf.physfn.unwrap();
    assert_eq!((of.pf, of.index), (addr("0000:3b:00.0"), Some(6)));
    assert_eq!(host.pf_name_of(vf), Some("ens1f0"));
    assert_eq!(vf.netdevs, vec!["ens1f0v6"]);
    assert_eq!(vf.msi_irqs.len(), 3);

    let pf1 = &host.pci[&addr("0000:86:00.0")];
    assert_eq!(pf1.numa_node, Some(1));
    assert_eq!(host.numa.len(), 2);
    assert_eq!(host.numa_node(1).unwrap().cpus.to_string(), "16-31");
}

#[test]
fn pci_and_class_entries_are_relative_symlinks_into_sys_devices() {
    let fx = FixtureHost::connectx6dx_pair().unwrap();
    let sys = fx.path().join("sys");
    for link in [
        sys.join("bus/pci/devices/0000:3b:00.2"),
        sys.join("class/net/ens1f0v0"),
        sys.join("class/infiniband/mlx5_0"),
        sys.join("class/infiniband_verbs/uverbs0"),
    ] {
        let target = std::fs::read_link(&link).unwrap();
        assert!(
            target.is_relative(),
            "{} -> {}",
            link.display(),
            target.display()
        );
        assert!(
            target.to_string_lossy().contains("devices/pci0000:"),
            "{}",
            target.display()
        );
        let canon = std::fs::canonicalize(&link).unwrap();
        assert!(
            canon.starts_with(sys.join("devices")),
            "{}",
            canon.display()
        );
    }
}

#[test]
fn rdma_devices_ports_gids_and_char_devices() {
    let fx = FixtureHost::connectx6dx_pair().unwrap();
    let host = Host::scan(&fx.root());
    // 2 PFs + 16 VFs, each with its own mlx5_N.
    assert_eq!(host.rdma.len(), 18);
    let vf0 = addr("0000:3b:00.2");
    let dev = host.rdma_of_pci(&vf0).unwrap();
    assert_eq!(dev.name, "mlx5_1");
    let port = &dev.ports[0];
    assert_eq!((port.num, port.state.as_str()), (1, "ACTIVE"));
    assert_eq!(port.link_layer, "Ethernet");
    assert_eq!(port.rate_gbps(), Some(100.0));
    // Empty slots are skipped: only the two link-local GIDs.
    let gids = port.gids().unwrap();
    assert_eq!(gids.len(), 2);
    assert_eq!(gids[1].gid_type.as_deref(), Some("RoCE v2"));
    assert_eq!(gids[1].ndev.as_deref(), Some("ens1f0v0"));
    let cd = &dev.char_devices;
    let uv = cd.uverbs.as_ref().unwrap();
    assert_eq!(uv.name, "uverbs1");
    assert_eq!(uv.dev, Some((231, 193)));
    assert!(uv.present);
    assert_eq!(uv.container_path(), "/dev/infiniband/uverbs1");
    assert_eq!(cd.umad.len(), 1);
    assert!(cd.issm.is_empty(), "Ethernet-mode ConnectX has no issm");
    assert_eq!(cd.rdma_cm.as_ref().unwrap().name, "rdma_cm");
}

#[test]
fn infiniband_mode_has_issm() {
    let mut fx = FixtureHost::new().unwrap();
    let mut spec = PfSpec::connectx6dx("0000:af:00.0", "ibp175s0f0", Some(0), 1);
    spec.link_layer = LinkLayer::InfiniBand;
    fx.add_pf(spec).unwrap();
    let host = Host::scan(&fx.root());
    let dev = host.rdma_of_pci(&addr("0000:af:00.2")).unwrap();
    assert_eq!(dev.ports[0].link_layer, "InfiniBand");
    assert_eq!(dev.char_devices.issm.len(), 1);
    assert_eq!(dev.char_devices.issm[0].dev, Some((231, 65)));
    assert!(dev.char_devices.rdma_cm.is_none());
}

#[test]
fn roce_v2_gid_index_is_found_from_the_table_not_hard_coded() {
    let fx = FixtureHost::connectx6dx_pair().unwrap();
    fx.add_ipv4_gid("mlx5_1", 4, Ipv4Addr::new(10, 56, 0, 7), "ens1f0v0")
        .unwrap();
    let host = Host::scan(&fx.root());
    let dev = &host.rdma["mlx5_1"];
    assert_eq!(
        roce_v2_gid_index(dev, "ens1f0v0").unwrap(),
        Some((5, Ipv4Addr::new(10, 56, 0, 7)))
    );
    assert_eq!(
        roce_v2_gid_index(&host.rdma["mlx5_2"], "ens1f0v1").unwrap(),
        None
    );
}

#[test]
fn rxe_soft_device_lives_under_devices_virtual() {
    let mut fx = FixtureHost::new().unwrap();
    fx.add_rxe("rxe0", "eth0").unwrap();
    let canon = std::fs::canonicalize(fx.path().join("sys/class/infiniband/rxe0")).unwrap();
    assert!(
        canon.ends_with("sys/devices/virtual/infiniband/rxe0"),
        "{}",
        canon.display()
    );
    let host = Host::scan(&fx.root());
    assert!(host.errors.is_empty(), "{:?}", host.errors);
    let rxe = host.rdma_of_netdev("eth0").unwrap();
    assert_eq!(rxe.name, "rxe0");
    assert_eq!(rxe.pci, None);
    assert_eq!(rxe.char_devices.uverbs.as_ref().unwrap().name, "uverbs0");
    assert_eq!(host.netdevs["eth0"].pci, None);
}

#[test]
fn unknown_numa_reads_as_none() {
    let fx = FixtureHost::unknown_numa().unwrap();
    let host = Host::scan(&fx.root());
    assert!(host.errors.is_empty(), "{:?}", host.errors);
    assert_eq!(host.vfs().count(), 4);
    assert!(host.pci.values().all(|d| d.numa_node.is_none()));
}

#[test]
fn broken_host_reports_each_problem_with_its_path_and_keeps_the_rest() {
    let (fx, broken) = FixtureHost::broken().unwrap();
    let host = Host::scan(&fx.root());
    let msgs: Vec<String> = host.errors.iter().map(|e| e.to_string()).collect();
    let has = |needle: &str| msgs.iter().any(|m| m.contains(needle));
    assert!(has(&format!("{}", broken.dangling_vf)), "{msgs:#?}");
    assert!(has(&format!("{}/vendor", broken.no_vendor_vf)), "{msgs:#?}");
    assert!(
        has(&format!("{}/numa_node", broken.bad_numa_vf)) && has("banana"),
        "{msgs:#?}"
    );
    assert!(has("class/net/ghost0"), "{msgs:#?}");
    assert!(has("uverbs99/ibdev"), "{msgs:#?}");
    // The PF with the dangling virtfn link is still read.
    assert!(host.pci.contains_key(&addr("0000:3b:00.0")));
    assert_eq!(
        host.pf_name_of(&host.pci[&addr("0000:3b:00.2")]),
        Some("ens1f0")
    );
    // Everything else is still there: 16 VFs - 1 gone - 2 unreadable.
    assert_eq!(host.vfs().count(), 13);
    assert!(host.pci.contains_key(&addr("0000:86:00.0")));
    assert_eq!(
        host.netdevs.len(),
        17,
        "ghost0 and the gone VF's netdev are missing"
    );
}

#[test]
fn live_vf_count_changes_add_and_remove_everything() {
    let mut fx = FixtureHost::connectx6dx_pair().unwrap();
    let pf = addr("0000:3b:00.0");
    fx.set_num_vfs(&pf, 2).unwrap();
    let host = Host::scan(&fx.root());
    assert!(host.errors.is_empty(), "{:?}", host.errors);
    assert_eq!(host.vfs().count(), 10);
    assert!(!host.netdevs.contains_key("ens1f0v5"));
    fx.set_num_vfs(&pf, 12).unwrap();
    let host = Host::scan(&fx.root());
    assert!(host.errors.is_empty(), "{:?}", host.errors);
    assert_eq!(host.vfs().count(), 20);
    assert!(host.netdevs.contains_key("ens1f0v11"));
    let vf11 = fx.vf_address(&pf, 11).unwrap();
    assert!(host.rdma_of_pci(&vf11).is_some());
}

#[test]
fn set_num_vfs_goes_through_zero() {
    let fx = FixtureHost::connectx6dx_pair().unwrap();
    let root = fx.root();
    let pf = addr("0000:3b:00.0");
    sriov_helpers::pci::set_num_vfs(&root, pf, 4).unwrap();
    let path = root.pci_devices().join("0000:3b:00.0/sriov_numvfs");
    assert_eq!(std::fs::read_to_string(path).unwrap(), "4");
    let err = sriov_helpers::pci::set_num_vfs(&HostRoot::new("/nonexistent"), pf, 4).unwrap_err();
    assert!(
        err.to_string()
            .contains("/nonexistent/sys/bus/pci/devices/0000:3b:00.0/sriov_numvfs"),
        "{err}"
    );
}

#[test]
fn health_relevant_changes_are_visible() {
    let fx = FixtureHost::connectx6dx_pair().unwrap();
    fx.set_operstate("ens1f0v0", "down").unwrap();
    fx.remove_char_device("uverbs2").unwrap();
    let host = Host::scan(&fx.root());
    assert!(!host.netdevs["ens1f0v0"].is_up());
    assert!(host.netdevs["ens1f0v1"].is_up());
    let d = &host.rdma["mlx5_2"];
    assert!(!d.char_devices.uverbs.as_ref().unwrap().present);
}

#[test]
fn irq_affinity_round_trip() {
    let fx = FixtureHost::connectx6dx_pair().unwrap();
    let root = fx.root();
    let host = Host::scan(&root);
    let irq = host.pci[&addr("0000:86:00.0")].msi_irqs[0];
    let cur = sriov_helpers::irq::read_affinity(&root, irq).unwrap();
    assert_eq!(cur.to_string(), "16-31");
    let want: sriov_helpers::CpuList = "18".parse().unwrap();
    sriov_helpers::irq::write_affinity(&root, irq, &want).unwrap();
    assert_eq!(sriov_helpers::irq::read_affinity(&root, irq).unwrap(), want);
}

#[test]
fn bench_sized_fixture_scans_clean() {
    let fx = FixtureHost::many(2, 64).unwrap();
    let host = Host::scan(&fx.root());
    assert!(host.errors.is_empty(), "{:?}", host.errors);
    assert_eq!(host.vfs().count(), 128);
    assert_eq!(host.rdma.len(), 130);
}

#[test]
fn a_wrong_root_is_reported_not_taken_for_an_empty_host() {
    let host = Host::scan(&HostRoot::new("/nonexistent-kroce-root"));
    assert!(host.pci.is_empty());
    let msgs: Vec<String> = host.errors.iter().map(|e| e.to_string()).collect();
    assert!(
        msgs.iter()
            .any(|m| m.contains("/nonexistent-kroce-root/sys/bus/pci/devices")),
        "{msgs:?}"
    );
}

#[test]
fn gid_tables_are_read_on_demand_and_a_bad_gid_names_its_file() {
    let fx = FixtureHost::connectx6dx_pair().unwrap();
    let gid = fx.path().join("sys/class/infiniband/mlx5_1/ports/1/gids/3");
    std::fs::write(&gid, "not-a-gid\n").unwrap();
    // The scan does not read GIDs: the device is there, without errors.
    let host = Host::scan(&fx.root());
    assert!(host.errors.is_empty(), "{:?}", host.errors);
    let dev = &host.rdma["mlx5_1"];
    let err = dev.ports[0].gids().unwrap_err().to_string();
    assert!(
        err.contains("mlx5_1/ports/1/gids/3") && err.contains("not-a-gid"),
        "{err}"
    );
    assert!(roce_v2_gid_index(dev, "ens1f0v0").is_err());
    // A GID added after the scan is seen by the next read of the table.
    fx.add_ipv4_gid("mlx5_2", 4, Ipv4Addr::new(10, 56, 0, 9), "ens1f0v1")
        .unwrap();
    assert_eq!(
        roce_v2_gid_index(&host.rdma["mlx5_2"], "ens1f0v1").unwrap(),
        Some((5, Ipv4Addr::new(10, 56, 0, 9)))
    );
}

#[test]
fn one_vf_read_alone_finds_its_index_on_the_pf() {
    let fx = FixtureHost::connectx6dx_pair().unwrap();
    let root = fx.root();
    let vf = sriov_helpers::pci::read_pci_device(&root, addr("0000:3b:01.0")).unwrap();
    let of = vf.physfn.unwrap();
    assert_eq!((of.pf, of.index), (addr("0000:3b:00.0"), Some(6)));
    assert_eq!(vf.netdevs, vec!["ens1f0v6"]);
    assert_eq!(vf.rdma_devices, vec!["mlx5_7"]);
}

/// A QEMU-igb-like host: PF `eth0` on NUMA 1 with two igbvf VFs, no RDMA
/// device of their own; `rxe0` created on VF 1's netdev, `rxe1` on a veth.
fn igb_with_rxe_on_a_vf() -> (FixtureHost, PciAddress, PciAddress, String) {
    let mut fx = FixtureHost::new().unwrap();
    fx.add_numa_node(0, "0-1").unwrap();
    fx.add_numa_node(1, "2-3").unwrap();
    fx.add_rdma_cm().unwrap();
    let pf = addr("0000:01:00.0");
    fx.add_pf(PfSpec::igb("0000:01:00.0", "eth0", Some(1), 2))
        .unwrap();
    let vf1 = fx.vf_address(&pf, 1).unwrap();
    let netdev = fx.add_rxe_on_vf("rxe0", &pf, 1).unwrap();
    fx.add_rxe("rxe1", "veth9").unwrap();
    (fx, pf, vf1, netdev)
}

#[test]
fn igb_fixture_has_the_real_vf_layout() {
    let (fx, pf, vf1, netdev) = igb_with_rxe_on_a_vf();
    let host = Host::scan(&fx.root());
    assert!(host.errors.is_empty(), "{:?}", host.errors);
    // Offset 0x80, stride 2: VF1 is 01:10.2, bound to igbvf.
    assert_eq!(vf1, addr("0000:01:10.2"));
    let vf = &host.pci[&vf1];
    assert_eq!((vf.vendor, vf.device), (0x8086, 0x10ca));
    assert_eq!(vf.driver.as_deref(), Some("igbvf"));
    assert_eq!(vf.physfn.unwrap().pf, pf);
    assert_eq!(vf.numa_node, Some(1));
    assert_eq!(host.pci[&pf].driver.as_deref(), Some("igb"));
    assert_eq!(vf.netdevs, vec![netdev.clone()]);
    // As the kernel lays out an rxe: under devices/virtual, no `device`
    // link, `parent` naming the VF netdev, whose `device` is the VF.
    let class = fx.path().join("sys/class/infiniband/rxe0");
    let canon = std::fs::canonicalize(&class).unwrap();
    assert!(
        canon.ends_with("sys/devices/virtual/infiniband/rxe0"),
        "{}",
        canon.display()
    );
    assert!(std::fs::symlink_metadata(class.join("device")).is_err());
    assert_eq!(
        std::fs::read_to_string(class.join("parent")).unwrap(),
        format!("{netdev}\n")
    );
    assert_eq!(
        std::fs::read_to_string(class.join("node_type")).unwrap(),
        "1: CA\n"
    );
    assert_eq!(
        std::fs::read_to_string(class.join("ports/1/gid_attrs/types/1")).unwrap(),
        "RoCE v2\n"
    );
    let uverbs = host.rdma["rxe0"].char_devices.uverbs.as_ref().unwrap();
    let uverbs_dir = std::fs::canonicalize(
        fx.path()
            .join("sys/class/infiniband_verbs")
            .join(&uverbs.name),
    )
    .unwrap();
    assert!(
        uverbs_dir
            .starts_with(std::fs::canonicalize(fx.path().join("sys/devices/virtual")).unwrap()),
        "{}",
        uverbs_dir.display()
    );
}

#[test]
fn rxe_on_a_vf_netdev_is_that_vfs_rdma_device() {
    let (fx, pf, vf1, netdev) = igb_with_rxe_on_a_vf();
    // The kernel adds the IPv4 GIDs when the VF netdev gets an address.
    fx.add_ipv4_gid("rxe0", 2, Ipv4Addr::new(10, 0, 0, 7), &netdev)
        .unwrap();
    let host = Host::scan(&fx.root());
    assert!(host.errors.is_empty(), "{:?}", host.errors);
    let rxe = host.rdma_of_pci(&vf1).expect("VF 1 shows its rxe");
    assert_eq!(rxe.name, "rxe0");
    assert!(rxe.soft);
    assert_eq!(rxe.parent_netdev.as_deref(), Some(netdev.as_str()));
    assert_eq!(rxe.char_devices.uverbs.as_ref().unwrap().name, "uverbs0");
    assert_eq!(rxe.char_devices.umad.len(), 1);
    assert_eq!(
        roce_v2_gid_index(rxe, &netdev).unwrap(),
        Some((3, Ipv4Addr::new(10, 0, 0, 7)))
    );
    // VF 0 and the PF have none; the rxe on a veth stays a soft device.
    assert!(host.rdma_of_pci(&fx.vf_address(&pf, 0).unwrap()).is_none());
    assert!(host.rdma_of_pci(&pf).is_none());
    let plain = &host.rdma["rxe1"];
    assert!(plain.soft);
    assert_eq!(plain.pci, None);
    assert_eq!(host.rdma_of_netdev("veth9").unwrap().name, "rxe1");
}

#[test]
fn rxe_on_a_pf_or_on_a_vf_with_its_own_rdma_device_stays_soft() {
    let mut fx = FixtureHost::connectx6dx_pair().unwrap();
    fx.add_pf(PfSpec::igb("0000:01:00.0", "eth0", Some(0), 1))
        .unwrap();
    fx.add_rxe("rxe_pf", "eth0").unwrap();
    // A ConnectX VF has its own mlx5 device: that one stays the VF's.
    let cx_vf = addr("0000:3b:00.2");
    let cx_netdev = fx
        .add_rxe_on_vf("rxe_cx", &addr("0000:3b:00.0"), 0)
        .unwrap();
    assert_eq!(cx_netdev, "ens1f0v0");
    let host = Host::scan(&fx.root());
    assert!(host.errors.is_empty(), "{:?}", host.errors);
    assert_eq!(host.rdma["rxe_pf"].pci, None);
    assert!(host.rdma_of_pci(&addr("0000:01:00.0")).is_none());
    assert_eq!(host.rdma["rxe_cx"].pci, None);
    let own = host.rdma_of_pci(&cx_vf).unwrap();
    assert!(own.name.starts_with("mlx5_") && !own.soft, "{own:?}");
}
