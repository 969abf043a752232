//! RDMA devices across network namespaces (NETLINK_RDMA). Needs an RDMA
//! stack: the real implementation is written for it; tests use the
//! recording one (`testing` feature) and compare the exact bytes.

use crate::netlink::rdma::{self as msgs, RdmaNetnsMode};
use crate::netlink::{NlError, NlSocket};
use crate::netns::Netns;
use nix::errno::Errno;
use nix::sys::socket::SockProtocol;
use std::os::fd::AsRawFd;

#[derive(Debug, thiserror::Error)]
pub enum RdmaError {
    #[error("RDMA netlink is not available in netns {netns} (no RDMA stack loaded?): {source}")]
    Unavailable {
        netns: String,
        #[source]
        source: NlError,
    },
    #[error("{op} RDMA device {device}: {source}")]
    Netlink {
        op: String,
        device: String,
        #[source]
        source: NlError,
    },
}

/// Whether a move happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Moved {
    Yes,
    /// The device is not in the source netns (already moved, or gone).
    NotFound,
}

pub trait RdmaControl {
    /// The host's RDMA netns mode.
    fn netns_mode(&mut self) -> Result<RdmaNetnsMode, RdmaError>;
    /// Whether `device` is visible in `ns`.
    fn present(&mut self, ns: &Netns, device: &str) -> Result<bool, RdmaError>;
    /// Moves `device` from `from` into `to`.
    fn move_device(&mut self, device: &str, from: &Netns, to: &Netns) -> Result<Moved, RdmaError>;
}

/// The real implementation: one NETLINK_RDMA socket per request netns.
#[derive(Debug)]
pub struct NetlinkRdma {
    host: Option<Netns>,
}

impl NetlinkRdma {
    /// `host`: where the netns mode is asked (`None`: the calling thread's).
    pub fn new(host: Option<Netns>) -> NetlinkRdma {
        NetlinkRdma { host }
    }

    fn socket(ns: Option<&Netns>) -> Result<NlSocket, RdmaError> {
        let r = match ns {
            Some(ns) => NlSocket::open_in(ns, SockProtocol::NetlinkRDMA),
            None => NlSocket::open(SockProtocol::NetlinkRDMA),
        };
        r.map_err(|source| RdmaError::Unavailable {
            netns: ns
                .map(|n| n.path().display().to_string())
                .unwrap_or_else(|| "of this process".into()),
            source,
        })
    }

    fn find(sock: &mut NlSocket, device: &str) -> Result<Option<u32>, RdmaError> {
        let replies = sock
            .request(&msgs::dump_devices())
            .map_err(|source| RdmaError::Netlink {
                op: "list devices to find".into(),
                device: device.into(),
                source,
            })?;
        for p in replies {
            let (index, name) = msgs::parse_device(&p).map_err(|e| RdmaError::Netlink {
                op: "decode".into(),
                device: device.into(),
                source: e.into(),
            })?;
            if name == device {
                return Ok(Some(index));
            }
        }
        Ok(None)
    }
}

impl RdmaControl for NetlinkRdma {
    fn netns_mode(&mut self) -> Result<RdmaNetnsMode, RdmaError> {
        let mut sock = Self::socket(self.host.as_ref())?;
        let replies = sock
            .request(&msgs::sys_get())
            .map_err(|source| RdmaError::Netlink {
                op: "read the netns mode (SYS_GET) for".into(),
                device: "(system)".into(),
                source,
            })?;
        let first = replies.first().ok_or_else(|| RdmaError::Netlink {
            op: "read the netns mode (SYS_GET) for".into(),
            device: "(system)".into(),
            source: NlError::Kernel(Errno::ENODATA),
        })?;
        msgs::parse_netns_mode(first).map_err(|e| RdmaError::Netlink {
            op: "decode the netns mode for".into(),
            device: "(system)".into(),
            source: e.into(),
        })
    }

    fn present(&mut self, ns: &Netns, device: &str) -> Result<bool, RdmaError> {
        let mut sock = Self::socket(Some(ns))?;
        Ok(Self::find(&mut sock, device)?.is_some())
    }

    fn move_device(&mut self, device: &str, from: &Netns, to: &Netns) -> Result<Moved, RdmaError> {
        let mut sock = Self::socket(Some(from))?;
        let Some(index) = Self::find(&mut sock, device)? else {
            return Ok(Moved::NotFound);
        };
        let fd = u32::try_from(to.fd().as_raw_fd()).unwrap_or_default();
        sock.request(&msgs::set_netns(index, fd))
            .map(|_| Moved::Yes)
            .map_err(|source| RdmaError::Netlink {
                op: format!("move to netns {}", to.path().display()),
                device: device.into(),
                source,
            })
    }
}
