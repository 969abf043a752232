//! Recording stand-ins for what this kernel cannot do: PF-side VF
//! attributes and RDMA netns moves. They build the exact messages the real
//! implementations send (same builders), record them, and keep an
//! in-memory model of the hardware so flows can be checked end to end.

use crate::addr::Mac;
use crate::rdma::{Moved, NetlinkRdma, RdmaControl, RdmaError, RdmaSocket, RdmaSockets};
use crate::testing::Faults;
use crate::vf_config::{VfConfig, VfConfigError};
use kroce_netlink::NlError;
use kroce_netlink::netns::Netns;
use kroce_netlink::rdma::{self as rmsgs, RdmaNetnsMode};
use kroce_netlink::route;
use kroce_netlink::vf_attrs::{LinkState, VfSetting, VfState};
use nix::errno::Errno;
use std::collections::BTreeMap;

/// One recorded netlink request: type, flags and the bytes after `nlmsghdr`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    pub msg_type: u16,
    pub flags: u16,
    pub payload: Vec<u8>,
}

impl Sent {
    fn of(m: &kroce_netlink::MsgBuilder) -> Sent {
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
    /// Behave as igb (82576) does, as measured on the real driver in the
    /// VM tier: see [`RecordingVfConfig::igb`].
    pub igb: Option<IgbModel>,
}

/// What igb does that mlx5 does not: it refuses 802.1ad (EPROTONOSUPPORT), a
/// min rate (EINVAL) and link state (EOPNOTSUPP); a PF-side MAC is an admin
/// MAC (00:00:00:00:00:00 clears it), and while one is set with trust off
/// the VF netdev cannot change its own MAC (EADDRNOTAVAIL, through the
/// shared [`Faults`]); with no admin MAC the PF reports the VF's own MAC.
#[derive(Debug, Clone, Default)]
pub struct IgbModel {
    pub faults: Faults,
    pub admin_mac: std::collections::BTreeSet<(String, u32)>,
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

    /// igb PFs (see [`IgbModel`]); VF `n`'s own MAC is `macs[n]` where given.
    /// `faults` must be the ones the calls are made with.
    pub fn igb(pfs: &[(&str, u32, u32)], macs: &[Mac], faults: Faults) -> RecordingVfConfig {
        let mut r = RecordingVfConfig::new(pfs);
        for ((_, vf), st) in r.vfs.iter_mut() {
            if let Some(m) = macs.get(*vf as usize) {
                st.mac = *m;
            }
        }
        r.igb = Some(IgbModel {
            faults,
            admin_mac: Default::default(),
        });
        r
    }

    pub fn state(&self, pf: &str, vf: u32) -> Option<VfState> {
        let mut st = self.vfs.get(&(pf.to_string(), vf)).copied()?;
        if let Some(igb) = &self.igb
            && !igb.admin_mac.contains(&(pf.to_string(), vf))
            && let Some(m) = igb.faults.netdev_mac()
        {
            st.mac = m;
        }
        Some(st)
    }

    fn igb_refusal(&self, setting: &VfSetting) -> Option<Errno> {
        self.igb.as_ref()?;
        match setting {
            VfSetting::Vlan {
                proto: kroce_netlink::vf_attrs::VlanProto::Dot1Ad,
                ..
            } => Some(Errno::EPROTONOSUPPORT),
            VfSetting::Rate { min, .. } if *min > 0 => Some(Errno::EINVAL),
            VfSetting::LinkState { .. } => Some(Errno::EOPNOTSUPP),
            _ => None,
        }
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
        if !self.vfs.contains_key(&(pf.to_string(), vf)) {
            return Err(VfConfigError::NoSuchVf {
                pf: pf.into(),
                vf,
                listed: 0,
            });
        }
        self.sent.push(Sent::of(&route::set_vf(index, vf, setting)));
        if let Some(errno) = self.igb_refusal(setting) {
            return Err(VfConfigError::Netlink {
                op: format!("set {setting} on"),
                pf: pf.into(),
                vf,
                source: kroce_netlink::NlError::Kernel(errno),
            });
        }
        let st = self
            .vfs
            .get_mut(&(pf.to_string(), vf))
            .ok_or(VfConfigError::NoSuchVf {
                pf: pf.into(),
                vf,
                listed: 0,
            })?;
        st.apply(setting);
        let trusted = st.trust == Some(true);
        if let Some(igb) = &mut self.igb {
            let key = (pf.to_string(), vf);
            if let VfSetting::Mac { mac } = setting {
                if mac.is_zero() {
                    igb.admin_mac.remove(&key);
                } else {
                    igb.admin_mac.insert(key.clone());
                }
            }
            igb.faults
                .set_vf_mac_locked(igb.admin_mac.contains(&key) && !trusted);
        }
        Ok(())
    }
}

/// One RDMA netlink request as the recording kernel saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RdmaCall {
    pub sent: Sent,
    /// The netns (st_dev, st_ino) the socket was opened in.
    pub socket_netns: (u64, u64),
    /// The sending thread's netns at send time (`/proc/thread-self/ns/net`):
    /// what the kernel calls `current->nsproxy->net_ns`.
    pub thread_netns: (u64, u64),
    /// For a move (SET with NET_NS_FD): the netns the device was in when the
    /// request came, i.e. the source.
    pub device_netns: Option<(u64, u64)>,
    /// The errno the recording kernel answered with.
    pub errno: Option<Errno>,
}

/// A model of the kernel's NETLINK_RDMA (nldev) for what this kernel cannot
/// do: RDMA devices and the netns each is in. Sits behind the real
/// [`NetlinkRdma`] logic as its socket source, so the threads and netns
/// requests are sent from are the real ones; it reads the sending thread's
/// netns per request and applies the kernel's rules:
/// - a dump lists the devices of the socket's netns (exclusive mode);
/// - SET looks the device up in the socket's netns (ENODEV), resolves
///   NET_NS_FD in this process's fd table (EBADF), refuses in shared mode
///   (EOPNOTSUPP) and, like `rdma_dev_change_netns(dev,
///   current->nsproxy->net_ns, net)`, answers ENODEV unless the sending
///   thread is in the device's current netns;
/// - NEWLINK creates a soft device over a netdev of the socket's netns
///   (ENODEV without one, ENFILE when the name is taken), in that netns or
///   in [`RecordingRdma::created_in`];
/// - a soft device is gone once its netdev left the netns it was in (the
///   kernel unregisters an rxe at its netdev's NETDEV_UNREGISTER, which a
///   netns move is): checked on every request, on the real links.
#[derive(Debug)]
pub struct RecordingRdma {
    /// `Err`: no RDMA stack (opening a socket fails with this message).
    pub mode: Result<RdmaNetnsMode, String>,
    /// name -> (device index, netns id)
    pub devices: BTreeMap<String, (u32, (u64, u64))>,
    /// Soft devices: name -> (netdev name, netdev ifindex, the netdev's netns).
    pub soft: BTreeMap<String, (String, u32, Netns)>,
    /// Where NEWLINK puts a device: `None` the socket's netns, else this
    /// netns (older kernels: init_net in exclusive mode).
    pub created_in: Option<(u64, u64)>,
    pub sent: Vec<Sent>,
    pub calls: Vec<RdmaCall>,
}

impl RecordingRdma {
    pub fn new(mode: Result<RdmaNetnsMode, String>) -> RecordingRdma {
        RecordingRdma {
            mode,
            devices: BTreeMap::new(),
            soft: BTreeMap::new(),
            created_in: None,
            sent: Vec::new(),
            calls: Vec::new(),
        }
    }

    /// Puts `name` (index `index`) in `ns`.
    pub fn with_device(mut self, name: &str, index: u32, ns: &Netns) -> RecordingRdma {
        self.devices.insert(name.into(), (index, ns.id()));
        self
    }

    /// Puts soft device `name` (rxe, index `index`) over netdev `netdev`
    /// of `ns` (a real link there).
    pub fn with_soft_device(
        mut self,
        name: &str,
        index: u32,
        ns: &Netns,
        netdev: &str,
    ) -> std::io::Result<RecordingRdma> {
        let ifindex =
            ns.run_in(|| nix::net::if_::if_nametoindex(netdev).map_err(std::io::Error::from))?;
        self.devices.insert(name.into(), (index, ns.id()));
        let here = Netns::open(ns.path())?;
        self.soft
            .insert(name.into(), (netdev.into(), ifindex, here));
        Ok(self)
    }

    /// Where `name` is now (`None`: no such device, or its netdev left).
    pub fn netns_of(&self, name: &str) -> Option<(u64, u64)> {
        if self.soft.get(name).is_some_and(|s| !Self::netdev_there(s)) {
            return None;
        }
        self.devices.get(name).map(|d| d.1)
    }

    /// The soft device's netdev under its name and ifindex in its netns: a
    /// move renames it (CNI_IFNAME) or takes it elsewhere.
    fn netdev_there((netdev, ifindex, ns): &(String, u32, Netns)) -> bool {
        ns.run_in(|| Ok(nix::net::if_::if_nametoindex(netdev.as_str()) == Ok(*ifindex)))
            .unwrap_or(false)
    }

    /// The recorded creations (NEWLINK requests), answered or refused.
    pub fn creations(&self) -> Vec<&RdmaCall> {
        self.calls
            .iter()
            .filter(|c| c.sent.msg_type == rmsgs::nldev_type(rmsgs::RDMA_NLDEV_CMD_NEWLINK))
            .collect()
    }

    /// Drops the soft devices whose netdev is no longer in its netns.
    fn reap(&mut self) {
        let gone: Vec<String> = self
            .soft
            .iter()
            .filter(|(_, s)| !Self::netdev_there(s))
            .map(|(n, _)| n.clone())
            .collect();
        for n in gone {
            self.soft.remove(&n);
            self.devices.remove(&n);
        }
    }

    /// The recorded moves (SET requests), answered or refused.
    pub fn moves(&self) -> Vec<&RdmaCall> {
        self.calls
            .iter()
            .filter(|c| c.sent.msg_type == rmsgs::nldev_type(rmsgs::RDMA_NLDEV_CMD_SET))
            .collect()
    }

    fn visible(&self, socket_netns: (u64, u64), dev_netns: (u64, u64)) -> bool {
        matches!(self.mode, Ok(RdmaNetnsMode::Shared)) || dev_netns == socket_netns
    }

    /// The kernel's answer to one request.
    fn answer(
        &mut self,
        msg: &kroce_netlink::MsgBuilder,
        socket_netns: (u64, u64),
        thread_netns: (u64, u64),
        device_netns: &mut Option<(u64, u64)>,
    ) -> Result<Vec<Vec<u8>>, Errno> {
        let ty = msg.msg_type();
        if ty == rmsgs::nldev_type(rmsgs::RDMA_NLDEV_CMD_SYS_GET) {
            let mode = match self.mode {
                Ok(RdmaNetnsMode::Exclusive) => 0,
                Ok(RdmaNetnsMode::Shared) => 1,
                Err(_) => return Err(Errno::EOPNOTSUPP),
            };
            let mut r = kroce_netlink::MsgBuilder::new(ty, 0);
            r.attr_u8(rmsgs::RDMA_NLDEV_SYS_ATTR_NETNS_MODE, mode);
            return Ok(vec![r.payload().to_vec()]);
        }
        if ty == rmsgs::nldev_type(rmsgs::RDMA_NLDEV_CMD_GET) {
            return Ok(self
                .devices
                .iter()
                .filter(|(_, d)| self.visible(socket_netns, d.1))
                .map(|(name, d)| {
                    let mut r = kroce_netlink::MsgBuilder::new(ty, 0);
                    r.attr_u32(rmsgs::RDMA_NLDEV_ATTR_DEV_INDEX, d.0)
                        .attr_str(rmsgs::RDMA_NLDEV_ATTR_DEV_NAME, name);
                    r.payload().to_vec()
                })
                .collect());
        }
        if ty == rmsgs::nldev_type(rmsgs::RDMA_NLDEV_CMD_NEWLINK) {
            let (mut name, mut link_type, mut netdev) = (None, None, None);
            for (t, p) in kroce_netlink::attrs(msg.payload()).flatten() {
                match t {
                    rmsgs::RDMA_NLDEV_ATTR_DEV_NAME => name = Some(kroce_netlink::read_str(p)),
                    rmsgs::RDMA_NLDEV_ATTR_LINK_TYPE => {
                        link_type = Some(kroce_netlink::read_str(p))
                    }
                    rmsgs::RDMA_NLDEV_ATTR_NDEV_NAME => netdev = Some(kroce_netlink::read_str(p)),
                    _ => {}
                }
            }
            let (Some(name), Some(link_type), Some(netdev)) = (name, link_type, netdev) else {
                return Err(Errno::EINVAL);
            };
            if link_type != "rxe" && link_type != "siw" {
                return Err(Errno::EINVAL);
            }
            // dev_get_by_name(sock_net(skb->sk), ...): this thread is in the
            // socket's netns (NetlinkRdma sends from there).
            let here = Netns::current().map_err(|_| Errno::EINVAL)?;
            if here.id() != socket_netns {
                return Err(Errno::EINVAL);
            }
            let ifindex =
                nix::net::if_::if_nametoindex(netdev.as_str()).map_err(|_| Errno::ENODEV)?;
            if self
                .soft
                .values()
                .any(|(_, i, ns)| *i == ifindex && ns.id() == socket_netns)
            {
                return Err(Errno::EEXIST);
            }
            if self.devices.contains_key(&name) {
                return Err(Errno::ENFILE);
            }
            let index = self.devices.values().map(|d| d.0).max().unwrap_or(0) + 1;
            let at = self.created_in.unwrap_or(socket_netns);
            let own = Netns::open(std::path::Path::new("/proc/thread-self/ns/net"))
                .map_err(|_| Errno::EINVAL)?;
            self.devices.insert(name.clone(), (index, at));
            self.soft.insert(name, (netdev, ifindex, own));
            return Ok(Vec::new());
        }
        if ty != rmsgs::nldev_type(rmsgs::RDMA_NLDEV_CMD_SET) {
            return Err(Errno::EOPNOTSUPP);
        }
        let (mut index, mut fd) = (None, None);
        for (t, p) in kroce_netlink::attrs(msg.payload()).flatten() {
            match t {
                rmsgs::RDMA_NLDEV_ATTR_DEV_INDEX => index = kroce_netlink::read_u32(p),
                rmsgs::RDMA_NLDEV_NET_NS_FD => fd = kroce_netlink::read_u32(p),
                _ => {}
            }
        }
        let index = index.ok_or(Errno::EINVAL)?;
        // ib_device_get_by_index(sock_net(skb->sk), index)
        let name = self
            .devices
            .iter()
            .find(|(_, d)| d.0 == index && self.visible(socket_netns, d.1))
            .map(|(n, _)| n.clone())
            .ok_or(Errno::ENODEV)?;
        let fd = fd.ok_or(Errno::EINVAL)?;
        // get_net_ns_by_fd: the fd table is the process's.
        let target = Netns::open(std::path::Path::new(&format!("/proc/self/fd/{fd}")))
            .map_err(|_| Errno::EBADF)?
            .id();
        if matches!(self.mode, Ok(RdmaNetnsMode::Shared)) {
            return Err(Errno::EOPNOTSUPP);
        }
        let dev = self.devices.get_mut(&name).ok_or(Errno::ENODEV)?;
        *device_netns = Some(dev.1);
        if dev.1 != thread_netns {
            return Err(Errno::ENODEV);
        }
        dev.1 = target;
        Ok(Vec::new())
    }
}

/// A socket of the recording kernel, opened in `netns`.
struct RecordingRdmaSocket<'a> {
    kernel: &'a mut RecordingRdma,
    netns: (u64, u64),
}

impl RdmaSocket for RecordingRdmaSocket<'_> {
    fn request(&mut self, msg: &kroce_netlink::MsgBuilder) -> Result<Vec<Vec<u8>>, NlError> {
        let thread_netns = Netns::current().map_err(NlError::Socket)?.id();
        self.kernel.reap();
        let mut device_netns = None;
        let r = self
            .kernel
            .answer(msg, self.netns, thread_netns, &mut device_netns);
        self.kernel.sent.push(Sent::of(msg));
        self.kernel.calls.push(RdmaCall {
            sent: Sent::of(msg),
            socket_netns: self.netns,
            thread_netns,
            device_netns,
            errno: r.as_ref().err().copied(),
        });
        r.map_err(NlError::Kernel)
    }
}

impl RdmaSockets for RecordingRdma {
    fn open(&mut self) -> Result<Box<dyn RdmaSocket + '_>, NlError> {
        if let Err(e) = &self.mode {
            return Err(NlError::Socket(std::io::Error::other(e.clone())));
        }
        let netns = Netns::current().map_err(NlError::Socket)?.id();
        Ok(Box::new(RecordingRdmaSocket {
            kernel: self,
            netns,
        }))
    }
}

/// The real request logic over the recording kernel.
impl RdmaControl for RecordingRdma {
    fn netns_mode(&mut self) -> Result<RdmaNetnsMode, RdmaError> {
        NetlinkRdma::with_sockets(None, self).netns_mode()
    }

    fn present(&mut self, ns: &Netns, device: &str) -> Result<bool, RdmaError> {
        NetlinkRdma::with_sockets(None, self).present(ns, device)
    }

    fn move_device(&mut self, device: &str, from: &Netns, to: &Netns) -> Result<Moved, RdmaError> {
        NetlinkRdma::with_sockets(None, self).move_device(device, from, to)
    }

    fn add_link(
        &mut self,
        ns: &Netns,
        device: &str,
        link_type: &str,
        netdev: &str,
    ) -> Result<(), RdmaError> {
        NetlinkRdma::with_sockets(None, self).add_link(ns, device, link_type, netdev)
    }
}
