//! PCI devices: addresses, identity, driver, NUMA, SR-IOV (PF and VF side),
//! netdevs, MSI IRQs and RDMA devices found under `sys/bus/pci/devices/<bdf>`.

use crate::cpulist::CpuList;
use crate::error::{HostError, ParseError};
use crate::root::HostRoot;
use crate::sysfs_io::{SysDir, dir_names};
use serde::Serialize;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

/// A PCI address in the kernel's `DDDD:BB:DD.F` form. Parsing is strict: a
/// value that could be a path (`../`, `/`) never parses, so an address from
/// untrusted input can be joined onto a sysfs path safely.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PciAddress {
    pub domain: u32,
    pub bus: u8,
    pub device: u8,
    pub function: u8,
}

impl PciAddress {
    pub const fn new(domain: u32, bus: u8, device: u8, function: u8) -> Self {
        PciAddress {
            domain,
            bus,
            device,
            function,
        }
    }
}

impl fmt::Display for PciAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

impl FromStr for PciAddress {
    type Err = ParseError;

    /// Accepts `DDDD:BB:DD.F` and the short `BB:DD.F` (domain 0).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |reason| ParseError::PciAddress {
            value: s.to_string(),
            reason,
        };
        if s.is_empty() || s.len() > 13 {
            return Err(err("expected DDDD:BB:DD.F"));
        }
        if !s
            .chars()
            .all(|c| c.is_ascii_hexdigit() || c == ':' || c == '.')
        {
            return Err(err("only hex digits, ':' and '.' are allowed"));
        }
        let (rest, function) = s.rsplit_once('.').ok_or(err("missing '.F' function"))?;
        let parts: Vec<&str> = rest.split(':').collect();
        let (domain, bus, device) = match parts.as_slice() {
            [d, b, dev] => (*d, *b, *dev),
            [b, dev] => ("0", *b, *dev),
            _ => return Err(err("expected DDDD:BB:DD.F")),
        };
        let hex = |v: &str, max_len: usize| -> Option<u32> {
            if v.is_empty() || v.len() > max_len {
                return None;
            }
            u32::from_str_radix(v, 16).ok()
        };
        let domain = hex(domain, 8).ok_or(err("bad domain"))?;
        let bus = hex(bus, 2).ok_or(err("bad bus"))?;
        let device = hex(device, 2)
            .filter(|d| *d < 32)
            .ok_or(err("bad device number (00-1f)"))?;
        let function = hex(function, 1)
            .filter(|f| *f < 8)
            .ok_or(err("bad function number (0-7)"))?;
        Ok(PciAddress {
            domain,
            bus: bus as u8,
            device: device as u8,
            function: function as u8,
        })
    }
}

crate::serde_via_str!(PciAddress);

/// The SR-IOV side of a physical function.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SriovPf {
    pub total_vfs: u32,
    pub num_vfs: u32,
    /// `(vf index, VF address)` from the `virtfnN` links, sorted by index.
    pub vfs: Vec<(u32, PciAddress)>,
}

/// The VF side: its parent PF and its index on that PF.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VfOf {
    pub pf: PciAddress,
    /// Derived from the PF's `virtfnN` link that points back at this VF;
    /// `None` when the PF does not list it (a broken or racing host).
    pub index: Option<u32>,
}

/// One PCI function as sysfs shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PciDevice {
    pub address: PciAddress,
    pub vendor: u16,
    pub device: u16,
    pub class: u32,
    pub driver: Option<String>,
    /// `None` when the kernel reports -1 (unknown) or the file is absent.
    pub numa_node: Option<u32>,
    pub local_cpus: Option<CpuList>,
    pub sriov: Option<SriovPf>,
    pub physfn: Option<VfOf>,
    pub netdevs: Vec<String>,
    pub rdma_devices: Vec<String>,
    pub msi_irqs: Vec<u32>,
}

impl PciDevice {
    pub fn is_pf(&self) -> bool {
        self.sriov.is_some()
    }
    pub fn is_vf(&self) -> bool {
        self.physfn.is_some()
    }
    /// `15b3` style vendor string as the selectors use it.
    pub fn vendor_hex(&self) -> String {
        format!("{:04x}", self.vendor)
    }
    pub fn device_hex(&self) -> String {
        format!("{:04x}", self.device)
    }
}

fn dev_dir(root: &HostRoot, addr: &PciAddress) -> PathBuf {
    root.pci_devices().join(addr.to_string())
}

/// Reads one PCI function. Errors name the file that was missing or wrong.
pub fn read_pci_device(root: &HostRoot, addr: PciAddress) -> Result<PciDevice, HostError> {
    read_pci_device_with(root, addr, true)
}

/// As [`read_pci_device`]; with `resolve_vf_index` false a VF's index is left
/// `None` for the caller to fill from its PF's `virtfnN` list (a whole-host
/// scan does that once per PF instead of once per VF, which is quadratic).
pub(crate) fn read_pci_device_with(
    root: &HostRoot,
    addr: PciAddress,
    resolve_vf_index: bool,
) -> Result<PciDevice, HostError> {
    let dir = SysDir::open(&dev_dir(root, &addr), "PCI device")?;
    read_pci_device_in(root, &dir, addr, resolve_vf_index)
}

/// As [`read_pci_device_with`] for a scan that holds `sys/bus/pci/devices` open.
pub(crate) fn read_pci_device_at(
    root: &HostRoot,
    devices: &SysDir,
    addr: PciAddress,
) -> Result<PciDevice, HostError> {
    let dir = devices.subdir(&addr.to_string(), "PCI device")?;
    read_pci_device_in(root, &dir, addr, false)
}

fn read_pci_device_in(
    root: &HostRoot,
    dir: &SysDir,
    addr: PciAddress,
    resolve_vf_index: bool,
) -> Result<PciDevice, HostError> {
    let vendor = dir.parse_hex_u16("vendor", "PCI vendor id")?;
    let device = dir.parse_hex_u16("device", "PCI device id")?;
    let class = dir.parse_hex_u32("class", "PCI class")?;
    let driver = dir.link_name("driver")?;
    let numa_node = match dir.parse_optional_num::<i64>("numa_node", "NUMA node")? {
        Some(n) if n >= 0 => Some(n as u32),
        _ => None,
    };
    let local_cpus = match dir.read_optional("local_cpulist")? {
        None => None,
        Some(s) => Some(s.parse::<CpuList>().map_err(|e| HostError::Malformed {
            path: dir.join("local_cpulist"),
            what: "CPU list",
            value: e.to_string(),
        })?),
    };
    let sriov = read_sriov_pf(dir)?;
    let physfn = read_physfn(root, dir, addr, resolve_vf_index)?;
    let netdevs = dir.dir_names("net")?;
    let rdma_devices = dir.dir_names("infiniband")?;
    let msi_irqs = {
        let mut irqs = Vec::new();
        for name in dir.dir_names("msi_irqs")? {
            let irq = name.parse::<u32>().map_err(|_| HostError::Malformed {
                path: dir.join("msi_irqs").join(&name),
                what: "IRQ number",
                value: name.clone(),
            })?;
            irqs.push(irq);
        }
        irqs.sort_unstable();
        irqs
    };
    Ok(PciDevice {
        address: addr,
        vendor,
        device,
        class,
        driver,
        numa_node,
        local_cpus,
        sriov,
        physfn,
        netdevs,
        rdma_devices,
        msi_irqs,
    })
}

fn read_sriov_pf(dir: &SysDir) -> Result<Option<SriovPf>, HostError> {
    let Some(total_vfs) = dir.parse_optional_num::<u32>("sriov_totalvfs", "VF count")? else {
        return Ok(None);
    };
    let num_vfs = dir
        .parse_optional_num::<u32>("sriov_numvfs", "VF count")?
        .unwrap_or_default();
    let mut vfs = Vec::new();
    for name in dir.dir_names(".")? {
        let Some(idx) = name.strip_prefix("virtfn") else {
            continue;
        };
        let link = dir.join(&name);
        let idx: u32 = idx.parse().map_err(|_| HostError::Malformed {
            path: link.clone(),
            what: "virtfn index",
            value: name.clone(),
        })?;
        // Read the link text only: a VF whose directory is gone must not hide
        // its PF (the VF's own entry reports the damage).
        let target = dir
            .read_link(&name)?
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let vf: PciAddress = target.parse().map_err(|_| HostError::Malformed {
            path: link.clone(),
            what: "virtfn target",
            value: target.clone(),
        })?;
        vfs.push((idx, vf));
    }
    vfs.sort();
    Ok(Some(SriovPf {
        total_vfs,
        num_vfs,
        vfs,
    }))
}

fn read_physfn(
    root: &HostRoot,
    dir: &SysDir,
    addr: PciAddress,
    resolve_index: bool,
) -> Result<Option<VfOf>, HostError> {
    let Some(target) = dir.link_name("physfn")? else {
        return Ok(None);
    };
    let pf: PciAddress = target.parse().map_err(|_| HostError::Malformed {
        path: dir.join("physfn"),
        what: "physfn target",
        value: target.clone(),
    })?;
    if !resolve_index {
        return Ok(Some(VfOf { pf, index: None }));
    }
    // The VF index is whichever `virtfnN` of the PF points back at us.
    let pf_dir = match SysDir::open(&dev_dir(root, &pf), "PCI device") {
        Ok(d) => d,
        // A PF gone or dangling leaves the index unknown, not the VF unread.
        Err(e) if e.is_not_found() => return Ok(Some(VfOf { pf, index: None })),
        Err(e) => return Err(e),
    };
    let me = addr.to_string();
    let mut index = None;
    for name in pf_dir.dir_names(".")? {
        if let Some(n) = name.strip_prefix("virtfn")
            && let Ok(Some(t)) = pf_dir.link_name(&name)
            && t == me
        {
            index = n.parse().ok();
            break;
        }
    }
    Ok(Some(VfOf { pf, index }))
}

/// All PCI addresses under `sys/bus/pci/devices`, sorted. Names that are not
/// PCI addresses are skipped.
pub fn list_pci_addresses(root: &HostRoot) -> Result<Vec<PciAddress>, HostError> {
    Ok(dir_names(&root.pci_devices())?
        .into_iter()
        .filter_map(|n| n.parse().ok())
        .collect())
}

/// Writes `sriov_numvfs` the way the kernel requires: a change between two
/// non-zero counts must go through 0 first.
pub fn set_num_vfs(root: &HostRoot, pf: PciAddress, num_vfs: u32) -> Result<(), HostError> {
    let path = dev_dir(root, &pf).join("sriov_numvfs");
    let current: u32 = crate::sysfs_io::parse_num(&path, "VF count")?;
    if current == num_vfs {
        return Ok(());
    }
    if current != 0 && num_vfs != 0 {
        crate::sysfs_io::write_string(&path, "0")?;
    }
    crate::sysfs_io::write_string(&path, &num_vfs.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_full_and_short_addresses() {
        let a: PciAddress = "0000:3b:00.2".parse().unwrap();
        assert_eq!(a, PciAddress::new(0, 0x3b, 0, 2));
        assert_eq!(a.to_string(), "0000:3b:00.2");
        let b: PciAddress = "3b:01.7".parse().unwrap();
        assert_eq!(b.to_string(), "0000:3b:01.7");
        let c: PciAddress = "10000:af:1f.0".parse().unwrap();
        assert_eq!(c.domain, 0x10000);
    }

    #[test]
    fn rejects_path_like_and_malformed_addresses() {
        for bad in [
            "",
            "../../etc",
            "0000:3b:00.2/../x",
            "0000:3b:00",
            "0000:3b:20.0",
            "0000:3b:00.8",
            "0000:3bb:00.1",
            "zz:00.0",
            "0000:3b:00.2 ",
        ] {
            let err = bad.parse::<PciAddress>().unwrap_err();
            assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
        }
    }

    #[test]
    fn serde_round_trip() {
        let a = PciAddress::new(0, 0x86, 1, 3);
        let j = serde_json::to_string(&a).unwrap();
        assert_eq!(j, "\"0000:86:01.3\"");
        let back: PciAddress = serde_json::from_str(&j).unwrap();
        assert_eq!(back, a);
    }
}
