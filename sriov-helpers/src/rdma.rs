//! RDMA devices: `…/<bdf>/infiniband/<dev>` for PCI devices and
//! `sys/class/infiniband/<dev>` for soft devices (rxe, siw) whose `parent`
//! names a netdev; their ports, GID table and char devices.

use crate::error::HostError;
use crate::pci::PciAddress;
use crate::root::HostRoot;
use crate::sysfs_io::{canonical, dir_names, link_name, read_optional, read_string};
use serde::Serialize;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};

/// Character devices major number for all of uverbs/umad/issm.
pub const IB_MAJOR: u32 = 231;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RdmaDevice {
    pub name: String,
    /// The PCI function it sits on; `None` for soft devices.
    pub pci: Option<PciAddress>,
    /// For soft devices, the netdev named in `parent`.
    pub parent_netdev: Option<String>,
    pub node_type: Option<String>,
    pub ports: Vec<RdmaPort>,
    pub char_devices: CharDevices,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RdmaPort {
    pub num: u32,
    /// e.g. `ACTIVE`, `DOWN` (the text after `4: `).
    pub state: String,
    pub phys_state: Option<String>,
    /// `Ethernet` (RoCE) or `InfiniBand`.
    pub link_layer: String,
    /// The raw `rate` text, e.g. `100 Gb/sec (2X HDR)`.
    pub rate: Option<String>,
    pub gids: Vec<Gid>,
}

impl RdmaPort {
    pub fn is_active(&self) -> bool {
        self.state == "ACTIVE"
    }
    /// Port speed in Gb/s parsed from `rate` (`100 Gb/sec (2X HDR)` -> 100).
    pub fn rate_gbps(&self) -> Option<f64> {
        let r = self.rate.as_deref()?;
        let num = r.split_whitespace().next()?;
        num.parse().ok()
    }
    /// RoCE v2 GIDs that carry an IPv4 address, with their index.
    pub fn roce_v2_ipv4_gids(&self) -> impl Iterator<Item = (u32, Ipv4Addr, Option<&str>)> {
        self.gids.iter().filter_map(|g| {
            if g.gid_type.as_deref() != Some("RoCE v2") {
                return None;
            }
            g.gid
                .to_ipv4_mapped()
                .map(|v4| (g.index, v4, g.ndev.as_deref()))
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Gid {
    pub index: u32,
    pub gid: Ipv6Addr,
    /// `IB/RoCE v1` or `RoCE v2`.
    pub gid_type: Option<String>,
    pub ndev: Option<String>,
}

/// One char device of an RDMA device (`uverbs0`, `umad1`, `issm1`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CharDevice {
    /// Name under `/dev/infiniband`.
    pub name: String,
    /// Where it is on this host (under the dev root).
    pub host_path: PathBuf,
    /// `major:minor` from sysfs `dev`, when readable.
    pub dev: Option<(u32, u32)>,
    /// Whether the node exists under the dev root right now.
    pub present: bool,
}

impl CharDevice {
    /// Path inside a container.
    pub fn container_path(&self) -> String {
        format!("/dev/infiniband/{}", self.name)
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CharDevices {
    pub uverbs: Option<CharDevice>,
    pub umad: Vec<CharDevice>,
    pub issm: Vec<CharDevice>,
    /// `dev/infiniband/rdma_cm`, shared by all devices, when present.
    pub rdma_cm: Option<CharDevice>,
}

impl CharDevices {
    /// Every char device, uverbs first, in a stable order.
    pub fn all(&self) -> impl Iterator<Item = &CharDevice> {
        self.uverbs
            .iter()
            .chain(self.umad.iter())
            .chain(self.issm.iter())
            .chain(self.rdma_cm.iter())
    }
}

/// Which char devices belong to which RDMA device: built once per scan from
/// the `ibdev` files of `infiniband_verbs` and `infiniband_mad`.
#[derive(Debug, Default, Clone)]
pub struct CharDeviceIndex {
    /// (ibdev, kind, char device)
    entries: Vec<(String, CharKind, CharDevice)>,
    rdma_cm: Option<CharDevice>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CharKind {
    Uverbs,
    Umad,
    Issm,
}

impl CharDeviceIndex {
    pub fn read(root: &HostRoot) -> (Self, Vec<HostError>) {
        let mut idx = CharDeviceIndex::default();
        let mut errors = Vec::new();
        for (class_dir, prefixes) in [
            (root.class_verbs(), &[("uverbs", CharKind::Uverbs)][..]),
            (
                root.class_mad(),
                &[("umad", CharKind::Umad), ("issm", CharKind::Issm)][..],
            ),
        ] {
            let names = match dir_names(&class_dir) {
                Ok(n) => n,
                Err(e) => {
                    errors.push(e);
                    continue;
                }
            };
            for name in names {
                let Some(kind) = prefixes
                    .iter()
                    .find(|(p, _)| {
                        name.strip_prefix(p)
                            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
                    })
                    .map(|(_, k)| *k)
                else {
                    continue; // abi_version and friends
                };
                let dir = class_dir.join(&name);
                match read_string(&dir.join("ibdev")) {
                    Ok(ibdev) => {
                        let dev = read_dev_numbers(&dir.join("dev"));
                        let host_path = root.dev_infiniband().join(&name);
                        let present = host_path.exists();
                        idx.entries.push((
                            ibdev,
                            kind,
                            CharDevice {
                                name,
                                host_path,
                                dev,
                                present,
                            },
                        ));
                    }
                    Err(e) => errors.push(e),
                }
            }
        }
        let cm = root.dev_infiniband().join("rdma_cm");
        if cm.exists() {
            idx.rdma_cm = Some(CharDevice {
                name: "rdma_cm".into(),
                host_path: cm,
                dev: None,
                present: true,
            });
        }
        (idx, errors)
    }

    pub fn for_device(&self, ibdev: &str) -> CharDevices {
        let mut out = CharDevices {
            rdma_cm: self.rdma_cm.clone(),
            ..Default::default()
        };
        for (dev, kind, cd) in &self.entries {
            if dev != ibdev {
                continue;
            }
            match kind {
                CharKind::Uverbs => out.uverbs = Some(cd.clone()),
                CharKind::Umad => out.umad.push(cd.clone()),
                CharKind::Issm => out.issm.push(cd.clone()),
            }
        }
        out
    }
}

fn read_dev_numbers(path: &Path) -> Option<(u32, u32)> {
    let s = std::fs::read_to_string(path).ok()?;
    let (a, b) = s.trim().split_once(':')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// Strips the `4: ` prefix of `state`/`phys_state`.
fn state_text(s: &str) -> String {
    match s.split_once(':') {
        Some((_, t)) => t.trim().to_string(),
        None => s.trim().to_string(),
    }
}

/// Reads the RDMA device whose sysfs directory is `dir` (any path that
/// resolves to it: the class link or the directory under the PCI device).
pub fn read_rdma_device(
    dir: &Path,
    name: &str,
    chars: &CharDeviceIndex,
) -> Result<RdmaDevice, HostError> {
    let real = canonical(dir)?;
    let pci = match link_name(&real.join("device"))? {
        Some(t) => t.parse::<PciAddress>().ok(),
        None => None,
    };
    // Soft devices live under devices/virtual and name their netdev in `parent`.
    let parent_netdev = read_optional(&real.join("parent"))?;
    let node_type = read_optional(&real.join("node_type"))?;
    let mut ports = Vec::new();
    for pname in dir_names(&real.join("ports"))? {
        let num: u32 = pname.parse().map_err(|_| HostError::Malformed {
            path: real.join("ports").join(&pname),
            what: "port number",
            value: pname.clone(),
        })?;
        ports.push(read_port(&real.join("ports").join(&pname), num)?);
    }
    ports.sort_by_key(|p| p.num);
    Ok(RdmaDevice {
        name: name.to_string(),
        pci,
        parent_netdev,
        node_type,
        ports,
        char_devices: chars.for_device(name),
    })
}

fn read_port(dir: &Path, num: u32) -> Result<RdmaPort, HostError> {
    let state = state_text(&read_string(&dir.join("state"))?);
    let phys_state = read_optional(&dir.join("phys_state"))?.map(|s| state_text(&s));
    let link_layer = read_string(&dir.join("link_layer"))?;
    let rate = read_optional(&dir.join("rate"))?;
    let mut gids = Vec::new();
    for gname in dir_names(&dir.join("gids"))? {
        let path = dir.join("gids").join(&gname);
        let index: u32 = gname.parse().map_err(|_| HostError::Malformed {
            path: path.clone(),
            what: "GID index",
            value: gname.clone(),
        })?;
        let text = read_string(&path)?;
        let gid: Ipv6Addr = text.parse().map_err(|_| HostError::Malformed {
            path: path.clone(),
            what: "GID",
            value: text.clone(),
        })?;
        if gid.is_unspecified() {
            // Empty table slot: the kernel refuses to read its attributes.
            continue;
        }
        let gid_type = std::fs::read_to_string(dir.join("gid_attrs/types").join(&gname))
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty());
        let ndev = std::fs::read_to_string(dir.join("gid_attrs/ndevs").join(&gname))
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty());
        gids.push(Gid {
            index,
            gid,
            gid_type,
            ndev,
        });
    }
    gids.sort_by_key(|g| g.index);
    Ok(RdmaPort {
        num,
        state,
        phys_state,
        link_layer,
        rate,
        gids,
    })
}

/// Names under `sys/class/infiniband`.
pub fn list_rdma_devices(root: &HostRoot) -> Result<Vec<String>, HostError> {
    dir_names(&root.class_infiniband())
}

/// The RoCE v2 GID index for one of a netdev's IPv4 addresses on this device:
/// the kernel fills the GID table from the netdev's addresses, so this never
/// needs a hard-coded index.
pub fn roce_v2_gid_index(dev: &RdmaDevice, netdev: &str) -> Option<(u32, Ipv4Addr)> {
    dev.ports.iter().find_map(|p| {
        p.roce_v2_ipv4_gids()
            .find(|(_, _, ndev)| ndev.is_none_or(|n| n == netdev))
            .map(|(i, a, _)| (i, a))
    })
}
