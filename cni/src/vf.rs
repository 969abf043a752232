//! Resolving a VF from sysfs under a host root: its PF, VF index, netdev and
//! RDMA device. Reads only.

use sriov_helpers::pci::read_pci_device;
use sriov_helpers::{HostError, HostRoot, PciAddress};

/// A VF and everything ADD/DEL need to know about it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VfTarget {
    pub pci: PciAddress,
    pub pf_pci: PciAddress,
    pub vf_index: u32,
    /// The PF netdev VF attributes are set through.
    pub pf_ifname: String,
    /// The VF's netdev as sysfs shows it in the host netns now; `None` when it
    /// is in another netns or the VF is bound to a non-netdev driver.
    pub netdev: Option<String>,
    pub rdma: Option<String>,
    pub driver: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum VfError {
    #[error("PCI device {pci} not found under {path}")]
    NotFound { pci: PciAddress, path: String },
    #[error("PCI device {pci} is not a VF (no physfn link){hint}")]
    NotAVf { pci: PciAddress, hint: String },
    #[error("VF {pci}: its PF {pf} does not list it in any virtfnN link")]
    NoIndex { pci: PciAddress, pf: PciAddress },
    #[error("VF {pci}: its PF {pf} has no netdev to set VF attributes through")]
    PfWithoutNetdev { pci: PciAddress, pf: PciAddress },
    #[error("VF {pci}: {source}")]
    Host {
        pci: PciAddress,
        #[source]
        source: HostError,
    },
}

/// Reads the VF at `pci` and its PF from `root`'s sysfs.
pub fn resolve(root: &HostRoot, pci: PciAddress) -> Result<VfTarget, VfError> {
    let dev = read_pci_device(root, pci).map_err(|e| {
        if e.is_not_found() {
            VfError::NotFound {
                pci,
                path: root.pci_devices().display().to_string(),
            }
        } else {
            VfError::Host { pci, source: e }
        }
    })?;
    let Some(physfn) = dev.physfn else {
        let hint = match &dev.sriov {
            Some(s) => format!(": it is a PF with {} VFs", s.num_vfs),
            None => String::new(),
        };
        return Err(VfError::NotAVf { pci, hint });
    };
    let pf = physfn.pf;
    let vf_index = physfn.index.ok_or(VfError::NoIndex { pci, pf })?;
    let pf_dev = read_pci_device(root, pf).map_err(|e| VfError::Host { pci, source: e })?;
    let pf_ifname = pf_dev
        .netdevs
        .first()
        .cloned()
        .ok_or(VfError::PfWithoutNetdev { pci, pf })?;
    Ok(VfTarget {
        pci,
        pf_pci: pf,
        vf_index,
        pf_ifname,
        netdev: dev.netdevs.first().cloned(),
        rdma: dev.rdma_devices.first().cloned(),
        driver: dev.driver,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use sriov_helpers::fixture::FixtureHost;

    #[test]
    fn resolves_connectx_vf() {
        let h = FixtureHost::connectx6dx_pair().unwrap();
        let vf = resolve(&h.root(), "0000:3b:00.4".parse().unwrap()).unwrap();
        assert_eq!(vf.pf_pci.to_string(), "0000:3b:00.0");
        assert_eq!(vf.vf_index, 2);
        assert_eq!(vf.pf_ifname, "ens1f0");
        assert_eq!(vf.netdev.as_deref(), Some("ens1f0v2"));
        assert!(vf.rdma.as_deref().unwrap().starts_with("mlx5_"));
        assert_eq!(vf.driver.as_deref(), Some("mlx5_core"));
    }

    #[test]
    fn refuses_pf_and_missing() {
        let h = FixtureHost::connectx6dx_pair().unwrap();
        let e = resolve(&h.root(), "0000:3b:00.0".parse().unwrap()).unwrap_err();
        assert!(
            e.to_string().contains("not a VF") && e.to_string().contains("PF with 8 VFs"),
            "{e}"
        );
        let e = resolve(&h.root(), "0000:aa:00.2".parse().unwrap()).unwrap_err();
        assert!(matches!(e, VfError::NotFound { .. }), "{e}");
    }
}
