//! Network interfaces under `sys/class/net/<if>`.

use crate::error::HostError;
use crate::pci::PciAddress;
use crate::root::HostRoot;
use crate::sysfs_io::{canonical, link_name, parse_optional_num, read_optional};
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
    let dir = root.class_net().join(name);
    canonical(&dir)?;
    let operstate = read_optional(&dir.join("operstate"))?.unwrap_or_else(|| "unknown".into());
    let address = read_optional(&dir.join("address"))?;
    let mtu = parse_optional_num::<u32>(&dir.join("mtu"), "MTU")?;
    let ifindex = parse_optional_num::<u32>(&dir.join("ifindex"), "ifindex")?;
    let carrier = match std::fs::read_to_string(dir.join("carrier")) {
        Ok(s) => match s.trim() {
            "1" => Some(true),
            "0" => Some(false),
            _ => None,
        },
        Err(_) => None,
    };
    let pci = match link_name(&dir.join("device"))? {
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
