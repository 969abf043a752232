//! RDMA devices: `…/<bdf>/infiniband/<dev>` for PCI devices and
//! `sys/class/infiniband/<dev>` for soft devices (rxe, siw) whose `parent`
//! names a netdev; their ports, GID table and char devices.

use crate::error::HostError;
use crate::pci::PciAddress;
use crate::root::HostRoot;
use crate::sysfs_io::{SysDir, dir_names};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};

/// Character devices major number for all of uverbs/umad/issm.
pub const IB_MAJOR: u32 = 231;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RdmaDevice {
    pub name: String,
    /// The PCI function it belongs to: its `device` link, or, for a soft
    /// device created on a VF's netdev, that VF (filled by [`crate::Host::scan`],
    /// see there). `None` for a soft device on any other netdev.
    pub pci: Option<PciAddress>,
    /// A soft device (rxe, siw): no `device` link, its netdev named in `parent`.
    pub soft: bool,
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
    /// The port's sysfs directory, for reading the GID table on demand.
    #[serde(skip)]
    dir: PathBuf,
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
    /// The port's GID table (non-empty slots, by index), read now. A scan
    /// does not read it: a real port has 255+ slots, a file each, and only
    /// a few callers (GID lookup for a RoCE endpoint) need it.
    pub fn gids(&self) -> Result<Vec<Gid>, HostError> {
        read_gids(&self.dir)
    }
    /// RoCE v2 GIDs that carry an IPv4 address: `(index, address, ndev)`,
    /// read now (see [`RdmaPort::gids`]).
    pub fn roce_v2_ipv4_gids(&self) -> Result<Vec<(u32, Ipv4Addr, Option<String>)>, HostError> {
        Ok(self
            .gids()?
            .into_iter()
            .filter_map(|g| {
                if g.gid_type.as_deref() != Some("RoCE v2") {
                    return None;
                }
                g.gid.to_ipv4_mapped().map(|v4| (g.index, v4, g.ndev))
            })
            .collect())
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
/// the `ibdev` files of `infiniband_verbs` and `infiniband_mad`, keyed by
/// RDMA device name.
#[derive(Debug, Default, Clone)]
pub struct CharDeviceIndex {
    by_ibdev: BTreeMap<String, CharDevices>,
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
        // One listing of dev/infiniband instead of a stat per char device.
        let dev_nodes: BTreeSet<String> = match dir_names(&root.dev_infiniband()) {
            Ok(n) => n.into_iter().collect(),
            Err(e) => {
                errors.push(e);
                BTreeSet::new()
            }
        };
        for (class_dir, prefixes) in [
            (root.class_verbs(), &[("uverbs", CharKind::Uverbs)][..]),
            (
                root.class_mad(),
                &[("umad", CharKind::Umad), ("issm", CharKind::Issm)][..],
            ),
        ] {
            let class = match SysDir::open(&class_dir, "char device class directory") {
                Ok(d) => d,
                Err(e) => {
                    errors.push(e);
                    continue;
                }
            };
            let names = match class.dir_names(".") {
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
                match class.read_string(&format!("{name}/ibdev")) {
                    Ok(ibdev) => {
                        let dev = read_dev_numbers(&class, &format!("{name}/dev"));
                        let host_path = root.dev_infiniband().join(&name);
                        let present = dev_nodes.contains(&name);
                        let cd = CharDevice {
                            name,
                            host_path,
                            dev,
                            present,
                        };
                        let e = idx.by_ibdev.entry(ibdev).or_default();
                        match kind {
                            CharKind::Uverbs => e.uverbs = Some(cd),
                            CharKind::Umad => e.umad.push(cd),
                            CharKind::Issm => e.issm.push(cd),
                        }
                    }
                    Err(e) => errors.push(e),
                }
            }
        }
        if dev_nodes.contains("rdma_cm") {
            idx.rdma_cm = Some(CharDevice {
                name: "rdma_cm".into(),
                host_path: root.dev_infiniband().join("rdma_cm"),
                dev: None,
                present: true,
            });
        }
        (idx, errors)
    }

    pub fn for_device(&self, ibdev: &str) -> CharDevices {
        let mut out = self.by_ibdev.get(ibdev).cloned().unwrap_or_default();
        out.rdma_cm = self.rdma_cm.clone();
        out
    }
}

fn read_dev_numbers(dir: &SysDir, name: &str) -> Option<(u32, u32)> {
    let s = dir.read_lossy(name)?;
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
    let dir = SysDir::open(dir, "RDMA device")?;
    read_rdma_device_in(&dir, name, chars)
}

/// As [`read_rdma_device`] for a scan that holds `sys/class/infiniband` open.
pub(crate) fn read_rdma_device_at(
    class: &SysDir,
    name: &str,
    chars: &CharDeviceIndex,
) -> Result<RdmaDevice, HostError> {
    let dir = class.subdir(name, "RDMA device")?;
    read_rdma_device_in(&dir, name, chars)
}

fn read_rdma_device_in(
    dir: &SysDir,
    name: &str,
    chars: &CharDeviceIndex,
) -> Result<RdmaDevice, HostError> {
    let device = dir.link_name("device")?;
    let soft = device.is_none();
    let pci = device.and_then(|t| t.parse::<PciAddress>().ok());
    // Soft devices live under devices/virtual and name their netdev in `parent`.
    let parent_netdev = dir.read_optional("parent")?;
    let node_type = dir.read_optional("node_type")?;
    let mut ports = Vec::new();
    for pname in dir.dir_names("ports")? {
        let num: u32 = pname.parse().map_err(|_| HostError::Malformed {
            path: dir.join("ports").join(&pname),
            what: "port number",
            value: pname.clone(),
        })?;
        ports.push(read_port(dir, &format!("ports/{pname}"), num)?);
    }
    ports.sort_by_key(|p| p.num);
    Ok(RdmaDevice {
        name: name.to_string(),
        pci,
        soft,
        parent_netdev,
        node_type,
        ports,
        char_devices: chars.for_device(name),
    })
}

/// Reads port `num` from `<dev>/<port>/` (files opened relative to the
/// device directory: two opens of subdirectories cost more than the walk).
fn read_port(dev: &SysDir, port: &str, num: u32) -> Result<RdmaPort, HostError> {
    let file = |name: &str| format!("{port}/{name}");
    let state = state_text(&dev.read_string(&file("state"))?);
    let phys_state = dev
        .read_optional(&file("phys_state"))?
        .map(|s| state_text(&s));
    let link_layer = dev.read_string(&file("link_layer"))?;
    let rate = dev.read_optional(&file("rate"))?;
    Ok(RdmaPort {
        num,
        state,
        phys_state,
        link_layer,
        rate,
        dir: dev.join(port),
    })
}

fn read_gids(port: &Path) -> Result<Vec<Gid>, HostError> {
    let dir = SysDir::open(port, "RDMA port")?;
    let mut gids = Vec::new();
    for gname in dir.dir_names("gids")? {
        let file = format!("gids/{gname}");
        let index: u32 = gname.parse().map_err(|_| HostError::Malformed {
            path: dir.join(&file),
            what: "GID index",
            value: gname.clone(),
        })?;
        let text = dir.read_string(&file)?;
        let gid: Ipv6Addr = text.parse().map_err(|_| HostError::Malformed {
            path: dir.join(&file),
            what: "GID",
            value: text.clone(),
        })?;
        if gid.is_unspecified() {
            // Empty table slot: the kernel refuses to read its attributes.
            continue;
        }
        let attr = |kind: &str| {
            dir.read_lossy(&format!("gid_attrs/{kind}/{gname}"))
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
        };
        gids.push(Gid {
            index,
            gid,
            gid_type: attr("types"),
            ndev: attr("ndevs"),
        });
    }
    gids.sort_by_key(|g| g.index);
    Ok(gids)
}

/// Names under `sys/class/infiniband`.
pub fn list_rdma_devices(root: &HostRoot) -> Result<Vec<String>, HostError> {
    dir_names(&root.class_infiniband())
}

/// The RoCE v2 GID index for one of a netdev's IPv4 addresses on this device:
/// the kernel fills the GID table from the netdev's addresses, so this never
/// needs a hard-coded index. Reads the GID tables now; `Ok(None)` when no
/// port has such a GID.
pub fn roce_v2_gid_index(
    dev: &RdmaDevice,
    netdev: &str,
) -> Result<Option<(u32, Ipv4Addr)>, HostError> {
    for p in &dev.ports {
        let hit = p
            .roce_v2_ipv4_gids()?
            .into_iter()
            .find(|(_, _, ndev)| ndev.as_deref().is_none_or(|n| n == netdev));
        if let Some((i, a, _)) = hit {
            return Ok(Some((i, a)));
        }
    }
    Ok(None)
}
