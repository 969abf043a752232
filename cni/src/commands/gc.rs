//! GC: releases every attachment of this network that is not in
//! `cni.dev/valid-attachments` (VF, IPAM lease, memlock entry, claim and
//! lock file), then forwards GC to an IPAM delegate that speaks 1.1.0.

use super::release::{Leftovers, release_claim};
use super::{Backends, Node, Request};
use crate::config::Attachment;
use crate::ipam;
use crate::log::Logger;
use crate::memlock::MemlockDir;
use crate::protocol::{CniError, Command, code};
use std::collections::HashSet;

pub fn gc(req: &Request, node: &Node, b: &mut Backends<'_>, log: &Logger) -> Result<(), CniError> {
    let valid: HashSet<Attachment> = req
        .conf
        .valid_attachments
        .clone()
        .ok_or_else(|| {
            CniError::new(
                code::INVALID_CONFIG,
                "GC needs cni.dev/valid-attachments (refusing to treat a missing list as empty)",
            )
        })?
        .into_iter()
        .collect();
    let is_valid = |cid: &str, ifname: &str| {
        valid.contains(&Attachment {
            container_id: cid.to_string(),
            ifname: ifname.to_string(),
        })
    };
    let mut errors = Leftovers::default();
    let (claims, bad) = node.state.claims();
    for e in bad {
        errors.push(e);
    }
    for c in claims {
        if c.network != req.conf.name || is_valid(&c.container_id, &c.ifname) {
            continue;
        }
        // Held to the end of this iteration (see `VfLock` for its file).
        let _lock = match node.state.lock_vf(&c.vf.key(), node.lock_timeout) {
            Ok(l) => l,
            Err(e) => {
                errors.push(e);
                continue;
            }
        };
        // Re-read under the lock: an ADD may have replaced it meanwhile.
        match node.state.read_claim(&c.vf.key()) {
            Ok(Some(cur)) if cur.owned_by(&c.container_id, &c.ifname) => {
                log.info(&format!(
                    "GC: releasing {} of stale attachment {}/{}",
                    cur.vf, cur.container_id, cur.ifname
                ));
                let left = release_claim(&cur, node, b, log, req.release_ipam());
                errors.append(left);
            }
            Ok(_) => {}
            Err(e) => errors.push(e),
        }
    }
    let memlock = MemlockDir::new(node.state.root());
    match memlock.entries() {
        Ok(entries) => {
            for (cid, ifname, network) in entries {
                if network == req.conf.name
                    && !is_valid(&cid, &ifname)
                    && let Err(e) = memlock.forget(&cid, &ifname)
                {
                    errors.push(e);
                }
            }
        }
        Err(e) => errors.push(e),
    }
    if let Some(i) = &req.conf.ipam {
        let ireq = req.ipam_request(Command::Gc, &i.plugin);
        match ipam::speaks_1_1(b.ipam, &ireq) {
            Ok(true) => {
                if let Err(e) = b.ipam.exec(&ireq) {
                    errors.push(e);
                }
            }
            Ok(false) => log.info(&format!(
                "IPAM plugin {} predates GC (CNI 1.1.0); stale leases were released one by one",
                i.plugin
            )),
            Err(e) => errors.push(e),
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(CniError::new(
            code::CLEANUP,
            format!("GC left {} problem(s)", errors.len()),
        )
        .with_details(errors.to_string()))
    }
}
