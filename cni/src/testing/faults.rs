//! Failure injection: decorators over the backends that fail the n-th call
//! of one operation, once. After the injected failure every call goes
//! through, so the rollback runs against the real backends.

use crate::addr::{IpNet, Mac};
use crate::ipam::{IpamDelegate, IpamError, IpamRequest, Pending};
use crate::links::{LinkError, Links, LinksOpener};
use crate::protocol::{CniError, Command, Route};
use crate::rdma::{Moved, RdmaControl, RdmaError};
use crate::vf_config::{VfConfig, VfConfigError};
use kroce_netlink::NlError;
use kroce_netlink::netns::Netns;
use kroce_netlink::rdma::RdmaNetnsMode;
use kroce_netlink::route::LinkInfo;
use kroce_netlink::vf_attrs::{VfSetting, VfState};
use nix::errno::Errno;
use std::cell::RefCell;
use std::collections::HashMap;
use std::os::fd::BorrowedFd;
use std::rc::Rc;

#[derive(Debug, Default)]
struct FaultState {
    target: Option<(String, usize)>,
    counts: HashMap<String, usize>,
    fired: bool,
    /// Every operation, in the order the backends saw them.
    journal: Vec<String>,
    /// The igb model (`RecordingVfConfig::igb`): the VF netdev's own MAC
    /// change is refused (an admin MAC is set and trust is off).
    vf_mac_locked: bool,
    /// The last MAC the VF netdev set on itself (igb reports it PF-side
    /// when no admin MAC is set).
    netdev_mac: Option<Mac>,
    /// igb: the VF-PF mailbox message that would tell the PF this MAC is
    /// lost this many more times (igbvf ignores the timeout).
    lost_learns: Option<(Mac, usize)>,
}

/// Shared by all decorators of one call.
#[derive(Debug, Clone, Default)]
pub struct Faults(Rc<RefCell<FaultState>>);

impl Faults {
    /// No failure.
    pub fn none() -> Faults {
        Faults::default()
    }

    /// Fail the `nth` (0-based) call of `op` (`links.move_to`, `vf.set`,
    /// `rdma.move_device`, `ipam.add`, ...).
    pub fn fail_at(op: &str, nth: usize) -> Faults {
        let f = Faults::default();
        f.0.borrow_mut().target = Some((op.to_string(), nth));
        f
    }

    /// Whether the injected failure happened.
    pub fn fired(&self) -> bool {
        self.0.borrow().fired
    }

    /// Every operation the wrapped backends saw, in order (`links.move_to`,
    /// `ipam.start.ADD`, `ipam.done.ADD`, ...).
    pub fn journal(&self) -> Vec<String> {
        self.0.borrow().journal.clone()
    }

    pub fn set_vf_mac_locked(&self, locked: bool) {
        self.0.borrow_mut().vf_mac_locked = locked;
    }

    pub fn vf_mac_locked(&self) -> bool {
        self.0.borrow().vf_mac_locked
    }

    /// The PF misses the VF netdev's change to `mac` the next `times` times.
    pub fn lose_vf_mac_learns(&self, mac: Mac, times: usize) {
        self.0.borrow_mut().lost_learns = Some((mac, times));
    }

    pub fn netdev_mac(&self) -> Option<Mac> {
        self.0.borrow().netdev_mac
    }

    fn hit(&self, op: &str) -> bool {
        let mut s = self.0.borrow_mut();
        s.journal.push(op.to_string());
        let n = {
            let c = s.counts.entry(op.to_string()).or_default();
            *c += 1;
            *c - 1
        };
        let fire = !s.fired && s.target.as_ref().is_some_and(|(o, k)| o == op && *k == n);
        if fire {
            s.fired = true;
        }
        fire
    }

    fn link_err(&self, op: &str) -> LinkError {
        LinkError {
            op: format!("{op} (injected)"),
            target: String::new(),
            netns: String::new(),
            source: NlError::Kernel(Errno::EIO),
        }
    }
}

pub struct FaultyOpener<'a> {
    pub inner: &'a mut dyn LinksOpener,
    pub faults: Faults,
}

impl std::fmt::Debug for FaultyOpener<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FaultyOpener")
    }
}

impl LinksOpener for FaultyOpener<'_> {
    fn open(&mut self, ns: &Netns) -> Result<Box<dyn Links>, LinkError> {
        Ok(Box::new(FaultyLinks {
            inner: self.inner.open(ns)?,
            faults: self.faults.clone(),
        }))
    }
}

struct FaultyLinks {
    inner: Box<dyn Links>,
    faults: Faults,
}

macro_rules! guarded {
    ($self:ident, $op:literal, $call:expr) => {{
        if $self.faults.hit(concat!("links.", $op)) {
            return Err($self.faults.link_err($op));
        }
        $call
    }};
}

impl Links for FaultyLinks {
    fn netns(&self) -> &str {
        self.inner.netns()
    }
    fn by_name(&mut self, name: &str) -> Result<Option<LinkInfo>, LinkError> {
        self.inner.by_name(name)
    }
    fn by_index(&mut self, index: u32) -> Result<Option<LinkInfo>, LinkError> {
        self.inner.by_index(index)
    }
    fn set_up(&mut self, index: u32, up: bool) -> Result<(), LinkError> {
        guarded!(self, "set_up", self.inner.set_up(index, up))
    }
    fn set_mac(&mut self, index: u32, mac: &Mac) -> Result<(), LinkError> {
        // igb: "VF N attempted to override administratively set MAC address".
        if self.faults.vf_mac_locked() {
            return Err(LinkError {
                op: format!("set MAC {mac} on index {index}"),
                target: String::new(),
                netns: String::new(),
                source: NlError::Kernel(Errno::EADDRNOTAVAIL),
            });
        }
        // The kernel calls no driver for an unchanged address: igb hears of
        // (and records) a VF's MAC only when it changes.
        let before = self
            .inner
            .by_index(index)
            .ok()
            .flatten()
            .and_then(|l| l.mac);
        guarded!(self, "set_mac", self.inner.set_mac(index, mac))?;
        if before != Some(*mac) {
            let mut st = self.faults.0.borrow_mut();
            match &mut st.lost_learns {
                Some((m, n)) if m == mac && *n > 0 => *n -= 1,
                _ => st.netdev_mac = Some(*mac),
            }
        }
        Ok(())
    }
    fn set_mtu(&mut self, index: u32, mtu: u32) -> Result<(), LinkError> {
        guarded!(self, "set_mtu", self.inner.set_mtu(index, mtu))
    }
    fn rename(&mut self, index: u32, name: &str) -> Result<(), LinkError> {
        guarded!(self, "rename", self.inner.rename(index, name))
    }
    fn move_to(
        &mut self,
        index: u32,
        target: BorrowedFd<'_>,
        new_name: &str,
        new_ifindex: Option<u32>,
    ) -> Result<(), LinkError> {
        guarded!(
            self,
            "move_to",
            self.inner.move_to(index, target, new_name, new_ifindex)
        )
    }
    fn add_altname(&mut self, index: u32, name: &str) -> Result<(), LinkError> {
        guarded!(self, "add_altname", self.inner.add_altname(index, name))
    }
    fn del_altname(&mut self, index: u32, name: &str) -> Result<(), LinkError> {
        guarded!(self, "del_altname", self.inner.del_altname(index, name))
    }
    fn addresses(&mut self, index: u32) -> Result<Vec<IpNet>, LinkError> {
        self.inner.addresses(index)
    }
    fn add_address(&mut self, index: u32, addr: &IpNet) -> Result<(), LinkError> {
        guarded!(self, "add_address", self.inner.add_address(index, addr))
    }
    fn add_route(&mut self, index: u32, route: &Route) -> Result<(), LinkError> {
        guarded!(self, "add_route", self.inner.add_route(index, route))
    }
}

pub struct FaultyVf<'a> {
    pub inner: &'a mut dyn VfConfig,
    pub faults: Faults,
}

impl std::fmt::Debug for FaultyVf<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FaultyVf")
    }
}

impl VfConfig for FaultyVf<'_> {
    fn get(&mut self, pf: &str, vf: u32) -> Result<VfState, VfConfigError> {
        self.inner.get(pf, vf)
    }
    fn set(&mut self, pf: &str, vf: u32, setting: &VfSetting) -> Result<(), VfConfigError> {
        if self.faults.hit("vf.set") {
            return Err(VfConfigError::Netlink {
                op: format!("set {setting} on (injected)"),
                pf: pf.into(),
                vf,
                source: NlError::Kernel(Errno::EIO),
            });
        }
        self.inner.set(pf, vf, setting)
    }
}

pub struct FaultyRdma<'a> {
    pub inner: &'a mut dyn RdmaControl,
    pub faults: Faults,
}

impl std::fmt::Debug for FaultyRdma<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FaultyRdma")
    }
}

impl RdmaControl for FaultyRdma<'_> {
    fn netns_mode(&mut self) -> Result<RdmaNetnsMode, RdmaError> {
        self.inner.netns_mode()
    }
    fn present(&mut self, ns: &Netns, device: &str) -> Result<bool, RdmaError> {
        self.inner.present(ns, device)
    }
    fn move_device(&mut self, device: &str, from: &Netns, to: &Netns) -> Result<Moved, RdmaError> {
        if self.faults.hit("rdma.move_device") {
            return Err(RdmaError::Netlink {
                op: "move (injected)".into(),
                device: device.into(),
                source: NlError::Kernel(Errno::EIO),
            });
        }
        self.inner.move_device(device, from, to)
    }
    fn add_link(
        &mut self,
        ns: &Netns,
        device: &str,
        link_type: &str,
        netdev: &str,
    ) -> Result<(), RdmaError> {
        if self.faults.hit("rdma.add_link") {
            return Err(RdmaError::Netlink {
                op: "create (injected)".into(),
                device: device.into(),
                source: NlError::Kernel(Errno::EIO),
            });
        }
        self.inner.add_link(ns, device, link_type, netdev)
    }
}

/// Fails `ipam.add` after the real delegate allocated: the worst case for
/// lease leaks.
pub struct FaultyIpam<'a> {
    pub inner: &'a mut dyn IpamDelegate,
    pub faults: Faults,
}

impl std::fmt::Debug for FaultyIpam<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FaultyIpam")
    }
}

impl IpamDelegate for FaultyIpam<'_> {
    fn exec(&mut self, req: &IpamRequest<'_>) -> Result<Vec<u8>, IpamError> {
        let out = self.inner.exec(req)?;
        if req.command == Command::Add && self.faults.hit("ipam.add") {
            return Err(IpamError::Plugin {
                plugin: req.plugin.into(),
                command: "ADD",
                error: CniError::new(999, "injected failure after allocation"),
            });
        }
        Ok(out)
    }

    /// The inner delegate runs concurrently as it would unwrapped; the
    /// journal gets `ipam.start.<CMD>` now and `ipam.done.<CMD>` when the
    /// result is collected, where an `ipam.add` fault strikes.
    fn start(&mut self, req: &IpamRequest<'_>) -> Pending {
        let command = req.command.as_str();
        self.faults.hit(&format!("ipam.start.{command}"));
        let pending = self.inner.start(req);
        let (faults, plugin, add) = (
            self.faults.clone(),
            req.plugin.to_string(),
            req.command == Command::Add,
        );
        Pending::later(move || {
            let out = pending.wait();
            faults.hit(&format!("ipam.done.{command}"));
            let out = out?;
            if add && faults.hit("ipam.add") {
                return Err(IpamError::Plugin {
                    plugin,
                    command: "ADD",
                    error: CniError::new(999, "injected failure after allocation"),
                });
            }
            Ok(out)
        })
    }

    fn known_versions(&mut self, req: &IpamRequest<'_>) -> Option<Vec<String>> {
        self.inner.known_versions(req)
    }

    fn remember_versions(&mut self, req: &IpamRequest<'_>, versions: &[String]) {
        self.inner.remember_versions(req, versions)
    }
}
