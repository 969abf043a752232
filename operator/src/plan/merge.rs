//! Merging every `RdmaNetwork` that selects a node into that node's one
//! desired `RdmaNodeState`, with conflict detection. A node with a conflict
//! keeps its last good state: the plan says so instead of producing a spec.

use super::device_plugin::{DevicePluginConfig, device_plugin_config};
use super::validate::{FieldError, validate_network};
use crate::crd::{
    Frontend, NetnsModeRequest, ObservedPf, PfConfig, RdmaNetworkSpec, RdmaNodeStateSpec,
    SoftDeviceGroup, VfGroup,
};
use sriov_helpers::{CpuList, PciAddress, PfSelector};
use std::collections::{BTreeMap, BTreeSet};

/// A network as listed from the API (deleted ones already left out).
#[derive(Debug, Clone)]
pub struct NetworkInput {
    pub name: String,
    pub spec: RdmaNetworkSpec,
}

/// A node as listed from the API, with the PF inventory its agent reported
/// (`None` until the agent has reported once).
#[derive(Debug, Clone)]
pub struct NodeInput {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub inventory: Option<Vec<ObservedPf>>,
}

/// Two networks that cannot both be applied to one node as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    pub node: String,
    /// Sorted; one entry when a single network cannot fit (e.g. too many VFs).
    pub networks: Vec<String>,
    pub message: String,
}

/// What the controller should do with a node's `RdmaNodeState` spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Desired {
    /// Write this spec.
    Spec(RdmaNodeStateSpec),
    /// Conflict: leave the current spec (the last good one) as it is.
    KeepLastGood,
    /// The agent has not reported the node's PFs yet and a PF network
    /// selects it: make sure the object exists (empty spec) so the agent can
    /// report, change nothing else.
    AwaitInventory,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePlan {
    pub node: String,
    /// Valid networks whose `nodeSelector` selects the node.
    pub selected: Vec<String>,
    /// Selected networks that found at least one PF on the node, and
    /// selected soft-device networks (their netdevs are the agent's to check).
    pub matched: Vec<String>,
    pub desired: Desired,
    pub conflicts: Vec<Conflict>,
    /// The device plugin's pools for this node (with `Desired::Spec` only).
    pub device_plugin: Option<DevicePluginConfig>,
}

#[derive(Debug, Clone, Default)]
pub struct ClusterPlan {
    pub nodes: Vec<NodePlan>,
    /// Networks left out of every node because their spec is invalid.
    pub invalid: BTreeMap<String, Vec<FieldError>>,
}

impl ClusterPlan {
    /// Nodes where `network` found PFs.
    pub fn matched_nodes(&self, network: &str) -> impl Iterator<Item = &NodePlan> {
        self.nodes
            .iter()
            .filter(move |n| n.matched.iter().any(|m| m == network))
    }
    /// Every conflict that names `network`.
    pub fn conflicts_of(&self, network: &str) -> impl Iterator<Item = &Conflict> {
        self.nodes
            .iter()
            .flat_map(|n| n.conflicts.iter())
            .filter(move |c| c.networks.iter().any(|m| m == network))
    }
}

/// A network with its selectors parsed once for all nodes.
#[derive(Debug)]
struct Prepared<'a> {
    name: &'a str,
    spec: &'a RdmaNetworkSpec,
    resource: String,
    vendor: Option<String>,
    device: Option<String>,
    pf_names: Vec<PfSelector>,
    root_devices: Vec<PciAddress>,
    /// `nicSelector.ifNames`: soft devices, never a PF claim.
    soft: bool,
}

impl<'a> Prepared<'a> {
    /// Valid specs only (validation has already parsed everything once).
    fn new(n: &'a NetworkInput) -> Prepared<'a> {
        Prepared {
            name: &n.name,
            spec: &n.spec,
            resource: n.spec.full_resource_name(&n.name),
            vendor: n
                .spec
                .nic_selector
                .vendor
                .as_deref()
                .map(str::to_ascii_lowercase),
            device: n
                .spec
                .nic_selector
                .device_id
                .as_deref()
                .map(str::to_ascii_lowercase),
            pf_names: n
                .spec
                .nic_selector
                .pf_names
                .iter()
                .filter_map(|p| p.parse().ok())
                .collect(),
            root_devices: n
                .spec
                .nic_selector
                .root_devices
                .iter()
                .filter_map(|p| p.parse().ok())
                .collect(),
            soft: n.spec.nic_selector.is_soft(),
        }
    }

    fn selects(&self, labels: &BTreeMap<String, String>) -> bool {
        selects(self.spec, labels)
    }

    /// The VFs of `pf` this network claims, or `None` if it does not match.
    fn claim(&self, pf: &ObservedPf) -> Option<BTreeSet<u32>> {
        if self.soft {
            return None;
        }
        if let Some(v) = &self.vendor
            && !pf.vendor.eq_ignore_ascii_case(v)
        {
            return None;
        }
        if let Some(d) = &self.device
            && !pf.device_id.eq_ignore_ascii_case(d)
        {
            return None;
        }
        if !self.root_devices.is_empty() {
            let addr = pf.pci_address.parse::<PciAddress>().ok()?;
            if !self.root_devices.contains(&addr) {
                return None;
            }
        }
        let all = || (0..self.spec.vf_count()).collect::<BTreeSet<u32>>();
        if self.pf_names.is_empty() {
            return Some(all());
        }
        let ifname = pf.if_name.as_deref()?;
        let mut vfs: Option<BTreeSet<u32>> = None;
        for sel in self.pf_names.iter().filter(|s| s.pf_name == ifname) {
            let set = sel.vfs.clone().unwrap_or_else(all);
            vfs.get_or_insert_with(BTreeSet::new).extend(set);
        }
        vfs
    }
}

/// One network's claim on one PF.
#[derive(Debug)]
struct Claim<'a> {
    net: &'a Prepared<'a>,
    vfs: BTreeSet<u32>,
}

fn pair(a: &str, b: &str) -> Vec<String> {
    let mut v = vec![a.to_string(), b.to_string()];
    v.sort();
    v
}

fn pf_label(pf: &ObservedPf) -> String {
    match &pf.if_name {
        Some(n) => format!("{n} ({})", pf.pci_address),
        None => pf.pci_address.clone(),
    }
}

/// Whether a network's node selector matches these node labels.
pub fn selects(spec: &RdmaNetworkSpec, labels: &BTreeMap<String, String>) -> bool {
    spec.node_selector
        .iter()
        .all(|(k, v)| labels.get(k) == Some(v))
}

/// Plans every node. Networks are taken in name order so the result never
/// depends on list order.
pub fn plan_cluster(nodes: &[NodeInput], networks: &[NetworkInput]) -> ClusterPlan {
    plan_cluster_with(nodes, networks, Pools::Planned)
}

/// [`plan_cluster`] without device plugin pools (`device_plugin` stays
/// None): for readers of selection, matches, specs and conflicts only. At
/// thousands of nodes the pools were most of a plan's memory.
pub fn plan_cluster_without_pools(nodes: &[NodeInput], networks: &[NetworkInput]) -> ClusterPlan {
    plan_cluster_with(nodes, networks, Pools::Skipped)
}

#[derive(Clone, Copy, PartialEq)]
enum Pools {
    Planned,
    Skipped,
}

fn plan_cluster_with(nodes: &[NodeInput], networks: &[NetworkInput], pools: Pools) -> ClusterPlan {
    let mut invalid = BTreeMap::new();
    let mut valid: Vec<&NetworkInput> = Vec::new();
    for n in networks {
        match validate_network(&n.name, &n.spec) {
            Ok(()) => valid.push(n),
            Err(e) => {
                invalid.insert(n.name.clone(), e);
            }
        }
    }
    valid.sort_by(|a, b| a.name.cmp(&b.name));
    let prepared: Vec<Prepared> = valid.into_iter().map(Prepared::new).collect();
    let nodes = nodes
        .iter()
        .map(|n| plan_prepared(n, &prepared, pools))
        .collect();
    ClusterPlan { nodes, invalid }
}

/// Plans one node against networks already known to be valid.
pub fn plan_node(node: &NodeInput, networks: &[NetworkInput]) -> NodePlan {
    let mut sorted: Vec<&NetworkInput> = networks.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    let prepared: Vec<Prepared> = sorted.into_iter().map(Prepared::new).collect();
    plan_prepared(node, &prepared, Pools::Planned)
}

fn plan_prepared(node: &NodeInput, networks: &[Prepared], pools: Pools) -> NodePlan {
    let selected: Vec<&Prepared> = networks
        .iter()
        .filter(|n| n.selects(&node.labels))
        .collect();
    let mut plan = NodePlan {
        node: node.name.clone(),
        selected: selected.iter().map(|n| n.name.to_string()).collect(),
        matched: Vec::new(),
        desired: Desired::AwaitInventory,
        conflicts: Vec::new(),
        device_plugin: None,
    };
    // Without the agent's report, PF networks cannot be matched; soft
    // networks (or none: an empty spec removes what earlier networks made)
    // need no inventory.
    let inventory: &[ObservedPf] = match &node.inventory {
        Some(i) => i,
        None if selected.iter().any(|n| !n.soft) => return plan,
        None => &[],
    };
    let mut pfs: Vec<&ObservedPf> = inventory.iter().collect();
    pfs.sort_by(|a, b| a.pci_address.cmp(&b.pci_address));
    let mut matched = BTreeSet::new();
    let mut configs = Vec::new();
    let mut resource_owner: BTreeMap<&str, &str> = BTreeMap::new();
    for pf in pfs {
        let claims: Vec<Claim> = selected
            .iter()
            .filter_map(|n| n.claim(pf).map(|vfs| Claim { net: n, vfs }))
            .collect();
        if claims.is_empty() {
            continue;
        }
        for c in &claims {
            matched.insert(c.net.name.to_string());
        }
        let before = plan.conflicts.len();
        check_claims(&node.name, pf, &claims, &mut plan.conflicts);
        for c in &claims {
            match resource_owner.get(c.net.resource.as_str()) {
                Some(owner) if *owner != c.net.name => plan.conflicts.push(Conflict {
                    node: node.name.clone(),
                    networks: pair(owner, c.net.name),
                    message: format!(
                        "networks {owner} and {} both advertise {} on node {}",
                        c.net.name, c.net.resource, node.name
                    ),
                }),
                _ => {
                    resource_owner.insert(&c.net.resource, c.net.name);
                }
            }
        }
        if plan.conflicts.len() == before {
            configs.push(pf_config(pf, &claims));
        }
    }
    let soft_devices = soft_groups(
        &node.name,
        &selected,
        &mut resource_owner,
        &mut plan.conflicts,
    );
    for g in &soft_devices {
        matched.insert(g.network.clone());
    }
    plan.matched = matched.into_iter().collect();
    if !plan.conflicts.is_empty() {
        plan.conflicts.dedup();
        plan.desired = Desired::KeepLastGood;
        return plan;
    }
    // The netns mode is the host's, not a PF's: each network that has
    // devices here says what it needs; the agent judges disagreement (it
    // names both networks in its Degraded condition and writes nothing).
    let rdma_netns_modes = selected
        .iter()
        .filter(|n| {
            !n.spec.rdma_netns_mode.is_unmanaged() && plan.matched.iter().any(|m| m == n.name)
        })
        .map(|n| NetnsModeRequest {
            network: n.name.to_string(),
            mode: n.spec.rdma_netns_mode,
        })
        .collect();
    let spec = RdmaNodeStateSpec {
        node_name: node.name.clone(),
        pfs: configs,
        soft_devices,
        rdma_netns_modes,
    };
    if pools == Pools::Skipped {
        plan.desired = Desired::Spec(spec);
        return plan;
    }
    let memlock: BTreeMap<&str, Option<&str>> = selected
        .iter()
        .map(|n| (n.name, n.spec.memlock.as_deref()))
        .collect();
    let mut dp = device_plugin_config(&spec, inventory, &memlock);
    // A `frontend: dra` network's VFs are configured the same, but the DRA
    // plugin offers them (through the network's DeviceClass): no pool.
    let dra: BTreeSet<&str> = selected
        .iter()
        .filter(|n| n.spec.frontend == Frontend::Dra)
        .map(|n| n.resource.as_str())
        .collect();
    dp.pools.retain(|p| !dra.contains(p.resource_name.as_str()));
    plan.device_plugin = Some(dp);
    plan.desired = Desired::Spec(spec);
    plan
}

/// The soft-device groups of the selected `ifNames` networks; a netdev
/// named by two networks, or a resource name another network already
/// advertises on the node, is a conflict naming both.
fn soft_groups<'a>(
    node: &str,
    selected: &[&'a Prepared<'a>],
    resource_owner: &mut BTreeMap<&'a str, &'a str>,
    conflicts: &mut Vec<Conflict>,
) -> Vec<SoftDeviceGroup> {
    let mut groups = Vec::new();
    let mut netdev_owner: BTreeMap<&str, &str> = BTreeMap::new();
    for n in selected.iter().filter(|n| n.soft) {
        for ifname in &n.spec.nic_selector.if_names {
            match netdev_owner.get(ifname.as_str()) {
                Some(owner) => conflicts.push(Conflict {
                    node: node.to_string(),
                    networks: pair(owner, n.name),
                    message: format!(
                        "networks {owner} and {} both select soft device netdev {ifname} on node {node}",
                        n.name
                    ),
                }),
                None => {
                    netdev_owner.insert(ifname, n.name);
                }
            }
        }
        match resource_owner.get(n.resource.as_str()) {
            Some(owner) if *owner != n.name => conflicts.push(Conflict {
                node: node.to_string(),
                networks: pair(owner, n.name),
                message: format!(
                    "networks {owner} and {} both advertise {} on node {node}",
                    n.name, n.resource
                ),
            }),
            _ => {
                resource_owner.insert(&n.resource, n.name);
            }
        }
        groups.push(SoftDeviceGroup {
            network: n.name.to_string(),
            resource_name: n.resource.clone(),
            if_names: n.spec.nic_selector.if_names.clone(),
        });
    }
    groups
}

/// Same PF, different `numVfs`; overlapping VF ranges; VFs beyond what the
/// PF supports; different IRQ or QoS settings for one PF.
fn check_claims(node: &str, pf: &ObservedPf, claims: &[Claim], out: &mut Vec<Conflict>) {
    let label = pf_label(pf);
    for c in claims {
        if c.net.spec.vf_count() > pf.total_vfs {
            out.push(Conflict {
                node: node.to_string(),
                networks: vec![c.net.name.to_string()],
                message: format!(
                    "network {} asks {} VFs on PF {label} of node {node}, which supports {}",
                    c.net.name,
                    c.net.spec.vf_count(),
                    pf.total_vfs
                ),
            });
        }
    }
    for (i, a) in claims.iter().enumerate() {
        for b in &claims[i + 1..] {
            let (an, bn) = (a.net.name, b.net.name);
            if a.net.spec.vf_count() != b.net.spec.vf_count() {
                out.push(Conflict {
                    node: node.to_string(),
                    networks: pair(an, bn),
                    message: format!(
                        "networks {an} and {bn} both claim PF {label} on node {node} with different numVfs ({} vs {})",
                        a.net.spec.vf_count(),
                        b.net.spec.vf_count()
                    ),
                });
                continue;
            }
            let common: Vec<u32> = a.vfs.intersection(&b.vfs).copied().collect();
            if !common.is_empty() {
                out.push(Conflict {
                    node: node.to_string(),
                    networks: pair(an, bn),
                    message: format!(
                        "networks {an} and {bn} both claim VFs {} of PF {label} on node {node}; give them disjoint ranges (pfNames: {}#0-3 and {}#4-7)",
                        CpuList::from_cpus(common),
                        pf.if_name.as_deref().unwrap_or("pf"),
                        pf.if_name.as_deref().unwrap_or("pf"),
                    ),
                });
            }
            if a.net.spec.irq_affinity != b.net.spec.irq_affinity {
                out.push(Conflict {
                    node: node.to_string(),
                    networks: pair(an, bn),
                    message: format!(
                        "networks {an} and {bn} share PF {label} on node {node} but ask for different irqAffinity"
                    ),
                });
            }
            if a.net.spec.qos.is_some()
                && b.net.spec.qos.is_some()
                && a.net.spec.qos != b.net.spec.qos
            {
                out.push(Conflict {
                    node: node.to_string(),
                    networks: pair(an, bn),
                    message: format!(
                        "networks {an} and {bn} share PF {label} on node {node} but ask for different qos"
                    ),
                });
            }
        }
    }
}

fn pf_config(pf: &ObservedPf, claims: &[Claim]) -> PfConfig {
    let mut groups: Vec<VfGroup> = claims
        .iter()
        .map(|c| VfGroup {
            network: c.net.name.to_string(),
            resource_name: c.net.resource.clone(),
            vf_range: CpuList::from_cpus(c.vfs.iter().copied()).to_string(),
            mtu: c.net.spec.mtu,
        })
        .collect();
    groups.sort_by(|a, b| a.network.cmp(&b.network));
    let first = &claims[0].net.spec;
    PfConfig {
        pci_address: pf.pci_address.clone(),
        if_name: pf.if_name.clone().unwrap_or_default(),
        num_vfs: first.vf_count(),
        mtu: claims.iter().filter_map(|c| c.net.spec.mtu).max(),
        vf_groups: groups,
        irq_affinity: first.irq_affinity.clone(),
        qos: claims.iter().find_map(|c| c.net.spec.qos.clone()),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::crd::NicSelector;

    pub(crate) fn inventory_pf(addr: &str, ifname: &str) -> ObservedPf {
        ObservedPf {
            pci_address: addr.into(),
            if_name: Some(ifname.into()),
            vendor: "15b3".into(),
            device_id: "101d".into(),
            total_vfs: 127,
            ..Default::default()
        }
    }

    pub(crate) fn node(name: &str, labels: &[(&str, &str)]) -> NodeInput {
        NodeInput {
            name: name.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            inventory: Some(vec![
                inventory_pf("0000:3b:00.0", "ens1f0"),
                inventory_pf("0000:86:00.0", "ens2f0"),
            ]),
        }
    }

    pub(crate) fn net(name: &str, pf_names: &[&str], num_vfs: u32) -> NetworkInput {
        let spec: RdmaNetworkSpec = serde_json::from_value(serde_json::json!({
            "nicSelector": {"pfNames": pf_names},
            "numVfs": num_vfs,
            "mtu": 9000,
        }))
        .unwrap();
        NetworkInput {
            name: name.into(),
            spec,
        }
    }

    fn spec_of(p: &NodePlan) -> &RdmaNodeStateSpec {
        match &p.desired {
            Desired::Spec(s) => s,
            other => panic!("expected a spec, got {other:?}"),
        }
    }

    #[test]
    fn two_networks_on_disjoint_ranges_of_one_pf_merge() {
        let nets = [
            net("alpha", &["ens1f0#0-3"], 8),
            net("beta", &["ens1f0#4-7", "ens2f0"], 8),
        ];
        let p = plan_node(&node("n1", &[]), &nets);
        assert!(p.conflicts.is_empty(), "{:?}", p.conflicts);
        let s = spec_of(&p);
        assert_eq!(s.pfs.len(), 2);
        let pf0 = &s.pfs[0];
        assert_eq!(pf0.pci_address, "0000:3b:00.0");
        assert_eq!(pf0.num_vfs, 8);
        let ranges: Vec<(&str, &str)> = pf0
            .vf_groups
            .iter()
            .map(|g| (g.network.as_str(), g.vf_range.as_str()))
            .collect();
        assert_eq!(ranges, [("alpha", "0-3"), ("beta", "4-7")]);
        assert_eq!(s.pfs[1].vf_groups[0].vf_range, "0-7");
        assert_eq!(p.matched, ["alpha", "beta"]);
    }

    /// The node spec lists each matched network's `rdmaNetnsMode` (not
    /// `unmanaged`, not networks without devices here), in name order;
    /// disagreement is the agent's to report, so it is carried as it is.
    #[test]
    fn netns_modes_fold_per_matched_network() {
        use crate::crd::RdmaNetnsModeSetting as M;
        let with = |name: &str, pf: &str, mode: M| {
            let mut n = net(name, &[pf], 8);
            n.spec.rdma_netns_mode = mode;
            n
        };
        let modes = |nets: &[NetworkInput]| -> Vec<(String, M)> {
            spec_of(&plan_node(&node("n1", &[]), nets))
                .rdma_netns_modes
                .iter()
                .map(|r| (r.network.clone(), r.mode))
                .collect()
        };
        type Case = (Vec<NetworkInput>, Vec<(&'static str, M)>);
        let table: Vec<Case> = vec![
            (vec![net("a", &["ens1f0"], 8)], vec![]),
            (vec![with("a", "ens1f0", M::Unmanaged)], vec![]),
            (
                vec![with("a", "ens1f0", M::Exclusive)],
                vec![("a", M::Exclusive)],
            ),
            (
                vec![
                    with("b", "ens2f0", M::Shared),
                    with("a", "ens1f0", M::Exclusive),
                ],
                vec![("a", M::Exclusive), ("b", M::Shared)],
            ),
            // No PF of this node: its mode does not bind the node.
            (vec![with("a", "ens9f0", M::Exclusive)], vec![]),
        ];
        for (nets, want) in table {
            let want: Vec<(String, M)> =
                want.into_iter().map(|(n, m)| (n.to_string(), m)).collect();
            assert_eq!(modes(&nets), want);
        }
        // The field round-trips under its CRD name; unmanaged is omitted.
        let n = with("a", "ens1f0", M::Exclusive);
        let v = serde_json::to_value(&n.spec).unwrap();
        assert_eq!(v["rdmaNetnsMode"], "exclusive");
        let v = serde_json::to_value(&net("a", &["ens1f0"], 8).spec).unwrap();
        assert!(v.get("rdmaNetnsMode").is_none(), "{v}");
    }

    #[test]
    fn different_num_vfs_on_one_pf_is_a_conflict_naming_both() {
        let nets = [net("alpha", &["ens1f0"], 8), net("beta", &["ens1f0"], 16)];
        let p = plan_node(&node("n1", &[]), &nets);
        assert_eq!(p.desired, Desired::KeepLastGood);
        assert_eq!(p.device_plugin, None);
        assert_eq!(p.conflicts.len(), 1);
        let c = &p.conflicts[0];
        assert_eq!(c.networks, ["alpha", "beta"]);
        assert!(c.message.contains("alpha") && c.message.contains("beta"));
        assert!(c.message.contains("8 vs 16"), "{}", c.message);
        assert!(c.message.contains("ens1f0 (0000:3b:00.0)"), "{}", c.message);
    }

    #[test]
    fn overlapping_ranges_are_a_conflict_naming_the_vfs() {
        let nets = [
            net("alpha", &["ens1f0#0-4"], 8),
            net("beta", &["ens1f0#3-7"], 8),
        ];
        let p = plan_node(&node("n1", &[]), &nets);
        assert_eq!(p.desired, Desired::KeepLastGood);
        assert!(
            p.conflicts[0].message.contains("VFs 3-4"),
            "{:?}",
            p.conflicts
        );
        // Whole-PF claims by two networks overlap too.
        let nets = [net("alpha", &["ens1f0"], 8), net("beta", &["ens1f0"], 8)];
        let p = plan_node(&node("n1", &[]), &nets);
        assert!(p.conflicts[0].message.contains("VFs 0-7"));
    }

    #[test]
    fn node_selector_and_nic_selector_filter() {
        let mut a = net("alpha", &["ens1f0"], 4);
        a.spec.node_selector.insert("rdma".into(), "yes".into());
        let mut b = net("beta", &[], 4);
        b.spec.nic_selector = NicSelector {
            vendor: Some("15B3".into()),
            device_id: Some("101d".into()),
            root_devices: vec!["0000:86:00.0".into()],
            ..Default::default()
        };
        let plain = plan_node(&node("n1", &[]), &[a.clone(), b.clone()]);
        assert_eq!(plain.selected, ["beta"]);
        let s = spec_of(&plain);
        assert_eq!(s.pfs.len(), 1);
        assert_eq!(s.pfs[0].if_name, "ens2f0");
        let labelled = plan_node(&node("n2", &[("rdma", "yes")]), &[a, b]);
        assert_eq!(labelled.matched, ["alpha", "beta"]);
        assert_eq!(spec_of(&labelled).pfs.len(), 2);
    }

    #[test]
    fn too_many_vfs_for_the_pf_keeps_last_good() {
        let mut inv = node("n1", &[]);
        if let Some(i) = inv.inventory.as_mut() {
            i[0].total_vfs = 4;
        }
        let p = plan_node(&inv, &[net("alpha", &["ens1f0"], 8)]);
        assert_eq!(p.desired, Desired::KeepLastGood);
        assert!(p.conflicts[0].message.contains("supports 4"));
    }

    #[test]
    fn same_resource_name_from_two_networks_conflicts() {
        let mut a = net("alpha", &["ens1f0"], 4);
        let mut b = net("beta", &["ens2f0"], 4);
        a.spec.resource_name = Some("vf".into());
        b.spec.resource_name = Some("vf".into());
        let p = plan_node(&node("n1", &[]), &[a, b]);
        assert_eq!(p.desired, Desired::KeepLastGood);
        assert!(p.conflicts[0].message.contains("rdma/vf"));
    }

    #[test]
    fn unknown_inventory_waits_and_unselected_node_gets_empty_spec() {
        let mut n = node("n1", &[]);
        n.inventory = None;
        let p = plan_node(&n, &[net("alpha", &["ens1f0"], 4)]);
        assert_eq!(p.desired, Desired::AwaitInventory);
        let p = plan_node(&n, &[]);
        assert_eq!(
            p.desired,
            Desired::Spec(RdmaNodeStateSpec {
                node_name: "n1".into(),
                ..Default::default()
            })
        );
    }

    fn soft_net(name: &str, if_names: &[&str]) -> NetworkInput {
        NetworkInput {
            name: name.into(),
            spec: serde_json::from_value(serde_json::json!({
                "nicSelector": {"ifNames": if_names},
            }))
            .unwrap(),
        }
    }

    #[test]
    fn soft_and_sriov_networks_share_a_node() {
        let nets = [
            net("fast", &["ens1f0#0-3"], 8),
            soft_net("rxe", &["kvf0", "kvf1"]),
        ];
        let p = plan_node(&node("n1", &[]), &nets);
        assert!(p.conflicts.is_empty(), "{:?}", p.conflicts);
        assert_eq!(p.matched, ["fast", "rxe"]);
        let s = spec_of(&p);
        assert_eq!(s.pfs.len(), 1, "the soft network claims no PF");
        assert_eq!(s.pfs[0].vf_groups.len(), 1);
        assert_eq!(
            s.soft_devices,
            [SoftDeviceGroup {
                network: "rxe".into(),
                resource_name: "rdma/rxe".into(),
                if_names: vec!["kvf0".into(), "kvf1".into()],
            }]
        );
        let pools = p.device_plugin.unwrap().pools;
        let sel: Vec<(&str, &[String], &[String])> = pools
            .iter()
            .map(|p| {
                (
                    p.resource_name.as_str(),
                    &p.selectors.pf_names[..],
                    &p.selectors.if_names[..],
                )
            })
            .collect();
        assert_eq!(
            sel,
            [
                ("rdma/fast", &["ens1f0#0-3".to_string()][..], &[][..]),
                (
                    "rdma/rxe",
                    &[][..],
                    &["kvf0".to_string(), "kvf1".to_string()][..]
                ),
            ]
        );
    }

    #[test]
    fn dra_network_vfs_are_configured_but_get_no_device_plugin_pool() {
        let mut dra = net("dra", &["ens1f0#4-7"], 8);
        dra.spec.frontend = Frontend::Dra;
        let nets = [net("fast", &["ens1f0#0-3"], 8), dra];
        let p = plan_node(&node("n1", &[]), &nets);
        assert!(p.conflicts.is_empty(), "{:?}", p.conflicts);
        let groups: Vec<(&str, &str)> = spec_of(&p).pfs[0]
            .vf_groups
            .iter()
            .map(|g| (g.network.as_str(), g.vf_range.as_str()))
            .collect();
        assert_eq!(groups, [("dra", "4-7"), ("fast", "0-3")]);
        let pools: Vec<String> = p
            .device_plugin
            .unwrap()
            .pools
            .into_iter()
            .map(|p| p.resource_name)
            .collect();
        assert_eq!(pools, ["rdma/fast"]);
    }

    #[test]
    fn a_plan_without_pools_differs_only_in_the_pools() {
        let nets = [
            net("fast", &["ens1f0#0-3"], 8),
            net("bulk", &["ens1f0#4-7"], 8),
        ];
        let nodes = [node("n1", &[]), node("n2", &[])];
        let full = plan_cluster(&nodes, &nets);
        let lean = plan_cluster_without_pools(&nodes, &nets);
        assert!(full.nodes.iter().all(|n| n.device_plugin.is_some()));
        assert!(lean.nodes.iter().all(|n| n.device_plugin.is_none()));
        let without = |p: &ClusterPlan| {
            p.nodes
                .iter()
                .cloned()
                .map(|mut n| {
                    n.device_plugin = None;
                    n
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(without(&full), lean.nodes);
        assert_eq!(full.invalid, lean.invalid);
    }

    #[test]
    fn soft_networks_conflict_on_a_netdev_or_a_resource_name() {
        let p = plan_node(
            &node("n1", &[]),
            &[soft_net("a", &["kvf0", "kvf1"]), soft_net("b", &["kvf1"])],
        );
        assert_eq!(p.desired, Desired::KeepLastGood);
        assert_eq!(p.conflicts[0].networks, ["a", "b"]);
        assert!(p.conflicts[0].message.contains("kvf1"), "{:?}", p.conflicts);
        let mut rxe = soft_net("rxe", &["kvf0"]);
        rxe.spec.resource_name = Some("fast".into());
        let p = plan_node(&node("n1", &[]), &[net("fast", &["ens1f0"], 8), rxe]);
        assert_eq!(p.desired, Desired::KeepLastGood);
        assert!(
            p.conflicts[0].message.contains("rdma/fast"),
            "{:?}",
            p.conflicts
        );
    }

    #[test]
    fn soft_networks_need_no_inventory_but_pf_networks_still_wait_for_it() {
        let mut n = node("kind-worker", &[]);
        n.inventory = None;
        let p = plan_node(&n, &[soft_net("rxe", &["kvf0"])]);
        assert_eq!(spec_of(&p).soft_devices.len(), 1);
        let p = plan_node(
            &n,
            &[soft_net("rxe", &["kvf0"]), net("fast", &["ens1f0"], 8)],
        );
        assert_eq!(p.desired, Desired::AwaitInventory);
        // A node whose agent reported no SR-IOV PF at all.
        n.inventory = Some(vec![]);
        let p = plan_node(
            &n,
            &[soft_net("rxe", &["kvf0"]), net("fast", &["ens1f0"], 8)],
        );
        assert_eq!(p.matched, ["rxe"]);
        assert_eq!(spec_of(&p).soft_devices.len(), 1);
    }

    #[test]
    fn cluster_plan_leaves_invalid_networks_out_and_is_order_independent() {
        let mut bad = net("broken", &["ens2f0"], 4);
        bad.spec.nic_selector.pf_names = vec!["ens2f0#9".into()];
        let nodes = [node("n1", &[]), node("n2", &[])];
        let nets = vec![
            net("beta", &["ens1f0#4-7"], 8),
            bad,
            net("alpha", &["ens1f0#0-3"], 8),
        ];
        let p1 = plan_cluster(&nodes, &nets);
        let mut rev = nets.clone();
        rev.reverse();
        let p2 = plan_cluster(&nodes, &rev);
        assert_eq!(p1.nodes, p2.nodes);
        assert!(p1.invalid.contains_key("broken"));
        assert_eq!(p1.matched_nodes("alpha").count(), 2);
        assert_eq!(p1.matched_nodes("broken").count(), 0);
    }
}
