//! The agent against fixture hosts whose simulated kernel creates and
//! removes VF entries when `sriov_numvfs` is written.

use super::apply::{Agent, AgentConfig, ApplyOutcome};
use super::dcb::{DCB_CAP_DCBX_HOST, DCB_CAP_DCBX_VER_IEEE, FakeDcb};
use super::holders::{HolderSources, NodeHolders};
use super::links::FixtureLinks;
use super::pf_record::MemPfRecord;
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
pub(super) fn lay_out_kernel_files(host: &FixtureHost) {
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
    pub(super) record: Arc<MemPfRecord>,
    pub(super) netns_mode: Arc<crate::netns_mode::fake::FakeNetnsMode>,
    pub(super) config: AgentConfig,
    pub(super) path: PathBuf,
}

impl Rig {
    pub(super) fn new() -> Rig {
        Rig::with_kernel_hook(lay_out_kernel_files)
    }

    /// `hook` runs after each simulated `sriov_numvfs` write (it must lay
    /// out the kernel files, as [`lay_out_kernel_files`] does).
    pub(super) fn with_kernel_hook(hook: fn(&FixtureHost)) -> Rig {
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
        kernel.after_write = Some(hook);
        Rig {
            kernel: Arc::new(kernel),
            links: Arc::new(links),
            dcb: Arc::new(FakeDcb::default()),
            record: Arc::new(MemPfRecord::default()),
            netns_mode: Arc::new(crate::netns_mode::fake::FakeNetnsMode::new(
                Some(kroce_netlink::rdma::RdmaNetnsMode::Shared),
                0,
                None,
            )),
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
            record: &*self.record,
            netns_mode: &*self.netns_mode,
        }
    }

    /// Where the fixture host keeps kroce-cni's claims and the DRA checkpoint.
    pub(super) fn sources(&self) -> HolderSources {
        HolderSources {
            cni_state_dir: self.path.join("var/lib/cni/kroce"),
            dra_checkpoint: self.path.join("var/lib/kroce/dra/checkpoint.json"),
            cni_state_required: false,
        }
    }

    /// One pass, with the holders the node's records name.
    pub(super) fn apply(&self, spec: &RdmaNodeStateSpec) -> ApplyOutcome {
        self.agent()
            .apply(spec, &NodeHolders::read(&self.sources()))
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
    let o = rig.apply(&spec());
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
    let again = rig.apply(&spec());
    assert!(again.changes.is_empty(), "{:#?}", again.changes);
    assert_eq!(rig.kernel.writes().len(), 2);
}

#[test]
fn drift_is_detected_and_put_back() {
    let rig = Rig::new();
    let first = rig.apply(&spec());
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

    let o = rig.apply(&spec());
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
    let o = rig.apply(&spec());
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

/// A kroce-cni claim on `vf` (of PF0) for pod `ns/pod`, written by
/// kroce-cni's own state code, as ADD writes it.
pub(super) fn cni_claim(rig: &Rig, vf: &str, ns: &str, pod: &str) {
    use kroce_cni::state::{Claim, Original, Phase, Planned, StateDir};
    use kroce_cni::vf::{Target, VfTarget};
    let claim = Claim {
        version: 1,
        vf: Target::Vf(VfTarget {
            pci: pci(vf),
            pf_pci: pci(PF0),
            vf_index: 1,
            pf_ifname: "ens1f0".into(),
            netdev: Some("ens1f0v1".into()),
            rdma: None,
            rdma_soft: None,
            driver: Some("mlx5_core".into()),
            pf_driver: None,
        }),
        container_id: "0123456789abcdef0123".into(),
        ifname: "net1".into(),
        netns: "/var/run/netns/cni-1".into(),
        network: "fast".into(),
        phase: Phase::Attached,
        original: Original {
            link: kroce_netlink::route::LinkInfo {
                index: 7,
                name: "ens1f0v1".into(),
                mac: None,
                mtu: 1500,
                up: false,
                altnames: Vec::new(),
                parent_dev: Some(vf.into()),
            },
            vf: None,
        },
        planned: Planned::default(),
        pod_ifindex: None,
        result: None,
        config: serde_json::json!({"cniVersion": "1.1.0", "name": "fast", "type": "kroce-cni"}),
        cni_args: format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE={ns};K8S_POD_NAME={pod};K8S_POD_INFRA_CONTAINER_ID=0123"
        ),
        cni_path: vec!["/opt/cni/bin".into()],
    };
    StateDir::new(rig.sources().cni_state_dir)
        .write_claim(&claim)
        .unwrap();
}

/// A DRA checkpoint (`dra/src/checkpoint.rs`, version 1) with one
/// prepared claim `ns/name` on the VF device of `vf`.
pub(super) fn dra_checkpoint(rig: &Rig, vf: &str, ns: &str, name: &str, attach: bool) {
    let device = crate::holders::dra_vf_device_name(vf);
    let cp = serde_json::json!({
        "version": 1,
        "claims": {
            "8d9e3b52-0f3c-4c39-9a55-6d0b1d3a7f10": {
                "namespace": ns, "name": name,
                "devices": [{
                    "requestNames": ["vf"], "pool": "n1", "device": device,
                    "cdiDeviceIds": [format!("rdma.kroce.io/vf={device}")],
                    "config": {"attach": attach}
                }],
                "files": []
            }
        }
    });
    let path = rig.sources().dra_checkpoint;
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, serde_json::to_vec_pretty(&cp).unwrap()).unwrap();
}

/// Issue 19: a pod's own Multus annotation (which its author writes) no
/// longer holds a VF; kroce-cni's claim on it does, naming the pod the
/// runtime gave kroce-cni.
#[test]
fn vfs_held_by_pods_are_not_pulled_and_the_pods_are_named() {
    let rig = Rig::new();
    cni_claim(&rig, "0000:3b:00.3", "team-a", "trainer-0");
    let o = rig.apply(&spec());
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
    let o = rig.apply(&spec());
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
    let o = rig.apply(&spec());
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
    let o = rig.apply(&s);
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

/// Sets a PF's VF count on the fixture host as an admin (or the firmware)
/// would, outside kroce.
fn admin_sets_vfs(rig: &Rig, pf: &str, n: u32) {
    let mut host = rig.kernel.host.lock().unwrap();
    host.set_num_vfs(&pci(pf), 0).unwrap();
    host.set_num_vfs(&pci(pf), n).unwrap();
}

fn only(pfs: Vec<kroce_operator::crd::PfConfig>) -> RdmaNodeStateSpec {
    RdmaNodeStateSpec {
        node_name: "n1".into(),
        pfs,
        ..Default::default()
    }
}

fn vfs_on(rig: &Rig, pf: &str) -> u32 {
    rig.host().pci[&pci(pf)].sriov.as_ref().unwrap().num_vfs
}

/// Issue 24: VFs that existed before any network (4 on ens2f0, made by
/// the admin) are not kroce's: the network asks for 4, so kroce writes
/// nothing, and when the network goes the PF keeps its 4. The old agent
/// listed it in managedPfs and wrote 4 -> 0.
#[test]
fn vfs_that_were_there_before_kroce_stay_when_the_network_goes() {
    let rig = Rig::new();
    admin_sets_vfs(&rig, PF1, 4);
    let s = only(vec![
        pf_config(PF0, "ens1f0", 8),
        pf_config(PF1, "ens2f0", 4),
    ]);
    let o = rig.apply(&s);
    assert_eq!(o.status.sync_state, SyncState::Succeeded, "{:#?}", o.status);
    assert!(rig.kernel.writes().is_empty(), "{:?}", rig.kernel.writes());
    assert!(rig.record.entries().is_empty(), "kroce changed nothing");
    // The network is deleted (or the node deselected): an empty spec.
    let o = rig.apply(&only(vec![]));
    assert!(rig.kernel.writes().is_empty(), "{:?}", rig.kernel.writes());
    assert_eq!(vfs_on(&rig, PF1), 4);
    assert_eq!(vfs_on(&rig, PF0), 8);
    assert!(
        o.status.managed_pfs.is_empty(),
        "{:?}",
        o.status.managed_pfs
    );
}

/// Issue 24: a PF kroce raised from 0 to 8 goes back to 0 on release, and
/// one it raised from 4 to 8 goes back to 4 (never below what was there).
#[test]
fn a_released_pf_goes_back_to_its_vf_count_from_before_kroce() {
    let rig = Rig::new();
    admin_sets_vfs(&rig, PF0, 0);
    admin_sets_vfs(&rig, PF1, 4);
    let s = only(vec![
        pf_config(PF0, "ens1f0", 8),
        pf_config(PF1, "ens2f0", 8),
    ]);
    let o = rig.apply(&s);
    assert_eq!(o.status.sync_state, SyncState::Succeeded, "{:#?}", o.status);
    assert_eq!((vfs_on(&rig, PF0), vfs_on(&rig, PF1)), (8, 8));
    let before: Vec<(String, u32)> = rig.record.entries().into_iter().collect();
    assert_eq!(before, [(PF0.to_string(), 0), (PF1.to_string(), 4)]);
    // A later spec change keeps the first "before".
    let s2 = only(vec![
        pf_config(PF0, "ens1f0", 2),
        pf_config(PF1, "ens2f0", 8),
    ]);
    rig.apply(&s2);
    assert_eq!(rig.record.entries()[PF0], 0);
    let writes = rig.kernel.writes().len();

    let o = rig.apply(&only(vec![]));
    assert_eq!(o.status.sync_state, SyncState::Succeeded, "{:#?}", o.status);
    assert_eq!(
        rig.kernel.writes()[writes..],
        [(pci(PF0), 0), (pci(PF1), 0), (pci(PF1), 4)]
    );
    assert_eq!((vfs_on(&rig, PF0), vfs_on(&rig, PF1)), (0, 4));
    assert!(rig.record.entries().is_empty(), "released: kroce's no more");
    assert!(o.status.managed_pfs.is_empty());
    assert!(
        o.changes
            .iter()
            .any(|c| c.contains("sriov_numvfs 8 -> 4 (released")),
        "{:?}",
        o.changes
    );
    // Released PFs are the admin's again: another pass writes nothing.
    rig.apply(&only(vec![]));
    assert_eq!(rig.kernel.writes().len(), writes + 3);
}

/// The record is saved before the first write: a save that fails leaves
/// the PF untouched, with the reason.
#[test]
fn no_vf_count_change_without_its_record() {
    let rig = Rig::new();
    rig.record
        .fail_saves
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let o = rig.apply(&spec());
    assert!(rig.kernel.writes().is_empty(), "{:?}", rig.kernel.writes());
    let d = condition(&o, "Degraded");
    assert_eq!(d.reason, "PfRecordUnwritable");
    assert!(
        d.message.contains("0000:3b:00.0") && d.message.contains("8 -> 4"),
        "{}",
        d.message
    );
}

/// A held VF blocks a release like any change; the PF stays recorded and
/// managed until it is back at its old count.
#[test]
fn a_release_waits_for_held_vfs() {
    let rig = Rig::new();
    rig.apply(&spec());
    assert_eq!(rig.record.entries()[PF0], 8);
    cni_claim(&rig, "0000:3b:00.3", "team-a", "trainer-0");
    let o = rig.apply(&only(vec![]));
    assert_eq!(vfs_on(&rig, PF0), 4);
    assert_eq!(o.status.managed_pfs, [PF0]);
    assert!(
        condition(&o, "VfsHeld")
            .message
            .contains("team-a/trainer-0")
    );
    std::fs::remove_dir_all(rig.sources().cni_state_dir.join("vf")).unwrap();
    let o = rig.apply(&only(vec![]));
    assert_eq!(vfs_on(&rig, PF0), 8);
    assert!(o.status.managed_pfs.is_empty());
}

#[test]
fn refused_irq_is_reported_not_fatal_and_irqbalance_is_noticed() {
    let rig = Rig::new();
    rig.apply(&spec());
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
    let o = rig.apply(&spec());
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
    // The driver has RoCE ECN (the `ecn` dir) but not this file.
    std::fs::remove_file(rig.path.join("sys/class/net/ens1f0/ecn/roce_rp/enable/3")).unwrap();
    std::fs::remove_dir_all(rig.path.join("configfs/rdma_cm/mlx5_0")).unwrap();
    // No VF change, so the simulated kernel lays nothing out again.
    let mut s = spec();
    s.pfs[0] = pf_config(PF0, "ens1f0", 8);
    let o = rig.apply(&s);
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
    let ctl = SysfsVfControl::new(rig.config.root.clone(), Duration::from_secs(5));
    let mut config = rig.config.clone();
    config.vf_wait = Duration::from_millis(200);
    let agent = Agent {
        config: &config,
        vfs: &ctl,
        links: &*rig.links,
        dcb: &*rig.dcb,
        record: &*rig.record,
        netns_mode: &*rig.netns_mode,
    };
    let mut s = spec();
    s.pfs[1].num_vfs = 16;
    s.pfs[1].vf_groups[0].vf_range = "0-15".into();
    let o = agent.apply(&s, &NodeHolders::default());
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
    cni_claim(&rig, "0000:3b:00.3", "team-a", "trainer-0");
    let o = rig.apply(&spec());
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
    assert!(
        o.status.held_vfs[0]
            .reason
            .contains("kroce-cni claim (network fast"),
        "{}",
        o.status.held_vfs[0].reason
    );
    // Once nothing holds them, the list empties.
    rig.kernel
        .host
        .lock()
        .unwrap()
        .add_virtual_netdev("ens1f0v5", "02:00:00:00:05:05", 1500)
        .unwrap();
    std::fs::remove_dir_all(rig.sources().cni_state_dir.join("vf")).unwrap();
    let o = rig.apply(&spec());
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
        rdma_netns_modes: vec![],
    };
    let o = rig.apply(&spec);
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
    let o = rig.apply(&spec);
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
    fn request(&mut self, msg: &kroce_netlink::MsgBuilder) -> std::io::Result<Vec<Vec<u8>>> {
        use kroce_netlink::dcb::{RTM_GETDCB, RTM_SETDCB, cmd};
        let msg = msg.finish(1);
        self.sent.push(msg.clone());
        let command = msg[17];
        // Reply payloads: `dcbmsg` + attributes.
        let encode = |_type: u16, command: u8, attrs: &[u8]| {
            let mut m = vec![0, command, 0, 0];
            m.extend_from_slice(attrs);
            m
        };
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
            return Ok(vec![encode(RTM_GETDCB, command, &a)]);
        }
        // DCB_ATTR_IEEE_PFC (2) inside the DCB_ATTR_IEEE nest at byte 32.
        let is_pfc = msg.len() > 40 && msg[38] == 2;
        let status = if command == cmd::IEEE_SET && is_pfc {
            (-libc::EINVAL) as u8
        } else {
            0
        };
        let kind = if command == cmd::SDCBX { 14 } else { 13 };
        Ok(vec![encode(RTM_SETDCB, command, &attr(kind, &[status]))])
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
        record: &*rig.record,
        netns_mode: &*rig.netns_mode,
    };
    let o = agent.apply(&spec(), &NodeHolders::default());
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

/// Issue 25: a NIC without DCB or RoCE ECN (igb: `DCB IEEE_GET on eth0:
/// Operation not supported`, no `/sys/class/net/eth0/ecn`) gets a clear
/// "not supported by this driver" condition; everything else is applied
/// and the pass succeeds. The old agent failed the whole sync.
#[test]
fn a_driver_without_dcb_or_ecn_is_reported_unsupported_not_failed() {
    let mut rig = Rig::new();
    rig.dcb = Arc::new(FakeDcb {
        unsupported: vec!["ens1f0".into()],
        ..Default::default()
    });
    std::fs::remove_dir_all(rig.path.join("sys/class/net/ens1f0/ecn")).unwrap();
    // No VF change, so the simulated kernel lays no ECN files out again.
    let mut s = spec();
    s.pfs[0] = pf_config(PF0, "ens1f0", 8);
    s.pfs[0].qos = Some(QosSpec {
        pfc_priority: 3,
        ..Default::default()
    });
    let o = rig.apply(&s);
    assert_eq!(o.status.sync_state, SyncState::Succeeded, "{:#?}", o.status);
    assert!(condition(&o, "Ready").is_true());
    assert!(
        !condition(&o, "Degraded").is_true(),
        "{:?}",
        condition(&o, "Degraded")
    );
    let u = condition(&o, "QosUnsupported");
    assert!(u.is_true());
    assert_eq!(u.reason, "NotSupportedByDriver");
    assert!(
        u.message.contains("ens1f0 (0000:3b:00.0)")
            && u.message
                .contains("DCB (PFC, trust) not supported by this driver")
            && u.message.contains("Operation not supported")
            && u.message.contains("RoCE ECN not supported by this driver")
            && u.message.contains("ens1f0/ecn"),
        "{}",
        u.message
    );
    // The other PF's QoS and everything else went on.
    assert!(
        o.changes.iter().any(|c| c.starts_with("ens2f0: ")),
        "{:?}",
        o.changes
    );
    assert!(
        o.changes.iter().any(|c| c.contains("MTU")),
        "{:?}",
        o.changes
    );
}

/// Issue 25: IRQs a VF has not requested yet (igbvf requests its MSI-X
/// vectors when the netdev opens, so `/proc/irq/N` is not there) are
/// reported as pending, not as "kept their affinity", and are pinned at a
/// later pass once they appear.
#[test]
fn irqs_of_a_down_device_are_pending_and_pinned_when_they_appear() {
    let rig = Rig::new();
    rig.apply(&spec());
    let host = rig.host();
    // Every VF IRQ of ens1f0 not requested yet.
    let vf_irqs: Vec<u32> = irq_affinities(&host, PF0, &rig.path)
        .into_iter()
        .filter(|(dev, _, _)| dev != PF0)
        .map(|(_, irq, _)| irq)
        .collect();
    assert!(!vf_irqs.is_empty());
    let saved = rig.path.join("saved-irqs");
    std::fs::create_dir_all(&saved).unwrap();
    for irq in &vf_irqs {
        std::fs::rename(
            rig.path.join(format!("proc/irq/{irq}")),
            saved.join(irq.to_string()),
        )
        .unwrap();
    }
    let o = rig.apply(&spec());
    assert_eq!(o.status.sync_state, SyncState::Succeeded, "{:#?}", o.status);
    let p = condition(&o, "IrqsPending");
    assert!(p.is_true());
    assert_eq!(p.reason, "DeviceDown");
    assert!(
        p.message.starts_with(&format!(
            "{} IRQs not allocated yet (device down)",
            vf_irqs.len()
        )),
        "{}",
        p.message
    );
    assert!(!condition(&o, "IrqsRefused").is_true(), "not refused");
    assert_eq!(o.irqs_pending, vf_irqs.len());
    let pending = o
        .status
        .irq_placement
        .iter()
        .find(|p| p.irq == vf_irqs[0])
        .unwrap();
    assert!(
        pending
            .error
            .as_deref()
            .unwrap()
            .contains("not requested by the driver yet"),
        "{pending:?}"
    );
    // The netdevs open: the kernel adds the IRQs with its default affinity.
    for irq in &vf_irqs {
        let d = rig.path.join(format!("proc/irq/{irq}"));
        std::fs::rename(saved.join(irq.to_string()), &d).unwrap();
        std::fs::write(d.join("smp_affinity_list"), "0-31\n").unwrap();
    }
    let o = rig.apply(&spec());
    assert!(!condition(&o, "IrqsPending").is_true());
    assert_eq!(o.irqs_pending, 0);
    for (dev, irq, cpus) in irq_affinities(&rig.host(), PF0, &rig.path) {
        let list: Vec<u32> = cpus.cpus().collect();
        assert!(
            list.len() == 1 && (2..=15).contains(&list[0]),
            "IRQ {irq} of {dev}: {cpus}"
        );
    }
}

/// Issue 22: the spec's `rdmaNetnsModes` reach the host through the agent's
/// pass: applied live when the kernel allows it, `RdmaNetnsModePending` /
/// `RebootRequired` when a netns exists, Degraded naming both networks
/// (nothing written) when they disagree; the VFs are configured either way.
#[test]
fn netns_mode_is_applied_reported_and_conflicts_write_nothing() {
    use crate::netns_mode::{CONFLICT_REASON, PENDING_CONDITION, REBOOT_REQUIRED, render};
    use kroce_netlink::rdma::RdmaNetnsMode;
    use kroce_operator::crd::{NetnsModeRequest, RdmaNetnsModeSetting as M};
    let req = |n: &str, mode| NetnsModeRequest {
        network: n.into(),
        mode,
    };
    let rig = Rig::new();
    // No mode asked: the condition is there, False.
    let o = rig.apply(&spec());
    assert_eq!(o.status.sync_state, SyncState::Succeeded);
    assert!(!condition(&o, PENDING_CONDITION).is_true());
    let mut s = spec();
    s.rdma_netns_modes = vec![req("fast", M::Exclusive)];
    let o = rig.apply(&s);
    assert_eq!(o.status.sync_state, SyncState::Succeeded, "{:#?}", o.status);
    let c = condition(&o, PENDING_CONDITION);
    assert!(!c.is_true() && c.reason == "Applied", "{c:?}");
    assert_eq!(rig.netns_mode.state().live, Some(RdmaNetnsMode::Exclusive));
    assert!(
        o.changes.iter().any(|c| c.contains("set to exclusive")),
        "{:?}",
        o.changes
    );
    // A pod's netns exists now: shared can only come with a reboot.
    rig.netns_mode.state().other_netns = 1;
    s.rdma_netns_modes = vec![req("fast", M::Shared)];
    let o = rig.apply(&s);
    let c = condition(&o, PENDING_CONDITION);
    assert!(c.is_true() && c.reason == REBOOT_REQUIRED, "{c:?}");
    assert_eq!(o.status.sync_state, SyncState::Succeeded);
    assert_eq!(rig.netns_mode.state().live, Some(RdmaNetnsMode::Exclusive));
    assert_eq!(
        rig.netns_mode.state().file.as_deref(),
        Some(render(RdmaNetnsMode::Shared).as_str())
    );
    // Two networks disagree: Degraded names both, the host keeps all.
    let sets = rig.netns_mode.state().sets.len();
    s.rdma_netns_modes = vec![req("fast", M::Exclusive), req("slow", M::Shared)];
    let o = rig.apply(&s);
    assert_eq!(o.status.sync_state, SyncState::Failed);
    let d = condition(&o, "Degraded");
    assert!(d.is_true() && d.reason == CONFLICT_REASON, "{d:?}");
    assert!(
        d.message.contains("fast") && d.message.contains("slow"),
        "{d:?}"
    );
    assert_eq!(rig.netns_mode.state().sets.len(), sets);
    assert_eq!(
        rig.netns_mode.state().file.as_deref(),
        Some(render(RdmaNetnsMode::Shared).as_str())
    );
    assert_eq!(o.status.configured_pfs, 2, "the PFs are still configured");
}
