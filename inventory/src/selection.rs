//! Which pool each candidate lands in: the first pool whose selectors all
//! match and whose mode can use the device.

use crate::config::{Config, Mode, Pool, Selectors};
use crate::inventory::{Candidate, DeviceKind};

/// True when every selector given matches the candidate.
pub fn matches(s: &Selectors, c: &Candidate) -> bool {
    fn any<T: PartialEq>(list: &Option<Vec<T>>, value: Option<T>) -> bool {
        match list {
            None => true,
            Some(l) => value.is_some_and(|v| l.contains(&v)),
        }
    }
    let netdev = c.netdev.as_ref().map(|n| n.name.clone());
    any(&s.vendors, c.vendor)
        && any(&s.devices, c.device)
        && any(&s.drivers, c.driver.clone())
        && any(&s.root_devices, c.pf)
        && any(&s.link_types, c.link_type)
        && any(&s.numa_nodes, c.numa)
        && any(&s.if_names, netdev)
        && s.is_rdma.is_none_or(|want| want == c.rdma.is_some())
        && s.pf_names.as_ref().is_none_or(|sels| {
            c.kind != DeviceKind::Soft
                && c.pf_name
                    .as_deref()
                    .is_some_and(|pf| sels.iter().any(|sel| sel.matches(pf, c.vf_index)))
        })
}

/// Whether the pool's mode can hand out this device at all.
pub fn eligible(pool: &Pool, c: &Candidate) -> bool {
    match pool.mode {
        // A PF whose VFs are enabled is the VFs' parent, not a device to give away.
        Mode::Exclusive => !(c.kind == DeviceKind::Pci && c.active_vfs > 0),
        // Sharing means sharing the RDMA device's char devices.
        Mode::Shared { .. } => c.rdma.is_some(),
    }
}

/// The pool index of each candidate (`None`: no pool takes it).
pub fn assign(config: &Config, candidates: &[Candidate]) -> Vec<Option<usize>> {
    candidates
        .iter()
        .map(|c| {
            config
                .pools
                .iter()
                .position(|p| eligible(p, c) && matches(&p.selectors, c))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Format, parse};
    use crate::host_view::HostView;
    use crate::inventory::{Memory, candidates};
    use sriov_helpers::fixture::FixtureHost;

    fn pools_of(yaml: &str, fx: &FixtureHost) -> Vec<(String, Option<String>)> {
        let cfg = parse(yaml, Format::Yaml).unwrap();
        let c = candidates(&HostView::scan(&fx.root()), &mut Memory::default());
        let a = assign(&cfg, &c);
        c.iter()
            .zip(a)
            .map(|(c, p)| (c.id.clone(), p.map(|i| cfg.pools[i].resource.to_string())))
            .collect()
    }

    fn ids_in(assigned: &[(String, Option<String>)], pool: &str) -> Vec<String> {
        assigned
            .iter()
            .filter(|(_, p)| p.as_deref() == Some(pool))
            .map(|(id, _)| id.clone())
            .collect()
    }

    #[test]
    fn first_matching_pool_wins_and_ranges_apply() {
        let (_dir, fx) = crate::testing::connectx_pair();
        let a = pools_of(
            r#"
pools:
- resourceName: low
  selectors: {pfNames: ["ens1f0#0-1,6"]}
- resourceName: numa0
  selectors: {vendors: ["15b3"], devices: ["101e"], numaNodes: [0]}
- resourceName: all
  selectors: {drivers: [mlx5_core], isRdma: true, linkTypes: [ether]}
"#,
            &fx,
        );
        assert_eq!(
            ids_in(&a, "rdma/low"),
            ["0000:3b:00.2", "0000:3b:00.3", "0000:3b:01.0"]
        );
        let numa0 = ids_in(&a, "rdma/numa0");
        assert_eq!(numa0.len(), 5, "{numa0:?}");
        assert!(numa0.iter().all(|id| id.starts_with("0000:3b:")));
        // The PFs have VFs enabled: not handed out by exclusive pools.
        let all = ids_in(&a, "rdma/all");
        assert_eq!(all.len(), 8);
        assert!(all.iter().all(|id| id.starts_with("0000:86:")));
        assert!(!all.contains(&"0000:86:00.0".to_string()));
    }

    #[test]
    fn root_devices_soft_devices_and_shared_pfs() {
        let (_dir, mut fx) = crate::testing::connectx_pair();
        fx.add_rxe("rxe0", "eth9").unwrap();
        let a = pools_of(
            r#"
pools:
- resourceName: soft
  selectors: {ifNames: [eth9]}
- resourceName: hca
  mode: shared
  selectors: {rootDevices: ["0000:86:00.0"], devices: ["101d"]}
- resourceName: root
  selectors: {rootDevices: ["0000:86:00.0"], isRdma: true}
- resourceName: nordma
  selectors: {isRdma: false}
"#,
            &fx,
        );
        assert_eq!(ids_in(&a, "rdma/soft"), ["rxe0"]);
        assert_eq!(ids_in(&a, "rdma/hca"), ["0000:86:00.0"]);
        assert_eq!(ids_in(&a, "rdma/root").len(), 8);
        assert!(ids_in(&a, "rdma/nordma").is_empty());
        // pfNames never match a soft device.
        let a = pools_of(
            "pools:\n- resourceName: x\n  selectors: {pfNames: [eth9]}\n",
            &fx,
        );
        assert!(ids_in(&a, "rdma/x").is_empty());
    }

    #[test]
    fn unknown_numa_never_matches_numa_selector() {
        let fx = FixtureHost::unknown_numa().unwrap();
        let a = pools_of(
            "pools:\n- resourceName: n0\n  selectors: {numaNodes: [0]}\n- resourceName: any\n  selectors: {vendors: [\"15b3\"]}\n",
            &fx,
        );
        assert!(ids_in(&a, "rdma/n0").is_empty());
        assert_eq!(ids_in(&a, "rdma/any").len(), 4);
    }
}
