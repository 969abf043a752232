//! Giving a VF back: one converging procedure for rollback, DEL, GC and the
//! takeover of a dead sandbox's VF. It works from the claim's original
//! state, not from a log of what was done, so it is correct after a crash
//! at any point and idempotent. State already gone is a note, not an error.

use super::{Backends, Node};
use crate::addr::Mac;
use crate::ipam::{self, IpamError, IpamRequest};
use crate::links::{LinkError, Links};
use crate::log::Logger;
use crate::memlock::MemlockDir;
use crate::protocol::{CniArgs, Command};
use crate::rdma::{Moved, RdmaError};
use crate::state::{Claim, StateError};
use crate::vf::{Target, VfError};
use crate::vf_config::VfConfigError;
use kroce_netlink::netns::Netns;
use kroce_netlink::route::LinkInfo;
use kroce_netlink::vf_attrs::{VfSetting, VfState};
use sriov_helpers::HostRoot;
use std::path::{Path, PathBuf};

/// One thing a release could not undo. State already gone is a note in
/// the log, never one of these.
#[derive(Debug, thiserror::Error)]
pub enum ReleaseError {
    #[error(transparent)]
    Link(#[from] LinkError),
    #[error(transparent)]
    Rdma(#[from] RdmaError),
    #[error(transparent)]
    VfConfig(#[from] VfConfigError),
    /// The claimed VF cannot be read from sysfs now.
    #[error("PF-side settings not restored: {0}")]
    PfSide(#[source] VfError),
    /// A soft RDMA device over the VF's netdev, not made again on the host.
    #[error(
        "{target}: {ty} device {dev} not made again over {netdev} (`rdma link add {dev} type {ty} netdev {netdev}` does it by hand): {source}"
    )]
    SoftNotRemade {
        target: Box<Target>,
        ty: String,
        dev: String,
        netdev: String,
        source: RdmaError,
    },
    #[error(transparent)]
    Ipam(#[from] IpamError),
    /// The memlock request file (its path is in the error).
    #[error(transparent)]
    Memlock(#[from] std::io::Error),
    #[error(transparent)]
    State(#[from] StateError),
}

/// What a release (or a DEL, GC) left undone, in the order met; empty when
/// it converged. Shown as the CNI error's `details`, `; `-separated.
#[derive(Debug, Default)]
pub struct Leftovers(Vec<ReleaseError>);

impl Leftovers {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn push(&mut self, e: impl Into<ReleaseError>) {
        self.0.push(e.into());
    }

    pub fn append(&mut self, mut other: Leftovers) {
        self.0.append(&mut other.0);
    }
}

impl std::fmt::Display for Leftovers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

/// The IPAM plugin a release may run: the current config's `ipam.type` (a
/// bare file name, checked at parse) found on the runtime's `CNI_PATH`.
/// Nothing a claim file records (plugin, `CNI_PATH`) is ever executed.
#[derive(Debug, Clone, Copy)]
pub struct ReleaseIpam<'a> {
    pub plugin: Option<&'a str>,
    pub path: &'a [PathBuf],
}

/// Where a link was looked up.
#[derive(Debug, Clone, Copy)]
pub enum Seen<'a> {
    /// In the claim's pod netns, under the claim's ifname.
    Pod,
    /// In the host netns, whose sysfs is under this root.
    Host(&'a HostRoot),
}

/// Whether `l` is the claim's netdev. A VF: the PCI parent when the kernel
/// reports one (real VFs); else the recorded ifindex, and in the host netns
/// also sysfs' `device` link (virtual stand-ins, older kernels). A soft
/// device (whose netdev may sit on any NIC): the recorded ifindex, and in
/// the host netns also sysfs naming `l` as its parent now. An ifindex alone
/// never decides in the host netns: a claim could name any host link's.
///
/// A soft device that dies with its netdev's move (and is made again) is
/// not in the host's sysfs between the move back and its remaking: then the
/// ifindex and the MAC (the original or the planned one) together decide.
pub fn is_our_link(l: &LinkInfo, claim: &Claim, seen: Seen<'_>) -> bool {
    let index = l.index == claim.original.link.index || Some(l.index) == claim.pod_ifindex;
    match (&claim.vf, &l.parent_dev, seen) {
        (Target::Vf(v), Some(p), _) => *p == v.pci.to_string(),
        (_, _, Seen::Pod) => index,
        (target, _, Seen::Host(root)) => {
            index
                && match crate::vf::host_link_is(root, l, target) {
                    Ok(()) => true,
                    Err(crate::vf::NotTheDevice::Soft {
                        source: crate::vf::VfError::SoftNotFound { .. },
                        ..
                    }) if target.soft_link().is_some() => {
                        l.mac.is_some()
                            && (l.mac == claim.original.link.mac || l.mac == claim.planned.mac)
                    }
                    Err(_) => false,
                }
        }
    }
}

fn note_or_error(errors: &mut Leftovers, log: &Logger, e: LinkError) {
    if e.is_gone() {
        log.info(&format!("already gone: {e}"));
    } else {
        errors.push(e);
    }
}

/// The claim's VF netdev in the host netns, wherever it ended up: its
/// original ifindex, its original name, or the name sysfs shows now (a VF
/// the kernel returned from a dead netns may be called `devN`).
pub fn find_host_link(
    host: &mut dyn Links,
    claim: &Claim,
    node: &Node,
) -> Result<Option<LinkInfo>, LinkError> {
    let seen = Seen::Host(&node.host_root);
    if let Some(l) = host.by_index(claim.original.link.index)?
        && is_our_link(&l, claim, seen)
    {
        return Ok(Some(l));
    }
    let mut names = vec![claim.original.link.name.clone()];
    if let Ok(vf) = crate::vf::resolve_key(&node.host_root, &claim.vf.key())
        && let Some(n) = vf.netdev()
    {
        names.push(n.clone());
    }
    for n in names {
        if let Some(l) = host.by_name(&n)?
            && is_our_link(&l, claim, seen)
        {
            return Ok(Some(l));
        }
    }
    Ok(None)
}

/// Puts the VF back: RDMA device and netdev into the host netns under the
/// original name, PF-side attributes, MAC, MTU, altnames and up/down as
/// they were. Returns the errors that are not "already gone".
pub fn restore_vf(claim: &Claim, node: &Node, b: &mut Backends<'_>, log: &Logger) -> Leftovers {
    let mut errors = Leftovers::default();
    let orig = &claim.original.link;
    let pod_ns = Netns::open(Path::new(&claim.netns))
        .ok()
        .filter(|ns| !ns.same_as(&node.host_netns));
    if pod_ns.is_none() {
        log.info(&format!("netns {} is gone", claim.netns));
    }

    // 1. The RDMA device, while its netns still exists. Not a soft device
    //    over the VF's netdev: it dies with the netdev's move (made again
    //    on the host in step 4b).
    let soft = claim.vf.soft_link();
    if let (Some(dev), Some(ns), None) = (&claim.planned.rdma_device, &pod_ns, soft) {
        match b.rdma.move_device(dev, ns, &node.host_netns) {
            Ok(Moved::Yes) => log.info(&format!("RDMA device {dev} back in the host netns")),
            Ok(Moved::NotFound) => log.info(&format!("RDMA device {dev} not in {}", claim.netns)),
            Err(e) => errors.push(e),
        }
    }

    let mut host = match b.links.open(&node.host_netns) {
        Ok(h) => h,
        Err(e) => {
            errors.push(e);
            return errors;
        }
    };

    // 2. The netdev, out of the pod netns under its original name.
    let mut moved_back = false;
    if let Some(ns) = &pod_ns {
        match b.links.open(ns) {
            Ok(mut pod) => match pod.by_name(&claim.ifname) {
                Ok(Some(l)) if is_our_link(&l, claim, Seen::Pod) => {
                    // Its own ifindex back when free; any ifindex otherwise.
                    let r = match pod.move_to(
                        l.index,
                        node.host_netns.fd(),
                        &orig.name,
                        Some(orig.index),
                    ) {
                        Err(e) if e.errno() == Some(nix::errno::Errno::EEXIST) => {
                            pod.move_to(l.index, node.host_netns.fd(), &orig.name, None)
                        }
                        other => other,
                    };
                    match r {
                        Ok(()) => moved_back = true,
                        Err(e) => note_or_error(&mut errors, log, e),
                    }
                }
                Ok(Some(l)) => log.warn(&format!(
                    "{} in {} (ifindex {}) is not {}: left alone",
                    claim.ifname, claim.netns, l.index, claim.vf
                )),
                Ok(None) => {}
                Err(e) => note_or_error(&mut errors, log, e),
            },
            Err(e) => note_or_error(&mut errors, log, e),
        }
    }

    // 3. PF-side, only what differs from the original now (a setting the
    //    driver refused was never changed: igb answers EOPNOTSUPP to a link
    //    state, and restoring it would fail the same way). The PF-side MAC
    //    goes first and is *cleared* (00:00:00:00:00:00): an admin MAC left
    //    on igb with trust off makes it refuse the VF netdev's own MAC
    //    change below (EADDRNOTAVAIL, the claim then stayed for good).
    let pf_side = pf_side_to_restore(claim, node, b, log, &mut errors);
    let mac_cleared = match &pf_side {
        Some((v, orig_vf, settings))
            if settings.iter().any(|s| matches!(s, VfSetting::Mac { .. })) =>
        {
            match b
                .vf
                .set(&v.pf_ifname, v.vf_index, &VfSetting::Mac { mac: Mac::ZERO })
            {
                Ok(()) => true,
                Err(e) if e.is_gone() => {
                    log.info(&format!("already gone: {e}"));
                    false
                }
                // A driver that takes no zero MAC: the original, as before.
                Err(_) => {
                    if let Err(e) = b.vf.set(
                        &v.pf_ifname,
                        v.vf_index,
                        &VfSetting::Mac { mac: orig_vf.mac },
                    ) {
                        errors.push(e);
                    }
                    false
                }
            }
        }
        _ => false,
    };

    // 4. The netdev's own attributes. After a clear the VF's own MAC is
    //    set even when the netdev still has it: that is how igb learns it
    //    again (the PF then reports it, as before the ADD).
    let was_admin = pf_side
        .as_ref()
        .is_some_and(|(_, o, _)| !o.mac.is_zero() && orig.mac != Some(o.mac));
    let force_mac = mac_cleared && !was_admin;
    restore_netdev(
        claim,
        node,
        host.as_mut(),
        moved_back,
        force_mac,
        log,
        &mut errors,
    );

    // 4a. igb learns the VF's own MAC over the VF-PF mailbox, and igbvf
    //     ignores a mailbox that timed out (e1000_rar_set_vf): the netdev
    //     has the MAC, the PF does not, and the VF gets no unicast. Seen
    //     under emulation on a loaded machine: check, and set it once more.
    if force_mac
        && let (Some((v, _, _)), Some(mac)) = (&pf_side, orig.mac)
        && b.vf
            .get(&v.pf_ifname, v.vf_index)
            .is_ok_and(|now| now.mac != mac)
    {
        log.warn(&format!(
            "{}: the PF did not record the VF's own MAC {mac}: setting it again",
            claim.vf
        ));
        restore_netdev(claim, node, host.as_mut(), true, true, log, &mut errors);
        if let Ok(now) = b.vf.get(&v.pf_ifname, v.vf_index)
            && now.mac != mac
        {
            log.warn(&format!(
                "{}: the PF still reports {} for VF {} of {} (the VF's own MAC is {mac})",
                claim.vf, now.mac, v.vf_index, v.pf_ifname
            ));
        }
    }

    // 4b. A soft RDMA device that was over the VF's netdev: the kernel
    //     deleted it when the netdev left (ADD) and again when it came
    //     back; made again on the host under its name, over the netdev's
    //     original name (unless it is there already: a repeated release).
    if let Some((dev, ty)) = soft {
        recreate_on_host(claim, node, b, host.as_mut(), dev, ty, log, &mut errors);
    }

    // 5. The other PF-side settings, and the MAC as it was set: an admin MAC
    //    again only if it was one (non-zero and not the VF's own address);
    //    else the VF's own MAC set in step 4 is what the PF reports.
    if let Some((v, orig_vf, settings)) = &pf_side {
        for s in settings {
            if matches!(s, VfSetting::Mac { .. }) {
                continue;
            }
            match b.vf.set(&v.pf_ifname, v.vf_index, s) {
                Ok(()) => {}
                Err(e) if e.is_gone() => log.info(&format!("already gone: {e}")),
                Err(e) => errors.push(e),
            }
        }
        if mac_cleared
            && was_admin
            && let Err(e) = b.vf.set(
                &v.pf_ifname,
                v.vf_index,
                &VfSetting::Mac { mac: orig_vf.mac },
            )
        {
            errors.push(e);
        }
    }
    errors
}

#[allow(clippy::too_many_arguments)]
fn recreate_on_host(
    claim: &Claim,
    node: &Node,
    b: &mut Backends<'_>,
    host: &mut dyn Links,
    dev: &str,
    ty: &str,
    log: &Logger,
    errors: &mut Leftovers,
) {
    let name = &claim.original.link.name;
    match host.by_name(name) {
        Ok(Some(l)) if is_our_link(&l, claim, Seen::Host(&node.host_root)) => {}
        Ok(_) => {
            log.info(&format!(
                "{ty} device {dev} not made again: {} netdev {name} is not in the host netns",
                claim.vf
            ));
            return;
        }
        Err(e) => {
            note_or_error(errors, log, e);
            return;
        }
    }
    match b.rdma.present(&node.host_netns, dev) {
        Ok(true) => {
            log.info(&format!("{ty} device {dev} is in the host netns"));
            return;
        }
        Ok(false) => {}
        Err(e) => {
            errors.push(e);
            return;
        }
    }
    match b.rdma.add_link(&node.host_netns, dev, ty, name) {
        Ok(()) => log.info(&format!("{ty} device {dev} made again over {name}")),
        Err(source) => errors.push(ReleaseError::SoftNotRemade {
            target: Box::new(claim.vf.clone()),
            ty: ty.to_string(),
            dev: dev.to_string(),
            netdev: name.clone(),
            source,
        }),
    }
}

/// The PF-side settings to put back: the original value of each planned
/// setting whose current value differs (all of them when the PF cannot be
/// read now). `None` without a PF or without recorded PF-side state.
///
/// Only on the PF and VF index the host says the claimed PCI address is
/// now: a claim's recorded PF and index never choose another VF.
fn pf_side_to_restore<'c>(
    claim: &'c Claim,
    node: &Node,
    b: &mut Backends<'_>,
    log: &Logger,
    errors: &mut Leftovers,
) -> Option<(crate::vf::VfTarget, &'c VfState, Vec<VfSetting>)> {
    let orig_vf = claim.original.vf.as_ref()?;
    let recorded = claim.vf.vf()?;
    let v = match crate::vf::resolve(&node.host_root, recorded.pci) {
        Ok(cur) => {
            if (cur.pf_ifname.as_str(), cur.vf_index)
                != (recorded.pf_ifname.as_str(), recorded.vf_index)
            {
                log.warn(&format!(
                    "{}: the claim says VF {} of {}, the host says VF {} of {}: restoring the host's",
                    claim.vf, recorded.vf_index, recorded.pf_ifname, cur.vf_index, cur.pf_ifname
                ));
            }
            cur
        }
        Err(e @ crate::vf::VfError::NotFound { .. }) => {
            log.info(&format!("already gone: {e}"));
            return None;
        }
        Err(e) => {
            errors.push(ReleaseError::PfSide(e));
            return None;
        }
    };
    let now = match b.vf.get(&v.pf_ifname, v.vf_index) {
        Ok(now) => Some(now),
        Err(e) if e.is_gone() => {
            log.info(&format!("already gone: {e}"));
            return None;
        }
        Err(e) => {
            errors.push(e);
            None
        }
    };
    let settings = claim
        .planned
        .vf_settings
        .iter()
        .filter_map(|s| {
            let o = s.original_in(orig_vf)?;
            match &now {
                Some(now) if s.original_in(now) == Some(o) => None,
                _ => Some(o),
            }
        })
        .collect();
    Some((v, orig_vf, settings))
}

/// Step 4 of [`restore_vf`]: the VF netdev in the host netns gets its
/// original name, MAC, MTU, altnames and up/down state back.
fn restore_netdev(
    claim: &Claim,
    node: &Node,
    host: &mut dyn Links,
    moved_back: bool,
    force_mac: bool,
    log: &Logger,
    errors: &mut Leftovers,
) {
    let orig = &claim.original.link;
    let link = if moved_back {
        host.by_name(&orig.name)
    } else {
        find_host_link(host, claim, node)
    };
    let link = match link {
        Ok(Some(l)) => l,
        Ok(None) => {
            log.info(&format!(
                "{} netdev {} is not in the host netns (vanished, or still in a netns we cannot reach)",
                claim.vf, orig.name
            ));
            return;
        }
        Err(e) => {
            note_or_error(errors, log, e);
            return;
        }
    };
    let mut fix = |r: Result<(), LinkError>| {
        if let Err(e) = r {
            note_or_error(errors, log, e);
        }
    };
    let mut up = link.up;
    if link.name != orig.name {
        if up {
            fix(host.set_up(link.index, false));
            up = false;
        }
        // The kernel refuses a rename to one of the link's own altnames.
        if link.altnames.contains(&orig.name) {
            fix(host.del_altname(link.index, &orig.name));
        }
        fix(host.rename(link.index, &orig.name));
    }
    if let Some(mac) = orig.mac
        && (link.mac != Some(mac) || force_mac)
    {
        // The kernel skips an unchanged address, and igb records a VF's MAC
        // only when the VF changes it: a moment on a neighbour address
        // (last bit flipped: still unicast, same administration bit) first.
        if link.mac == Some(mac) {
            let mut other = mac;
            other.0[5] ^= 1;
            fix(host.set_mac(link.index, &other));
        }
        fix(host.set_mac(link.index, &mac));
    }
    if link.mtu != orig.mtu {
        fix(host.set_mtu(link.index, orig.mtu));
    }
    for a in &orig.altnames {
        if !link.altnames.contains(a) && *a != orig.name {
            fix(host.add_altname(link.index, a));
        }
    }
    if up != orig.up {
        fix(host.set_up(link.index, orig.up));
    }
}

/// The IPAM DEL request of a claimed attachment: its recorded config and
/// `CNI_ARGS`, but the plugin and `CNI_PATH` of this call. `None` without
/// IPAM, or (with a warning) when the recorded plugin is not this config's:
/// its lease then stays in its store, nothing the claim names is run.
fn claim_ipam_del<'a>(
    claim: &'a Claim,
    args: &'a CniArgs,
    current: ReleaseIpam<'a>,
    netns: Option<&'a Path>,
    log: &Logger,
) -> Option<IpamRequest<'a>> {
    let recorded = claim
        .config
        .get("ipam")
        .and_then(|i| i.get("type"))
        .and_then(serde_json::Value::as_str)
        .filter(|t| !t.is_empty())?;
    match current.plugin {
        Some(p) if p == recorded => Some(IpamRequest {
            command: Command::Del,
            plugin: p,
            config: &claim.config,
            container_id: Some(&claim.container_id),
            netns,
            ifname: Some(&claim.ifname),
            args,
            path: current.path,
        }),
        other => {
            log.warn(&format!(
                "{}: the claim's IPAM plugin {recorded:?} is not this config's ({}): \
                 its IPAM DEL is not run (a lease it gave, if any, stays in its store)",
                claim.vf,
                other.map_or_else(|| "none".to_string(), |p| format!("{p:?}"))
            ));
            None
        }
    }
}

/// The IPAM DEL request of one attachment (with that attachment's config,
/// `CNI_ARGS` and `CNI_PATH`); `None` without IPAM.
fn ipam_del_request<'a>(
    config: &'a serde_json::Value,
    args: &'a CniArgs,
    path: &'a [std::path::PathBuf],
    container_id: &'a str,
    ifname: &'a str,
    netns: Option<&'a Path>,
) -> Option<IpamRequest<'a>> {
    let plugin = config
        .get("ipam")
        .and_then(|i| i.get("type"))
        .and_then(serde_json::Value::as_str)
        .filter(|t| !t.is_empty())?;
    Some(IpamRequest {
        command: Command::Del,
        plugin,
        config,
        container_id: Some(container_id),
        netns,
        ifname: Some(ifname),
        args,
        path,
    })
}

/// Releases what IPAM gave one attachment. Absent leases are fine
/// (host-local and friends make DEL idempotent).
pub fn ipam_release(
    b: &mut Backends<'_>,
    config: &serde_json::Value,
    args: &CniArgs,
    path: &[std::path::PathBuf],
    container_id: &str,
    ifname: &str,
    netns: Option<&Path>,
) -> Result<(), IpamError> {
    let Some(req) = ipam_del_request(config, args, path, container_id, ifname, netns) else {
        return Ok(());
    };
    ipam::exec_negotiated(b.ipam, &req).map(|_| ())
}

/// Everything of an attachment recorded in `claim`: the VF, its IPAM lease
/// and memlock entry, and the claim itself when nothing failed. The caller
/// holds the VF lock (whose file goes with it once the claim is gone: a
/// takeover keeps using it). `ipam_now`: see [`ReleaseIpam`]. Returns what
/// could not be undone.
pub fn release_claim(
    claim: &Claim,
    node: &Node,
    b: &mut Backends<'_>,
    log: &Logger,
    ipam_now: ReleaseIpam<'_>,
) -> Leftovers {
    let args = CniArgs::parse(&claim.cni_args).unwrap_or_default();
    let netns = Some(Path::new(&claim.netns)).filter(|p| kroce_netlink::netns::is_alive(p));
    let req = claim_ipam_del(claim, &args, ipam_now, netns, log);
    // A delegate that does not need the link releases while the VF goes
    // back (see ADD); any other after it, as always.
    let early = req
        .as_ref()
        .filter(|r| ipam::runs_without_the_link(r.plugin))
        .map(|r| ipam::start_negotiated(b.ipam, r));
    let mut errors = restore_vf(claim, node, b, log);
    if let Some(req) = &req {
        let started = early.unwrap_or_else(|| ipam::start_negotiated(b.ipam, req));
        match ipam::finish_negotiated(b.ipam, req, started) {
            Ok(_) => {}
            // Nothing can release through a plugin that is not there; an
            // error here would keep the VF claimed for ever (every later
            // ADD would retry this release and fail).
            Err(e @ ipam::IpamError::NotFound { .. }) => {
                log.warn(&format!("{e}: a lease it gave, if any, stays in its store"));
            }
            Err(e) => errors.push(e),
        }
    }
    if let Err(e) = MemlockDir::new(node.state.root()).forget(&claim.container_id, &claim.ifname) {
        errors.push(e);
    }
    if errors.is_empty()
        && let Err(e) = node.state.remove_claim(&claim.vf.key())
    {
        errors.push(e);
    }
    // One line per release (DEL, GC, rollback, takeover), so an admin can
    // tell from the log when a VF went back and whose it was.
    let what = format!(
        "{} (host netdev {}) of container {}, {} in netns {}",
        claim.vf, claim.original.link.name, claim.container_id, claim.ifname, claim.netns
    );
    if errors.is_empty() {
        log.info(&format!("released {what}"));
    } else {
        log.info(&format!(
            "release of {what} left {} problem(s)",
            errors.len()
        ));
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The CNI error's `details` read as the `; `-joined strings they were
    /// built from before the errors were typed.
    #[test]
    fn leftovers_read_as_before() {
        let target = Target::Soft(crate::vf::SoftTarget {
            link_type: Some("rxe".into()),
            soft_rdma: "rxe0".into(),
            netdev: Some("eth1".into()),
        });
        let rdma = || RdmaError::EnterNetns {
            netns: "/proc/1/ns/net".into(),
            source: std::io::Error::from_raw_os_error(1),
        };
        let not_a_vf = || VfError::NotAVf {
            pci: "0000:3b:00.2".parse().unwrap(),
            hint: String::new(),
        };
        let mut left = Leftovers::default();
        assert!(left.is_empty());
        left.push(ReleaseError::SoftNotRemade {
            target: Box::new(target.clone()),
            ty: "rxe".into(),
            dev: "rxe0".into(),
            netdev: "eth1".into(),
            source: rdma(),
        });
        let mut more = Leftovers::default();
        more.push(ReleaseError::PfSide(not_a_vf()));
        more.push(std::io::Error::other("/s/memlock/c1.json: no space"));
        left.append(more);
        assert_eq!(left.len(), 3);
        let (ty, dev, name, e) = ("rxe", "rxe0", "eth1", rdma());
        let old = [
            format!(
                "{}: {ty} device {dev} not made again over {name} (`rdma link add {dev} type {ty} netdev {name}` does it by hand): {e}",
                target
            ),
            format!("PF-side settings not restored: {}", not_a_vf()),
            "/s/memlock/c1.json: no space".to_string(),
        ];
        assert_eq!(left.to_string(), old.join("; "));
    }
}
