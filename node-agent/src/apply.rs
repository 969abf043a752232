//! One pass of the agent: validate the spec against the host, then VFs,
//! MTU, IRQs, QoS, each only where the host differs from the spec (so the
//! same pass is the first apply and the drift repair), then the report.

use super::dcb::{DCB_CAP_DCBX_HOST, DCB_CAP_DCBX_VER_IEEE, Dcb, DcbApp, DcbError};
use super::holders::VfHolders;
use super::host_files::{ensure_value, irqbalance_running, read_trimmed};
use super::links::LinkControl;
use super::netns_mode::NetnsModeHost;
use super::pf_record::{ChangedPfs, PfRecord};
use super::soft::check_soft_devices;
use super::vfs::VfControl;
use kroce_operator::crd::{
    Condition, HeldVf, IrqPlacement, IrqPolicy, ObservedPf, ObservedQos, ObservedSoftDevice,
    ObservedVf, PfConfig, RdmaNodeStateSpec, RdmaNodeStateStatus, SyncState, Trust,
};
use kroce_operator::plan::irq::{IrqDevice, plan_irqs};
use kroce_operator::plan::qos::{ROCE_V2_MODE, dscp_map, ecn_files, plan_qos, rdma_cm_port_dir};
use sriov_helpers::{CpuList, Host, HostRoot, PciAddress, PciDevice};
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Roots and timings, all values so tests point them at fixture trees.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub root: HostRoot,
    /// Where configfs is mounted (`/sys/kernel/config` on a host).
    pub configfs: PathBuf,
    /// How long to wait for VF netdevs and RDMA devices after a write.
    pub vf_wait: Duration,
    pub poll: Duration,
}

/// The side-effect edges, passed in explicitly.
#[derive(Clone, Copy)]
pub struct Agent<'a> {
    pub config: &'a AgentConfig,
    pub vfs: &'a dyn VfControl,
    pub links: &'a dyn LinkControl,
    pub dcb: &'a dyn Dcb,
    /// Which PFs kroce changed and what they had before.
    pub record: &'a dyn PfRecord,
    /// The host's RDMA netns mode (live and kroce's modprobe.d file).
    pub netns_mode: &'a dyn NetnsModeHost,
}

impl std::fmt::Debug for Agent<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("config", self.config)
            .finish()
    }
}

/// The status to report and what this pass changed on the host.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ApplyOutcome {
    pub status: RdmaNodeStateStatus,
    /// One line per change made (empty when the host already matched).
    pub changes: Vec<String>,
    /// `(reason, message)` of each error of the pass (the loop logs them).
    pub problems: Vec<(String, String)>,
    /// IRQs not requested by their driver yet: worth an early re-check.
    pub irqs_pending: usize,
}

/// A spec PF resolved against the host, validated before any write.
#[derive(Debug)]
struct Target<'s> {
    addr: PciAddress,
    num_vfs: u32,
    config: Option<&'s PfConfig>,
}

#[derive(Debug, Default)]
struct Pass {
    changes: Vec<String>,
    errors: Vec<(String, String)>,
    held: Vec<String>,
    /// The same, as data for the controller's drain.
    held_vfs: Vec<HeldVf>,
    soft: Vec<ObservedSoftDevice>,
    refused_irqs: usize,
    /// IRQs the device has not requested yet (its netdev is down: igbvf
    /// requests its MSI-X vectors at open), pinned at a later pass.
    pending_irqs: usize,
    /// PFs whose earlier `sriov_numvfs` write is still in the kernel.
    busy: Vec<String>,
    /// What the spec asks that this PF's driver cannot do at all.
    unsupported: Vec<String>,
    placements: Vec<IrqPlacement>,
    blocked: BTreeSet<PciAddress>,
    /// `RdmaNetnsModePending`, from the netns mode step.
    netns_mode: Option<Condition>,
    /// PFs kroce changed, with their VF count before (loaded at the start
    /// of the pass, saved before each first write and after each release).
    record: ChangedPfs,
}

impl Pass {
    fn error(&mut self, reason: &str, msg: impl Into<String>) {
        self.errors.push((reason.to_string(), msg.into()));
    }
}

/// What a PF's VFs still lack when the wait for them ends (the VF count,
/// a VF's device, netdev or RDMA device).
#[derive(Debug, thiserror::Error)]
#[error("{}", .0.join(", "))]
struct VfPartsMissing(Vec<String>);

fn pf_label(host: &Host, addr: &PciAddress) -> String {
    match host.netdev_of(addr) {
        Some(n) => format!("{n} ({addr})"),
        None => addr.to_string(),
    }
}

impl Agent<'_> {
    /// Applies `spec`. PFs that left it go back to the VF count they had
    /// before kroce changed them (the [`PfRecord`]); PFs kroce never
    /// changed are never written.
    pub fn apply(&self, spec: &RdmaNodeStateSpec, holders: &dyn VfHolders) -> ApplyOutcome {
        let root = &self.config.root;
        let host = Host::scan(root);
        let mut pass = Pass::default();
        // The host-wide RDMA netns mode first: it depends on no PF, and a
        // bad PF spec must not keep it from the next boot's file.
        let netns = super::netns_mode::apply(self.netns_mode, &spec.rdma_netns_modes);
        pass.changes.extend(netns.changes);
        for (reason, msg) in netns.errors {
            pass.error(&reason, msg);
        }
        pass.netns_mode = Some(netns.condition);
        match self.record.load() {
            Ok(r) => pass.record = r,
            Err(e) => {
                // Without it a release could go below what was there
                // before kroce: no VF count changes at all this pass.
                pass.error("PfRecordUnreadable", e.to_string());
                return self.report(spec, &[], &host, pass);
            }
        }
        let targets = match self.resolve(spec, &pass.record, &host) {
            Ok(t) => t,
            Err(errors) => {
                for e in errors {
                    pass.error("InvalidSpec", e);
                }
                return self.report(spec, &[], &host, pass);
            }
        };
        // 1. VFs, all PFs first: the later steps need the new netdevs.
        for t in &targets {
            self.apply_vfs(&host, t, holders, &mut pass);
        }
        let host = Host::scan(root);
        for t in targets.iter().filter(|t| t.num_vfs > 0) {
            let Some(cfg) = t.config else { continue };
            if pass.blocked.contains(&t.addr) {
                continue;
            }
            self.apply_mtu(&host, t.addr, cfg, &mut pass);
            self.apply_irqs(&host, t.addr, cfg, &mut pass);
            if let Some(q) = &cfg.qos {
                self.apply_qos(&host, t.addr, q, &mut pass);
            }
        }
        let host = Host::scan(root);
        // Soft devices: nothing to create, only to find.
        let soft = check_soft_devices(&host, &spec.soft_devices);
        for (reason, msg) in soft.problems {
            pass.error(&reason, msg);
        }
        pass.soft = soft.observed;
        self.report(spec, &targets, &host, pass)
    }

    /// Validates every spec PF against the host before the first write.
    fn resolve<'s>(
        &self,
        spec: &'s RdmaNodeStateSpec,
        record: &ChangedPfs,
        host: &Host,
    ) -> Result<Vec<Target<'s>>, Vec<String>> {
        let mut errors = Vec::new();
        let mut targets = Vec::new();
        for (i, pf) in spec.pfs.iter().enumerate() {
            let field = format!("spec.pfs[{i}]");
            let addr = match pf.pci_address.parse::<PciAddress>() {
                Ok(a) => a,
                Err(e) => {
                    errors.push(format!("{field}.pciAddress: {e}"));
                    continue;
                }
            };
            let Some(dev) = host.pci.get(&addr) else {
                errors.push(format!(
                    "{field}.pciAddress: no PCI device {addr} on this node"
                ));
                continue;
            };
            let Some(sriov) = &dev.sriov else {
                errors.push(format!("{field}.pciAddress: {addr} is not an SR-IOV PF"));
                continue;
            };
            if pf.num_vfs > sriov.total_vfs {
                errors.push(format!(
                    "{field}.numVfs: {} is more than sriov_totalvfs {} of {addr}",
                    pf.num_vfs, sriov.total_vfs
                ));
            }
            for (j, g) in pf.vf_groups.iter().enumerate() {
                match g.vf_range.parse::<CpuList>() {
                    Ok(r) if r.cpus().all(|v| v < pf.num_vfs) => {}
                    Ok(_) => errors.push(format!(
                        "{field}.vfGroups[{j}].vfRange: {:?} goes beyond numVfs {}",
                        g.vf_range, pf.num_vfs
                    )),
                    Err(e) => errors.push(format!("{field}.vfGroups[{j}].vfRange: {e}")),
                }
            }
            if let Some(r) = &pf.irq_affinity.reserved_cpus
                && let Err(e) = r.parse::<CpuList>()
            {
                errors.push(format!("{field}.irqAffinity.reservedCpus: {e}"));
            }
            if let Some(q) = &pf.qos
                && q.pfc_priority > 7
            {
                errors.push(format!(
                    "{field}.qos.pfcPriority: {} is outside 0-7",
                    q.pfc_priority
                ));
            }
            targets.push(Target {
                addr,
                num_vfs: pf.num_vfs,
                config: Some(pf),
            });
        }
        // PFs kroce changed that left the spec go back to what they had
        // before kroce; a PF kroce never wrote is not a target.
        for (m, before) in &record.num_vfs_before {
            let Ok(addr) = m.parse::<PciAddress>() else {
                continue;
            };
            if targets.iter().any(|t| t.addr == addr) || !host.pci.contains_key(&addr) {
                continue;
            }
            targets.push(Target {
                addr,
                num_vfs: *before,
                config: None,
            });
        }
        if errors.is_empty() {
            Ok(targets)
        } else {
            Err(errors)
        }
    }

    fn apply_vfs(&self, host: &Host, t: &Target, holders: &dyn VfHolders, pass: &mut Pass) {
        let Some(dev) = host.pci.get(&t.addr) else {
            return;
        };
        let Some(sriov) = &dev.sriov else { return };
        let current = sriov.num_vfs;
        let key = t.addr.to_string();
        if current == t.num_vfs {
            // A released PF back where it was before kroce: kroce's no more.
            if t.config.is_none() {
                self.forget(&key, pass);
            }
            return;
        }
        let label = pf_label(host, &t.addr);
        // Any change goes through 0: every current VF goes away.
        let mut held = Vec::new();
        for (idx, vf) in &sriov.vfs {
            let hs = holders.holders(&vf.to_string());
            let mut pods: Vec<String> = hs.iter().filter_map(|h| h.pod.clone()).collect();
            pods.sort();
            pods.dedup();
            let reason = if !hs.is_empty() {
                let who: Vec<String> = hs
                    .iter()
                    .map(|h| match &h.pod {
                        Some(p) => format!("{p} ({})", h.what),
                        None => h.what.clone(),
                    })
                    .collect();
                format!("VF {idx} ({vf}) held by {}", who.join(", "))
            } else if let Some(d) = host.pci.get(vf)
                && d.driver.is_some()
                && !d.netdevs.iter().any(|n| host.netdevs.contains_key(n))
            {
                format!(
                    "VF {idx} ({vf}) has no netdev in the host namespace (in a pod, or bound to another driver)"
                )
            } else {
                continue;
            };
            pass.held_vfs.push(HeldVf {
                pf: t.addr.to_string(),
                index: *idx,
                pci_address: vf.to_string(),
                pods,
                reason: reason.clone(),
            });
            held.push(reason);
        }
        if !held.is_empty() {
            pass.held.push(format!(
                "PF {label}: not changing numVfs {current} -> {}: {}",
                t.num_vfs,
                held.join("; ")
            ));
            pass.blocked.insert(t.addr);
            return;
        }
        // Recorded before the first write: a crash after it must not leave
        // a PF kroce changed without what it had before.
        if !pass.record.num_vfs_before.contains_key(&key) {
            let mut next = pass.record.clone();
            next.num_vfs_before.insert(key.clone(), current);
            if let Err(e) = self.record.save(&next) {
                pass.error(
                    "PfRecordUnwritable",
                    format!(
                        "PF {label}: not changing numVfs {current} -> {}: {e}",
                        t.num_vfs
                    ),
                );
                pass.blocked.insert(t.addr);
                return;
            }
            pass.record = next;
        }
        let writes: Vec<u32> = if current != 0 && t.num_vfs != 0 {
            vec![0, t.num_vfs]
        } else {
            vec![t.num_vfs]
        };
        for n in writes {
            if let Err(e) = self.vfs.write_num_vfs(t.addr, n) {
                if matches!(e, super::vfs::SriovNumvfsError::Busy { .. }) {
                    // Not a failure yet: the kernel is still working.
                    pass.busy.push(format!("PF {label}: {e}"));
                } else {
                    pass.error(e.reason(), format!("PF {label}: {e}"));
                }
                pass.blocked.insert(t.addr);
                return;
            }
        }
        pass.changes.push(format!(
            "PF {label}: sriov_numvfs {current} -> {}{}",
            t.num_vfs,
            if t.config.is_none() {
                " (released: its VF count before kroce)"
            } else {
                ""
            }
        ));
        if t.config.is_none() {
            // Released: what the VFs need now is not kroce's to wait for
            // (an admin's VFs may be bound to vfio-pci, without netdevs).
            self.forget(&key, pass);
            return;
        }
        if t.num_vfs > 0
            && let Err(missing) = self.wait_for_vfs(t.addr, t.num_vfs)
        {
            pass.error(
                "VfNotReady",
                format!(
                    "PF {label}: VFs did not appear within {:?}: {missing}",
                    self.config.vf_wait
                ),
            );
            pass.blocked.insert(t.addr);
        }
    }

    /// Drops a released PF from the record (kept when the save fails: the
    /// next pass finds the PF at its old count and tries again).
    fn forget(&self, key: &str, pass: &mut Pass) {
        if !pass.record.num_vfs_before.contains_key(key) {
            return;
        }
        let mut next = pass.record.clone();
        next.num_vfs_before.remove(key);
        match self.record.save(&next) {
            Ok(()) => pass.record = next,
            Err(e) => pass.error("PfRecordUnwritable", format!("PF {key}: {e}")),
        }
    }

    /// Waits until the PF lists `num` VFs, each with a netdev and (when the
    /// PF has one) an RDMA device; `Err` says what is still missing.
    fn wait_for_vfs(&self, pf: PciAddress, num: u32) -> Result<(), VfPartsMissing> {
        let deadline = Instant::now() + self.config.vf_wait;
        loop {
            let missing = self.missing_vf_parts(pf, num);
            if missing.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(VfPartsMissing(missing));
            }
            std::thread::sleep(self.config.poll);
        }
    }

    fn missing_vf_parts(&self, pf: PciAddress, num: u32) -> Vec<String> {
        let host = Host::scan(&self.config.root);
        let Some(sriov) = host.pci.get(&pf).and_then(|d| d.sriov.clone()) else {
            return vec![format!("PF {pf} gone")];
        };
        let wants_rdma = host
            .pci
            .get(&pf)
            .is_some_and(|d| !d.rdma_devices.is_empty());
        let mut missing = Vec::new();
        if sriov.vfs.len() < num as usize {
            missing.push(format!("{} of {num} VFs listed", sriov.vfs.len()));
        }
        for (idx, vf) in &sriov.vfs {
            let Some(d) = host.pci.get(vf) else {
                missing.push(format!("VF {idx} ({vf}) device"));
                continue;
            };
            if d.netdevs.is_empty() {
                missing.push(format!("VF {idx} ({vf}) netdev"));
            }
            if wants_rdma && d.rdma_devices.is_empty() {
                missing.push(format!("VF {idx} ({vf}) RDMA device"));
            }
        }
        missing
    }

    fn vfs_of(host: &Host, pf: PciAddress) -> Vec<(u32, &PciDevice)> {
        host.pci
            .get(&pf)
            .and_then(|d| d.sriov.as_ref())
            .map(|s| {
                s.vfs
                    .iter()
                    .filter_map(|(i, a)| host.pci.get(a).map(|d| (*i, d)))
                    .collect()
            })
            .unwrap_or_default()
    }

    fn set_mtu_if_needed(&self, host: &Host, ifname: &str, mtu: u32, pass: &mut Pass) {
        let Some(nd) = host.netdevs.get(ifname) else {
            return; // in a pod's namespace: the CNI owns it there
        };
        if nd.mtu == Some(mtu) {
            return;
        }
        match self.links.set_mtu(ifname, mtu) {
            Ok(()) => pass.changes.push(format!(
                "{ifname}: MTU {} -> {mtu}",
                nd.mtu.map_or("?".to_string(), |m| m.to_string())
            )),
            Err(e) => pass.error("MtuFailed", e.to_string()),
        }
    }

    fn apply_mtu(&self, host: &Host, pf: PciAddress, cfg: &PfConfig, pass: &mut Pass) {
        // PF first: a VF's MTU cannot exceed its PF's.
        if let (Some(mtu), Some(name)) = (cfg.mtu, host.netdev_of(&pf)) {
            self.set_mtu_if_needed(host, name, mtu, pass);
        }
        let vfs = Self::vfs_of(host, pf);
        for g in &cfg.vf_groups {
            let Some(mtu) = g.mtu else { continue };
            let Ok(range) = g.vf_range.parse::<CpuList>() else {
                continue;
            };
            for (idx, vf) in &vfs {
                if range.contains(*idx)
                    && let Some(name) = vf.netdevs.first()
                {
                    self.set_mtu_if_needed(host, name, mtu, pass);
                }
            }
        }
    }

    fn apply_irqs(&self, host: &Host, pf: PciAddress, cfg: &PfConfig, pass: &mut Pass) {
        if cfg.irq_affinity.policy == IrqPolicy::None {
            return;
        }
        let Some(pf_dev) = host.pci.get(&pf) else {
            return;
        };
        let mut devices = vec![irq_device(host, pf_dev)];
        devices.extend(
            Self::vfs_of(host, pf)
                .into_iter()
                .map(|(_, d)| irq_device(host, d)),
        );
        let all_cpus = CpuList::from_cpus(host.numa.iter().flat_map(|n| n.cpus.cpus()));
        let plan = plan_irqs(&devices, &cfg.irq_affinity, &all_cpus);
        for p in plan.problems {
            pass.error("IrqPlacementImpossible", p);
        }
        let root = &self.config.root;
        for a in plan.assignments {
            let want = CpuList::from_cpus([a.cpu]);
            let mut placement = IrqPlacement {
                irq: a.irq,
                device: a.device.clone(),
                cpus: want.to_string(),
                error: None,
            };
            // Listed in the device's msi_irqs but not requested by its
            // driver yet (no /proc/irq/N until request_irq: igbvf does that
            // when the netdev opens): not refused, just not there yet.
            if !root.proc_irq().join(a.irq.to_string()).exists() {
                placement.cpus = String::new();
                placement.error = Some(format!(
                    "not requested by the driver yet (device down): no {}; pinned when it appears",
                    root.proc_irq().join(a.irq.to_string()).display()
                ));
                pass.pending_irqs += 1;
                pass.placements.push(placement);
                continue;
            }
            match sriov_helpers::irq::read_affinity(root, a.irq) {
                Ok(cur) if cur == want => {}
                Ok(cur) => match sriov_helpers::irq::write_affinity(root, a.irq, &want) {
                    Ok(()) => pass.changes.push(format!(
                        "IRQ {} ({}): CPUs {cur} -> {want}",
                        a.irq, a.device
                    )),
                    Err(e) => {
                        let eio = matches!(&e, sriov_helpers::HostError::Write { source, .. }
                            if source.raw_os_error() == Some(libc::EIO));
                        placement.cpus = cur.to_string();
                        placement.error = Some(if eio {
                            format!("kernel-managed IRQ, affinity fixed by the driver (EIO): {e}")
                        } else {
                            e.to_string()
                        });
                        pass.refused_irqs += 1;
                    }
                },
                Err(e) => {
                    placement.cpus = String::new();
                    placement.error = Some(e.to_string());
                    pass.refused_irqs += 1;
                }
            }
            pass.placements.push(placement);
        }
    }

    fn apply_qos(
        &self,
        host: &Host,
        pf: PciAddress,
        q: &kroce_operator::crd::QosSpec,
        pass: &mut Pass,
    ) {
        let plan = plan_qos(q);
        let Some(ifname) = host.netdev_of(&pf).map(str::to_string) else {
            pass.error("QosFailed", format!("PF {pf} has no netdev for DCB"));
            return;
        };
        let driver = host
            .pci
            .get(&pf)
            .and_then(|d| d.driver.clone())
            .unwrap_or_else(|| "unknown driver".into());
        // A driver's refusal is its own reason, so `kubectl get` tells it
        // from an unreachable netlink; the message names the PF. A driver
        // without dcbnl ops at all (igb: EOPNOTSUPP) is not a failed sync of
        // everything else: it is reported as unsupported.
        let dcb_failed = |pass: &mut Pass, e: DcbError| {
            let reason = match &e {
                DcbError::Io { source, .. } if source.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                    pass.unsupported.push(format!(
                        "PF {ifname} ({pf}), driver {driver}: DCB (PFC, trust) not supported by this driver ({e})"
                    ));
                    return;
                }
                DcbError::Refused { .. } => "DcbRefused",
                _ => "QosFailed",
            };
            pass.error(reason, format!("PF {pf}: {e}"));
        };
        // DCB: host-managed IEEE DCBX, PFC on the one priority, trust.
        match self.dcb.get(&ifname) {
            Ok(state) => {
                let want_dcbx = DCB_CAP_DCBX_HOST | DCB_CAP_DCBX_VER_IEEE;
                if state.dcbx != Some(want_dcbx) {
                    match self.dcb.set_dcbx(&ifname, want_dcbx) {
                        Ok(()) => pass.changes.push(format!("{ifname}: DCBX host/IEEE")),
                        Err(e) => dcb_failed(pass, e),
                    }
                }
                let mut pfc = state.pfc.unwrap_or_default();
                if pfc.pfc_en != plan.pfc_enabled {
                    let old = pfc.pfc_en;
                    pfc.pfc_en = plan.pfc_enabled;
                    match self.dcb.set_pfc(&ifname, &pfc) {
                        Ok(()) => pass.changes.push(format!(
                            "{ifname}: PFC {old:08b} -> {:08b}",
                            plan.pfc_enabled
                        )),
                        Err(e) => dcb_failed(pass, e),
                    }
                }
                let have = state.dscp_apps();
                match plan.trust {
                    Trust::Dscp => {
                        let missing: Vec<DcbApp> = dscp_map()
                            .into_iter()
                            .map(|(d, p)| DcbApp::dscp(d, p))
                            .filter(|a| !have.contains(a))
                            .collect();
                        if !missing.is_empty() {
                            match self.dcb.add_apps(&ifname, &missing) {
                                Ok(()) => pass.changes.push(format!(
                                    "{ifname}: trust dscp ({} DSCP mappings)",
                                    missing.len()
                                )),
                                Err(e) => dcb_failed(pass, e),
                            }
                        }
                    }
                    Trust::Pcp => {
                        if !have.is_empty() {
                            match self.dcb.del_apps(&ifname, &have) {
                                Ok(()) => pass.changes.push(format!("{ifname}: trust pcp")),
                                Err(e) => dcb_failed(pass, e),
                            }
                        }
                    }
                }
            }
            Err(e) => dcb_failed(pass, e),
        }
        // ECN on the priority, reaction and notification points. No `ecn`
        // directory at all: the driver has no RoCE ECN (igb); a missing
        // file in one that exists is an error.
        let ecn_dir = self
            .config
            .root
            .sys()
            .join("class/net")
            .join(&ifname)
            .join("ecn");
        if plan.ecn_priority.is_some() && !ecn_dir.is_dir() {
            pass.unsupported.push(format!(
                "PF {ifname} ({pf}), driver {driver}: RoCE ECN not supported by this driver (no {})",
                ecn_dir.display()
            ));
        } else if let Some(p) = plan.ecn_priority {
            for f in ecn_files(self.config.root.sys(), &ifname, p) {
                match ensure_value(&f, "1") {
                    Ok(true) => pass.changes.push(format!("{}: 1", f.display())),
                    Ok(false) => {}
                    Err(e) => pass.error("EcnFailed", format!("ECN not settable: {e}")),
                }
            }
        }
        // RDMA-CM defaults for the PF's and VFs' RDMA devices.
        let mut devs: Vec<&PciDevice> = host.pci.get(&pf).into_iter().collect();
        devs.extend(Self::vfs_of(host, pf).into_iter().map(|(_, d)| d));
        for d in devs {
            for name in &d.rdma_devices {
                self.apply_rdma_cm(host, name, plan.roce_tos, pass);
            }
        }
    }

    fn apply_rdma_cm(&self, host: &Host, dev: &str, tos: Option<u8>, pass: &mut Pass) {
        let group = self.config.configfs.join("rdma_cm").join(dev);
        // mkdir of the group makes the kernel populate ports/<n>/.
        if !group.exists()
            && let Err(e) = std::fs::create_dir(&group)
        {
            pass.error(
                "RdmaCmFailed",
                format!(
                    "{}: {e} (is configfs mounted and rdma_cm loaded?)",
                    group.display()
                ),
            );
            return;
        }
        let ports: Vec<u32> = host
            .rdma
            .get(dev)
            .map(|r| r.ports.iter().map(|p| p.num).collect())
            .unwrap_or_else(|| vec![1]);
        for port in ports {
            let dir = rdma_cm_port_dir(&self.config.configfs, dev, port);
            let mut want = vec![("default_roce_mode", ROCE_V2_MODE.to_string())];
            if let Some(t) = tos {
                want.push(("default_roce_tos", t.to_string()));
            }
            for (file, value) in want {
                match ensure_value(&dir.join(file), &value) {
                    Ok(true) => pass
                        .changes
                        .push(format!("{dev} port {port}: {file} = {value}")),
                    Ok(false) => {}
                    Err(e) => pass.error("RdmaCmFailed", e.to_string()),
                }
            }
        }
    }

    fn observed_qos(&self, ifname: &str) -> ObservedQos {
        let mut q = ObservedQos::default();
        if let Ok(s) = self.dcb.get(ifname) {
            if let Some(p) = s.pfc {
                q.pfc_priorities = (0u8..8).filter(|i| p.pfc_en & (1 << i) != 0).collect();
            }
            q.trust = Some(
                if s.dscp_apps().is_empty() {
                    "pcp"
                } else {
                    "dscp"
                }
                .into(),
            );
        }
        q.ecn_priorities = (0u8..8)
            .filter(|p| {
                ecn_files(self.config.root.sys(), ifname, *p)
                    .iter()
                    .all(|f| read_trimmed(f).is_ok_and(|v| v == "1"))
            })
            .collect();
        q
    }

    /// The status of the pass: what the host has now ([`Self::observed_pfs`]),
    /// what the pass did and what went wrong ([`conditions`]).
    fn report(
        &self,
        spec: &RdmaNodeStateSpec,
        targets: &[Target],
        host: &Host,
        pass: Pass,
    ) -> ApplyOutcome {
        let irqbalance = irqbalance_running(self.config.root.proc());
        let status = RdmaNodeStateStatus {
            pfs: self.observed_pfs(spec, host),
            managed_pfs: managed_pfs(spec, &pass.record),
            configured_pfs: configured_pfs(targets, &pass.blocked),
            conditions: conditions(&pass, irqbalance),
            sync_state: sync_state(&pass),
            last_error: last_error(&pass),
            irq_placement: pass.placements,
            soft_devices: pass.soft,
            held_vfs: pass.held_vfs,
            ..RdmaNodeStateStatus::default()
        };
        ApplyOutcome {
            status,
            changes: pass.changes,
            problems: pass.errors,
            irqs_pending: pass.pending_irqs,
        }
    }

    /// Every SR-IOV PF of the host as it is now, with its VFs, and its QoS
    /// (read from the device) where the spec asks for QoS on it.
    fn observed_pfs(&self, spec: &RdmaNodeStateSpec, host: &Host) -> Vec<ObservedPf> {
        let mut out = Vec::new();
        for pf in host.pfs() {
            let Some(sriov) = &pf.sriov else { continue };
            let if_name = host.netdev_of(&pf.address).map(str::to_string);
            let rdma = host.rdma_of_pci(&pf.address);
            let wants_qos = spec
                .pfs
                .iter()
                .any(|p| p.pci_address == pf.address.to_string() && p.qos.is_some());
            out.push(ObservedPf {
                pci_address: pf.address.to_string(),
                if_name: if_name.clone(),
                vendor: pf.vendor_hex(),
                device_id: pf.device_hex(),
                driver: pf.driver.clone(),
                total_vfs: sriov.total_vfs,
                num_vfs: sriov.num_vfs,
                numa_node: pf.numa_node,
                mtu: if_name
                    .as_ref()
                    .and_then(|n| host.netdevs.get(n))
                    .and_then(|n| n.mtu),
                rdma_device: rdma.map(|r| r.name.clone()),
                link_layer: rdma
                    .and_then(|r| r.ports.first())
                    .map(|p| p.link_layer.clone()),
                vfs: observed_vfs(host, pf.address),
                qos: match (&if_name, wants_qos) {
                    (Some(n), true) => Some(self.observed_qos(n)),
                    _ => None,
                },
            });
        }
        out
    }
}

/// The VFs of `pf` as the host scan found them.
fn observed_vfs(host: &Host, pf: PciAddress) -> Vec<ObservedVf> {
    Agent::vfs_of(host, pf)
        .into_iter()
        .map(|(index, d)| {
            let netdev = d.netdevs.first().cloned();
            ObservedVf {
                index,
                pci_address: d.address.to_string(),
                mtu: netdev
                    .as_ref()
                    .and_then(|n| host.netdevs.get(n))
                    .and_then(|n| n.mtu),
                netdev,
                rdma_device: d.rdma_devices.first().cloned(),
                numa_node: d.numa_node,
            }
        })
        .collect()
}

/// Still managed: every spec PF, and any PF kroce changed that is not back
/// at its VF count from before kroce yet.
fn managed_pfs(spec: &RdmaNodeStateSpec, record: &ChangedPfs) -> Vec<String> {
    let mut managed: BTreeSet<String> = spec.pfs.iter().map(|p| p.pci_address.clone()).collect();
    managed.extend(record.num_vfs_before.keys().cloned());
    managed.into_iter().collect()
}

/// Spec PFs the pass got to configure (not blocked by held VFs or errors).
fn configured_pfs(targets: &[Target], blocked: &BTreeSet<PciAddress>) -> u32 {
    targets
        .iter()
        .filter(|t| t.config.is_some() && !blocked.contains(&t.addr))
        .count() as u32
}

/// The status conditions of a pass; `irqbalance`: whether irqbalance runs.
fn conditions(pass: &Pass, irqbalance: bool) -> Vec<Condition> {
    let mut conditions = vf_conditions(pass);
    conditions.extend(irq_conditions(pass, irqbalance));
    conditions.push(pass.netns_mode.clone().unwrap_or_else(|| {
        Condition::new(super::netns_mode::PENDING_CONDITION, false, "Unmanaged", "")
    }));
    conditions
}

/// Ready, Degraded, and what held the PFs back (held VFs, the driver, a
/// write still in the kernel).
fn vf_conditions(pass: &Pass) -> Vec<Condition> {
    let mut conditions = Vec::new();
    let ok = pass.errors.is_empty() && pass.held.is_empty() && pass.busy.is_empty();
    conditions.push(if ok {
        Condition::new(
            "Ready",
            true,
            "Configured",
            "node matches its RdmaNodeState spec",
        )
    } else if pass.errors.is_empty() && !pass.busy.is_empty() {
        Condition::new("Ready", false, "VfWriteInProgress", pass.busy.join("\n"))
    } else if pass.errors.is_empty() {
        Condition::new("Ready", false, "VfsHeld", pass.held.join("\n"))
    } else {
        Condition::new("Ready", false, &pass.errors[0].0, pass.errors[0].1.clone())
    });
    conditions.push(if pass.errors.is_empty() {
        Condition::new("Degraded", false, "NoErrors", "")
    } else {
        let msg: Vec<String> = pass.errors.iter().map(|(_, m)| m.clone()).collect();
        Condition::new("Degraded", true, &pass.errors[0].0, msg.join("\n"))
    });
    conditions.push(if pass.held.is_empty() {
        Condition::new("VfsHeld", false, "NoneHeld", "")
    } else {
        Condition::new("VfsHeld", true, "PodsHoldVfs", pass.held.join("\n"))
    });
    conditions.push(if pass.unsupported.is_empty() {
        Condition::new("QosUnsupported", false, "Supported", "")
    } else {
        Condition::new(
            "QosUnsupported",
            true,
            "NotSupportedByDriver",
            pass.unsupported.join("\n"),
        )
    });
    conditions.push(if pass.busy.is_empty() {
        Condition::new("VfWriteInProgress", false, "NoWriteInProgress", "")
    } else {
        Condition::new(
            "VfWriteInProgress",
            true,
            "KernelStillWriting",
            pass.busy.join("\n"),
        )
    });
    conditions
}

/// What may undo or delay the IRQ placement.
fn irq_conditions(pass: &Pass, irqbalance: bool) -> Vec<Condition> {
    let mut conditions = Vec::new();
    conditions.push(if irqbalance {
        Condition::new(
            "IrqBalanceRunning",
            true,
            "IrqBalanceWillUndoPinning",
            "irqbalance is running and will move pinned RDMA IRQs; ban their CPUs with \
                 IRQBALANCE_BANNED_CPULIST (irqbalance >= 1.8) in /etc/sysconfig/irqbalance or \
                 /etc/default/irqbalance, or stop it on RDMA nodes",
        )
    } else {
        Condition::new("IrqBalanceRunning", false, "NotRunning", "")
    });
    conditions.push(if pass.pending_irqs == 0 {
            Condition::new("IrqsPending", false, "AllRequested", "")
        } else {
            Condition::new(
                "IrqsPending",
                true,
                "DeviceDown",
                format!(
                    "{} IRQs not allocated yet (device down): their driver requests them when the \
                     netdev opens; they are pinned at the first pass after that (see status.irqPlacement)",
                    pass.pending_irqs
                ),
            )
        });
    conditions.push(if pass.refused_irqs == 0 {
            Condition::new("IrqsRefused", false, "AllPlaced", "")
        } else {
            Condition::new(
                "IrqsRefused",
                true,
                "ManagedIrqs",
                format!(
                    "{} IRQs kept their affinity (kernel-managed or unwritable); see status.irqPlacement",
                    pass.refused_irqs
                ),
            )
        });
    conditions
}

fn sync_state(pass: &Pass) -> SyncState {
    if !pass.errors.is_empty() {
        SyncState::Failed
    } else if !pass.held.is_empty() || !pass.busy.is_empty() {
        SyncState::InProgress
    } else {
        SyncState::Succeeded
    }
}

/// The first error, else the first write in progress, else the first held PF.
fn last_error(pass: &Pass) -> Option<String> {
    pass.errors
        .first()
        .map(|(_, m)| m.clone())
        .or_else(|| pass.busy.first().cloned())
        .or_else(|| pass.held.first().cloned())
}

fn irq_device(host: &Host, d: &PciDevice) -> IrqDevice {
    IrqDevice {
        name: d
            .netdevs
            .first()
            .cloned()
            .or_else(|| host.netdev_of(&d.address).map(str::to_string))
            .unwrap_or_else(|| d.address.to_string()),
        msi_irqs: d.msi_irqs.clone(),
        local_cpus: d.local_cpus.clone(),
    }
}
