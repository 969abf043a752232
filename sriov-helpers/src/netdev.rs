//! Network interfaces under `sys/class/net/<if>`.

use crate::error::HostError;
use crate::pci::PciAddress;
use crate::root::HostRoot;
use crate::sysfs_io::SysDir;
use serde::Serialize;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Netdev {
    pub name: String,
    pub ifindex: Option<u32>,
    /// `up`, `down`, `unknown`, `lowerlayerdown`, ... as the kernel writes it.
    pub operstate: String,
    pub address: Option<String>,
    pub mtu: Option<u32>,
    /// `None` when the kernel refuses to say (reading `carrier` of a down
    /// interface fails with EINVAL on a real host).
    pub carrier: Option<bool>,
    /// The PCI function behind it, from the `device` link; `None` for virtual
    /// netdevs (veth, macvlan, bond).
    pub pci: Option<PciAddress>,
}

impl Netdev {
    /// Up for traffic: operstate `up`, or `unknown` with carrier (some
    /// drivers never report operstate).
    pub fn is_up(&self) -> bool {
        self.operstate == "up" || (self.operstate == "unknown" && self.carrier == Some(true))
    }
}

pub fn read_netdev(root: &HostRoot, name: &str) -> Result<Netdev, HostError> {
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(HostError::Malformed {
            path: root.class_net(),
            what: "interface name",
            value: name.to_string(),
        });
    }
    let dir = SysDir::open(&root.class_net().join(name), "netdev")?;
    read_netdev_in(&dir, name)
}

/// As [`read_netdev`] for a scan that holds `sys/class/net` open.
pub(crate) fn read_netdev_at(class_net: &SysDir, name: &str) -> Result<Netdev, HostError> {
    let dir = class_net.subdir(name, "netdev")?;
    read_netdev_in(&dir, name)
}

fn read_netdev_in(dir: &SysDir, name: &str) -> Result<Netdev, HostError> {
    let operstate = dir
        .read_optional("operstate")?
        .unwrap_or_else(|| "unknown".into());
    let address = dir.read_optional("address")?;
    let mtu = dir.parse_optional_num::<u32>("mtu", "MTU")?;
    let ifindex = dir.parse_optional_num::<u32>("ifindex", "ifindex")?;
    let carrier = match dir.read_lossy("carrier") {
        Some(s) => match s.trim() {
            "1" => Some(true),
            "0" => Some(false),
            _ => None,
        },
        None => None,
    };
    let pci = match dir.link_name("device")? {
        Some(t) => t.parse::<PciAddress>().ok(),
        None => None,
    };
    Ok(Netdev {
        name: name.to_string(),
        ifindex,
        operstate,
        address,
        mtu,
        carrier,
        pci,
    })
}

pub fn list_netdevs(root: &HostRoot) -> Result<Vec<String>, HostError> {
    crate::sysfs_io::dir_names(&root.class_net())
}
