//! ADD: validate and read everything, take the VF, record its original
//! state, then run the plan; any failure releases everything done so far.

use super::release::release_claim;
use super::{Backends, Node, Request, device_key, open_netns};
use crate::ipam::{self, IpamRequest};
use crate::links::Links;
use crate::log::Logger;
use crate::memlock::{self, MemlockDir};
use crate::netns::Netns;
use crate::plan::{AddPlan, Step, plan_add};
use crate::protocol::{CniError, CniResult, CniVersion, Command, Interface, Route, code};
use crate::state::{Claim, Original, Phase, Planned, VfLock};
use std::path::Path;

pub fn add(
    req: &Request,
    node: &Node,
    b: &mut Backends<'_>,
    log: &Logger,
) -> Result<CniResult, CniError> {
    let env = &req.env;
    let conf = &req.conf;
    let ifname = env.ifname();
    let cid = env.container_id();

    // --- Reads and validation: nothing is touched until the claim. ---
    let key = device_key(conf)?;
    let vf = crate::vf::resolve_key(&node.host_root, &key)
        .map_err(|e| CniError::new(code::VF_LOOKUP, e.to_string()))?;
    let rdma_mode = match (vf.rdma(), conf.rdma) {
        (Some(_), p) if p != crate::config::RdmaPolicy::Never => {
            Some(b.rdma.netns_mode().map_err(|e| e.to_string()))
        }
        _ => None,
    };
    let (plan, warnings) = plan_add(conf, ifname, &vf, rdma_mode)?;
    for w in &warnings {
        log.warn(w);
    }
    // A missing IPAM plugin is a config error found before anything moves
    // (found after the move, its rollback could not release a lease).
    if let Some(i) = conf.ipam.as_ref().filter(|_| plan.ipam) {
        ipam::find_plugin(&i.plugin, &env.path)
            .map_err(|e| CniError::new(code::IPAM, e.to_string()))?;
    }
    let netns_path = env.netns.as_deref().unwrap_or(Path::new(""));
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

    // --- The VF is ours from here. ---
    let lock = node
        .state
        .lock_vf(&key, node.lock_timeout)
        .map_err(|e| CniError::new(code::TRY_AGAIN, e.to_string()))?;
    let prepared = (|| {
        take_over_stale_claim(req, node, b, log, &pod_ns, &lock, &key)?;
        // A VF returned from a dead netns may carry another name now.
        let vf = crate::vf::resolve_key(&node.host_root, &key)
            .map_err(|e| CniError::new(code::VF_LOOKUP, e.to_string()))?;
        let plan = AddPlan {
            vf: vf.clone(),
            ..plan
        };
        if let crate::vf::Target::Soft(soft) = &vf {
            refuse_a_claimed_vfs_netdev(node, soft)?;
        }

        let mut host = b
            .links
            .open(&node.host_netns)
            .map_err(|e| CniError::new(code::NETLINK, e.to_string()))?;
        let host_name = vf.netdev().cloned().ok_or_else(|| {
            CniError::new(
                code::VF_LOOKUP,
                match &vf {
                    crate::vf::Target::Vf(v) => format!(
                        "VF {} has no netdev in the host netns (driver {}; held by another netns, or bound to a non-netdev driver such as vfio-pci)",
                        v.pci,
                        v.driver.as_deref().unwrap_or("none")
                    ),
                    crate::vf::Target::Soft(_) => {
                        format!("{vf} has no parent netdev (no `parent` in sysfs)")
                    }
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
        // The link about to move must be the device's by facts its name
        // does not decide (sysfs `device`, the kernel's parent device).
        crate::vf::host_link_is(&node.host_root, &link, &vf).map_err(|e| {
            CniError::new(
                code::VF_LOOKUP,
                format!("{}: refusing to move {host_name}: {e}", key.label()),
            )
        })?;
        let original_vf = match (plan.vf_settings.is_empty(), vf.vf()) {
            (true, _) => None,
            (false, Some(v)) => Some(
                b.vf.get(&v.pf_ifname, v.vf_index)
                    .map_err(|e| CniError::new(code::VF_CONFIG, e.to_string()))?,
            ),
            // plan_add refuses PF-side settings without a PF.
            (false, None) => {
                return Err(CniError::new(
                    code::INVALID_CONFIG,
                    format!("{vf} has no PF: PF-side VF attributes cannot be set"),
                ));
            }
        };
        // IFLA_VF_RATE carries both rates: the one not configured keeps
        // the VF's current value, read above before any change.
        let plan = match &original_vf {
            Some(cur) => AddPlan {
                vf_settings: crate::plan::complete_rates(&plan.vf_settings, conf, cur)?,
                ..plan
            },
            None => plan,
        };
        let claim = Claim {
            version: 1,
            vf: vf.clone(),
            container_id: cid.to_string(),
            ifname: ifname.to_string(),
            netns: netns_path.display().to_string(),
            network: conf.name.clone(),
            phase: Phase::Adding,
            original: Original {
                link,
                vf: original_vf,
            },
            planned: Planned {
                vf_settings: plan.vf_settings.clone(),
                mac: plan.mac,
                mtu: plan.mtu,
                rdma_device: plan.rdma_device.clone(),
            },
            pod_ifindex: None,
            result: None,
            config: conf.raw.clone(),
            cni_args: env.args.to_env_string(),
            cni_path: env.path.clone(),
        };
        node.state
            .write_claim(&claim)
            .map_err(|e| CniError::new(code::IO, e.to_string()))?;
        Ok((claim, plan, host, host_name))
    })();
    let (mut claim, plan, mut host, host_name) = match prepared {
        Ok(p) => p,
        Err(e) => {
            // Nothing was claimed: leave no lock file behind either.
            if matches!(node.state.read_claim(&key), Ok(None)) {
                lock.remove_file();
            }
            return Err(e);
        }
    };

    // --- Side effects. ---
    // A delegate that does not need the link runs while the VF moves: each
    // takes ~15 ms (a process start; the kernel's netns move).
    let ipam_plugin = conf.ipam.as_ref().map(|i| i.plugin.clone());
    let ipam_started = match &ipam_plugin {
        Some(p) if plan.ipam && ipam::runs_without_the_link(p) => Some(ipam::start_negotiated(
            b.ipam,
            &req.ipam_request(Command::Add, p),
        )),
        _ => None,
    };
    let mut run = AddRun {
        req,
        node,
        plan: &plan,
        pod_ns: &pod_ns,
        link: claim.original.link.clone(),
        pod_index: None,
        ipam_started,
        ipam_result: None,
    };
    let outcome = run_steps(&mut run, &mut claim, host.as_mut(), pod.as_mut(), b, log);
    // A step failed before the lease was collected: the delegate must be
    // done before the rollback's IPAM DEL, or that DEL could come first and
    // leave the lease allocated.
    if let (Some(started), Some(p)) = (run.ipam_started.take(), &ipam_plugin) {
        let _ = ipam::finish_add(b.ipam, &req.ipam_request(Command::Add, p), started);
    }
    drop(host);
    drop(pod);
    match outcome {
        Ok(result) => {
            claim.phase = Phase::Attached;
            claim.result = Some(result.render(CniVersion::LATEST));
            match node.state.write_claim(&claim) {
                Ok(()) => {
                    log.info(&format!(
                        "attached {} ({host_name}) as {ifname} in {}",
                        claim.vf, claim.netns
                    ));
                    Ok(result)
                }
                Err(e) => Err(rollback(
                    req,
                    &claim,
                    node,
                    b,
                    log,
                    &lock,
                    CniError::new(code::IO, e.to_string()),
                )),
            }
        }
        Err(e) => Err(rollback(req, &claim, node, b, log, &lock, e)),
    }
}

struct AddRun<'a> {
    req: &'a Request,
    node: &'a Node,
    plan: &'a AddPlan,
    pod_ns: &'a Netns,
    /// The VF netdev in the host netns as found.
    link: crate::netlink::route::LinkInfo,
    pod_index: Option<u32>,
    /// IPAM ADD under way (started before the first step).
    ipam_started: Option<ipam::Started>,
    ipam_result: Option<CniResult>,
}

fn nl(e: impl std::fmt::Display, what: &str) -> CniError {
    CniError::new(code::NETLINK, format!("{what}: {e}"))
}

fn run_steps(
    run: &mut AddRun<'_>,
    claim: &mut Claim,
    host: &mut dyn Links,
    pod: &mut dyn Links,
    b: &mut Backends<'_>,
    log: &Logger,
) -> Result<CniResult, CniError> {
    let ifname = run.plan.pod_ifname.clone();
    let vf = &run.plan.vf;
    for step in run.plan.steps() {
        log.debug(&format!("step {step:?}"));
        match step {
            Step::VfSetting(i) => {
                let s = &run.plan.vf_settings[i];
                let v = vf.vf().ok_or_else(|| {
                    CniError::new(
                        code::INVALID_CONFIG,
                        format!("{vf} has no PF: PF-side VF attributes cannot be set"),
                    )
                })?;
                b.vf.set(&v.pf_ifname, v.vf_index, s)
                    .map_err(|e| CniError::new(code::VF_CONFIG, e.to_string()))?;
            }
            Step::DropAltnames => {
                for a in &run.link.altnames {
                    host.del_altname(run.link.index, a)
                        .map_err(|e| nl(e, &format!("VF netdev {}", run.link.name)))?;
                }
            }
            Step::MoveToPod => {
                host.move_to(run.link.index, run.pod_ns.fd(), &ifname, None)
                    .map_err(|e| nl(e, &format!("VF netdev {}", run.link.name)))?;
                let moved = pod
                    .by_name(&ifname)
                    .map_err(|e| nl(e, "moved VF netdev"))?
                    .ok_or_else(|| {
                        nl(
                            format!("{ifname} missing after the move"),
                            "moved VF netdev",
                        )
                    })?;
                if moved.index != run.link.index {
                    claim.pod_ifindex = Some(moved.index);
                    run.node
                        .state
                        .write_claim(claim)
                        .map_err(|e| CniError::new(code::IO, e.to_string()))?;
                }
                run.pod_index = Some(moved.index);
            }
            Step::SetMac => {
                if let (Some(mac), Some(i)) = (run.plan.mac, run.pod_index) {
                    pod.set_mac(i, &mac).map_err(|e| nl(e, &ifname))?;
                }
            }
            Step::SetMtu => {
                if let (Some(mtu), Some(i)) = (run.plan.mtu, run.pod_index) {
                    pod.set_mtu(i, mtu).map_err(|e| nl(e, &ifname))?;
                }
            }
            Step::LinkUp => {
                if let Some(i) = run.pod_index {
                    pod.set_up(i, true).map_err(|e| nl(e, &ifname))?;
                }
            }
            Step::MoveRdma => {
                if let Some(dev) = &run.plan.rdma_device {
                    match b.rdma.move_device(dev, &run.node.host_netns, run.pod_ns) {
                        Ok(crate::rdma::Moved::Yes) => {}
                        Ok(crate::rdma::Moved::NotFound) => {
                            return Err(CniError::new(
                                code::RDMA,
                                format!("RDMA device {dev} of {vf} is not in the host netns"),
                            ));
                        }
                        Err(e) => return Err(CniError::new(code::RDMA, e.to_string())),
                    }
                }
            }
            Step::RecreateRdma => {
                if let (Some(dev), Some(ty)) = (&run.plan.rdma_device, &run.plan.rdma_recreate) {
                    recreate_in_pod(b, run.node, run.pod_ns, vf, dev, ty, &ifname)?;
                }
            }
            Step::IpamAdd => {
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
            }
            Step::Addresses => {
                if let (Some(r), Some(i)) = (&run.ipam_result, run.pod_index) {
                    for ip in &r.ips {
                        pod.add_address(i, &ip.address)
                            .map_err(|e| nl(e, &ifname))?;
                    }
                }
            }
            Step::Routes => {
                if let (Some(r), Some(i)) = (&run.ipam_result, run.pod_index) {
                    for route in &r.routes {
                        pod.add_route(i, &with_gateway(route, r))
                            .map_err(|e| nl(e, &ifname))?;
                    }
                }
            }
            Step::RecordMemlock => {
                if let Some(m) = run.plan.memlock {
                    MemlockDir::new(run.node.state.root())
                        .record(
                            &claim.container_id,
                            &claim.netns,
                            &ifname,
                            &claim.network,
                            m,
                        )
                        .map_err(|e| CniError::new(code::IO, format!("memlock request: {e}")))?;
                }
            }
        }
    }
    let index = run.pod_index.ok_or_else(|| nl("no pod ifindex", &ifname))?;
    let final_link = pod
        .by_index(index)
        .map_err(|e| nl(e, &ifname))?
        .ok_or_else(|| nl("vanished after ADD", &ifname))?;
    let mut ours = run.ipam_result.take().unwrap_or_default();
    ours.interfaces = vec![Interface {
        name: ifname.clone(),
        mac: final_link.mac.map(|m| m.to_string()),
        mtu: Some(final_link.mtu),
        sandbox: Some(claim.netns.clone()),
        socket_path: None,
        pci_id: vf.pci().map(|p| p.to_string()),
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
    lock: &VfLock,
    e: CniError,
) -> CniError {
    log.error(&format!("ADD failed, rolling back: {e}"));
    let left = release_claim(claim, node, b, log, req.release_ipam());
    if left.is_empty() {
        lock.remove_file();
        e
    } else {
        let d = format!("rollback incomplete: {}", left.join("; "));
        CniError {
            details: Some(match e.details {
                Some(old) => format!("{old}; {d}"),
                None => d,
            }),
            ..e
        }
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
            if crate::netns::is_alive(Path::new(&c.netns)) {
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
                "{vf}: {ty} device {dev} (deleted by the kernel when the VF's netdev left the host netns) could not be made again over {ifname} in the pod netns: {e}; the VF is given back and {dev} made again on the host. Use `rdma: false` to attach the VF without RDMA, or check that the rdma_{ty} module is loaded and the RDMA netns mode (`rdma system`)"
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
    // Proof the VF lock is held; its file stays: this ADD goes on with it.
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
        .with_details(left.join("; ")))
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
