//! Netdev operations this kernel can do (move, rename, MAC, MTU, up/down,
//! altnames, addresses, routes), per netns, behind a narrow trait. The real
//! implementation is one rtnetlink socket per netns.

use crate::addr::{IpNet, Mac};
use crate::protocol::Route;
use kroce_netlink::netns::Netns;
use kroce_netlink::route::{self, LinkInfo};
use kroce_netlink::{MsgBuilder, NlError, NlSocket};
use nix::errno::Errno;
use nix::sys::socket::SockProtocol;
use std::os::fd::{AsRawFd, BorrowedFd};

#[derive(Debug, thiserror::Error)]
#[error("{op} {target} in netns {netns}: {source}")]
pub struct LinkError {
    pub op: String,
    pub target: String,
    pub netns: String,
    #[source]
    pub source: NlError,
}

impl LinkError {
    pub fn errno(&self) -> Option<Errno> {
        self.source.errno()
    }

    /// The link (or the netns) is simply not there.
    pub fn is_gone(&self) -> bool {
        matches!(self.errno(), Some(Errno::ENODEV | Errno::ENOENT))
    }
}

/// Operations on the links of one netns.
pub trait Links {
    /// The netns this handle works in (for messages).
    fn netns(&self) -> &str;
    fn by_name(&mut self, name: &str) -> Result<Option<LinkInfo>, LinkError>;
    fn by_index(&mut self, index: u32) -> Result<Option<LinkInfo>, LinkError>;
    fn set_up(&mut self, index: u32, up: bool) -> Result<(), LinkError>;
    fn set_mac(&mut self, index: u32, mac: &Mac) -> Result<(), LinkError>;
    fn set_mtu(&mut self, index: u32, mtu: u32) -> Result<(), LinkError>;
    fn rename(&mut self, index: u32, name: &str) -> Result<(), LinkError>;
    /// Moves the link into `target`, named `new_name` there, with ifindex
    /// `new_ifindex` when given (the kernel refuses with EEXIST when taken).
    fn move_to(
        &mut self,
        index: u32,
        target: BorrowedFd<'_>,
        new_name: &str,
        new_ifindex: Option<u32>,
    ) -> Result<(), LinkError>;
    fn add_altname(&mut self, index: u32, name: &str) -> Result<(), LinkError>;
    fn del_altname(&mut self, index: u32, name: &str) -> Result<(), LinkError>;
    fn addresses(&mut self, index: u32) -> Result<Vec<IpNet>, LinkError>;
    fn add_address(&mut self, index: u32, addr: &IpNet) -> Result<(), LinkError>;
    fn add_route(&mut self, index: u32, route: &Route) -> Result<(), LinkError>;
}

/// Opens a [`Links`] handle for a netns.
pub trait LinksOpener {
    fn open(&mut self, ns: &Netns) -> Result<Box<dyn Links>, LinkError>;
}

/// The real thing: rtnetlink over one socket bound to the netns.
#[derive(Debug)]
pub struct RtnlLinks {
    sock: NlSocket,
    netns: String,
}

impl RtnlLinks {
    pub fn open(ns: &Netns) -> Result<RtnlLinks, LinkError> {
        let netns = ns.path().display().to_string();
        let sock =
            NlSocket::open_in(ns, SockProtocol::NetlinkRoute).map_err(|source| LinkError {
                op: "open rtnetlink socket".into(),
                target: String::new(),
                netns: netns.clone(),
                source,
            })?;
        Ok(RtnlLinks { sock, netns })
    }

    fn err(&self, op: impl Into<String>, target: impl Into<String>, source: NlError) -> LinkError {
        LinkError {
            op: op.into(),
            target: target.into(),
            netns: self.netns.clone(),
            source,
        }
    }

    fn ack(&mut self, msg: &MsgBuilder, op: &str, target: String) -> Result<(), LinkError> {
        self.sock
            .request(msg)
            .map(|_| ())
            .map_err(|e| self.err(op, target, e))
    }

    fn one_link(&mut self, msg: &MsgBuilder, what: String) -> Result<Option<LinkInfo>, LinkError> {
        match self.sock.request(msg) {
            Ok(replies) => match replies.first() {
                None => Ok(None),
                Some(p) => route::parse_link(p)
                    .map(Some)
                    .map_err(|e| self.err("read link", what, e.into())),
            },
            Err(e) if matches!(e.errno(), Some(Errno::ENODEV)) => Ok(None),
            Err(e) => Err(self.err("read link", what, e)),
        }
    }
}

impl Links for RtnlLinks {
    fn netns(&self) -> &str {
        &self.netns
    }

    fn by_name(&mut self, name: &str) -> Result<Option<LinkInfo>, LinkError> {
        self.one_link(&route::get_link_by_name(name), name.to_string())
    }

    fn by_index(&mut self, index: u32) -> Result<Option<LinkInfo>, LinkError> {
        self.one_link(&route::get_link_by_index(index), format!("index {index}"))
    }

    fn set_up(&mut self, index: u32, up: bool) -> Result<(), LinkError> {
        let op = if up { "set up" } else { "set down" };
        self.ack(&route::set_up(index, up), op, format!("index {index}"))
    }

    fn set_mac(&mut self, index: u32, mac: &Mac) -> Result<(), LinkError> {
        self.ack(
            &route::set_mac(index, mac),
            &format!("set MAC {mac} on"),
            format!("index {index}"),
        )
    }

    fn set_mtu(&mut self, index: u32, mtu: u32) -> Result<(), LinkError> {
        self.ack(
            &route::set_mtu(index, mtu),
            &format!("set MTU {mtu} on"),
            format!("index {index}"),
        )
    }

    fn rename(&mut self, index: u32, name: &str) -> Result<(), LinkError> {
        self.ack(
            &route::rename(index, name),
            &format!("rename to {name}"),
            format!("index {index}"),
        )
    }

    fn move_to(
        &mut self,
        index: u32,
        target: BorrowedFd<'_>,
        new_name: &str,
        new_ifindex: Option<u32>,
    ) -> Result<(), LinkError> {
        let fd = u32::try_from(target.as_raw_fd()).unwrap_or_default();
        self.ack(
            &route::move_to_netns(index, fd, new_name, new_ifindex),
            &format!("move (as {new_name}) out of"),
            format!("index {index}"),
        )
    }

    fn add_altname(&mut self, index: u32, name: &str) -> Result<(), LinkError> {
        self.ack(
            &route::altname(index, name, true),
            &format!("add altname {name} to"),
            format!("index {index}"),
        )
    }

    fn del_altname(&mut self, index: u32, name: &str) -> Result<(), LinkError> {
        self.ack(
            &route::altname(index, name, false),
            &format!("delete altname {name} of"),
            format!("index {index}"),
        )
    }

    fn addresses(&mut self, index: u32) -> Result<Vec<IpNet>, LinkError> {
        let replies = self
            .sock
            .request(&route::dump_addresses())
            .map_err(|e| self.err("list addresses of", format!("index {index}"), e))?;
        let mut out = Vec::new();
        for p in replies {
            let (i, net) = route::parse_address(&p)
                .map_err(|e| self.err("list addresses of", format!("index {index}"), e.into()))?;
            if i == index {
                out.push(net);
            }
        }
        Ok(out)
    }

    fn add_address(&mut self, index: u32, addr: &IpNet) -> Result<(), LinkError> {
        self.ack(
            &route::add_address(index, addr),
            &format!("add address {addr} to"),
            format!("index {index}"),
        )
    }

    fn add_route(&mut self, index: u32, r: &Route) -> Result<(), LinkError> {
        let via = r.gw.map(|g| format!(" via {g}")).unwrap_or_default();
        self.ack(
            &route::add_route(index, r),
            &format!("add route {}{via} on", r.dst),
            format!("index {index}"),
        )
    }
}

/// Opens [`RtnlLinks`].
#[derive(Debug, Default)]
pub struct RtnlOpener;

impl LinksOpener for RtnlOpener {
    fn open(&mut self, ns: &Netns) -> Result<Box<dyn Links>, LinkError> {
        Ok(Box::new(RtnlLinks::open(ns)?))
    }
}
