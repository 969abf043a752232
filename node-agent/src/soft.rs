//! Soft RDMA devices (`nicSelector.ifNames`): rxe/siw devices an admin (or
//! the kind e2e) made over existing netdevs. The agent creates nothing for
//! them; it checks each named netdev exists and carries an RDMA device, and
//! reports what it found, so a node missing them is not counted ready.

use kroce_operator::crd::{ObservedSoftDevice, SoftDeviceGroup};
use sriov_helpers::Host;

/// What one check found: the observations for the status, and one
/// `(reason, message)` per problem.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SoftCheck {
    pub observed: Vec<ObservedSoftDevice>,
    pub problems: Vec<(String, String)>,
}

/// Checks every netdev of every group against the host; each netdev once.
pub fn check_soft_devices(host: &Host, groups: &[SoftDeviceGroup]) -> SoftCheck {
    let mut out = SoftCheck::default();
    for g in groups {
        for ifname in &g.if_names {
            if out.observed.iter().any(|o| &o.if_name == ifname) {
                continue;
            }
            let netdev = host.netdevs.get(ifname);
            let present = netdev.is_some();
            // A soft device names its netdev as parent; a NIC's own RDMA
            // device sits on the netdev's PCI function.
            let rdma = host
                .rdma_of_netdev(ifname)
                .or_else(|| {
                    netdev
                        .and_then(|n| n.pci.as_ref())
                        .and_then(|a| host.rdma_of_pci(a))
                })
                .map(|r| r.name.clone());
            if !present {
                out.problems.push((
                    "SoftDeviceMissing".into(),
                    format!(
                        "netdev {ifname} (network {}, {}) does not exist on this node",
                        g.network, g.resource_name
                    ),
                ));
            } else if rdma.is_none() {
                out.problems.push((
                    "SoftDeviceNotRdma".into(),
                    format!(
                        "netdev {ifname} (network {}, {}) has no RDMA device; create one, e.g. \
                         `rdma link add rxe_{ifname} type rxe netdev {ifname}`",
                        g.network, g.resource_name
                    ),
                ));
            }
            out.observed.push(ObservedSoftDevice {
                if_name: ifname.clone(),
                present,
                rdma_device: rdma,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use sriov_helpers::HostRoot;
    use sriov_helpers::fixture::FixtureHost;

    fn group(names: &[&str]) -> SoftDeviceGroup {
        SoftDeviceGroup {
            network: "rxe".into(),
            resource_name: "rdma/vf".into(),
            if_names: names.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn reports_rxe_devices_and_names_what_is_missing() {
        let mut fx = FixtureHost::connectx6dx_pair().unwrap();
        fx.add_rxe("rxe_kvf0", "kvf0").unwrap();
        // A macvlan nobody put an rxe device on.
        fx.add_virtual_netdev("kvf1", "02:00:00:00:01:01", 1500)
            .unwrap();
        let host = Host::scan(&HostRoot::new(fx.path()));
        let c = check_soft_devices(
            &host,
            &[group(&["kvf0", "kvf9"]), group(&["kvf0", "kvf1", "ens1f0"])],
        );
        let seen: Vec<(&str, bool, Option<&str>)> = c
            .observed
            .iter()
            .map(|o| (o.if_name.as_str(), o.present, o.rdma_device.as_deref()))
            .collect();
        assert_eq!(
            seen,
            [
                ("kvf0", true, Some("rxe_kvf0")),
                ("kvf9", false, None),
                ("kvf1", true, None),
                // A NIC's netdev counts through its PCI function's RDMA device.
                ("ens1f0", true, Some("mlx5_0")),
            ],
            "kvf0 is reported once"
        );
        let reasons: Vec<&str> = c.problems.iter().map(|(r, _)| r.as_str()).collect();
        assert_eq!(reasons, ["SoftDeviceMissing", "SoftDeviceNotRdma"]);
        assert!(c.problems[0].1.contains("kvf9") && c.problems[0].1.contains("network rxe"));
        assert!(c.problems[1].1.contains("rdma link add"));
    }
}
