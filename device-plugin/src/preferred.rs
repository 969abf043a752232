//! GetPreferredAllocation: from the available devices, pick `size` that
//! include every must-include.
//!
//! - [`Strategy::Pack`] (VFs): on the fewest NUMA nodes, then on the fewest
//!   PFs.
//! - [`Strategy::Spread`] (shares of shared HCAs, where `rdma/hca: 2` means
//!   two HCAs to a user): on the most HCAs, then on the fewest NUMA nodes,
//!   then as evenly as possible. When the Topology Manager demands one NUMA
//!   node the kubelet offers only that node's devices, so spreading never
//!   breaks its alignment.
//!
//! The answer depends only on the sets given, not on their order, and ties
//! go to the lowest IDs.

use std::collections::{BTreeMap, BTreeSet};

/// Where a device sits. `numa: None` (unknown) counts as a node of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    pub numa: Option<u32>,
    /// The PF/HCA the device belongs to.
    pub group: String,
}

/// How to choose among the available devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// Fewest NUMA nodes, then fewest groups (PFs): VFs of one PF share its
    /// switch and link.
    Pack,
    /// Most groups (HCAs), then fewest NUMA nodes, then the fewest shares on
    /// any one HCA: shares of one HCA share everything, so a request for two
    /// is a request for two HCAs.
    Spread,
}

impl Strategy {
    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::Pack => "pack",
            Strategy::Spread => "spread",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PreferredError {
    #[error("allocation size {0} is negative")]
    NegativeSize(i64),
    #[error("must-include device {0:?} is not among the available devices")]
    MustIncludeUnavailable(String),
    #[error("allocation size {size} is smaller than the {must} must-include devices")]
    SizeBelowMustInclude { size: usize, must: usize },
    #[error("allocation size {size} is more than the {available} available devices")]
    NotEnough { size: usize, available: usize },
}

/// Above this many NUMA nodes to choose from, choose greedily instead of
/// trying every combination.
const EXACT_NODE_LIMIT: usize = 12;

/// How good a pick is, lower is better: (PFs, 0) for pack; (MAX - HCAs,
/// most shares on one HCA) for spread.
type Score = (usize, usize);

/// Node sort key: known nodes by id first, unknown last.
type NodeKey = (bool, u32);

fn node_key(n: Option<u32>) -> NodeKey {
    (n.is_none(), n.unwrap_or(0))
}

pub fn preferred(
    available: &[String],
    must_include: &[String],
    size: i64,
    topology: &dyn Fn(&str) -> Topology,
    strategy: Strategy,
) -> Result<Vec<String>, PreferredError> {
    let size = usize::try_from(size).map_err(|_| PreferredError::NegativeSize(size))?;
    let avail: BTreeSet<&str> = available.iter().map(String::as_str).collect();
    let must: BTreeSet<&str> = must_include.iter().map(String::as_str).collect();
    if let Some(m) = must.iter().find(|m| !avail.contains(*m)) {
        return Err(PreferredError::MustIncludeUnavailable((*m).to_string()));
    }
    if size < must.len() {
        return Err(PreferredError::SizeBelowMustInclude {
            size,
            must: must.len(),
        });
    }
    if size > avail.len() {
        return Err(PreferredError::NotEnough {
            size,
            available: avail.len(),
        });
    }
    let need = size - must.len();
    let topo: BTreeMap<&str, Topology> = avail.iter().map(|id| (*id, topology(id))).collect();
    let must_nodes: BTreeSet<NodeKey> = must.iter().map(|m| node_key(topo[m].numa)).collect();
    let must_groups: BTreeSet<&str> = must.iter().map(|m| topo[m].group.as_str()).collect();
    // Candidates per node, in ID order.
    let mut by_node: BTreeMap<NodeKey, Vec<&str>> = BTreeMap::new();
    for id in avail.iter().filter(|id| !must.contains(*id)) {
        by_node.entry(node_key(topo[id].numa)).or_default().push(id);
    }
    // What a node offers: devices (pack), or HCAs not yet used by a
    // must-include (spread: every such HCA on a node is one more HCA).
    let offer = |ids: &Vec<&str>| -> usize {
        match strategy {
            Strategy::Pack => ids.len(),
            Strategy::Spread => ids
                .iter()
                .map(|id| topo[id].group.as_str())
                .filter(|g| !must_groups.contains(g))
                .collect::<BTreeSet<&str>>()
                .len(),
        }
    };
    let target = match strategy {
        Strategy::Pack => need,
        // As many new HCAs as the request and the host allow.
        Strategy::Spread => need.min(by_node.values().map(offer).sum()),
    };
    let free: usize = must_nodes
        .iter()
        .filter_map(|n| by_node.get(n))
        .map(offer)
        .sum();
    let others: Vec<(NodeKey, usize)> = by_node
        .iter()
        .filter(|(n, _)| !must_nodes.contains(*n))
        .map(|(n, v)| (*n, offer(v)))
        .collect();
    let extra_sets = minimal_node_sets(&others, target.saturating_sub(free));
    // Among node sets of minimal size, the one whose picks score best.
    let mut best: Option<(Score, Vec<NodeKey>, Vec<&str>)> = None;
    for extra in extra_sets {
        let pool: Vec<&str> = by_node
            .iter()
            .filter(|(n, _)| must_nodes.contains(*n) || extra.contains(*n))
            .flat_map(|(_, v)| v.iter().copied())
            .collect();
        let (score, picked) = match strategy {
            Strategy::Pack => {
                let (groups, picked) = pack_groups(&pool, need, &must_groups, &topo);
                ((groups, 0), picked)
            }
            Strategy::Spread => spread_groups(&pool, need, &must, &topo),
        };
        let better = match &best {
            None => true,
            Some((sc, e, _)) => (score, &extra) < (*sc, e),
        };
        if better {
            best = Some((score, extra, picked));
        }
    }
    let mut out: Vec<String> = must.iter().map(|s| s.to_string()).collect();
    if let Some((_, _, picked)) = best {
        out.extend(picked.into_iter().map(str::to_string));
    }
    out.sort();
    Ok(out)
}

/// Every smallest set of nodes (sorted keys) whose candidate counts reach
/// `need`; `[[]]` when nothing extra is needed.
fn minimal_node_sets(nodes: &[(NodeKey, usize)], need: usize) -> Vec<Vec<NodeKey>> {
    if need == 0 {
        return vec![Vec::new()];
    }
    // Biggest nodes first: the fewest nodes that can reach `need`.
    let mut sorted: Vec<(NodeKey, usize)> = nodes.to_vec();
    sorted.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut sum = 0;
    let mut j = 0;
    for (_, c) in &sorted {
        if sum >= need {
            break;
        }
        sum += c;
        j += 1;
    }
    if nodes.len() > EXACT_NODE_LIMIT {
        let mut greedy: Vec<NodeKey> = sorted.iter().take(j).map(|(n, _)| *n).collect();
        greedy.sort();
        return vec![greedy];
    }
    let mut out = Vec::new();
    let mut chosen = Vec::new();
    combinations(nodes, j, 0, need, &mut chosen, &mut out);
    out
}

fn combinations(
    nodes: &[(NodeKey, usize)],
    left: usize,
    start: usize,
    need: usize,
    chosen: &mut Vec<(NodeKey, usize)>,
    out: &mut Vec<Vec<NodeKey>>,
) {
    if left == 0 {
        if chosen.iter().map(|(_, c)| c).sum::<usize>() >= need {
            let mut keys: Vec<NodeKey> = chosen.iter().map(|(n, _)| *n).collect();
            keys.sort();
            out.push(keys);
        }
        return;
    }
    for i in start..nodes.len() {
        chosen.push(nodes[i]);
        combinations(nodes, left - 1, i + 1, need, chosen, out);
        chosen.pop();
    }
}

/// Picks `need` devices from `pool` on the fewest PFs: the must-include PFs
/// cost nothing, then the biggest PFs first. Returns (PFs used, picks).
fn pack_groups<'a>(
    pool: &[&'a str],
    need: usize,
    must_groups: &BTreeSet<&str>,
    topo: &BTreeMap<&str, Topology>,
) -> (usize, Vec<&'a str>) {
    let mut groups: BTreeMap<&str, Vec<&'a str>> = BTreeMap::new();
    for id in pool {
        groups.entry(topo[id].group.as_str()).or_default().push(id);
    }
    let mut order: Vec<(&str, Vec<&'a str>)> = groups.into_iter().collect();
    order.sort_by(|a, b| {
        let free = |g: &str| !must_groups.contains(g);
        free(a.0)
            .cmp(&free(b.0))
            .then(b.1.len().cmp(&a.1.len()))
            .then(a.0.cmp(b.0))
    });
    let mut picked = Vec::with_capacity(need);
    let mut used: BTreeSet<&str> = must_groups.clone();
    for (g, mut ids) in order {
        if picked.len() >= need {
            break;
        }
        ids.sort();
        used.insert(g);
        picked.extend(ids.into_iter().take(need - picked.len()));
    }
    (used.len(), picked)
}

/// Picks `need` devices from `pool` spread over the most groups, evenly:
/// each pick goes to the group holding the fewest so far (must-includes
/// count), lowest group and ID on ties. This water-filling reaches both the
/// most groups and the lowest maximum per group. Returns ((usize::MAX -
/// groups used, most in one group), picks): lower is better.
fn spread_groups<'a>(
    pool: &[&'a str],
    need: usize,
    must: &BTreeSet<&str>,
    topo: &BTreeMap<&str, Topology>,
) -> (Score, Vec<&'a str>) {
    let mut free: BTreeMap<&str, Vec<&'a str>> = BTreeMap::new();
    for id in pool {
        free.entry(topo[id].group.as_str()).or_default().push(id);
    }
    for ids in free.values_mut() {
        // Taken from the back: lowest ID first.
        ids.sort_by(|a, b| b.cmp(a));
    }
    let mut held: BTreeMap<&str, usize> = BTreeMap::new();
    for m in must {
        *held.entry(topo[m].group.as_str()).or_default() += 1;
    }
    let mut picked = Vec::with_capacity(need);
    while picked.len() < need {
        let next = free
            .iter()
            .filter(|(_, ids)| !ids.is_empty())
            .min_by_key(|(g, _)| (held.get(*g).copied().unwrap_or(0), **g))
            .map(|(g, _)| *g);
        let Some(g) = next else { break };
        if let Some(id) = free.get_mut(g).and_then(Vec::pop) {
            picked.push(id);
            *held.entry(g).or_default() += 1;
        }
    }
    let most = held.values().copied().max().unwrap_or(0);
    ((usize::MAX - held.len(), most), picked)
}

#[cfg(test)]
mod tests {
    use super::Strategy as Pick;
    use super::*;
    use proptest::prelude::*;
    // The enum above and proptest's trait share a name; in here it is the trait.
    use proptest::strategy::Strategy;

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    /// id "n<numa>g<group>-<i>"; numa "x" means unknown.
    fn topo_of(id: &str) -> Topology {
        let numa = id[1..2].parse().ok();
        Topology {
            numa,
            group: id[..4].to_string(),
        }
    }

    #[test]
    fn packs_on_one_numa_then_one_pf() {
        let avail = ids(&[
            "n0g0-0", "n0g1-0", "n0g1-1", "n1g2-0", "n1g2-1", "n1g2-2", "n1g3-0",
        ]);
        // Two fit on NUMA 0 (g1) and on NUMA 1 (g2): NUMA 0 comes first by id,
        // but both need one PF; the tie goes to the lower node.
        assert_eq!(
            preferred(&avail, &[], 2, &topo_of, Pick::Pack).unwrap(),
            ids(&["n0g1-0", "n0g1-1"])
        );
        // Three only fit on NUMA 1, and on a single PF there.
        assert_eq!(
            preferred(&avail, &[], 3, &topo_of, Pick::Pack).unwrap(),
            ids(&["n1g2-0", "n1g2-1", "n1g2-2"])
        );
        // A must-include on NUMA 0 pulls the rest there.
        assert_eq!(
            preferred(&avail, &ids(&["n0g0-0"]), 3, &topo_of, Pick::Pack).unwrap(),
            ids(&["n0g0-0", "n0g1-0", "n0g1-1"])
        );
    }

    #[test]
    fn prefers_node_set_with_fewer_pfs() {
        // Both nodes hold 4, NUMA 0 over two PFs, NUMA 1 on one.
        let avail = ids(&[
            "n0g0-0", "n0g0-1", "n0g1-0", "n0g1-1", "n1g2-0", "n1g2-1", "n1g2-2", "n1g2-3",
        ]);
        assert_eq!(
            preferred(&avail, &[], 4, &topo_of, Pick::Pack).unwrap(),
            ids(&["n1g2-0", "n1g2-1", "n1g2-2", "n1g2-3"])
        );
    }

    #[test]
    fn bad_requests_are_named() {
        let avail = ids(&["n0g0-0", "n0g0-1"]);
        assert_eq!(
            preferred(&avail, &ids(&["n9g9-9"]), 1, &topo_of, Pick::Pack).unwrap_err(),
            PreferredError::MustIncludeUnavailable("n9g9-9".into())
        );
        assert!(matches!(
            preferred(&avail, &[], 3, &topo_of, Pick::Pack),
            Err(PreferredError::NotEnough {
                size: 3,
                available: 2
            })
        ));
        assert!(matches!(
            preferred(&avail, &avail, 1, &topo_of, Pick::Pack),
            Err(PreferredError::SizeBelowMustInclude { .. })
        ));
        assert!(preferred(&avail, &[], -1, &topo_of, Pick::Pack).is_err());
    }

    /// What a strategy minimises over a selection: (NUMA nodes, PFs) for
    /// pack; (MAX - HCAs, NUMA nodes, most shares on one HCA) for spread.
    fn cost(sel: &[String], how: Pick) -> (usize, usize, usize) {
        let t: Vec<Topology> = sel.iter().map(|s| topo_of(s)).collect();
        let nodes: BTreeSet<Option<u32>> = t.iter().map(|t| t.numa).collect();
        let mut groups: BTreeMap<&str, usize> = BTreeMap::new();
        for x in &t {
            *groups.entry(x.group.as_str()).or_default() += 1;
        }
        match how {
            Pick::Pack => (nodes.len(), groups.len(), 0),
            Pick::Spread => (
                usize::MAX - groups.len(),
                nodes.len(),
                groups.values().copied().max().unwrap_or(0),
            ),
        }
    }

    /// The best cost over every valid selection, by brute force.
    fn best_cost(
        avail: &[String],
        must: &[String],
        size: usize,
        how: Pick,
    ) -> (usize, usize, usize) {
        let rest: Vec<&String> = avail.iter().filter(|a| !must.contains(a)).collect();
        let mut best = (usize::MAX, usize::MAX, usize::MAX);
        for mask in 0u32..(1 << rest.len()) {
            if mask.count_ones() as usize + must.len() != size {
                continue;
            }
            let mut sel: Vec<String> = must.to_vec();
            for (i, r) in rest.iter().enumerate() {
                if mask & (1 << i) != 0 {
                    sel.push((*r).clone());
                }
            }
            best = best.min(cost(&sel, how));
        }
        best
    }

    #[test]
    fn spread_puts_shares_on_different_hcas_on_one_numa_node() {
        // Shared pool: two HCAs on NUMA 0 (g0, g1), one on NUMA 1 (g2), three shares each.
        let avail = ids(&[
            "n0g0-0", "n0g0-1", "n0g0-2", "n0g1-0", "n0g1-1", "n0g1-2", "n1g2-0", "n1g2-1",
            "n1g2-2",
        ]);
        let spread = |must: &[&str], size| {
            preferred(&avail, &ids(must), size, &topo_of, Pick::Spread).unwrap()
        };
        // `rdma/hca: 2` is two HCAs, not two shares of one.
        assert_eq!(spread(&[], 2), ids(&["n0g0-0", "n0g1-0"]));
        assert_eq!(
            preferred(&avail, &[], 2, &topo_of, Pick::Pack).unwrap(),
            ids(&["n0g0-0", "n0g0-1"])
        );
        // Four: all three HCAs, the fourth share on the lowest.
        assert_eq!(
            spread(&[], 4),
            ids(&["n0g0-0", "n0g0-1", "n0g1-0", "n1g2-0"])
        );
        // Seven: 3+2+2, as even as it gets.
        assert_eq!(spread(&[], 7).len(), 7);
        // A second HCA is worth a second NUMA node.
        assert_eq!(spread(&["n1g2-1"], 2), ids(&["n0g0-0", "n1g2-1"]));
        // A must-include's HCA counts as used: the next goes to the other one.
        assert_eq!(spread(&["n0g1-2"], 2), ids(&["n0g0-0", "n0g1-2"]));
        // Among ways to reach two HCAs, one NUMA node beats two (lower IDs
        // would have taken n0g0).
        let avail = ids(&["n0g0-0", "n0g0-1", "n1g1-0", "n1g2-0"]);
        assert_eq!(
            preferred(&avail, &[], 2, &topo_of, Pick::Spread).unwrap(),
            ids(&["n1g1-0", "n1g2-0"])
        );
    }

    fn device_pool() -> impl Strategy<Value = Vec<String>> {
        // numa 0-2 or unknown, groups 0-3, up to 10 distinct devices.
        proptest::collection::btree_set(
            (
                prop_oneof![Just("0"), Just("1"), Just("2"), Just("x")],
                0u8..4,
                0u8..3,
            ),
            1..10,
        )
        .prop_map(|s| {
            s.into_iter()
                .map(|(n, g, i)| format!("n{n}g{g}-{i}"))
                .collect()
        })
    }

    proptest! {
        #[test]
        fn preferred_allocation_properties(
            avail in device_pool(),
            must_mask in any::<u16>(),
            size_pick in any::<u16>(),
            shuffle in any::<u64>(),
        ) {
            let must: Vec<String> = avail
                .iter()
                .enumerate()
                .filter(|(i, _)| must_mask & (1 << i) != 0 && i % 3 == 0)
                .map(|(_, a)| a.clone())
                .collect();
            let span = avail.len() - must.len();
            let size = must.len() + (size_pick as usize % (span + 1));
            for how in [Pick::Pack, Pick::Spread] {
                let got = preferred(&avail, &must, size as i64, &topo_of, how).unwrap();
                // Right size, only available devices, no duplicates, all must-includes.
                prop_assert_eq!(got.len(), size);
                prop_assert!(got.iter().all(|g| avail.contains(g)));
                let uniq: BTreeSet<&String> = got.iter().collect();
                prop_assert_eq!(uniq.len(), got.len());
                prop_assert!(must.iter().all(|m| got.contains(m)));
                // Pack: fewest NUMA nodes, then fewest PFs. Spread: most
                // HCAs, then fewest NUMA nodes, then evenly.
                prop_assert_eq!(cost(&got, how), best_cost(&avail, &must, size, how), "{:?}", how);
                // Same sets in another order give the same answer.
                let mut rotated = avail.clone();
                let k = (shuffle as usize) % rotated.len();
                rotated.rotate_left(k);
                rotated.reverse();
                prop_assert_eq!(preferred(&rotated, &must, size as i64, &topo_of, how).unwrap(), got);
            }
        }
    }
}
