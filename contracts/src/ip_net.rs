//! An interface address with its prefix length (`10.1.0.5/24`): what a CNI
//! result, an IPAM answer and an rtnetlink `RTM_NEWADDR` carry. kroce-cni
//! and kroce-netlink share it.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// An address with its prefix length, `10.1.0.5/24` (host bits kept: this
/// is an interface address, not only a network).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IpNet {
    pub addr: IpAddr,
    pub prefix: u8,
}

impl IpNet {
    pub fn new(addr: IpAddr, prefix: u8) -> Result<IpNet, IpNetError> {
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if prefix > max {
            return Err(IpNetError::PrefixTooLong { prefix, max });
        }
        Ok(IpNet { addr, prefix })
    }

    pub fn is_ipv4(&self) -> bool {
        self.addr.is_ipv4()
    }

    /// The IPv4 broadcast address of the subnet, when it has one (/31 and /32
    /// do not).
    pub fn ipv4_broadcast(&self) -> Option<std::net::Ipv4Addr> {
        match self.addr {
            IpAddr::V4(a) if self.prefix < 31 => {
                let host_mask = u32::MAX >> self.prefix;
                Some(std::net::Ipv4Addr::from(u32::from(a) | host_mask))
            }
            _ => None,
        }
    }

    /// Whether `ip` lies inside this subnet.
    pub fn contains(&self, ip: &IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(a), IpAddr::V4(b)) => {
                let mask = if self.prefix == 0 {
                    0
                } else {
                    u32::MAX << (32 - u32::from(self.prefix))
                };
                u32::from(a) & mask == u32::from(*b) & mask
            }
            (IpAddr::V6(a), IpAddr::V6(b)) => {
                let mask = if self.prefix == 0 {
                    0
                } else {
                    u128::MAX << (128 - u32::from(self.prefix))
                };
                u128::from(a) & mask == u128::from(*b) & mask
            }
            _ => false,
        }
    }
}

impl fmt::Display for IpNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// Why a string or an address/prefix pair is not an [`IpNet`] (the caller
/// names the field).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IpNetError {
    #[error("expected ADDRESS/PREFIX")]
    NoPrefix,
    #[error("{0:?} is not an IP address")]
    Addr(String),
    #[error("{0:?} is not a prefix length")]
    Prefix(String),
    #[error("prefix /{prefix} is longer than {max}")]
    PrefixTooLong { prefix: u8, max: u8 },
}

impl FromStr for IpNet {
    type Err = IpNetError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (a, p) = s.split_once('/').ok_or(IpNetError::NoPrefix)?;
        let addr: IpAddr = a.parse().map_err(|_| IpNetError::Addr(a.to_string()))?;
        if p.is_empty() || p.len() > 3 || !p.chars().all(|c| c.is_ascii_digit()) {
            return Err(IpNetError::Prefix(p.to_string()));
        }
        let prefix: u8 = p.parse().map_err(|_| IpNetError::Prefix(p.to_string()))?;
        IpNet::new(addr, prefix)
    }
}

sriov_helpers::serde_via_str!(IpNet);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipnet_parse_and_broadcast() {
        let n: IpNet = "10.1.2.3/24".parse().unwrap();
        assert_eq!(n.ipv4_broadcast().unwrap().to_string(), "10.1.2.255");
        assert!(n.contains(&"10.1.2.200".parse().unwrap()));
        assert!(!n.contains(&"10.1.3.1".parse().unwrap()));
        assert_eq!(
            "10.0.0.1/32".parse::<IpNet>().unwrap().ipv4_broadcast(),
            None
        );
        let v6: IpNet = "fd00::5/64".parse().unwrap();
        assert!(v6.contains(&"fd00::1".parse().unwrap()));
        for bad in [
            "10.0.0.1",
            "10.0.0.1/33",
            "fd00::1/129",
            "x/24",
            "10.0.0.1/-1",
            "10.0.0.1/",
        ] {
            assert!(bad.parse::<IpNet>().is_err(), "{bad}");
        }
    }
}
