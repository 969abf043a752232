//! A candidate's device-info (k8snetworkplumbingwg device-info-spec 1.1.0):
//! what Multus and kroce's CNI read to learn which VF a pod got. The format
//! is [`kroce_contracts::device_info`]; here, what a candidate's is.

use crate::inventory::{Candidate, DeviceKind};
use kroce_contracts::device_info::DeviceInfo;

/// The device-info of a candidate; `None` for a soft device with no PCI
/// function behind its netdev (the spec requires a PCI address).
pub fn for_candidate(c: &Candidate) -> Option<DeviceInfo> {
    let pci = c.pci?;
    Some(DeviceInfo::pci(
        pci.to_string(),
        match c.kind {
            DeviceKind::Vf => c.pf.map(|p| p.to_string()),
            _ => None,
        },
        c.rdma.as_ref().map(|r| r.name.clone()),
    ))
}
