//! What the plugin can hand out: one [`Candidate`] per network PCI function
//! and per soft RDMA device (rxe), with the facts selectors and health need.
//!
//! Identity facts that can vanish while a device still exists (its netdev
//! moves into a pod, its RDMA device disappears) are kept in [`Memory`]
//! across scans, so a VF whose RDMA device vanished stays in its pool and
//! turns Unhealthy instead of silently dropping out of it.

use crate::config::LinkType;
use crate::host_view::HostView;
use serde::Serialize;
use sriov_helpers::rdma::roce_v2_gid_index;
use sriov_helpers::{PciAddress, PciDevice, RdmaDevice};
use std::collections::BTreeMap;
use std::net::Ipv4Addr;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    /// An SR-IOV virtual function.
    Vf,
    /// A PF or a NIC function without SR-IOV.
    Pci,
    /// A soft RDMA device (rxe, siw) over a netdev.
    Soft,
}

impl DeviceKind {
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceKind::Vf => "vf",
            DeviceKind::Pci => "pci",
            DeviceKind::Soft => "soft",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NetdevState {
    pub name: String,
    /// Visible in this network namespace (`sys/class/net/<name>`).
    pub present: bool,
    pub operstate: Option<String>,
    pub up: bool,
    /// `None` when `flags` could not be read.
    pub admin_up: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CharNode {
    pub name: String,
    /// Exists under the dev root right now.
    pub present: bool,
}

impl CharNode {
    pub fn container_path(&self) -> String {
        format!("/dev/infiniband/{}", self.name)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RdmaState {
    pub name: String,
    /// Listed in `sys/class/infiniband` right now.
    pub present: bool,
    /// uverbs, umad, issm — the device's own char devices.
    pub char_devices: Vec<CharNode>,
    /// RoCE v2 GID index and address for the netdev's IPv4 address.
    pub roce_v2_gid: Option<(u32, Ipv4Addr)>,
    pub port_state: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Candidate {
    /// The base device ID: the PCI address, or the RDMA device name of a soft device.
    pub id: String,
    pub kind: DeviceKind,
    pub pci: Option<PciAddress>,
    /// The PF of a VF; a PF is its own.
    pub pf: Option<PciAddress>,
    /// The PF's netdev name (what `pfNames` matches).
    pub pf_name: Option<String>,
    pub vf_index: Option<u32>,
    pub vendor: Option<u16>,
    pub device: Option<u16>,
    pub driver: Option<String>,
    pub numa: Option<u32>,
    /// VFs currently enabled on a PF.
    pub active_vfs: u32,
    pub netdev: Option<NetdevState>,
    pub rdma: Option<RdmaState>,
    pub link_type: Option<LinkType>,
    /// `dev/infiniband/rdma_cm` exists (given to every RDMA container when it does).
    pub rdma_cm: bool,
}

impl Candidate {
    /// The key preferred allocation packs on: the PF (or the device itself).
    pub fn pack_group(&self) -> String {
        match self.pf {
            Some(pf) => pf.to_string(),
            None => self.id.clone(),
        }
    }
}

/// Names last seen for each base device ID; entries go when the device does.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Memory {
    entries: BTreeMap<String, Remembered>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Remembered {
    netdev: Option<String>,
    rdma: Option<String>,
    char_devices: Vec<String>,
}

fn link_type_of(rdma: Option<&RdmaDevice>, mac: Option<&str>) -> Option<LinkType> {
    if let Some(p) = rdma.and_then(|r| r.ports.first()) {
        match p.link_layer.as_str() {
            "Ethernet" => return Some(LinkType::Ether),
            "InfiniBand" => return Some(LinkType::Infiniband),
            _ => {}
        }
    }
    // 6-byte Ethernet MAC vs 20-byte IPoIB hardware address.
    match mac.map(str::len) {
        Some(17) => Some(LinkType::Ether),
        Some(59) => Some(LinkType::Infiniband),
        _ => None,
    }
}

fn netdev_state(view: &HostView, name: &str) -> NetdevState {
    let nd = view.host.netdevs.get(name);
    NetdevState {
        name: name.to_string(),
        present: nd.is_some(),
        operstate: nd.map(|n| n.operstate.clone()),
        up: nd.is_some_and(|n| n.is_up()),
        admin_up: view.admin_up.get(name).copied(),
    }
}

fn rdma_state(
    view: &HostView,
    current: Option<&RdmaDevice>,
    remembered: &Remembered,
    netdev: Option<&str>,
) -> Option<RdmaState> {
    match current {
        Some(r) => Some(RdmaState {
            name: r.name.clone(),
            present: true,
            char_devices: r
                .char_devices
                .uverbs
                .iter()
                .chain(r.char_devices.umad.iter())
                .chain(r.char_devices.issm.iter())
                .map(|c| CharNode {
                    name: c.name.clone(),
                    present: view.dev_nodes.contains(&c.name),
                })
                .collect(),
            // Read now (the host scan leaves GID tables to who needs them);
            // an unreadable table shows as no GID, which Allocate omits.
            roce_v2_gid: netdev.and_then(|n| roce_v2_gid_index(r, n).ok().flatten()),
            port_state: r.ports.first().map(|p| p.state.clone()),
        }),
        None => remembered.rdma.as_ref().map(|name| RdmaState {
            name: name.clone(),
            present: false,
            char_devices: remembered
                .char_devices
                .iter()
                .map(|c| CharNode {
                    name: c.clone(),
                    present: view.dev_nodes.contains(c),
                })
                .collect(),
            roce_v2_gid: None,
            port_state: None,
        }),
    }
}

fn remember(c: &Candidate) -> Remembered {
    Remembered {
        netdev: c.netdev.as_ref().map(|n| n.name.clone()),
        rdma: c.rdma.as_ref().map(|r| r.name.clone()),
        char_devices: c
            .rdma
            .as_ref()
            .map(|r| r.char_devices.iter().map(|c| c.name.clone()).collect())
            .unwrap_or_default(),
    }
}

fn pci_candidate(view: &HostView, dev: &PciDevice, mem: &Remembered) -> Candidate {
    let host = &view.host;
    let rdma_cm = view.dev_nodes.contains("rdma_cm");
    let netdev_name = dev.netdevs.first().cloned().or_else(|| mem.netdev.clone());
    let netdev = netdev_name.as_deref().map(|n| netdev_state(view, n));
    let current_rdma = host.rdma_of_pci(&dev.address);
    let rdma = rdma_state(view, current_rdma, mem, netdev_name.as_deref());
    let mac = netdev_name
        .as_deref()
        .and_then(|n| host.netdevs.get(n))
        .and_then(|n| n.address.as_deref());
    let (kind, pf, pf_name, vf_index) = match dev.physfn {
        Some(of) => (
            DeviceKind::Vf,
            Some(of.pf),
            host.netdev_of(&of.pf).map(str::to_string),
            of.index,
        ),
        None => (
            DeviceKind::Pci,
            Some(dev.address),
            netdev_name.clone(),
            None,
        ),
    };
    Candidate {
        id: dev.address.to_string(),
        kind,
        pci: Some(dev.address),
        pf,
        pf_name,
        vf_index,
        vendor: Some(dev.vendor),
        device: Some(dev.device),
        driver: dev.driver.clone(),
        numa: dev.numa_node,
        active_vfs: dev.sriov.as_ref().map_or(0, |s| s.num_vfs),
        netdev,
        rdma,
        link_type: link_type_of(current_rdma, mac),
        rdma_cm,
    }
}

fn soft_candidate(view: &HostView, r: &RdmaDevice) -> Candidate {
    let host = &view.host;
    let netdev = r.parent_netdev.as_deref().map(|n| netdev_state(view, n));
    // A soft device sits where its netdev's PCI function is, if it has one.
    let backing = r
        .parent_netdev
        .as_deref()
        .and_then(|n| host.netdevs.get(n))
        .and_then(|n| n.pci)
        .and_then(|a| host.pci.get(&a));
    let mac = r
        .parent_netdev
        .as_deref()
        .and_then(|n| host.netdevs.get(n))
        .and_then(|n| n.address.as_deref());
    Candidate {
        id: r.name.clone(),
        kind: DeviceKind::Soft,
        pci: backing.map(|d| d.address),
        pf: None,
        pf_name: None,
        vf_index: None,
        vendor: None,
        device: None,
        driver: None,
        numa: backing.and_then(|d| d.numa_node),
        active_vfs: 0,
        netdev,
        rdma: rdma_state(
            view,
            Some(r),
            &Remembered::default(),
            r.parent_netdev.as_deref(),
        ),
        link_type: link_type_of(Some(r), mac),
        rdma_cm: view.dev_nodes.contains("rdma_cm"),
    }
}

/// Every candidate on the host, PCI functions by address then soft devices by
/// name. Updates `memory` with what was seen (and forgets devices that are gone).
pub fn candidates(view: &HostView, memory: &mut Memory) -> Vec<Candidate> {
    let mut out = Vec::new();
    let empty = Remembered::default();
    for dev in view.host.pci.values() {
        let id = dev.address.to_string();
        let mem = memory.entries.get(&id).unwrap_or(&empty);
        out.push(pci_candidate(view, dev, mem));
    }
    for r in view.host.rdma.values().filter(|r| r.pci.is_none()) {
        out.push(soft_candidate(view, r));
    }
    memory.entries = out
        .iter()
        .map(|c| {
            let mut m = remember(c);
            if let Some(old) = memory.entries.get(&c.id) {
                // Keep what a past scan knew and this one could not see.
                m.netdev = m.netdev.or_else(|| old.netdev.clone());
                if m.char_devices.is_empty() {
                    m.char_devices = old.char_devices.clone();
                }
            }
            (c.id.clone(), m)
        })
        .collect();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connectx_pair_gives_pfs_and_vfs_with_rdma() {
        let (_dir, fx) = crate::testing::connectx_pair();
        let view = HostView::scan(&fx.root());
        let mut mem = Memory::default();
        let c = candidates(&view, &mut mem);
        assert_eq!(c.len(), 18, "{:?}", view.host.errors);
        let pf = c.iter().find(|c| c.id == "0000:3b:00.0").unwrap();
        assert_eq!(pf.kind, DeviceKind::Pci);
        assert_eq!(pf.active_vfs, 8);
        let vf = c.iter().find(|c| c.id == "0000:3b:00.2").unwrap();
        assert_eq!(vf.kind, DeviceKind::Vf);
        assert_eq!(vf.pf_name.as_deref(), Some("ens1f0"));
        assert_eq!(vf.vf_index, Some(0));
        assert_eq!(vf.numa, Some(0));
        assert_eq!(vf.link_type, Some(LinkType::Ether));
        assert!(vf.rdma_cm);
        let r = vf.rdma.as_ref().unwrap();
        assert!(r.present);
        assert_eq!(r.char_devices.len(), 2, "{r:?}");
        assert!(r.char_devices.iter().all(|c| c.present));
        assert_eq!(vf.netdev.as_ref().unwrap().name, "ens1f0v0");
        assert!(vf.netdev.as_ref().unwrap().up);
    }

    #[test]
    fn remembers_rdma_device_after_it_vanishes() {
        let (_dir, fx) = crate::testing::connectx_pair();
        let mut mem = Memory::default();
        let before = candidates(&HostView::scan(&fx.root()), &mut mem);
        let vf = before.iter().find(|c| c.id == "0000:3b:00.3").unwrap();
        let rdma = vf.rdma.as_ref().unwrap().name.clone();
        let uverbs = vf.rdma.as_ref().unwrap().char_devices[0].name.clone();
        std::fs::remove_file(fx.path().join("sys/class/infiniband").join(&rdma)).unwrap();
        fx.remove_char_device(&uverbs).unwrap();
        let after = candidates(&HostView::scan(&fx.root()), &mut mem);
        let vf = after.iter().find(|c| c.id == "0000:3b:00.3").unwrap();
        let r = vf.rdma.as_ref().unwrap();
        assert_eq!(r.name, rdma);
        assert!(!r.present);
        let node = r.char_devices.iter().find(|c| c.name == uverbs).unwrap();
        assert!(!node.present);
    }

    #[test]
    fn soft_device_over_virtual_netdev() {
        let (_dir, mut fx) = crate::testing::connectx_pair();
        fx.add_rxe("rxe0", "eth9").unwrap();
        let c = candidates(&HostView::scan(&fx.root()), &mut Memory::default());
        let rxe = c.iter().find(|c| c.id == "rxe0").unwrap();
        assert_eq!(rxe.kind, DeviceKind::Soft);
        assert_eq!(rxe.netdev.as_ref().unwrap().name, "eth9");
        assert_eq!(rxe.pci, None);
        assert_eq!(rxe.pack_group(), "rxe0");
    }

    #[test]
    fn rxe_on_a_vf_netdev_is_the_vfs_rdma_device() {
        use sriov_helpers::fixture::{FixtureHost, PfSpec};
        let mut fx = FixtureHost::new().unwrap();
        fx.add_numa_node(0, "0-1").unwrap();
        fx.add_numa_node(1, "2-3").unwrap();
        fx.add_rdma_cm().unwrap();
        let pf: PciAddress = "0000:01:00.0".parse().unwrap();
        fx.add_pf(PfSpec::igb("0000:01:00.0", "eth0", Some(1), 2))
            .unwrap();
        let netdev = fx.add_rxe_on_vf("rxe0", &pf, 1).unwrap();
        fx.add_ipv4_gid("rxe0", 2, Ipv4Addr::new(10, 0, 0, 7), &netdev)
            .unwrap();
        fx.add_rxe("rxe1", "veth9").unwrap();
        let c = candidates(&HostView::scan(&fx.root()), &mut Memory::default());
        let vf1 = fx.vf_address(&pf, 1).unwrap().to_string();
        let vf = c.iter().find(|c| c.id == vf1).unwrap();
        assert_eq!(vf.kind, DeviceKind::Vf);
        assert_eq!(vf.numa, Some(1));
        assert_eq!(vf.link_type, Some(LinkType::Ether));
        let r = vf.rdma.as_ref().expect("the VF shows its rxe");
        assert_eq!(r.name, "rxe0");
        assert!(r.present);
        let nodes: Vec<&str> = r.char_devices.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(nodes, ["uverbs0", "umad0"]);
        assert!(r.char_devices.iter().all(|c| c.present));
        assert_eq!(r.roce_v2_gid, Some((3, Ipv4Addr::new(10, 0, 0, 7))));
        // Not listed a second time as a soft device; the veth's rxe is one.
        assert!(!c.iter().any(|c| c.id == "rxe0"));
        let soft = c.iter().find(|c| c.id == "rxe1").unwrap();
        assert_eq!(soft.kind, DeviceKind::Soft);
        let vf0 = fx.vf_address(&pf, 0).unwrap().to_string();
        assert!(c.iter().find(|c| c.id == vf0).unwrap().rdma.is_none());
    }
}
