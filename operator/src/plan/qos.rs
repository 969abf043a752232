//! RoCE QoS plan for one PF: DCB (trust, PFC), ECN files, RDMA-CM defaults.

use crate::crd::{QosSpec, Trust};
use std::path::{Path, PathBuf};

/// RDMA-CM's name for RoCE v2 in `default_roce_mode`.
pub const ROCE_V2_MODE: &str = "RoCE v2";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QosPlan {
    pub trust: Trust,
    /// `pfc_en` bitmap: the one lossless priority.
    pub pfc_enabled: u8,
    pub ecn_priority: Option<u8>,
    pub roce_tos: Option<u8>,
}

pub fn plan_qos(q: &QosSpec) -> QosPlan {
    QosPlan {
        trust: q.trust,
        pfc_enabled: 1u8 << (q.pfc_priority & 7),
        ecn_priority: q.ecn.then_some(q.pfc_priority & 7),
        roce_tos: q.roce_tos,
    }
}

/// The DSCP-to-priority map installed for `trust: dscp`: the usual
/// `priority = dscp >> 3` (DSCP 26, the common RoCE class, lands on 3).
pub fn dscp_map() -> Vec<(u8, u8)> {
    (0u8..64).map(|d| (d, d >> 3)).collect()
}

/// `sys/class/net/<if>/ecn/roce_rp/enable/<p>` and `roce_np/enable/<p>`.
pub fn ecn_files(sys: &Path, ifname: &str, priority: u8) -> [PathBuf; 2] {
    let base = sys.join("class/net").join(ifname).join("ecn");
    [
        base.join("roce_rp/enable").join(priority.to_string()),
        base.join("roce_np/enable").join(priority.to_string()),
    ]
}

/// `<configfs>/rdma_cm/<dev>/ports/<port>/` files.
pub fn rdma_cm_port_dir(configfs: &Path, rdma_dev: &str, port: u32) -> PathBuf {
    configfs
        .join("rdma_cm")
        .join(rdma_dev)
        .join("ports")
        .join(port.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pfc_on_the_priority_only_and_ecn_follows() {
        let p = plan_qos(&QosSpec::default());
        assert_eq!(p.pfc_enabled, 0b0000_1000);
        assert_eq!(p.ecn_priority, Some(3));
        let q = QosSpec {
            pfc_priority: 5,
            ecn: false,
            ..Default::default()
        };
        let p = plan_qos(&q);
        assert_eq!(p.pfc_enabled, 0b0010_0000);
        assert_eq!(p.ecn_priority, None);
    }

    #[test]
    fn dscp_26_maps_to_priority_3_and_paths_are_as_the_kernel_names_them() {
        let m = dscp_map();
        assert_eq!(m.len(), 64);
        assert!(m.contains(&(26, 3)) && m.contains(&(63, 7)) && m.contains(&(0, 0)));
        let [rp, np] = ecn_files(Path::new("/sys"), "ens1f0", 3);
        assert_eq!(rp, Path::new("/sys/class/net/ens1f0/ecn/roce_rp/enable/3"));
        assert_eq!(np, Path::new("/sys/class/net/ens1f0/ecn/roce_np/enable/3"));
        assert_eq!(
            rdma_cm_port_dir(Path::new("/sys/kernel/config"), "mlx5_0", 1),
            Path::new("/sys/kernel/config/rdma_cm/mlx5_0/ports/1")
        );
    }
}
