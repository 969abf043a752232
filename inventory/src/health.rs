//! Device health from one host scan.
//!
//! Unhealthy when:
//! - its netdev is administratively up but not running (link down), or
//! - its netdev, RDMA device or PCI netdev is gone from the host namespace, or
//! - one of its char devices is missing under the dev root.
//!
//! An admin-down netdev is healthy: fresh VFs are down until the CNI
//! configures them. A device handed to a pod ("in use") is expected to lose
//! its netdev (and, in exclusive RDMA netns mode, its RDMA device) from the
//! host namespace, so those two checks are skipped for it; its char devices
//! never leave `/dev` and are still checked.

use crate::inventory::{Candidate, DeviceKind};
use serde::Serialize;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", content = "reasons")]
pub enum Health {
    Healthy,
    Unhealthy(Vec<String>),
}

impl Health {
    pub fn is_healthy(&self) -> bool {
        matches!(self, Health::Healthy)
    }

    pub fn reasons(&self) -> &[String] {
        match self {
            Health::Healthy => &[],
            Health::Unhealthy(r) => r,
        }
    }
}

/// `in_use`: the device was handed to a pod and may live in its namespace.
pub fn evaluate(c: &Candidate, in_use: bool) -> Health {
    let mut reasons = Vec::new();
    match &c.netdev {
        None if c.kind != DeviceKind::Soft && !in_use => {
            reasons.push("no netdev in the host network namespace".to_string());
        }
        Some(n) if !n.present && !in_use => {
            reasons.push(format!("netdev {} is gone", n.name));
        }
        Some(n) if n.present && n.admin_up != Some(false) && !n.up => {
            reasons.push(format!(
                "netdev {} is {}",
                n.name,
                n.operstate.as_deref().unwrap_or("unknown")
            ));
        }
        _ => {}
    }
    if let Some(r) = &c.rdma {
        if !r.present && !in_use {
            reasons.push(format!("RDMA device {} is gone", r.name));
        }
        for node in r.char_devices.iter().filter(|n| !n.present) {
            reasons.push(format!("{} is missing under the dev root", node.name));
        }
    }
    if reasons.is_empty() {
        Health::Healthy
    } else {
        Health::Unhealthy(reasons)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::{CharNode, NetdevState, RdmaState};

    fn vf() -> Candidate {
        Candidate {
            id: "0000:3b:00.2".into(),
            kind: DeviceKind::Vf,
            pci: "0000:3b:00.2".parse().ok(),
            pf: "0000:3b:00.0".parse().ok(),
            pf_name: Some("ens1f0".into()),
            vf_index: Some(0),
            vendor: Some(0x15b3),
            device: Some(0x101e),
            driver: Some("mlx5_core".into()),
            numa: Some(0),
            active_vfs: 0,
            netdev: Some(NetdevState {
                name: "ens1f0v0".into(),
                present: true,
                operstate: Some("up".into()),
                up: true,
                admin_up: Some(true),
            }),
            rdma: Some(RdmaState {
                name: "mlx5_2".into(),
                present: true,
                char_devices: vec![CharNode {
                    name: "uverbs2".into(),
                    present: true,
                }],
                roce_v2_gid: None,
                port_state: Some("ACTIVE".into()),
            }),
            link_type: None,
            rdma_cm: true,
        }
    }

    #[test]
    fn healthy_vf() {
        assert_eq!(evaluate(&vf(), false), Health::Healthy);
    }

    #[test]
    fn link_down_is_unhealthy_but_admin_down_is_not() {
        let mut c = vf();
        let n = c.netdev.as_mut().unwrap();
        n.up = false;
        n.operstate = Some("lowerlayerdown".into());
        assert_eq!(
            evaluate(&c, false).reasons(),
            ["netdev ens1f0v0 is lowerlayerdown"]
        );
        // Still unhealthy while in use: the netdev is visible and broken.
        assert!(!evaluate(&c, true).is_healthy());
        c.netdev.as_mut().unwrap().admin_up = Some(false);
        assert!(evaluate(&c, false).is_healthy());
        // Unknown flags (no `flags` file): operstate decides.
        c.netdev.as_mut().unwrap().admin_up = None;
        assert!(!evaluate(&c, false).is_healthy());
    }

    #[test]
    fn gone_netdev_and_rdma_are_tolerated_only_in_use() {
        let mut c = vf();
        c.netdev.as_mut().unwrap().present = false;
        c.rdma.as_mut().unwrap().present = false;
        assert_eq!(
            evaluate(&c, false).reasons(),
            ["netdev ens1f0v0 is gone", "RDMA device mlx5_2 is gone"]
        );
        assert!(evaluate(&c, true).is_healthy());
        c.netdev = None;
        assert_eq!(
            evaluate(&c, false).reasons()[0],
            "no netdev in the host network namespace"
        );
    }

    #[test]
    fn missing_char_device_is_unhealthy_even_in_use() {
        let mut c = vf();
        c.rdma.as_mut().unwrap().char_devices[0].present = false;
        let h = evaluate(&c, true);
        assert_eq!(h.reasons(), ["uverbs2 is missing under the dev root"]);
    }
}
