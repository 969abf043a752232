//! `kroce-node-agent doctor`: the checks a RoCE engineer runs by hand, each a
//! named result with its evidence and a fix hint, run against a host root
//! (sysfs/procfs trees given as values) plus [`NetState`] for what sysfs
//! cannot tell (addresses, DCB PFC state, the containers' memlock limit, a
//! firewall ruleset), which the caller reads with its own tools.
//!
//! Checks are grouped per PF: the PF, its VFs and their RDMA devices are one
//! subject; node-wide checks (memlock, irqbalance, UDP 4791) have subject
//! `node`.

pub mod baseline;
pub mod firewall;

use serde::{Deserialize, Serialize};
use sriov_helpers::{CpuList, Host, HostRoot, PciDevice, RdmaDevice};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::Ipv4Addr;

/// Check names, as they appear in the table, JSON and node conditions.
pub mod names {
    pub const DEVICES: &str = "devices";
    pub const HOST_SCAN: &str = "host-scan";
    pub const LINK: &str = "link";
    pub const ROCE_V2_GID: &str = "roce-v2-gid";
    pub const MTU: &str = "mtu";
    pub const PFC: &str = "pfc";
    pub const ECN: &str = "ecn";
    pub const IRQ_NUMA: &str = "irq-numa";
    pub const MEMLOCK: &str = "memlock";
    pub const IRQBALANCE: &str = "irqbalance";
    pub const UDP_4791: &str = "udp-4791";
}

/// Bytes of RoCE v2 headers the kernel takes off the netdev MTU before
/// choosing the RDMA MTU (`iboe_get_mtu` in include/rdma/ib_addr.h): GRH 40 +
/// UDP 8 + BTH 12 + XRC ext 4 + AtomicETH 28 + ICRC 4 (include/rdma/ib_pack.h).
pub const ROCE_HEADER_BYTES: u32 = 96;
const IB_MTUS: [u32; 5] = [4096, 2048, 1024, 512, 256];
/// A default the operator can override from the network's `memlock`.
pub const DEFAULT_MIN_MEMLOCK_BYTES: u64 = 64 * 1024 * 1024;
/// How many offenders an evidence line lists before "+N more".
const MAX_LISTED: usize = 6;

/// The RDMA active MTU the kernel derives for a RoCE port from its netdev
/// MTU: the largest IB MTU (256..4096) not above `netdev_mtu - 96`. `None`
/// when the netdev MTU is too small for any (below 352).
pub fn roce_active_mtu(netdev_mtu: u32) -> Option<u32> {
    let room = netdev_mtu.checked_sub(ROCE_HEADER_BYTES)?;
    IB_MTUS.into_iter().find(|m| *m <= room)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Pass,
    Skip,
    Warn,
    Fail,
}

impl Status {
    pub fn label(self) -> &'static str {
        match self {
            Status::Pass => "PASS",
            Status::Skip => "SKIP",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckResult {
    pub name: String,
    /// The PF netdev (for per-PF checks) or `node`.
    pub subject: String,
    pub status: Status,
    pub evidence: String,
    /// What to do about it (absent on pass).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
}

/// The containers' RLIMIT_MEMLOCK.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum MemlockLimit {
    Unlimited,
    Bytes(u64),
}

impl MemlockLimit {
    /// The soft limit from a `/proc/<pid>/limits` text (`Max locked memory
    /// 8388608 8388608 bytes`); what a process started like the container
    /// gets. `None` when the line is absent or malformed.
    pub fn from_proc_limits(text: &str) -> Option<MemlockLimit> {
        let line = text.lines().find(|l| l.starts_with("Max locked memory"))?;
        let soft = line
            .trim_start_matches("Max locked memory")
            .split_whitespace()
            .next()?;
        if soft == "unlimited" {
            Some(MemlockLimit::Unlimited)
        } else {
            soft.parse().ok().map(MemlockLimit::Bytes)
        }
    }
}

/// What sysfs cannot give; each part optional (its check is skipped).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct NetState {
    /// IPv4 addresses per netdev (host network namespace).
    pub ipv4: BTreeMap<String, Vec<Ipv4Addr>>,
    /// Priorities with PFC enabled, per PF netdev (from DCB netlink).
    pub pfc_enabled: BTreeMap<String, Vec<u8>>,
    /// RDMA active MTU per device (from ibv_query_port), when known.
    pub active_mtu: BTreeMap<String, u32>,
    /// The memlock limit containers get.
    pub memlock: Option<MemlockLimit>,
    /// `iptables-save` or `nft list ruleset` text.
    pub firewall_ruleset: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DoctorOptions {
    /// The RoCE traffic priority (`qos.pfcPriority`, default 3).
    pub roce_priority: u8,
    pub min_memlock_bytes: u64,
    /// Only these PF netdevs (empty: every PF with an RDMA device, and soft devices).
    pub pf_names: Vec<String>,
}

impl Default for DoctorOptions {
    fn default() -> Self {
        DoctorOptions {
            roce_priority: 3,
            min_memlock_bytes: DEFAULT_MIN_MEMLOCK_BYTES,
            pf_names: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DoctorError {
    #[error("roce priority {0} is invalid: must be 0..=7")]
    BadPriority(u8),
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct DoctorReport {
    pub checks: Vec<CheckResult>,
}

impl DoctorReport {
    /// The worst status of all checks (`Pass` when there are none).
    pub fn worst(&self) -> Status {
        self.checks
            .iter()
            .map(|c| c.status)
            .max()
            .unwrap_or(Status::Pass)
    }

    pub fn count(&self, s: Status) -> usize {
        self.checks.iter().filter(|c| c.status == s).count()
    }

    pub fn to_json(&self) -> Result<String, serde_json::Error> {
        serde_json::to_string_pretty(self)
    }

    /// A fixed-width table with hints under the checks that did not pass,
    /// and a summary line.
    pub fn render_table(&self) -> String {
        let w_name = self
            .checks
            .iter()
            .map(|c| c.name.len())
            .max()
            .unwrap_or(0)
            .max(5);
        let w_subj = self
            .checks
            .iter()
            .map(|c| c.subject.len())
            .max()
            .unwrap_or(0)
            .max(7);
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:<6} {:<w_name$} {:<w_subj$} EVIDENCE",
            "STATUS", "CHECK", "SUBJECT"
        );
        for c in &self.checks {
            let _ = writeln!(
                out,
                "{:<6} {:<w_name$} {:<w_subj$} {}",
                c.status.label(),
                c.name,
                c.subject,
                c.evidence
            );
            if c.status != Status::Pass
                && let Some(h) = &c.hint
            {
                let _ = writeln!(out, "{:<6} {:<w_name$} {:<w_subj$} hint: {h}", "", "", "");
            }
        }
        let _ = writeln!(
            out,
            "{} fail, {} warn, {} pass, {} skip",
            self.count(Status::Fail),
            self.count(Status::Warn),
            self.count(Status::Pass),
            self.count(Status::Skip)
        );
        out
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Pf,
    Vf,
    Soft,
}

#[derive(Debug)]
struct Member<'a> {
    role: Role,
    pci: Option<&'a PciDevice>,
    /// The netdev in this network namespace, if any.
    netdev: Option<String>,
    rdma: Option<&'a RdmaDevice>,
}

impl Member<'_> {
    fn label(&self) -> String {
        let dev = self.rdma.map_or("-", |r| r.name.as_str());
        match (&self.netdev, self.pci) {
            (Some(n), _) => format!("{dev} ({n})"),
            (None, Some(p)) => format!("{dev} ({})", p.address),
            (None, None) => dev.to_string(),
        }
    }
}

#[derive(Debug)]
struct Group<'a> {
    /// PF netdev, or the soft device's parent netdev.
    subject: String,
    members: Vec<Member<'a>>,
}

fn build_groups<'a>(host: &'a Host, opts: &DoctorOptions) -> Vec<Group<'a>> {
    let wanted = |n: &str| opts.pf_names.is_empty() || opts.pf_names.iter().any(|p| p == n);
    let mut groups = Vec::new();
    for pf in host.pfs() {
        let Some(pf_netdev) = host.netdev_of(&pf.address) else {
            continue;
        };
        if !wanted(pf_netdev) {
            continue;
        }
        let mut members = vec![Member {
            role: Role::Pf,
            pci: Some(pf),
            netdev: Some(pf_netdev.to_string()),
            rdma: host.rdma_of_pci(&pf.address),
        }];
        if let Some(sriov) = &pf.sriov {
            for (_, vf_addr) in &sriov.vfs {
                let Some(vf) = host.pci.get(vf_addr) else {
                    continue;
                };
                members.push(Member {
                    role: Role::Vf,
                    pci: Some(vf),
                    netdev: host
                        .netdev_of(vf_addr)
                        .filter(|n| host.netdevs.contains_key(*n))
                        .map(str::to_string),
                    rdma: host.rdma_of_pci(vf_addr),
                });
            }
        }
        let has_rdma = members.iter().any(|m| m.rdma.is_some());
        if has_rdma || !opts.pf_names.is_empty() {
            groups.push(Group {
                subject: pf_netdev.to_string(),
                members,
            });
        }
    }
    for dev in host.rdma.values().filter(|d| d.pci.is_none()) {
        let Some(parent) = dev.parent_netdev.as_deref() else {
            continue;
        };
        if !wanted(parent) {
            continue;
        }
        groups.push(Group {
            subject: parent.to_string(),
            members: vec![Member {
                role: Role::Soft,
                pci: None,
                netdev: Some(parent.to_string()),
                rdma: Some(dev),
            }],
        });
    }
    groups
}

fn listed(items: &[String]) -> String {
    let mut s = items
        .iter()
        .take(MAX_LISTED)
        .cloned()
        .collect::<Vec<_>>()
        .join("; ");
    if items.len() > MAX_LISTED {
        let _ = write!(s, "; +{} more", items.len() - MAX_LISTED);
    }
    s
}

fn result(
    name: &str,
    subject: &str,
    status: Status,
    evidence: String,
    hint: Option<&str>,
) -> CheckResult {
    CheckResult {
        name: name.to_string(),
        subject: subject.to_string(),
        status,
        evidence,
        hint: hint.map(str::to_string),
    }
}

fn vf_count(g: &Group<'_>) -> usize {
    g.members.iter().filter(|m| m.role == Role::Vf).count()
}

fn check_link(g: &Group<'_>) -> CheckResult {
    let mut bad = Vec::new();
    let mut ports = 0;
    for m in &g.members {
        let Some(r) = m.rdma else {
            bad.push(format!("{} has no RDMA device", m.label()));
            continue;
        };
        if r.ports.is_empty() {
            bad.push(format!("{} has no ports", m.label()));
        }
        for p in &r.ports {
            ports += 1;
            if p.link_layer != "Ethernet" {
                bad.push(format!(
                    "{} port {} link layer {} (not RoCE)",
                    m.label(),
                    p.num,
                    p.link_layer
                ));
            }
            if !p.is_active() {
                bad.push(format!(
                    "{} port {} state {}{}",
                    m.label(),
                    p.num,
                    p.state,
                    p.phys_state
                        .as_deref()
                        .map(|s| format!(" (phys {s})"))
                        .unwrap_or_default()
                ));
            }
        }
    }
    if bad.is_empty() {
        result(
            names::LINK,
            &g.subject,
            Status::Pass,
            format!(
                "{ports} ports ({} and {} VFs): link layer Ethernet, ACTIVE",
                g.members.first().map(Member::label).unwrap_or_default(),
                vf_count(g)
            ),
            None,
        )
    } else {
        result(
            names::LINK,
            &g.subject,
            Status::Fail,
            listed(&bad),
            Some(
                "RoCE needs an Ethernet link layer (mlxconfig LINK_TYPE_P1=2 on VPI cards) and an ACTIVE port: check cable, switch port and `ip link set <if> up`; VFs without an RDMA device need the RDMA driver (mlx5_ib) loaded",
            ),
        )
    }
}

fn check_gid(g: &Group<'_>, net: &NetState) -> CheckResult {
    let mut found = Vec::new();
    let mut missing = Vec::new();
    for m in &g.members {
        let (Some(nd), Some(r)) = (&m.netdev, m.rdma) else {
            continue;
        };
        let Some(addrs) = net.ipv4.get(nd) else {
            continue;
        };
        for a in addrs {
            let hit = r.ports.iter().find_map(|p| {
                // An unreadable GID table shows as "no GID" for that port.
                p.roce_v2_ipv4_gids()
                    .ok()?
                    .into_iter()
                    .find(|(_, ip, ndev)| ip == a && ndev.as_deref().is_none_or(|n| n == nd))
                    .map(|(i, ..)| (p.num, i))
            });
            match hit {
                Some((port, idx)) => {
                    found.push(format!("{nd} {a}: {} port {port} GID index {idx}", r.name))
                }
                None => missing.push(format!("{nd} {a}: no RoCE v2 GID on {}", r.name)),
            }
        }
    }
    if found.is_empty() && missing.is_empty() {
        return result(
            names::ROCE_V2_GID,
            &g.subject,
            Status::Skip,
            format!(
                "no IPv4 address known for {} or its VFs here (VFs get theirs inside pods)",
                g.subject
            ),
            None,
        );
    }
    if missing.is_empty() {
        result(
            names::ROCE_V2_GID,
            &g.subject,
            Status::Pass,
            listed(&found),
            None,
        )
    } else {
        result(
            names::ROCE_V2_GID,
            &g.subject,
            Status::Fail,
            listed(&missing),
            Some(
                "the kernel adds a RoCE v2 GID for each address of the netdev: check the address is on that netdev and RoCE v2 is enabled (configfs rdma_cm/<dev>/ports/1/default_roce_mode = \"RoCE v2\"); use the reported index with -x, never a fixed one",
            ),
        )
    }
}

fn check_mtu(g: &Group<'_>, host: &Host, net: &NetState) -> CheckResult {
    let mtu_of = |n: &str| host.netdevs.get(n).and_then(|d| d.mtu);
    let pf_mtu = g
        .members
        .first()
        .and_then(|m| m.netdev.as_deref())
        .and_then(mtu_of);
    let mut fails = Vec::new();
    let mut warns = Vec::new();
    // (netdev MTU, RoCE MTU) -> netdevs
    let mut seen: BTreeMap<(u32, u32), Vec<String>> = BTreeMap::new();
    for m in &g.members {
        let Some(nd) = m.netdev.as_deref() else {
            continue;
        };
        let Some(mtu) = mtu_of(nd) else {
            warns.push(format!("{nd}: MTU unreadable"));
            continue;
        };
        let Some(roce) = roce_active_mtu(mtu) else {
            fails.push(format!(
                "{nd} MTU {mtu} is below {} bytes: no RoCE MTU fits",
                256 + ROCE_HEADER_BYTES
            ));
            continue;
        };
        seen.entry((mtu, roce)).or_default().push(nd.to_string());
        if let Some(r) = m.rdma
            && let Some(active) = net.active_mtu.get(&r.name)
            && *active != roce
        {
            fails.push(format!(
                "{} active MTU {active} but {nd} MTU {mtu} gives {roce}",
                r.name
            ));
        }
        // An MTU just at an IB size loses a step to the RoCE headers.
        if let Some(step) = IB_MTUS.into_iter().find(|s| *s <= mtu)
            && step > roce
        {
            warns.push(format!(
                "{nd} MTU {mtu} gives RoCE MTU {roce}, not {step}: RoCE needs {} bytes of headers (MTU >= {})",
                ROCE_HEADER_BYTES,
                step + ROCE_HEADER_BYTES
            ));
        }
        if m.role == Role::Vf
            && let Some(pf) = pf_mtu
            && mtu > pf
        {
            fails.push(format!("VF {nd} MTU {mtu} > PF {} MTU {pf}", g.subject));
        }
    }
    let summary: Vec<String> = seen
        .iter()
        .map(|((mtu, roce), nds)| {
            let who = if nds.len() > 2 {
                format!("{} netdevs", nds.len())
            } else {
                nds.join(", ")
            };
            format!("MTU {mtu} -> RoCE {roce} ({who})")
        })
        .collect();
    if !fails.is_empty() {
        result(
            names::MTU,
            &g.subject,
            Status::Fail,
            listed(&fails),
            Some(
                "set the PF MTU at least as large as every VF's (ip link set <pf> mtu 9000) and the netdev MTU to the RoCE MTU + 96 or more (9000 for RoCE 4096)",
            ),
        )
    } else if !warns.is_empty() {
        result(
            names::MTU,
            &g.subject,
            Status::Warn,
            listed(&warns),
            Some(
                "raise the netdev MTU by the 96 bytes of RoCE headers (e.g. 4200 or 9000 for RoCE MTU 4096)",
            ),
        )
    } else if summary.is_empty() {
        result(
            names::MTU,
            &g.subject,
            Status::Skip,
            "no netdev of this PF in this network namespace".into(),
            None,
        )
    } else {
        result(
            names::MTU,
            &g.subject,
            Status::Pass,
            summary.join("; "),
            None,
        )
    }
}

fn check_pfc(g: &Group<'_>, net: &NetState, prio: u8) -> CheckResult {
    let Some(enabled) = net.pfc_enabled.get(&g.subject) else {
        return result(
            names::PFC,
            &g.subject,
            Status::Skip,
            format!(
                "PFC state of {} not provided (read it over DCB netlink, e.g. `dcb pfc show dev {}`)",
                g.subject, g.subject
            ),
            None,
        );
    };
    let mut prios: Vec<u8> = enabled.clone();
    prios.sort_unstable();
    prios.dedup();
    let list = |p: &[u8]| {
        if p.is_empty() {
            "none".to_string()
        } else {
            p.iter().map(u8::to_string).collect::<Vec<_>>().join(",")
        }
    };
    let others: Vec<u8> = prios.iter().copied().filter(|p| *p != prio).collect();
    if !prios.contains(&prio) {
        result(
            names::PFC,
            &g.subject,
            Status::Fail,
            format!(
                "PFC is off on RoCE priority {prio} (enabled on: {})",
                list(&prios)
            ),
            Some(
                "enable PFC on the RoCE priority only (kroce's qos.pfcPriority; `dcb pfc set dev <pf> prio-pfc <p>:on`) and on the switch ports",
            ),
        )
    } else if !others.is_empty() {
        result(
            names::PFC,
            &g.subject,
            Status::Warn,
            format!(
                "PFC on priority {prio} and also on {}: those classes can pause too",
                list(&others)
            ),
            Some("turn PFC off on every priority but the RoCE one"),
        )
    } else {
        result(
            names::PFC,
            &g.subject,
            Status::Pass,
            format!("PFC on priority {prio} only"),
            None,
        )
    }
}

fn check_ecn(g: &Group<'_>, root: &HostRoot, prio: u8) -> CheckResult {
    if g.members.iter().all(|m| m.role == Role::Soft) {
        return result(
            names::ECN,
            &g.subject,
            Status::Skip,
            "soft-RoCE device: no DCQCN in the NIC".into(),
            None,
        );
    }
    let dir = root.class_net().join(&g.subject).join("ecn");
    if !dir.is_dir() {
        return result(
            names::ECN,
            &g.subject,
            Status::Skip,
            format!("{} absent: the driver has no DCQCN sysfs", dir.display()),
            None,
        );
    }
    let mut seen = Vec::new();
    let mut bad = Vec::new();
    for side in ["roce_np", "roce_rp"] {
        let path = dir.join(side).join("enable").join(prio.to_string());
        match std::fs::read_to_string(&path) {
            Ok(s) => match s.trim() {
                "1" => seen.push(format!("{side}/enable/{prio}=1")),
                "0" => bad.push(format!("{side}/enable/{prio}=0")),
                other => bad.push(format!("{} holds {other:?}", path.display())),
            },
            Err(e) => bad.push(format!("{}: {e}", path.display())),
        }
    }
    if bad.is_empty() {
        result(names::ECN, &g.subject, Status::Pass, seen.join(", "), None)
    } else {
        result(
            names::ECN,
            &g.subject,
            Status::Fail,
            bad.join("; "),
            Some(
                "enable ECN (DCQCN) on the RoCE priority: echo 1 > /sys/class/net/<pf>/ecn/roce_np/enable/<p> and roce_rp/enable/<p> (kroce's node agent does this from qos)",
            ),
        )
    }
}

fn local_cpus_of(host: &Host, d: &PciDevice) -> Option<CpuList> {
    d.local_cpus.clone().or_else(|| {
        d.numa_node
            .and_then(|n| host.numa_node(n))
            .map(|n| n.cpus.clone())
    })
}

fn check_irqs(g: &Group<'_>, host: &Host, root: &HostRoot) -> CheckResult {
    let mut fails = Vec::new();
    let mut warns = Vec::new();
    let mut checked = 0usize;
    let mut locals: Vec<String> = Vec::new();
    for m in &g.members {
        let Some(d) = m.pci else { continue };
        if d.numa_node.is_none() {
            warns.push(format!("{}: firmware reports no NUMA node", d.address));
        }
        let Some(local) = local_cpus_of(host, d) else {
            warns.push(format!("{}: local CPUs unknown", d.address));
            continue;
        };
        let l = local.to_string();
        if !locals.contains(&l) {
            locals.push(l);
        }
        // The first vector is the control/async-event IRQ; kroce pins the
        // data vectors after it.
        for irq in d.msi_irqs.iter().skip(1) {
            match sriov_helpers::irq::read_affinity(root, *irq) {
                Ok(cpus) => {
                    checked += 1;
                    if !cpus.is_subset(&local) {
                        fails.push(format!(
                            "IRQ {irq} of {} on CPUs {cpus}, local CPUs {local}",
                            d.address
                        ));
                    }
                }
                Err(e) if e.is_not_found() => {}
                Err(e) => warns.push(e.to_string()),
            }
        }
    }
    if !fails.is_empty() {
        result(
            names::IRQ_NUMA,
            &g.subject,
            Status::Fail,
            listed(&fails),
            Some(
                "pin NIC IRQs to NUMA-local CPUs (kroce irqAffinity.policy: numaLocal, or write the local CPUs to /proc/irq/<n>/smp_affinity_list)",
            ),
        )
    } else if !warns.is_empty() {
        result(
            names::IRQ_NUMA,
            &g.subject,
            Status::Warn,
            listed(&warns),
            Some(
                "without NUMA information IRQ placement cannot be judged: check the BIOS exposes NUMA (SRAT) for the NIC's slot",
            ),
        )
    } else if checked == 0 {
        result(
            names::IRQ_NUMA,
            &g.subject,
            Status::Skip,
            "no data IRQs found".into(),
            None,
        )
    } else {
        result(
            names::IRQ_NUMA,
            &g.subject,
            Status::Pass,
            format!(
                "{checked} data IRQs of {} functions on their local CPUs ({})",
                g.members.iter().filter(|m| m.pci.is_some()).count(),
                locals.join(" / ")
            ),
            None,
        )
    }
}

fn mib(b: u64) -> String {
    if b.is_multiple_of(1024 * 1024) {
        format!("{} MiB", b / (1024 * 1024))
    } else {
        format!("{b} bytes")
    }
}

fn check_memlock(net: &NetState, min: u64) -> CheckResult {
    match net.memlock {
        None => result(
            names::MEMLOCK,
            "node",
            Status::Skip,
            "memlock limit of containers not provided".into(),
            None,
        ),
        Some(MemlockLimit::Unlimited) => result(
            names::MEMLOCK,
            "node",
            Status::Pass,
            "memlock unlimited".into(),
            None,
        ),
        Some(MemlockLimit::Bytes(b)) if b >= min => result(
            names::MEMLOCK,
            "node",
            Status::Pass,
            format!("memlock {} >= required {}", mib(b), mib(min)),
            None,
        ),
        Some(MemlockLimit::Bytes(b)) => result(
            names::MEMLOCK,
            "node",
            Status::Fail,
            format!(
                "memlock {} < required {}: RDMA memory registration will fail",
                mib(b),
                mib(min)
            ),
            Some(
                "raise the container runtime's memlock limit (containerd: LimitMEMLOCK=infinity in its systemd unit; CRI-O: default_ulimits = [\"memlock=-1:-1\"]) or set memlock in the RdmaNetwork",
            ),
        ),
    }
}

/// PIDs whose `comm` is `irqbalance`, under the proc root.
pub fn find_irqbalance(root: &HostRoot) -> std::io::Result<Vec<u32>> {
    let mut pids = Vec::new();
    for e in std::fs::read_dir(root.proc())? {
        let Ok(e) = e else { continue };
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        // A process may exit between readdir and read: skip it.
        if let Ok(comm) = std::fs::read_to_string(e.path().join("comm"))
            && comm.trim() == "irqbalance"
        {
            pids.push(pid);
        }
    }
    pids.sort_unstable();
    Ok(pids)
}

fn check_irqbalance(root: &HostRoot) -> CheckResult {
    match find_irqbalance(root) {
        Err(e) => result(
            names::IRQBALANCE,
            "node",
            Status::Skip,
            format!("cannot list {}: {e}", root.proc().display()),
            None,
        ),
        Ok(p) if p.is_empty() => result(
            names::IRQBALANCE,
            "node",
            Status::Pass,
            "irqbalance is not running".into(),
            None,
        ),
        Ok(p) => result(
            names::IRQBALANCE,
            "node",
            Status::Warn,
            format!(
                "irqbalance is running (pid {}): it moves IRQs off the CPUs kroce pins them to",
                p.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
            ),
            Some(
                "stop it (systemctl disable --now irqbalance) or keep it off the NIC's CPUs: IRQBALANCE_BANNED_CPULIST=<cpus> (older: IRQBALANCE_BANNED_CPUS=<mask>) in /etc/default/irqbalance or /etc/sysconfig/irqbalance",
            ),
        ),
    }
}

fn check_firewall(net: &NetState, host: &Host) -> CheckResult {
    let Some(text) = &net.firewall_ruleset else {
        return result(
            names::UDP_4791,
            "node",
            Status::Skip,
            "no firewall ruleset provided".into(),
            None,
        );
    };
    let f = firewall::analyze(text);
    let soft = host.rdma.values().any(|d| d.pci.is_none());
    let blocked_status = if soft { Status::Fail } else { Status::Warn };
    let hint = "accept UDP destination port 4791 in the input and output filter chains; hardware RoCE bypasses netfilter, but soft-RoCE (rxe) and firewalls on the path do not";
    match f.verdict {
        firewall::FirewallVerdict::Open => {
            result(names::UDP_4791, "node", Status::Pass, f.evidence, None)
        }
        firewall::FirewallVerdict::Unrecognized => {
            result(names::UDP_4791, "node", Status::Skip, f.evidence, None)
        }
        firewall::FirewallVerdict::MayBlock => result(
            names::UDP_4791,
            "node",
            Status::Warn,
            f.evidence,
            Some(hint),
        ),
        firewall::FirewallVerdict::Blocked => result(
            names::UDP_4791,
            "node",
            blocked_status,
            f.evidence,
            Some(hint),
        ),
    }
}

/// Runs every check. Per-PF checks come first, in PF order; node-wide
/// checks last.
pub fn run(
    root: &HostRoot,
    net: &NetState,
    opts: &DoctorOptions,
) -> Result<DoctorReport, DoctorError> {
    if opts.roce_priority > 7 {
        return Err(DoctorError::BadPriority(opts.roce_priority));
    }
    let host = Host::scan(root);
    Ok(run_on(&host, root, net, opts))
}

/// The checks on an already scanned host (the node agent scans anyway).
pub fn run_on(host: &Host, root: &HostRoot, net: &NetState, opts: &DoctorOptions) -> DoctorReport {
    let mut checks = Vec::new();
    if !host.errors.is_empty() {
        let errs: Vec<String> = host.errors.iter().map(ToString::to_string).collect();
        checks.push(result(
            names::HOST_SCAN,
            "node",
            Status::Warn,
            listed(&errs),
            Some("parts of sysfs could not be read; the checks below skip what is missing"),
        ));
    }
    let groups = build_groups(host, opts);
    if groups.is_empty() {
        let what = if opts.pf_names.is_empty() {
            "no PF with an RDMA device and no soft RDMA device found".to_string()
        } else {
            format!("none of the PFs {} found", opts.pf_names.join(", "))
        };
        checks.push(result(
            names::DEVICES,
            "node",
            Status::Fail,
            what,
            Some("load the NIC's RDMA driver (mlx5_ib) or create a soft device (rdma link add rxe0 type rxe netdev <if>)"),
        ));
    }
    let prio = opts.roce_priority.min(7);
    for g in &groups {
        checks.push(check_link(g));
        checks.push(check_gid(g, net));
        checks.push(check_mtu(g, host, net));
        checks.push(check_pfc(g, net, prio));
        checks.push(check_ecn(g, root, prio));
        checks.push(check_irqs(g, host, root));
    }
    checks.push(check_memlock(net, opts.min_memlock_bytes));
    checks.push(check_irqbalance(root));
    checks.push(check_firewall(net, host));
    DoctorReport { checks }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roce_mtu_follows_the_kernel_formula() {
        assert_eq!(roce_active_mtu(9000), Some(4096));
        assert_eq!(roce_active_mtu(4192), Some(4096));
        assert_eq!(roce_active_mtu(4191), Some(2048));
        assert_eq!(roce_active_mtu(4096), Some(2048));
        assert_eq!(roce_active_mtu(1500), Some(1024));
        assert_eq!(roce_active_mtu(352), Some(256));
        assert_eq!(roce_active_mtu(351), None);
        assert_eq!(roce_active_mtu(0), None);
    }

    #[test]
    fn memlock_from_proc_limits() {
        let t = "Limit                     Soft Limit           Hard Limit           Units     \nMax locked memory         8388608              8388608              bytes     \n";
        assert_eq!(
            MemlockLimit::from_proc_limits(t),
            Some(MemlockLimit::Bytes(8 * 1024 * 1024))
        );
        let u = "Max locked memory         unlimited            unlimited            bytes\n";
        assert_eq!(
            MemlockLimit::from_proc_limits(u),
            Some(MemlockLimit::Unlimited)
        );
        assert_eq!(
            MemlockLimit::from_proc_limits("Max open files 1024 1024 files\n"),
            None
        );
        assert_eq!(
            MemlockLimit::from_proc_limits("Max locked memory  lots  lots bytes"),
            None
        );
    }

    #[test]
    fn memlock_of_this_process_is_readable() {
        // The real /proc of the test process: present on every Linux CI.
        let t = std::fs::read_to_string("/proc/self/limits").unwrap();
        assert!(MemlockLimit::from_proc_limits(&t).is_some(), "{t}");
    }

    #[test]
    fn worst_orders_fail_over_warn_over_skip_over_pass() {
        let mk = |s| result("x", "node", s, String::new(), None);
        let r = DoctorReport {
            checks: vec![mk(Status::Pass), mk(Status::Skip), mk(Status::Warn)],
        };
        assert_eq!(r.worst(), Status::Warn);
        assert_eq!(DoctorReport::default().worst(), Status::Pass);
    }
}
