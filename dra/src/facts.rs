//! Edge: one read of the host for the DRA front end — the device plugin's
//! candidates (same host model, same health memory) plus the two facts a
//! ResourceSlice carries that candidates do not: each PCI function's PCIe
//! root complex and each RDMA port's speed and RoCE v2 support.

use kroce_inventory::host_view::HostView;
use kroce_inventory::inventory::{Candidate, Memory, candidates};
use sriov_helpers::{HostRoot, PciAddress};
use std::collections::BTreeMap;
use std::path::Path;

#[derive(Debug, Clone, Default, PartialEq)]
pub struct PortFacts {
    /// `Ethernet` or `InfiniBand`, as sysfs says.
    pub link_layer: String,
    /// From `rate` (`100 Gb/sec (2X HDR)`), in Mb/s so 2.5 Gb/s stays exact.
    pub rate_mbps: Option<i64>,
    /// The GID table has RoCE v2 entries.
    pub roce_v2: bool,
}

#[derive(Debug, Clone, Default)]
pub struct HostFacts {
    pub candidates: Vec<Candidate>,
    /// `pci0000:3a` style root complex per PCI function.
    pub pcie_roots: BTreeMap<PciAddress, String>,
    /// The first port of each RDMA device, by device name.
    pub ports: BTreeMap<String, PortFacts>,
    /// What the scan could not read (logged; one bad device hides nothing).
    pub errors: Vec<String>,
}

/// The root complex in a sysfs device path or `bus/pci/devices/<bdf>` link
/// target: its `pciDDDD:BB` component (`../../../devices/pci0000:3a/0000:3a:02.0/0000:3b:00.0`
/// → `pci0000:3a`). This is the value of the standard
/// `resource.kubernetes.io/pcieRoot` attribute.
pub fn pcie_root_of(path: &Path) -> Option<String> {
    path.components().find_map(|c| {
        let s = c.as_os_str().to_str()?;
        let rest = s.strip_prefix("pci")?;
        let (dom, bus) = rest.split_once(':')?;
        let hex = |v: &str, len: std::ops::RangeInclusive<usize>| {
            len.contains(&v.len()) && v.chars().all(|c| c.is_ascii_hexdigit())
        };
        // VMD domains have 5 digits (`pci10000:00`).
        (hex(dom, 4..=8) && hex(bus, 2..=2)).then(|| s.to_ascii_lowercase())
    })
}

impl HostFacts {
    /// Reads the host under `root`. `memory` carries names across scans
    /// (see the device plugin's inventory).
    pub fn scan(root: &HostRoot, memory: &mut Memory) -> HostFacts {
        let view = HostView::scan(root);
        Self::from_view(root, &view, memory)
    }

    pub fn from_view(root: &HostRoot, view: &HostView, memory: &mut Memory) -> HostFacts {
        let candidates = candidates(view, memory);
        let mut errors: Vec<String> = view.host.errors.iter().map(|e| e.to_string()).collect();
        let mut pcie_roots = BTreeMap::new();
        for addr in view.host.pci.keys() {
            let link = root.pci_devices().join(addr.to_string());
            match std::fs::read_link(&link) {
                Ok(target) => match pcie_root_of(&target) {
                    Some(r) => {
                        pcie_roots.insert(*addr, r);
                    }
                    None => errors.push(format!(
                        "{}: link target {} names no PCIe root",
                        link.display(),
                        target.display()
                    )),
                },
                Err(e) => errors.push(format!("{}: {e}", link.display())),
            }
        }
        let ports = view
            .host
            .rdma
            .values()
            .filter_map(|r| {
                let p = r.ports.first()?;
                Some((
                    r.name.clone(),
                    PortFacts {
                        link_layer: p.link_layer.clone(),
                        rate_mbps: p.rate_gbps().map(|g| (g * 1000.0).round() as i64),
                        // Read now: the host scan leaves GID tables to who needs them.
                        roce_v2: match p.gids() {
                            Ok(gids) => gids
                                .iter()
                                .any(|g| g.gid_type.as_deref() == Some("RoCE v2")),
                            Err(e) => {
                                errors.push(e.to_string());
                                false
                            }
                        },
                    },
                ))
            })
            .collect();
        HostFacts {
            candidates,
            pcie_roots,
            ports,
            errors,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pcie_root_from_sysfs_paths() {
        assert_eq!(
            pcie_root_of(Path::new(
                "../../../devices/pci0000:3a/0000:3a:02.0/0000:3b:00.2"
            )),
            Some("pci0000:3a".into())
        );
        assert_eq!(
            pcie_root_of(Path::new("/sys/devices/pci10000:00/x")),
            Some("pci10000:00".into())
        );
        assert_eq!(pcie_root_of(Path::new("/sys/devices/pcie_x/pci0000")), None);
        assert_eq!(pcie_root_of(Path::new("../../devices/virtual/net")), None);
    }
}
