//! A whole-host snapshot: every PCI function, netdev, RDMA device and NUMA
//! node, plus the errors met on the way. One bad device never hides the
//! others: its error is collected and the scan goes on.

use crate::error::HostError;
use crate::netdev::{Netdev, list_netdevs, read_netdev};
use crate::numa::{NumaNode, read_numa_nodes};
use crate::pci::{
    PciAddress, PciDevice, list_pci_addresses, read_pci_device, read_pci_device_with,
};
use crate::rdma::{CharDeviceIndex, RdmaDevice, list_rdma_devices, read_rdma_device};
use crate::root::HostRoot;
use std::collections::BTreeMap;

#[derive(Debug, Default)]
pub struct Host {
    pub pci: BTreeMap<PciAddress, PciDevice>,
    pub netdevs: BTreeMap<String, Netdev>,
    pub rdma: BTreeMap<String, RdmaDevice>,
    pub numa: Vec<NumaNode>,
    pub errors: Vec<HostError>,
}

/// What to read. Discovery of network devices does not need every PCI
/// function of the host (GPUs, NVMe, bridges): `network_only` keeps the scan
/// to class 0x02 (network) and 0x0c06 (InfiniBand) functions.
#[derive(Debug, Clone, Copy)]
pub struct ScanOptions {
    pub network_only: bool,
}

impl Default for ScanOptions {
    fn default() -> Self {
        ScanOptions { network_only: true }
    }
}

fn is_network_class(class: u32) -> bool {
    (class >> 16) == 0x02 || (class >> 8) == 0x0c06
}

impl Host {
    pub fn scan(root: &HostRoot) -> Host {
        Host::scan_with(root, ScanOptions::default())
    }

    pub fn scan_with(root: &HostRoot, opts: ScanOptions) -> Host {
        let mut host = Host::default();
        // A wrong --host-root would otherwise look like a host without NICs.
        if !root.pci_devices().is_dir() {
            host.errors.push(HostError::NotFound {
                path: root.pci_devices(),
                what: "PCI device directory (is the sysfs root right?)",
            });
        }
        match list_pci_addresses(root) {
            Ok(addrs) => {
                for addr in addrs {
                    match read_pci_device_with(root, addr, false) {
                        Ok(dev) => {
                            if !opts.network_only || is_network_class(dev.class) {
                                host.pci.insert(addr, dev);
                            }
                        }
                        Err(e) => host.errors.push(e),
                    }
                }
            }
            Err(e) => host.errors.push(e),
        }
        host.fill_vf_indices(root);
        match list_netdevs(root) {
            Ok(names) => {
                for name in names {
                    match read_netdev(root, &name) {
                        Ok(n) => {
                            host.netdevs.insert(name, n);
                        }
                        Err(e) => host.errors.push(e),
                    }
                }
            }
            Err(e) => host.errors.push(e),
        }
        let (chars, char_errors) = CharDeviceIndex::read(root);
        host.errors.extend(char_errors);
        match list_rdma_devices(root) {
            Ok(names) => {
                for name in names {
                    let dir = root.class_infiniband().join(&name);
                    match read_rdma_device(&dir, &name, &chars) {
                        Ok(d) => {
                            host.rdma.insert(name, d);
                        }
                        Err(e) => host.errors.push(e),
                    }
                }
            }
            Err(e) => host.errors.push(e),
        }
        let (numa, numa_errors) = read_numa_nodes(root);
        host.numa = numa;
        host.errors.extend(numa_errors);
        host
    }

    /// VF indices from each PF's `virtfnN` list; a VF whose PF was not read
    /// (broken, or filtered out) falls back to searching the PF directory.
    fn fill_vf_indices(&mut self, root: &HostRoot) {
        let mut index_of = BTreeMap::new();
        for pf in self.pci.values() {
            if let Some(sriov) = &pf.sriov {
                for (idx, vf) in &sriov.vfs {
                    index_of.insert(*vf, (pf.address, *idx));
                }
            }
        }
        for dev in self.pci.values_mut() {
            let Some(of) = dev.physfn.as_mut() else {
                continue;
            };
            match index_of.get(&dev.address) {
                Some((pf, idx)) if *pf == of.pf => of.index = Some(*idx),
                _ => {
                    if let Ok(full) = read_pci_device(root, dev.address) {
                        of.index = full.physfn.and_then(|p| p.index);
                    }
                }
            }
        }
    }

    pub fn pfs(&self) -> impl Iterator<Item = &PciDevice> {
        self.pci.values().filter(|d| d.is_pf())
    }

    pub fn vfs(&self) -> impl Iterator<Item = &PciDevice> {
        self.pci.values().filter(|d| d.is_vf())
    }

    /// The netdev name of a PCI function (its first, as the kernel lists them).
    pub fn netdev_of(&self, addr: &PciAddress) -> Option<&str> {
        self.pci
            .get(addr)
            .and_then(|d| d.netdevs.first())
            .map(String::as_str)
    }

    /// The RDMA device on a PCI function.
    pub fn rdma_of_pci(&self, addr: &PciAddress) -> Option<&RdmaDevice> {
        self.rdma.values().find(|r| r.pci.as_ref() == Some(addr))
    }

    /// A soft RDMA device (rxe) whose parent is this netdev.
    pub fn rdma_of_netdev(&self, ifname: &str) -> Option<&RdmaDevice> {
        self.rdma
            .values()
            .find(|r| r.parent_netdev.as_deref() == Some(ifname))
    }

    /// The PF netdev name of a VF (what `pfNames` selectors match on).
    pub fn pf_name_of(&self, vf: &PciDevice) -> Option<&str> {
        let pf = vf.physfn?.pf;
        self.netdev_of(&pf)
    }

    pub fn numa_node(&self, id: u32) -> Option<&NumaNode> {
        self.numa.iter().find(|n| n.id == id)
    }
}
