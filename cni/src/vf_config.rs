//! PF-side VF attributes over rtnetlink (`IFLA_VFINFO_LIST` on the PF).
//! Needs SR-IOV hardware: the real implementation is written for it; tests
//! use the recording one (`testing` feature) and compare the exact bytes.

use kroce_netlink::netns::Netns;
use kroce_netlink::route::{self, IFLA_VFINFO_LIST};
use kroce_netlink::vf_attrs::{VfSetting, VfState};
use kroce_netlink::{MsgBuilder, NlError, NlSocket};
use nix::errno::Errno;
use nix::sys::socket::SockProtocol;

#[derive(Debug, thiserror::Error)]
pub enum VfConfigError {
    #[error("PF {pf} not found in the host netns")]
    PfGone { pf: String },
    #[error("PF {pf} reports no VF {vf} (is SR-IOV enabled? the PF lists {listed} VFs)")]
    NoSuchVf { pf: String, vf: u32, listed: usize },
    #[error("{op} VF {vf} of PF {pf}: {source}")]
    Netlink {
        op: String,
        pf: String,
        vf: u32,
        #[source]
        source: NlError,
    },
}

impl VfConfigError {
    /// The PF or VF is not there any more (DEL after hot-unplug).
    pub fn is_gone(&self) -> bool {
        matches!(
            self,
            VfConfigError::PfGone { .. } | VfConfigError::NoSuchVf { .. }
        )
    }
}

/// Reads and sets VF attributes through a PF netdev.
pub trait VfConfig {
    fn get(&mut self, pf: &str, vf: u32) -> Result<VfState, VfConfigError>;
    fn set(&mut self, pf: &str, vf: u32, setting: &VfSetting) -> Result<(), VfConfigError>;
}

/// The real implementation: rtnetlink in the host netns, socket opened on
/// first use (DEL with nothing to restore never opens it).
#[derive(Debug)]
pub struct RtnlVfConfig {
    host: Option<Netns>,
    sock: Option<NlSocket>,
}

impl RtnlVfConfig {
    /// `host`: the netns the PFs live in (`None`: the calling thread's).
    pub fn new(host: Option<Netns>) -> RtnlVfConfig {
        RtnlVfConfig { host, sock: None }
    }

    fn sock(&mut self, pf: &str, vf: u32) -> Result<&mut NlSocket, VfConfigError> {
        if self.sock.is_none() {
            let s = match &self.host {
                Some(ns) => NlSocket::open_in(ns, SockProtocol::NetlinkRoute),
                None => NlSocket::open(SockProtocol::NetlinkRoute),
            }
            .map_err(|source| VfConfigError::Netlink {
                op: "open rtnetlink socket for".into(),
                pf: pf.into(),
                vf,
                source,
            })?;
            self.sock = Some(s);
        }
        match self.sock.as_mut() {
            Some(s) => Ok(s),
            None => Err(VfConfigError::PfGone { pf: pf.into() }),
        }
    }

    fn pf_reply(&mut self, pf: &str, vf: u32, msg: &MsgBuilder) -> Result<Vec<u8>, VfConfigError> {
        match self.sock(pf, vf)?.request(msg) {
            Ok(mut r) if !r.is_empty() => Ok(r.swap_remove(0)),
            Ok(_) => Err(VfConfigError::PfGone { pf: pf.into() }),
            Err(e) if matches!(e.errno(), Some(Errno::ENODEV)) => {
                Err(VfConfigError::PfGone { pf: pf.into() })
            }
            Err(source) => Err(VfConfigError::Netlink {
                op: "read".into(),
                pf: pf.into(),
                vf,
                source,
            }),
        }
    }
}

impl VfConfig for RtnlVfConfig {
    fn get(&mut self, pf: &str, vf: u32) -> Result<VfState, VfConfigError> {
        let reply = self.pf_reply(pf, vf, &route::get_link_vfs(pf))?;
        let decode = |source| VfConfigError::Netlink {
            op: format!("decode IFLA_VFINFO_LIST ({IFLA_VFINFO_LIST}) of"),
            pf: pf.into(),
            vf,
            source,
        };
        let vfs = route::parse_vfs(&reply).map_err(|e| decode(e.into()))?;
        let listed = vfs.len();
        vfs.into_iter()
            .find(|(i, _)| *i == vf)
            .map(|(_, s)| s)
            .ok_or(VfConfigError::NoSuchVf {
                pf: pf.into(),
                vf,
                listed,
            })
    }

    fn set(&mut self, pf: &str, vf: u32, setting: &VfSetting) -> Result<(), VfConfigError> {
        let link = self.pf_reply(pf, vf, &route::get_link_by_name(pf))?;
        let index = route::parse_link(&link)
            .map_err(|e| VfConfigError::Netlink {
                op: "decode".into(),
                pf: pf.into(),
                vf,
                source: e.into(),
            })?
            .index;
        self.sock(pf, vf)?
            .request(&route::set_vf(index, vf, setting))
            .map(|_| ())
            .map_err(|source| VfConfigError::Netlink {
                op: format!("set {setting} on"),
                pf: pf.into(),
                vf,
                source,
            })
    }
}
