//! DEL: idempotent. Releases the VF only when this attachment holds it (an
//! old pod's late DEL never touches a VF a newer pod holds), always
//! releases this attachment's IPAM lease and memlock entry.

use super::release::{Leftovers, ipam_release, release_claim};
use super::{Backends, Node, Request, device_key};
use crate::log::Logger;
use crate::memlock::MemlockDir;
use crate::protocol::{CniError, code};

pub fn del(req: &Request, node: &Node, b: &mut Backends<'_>, log: &Logger) -> Result<(), CniError> {
    let cid = req.env.container_id();
    let ifname = req.env.ifname();
    let mut errors = Leftovers::default();

    // The VF this attachment holds: the config's device when its claim is
    // ours, else a scan (the device-info file may be gone by now).
    let hinted = device_key(&req.conf)
        .ok()
        .and_then(|p| node.state.read_claim(&p).ok().flatten())
        .filter(|c| c.owned_by(cid, ifname))
        .map(|c| c.vf.key());
    let pci = hinted.or_else(|| node.state.find_claim(cid, ifname).map(|c| c.vf.key()));

    let mut released = false;
    if let Some(pci) = pci {
        // Held to the end of this block; its file goes with it when the
        // claim did (`VfLock`).
        let _lock = node
            .state
            .lock_vf(&pci, node.lock_timeout)
            .map_err(|e| CniError::new(code::TRY_AGAIN, e.to_string()))?;
        match node.state.read_claim(&pci) {
            Ok(Some(c)) if c.owned_by(cid, ifname) => {
                let left = release_claim(&c, node, b, log, req.release_ipam());
                errors.append(left);
                released = true;
            }
            Ok(_) => log.info(&format!(
                "{} is no longer held by {cid}/{ifname}: not touched",
                pci.label()
            )),
            Err(e) => errors.push(e),
        }
    } else {
        log.info(&format!("no VF recorded for {cid}/{ifname}"));
    }

    if !released {
        // No claim (never added, already deleted, taken over): the lease
        // and memlock entry of this attachment still go.
        if let Err(e) = ipam_release(
            b,
            &req.conf.raw,
            &req.env.args,
            &req.env.path,
            cid,
            ifname,
            req.env.netns.as_deref(),
        ) {
            errors.push(e);
        }
        if let Err(e) = MemlockDir::new(node.state.root()).forget(cid, ifname) {
            errors.push(e);
        }
    }

    if errors.is_empty() {
        Ok(())
    } else {
        Err(CniError::new(
            code::CLEANUP,
            format!("DEL of {cid}/{ifname} left {} problem(s)", errors.len()),
        )
        .with_details(errors.to_string()))
    }
}
