//! Recording stand-ins for what this kernel cannot do: PF-side VF
//! attributes and RDMA netns moves. They build the exact messages the real
//! implementations send (same builders), record them, and keep an
//! in-memory model of the hardware so flows can be checked end to end.

use crate::netlink::rdma::{self as rmsgs, RdmaNetnsMode};
use crate::netlink::route;
use crate::netns::Netns;
use crate::rdma::{Moved, RdmaControl, RdmaError};
use crate::vf_attrs::{LinkState, VfSetting, VfState};
use crate::vf_config::{VfConfig, VfConfigError};
use std::collections::BTreeMap;
use std::os::fd::AsRawFd;

/// One recorded netlink request: type, flags and the bytes after `nlmsghdr`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    pub msg_type: u16,
    pub flags: u16,
    pub payload: Vec<u8>,
}

impl Sent {
    fn of(m: &crate::netlink::MsgBuilder) -> Sent {
        Sent {
            msg_type: m.msg_type(),
            flags: m.flags(),
            payload: m.payload().to_vec(),
        }
    }
}

/// PFs with their VF tables, as an mlx5 PF reports them after VF creation.
#[derive(Debug, Clone, Default)]
pub struct RecordingVfConfig {
    /// PF netdev name -> ifindex used in the messages.
    pub pf_index: BTreeMap<String, u32>,
    pub vfs: BTreeMap<(String, u32), VfState>,
    pub sent: Vec<Sent>,
}

impl RecordingVfConfig {
    /// `pfs`: (PF netdev, its ifindex, VF count).
    pub fn new(pfs: &[(&str, u32, u32)]) -> RecordingVfConfig {
        let mut r = RecordingVfConfig::default();
        for (pf, index, n) in pfs {
            r.pf_index.insert(pf.to_string(), *index);
            for vf in 0..*n {
                r.vfs.insert(
                    (pf.to_string(), vf),
                    VfState {
                        spoofchk: Some(true),
                        trust: Some(false),
                        link_state: Some(LinkState::Auto),
                        ..VfState::default()
                    },
                );
            }
        }
        r
    }

    /// The two ConnectX-6 Dx PFs of `FixtureHost::connectx6dx_pair`.
    pub fn connectx6dx_pair() -> RecordingVfConfig {
        RecordingVfConfig::new(&[("ens1f0", 4, 8), ("ens2f0", 5, 8)])
    }

    pub fn state(&self, pf: &str, vf: u32) -> Option<VfState> {
        self.vfs.get(&(pf.to_string(), vf)).copied()
    }
}

impl VfConfig for RecordingVfConfig {
    fn get(&mut self, pf: &str, vf: u32) -> Result<VfState, VfConfigError> {
        if !self.pf_index.contains_key(pf) {
            return Err(VfConfigError::PfGone { pf: pf.into() });
        }
        self.state(pf, vf).ok_or(VfConfigError::NoSuchVf {
            pf: pf.into(),
            vf,
            listed: self.vfs.keys().filter(|(p, _)| p == pf).count(),
        })
    }

    fn set(&mut self, pf: &str, vf: u32, setting: &VfSetting) -> Result<(), VfConfigError> {
        let index = *self
            .pf_index
            .get(pf)
            .ok_or_else(|| VfConfigError::PfGone { pf: pf.into() })?;
        let st = self
            .vfs
            .get_mut(&(pf.to_string(), vf))
            .ok_or(VfConfigError::NoSuchVf {
                pf: pf.into(),
                vf,
                listed: 0,
            })?;
        self.sent.push(Sent::of(&route::set_vf(index, vf, setting)));
        st.apply(setting);
        Ok(())
    }
}

/// RDMA devices and the netns each is in.
#[derive(Debug, Clone)]
pub struct RecordingRdma {
    pub mode: Result<RdmaNetnsMode, String>,
    /// name -> (device index, netns id)
    pub devices: BTreeMap<String, (u32, (u64, u64))>,
    pub sent: Vec<Sent>,
}

impl RecordingRdma {
    pub fn new(mode: Result<RdmaNetnsMode, String>) -> RecordingRdma {
        RecordingRdma {
            mode,
            devices: BTreeMap::new(),
            sent: Vec::new(),
        }
    }

    /// Puts `name` (index `index`) in `ns`.
    pub fn with_device(mut self, name: &str, index: u32, ns: &Netns) -> RecordingRdma {
        self.devices.insert(name.into(), (index, ns.id()));
        self
    }

    pub fn netns_of(&self, name: &str) -> Option<(u64, u64)> {
        self.devices.get(name).map(|d| d.1)
    }
}

impl RdmaControl for RecordingRdma {
    fn netns_mode(&mut self) -> Result<RdmaNetnsMode, RdmaError> {
        self.sent.push(Sent::of(&rmsgs::sys_get()));
        self.mode.clone().map_err(|e| RdmaError::Unavailable {
            netns: "(recording)".into(),
            source: crate::netlink::NlError::Socket(std::io::Error::other(e)),
        })
    }

    fn present(&mut self, ns: &Netns, device: &str) -> Result<bool, RdmaError> {
        self.sent.push(Sent::of(&rmsgs::dump_devices()));
        Ok(self.devices.get(device).is_some_and(|d| d.1 == ns.id()))
    }

    fn move_device(&mut self, device: &str, from: &Netns, to: &Netns) -> Result<Moved, RdmaError> {
        self.sent.push(Sent::of(&rmsgs::dump_devices()));
        let Some(d) = self.devices.get_mut(device) else {
            return Ok(Moved::NotFound);
        };
        if d.1 != from.id() {
            return Ok(Moved::NotFound);
        }
        let fd = u32::try_from(to.fd().as_raw_fd()).unwrap_or_default();
        self.sent.push(Sent::of(&rmsgs::set_netns(d.0, fd)));
        d.1 = to.id();
        Ok(Moved::Yes)
    }
}
