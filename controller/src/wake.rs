//! Which reconciles a changed `RdmaNodeState` wakes. Admission writes one
//! entry per network into the node state's status; waking every network
//! the state carries on each of them made a rollout of N nodes x M
//! networks cost N x M x M network reconciles, each over the whole cluster.
//! So a state change wakes a network only when what that network reads of
//! the state changed: the spec, what the agent reported, the network's own
//! admission entry, or which runs are testing (a run elsewhere holds nodes
//! and counts against the cluster-wide limit).

use kroce_admission::lifecycle::AdmissionPhase;
use kroce_operator::crd::RdmaNodeState;
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

/// What the node loop reads of a state: the spec and what the agent
/// reported; not its heartbeat, not admission (no node plan reads it).
pub fn node_fingerprint(s: &RdmaNodeState) -> u64 {
    crate::stores::hash_of(&(s.metadata.generation, spec_json(s), agent_json(s)))
}

fn spec_json(s: &RdmaNodeState) -> String {
    serde_json::to_string(&s.spec).unwrap_or_default()
}

/// The agent's part of the status (without `lastSyncTime`).
fn agent_json(s: &RdmaNodeState) -> String {
    let mut st = s.status.clone().unwrap_or_default();
    st.last_sync_time = None;
    st.admission.clear();
    st.admission_phase = None;
    serde_json::to_string(&st).unwrap_or_default()
}

/// One hash per network the state carries (in its spec or its admission
/// entries): what that network's reconcile reads of it.
pub fn network_views(s: &RdmaNodeState) -> BTreeMap<String, u64> {
    let entries = s.status.as_ref().map_or(&[][..], |st| &st.admission[..]);
    let testing: Vec<(&str, String)> = entries
        .iter()
        .filter_map(|e| match crate::admission::marks::record(e).phase {
            AdmissionPhase::Testing { run, .. } => Some((e.network.as_str(), run.id)),
            _ => None,
        })
        .collect();
    let common =
        crate::stores::hash_of(&(s.metadata.generation, spec_json(s), agent_json(s), &testing));
    let mut networks = crate::node::networks_of_state(s);
    networks.extend(entries.iter().map(|e| e.network.clone()));
    networks
        .into_iter()
        .map(|n| {
            let own = entries
                .iter()
                .find(|e| e.network == n)
                .map(|e| serde_json::to_string(e).unwrap_or_default());
            let h = crate::stores::hash_of(&(common, &own));
            (n, h)
        })
        .collect()
}

/// Networks whose view differs between `old` and `new` (appeared and gone
/// ones included), in name order.
pub fn changed(old: Option<&BTreeMap<String, u64>>, new: &BTreeMap<String, u64>) -> Vec<String> {
    let empty = BTreeMap::new();
    let old = old.unwrap_or(&empty);
    let mut out: Vec<String> = new
        .iter()
        .filter(|(n, h)| old.get(*n) != Some(*h))
        .map(|(n, _)| n.clone())
        .chain(old.keys().filter(|n| !new.contains_key(*n)).cloned())
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The last views seen per node state: the network loop's mapper.
#[derive(Debug, Default)]
pub struct StateWakes {
    seen: Mutex<HashMap<String, BTreeMap<String, u64>>>,
}

impl StateWakes {
    /// The networks `s` wakes now, remembering its views for next time.
    pub fn networks(&self, s: &RdmaNodeState) -> Vec<String> {
        let name = s.metadata.name.clone().unwrap_or_default();
        let views = network_views(s);
        let Ok(mut seen) = self.seen.lock() else {
            // A poisoned map only costs precision: wake them all.
            return views.into_keys().collect();
        };
        let out = changed(seen.get(&name), &views);
        seen.insert(name, views);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kroce_operator::crd::admission::NetworkAdmission;
    use kroce_operator::crd::{PfConfig, RdmaNodeStateSpec, RdmaNodeStateStatus, VfGroup};

    fn state(networks: &[&str]) -> RdmaNodeState {
        let mut s = RdmaNodeState::new(
            "n1",
            RdmaNodeStateSpec {
                node_name: "n1".into(),
                pfs: vec![PfConfig {
                    vf_groups: networks
                        .iter()
                        .map(|n| VfGroup {
                            network: n.to_string(),
                            resource_name: format!("rdma/{n}"),
                            vf_range: "0-1".into(),
                            mtu: None,
                        })
                        .collect(),
                    ..serde_json::from_value(serde_json::json!({
                        "pciAddress": "0000:3b:00.0", "ifName": "ens1f0", "numVfs": 8
                    }))
                    .unwrap()
                }],
                soft_devices: vec![],
                rdma_netns_modes: vec![],
            },
        );
        s.metadata.generation = Some(1);
        s.status = Some(RdmaNodeStateStatus::default());
        s
    }

    fn entry(
        network: &str,
        phase: &str,
        state: kroce_admission::lifecycle::NodeAdmission,
    ) -> NetworkAdmission {
        NetworkAdmission {
            network: network.into(),
            phase: phase.into(),
            schedulable: phase == "Admitted",
            message: None,
            last_result: None,
            conditions: vec![],
            state,
        }
    }

    #[test]
    fn another_networks_admission_entry_wakes_only_that_network() {
        let w = StateWakes::default();
        let mut s = state(&["a", "b", "c"]);
        assert_eq!(w.networks(&s), ["a", "b", "c"]);
        assert!(w.networks(&s).is_empty(), "same state again");
        s.status.as_mut().unwrap().admission = vec![entry("a", "Admitted", Default::default())];
        s.status.as_mut().unwrap().admission_phase = Some("Pending".into());
        assert_eq!(w.networks(&s), ["a"]);
        s.status.as_mut().unwrap().last_sync_time = Some("2026-12-02T00:00:00Z".into());
        assert!(w.networks(&s).is_empty(), "heartbeat");
    }

    #[test]
    fn agent_reports_spec_changes_and_testing_runs_wake_every_network() {
        let w = StateWakes::default();
        let mut s = state(&["a", "b"]);
        w.networks(&s);
        s.status.as_mut().unwrap().configured_pfs = 1;
        assert_eq!(w.networks(&s), ["a", "b"]);
        s.metadata.generation = Some(2);
        assert_eq!(w.networks(&s), ["a", "b"]);
        // A run starting on the node holds it for every network.
        let testing = kroce_admission::lifecycle::NodeAdmission {
            phase: AdmissionPhase::Testing {
                run: kroce_admission::lifecycle::TestRun {
                    id: "r1".into(),
                    server_node: "n1".into(),
                    client_node: "n2".into(),
                    subjects: vec!["n1".into()],
                    started_at: 1,
                    deadline: 2,
                },
                previously_admitted: None,
            },
            ..Default::default()
        };
        let rec = entry("a", "Testing", testing);
        s.status.as_mut().unwrap().admission = vec![rec];
        assert_eq!(w.networks(&s), ["a", "b"]);
    }

    #[test]
    fn a_network_leaving_the_state_wakes_it() {
        let w = StateWakes::default();
        w.networks(&state(&["a", "b"]));
        let mut s = state(&["a"]);
        s.metadata.generation = Some(1);
        // The spec changed too, so both wake; b is among them though it is gone.
        assert_eq!(w.networks(&s), ["a", "b"]);
        assert_eq!(
            changed(
                Some(&network_views(&state(&["a", "b"]))),
                &network_views(&state(&["a", "b"]))
            ),
            Vec::<String>::new()
        );
    }

    #[test]
    fn the_node_loop_ignores_admission_and_heartbeats() {
        let mut s = state(&["a"]);
        let before = node_fingerprint(&s);
        s.status.as_mut().unwrap().admission = vec![entry("a", "Admitted", Default::default())];
        s.status.as_mut().unwrap().admission_phase = Some("Admitted".into());
        s.status.as_mut().unwrap().last_sync_time = Some("t".into());
        assert_eq!(node_fingerprint(&s), before);
        s.status.as_mut().unwrap().configured_pfs = 1;
        assert_ne!(node_fingerprint(&s), before);
    }
}
