//! One consistent picture of every pool: its devices (IDs as the kubelet sees
//! them), the candidate behind each, and its health. Built from a config and
//! a scan; every gRPC call answers from the latest one.
//!
//! Device IDs: a VF or PCI function is its PCI address (`0000:3b:00.2`), a
//! soft device its RDMA device name (`rxe0`); in a shared pool each HCA gives
//! `<base id>-<n>` for n in 0..sharedCount (`0000:3b:00.0-0`, `-1`, …).

use crate::api;
use crate::config::{Config, Mode, Pool};
use crate::health::{self, Health};
use crate::inventory::Candidate;
use crate::resource_name::ResourceName;
use crate::selection;
use std::collections::BTreeMap;
use std::sync::Arc;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolDevice {
    pub id: String,
    pub candidate: Arc<Candidate>,
    pub health: Health,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolSnapshot {
    pub pool: Pool,
    pub devices: BTreeMap<String, PoolDevice>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub pools: Vec<PoolSnapshot>,
    /// Candidates no pool takes (for `discover`).
    pub unassigned: Vec<Arc<Candidate>>,
}

impl Snapshot {
    /// `in_use(resource, base id)`: the device was handed to a pod (see [`health`]).
    pub fn build(
        config: &Config,
        candidates: Vec<Candidate>,
        in_use: &dyn Fn(&ResourceName, &str) -> bool,
    ) -> Snapshot {
        let assignment = selection::assign(config, &candidates);
        let mut pools: Vec<PoolSnapshot> = config
            .pools
            .iter()
            .map(|p| PoolSnapshot {
                pool: p.clone(),
                devices: BTreeMap::new(),
            })
            .collect();
        let mut unassigned = Vec::new();
        for (c, slot) in candidates.into_iter().zip(assignment) {
            let c = Arc::new(c);
            let Some(i) = slot else {
                unassigned.push(c);
                continue;
            };
            let ps = &mut pools[i];
            match ps.pool.mode {
                Mode::Exclusive => {
                    let health = health::evaluate(&c, in_use(&ps.pool.resource, &c.id));
                    ps.devices.insert(
                        c.id.clone(),
                        PoolDevice {
                            id: c.id.clone(),
                            candidate: c,
                            health,
                        },
                    );
                }
                Mode::Shared { count } => {
                    // The HCA stays in the host namespace: no in-use tolerance.
                    let health = health::evaluate(&c, false);
                    for n in 0..count {
                        let id = format!("{}-{n}", c.id);
                        ps.devices.insert(
                            id.clone(),
                            PoolDevice {
                                id,
                                candidate: c.clone(),
                                health: health.clone(),
                            },
                        );
                    }
                }
            }
        }
        Snapshot { pools, unassigned }
    }

    pub fn pool(&self, resource: &ResourceName) -> Option<&PoolSnapshot> {
        self.pools.iter().find(|p| &p.pool.resource == resource)
    }
}

impl PoolSnapshot {
    /// The ListAndWatch device list.
    pub fn api_devices(&self) -> Vec<api::Device> {
        self.devices
            .values()
            .map(|d| api::Device {
                id: d.id.clone(),
                health: if d.health.is_healthy() {
                    api::HEALTHY
                } else {
                    api::UNHEALTHY
                }
                .to_string(),
                topology: d.candidate.numa.map(|n| api::TopologyInfo {
                    nodes: vec![api::NumaNode { id: i64::from(n) }],
                }),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Format, parse};
    use crate::host_view::HostView;
    use crate::inventory::{Memory, candidates};

    #[test]
    fn shared_pool_gives_count_ids_per_hca_with_topology() {
        let (_dir, fx) = crate::testing::connectx_pair();
        let cfg = parse(
            "pools:\n- resourceName: hca\n  mode: shared\n  sharedCount: 3\n  selectors: {devices: [\"101d\"]}\n- resourceName: vf\n  selectors: {devices: [\"101e\"]}\n",
            Format::Yaml,
        )
        .unwrap();
        let c = candidates(&HostView::scan(&fx.root()), &mut Memory::default());
        let s = Snapshot::build(&cfg, c, &|_, _| false);
        let hca = s.pool(&cfg.pools[0].resource).unwrap();
        let ids: Vec<&str> = hca.devices.keys().map(String::as_str).collect();
        assert_eq!(
            ids,
            [
                "0000:3b:00.0-0",
                "0000:3b:00.0-1",
                "0000:3b:00.0-2",
                "0000:86:00.0-0",
                "0000:86:00.0-1",
                "0000:86:00.0-2"
            ]
        );
        let api = hca.api_devices();
        assert_eq!(api[0].health, "Healthy");
        assert_eq!(api[0].topology.as_ref().unwrap().nodes[0].id, 0);
        assert_eq!(api[5].topology.as_ref().unwrap().nodes[0].id, 1);
        assert_eq!(s.pool(&cfg.pools[1].resource).unwrap().devices.len(), 16);
        assert!(s.unassigned.is_empty());
    }

    #[test]
    fn in_use_vf_without_netdev_stays_healthy() {
        let (_dir, fx) = crate::testing::connectx_pair();
        fx.remove_netdev("ens1f0v0").unwrap();
        let cfg = parse(
            "pools:\n- resourceName: vf\n  selectors: {devices: [\"101e\"]}\n",
            Format::Yaml,
        )
        .unwrap();
        let view = HostView::scan(&fx.root());
        let c = candidates(&view, &mut Memory::default());
        let s = Snapshot::build(&cfg, c.clone(), &|_, _| false);
        let d = &s.pools[0].devices["0000:3b:00.2"];
        assert_eq!(d.health.reasons(), ["netdev ens1f0v0 is gone"]);
        let s = Snapshot::build(&cfg, c, &|r, id| {
            r.as_str() == "rdma/vf" && id == "0000:3b:00.2"
        });
        assert!(s.pools[0].devices["0000:3b:00.2"].health.is_healthy());
    }
}
