//! The agent against fixture hosts whose simulated kernel creates and
//! removes VF entries when `sriov_numvfs` is written.

use super::apply::{Agent, AgentConfig, ApplyOutcome};
use super::dcb::{DCB_CAP_DCBX_HOST, DCB_CAP_DCBX_VER_IEEE, FakeDcb};
use super::holders::PodSnapshot;
use super::links::FixtureLinks;
use super::vfs::{FixtureKernel, SysfsVfControl};
use kroce_operator::crd::{
    IrqAffinity, IrqPolicy, PfConfig, QosSpec, RdmaNodeStateSpec, ReservedCpusMode, SyncState,
    VfGroup,
};
use sriov_helpers::fixture::FixtureHost;
use sriov_helpers::{CpuList, Host, PciAddress};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub(super) const PF0: &str = "0000:3b:00.0";
pub(super) const PF1: &str = "0000:86:00.0";

pub(super) fn pci(s: &str) -> PciAddress {
    s.parse().unwrap()
}

/// What `mkdir rdma_cm/<dev>` makes the kernel lay out, and the ECN
/// switches mlx5 exposes: added for every RDMA device and PF netdev.
fn lay_out_kernel_files(host: &FixtureHost) {
    let root = host.path();
    let ib = root.join("sys/class/infiniband");
    for e in std::fs::read_dir(&ib).unwrap().flatten() {
        let port = root
            .join("configfs/rdma_cm")
            .join(e.file_name())
            .join("ports/1");
        if !port.exists() {
            std::fs::create_dir_all(&port).unwrap();
            std::fs::write(port.join("default_roce_mode"), "IB/RoCE v1\n").unwrap();
            std::fs::write(port.join("default_roce_tos"), "0\n").unwrap();
        }
    }
    for pf in ["ens1f0", "ens2f0"] {
        for point in ["roce_rp", "roce_np"] {
            let dir = root
                .join("sys/class/net")
                .join(pf)
                .join("ecn")
                .join(point)
                .join("enable");
            if !dir.exists() {
                std::fs::create_dir_all(&dir).unwrap();
                for p in 0..8 {
                    std::fs::write(dir.join(p.to_string()), "0\n").unwrap();
                }
            }
        }
    }
}

/// A fixture host with the fake edges; shared (`Arc`) so the agent's
/// Kubernetes loop can drive them too.
pub(super) struct Rig {
    pub(super) kernel: Arc<FixtureKernel>,
    pub(super) links: Arc<FixtureLinks>,
    pub(super) dcb: Arc<FakeDcb>,
    pub(super) config: AgentConfig,
    pub(super) path: PathBuf,
}

impl Rig {
    pub(super) fn new() -> Rig {
        let host = FixtureHost::connectx6dx_pair().unwrap();
        lay_out_kernel_files(&host);
        let path = host.path().to_path_buf();
        let config = AgentConfig {
            root: host.root(),
            configfs: path.join("configfs"),
            vf_wait: Duration::from_secs(2),
            poll: Duration::from_millis(10),
        };
        let links = FixtureLinks::new(path.join("sys"));
        let mut kernel = FixtureKernel::new(host);
        kernel.after_write = Some(lay_out_kernel_files);
        Rig {
            kernel: Arc::new(kernel),
            links: Arc::new(links),
            dcb: Arc::new(FakeDcb::default()),
            config,
            path,
        }
    }

    fn agent(&self) -> Agent<'_> {
        Agent {
            config: &self.config,
            vfs: &*self.kernel,
            links: &*self.links,
            dcb: &*self.dcb,
        }
    }

    fn apply(&self, spec: &RdmaNodeStateSpec, managed: &[&str]) -> ApplyOutcome {
        let managed: Vec<String> = managed.iter().map(|s| s.to_string()).collect();
        self.agent().apply(spec, &managed, &PodSnapshot::default())
    }

    pub(super) fn file(&self, rel: &str) -> String {
        std::fs::read_to_string(self.path.join(rel))
            .unwrap()
            .trim()
            .to_string()
    }

    pub(super) fn host(&self) -> Host {
        Host::scan(&self.config.root)
    }
}

pub(super) fn pf_config(addr: &str, ifname: &str, num_vfs: u32) -> PfConfig {
    PfConfig {
        pci_address: addr.into(),
        if_name: ifname.into(),
        num_vfs,
        mtu: Some(9000),
        vf_groups: vec![VfGroup {
            network: "fast".into(),
            resource_name: "rdma/fast".into(),
            vf_range: format!("0-{}", num_vfs - 1),
            mtu: Some(9000),
        }],
        irq_affinity: IrqAffinity {
            policy: IrqPolicy::NumaLocal,
            reserved_cpus: Some("0-1,16-17".into()),
            reserved_cpus_mode: ReservedCpusMode::Exclude,
        },
        qos: Some(QosSpec {
            roce_tos: Some(106),
            ..Default::default()
        }),
    }
}

pub(super) fn spec() -> RdmaNodeStateSpec {
    RdmaNodeStateSpec {
        node_name: "n1".into(),
        pfs: vec![pf_config(PF0, "ens1f0", 4), pf_config(PF1, "ens2f0", 8)],
        ..Default::default()
    }
}

fn condition<'a>(o: &'a ApplyOutcome, t: &str) -> &'a kroce_operator::crd::Condition {
    o.status
        .conditions
        .iter()
        .find(|c| c.type_ == t)
        .unwrap_or_else(|| panic!("no {t} condition in {:#?}", o.status.conditions))
}

/// IRQs of every function of a PF (PF and VFs), each with its affinity.
pub(super) fn irq_affinities(host: &Host, pf: &str, root: &Path) -> Vec<(String, u32, CpuList)> {
    let pf = pci(pf);
    let mut devs = vec![host.pci[&pf].clone()];
    for (_, vf) in &host.pci[&pf].sriov.as_ref().unwrap().vfs {
        devs.push(host.pci[vf].clone());
    }
    let mut out = Vec::new();
    for d in devs {
        for irq in d.msi_irqs.iter().skip(1) {
            let cpus = sriov_helpers::irq::read_affinity(&sriov_helpers::HostRoot::new(root), *irq)
                .unwrap();
            out.push((d.address.to_string(), *irq, cpus));
        }
    }
    out
}

#[test]
fn applies_vfs_mtu_irqs_and_qos_on_a_fixture_host() {
    let rig = Rig::new();
    let o = rig.apply(&spec(), &[]);
    assert_eq!(o.status.sync_state, SyncState::Succeeded, "{:#?}", o.status);
    assert!(condition(&o, "Ready").is_true());
    assert!(!condition(&o, "Degraded").is_true());
    // 8 -> 4 goes through 0; ens2f0 already has 8.
    assert_eq!(rig.kernel.writes(), [(pci(PF0), 0), (pci(PF0), 4)]);
    let host = rig.host();
    let pf0 = host.pci[&pci(PF0)].sriov.clone().unwrap();
    assert_eq!(pf0.num_vfs, 4);
    assert_eq!(pf0.vfs.len(), 4);
    let observed = &o.status.pfs[0];
    assert_eq!(observed.pci_address, PF0);
    assert_eq!(observed.num_vfs, 4);
    assert_eq!(observed.vfs.len(), 4);
    assert!(
        observed
            .vfs
            .iter()
            .all(|v| v.netdev.is_some() && v.rdma_device.is_some())
    );
    assert_eq!(observed.vfs[0].mtu, Some(9000));
    assert_eq!(o.status.managed_pfs, [PF0, PF1]);
    assert_eq!(o.status.configured_pfs, 2);

    // MTU: every VF netdev went from 1500 to 9000 (the PFs were at 9000).
    let calls = rig.links.calls();
    assert_eq!(calls.len(), 12, "{calls:?}");
    assert!(calls.iter().all(|(n, m)| n.contains('v') && *m == 9000));

    // IRQs: NUMA-local CPUs minus reserved, control vector left alone.
    for (pf, local) in [(PF0, 2..=15u32), (PF1, 18..=31u32)] {
        let irqs = irq_affinities(&host, pf, &rig.path);
        assert!(!irqs.is_empty());
        for (dev, irq, cpus) in &irqs {
            let list: Vec<u32> = cpus.cpus().collect();
            assert_eq!(list.len(), 1, "IRQ {irq} of {dev}: {cpus}");
            assert!(local.contains(&list[0]), "IRQ {irq} of {dev} on {cpus}");
        }
        // Round-robin: more IRQs than CPUs uses every allowed CPU.
        let used: std::collections::BTreeSet<u32> =
            irqs.iter().flat_map(|(_, _, c)| c.cpus()).collect();
        assert_eq!(used.len(), 14, "{pf}: {used:?}");
    }
    let first_pf_irq = host.pci[&pci(PF0)].msi_irqs[0];
    assert_eq!(
        rig.file(&format!("proc/irq/{first_pf_irq}/smp_affinity_list")),
        "0-15",
        "the control vector keeps its affinity"
    );
    assert!(o.status.irq_placement.iter().all(|p| p.error.is_none()));

    // ECN on priority 3 only, both points.
    for point in ["roce_rp", "roce_np"] {
        for p in 0..8 {
            let want = if p == 3 { "1" } else { "0" };
            assert_eq!(
                rig.file(&format!("sys/class/net/ens1f0/ecn/{point}/enable/{p}")),
                want
            );
        }
    }
    // RDMA-CM defaults on the PF's and every VF's RDMA device.
    let mut devs = vec![observed.rdma_device.clone().unwrap()];
    devs.extend(observed.vfs.iter().filter_map(|v| v.rdma_device.clone()));
    assert_eq!(devs.len(), 5);
    for d in devs {
        assert_eq!(
            rig.file(&format!("configfs/rdma_cm/{d}/ports/1/default_roce_mode")),
            "RoCE v2"
        );
        assert_eq!(
            rig.file(&format!("configfs/rdma_cm/{d}/ports/1/default_roce_tos")),
            "106"
        );
    }
    // DCB: host IEEE DCBX, PFC on 3 only, trust dscp (64 DSCP APP entries).
    let st = rig.dcb.state.lock().unwrap()["ens1f0"].clone();
    assert_eq!(st.dcbx, Some(DCB_CAP_DCBX_HOST | DCB_CAP_DCBX_VER_IEEE));
    assert_eq!(st.pfc.unwrap().pfc_en, 0b1000);
    assert_eq!(st.pfc.unwrap().pfc_cap, 8, "PFC capability kept from GET");
    assert_eq!(st.dscp_apps().len(), 64);
    let q = observed.qos.clone().unwrap();
    assert_eq!(q.pfc_priorities, [3]);
    assert_eq!(q.ecn_priorities, [3]);
    assert_eq!(q.trust.as_deref(), Some("dscp"));

    // A second pass finds nothing to do.
    let again = rig.apply(&spec(), &[]);
    assert!(again.changes.is_empty(), "{:#?}", again.changes);
    assert_eq!(rig.kernel.writes().len(), 2);
}

#[test]
fn drift_is_detected_and_put_back() {
    let rig = Rig::new();
    let first = rig.apply(&spec(), &[]);
    assert_eq!(first.status.sync_state, SyncState::Succeeded);
    let host = rig.host();
    let (_, irq, _) = irq_affinities(&host, PF0, &rig.path)[0].clone();
    let before = rig.file(&format!("proc/irq/{irq}/smp_affinity_list"));
    std::fs::write(
        rig.path.join(format!("proc/irq/{irq}/smp_affinity_list")),
        "0-31\n",
    )
    .unwrap();
    std::fs::write(
        rig.path.join("sys/class/net/ens1f0/ecn/roce_np/enable/3"),
        "0\n",
    )
    .unwrap();
    std::fs::write(rig.path.join("sys/class/net/ens1f0v2/mtu"), "1500\n").unwrap();
    let dev = first.status.pfs[0].vfs[1].rdma_device.clone().unwrap();
    let tos = format!("configfs/rdma_cm/{dev}/ports/1/default_roce_tos");
    std::fs::write(rig.path.join(&tos), "0\n").unwrap();
    rig.dcb
        .state
        .lock()
        .unwrap()
        .get_mut("ens1f0")
        .unwrap()
        .pfc
        .as_mut()
        .unwrap()
        .pfc_en = 0xff;

    let o = rig.apply(&spec(), &[]);
    assert_eq!(o.status.sync_state, SyncState::Succeeded);
    let joined = o.changes.join("\n");
    for needle in [
        format!("IRQ {irq}"),
        "ecn/roce_np/enable/3".to_string(),
        "ens1f0v2: MTU 1500 -> 9000".to_string(),
        "default_roce_tos = 106".to_string(),
        "ens1f0: PFC 11111111 -> 00001000".to_string(),
    ] {
        assert!(
            joined.contains(&needle),
            "no change {needle:?} in:\n{joined}"
        );
    }
    assert_eq!(o.changes.len(), 5, "{joined}");
    assert_eq!(
        rig.file(&format!("proc/irq/{irq}/smp_affinity_list")),
        before
    );
    assert_eq!(rig.file("sys/class/net/ens1f0/ecn/roce_np/enable/3"), "1");
    assert_eq!(rig.file("sys/class/net/ens1f0v2/mtu"), "9000");
    assert_eq!(rig.file(&tos), "106");
    // And VFs deleted behind the agent's back come back.
    rig.kernel
        .host
        .lock()
        .unwrap()
        .set_num_vfs(&pci(PF1), 0)
        .unwrap();
    let o = rig.apply(&spec(), &[]);
    assert!(
        o.changes.iter().any(|c| c.contains("sriov_numvfs 0 -> 8")),
        "{:?}",
        o.changes
    );
    assert_eq!(
        rig.host().pci[&pci(PF1)].sriov.as_ref().unwrap().vfs.len(),
        8
    );
}

#[test]
fn vfs_held_by_pods_are_not_pulled_and_the_pods_are_named() {
    let rig = Rig::new();
    let status = r#"[{"name":"team-a/fast","device-info":{"type":"pci","pci":{"pci-address":"0000:3b:00.3"}}}]"#;
    let pods = PodSnapshot::from_pods([("team-a", "trainer-0", status)]);
    let o = rig.agent().apply(&spec(), &[], &pods);
    assert!(rig.kernel.writes().is_empty(), "{:?}", rig.kernel.writes());
    let held = condition(&o, "VfsHeld");
    assert!(held.is_true());
    assert!(
        held.message.contains("team-a/trainer-0"),
        "{}",
        held.message
    );
    assert!(held.message.contains("0000:3b:00.3"), "{}", held.message);
    assert!(held.message.contains("8 -> 4"), "{}", held.message);
    assert_eq!(o.status.sync_state, SyncState::InProgress);
    assert!(!condition(&o, "Ready").is_true());
    // The other PF is configured anyway.
    assert_eq!(o.status.configured_pfs, 1);
    assert!(o.changes.iter().any(|c| c.starts_with("ens2f0v0: MTU")));
}

#[test]
fn a_vf_netdev_moved_out_of_the_host_namespace_counts_as_held() {
    let rig = Rig::new();
    rig.kernel
        .host
        .lock()
        .unwrap()
        .remove_netdev("ens1f0v5")
        .unwrap();
    let o = rig.apply(&spec(), &[]);
    assert!(rig.kernel.writes().iter().all(|(p, _)| *p != pci(PF0)));
    assert!(
        condition(&o, "VfsHeld").message.contains("VF 5"),
        "{:#?}",
        o.status.conditions
    );
}

#[test]
fn kernel_errors_become_conditions_and_other_pfs_proceed() {
    let rig = Rig::new();
    rig.kernel
        .fail
        .lock()
        .unwrap()
        .push((pci(PF0), libc::ENOSPC));
    let o = rig.apply(&spec(), &[]);
    assert_eq!(o.status.sync_state, SyncState::Failed);
    let d = condition(&o, "Degraded");
    assert!(d.is_true());
    assert_eq!(d.reason, "VfResourcesExhausted");
    assert!(
        d.message.contains("0000:3b:00.0") && d.message.contains("MSI-X"),
        "{}",
        d.message
    );
    assert!(
        o.status
            .last_error
            .as_deref()
            .unwrap_or("")
            .contains("sriov_numvfs=4")
    );
    assert_eq!(o.status.configured_pfs, 1);
    assert!(o.changes.iter().any(|c| c.starts_with("ens2f0v")));
}

#[test]
fn invalid_spec_changes_nothing_and_names_the_field() {
    let rig = Rig::new();
    let mut s = spec();
    s.pfs[1].pci_address = "0000:99:00.0".into();
    s.pfs[0].vf_groups[0].vf_range = "0-9".into();
    let o = rig.apply(&s, &[]);
    assert!(rig.kernel.writes().is_empty());
    assert!(rig.links.calls().is_empty());
    assert!(
        rig.dcb.calls().iter().all(|c| c.starts_with("IEEE_GET")),
        "{:?}",
        rig.dcb.calls()
    );
    let d = condition(&o, "Degraded");
    assert_eq!(d.reason, "InvalidSpec");
    assert!(
        d.message
            .contains("spec.pfs[1].pciAddress: no PCI device 0000:99:00.0"),
        "{}",
        d.message
    );
    assert!(
        d.message.contains("spec.pfs[0].vfGroups[0].vfRange"),
        "{}",
        d.message
    );
    // The inventory is still reported so the controller can plan.
    assert_eq!(o.status.pfs.len(), 2);
}

#[test]
fn a_managed_pf_that_leaves_the_spec_goes_back_to_zero_vfs() {
    let rig = Rig::new();
    let s = RdmaNodeStateSpec {
        node_name: "n1".into(),
        pfs: vec![pf_config(PF0, "ens1f0", 8)],
        ..Default::default()
    };
    let o = rig.apply(&s, &[PF0, PF1]);
    assert_eq!(rig.kernel.writes(), [(pci(PF1), 0)]);
    assert_eq!(o.status.managed_pfs, [PF0]);
    // A PF kroce never managed is left alone.
    let rig = Rig::new();
    rig.apply(&s, &[]);
    assert!(rig.kernel.writes().is_empty());
}

#[test]
fn refused_irq_is_reported_not_fatal_and_irqbalance_is_noticed() {
    let rig = Rig::new();
    rig.apply(&spec(), &[]);
    let host = rig.host();
    let (_, irq, _) = irq_affinities(&host, PF1, &rig.path)[0].clone();
    // A file the agent cannot write (stands in for the EIO of managed IRQs).
    let f = rig.path.join(format!("proc/irq/{irq}/smp_affinity_list"));
    std::fs::write(&f, "0-31\n").unwrap();
    let d = rig.path.join(format!("proc/irq/{irq}"));
    let keep = d.join("keep");
    std::fs::rename(&f, &keep).unwrap();
    std::fs::create_dir(&f).unwrap();
    std::fs::write(f.join("x"), "").unwrap();
    std::fs::create_dir_all(rig.path.join("proc/4242")).unwrap();
    std::fs::write(rig.path.join("proc/4242/comm"), "irqbalance\n").unwrap();
    let o = rig.apply(&spec(), &[]);
    let p = o
        .status
        .irq_placement
        .iter()
        .find(|p| p.irq == irq)
        .unwrap();
    assert!(p.error.is_some(), "{p:?}");
    assert!(condition(&o, "IrqsRefused").is_true());
    assert_eq!(
        o.status.sync_state,
        SyncState::Succeeded,
        "refused IRQs are not fatal"
    );
    let ib = condition(&o, "IrqBalanceRunning");
    assert!(ib.is_true() && ib.message.contains("IRQBALANCE_BANNED_CPULIST"));
}

#[test]
fn missing_ecn_and_configfs_are_errors_naming_the_path() {
    let rig = Rig::new();
    std::fs::remove_dir_all(rig.path.join("sys/class/net/ens1f0/ecn")).unwrap();
    std::fs::remove_dir_all(rig.path.join("configfs/rdma_cm/mlx5_0")).unwrap();
    // No VF change, so the simulated kernel lays nothing out again.
    let mut s = spec();
    s.pfs[0] = pf_config(PF0, "ens1f0", 8);
    let o = rig.apply(&s, &[]);
    let d = condition(&o, "Degraded");
    assert!(
        d.message.contains("ens1f0/ecn/roce_rp/enable/3"),
        "{}",
        d.message
    );
    // The agent made the group; the ports the kernel would add are absent here.
    assert!(rig.path.join("configfs/rdma_cm/mlx5_0").is_dir());
    assert!(
        d.message
            .contains("rdma_cm/mlx5_0/ports/1/default_roce_mode"),
        "{}",
        d.message
    );
}

#[test]
fn vfs_that_never_appear_time_out_with_what_is_missing() {
    // The real sysfs writer on a fixture: the file changes, no kernel creates VFs.
    let rig = Rig::new();
    let ctl = SysfsVfControl {
        root: rig.config.root.clone(),
        timeout: Duration::from_secs(5),
    };
    let mut config = rig.config.clone();
    config.vf_wait = Duration::from_millis(200);
    let agent = Agent {
        config: &config,
        vfs: &ctl,
        links: &*rig.links,
        dcb: &*rig.dcb,
    };
    let mut s = spec();
    s.pfs[1].num_vfs = 16;
    s.pfs[1].vf_groups[0].vf_range = "0-15".into();
    let o = agent.apply(&s, &[], &PodSnapshot::default());
    let d = condition(&o, "Degraded");
    assert_eq!(d.reason, "VfNotReady", "{d:?}");
    assert!(
        d.message.contains("did not appear within 200ms"),
        "{}",
        d.message
    );
    assert!(d.message.contains("8 of 16 VFs listed"), "{}", d.message);
    assert!(d.message.contains("0000:86:00.0"), "{}", d.message);
}

#[test]
fn held_vfs_are_reported_as_data_for_the_drain() {
    let rig = Rig::new();
    rig.kernel
        .host
        .lock()
        .unwrap()
        .remove_netdev("ens1f0v5")
        .unwrap();
    let status = r#"[{"name":"team-a/fast","device-info":{"type":"pci","pci":{"pci-address":"0000:3b:00.3"}}}]"#;
    let pods = PodSnapshot::from_pods([("team-a", "trainer-0", status)]);
    let o = rig.agent().apply(&spec(), &[], &pods);
    let held: Vec<(&str, u32, &str, Vec<&str>)> = o
        .status
        .held_vfs
        .iter()
        .map(|h| {
            (
                h.pf.as_str(),
                h.index,
                h.pci_address.as_str(),
                h.pods.iter().map(String::as_str).collect(),
            )
        })
        .collect();
    assert_eq!(
        held,
        [
            (PF0, 1, "0000:3b:00.3", vec!["team-a/trainer-0"]),
            // Not a pod kroce can name: reported, never evicted.
            (PF0, 5, "0000:3b:00.7", vec![]),
        ]
    );
    assert!(o.status.held_vfs[1].reason.contains("no netdev"));
    // Once nothing holds them, the list empties.
    rig.kernel
        .host
        .lock()
        .unwrap()
        .add_virtual_netdev("ens1f0v5", "02:00:00:00:05:05", 1500)
        .unwrap();
    let o = rig.apply(&spec(), &[]);
    assert!(o.status.held_vfs.is_empty(), "{:?}", o.status.held_vfs);
}

#[test]
fn soft_devices_are_checked_not_created() {
    let rig = Rig::new();
    rig.kernel
        .host
        .lock()
        .unwrap()
        .add_rxe("rxe_kvf0", "kvf0")
        .unwrap();
    let spec = RdmaNodeStateSpec {
        node_name: "n1".into(),
        pfs: vec![],
        soft_devices: vec![kroce_operator::crd::SoftDeviceGroup {
            network: "rxe".into(),
            resource_name: "rdma/vf".into(),
            if_names: vec!["kvf0".into(), "kvf1".into()],
        }],
    };
    let o = rig.apply(&spec, &[]);
    assert!(rig.kernel.writes().is_empty(), "{:?}", rig.kernel.writes());
    assert!(o.changes.is_empty(), "{:?}", o.changes);
    assert_eq!(o.status.sync_state, SyncState::Failed);
    let d = condition(&o, "Degraded");
    assert_eq!(d.reason, "SoftDeviceMissing");
    assert!(d.message.contains("kvf1"), "{}", d.message);
    let found: Vec<(&str, bool)> = o
        .status
        .soft_devices
        .iter()
        .map(|s| (s.if_name.as_str(), s.present))
        .collect();
    assert_eq!(found, [("kvf0", true), ("kvf1", false)]);
    // The admin (or the kind e2e) adds the second device: in sync, nothing written.
    rig.kernel
        .host
        .lock()
        .unwrap()
        .add_rxe("rxe_kvf1", "kvf1")
        .unwrap();
    let o = rig.apply(&spec, &[]);
    assert_eq!(o.status.sync_state, SyncState::Succeeded, "{:#?}", o.status);
    assert_eq!(
        o.status.soft_devices[1].rdma_device.as_deref(),
        Some("rxe_kvf1")
    );
    assert!(rig.kernel.writes().is_empty());
}

/// A kernel with an mlx5 that refuses PFC: the GET answers, `IEEE_SET`
/// with a PFC attribute comes back ACK 0 with -EINVAL in band (what
/// `dcbnl_ieee_set` does with the driver's error), everything else 0.
#[derive(Debug, Default)]
struct PfcRefusingKernel {
    sent: Vec<Vec<u8>>,
}

impl super::dcb::NetlinkTransport for PfcRefusingKernel {
    fn request(&mut self, msg: &[u8]) -> std::io::Result<Vec<Vec<u8>>> {
        use super::dcb::{RTM_GETDCB, RTM_SETDCB, cmd, encode};
        self.sent.push(msg.to_vec());
        let seq = u32::from_ne_bytes([msg[8], msg[9], msg[10], msg[11]]);
        let command = msg[17];
        let attr = |kind: u16, payload: &[u8]| {
            let mut a = Vec::new();
            a.extend(((4 + payload.len()) as u16).to_ne_bytes());
            a.extend(kind.to_ne_bytes());
            a.extend(payload);
            a.resize(a.len().div_ceil(4) * 4, 0);
            a
        };
        if command == cmd::IEEE_GET {
            let pfc = super::dcb::IeeePfc {
                pfc_cap: 8,
                ..Default::default()
            };
            let mut a = attr(13, &attr(2, &pfc.to_bytes()));
            a.extend(attr(14, &[DCB_CAP_DCBX_HOST | DCB_CAP_DCBX_VER_IEEE]));
            return Ok(vec![encode(RTM_GETDCB, command, seq, &a)]);
        }
        // DCB_ATTR_IEEE_PFC (2) inside the DCB_ATTR_IEEE nest at byte 32.
        let is_pfc = msg.len() > 40 && msg[38] == 2;
        let status = if command == cmd::IEEE_SET && is_pfc {
            (-libc::EINVAL) as u8
        } else {
            0
        };
        let kind = if command == cmd::SDCBX { 14 } else { 13 };
        Ok(vec![encode(
            RTM_SETDCB,
            command,
            seq,
            &attr(kind, &[status]),
        )])
    }
}

/// PFC refused by the driver is not "applied": the pass fails and the node
/// state's conditions say which PF refused what; the DSCP trust that the
/// driver took is still applied.
#[test]
fn a_driver_refusing_pfc_fails_the_pass_and_names_the_pf() {
    let rig = Rig::new();
    let dcb = super::dcb::NetlinkDcb::new(PfcRefusingKernel::default());
    let agent = Agent {
        config: &rig.config,
        vfs: &*rig.kernel,
        links: &*rig.links,
        dcb: &dcb,
    };
    let o = agent.apply(&spec(), &[], &PodSnapshot::default());
    assert_eq!(o.status.sync_state, SyncState::Failed, "{:#?}", o.status);
    let d = condition(&o, "Degraded");
    assert!(d.is_true());
    assert_eq!(d.reason, "DcbRefused");
    assert!(
        d.message.contains(PF0)
            && d.message.contains("PFC")
            && d.message.contains("Invalid argument"),
        "{}",
        d.message
    );
    assert!(
        !o.changes.iter().any(|c| c.contains("PFC")),
        "{:?}",
        o.changes
    );
    assert!(
        o.changes.iter().any(|c| c.contains("trust dscp")),
        "{:?}",
        o.changes
    );
}
