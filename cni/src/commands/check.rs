//! CHECK: the interface, its MAC, MTU and addresses in the pod netns against
//! `prevResult` (or the cached result), the RDMA device if it moved, then
//! the IPAM delegate's own CHECK.

use super::release::{Seen, is_our_link};
use super::{Backends, Node, Request, open_netns};
use crate::ipam;
use crate::log::Logger;
use crate::protocol::{CniError, CniResult, Command, code};

fn failed(msg: String) -> CniError {
    CniError::new(code::CHECK_FAILED, msg)
}

pub fn check(
    req: &Request,
    node: &Node,
    b: &mut Backends<'_>,
    _log: &Logger,
) -> Result<(), CniError> {
    let cid = req.env.container_id();
    let ifname = req.env.ifname();
    let claim = node.state.find_claim(cid, ifname).ok_or_else(|| {
        failed(format!(
            "no VF is attached for container {cid} interface {ifname}"
        ))
    })?;
    let prev = match &req.conf.prev_result {
        Some(p) => p.clone(),
        None => claim
            .result
            .as_ref()
            .and_then(|r| CniResult::parse(r).ok())
            .ok_or_else(|| CniError::new(code::INVALID_CONFIG, "CHECK needs prevResult"))?,
    };
    let netns = req.env.netns.as_deref().unwrap_or(std::path::Path::new(""));
    let ns_s = netns.display().to_string();
    let pod_ns = open_netns(netns)?;
    let mut pod = b
        .links
        .open(&pod_ns)
        .map_err(|e| CniError::new(code::NETLINK, e.to_string()))?;
    let link = pod
        .by_name(ifname)
        .map_err(|e| CniError::new(code::NETLINK, e.to_string()))?
        .ok_or_else(|| failed(format!("interface {ifname} is missing from netns {ns_s}")))?;
    if !is_our_link(&link, &claim, Seen::Pod) {
        return Err(failed(format!("{ifname} in {ns_s} is not {}", claim.vf)));
    }
    if !link.up {
        return Err(failed(format!("{ifname} in {ns_s} is down")));
    }
    let (idx, iface) = prev
        .interfaces
        .iter()
        .enumerate()
        .find(|(_, i)| i.name == ifname && i.sandbox.as_deref().is_none_or(|s| s == ns_s))
        .ok_or_else(|| failed(format!("prevResult lists no interface {ifname} in {ns_s}")))?;
    if let Some(mac) = &iface.mac {
        let have = link.mac.map(|m| m.to_string()).unwrap_or_default();
        if !have.eq_ignore_ascii_case(mac) {
            return Err(failed(format!(
                "{ifname} has MAC {have}, the result says {mac}"
            )));
        }
    }
    if let Some(mtu) = iface.mtu
        && mtu != link.mtu
    {
        return Err(failed(format!(
            "{ifname} has MTU {}, the result says {mtu}",
            link.mtu
        )));
    }
    let have = pod
        .addresses(link.index)
        .map_err(|e| CniError::new(code::NETLINK, e.to_string()))?;
    for ip in prev.ips.iter().filter(|ip| ip.interface == Some(idx)) {
        if !have.contains(&ip.address) {
            return Err(failed(format!("{ifname} lacks address {}", ip.address)));
        }
    }
    if let Some(dev) = &claim.planned.rdma_device {
        let present = b
            .rdma
            .present(&pod_ns, dev)
            .map_err(|e| CniError::new(code::RDMA, e.to_string()))?;
        if !present {
            return Err(failed(format!("RDMA device {dev} is not in netns {ns_s}")));
        }
    }
    if let Some(i) = &req.conf.ipam {
        ipam::exec_negotiated(b.ipam, &req.ipam_request(Command::Check, &i.plugin))
            .map_err(|e| CniError::new(e.delegate_code().unwrap_or(code::IPAM), e.to_string()))?;
    }
    Ok(())
}
