//! ADD, in four stages, each one function below:
//!
//! 1. [`validate`], without the VF lock, touching nothing: the device the
//!    config names, the IPAM plugin, the pod netns and ifname, the runtime's
//!    memlock limit. `config::parse` refused bad config values already.
//! 2. [`resolve`], under the VF lock: a stale claim on the device released,
//!    then the device, its host netdev, its PF-side state and the RDMA netns
//!    mode read, the plan made once from them, and the claim written.
//! 3. [`apply`]: the plan's steps, in order.
//! 4. [`record`]: the memlock request, then the claim marked attached.
//!
//! A failure in 3 or 4 releases everything through [`release_claim`]. The
//! claim is written at the end of 2, before the first side effect, and not
//! after apply: release works from the claim's record of the original
//! state, so after a crash at any later point DEL, GC or the next ADD's
//! takeover can still give the VF back. The lock file goes with the lock
//! unless a claim stays ([`VfLock`]).

use super::release::release_claim;
use super::{Backends, Node, Request, device_key, open_netns};
use crate::ipam::{self, IpamRequest};
use crate::links::Links;
use crate::log::Logger;
use crate::memlock::{self, MemlockDir};
use crate::plan::{AddPlan, Step, plan_add_on};
use crate::protocol::{CniError, CniResult, CniVersion, Command, Interface, Route, code};
use crate::state::{Claim, Original, Phase, Planned, VfLock};
use crate::vf::{DeviceKey, Target};
use kroce_netlink::netns::Netns;
use kroce_netlink::route::LinkInfo;
use kroce_netlink::vf_attrs::VfState;
use std::path::Path;

pub fn add(
    req: &Request,
    node: &Node,
    b: &mut Backends<'_>,
    log: &Logger,
) -> Result<CniResult, CniError> {
    let mut checked = validate(req, node, b, log)?;
    // Held to the end: whichever way this returns, the lock file stays
    // only with a claim (`VfLock`'s Drop), so no return below cleans up.
    let lock = node
        .state
        .lock_vf(&checked.key, node.lock_timeout)
        .map_err(|e| CniError::new(code::TRY_AGAIN, e.to_string()))?;
    let mut resolved = resolve(req, node, b, log, &checked, &lock)?;
    let applied = apply(
        req,
        node,
        b,
        log,
        &checked.pod_ns,
        &mut checked.pod,
        &mut resolved,
    );
    let Resolved {
        plan,
        mut claim,
        host,
    } = resolved;
    // The netlink sockets are done; release and rollback open their own.
    drop(host);
    drop(checked.pod);
    match applied.and_then(|result| record(node, &plan, &mut claim, result)) {
        Ok(result) => {
            log.info(&format!(
                "attached {} ({}) as {} in {}",
                claim.vf, claim.original.link.name, claim.ifname, claim.netns
            ));
            Ok(result)
        }
        Err(e) => Err(rollback(req, &claim, node, b, log, e)),
    }
}

/// What [`validate`] found: the device's key and the pod's netns.
struct Checked {
    key: DeviceKey,
    pod_ns: Netns,
    pod: Box<dyn Links>,
}

/// Stage 1: everything that can be refused without the VF lock, before
/// anything is touched.
fn validate(
    req: &Request,
    node: &Node,
    b: &mut Backends<'_>,
    log: &Logger,
) -> Result<Checked, CniError> {
    let conf = &req.conf;
    let ifname = req.env.ifname();
    let key = device_key(conf)?;
    // A missing IPAM plugin is a config error found before anything moves
    // (found after the move, its rollback could not release a lease).
    if let Some(i) = &conf.ipam {
        ipam::find_plugin(&i.plugin, &req.env.path)
            .map_err(|e| CniError::new(code::IPAM, e.to_string()))?;
    }
    let netns_path = netns_path(req);
    let pod_ns = open_netns(netns_path)?;
    if pod_ns.same_as(&node.host_netns) {
        return Err(CniError::new(
            code::INVALID_ENV,
            format!("CNI_NETNS {} is the host netns", netns_path.display()),
        ));
    }
    let mut pod = b
        .links
        .open(&pod_ns)
        .map_err(|e| CniError::new(code::NETLINK, e.to_string()))?;
    if let Some(l) = pod
        .by_name(ifname)
        .map_err(|e| CniError::new(code::NETLINK, e.to_string()))?
    {
        return Err(CniError::new(
            code::IFNAME_IN_USE,
            format!(
                "interface {ifname} already exists in netns {} (ifindex {})",
                netns_path.display(),
                l.index
            ),
        ));
    }
    check_memlock(conf, node, log);
    Ok(Checked { key, pod_ns, pod })
}

fn netns_path(req: &Request) -> &Path {
    req.env.netns.as_deref().unwrap_or(Path::new(""))
}

/// What [`resolve`] made: the plan, the claim as written, the host netns.
struct Resolved {
    plan: AddPlan,
    claim: Claim,
    host: Box<dyn Links>,
}

/// Stage 2, under the VF lock: the device as it is now, the plan made once
/// from it, and the claim written (before any change: see the module doc).
fn resolve(
    req: &Request,
    node: &Node,
    b: &mut Backends<'_>,
    log: &Logger,
    checked: &Checked,
    lock: &VfLock,
) -> Result<Resolved, CniError> {
    let conf = &req.conf;
    let key = &checked.key;
    take_over_stale_claim(req, node, b, log, &checked.pod_ns, lock, key)?;
    // Read after the takeover: a VF back from a dead netns may carry another
    // netdev name, and its RDMA device be back in the host netns.
    let vf = crate::vf::resolve_key(&node.host_root, key)
        .map_err(|e| CniError::new(code::VF_LOOKUP, e.to_string()))?;
    if let Target::Soft(soft) = &vf {
        refuse_a_claimed_vfs_netdev(node, soft)?;
    }
    let mut host = b
        .links
        .open(&node.host_netns)
        .map_err(|e| CniError::new(code::NETLINK, e.to_string()))?;
    let link = host_link(&mut *host, node, key, &vf)?;
    let original_vf = pf_side_state(b, conf, &vf)?;
    let rdma_mode = match (vf.rdma(), conf.rdma) {
        (Some(_), p) if p != crate::config::RdmaPolicy::Never => Some(b.rdma.netns_mode()),
        _ => None,
    };
    let (plan, warnings) =
        plan_add_on(conf, req.env.ifname(), &vf, rdma_mode, original_vf.as_ref())?;
    for w in &warnings {
        log.warn(w);
    }
    let claim = new_claim(
        req,
        &plan,
        Original {
            link,
            vf: original_vf,
        },
    );
    node.state
        .write_claim(&claim)
        .map_err(|e| CniError::new(code::IO, e.to_string()))?;
    Ok(Resolved { plan, claim, host })
}

/// The device's netdev in the host netns, checked to be the device's by
/// facts its name does not decide (sysfs `device`, the kernel's parent).
fn host_link(
    host: &mut dyn Links,
    node: &Node,
    key: &DeviceKey,
    vf: &Target,
) -> Result<LinkInfo, CniError> {
    let host_name = vf.netdev().cloned().ok_or_else(|| {
        CniError::new(
            code::VF_LOOKUP,
            match vf {
                Target::Vf(v) => format!(
                    "VF {} has no netdev in the host netns (driver {}; held by another netns, or bound to a non-netdev driver such as vfio-pci)",
                    v.pci,
                    v.driver.as_deref().unwrap_or("none")
                ),
                Target::Soft(_) => format!("{vf} has no parent netdev (no `parent` in sysfs)"),
            },
        )
    })?;
    let link = host
        .by_name(&host_name)
        .map_err(|e| CniError::new(code::NETLINK, e.to_string()))?
        .ok_or_else(|| {
            CniError::new(
                code::VF_LOOKUP,
                format!(
                    "{} netdev {host_name} is not in the host netns {}",
                    key.label(),
                    node.host_netns.path().display()
                ),
            )
        })?;
    crate::vf::host_link_is(&node.host_root, &link, vf).map_err(|e| {
        CniError::new(
            code::VF_LOOKUP,
            format!("{}: refusing to move {host_name}: {e}", key.label()),
        )
    })?;
    Ok(link)
}

/// The VF's PF-side attributes before any change, read only when the
/// config sets some: what release restores, and what completes the rate
/// pair. A device without a PF has none to read (and `config::parse`
/// refused PF-side attributes for it).
fn pf_side_state(
    b: &mut Backends<'_>,
    conf: &crate::config::NetConf,
    vf: &Target,
) -> Result<Option<VfState>, CniError> {
    match vf.vf() {
        Some(v) if !crate::plan::vf_settings(conf).is_empty() => {
            b.vf.get(&v.pf_ifname, v.vf_index)
                .map(Some)
                .map_err(|e| CniError::new(code::VF_CONFIG, e.to_string()))
        }
        _ => Ok(None),
    }
}

/// The claim ADD writes before its first change (phase `adding`).
fn new_claim(req: &Request, plan: &AddPlan, original: Original) -> Claim {
    Claim {
        version: 1,
        vf: plan.vf.clone(),
        container_id: req.env.container_id().to_string(),
        ifname: plan.pod_ifname.clone(),
        netns: netns_path(req).display().to_string(),
        network: req.conf.name.clone(),
        phase: Phase::Adding,
        original,
        planned: Planned {
            vf_settings: plan.vf_settings.clone(),
            mac: plan.mac,
            mtu: plan.mtu,
            rdma_device: plan.rdma_device.clone(),
        },
        pod_ifindex: None,
        result: None,
        config: req.conf.raw.clone(),
        cni_args: req.env.args.to_env_string(),
        cni_path: req.env.path.clone(),
    }
}

/// Stage 3: the plan's steps. An IPAM delegate that does not need the link
/// runs while the VF moves: each takes ~15 ms (a process start; the
/// kernel's netns move).
fn apply(
    req: &Request,
    node: &Node,
    b: &mut Backends<'_>,
    log: &Logger,
    pod_ns: &Netns,
    pod: &mut Box<dyn Links>,
    resolved: &mut Resolved,
) -> Result<CniResult, CniError> {
    let Resolved { plan, claim, host } = resolved;
    let ipam_plugin = req.conf.ipam.as_ref().map(|i| i.plugin.as_str());
    let ipam_started = match ipam_plugin {
        Some(p) if plan.ipam && ipam::runs_without_the_link(p) => Some(ipam::start_negotiated(
            b.ipam,
            &req.ipam_request(Command::Add, p),
        )),
        _ => None,
    };
    let mut run = AddRun {
        req,
        node,
        plan,
        pod_ns,
        link: claim.original.link.clone(),
        pod_index: None,
        ipam_started,
        ipam_result: None,
    };
    let outcome = run_steps(&mut run, claim, &mut **host, &mut **pod, b, log);
    // A step failed before the lease was collected: the delegate must be
    // done before the rollback's IPAM DEL, or that DEL could come first and
    // leave the lease allocated.
    if let (Some(started), Some(p)) = (run.ipam_started.take(), ipam_plugin) {
        let _ = ipam::finish_add(b.ipam, &req.ipam_request(Command::Add, p), started);
    }
    outcome
}

/// Stage 4, once every change is made: the memlock request (read by
/// kroce-nri), then the claim marked attached with the result.
fn record(
    node: &Node,
    plan: &AddPlan,
    claim: &mut Claim,
    result: CniResult,
) -> Result<CniResult, CniError> {
    if let Some(m) = plan.memlock {
        MemlockDir::new(node.state.root())
            .record(
                &claim.container_id,
                &claim.netns,
                &claim.ifname,
                &claim.network,
                m,
            )
            .map_err(|e| CniError::new(code::IO, format!("memlock request: {e}")))?;
    }
    claim.phase = Phase::Attached;
    claim.result = Some(result.render(CniVersion::LATEST));
    node.state
        .write_claim(claim)
        .map_err(|e| CniError::new(code::IO, e.to_string()))?;
    Ok(result)
}

struct AddRun<'a> {
    req: &'a Request,
    node: &'a Node,
    plan: &'a AddPlan,
    pod_ns: &'a Netns,
    /// The VF netdev in the host netns as found.
    link: LinkInfo,
    pod_index: Option<u32>,
    /// IPAM ADD under way (started before the first step).
    ipam_started: Option<ipam::Started>,
    ipam_result: Option<CniResult>,
}

fn nl(e: impl std::fmt::Display, what: &str) -> CniError {
    CniError::new(code::NETLINK, format!("{what}: {e}"))
}

/// Runs the plan's steps in order; the first failure stops it (the caller
/// rolls back). Returns the result to print.
fn run_steps(
    run: &mut AddRun<'_>,
    claim: &mut Claim,
    host: &mut dyn Links,
    pod: &mut dyn Links,
    b: &mut Backends<'_>,
    log: &Logger,
) -> Result<CniResult, CniError> {
    let ifname = run.plan.pod_ifname.as_str();
    let vf = &run.plan.vf;
    for step in run.plan.steps() {
        log.debug(&format!("step {step:?}"));
        match step {
            Step::VfSetting(i) => {
                // `steps` lists PF-side settings only for a device with a PF.
                if let Some(v) = vf.vf() {
                    b.vf.set(&v.pf_ifname, v.vf_index, &run.plan.vf_settings[i])
                        .map_err(|e| CniError::new(code::VF_CONFIG, e.to_string()))?;
                }
            }
            Step::DropAltnames => {
                for a in &run.link.altnames {
                    host.del_altname(run.link.index, a)
                        .map_err(|e| nl(e, &format!("VF netdev {}", run.link.name)))?;
                }
            }
            Step::MoveToPod => move_to_pod(run, claim, host, pod)?,
            Step::SetMac => {
                if let (Some(mac), Some(i)) = (run.plan.mac, run.pod_index) {
                    pod.set_mac(i, &mac).map_err(|e| nl(e, ifname))?;
                }
            }
            Step::SetMtu => {
                if let (Some(mtu), Some(i)) = (run.plan.mtu, run.pod_index) {
                    pod.set_mtu(i, mtu).map_err(|e| nl(e, ifname))?;
                }
            }
            Step::LinkUp => {
                if let Some(i) = run.pod_index {
                    pod.set_up(i, true).map_err(|e| nl(e, ifname))?;
                }
            }
            Step::MoveRdma => move_rdma(run, b)?,
            Step::RecreateRdma => {
                if let (Some(dev), Some(ty)) = (&run.plan.rdma_device, &run.plan.rdma_recreate) {
                    recreate_in_pod(b, run.node, run.pod_ns, vf, dev, ty, ifname)?;
                }
            }
            Step::IpamAdd => ipam_add(run, b)?,
            Step::Addresses => {
                if let (Some(r), Some(i)) = (&run.ipam_result, run.pod_index) {
                    for ip in &r.ips {
                        pod.add_address(i, &ip.address).map_err(|e| nl(e, ifname))?;
                    }
                }
            }
            Step::Routes => {
                if let (Some(r), Some(i)) = (&run.ipam_result, run.pod_index) {
                    for route in &r.routes {
                        pod.add_route(i, &with_gateway(route, r))
                            .map_err(|e| nl(e, ifname))?;
                    }
                }
            }
            // Written by `record`, once every change above is made.
            Step::RecordMemlock => {}
        }
    }
    result_of(run, claim, pod)
}

/// Moves the VF netdev into the pod netns under CNI_IFNAME.
fn move_to_pod(
    run: &mut AddRun<'_>,
    claim: &mut Claim,
    host: &mut dyn Links,
    pod: &mut dyn Links,
) -> Result<(), CniError> {
    let ifname = run.plan.pod_ifname.as_str();
    host.move_to(run.link.index, run.pod_ns.fd(), ifname, None)
        .map_err(|e| nl(e, &format!("VF netdev {}", run.link.name)))?;
    let moved = pod
        .by_name(ifname)
        .map_err(|e| nl(e, "moved VF netdev"))?
        .ok_or_else(|| {
            nl(
                format!("{ifname} missing after the move"),
                "moved VF netdev",
            )
        })?;
    // Recorded at once, not at `record`: a release after a crash from here
    // on knows the link in the pod netns by this ifindex.
    if moved.index != run.link.index {
        claim.pod_ifindex = Some(moved.index);
        run.node
            .state
            .write_claim(claim)
            .map_err(|e| CniError::new(code::IO, e.to_string()))?;
    }
    run.pod_index = Some(moved.index);
    Ok(())
}

/// Moves the VF's RDMA device into the pod netns.
fn move_rdma(run: &AddRun<'_>, b: &mut Backends<'_>) -> Result<(), CniError> {
    let Some(dev) = &run.plan.rdma_device else {
        return Ok(());
    };
    match b.rdma.move_device(dev, &run.node.host_netns, run.pod_ns) {
        Ok(crate::rdma::Moved::Yes) => Ok(()),
        Ok(crate::rdma::Moved::NotFound) => Err(CniError::new(
            code::RDMA,
            format!(
                "RDMA device {dev} of {} is not in the host netns",
                run.plan.vf
            ),
        )),
        Err(e) => Err(CniError::new(code::RDMA, e.to_string())),
    }
}

/// IPAM ADD: finishes the delegate started before the first step, or runs it.
fn ipam_add(run: &mut AddRun<'_>, b: &mut Backends<'_>) -> Result<(), CniError> {
    let plugin = run
        .req
        .conf
        .ipam
        .as_ref()
        .map(|i| i.plugin.as_str())
        .unwrap_or_default();
    let ireq: IpamRequest<'_> = run.req.ipam_request(Command::Add, plugin);
    let r = match run.ipam_started.take() {
        Some(started) => ipam::finish_add(b.ipam, &ireq, started),
        None => ipam::add(b.ipam, &ireq),
    }
    .map_err(|e| CniError::new(code::IPAM, e.to_string()))?;
    run.ipam_result = Some(r);
    Ok(())
}

/// The ADD result: the IPAM result with our interface as the pod sees it
/// now, chained after `prevResult`.
fn result_of(
    run: &mut AddRun<'_>,
    claim: &Claim,
    pod: &mut dyn Links,
) -> Result<CniResult, CniError> {
    let ifname = run.plan.pod_ifname.as_str();
    let index = run.pod_index.ok_or_else(|| nl("no pod ifindex", ifname))?;
    let final_link = pod
        .by_index(index)
        .map_err(|e| nl(e, ifname))?
        .ok_or_else(|| nl("vanished after ADD", ifname))?;
    let mut ours = run.ipam_result.take().unwrap_or_default();
    ours.interfaces = vec![Interface {
        name: ifname.to_string(),
        mac: final_link.mac.map(|m| m.to_string()),
        mtu: Some(final_link.mtu),
        sandbox: Some(claim.netns.clone()),
        socket_path: None,
        pci_id: run.plan.vf.pci().map(|p| p.to_string()),
    }];
    for ip in &mut ours.ips {
        ip.interface = Some(0);
    }
    if ours.dns.is_empty() {
        ours.dns = run.req.conf.dns.clone();
    }
    Ok(match &run.req.conf.prev_result {
        Some(prev) => prev.clone().chain(ours),
        None => ours,
    })
}

/// A route without `gw` uses the gateway of the address of its family
/// whose subnet holds it; none makes it a link-scope route.
fn with_gateway(route: &Route, r: &CniResult) -> Route {
    let mut out = route.clone();
    if out.gw.is_none() {
        out.gw = r
            .ips
            .iter()
            .filter(|ip| ip.address.is_ipv4() == route.dst.is_ipv4())
            .find_map(|ip| ip.gateway.filter(|g| ip.address.contains(g)));
    }
    out
}

/// Releases everything of a failed ADD; the error says what failed and
/// what could not be undone.
fn rollback(
    req: &Request,
    claim: &Claim,
    node: &Node,
    b: &mut Backends<'_>,
    log: &Logger,
    e: CniError,
) -> CniError {
    log.error(&format!("ADD failed, rolling back: {e}"));
    let left = release_claim(claim, node, b, log, req.release_ipam());
    if left.is_empty() {
        return e;
    }
    let d = format!("rollback incomplete: {left}");
    CniError {
        details: Some(match e.details {
            Some(old) => format!("{old}; {d}"),
            None => d,
        }),
        ..e
    }
}

/// A soft device over a VF's netdev: its netdev is the VF's, and a claim
/// on the VF (live or stale) says the VF is someone's. Refused before
/// anything moves; a stale claim is released by an ADD, DEL or GC of the VF.
fn refuse_a_claimed_vfs_netdev(node: &Node, soft: &crate::vf::SoftTarget) -> Result<(), CniError> {
    let Some(netdev) = &soft.netdev else {
        return Ok(());
    };
    let Ok(pci) = crate::vf::netdev_pci(&node.host_root, netdev) else {
        return Ok(());
    };
    if crate::vf::resolve(&node.host_root, pci).is_err() {
        return Ok(()); // not a VF (a PF, a NIC without SR-IOV)
    }
    let key = crate::vf::DeviceKey::Pci(pci);
    let held = match node.state.read_claim(&key) {
        Ok(None) => return Ok(()),
        Ok(Some(c)) => format!(
            "held by container {} ({} in netns {}{})",
            c.container_id,
            c.ifname,
            c.netns,
            if kroce_netlink::netns::is_alive(Path::new(&c.netns)) {
                ""
            } else {
                ", a dead netns: DEL or GC of that attachment, or an ADD of the VF by its PCI address, releases it"
            }
        ),
        Err(e) => format!("perhaps held: its claim cannot be read ({e})"),
    };
    Err(CniError::new(
        code::TRY_AGAIN,
        format!(
            "soft RDMA device {}: its netdev {netdev} is VF {pci}'s, which is {held}; not moved. Attach the VF by its PCI address instead (deviceID {pci}: its {} follows it)",
            soft.soft_rdma, soft.soft_rdma
        ),
    ))
}

/// Makes soft RDMA device `dev` (`ty`) again over the pod's netdev: the
/// kernel deleted it when the VF's netdev left the host netns. NEWLINK is
/// sent from inside the pod netns; a kernel that puts the new device in the
/// host netns (exclusive mode) gets it moved into the pod.
fn recreate_in_pod(
    b: &mut Backends<'_>,
    node: &Node,
    pod_ns: &Netns,
    vf: &crate::vf::Target,
    dev: &str,
    ty: &str,
    ifname: &str,
) -> Result<(), CniError> {
    let fail = |e: String| {
        CniError::new(
            code::RDMA,
            format!(
                "{vf}: {ty} device {dev} (deleted by the kernel when its netdev left the host netns) could not be made again over {ifname} in the pod netns: {e}; the netdev is given back and {dev} made again on the host. Use `rdma: false` to attach without RDMA, or check that the rdma_{ty} module is loaded and the RDMA netns mode (`rdma system`)"
            ),
        )
    };
    b.rdma
        .add_link(pod_ns, dev, ty, ifname)
        .map_err(|e| fail(e.to_string()))?;
    if b.rdma
        .present(pod_ns, dev)
        .map_err(|e| fail(e.to_string()))?
    {
        return Ok(());
    }
    match b.rdma.move_device(dev, &node.host_netns, pod_ns) {
        Ok(crate::rdma::Moved::Yes) => Ok(()),
        Ok(crate::rdma::Moved::NotFound) => Err(fail(format!(
            "made, but found neither in the pod netns nor in the host netns {}",
            node.host_netns.path().display()
        ))),
        Err(e) => Err(fail(e.to_string())),
    }
}

/// A claim left by another attachment: refuse while its netns lives, else
/// release it (VF, IPAM lease, memlock entry) and carry on.
fn take_over_stale_claim(
    req: &Request,
    node: &Node,
    b: &mut Backends<'_>,
    log: &Logger,
    pod_ns: &Netns,
    // Proof the VF lock is held.
    _held: &VfLock,
    key: &crate::vf::DeviceKey,
) -> Result<(), CniError> {
    let pci = key.label();
    let old = match node.state.read_claim(key) {
        Ok(Some(c)) => c,
        Ok(None) => return Ok(()),
        Err(e) => {
            log.warn(&format!("{e}; treating {pci} as free"));
            let _ = node.state.remove_claim(key);
            return Ok(());
        }
    };
    let same_attachment = old.owned_by(req.env.container_id(), req.env.ifname());
    let old_ns = Netns::open(Path::new(&old.netns)).ok();
    let alive = old_ns.is_some();
    if alive && !same_attachment {
        return Err(CniError::new(
            code::TRY_AGAIN,
            format!(
                "{pci} is held by container {} ({} in netns {}{})",
                old.container_id,
                old.ifname,
                old.netns,
                if old_ns.as_ref().is_some_and(|n| n.same_as(pod_ns)) {
                    ", this very netns"
                } else {
                    ""
                }
            ),
        ));
    }
    log.warn(&format!(
        "{pci}: releasing the {} claim of container {} ({} in {}) first",
        if alive {
            "earlier"
        } else {
            "stale (netns gone)"
        },
        old.container_id,
        old.ifname,
        old.netns
    ));
    let left = release_claim(&old, node, b, log, req.release_ipam());
    if left.is_empty() {
        Ok(())
    } else {
        Err(CniError::new(
            code::TRY_AGAIN,
            format!(
                "{pci}: the previous holder {} could not be released",
                old.container_id
            ),
        )
        .with_details(left.to_string()))
    }
}

/// Warns when the runtime's process tree cannot lock what RDMA needs
/// (`node.runtime_pids`: the runtime, not this short-lived plugin).
fn check_memlock(conf: &crate::config::NetConf, node: &Node, log: &Logger) {
    let needed = conf.memlock.unwrap_or(memlock::DEFAULT_NEEDED);
    let mut limits = Vec::new();
    for pid in &node.runtime_pids {
        match memlock::read_limit(node.host_root.proc(), pid) {
            Ok(l) => limits.push(l),
            Err(e) => log.info(&format!("cannot read the memlock limit of pid {pid}: {e}")),
        }
    }
    for w in memlock::limit_warnings(&limits, needed, conf.memlock) {
        log.warn(&w);
    }
}
