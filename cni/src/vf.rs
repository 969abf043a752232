//! Resolving the device a config names from sysfs under a host root: a VF
//! (its PF, VF index, netdev and RDMA device) or a soft RDMA device (rxe,
//! siw: its parent netdev). Reads only.

use sriov_helpers::pci::read_pci_device;
use sriov_helpers::{HostError, HostRoot, PciAddress};
use std::path::PathBuf;

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
    /// `rdma` is a soft device (rxe, siw; this is its link type) made over
    /// the VF's netdev: the kernel deletes it when the netdev leaves the
    /// netns, so ADD recreates it in the pod and release on the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdma_soft: Option<String>,
    pub driver: Option<String>,
    /// The PF's driver (`device/driver` of the PF): what VF attributes the
    /// PF accepts depends on it. Absent in claims written before it was read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pf_driver: Option<String>,
}

/// What identifies a device: its claim and lock files are named by it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceKey {
    Pci(PciAddress),
    /// A soft RDMA device's name (one [`rdma_name_ok`] takes).
    Soft(String),
}

impl std::fmt::Display for DeviceKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceKey::Pci(a) => a.fmt(f),
            DeviceKey::Soft(n) => f.write_str(n),
        }
    }
}

impl DeviceKey {
    /// `VF 0000:3b:00.2` / `soft RDMA device rxe0`, for messages.
    pub fn label(&self) -> String {
        match self {
            DeviceKey::Pci(a) => format!("VF {a}"),
            DeviceKey::Soft(n) => format!("soft RDMA device {n}"),
        }
    }

    /// From a state file stem; `None` for anything else found there.
    pub fn from_stem(s: &str) -> Option<Self> {
        match s.parse::<PciAddress>() {
            Ok(a) => Some(DeviceKey::Pci(a)),
            Err(_) if rdma_name_ok(s) => Some(DeviceKey::Soft(s.to_string())),
            Err(_) => None,
        }
    }
}

/// An RDMA device name as the kernel allows it (IB_DEVICE_NAME_MAX 64)
/// and safe as a file name: no `/`, not `.` or `..`.
pub fn rdma_name_ok(s: &str) -> bool {
    (1..=63).contains(&s.len())
        && s != "."
        && s != ".."
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

/// A soft RDMA device: no PF, so no PF-side VF attributes; its parent
/// netdev is what moves into the pod.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SoftTarget {
    /// The RDMA device name (also its key).
    pub soft_rdma: String,
    /// The parent netdev as sysfs names it.
    pub netdev: Option<String>,
    /// Its link type (`rxe`, `siw`): the kernel deletes a soft device when
    /// its netdev leaves the netns (`rxe_net`'s NETDEV_UNREGISTER), so ADD
    /// makes it again in the pod and release on the host. `None` in claims
    /// written before this was recorded (those are released as then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_type: Option<String>,
}

/// The device an attachment holds. Untagged: claims written before soft
/// devices existed read as `Vf`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
pub enum Target {
    Vf(VfTarget),
    Soft(SoftTarget),
}

impl Target {
    pub fn key(&self) -> DeviceKey {
        match self {
            Target::Vf(v) => DeviceKey::Pci(v.pci),
            Target::Soft(s) => DeviceKey::Soft(s.soft_rdma.clone()),
        }
    }
    pub fn netdev(&self) -> Option<&String> {
        match self {
            Target::Vf(v) => v.netdev.as_ref(),
            Target::Soft(s) => s.netdev.as_ref(),
        }
    }
    /// The RDMA device that follows the netdev.
    pub fn rdma(&self) -> Option<&String> {
        match self {
            Target::Vf(v) => v.rdma.as_ref(),
            Target::Soft(s) => Some(&s.soft_rdma),
        }
    }
    pub fn pci(&self) -> Option<PciAddress> {
        match self {
            Target::Vf(v) => Some(v.pci),
            Target::Soft(_) => None,
        }
    }
    /// The soft RDMA device over the netdev and its link type (an rxe on a
    /// VF, or the soft device itself): it dies with the netdev's move and
    /// is made again, never moved.
    pub fn soft_link(&self) -> Option<(&String, &String)> {
        match self {
            Target::Vf(v) => Some((v.rdma.as_ref()?, v.rdma_soft.as_ref()?)),
            Target::Soft(s) => Some((&s.soft_rdma, s.link_type.as_ref()?)),
        }
    }
    /// The VF, for PF-side attributes.
    pub fn vf(&self) -> Option<&VfTarget> {
        match self {
            Target::Vf(v) => Some(v),
            Target::Soft(_) => None,
        }
    }
}

/// `VF 0000:3b:00.2` / `soft RDMA device rxe0`, for messages.
impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Vf(v) => write!(f, "VF {}", v.pci),
            Target::Soft(s) => write!(f, "soft RDMA device {}", s.soft_rdma),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum VfError {
    #[error("soft RDMA device {name} not found under {path}")]
    SoftNotFound { name: String, path: String },
    #[error(
        "RDMA device {name} is not a soft device (no parent netdev in {path}); give its VF PCI address"
    )]
    NotSoft { name: String, path: String },
    #[error("soft RDMA device {name}: {path}: {source}")]
    SoftIo {
        name: String,
        path: String,
        #[source]
        source: std::io::Error,
    },
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

/// Why a netdev name does not lead to a PCI device in sysfs.
#[derive(Debug, thiserror::Error)]
pub enum NetdevPciError {
    #[error("{name:?} is not a netdev name")]
    BadName { name: String },
    #[error("{}: {source} (not a PCI function's netdev)", link.display())]
    NoDevice {
        link: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} resolves to {}, not a PCI device", link.display(), dev.display())]
    NotPci { link: PathBuf, dev: PathBuf },
}

/// The PCI device sysfs says netdev `name` sits on: where
/// `class/net/<name>/device` resolves to.
pub fn netdev_pci(root: &HostRoot, name: &str) -> Result<PciAddress, NetdevPciError> {
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(NetdevPciError::BadName { name: name.into() });
    }
    let link = root.class_net().join(name).join("device");
    let dev = match std::fs::canonicalize(&link) {
        Ok(dev) => dev,
        Err(source) => return Err(NetdevPciError::NoDevice { link, source }),
    };
    match dev
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.parse::<PciAddress>().ok())
    {
        Some(pci) => Ok(pci),
        None => Err(NetdevPciError::NotPci { link, dev }),
    }
}

/// Why host netdev `name` (ifindex `index`) is not a device's.
#[derive(Debug, thiserror::Error)]
pub enum NotTheDevice {
    #[error("netdev {name} (ifindex {index}) belongs to device {parent} (kernel), not VF {vf}")]
    KernelParent {
        name: String,
        index: u32,
        parent: String,
        vf: PciAddress,
    },
    #[error("netdev {name} (ifindex {index}) belongs to PCI device {pci}, not VF {vf}")]
    OtherPci {
        name: String,
        index: u32,
        pci: PciAddress,
        vf: PciAddress,
    },
    #[error("netdev {name} (ifindex {index}) is not VF {vf}'s: {source}")]
    NoPci {
        name: String,
        index: u32,
        vf: PciAddress,
        #[source]
        source: NetdevPciError,
    },
    #[error(
        "netdev {name} (ifindex {index}) is not the parent of soft RDMA device {soft} (sysfs: {})",
        parent.as_deref().unwrap_or("none")
    )]
    NotParent {
        name: String,
        index: u32,
        soft: String,
        parent: Option<String>,
    },
    #[error("netdev {name} (ifindex {index}): {source}")]
    Soft {
        name: String,
        index: u32,
        #[source]
        source: VfError,
    },
}

/// Whether the host link `l` (as netlink reports it in the host netns) is
/// `target`'s netdev, from facts the link name alone does not decide: for a
/// VF, the kernel's parent device (`IFLA_PARENT_DEV_NAME`, when reported)
/// and sysfs' `class/net/<name>/device` must both be the VF's PCI address;
/// for a soft RDMA device, sysfs must name `l` as its parent netdev now.
/// `Err` says why not, naming the link and the device.
pub fn host_link_is(
    root: &HostRoot,
    l: &kroce_netlink::route::LinkInfo,
    target: &Target,
) -> Result<(), NotTheDevice> {
    let (name, index) = (l.name.clone(), l.index);
    match target {
        Target::Vf(v) => {
            if let Some(p) = &l.parent_dev
                && *p != v.pci.to_string()
            {
                return Err(NotTheDevice::KernelParent {
                    name,
                    index,
                    parent: p.clone(),
                    vf: v.pci,
                });
            }
            match netdev_pci(root, &l.name) {
                Ok(pci) if pci == v.pci => Ok(()),
                Ok(pci) => Err(NotTheDevice::OtherPci {
                    name,
                    index,
                    pci,
                    vf: v.pci,
                }),
                Err(source) => Err(NotTheDevice::NoPci {
                    name,
                    index,
                    vf: v.pci,
                    source,
                }),
            }
        }
        Target::Soft(s) => match resolve_soft(root, &s.soft_rdma) {
            Ok(SoftTarget {
                netdev: Some(n), ..
            }) if n == l.name => Ok(()),
            Ok(t) => Err(NotTheDevice::NotParent {
                name,
                index,
                soft: s.soft_rdma.clone(),
                parent: t.netdev,
            }),
            Err(source) => Err(NotTheDevice::Soft {
                name,
                index,
                source,
            }),
        },
    }
}

/// Reads the device `key` names from `root`'s sysfs.
pub fn resolve_key(root: &HostRoot, key: &DeviceKey) -> Result<Target, VfError> {
    match key {
        DeviceKey::Pci(pci) => resolve(root, *pci).map(Target::Vf),
        DeviceKey::Soft(name) => resolve_soft(root, name).map(Target::Soft),
    }
}

/// Reads a soft RDMA device's parent netdev (`sys/class/infiniband/<name>/parent`).
pub fn resolve_soft(root: &HostRoot, name: &str) -> Result<SoftTarget, VfError> {
    let dir = root.class_infiniband().join(name);
    if std::fs::symlink_metadata(&dir).is_err() {
        return Err(VfError::SoftNotFound {
            name: name.to_string(),
            path: root.class_infiniband().display().to_string(),
        });
    }
    let parent = dir.join("parent");
    let netdev = match std::fs::read_to_string(&parent) {
        Ok(s) => s.trim().to_string(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(VfError::NotSoft {
                name: name.to_string(),
                path: parent.display().to_string(),
            });
        }
        Err(e) => {
            return Err(VfError::SoftIo {
                name: name.to_string(),
                path: parent.display().to_string(),
                source: e,
            });
        }
    };
    Ok(SoftTarget {
        soft_rdma: name.to_string(),
        netdev: (!netdev.is_empty()).then_some(netdev),
        link_type: Some(soft_link_type(&dir).to_string()),
    })
}

/// `siw` when the soft device at `dir` is an RNIC (iWARP), else `rxe`.
fn soft_link_type(dir: &std::path::Path) -> &'static str {
    let node_type = std::fs::read_to_string(dir.join("node_type")).unwrap_or_default();
    if node_type.contains("RNIC") {
        "siw"
    } else {
        "rxe"
    }
}

/// The soft RDMA device made over netdev `netdev` and its link type: a
/// device under `class/infiniband` with no `device` link whose `parent`
/// names `netdev`. `siw` when its node type is an RNIC (iWARP), else `rxe`.
pub fn soft_rdma_on(root: &HostRoot, netdev: &str) -> Option<(String, String)> {
    let names = sriov_helpers::rdma::list_rdma_devices(root).ok()?;
    names.into_iter().find_map(|name| {
        let dir = root.class_infiniband().join(&name);
        if std::fs::symlink_metadata(dir.join("device")).is_ok() {
            return None;
        }
        let parent = std::fs::read_to_string(dir.join("parent")).ok()?;
        if parent.trim() != netdev {
            return None;
        }
        Some((name, soft_link_type(&dir).to_string()))
    })
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
    let netdev = dev.netdevs.first().cloned();
    // A hardware RDMA device of the VF's own wins over an rxe on its netdev
    // (as in sriov-helpers' host model).
    let (rdma, rdma_soft) = match (dev.rdma_devices.first(), &netdev) {
        (Some(hw), _) => (Some(hw.clone()), None),
        (None, Some(n)) => match soft_rdma_on(root, n) {
            Some((name, ty)) => (Some(name), Some(ty)),
            None => (None, None),
        },
        (None, None) => (None, None),
    };
    Ok(VfTarget {
        pci,
        pf_pci: pf,
        vf_index,
        pf_ifname,
        netdev,
        rdma,
        rdma_soft,
        driver: dev.driver,
        pf_driver: pf_dev.driver,
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
        assert_eq!(vf.pf_driver.as_deref(), Some("mlx5_core"));
    }

    /// Issue 25 2(c): an rxe made on an igb VF's netdev is that VF's RDMA
    /// device, marked soft (the kernel deletes it when the netdev moves);
    /// a VF with a hardware RDMA device keeps its own.
    #[test]
    fn an_rxe_on_a_vf_netdev_is_the_vfs_soft_rdma_device() {
        let mut h = FixtureHost::connectx6dx_pair().unwrap();
        h.add_pf(sriov_helpers::fixture::PfSpec::igb(
            "0000:81:00.0",
            "eth1",
            Some(1),
            2,
        ))
        .unwrap();
        let pf = "0000:81:00.0".parse().unwrap();
        let netdev = h.add_rxe_on_vf("rxe_vf1", &pf, 1).unwrap();
        let root = h.root();
        let vf1 = resolve(&root, h.vf_address(&pf, 1).unwrap()).unwrap();
        assert_eq!(vf1.netdev.as_deref(), Some(netdev.as_str()));
        assert_eq!(vf1.rdma.as_deref(), Some("rxe_vf1"));
        assert_eq!(vf1.rdma_soft.as_deref(), Some("rxe"));
        let vf0 = resolve(&root, h.vf_address(&pf, 0).unwrap()).unwrap();
        assert_eq!((vf0.rdma, vf0.rdma_soft), (None, None));
        // A ConnectX VF with an rxe on its netdev: its mlx5 device wins.
        h.add_rxe("rxe_cx", "ens1f0v2").unwrap();
        let cx = resolve(&h.root(), "0000:3b:00.4".parse().unwrap()).unwrap();
        assert!(cx.rdma.as_deref().unwrap().starts_with("mlx5_"));
        assert_eq!(cx.rdma_soft, None);
    }

    #[test]
    fn resolves_soft_device() {
        let mut h = FixtureHost::connectx6dx_pair().unwrap();
        h.add_rxe("rxe_t0", "veth_t0").unwrap();
        let key = DeviceKey::from_stem("rxe_t0").unwrap();
        let t = resolve_key(&h.root(), &key).unwrap();
        assert_eq!(t.netdev().map(String::as_str), Some("veth_t0"));
        assert_eq!(t.rdma().map(String::as_str), Some("rxe_t0"));
        assert_eq!(t.key(), key);
        assert!(t.vf().is_none() && t.pci().is_none());
        assert_eq!(t.to_string(), "soft RDMA device rxe_t0");
        let e = resolve_soft(&h.root(), "rxe_nope").unwrap_err();
        assert!(matches!(e, VfError::SoftNotFound { .. }), "{e}");
        // A hardware RDMA device is not a soft one.
        let hw = sriov_helpers::rdma::list_rdma_devices(&h.root())
            .unwrap()
            .into_iter()
            .find(|n| n.starts_with("mlx5_"))
            .unwrap();
        let e = resolve_soft(&h.root(), &hw).unwrap_err();
        assert!(matches!(e, VfError::NotSoft { .. }), "{e}");
    }

    #[test]
    fn a_host_link_is_the_device_by_sysfs_and_the_kernel() {
        let mut h = FixtureHost::connectx6dx_pair().unwrap();
        h.add_rxe("rxe_t0", "veth_t0").unwrap();
        let root = h.root();
        let vf = Target::Vf(resolve(&root, "0000:3b:00.4".parse().unwrap()).unwrap());
        let link = |name: &str, parent: Option<&str>| kroce_netlink::route::LinkInfo {
            index: 9,
            name: name.into(),
            mac: None,
            mtu: 1500,
            up: false,
            altnames: vec![],
            parent_dev: parent.map(str::to_string),
        };
        host_link_is(&root, &link("ens1f0v2", None), &vf).unwrap();
        host_link_is(&root, &link("ens1f0v2", Some("0000:3b:00.4")), &vf).unwrap();
        // Another VF's netdev, a virtual link, no such name, or the kernel
        // naming another parent: refused, naming the link and the VF.
        for (name, parent) in [
            ("ens1f0v1", None),
            ("veth_t0", None),
            ("nosuch0", None),
            ("../ens1f0v2", None),
            ("ens1f0v2", Some("0000:3b:00.3")),
        ] {
            let e = host_link_is(&root, &link(name, parent), &vf)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(name) && e.contains("0000:3b:00.4"),
                "{name}: {e}"
            );
        }
        let soft = Target::Soft(resolve_soft(&root, "rxe_t0").unwrap());
        host_link_is(&root, &link("veth_t0", None), &soft).unwrap();
        let e = host_link_is(&root, &link("ens1f0v2", None), &soft)
            .unwrap_err()
            .to_string();
        assert!(e.contains("rxe_t0") && e.contains("veth_t0"), "{e}");
        assert_eq!(
            netdev_pci(&root, "ens1f0v2").unwrap().to_string(),
            "0000:3b:00.4"
        );
    }

    #[test]
    fn keys_from_file_stems() {
        assert_eq!(
            DeviceKey::from_stem("0000:3b:00.2"),
            Some(DeviceKey::Pci("0000:3b:00.2".parse().unwrap()))
        );
        assert_eq!(
            DeviceKey::from_stem("rxe_t0"),
            Some(DeviceKey::Soft("rxe_t0".into()))
        );
        assert_eq!(DeviceKey::from_stem(".."), None);
        assert_eq!(DeviceKey::from_stem("a:b"), None);
    }

    #[test]
    fn old_claims_read_as_vf() {
        let h = FixtureHost::connectx6dx_pair().unwrap();
        let vf = resolve(&h.root(), "0000:3b:00.4".parse().unwrap()).unwrap();
        let json = serde_json::to_value(&vf).unwrap();
        let t: Target = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(t, Target::Vf(vf));
        assert_eq!(serde_json::to_value(&t).unwrap(), json);
        let s = Target::Soft(SoftTarget {
            soft_rdma: "rxe_t0".into(),
            netdev: Some("v0".into()),
            link_type: Some("rxe".into()),
        });
        let back: Target = serde_json::from_value(serde_json::to_value(&s).unwrap()).unwrap();
        assert_eq!(back, s);
        // A soft claim written before the link type was recorded.
        let old: Target =
            serde_json::from_value(serde_json::json!({"softRdma": "rxe_t0", "netdev": "v0"}))
                .unwrap();
        assert_eq!(old.soft_link(), None);
        assert_eq!(old.rdma().map(String::as_str), Some("rxe_t0"));
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
