//! Netdev MTU. Setting it is a netlink operation (`RTM_SETLINK` with
//! `IFLA_MTU`), not a sysfs write, so it sits behind [`LinkControl`].

use std::io;

#[derive(Debug, thiserror::Error)]
#[error("cannot set MTU {mtu} on {ifname}: {source}")]
pub struct MtuError {
    pub ifname: String,
    pub mtu: u32,
    #[source]
    pub source: io::Error,
}

pub trait LinkControl: Send + Sync {
    fn set_mtu(&self, ifname: &str, mtu: u32) -> Result<(), MtuError>;
}

/// The real thing: kroce-netlink's synchronous socket (one stack for the
/// project), one socket in the agent's netns, opened on first use and kept.
#[derive(Debug, Default)]
pub struct NetlinkLinks {
    socket: std::sync::Mutex<Option<kroce_netlink::NlSocket>>,
}

impl NetlinkLinks {
    pub fn new() -> Self {
        NetlinkLinks::default()
    }
}

fn nl_io(e: kroce_netlink::NlError) -> io::Error {
    match e {
        kroce_netlink::NlError::Socket(e) => e,
        kroce_netlink::NlError::Kernel(errno) => io::Error::from_raw_os_error(errno as i32),
        other => io::Error::other(other.to_string()),
    }
}

impl LinkControl for NetlinkLinks {
    fn set_mtu(&self, ifname: &str, mtu: u32) -> Result<(), MtuError> {
        use kroce_netlink::{NlSocket, route};
        let err = |source| MtuError {
            ifname: ifname.to_string(),
            mtu,
            source,
        };
        let mut guard = self
            .socket
            .lock()
            .map_err(|_| err(io::Error::other("netlink socket lock poisoned")))?;
        let socket = match guard.as_mut() {
            Some(s) => s,
            None => guard.insert(
                NlSocket::open(nix::sys::socket::SockProtocol::NetlinkRoute)
                    .map_err(|e| err(nl_io(e)))?,
            ),
        };
        let replies = socket
            .request(&route::get_link_by_name(ifname))
            .map_err(|e| err(nl_io(e)))?;
        let link = replies
            .first()
            .ok_or_else(|| err(io::Error::from_raw_os_error(libc::ENODEV)))
            .and_then(|p| {
                route::parse_link(p).map_err(|e| err(io::Error::new(io::ErrorKind::InvalidData, e)))
            })?;
        socket
            .request(&route::set_mtu(link.index, mtu))
            .map(drop)
            .map_err(|e| err(nl_io(e)))
    }
}

/// Test double for fixture hosts: writes `sys/class/net/<if>/mtu` as the
/// kernel would after the netlink call, and records the calls.
#[cfg(any(test, feature = "testing"))]
#[derive(Debug)]
pub struct FixtureLinks {
    pub sys: std::path::PathBuf,
    pub calls: std::sync::Mutex<Vec<(String, u32)>>,
}

#[cfg(any(test, feature = "testing"))]
impl FixtureLinks {
    pub fn new(sys: impl Into<std::path::PathBuf>) -> Self {
        FixtureLinks {
            sys: sys.into(),
            calls: std::sync::Mutex::new(Vec::new()),
        }
    }
    pub fn calls(&self) -> Vec<(String, u32)> {
        self.calls.lock().map(|c| c.clone()).unwrap_or_default()
    }
}

#[cfg(any(test, feature = "testing"))]
impl LinkControl for FixtureLinks {
    fn set_mtu(&self, ifname: &str, mtu: u32) -> Result<(), MtuError> {
        if let Ok(mut c) = self.calls.lock() {
            c.push((ifname.to_string(), mtu));
        }
        let path = self.sys.join("class/net").join(ifname).join("mtu");
        if !path.exists() {
            return Err(MtuError {
                ifname: ifname.to_string(),
                mtu,
                source: io::Error::from_raw_os_error(libc::ENODEV),
            });
        }
        std::fs::write(&path, format!("{mtu}\n")).map_err(|source| MtuError {
            ifname: ifname.to_string(),
            mtu,
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> bool {
        std::process::Command::new("ip")
            .args(args)
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    }

    /// The real netlink path on a real veth pair (needs root).
    #[test]
    fn netlink_sets_mtu_on_a_real_veth() {
        // CI runs as root with veth: there a skip would hide a failure.
        let ci = std::env::var_os("CI").is_some();
        if !nix::unistd::Uid::effective().is_root() {
            assert!(!ci, "CI must run this test as root");
            println!("skipped: needs root to create a veth pair");
            return;
        }
        let (a, b) = ("krocemtu0", "krocemtu1");
        let _ = run(&["link", "del", a]);
        if !run(&["link", "add", a, "type", "veth", "peer", "name", b]) {
            assert!(!ci, "CI must be able to create a veth pair");
            println!("skipped: cannot create veth here");
            return;
        }
        let links = NetlinkLinks::new();
        let r = links.set_mtu(a, 4000);
        let mtu = std::fs::read_to_string(format!("/sys/class/net/{a}/mtu")).unwrap_or_default();
        let missing = links.set_mtu("krocenope0", 1500);
        let _ = run(&["link", "del", a]);
        r.unwrap();
        assert_eq!(mtu.trim(), "4000");
        let e = missing.unwrap_err();
        assert_eq!(e.source.raw_os_error(), Some(libc::ENODEV), "{e}");
        assert!(e.to_string().contains("krocenope0"));
    }
}
