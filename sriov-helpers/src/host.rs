//! A whole-host snapshot: every PCI function, netdev, RDMA device and NUMA
//! node, plus the errors met on the way. One bad device never hides the
//! others: its error is collected and the scan goes on.

use crate::error::HostError;
use crate::netdev::{Netdev, list_netdevs, read_netdev_at};
use crate::numa::{NumaNode, read_numa_nodes};
use crate::pci::{PciAddress, PciDevice, list_pci_addresses, read_pci_device, read_pci_device_at};
use crate::rdma::{CharDeviceIndex, RdmaDevice, list_rdma_devices, read_rdma_device_at};
use crate::root::HostRoot;
use crate::sysfs_io::SysDir;
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
    /// Reads the whole host. A soft RDMA device (rxe) whose parent netdev
    /// sits on a VF is that VF's RDMA device (`pci` set, `soft` still true).
    pub fn scan(root: &HostRoot) -> Host {
        Host::scan_with(root, ScanOptions::default())
    }

    pub fn scan_with(root: &HostRoot, opts: ScanOptions) -> Host {
        let mut host = Host::default();
        // A wrong --host-root would otherwise look like a host without NICs.
        if !crate::sysfs_io::is_dir(&root.pci_devices()) {
            host.errors.push(HostError::NotFound {
                path: root.pci_devices(),
                what: "PCI device directory (is the sysfs root right?)",
            });
        }
        // Three independent parts (PCI functions, netdevs, the RDMA side),
        // each on its own thread: the scan is syscall-bound, so on an idle
        // host with N cores its wall time is that of the longest part
        // (without threads they run inline, in the same order).
        let ((pci, pci_errors), (netdevs, netdev_errors), (rdma, rdma_errors)) =
            std::thread::scope(|s| {
                let rdma = spawn_part(s, "kroce-scan-rdma", root, read_rdma_side);
                let net = spawn_part(s, "kroce-scan-net", root, read_netdevs);
                let pci = read_pci_devices(root, opts);
                (
                    pci,
                    joined(net, root, read_netdevs),
                    joined(rdma, root, read_rdma_side),
                )
            });
        host.pci = pci;
        host.errors.extend(pci_errors);
        host.fill_vf_indices(root);
        host.netdevs = netdevs;
        host.errors.extend(netdev_errors);
        host.rdma = rdma;
        host.errors.extend(rdma_errors);
        host.attach_soft_rdma_to_vfs();
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

    /// A soft RDMA device (rxe) created on a VF's netdev belongs to that VF.
    /// The kernel gives such a device no `device` link (it lives under
    /// `devices/virtual/infiniband`); only its `parent` file names the netdev,
    /// whose own `device` link is the VF. Over a netdev that is not a VF (a
    /// veth, a PF, a NIC without SR-IOV) it stays a soft device, and so it
    /// does on a VF that has a hardware RDMA device of its own (that one is
    /// the VF's).
    fn attach_soft_rdma_to_vfs(&mut self) {
        let with_hw: std::collections::BTreeSet<PciAddress> = self
            .rdma
            .values()
            .filter(|r| !r.soft)
            .filter_map(|r| r.pci)
            .collect();
        for r in self.rdma.values_mut().filter(|r| r.soft && r.pci.is_none()) {
            let vf = r
                .parent_netdev
                .as_deref()
                .and_then(|n| self.netdevs.get(n))
                .and_then(|n| n.pci)
                .filter(|a| self.pci.get(a).is_some_and(PciDevice::is_vf));
            if let Some(vf) = vf.filter(|a| !with_hw.contains(a)) {
                r.pci = Some(vf);
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

    /// The RDMA device of a PCI function: its own, or a soft device on a
    /// VF's netdev (see [`Host::scan`]).
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

type Part<T> = (T, Vec<HostError>);

fn spawn_part<'scope, 'env, T: Send + 'scope>(
    s: &'scope std::thread::Scope<'scope, 'env>,
    name: &str,
    root: &'env HostRoot,
    f: fn(&HostRoot) -> Part<T>,
) -> std::io::Result<std::thread::ScopedJoinHandle<'scope, (Part<T>, u64)>> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn_scoped(s, move || crate::sysfs_io::counted(|| f(root)))
}

/// A part's result from its thread (its syscalls added to this thread's
/// count), or the part read inline when the thread could not be spawned.
fn joined<T>(
    spawned: std::io::Result<std::thread::ScopedJoinHandle<'_, (Part<T>, u64)>>,
    root: &HostRoot,
    inline: fn(&HostRoot) -> Part<T>,
) -> Part<T> {
    match spawned.map(|h| h.join()) {
        Ok(Ok((part, syscalls))) => {
            crate::sysfs_io::add_syscalls(syscalls);
            part
        }
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        Err(_) => inline(root),
    }
}

/// PCI functions (network ones unless `opts` says all); VF indices are
/// filled afterwards from the PFs' `virtfnN` links.
fn read_pci_devices(root: &HostRoot, opts: ScanOptions) -> Part<BTreeMap<PciAddress, PciDevice>> {
    let (mut pci, mut errors) = (BTreeMap::new(), Vec::new());
    // The bus directory is opened once and each device opened relative to
    // it (see sysfs_io).
    match list_pci_addresses(root).and_then(|addrs| {
        Ok((
            addrs,
            SysDir::open(&root.pci_devices(), "PCI device directory")?,
        ))
    }) {
        Ok((addrs, devices)) => {
            for addr in addrs {
                match read_pci_device_at(root, &devices, addr) {
                    Ok(dev) => {
                        if !opts.network_only || is_network_class(dev.class) {
                            pci.insert(addr, dev);
                        }
                    }
                    Err(e) => errors.push(e),
                }
            }
        }
        Err(e) => errors.push(e),
    }
    (pci, errors)
}

fn read_netdevs(root: &HostRoot) -> Part<BTreeMap<String, Netdev>> {
    let (mut netdevs, mut errors) = (BTreeMap::new(), Vec::new());
    match list_netdevs(root).and_then(|names| {
        Ok((
            names,
            SysDir::open(&root.class_net(), "net class directory")?,
        ))
    }) {
        Ok((names, class_net)) => {
            for name in names {
                match read_netdev_at(&class_net, &name) {
                    Ok(n) => {
                        netdevs.insert(name, n);
                    }
                    Err(e) => errors.push(e),
                }
            }
        }
        Err(e) => errors.push(e),
    }
    (netdevs, errors)
}

/// Char devices and RDMA devices, with the errors met, in scan order.
fn read_rdma_side(root: &HostRoot) -> (BTreeMap<String, RdmaDevice>, Vec<HostError>) {
    let (chars, mut errors) = CharDeviceIndex::read(root);
    let mut rdma = BTreeMap::new();
    match list_rdma_devices(root).and_then(|names| {
        Ok((
            names,
            SysDir::open(&root.class_infiniband(), "infiniband class directory")?,
        ))
    }) {
        Ok((names, class_ib)) => {
            for name in names {
                match read_rdma_device_at(&class_ib, &name, &chars) {
                    Ok(d) => {
                        rdma.insert(name, d);
                    }
                    Err(e) => errors.push(e),
                }
            }
        }
        Err(e) => errors.push(e),
    }
    (rdma, errors)
}
