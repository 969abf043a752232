#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The admission state machine: table tests for each transition and
//! property tests over random clusters (limits, cleanup, determinism).

use kroce_admission::lifecycle::{
    Action, AdmissionInput, AdmissionPhase, AdmissionPolicy, AdmittedAt, EventType, Marking,
    NodeAdmission, NodeView, RunOutcome, TestRun, plan,
};
use kroce_admission::thresholds::Measurement;
use proptest::prelude::*;
use std::collections::BTreeMap;

fn policy() -> AdmissionPolicy {
    AdmissionPolicy {
        enabled: true,
        marking: Marking::Taint,
        max_concurrent_nodes: 2,
        test_timeout_seconds: 300,
        backoff_base_seconds: 60,
        backoff_max_seconds: 600,
        retest_interval_seconds: None,
    }
}

fn node(name: &str, phase: AdmissionPhase, in_sync: bool, marked: Option<bool>) -> NodeView {
    NodeView {
        name: name.into(),
        admission: NodeAdmission {
            phase,
            ..Default::default()
        },
        config_generation: 1,
        config_in_sync: in_sync,
        marked_ready: marked,
    }
}

fn admitted(at: u64) -> AdmissionPhase {
    AdmissionPhase::Admitted {
        at: AdmittedAt {
            at,
            generation: 1,
            without_test: false,
        },
    }
}

fn input(nodes: Vec<NodeView>, now: u64) -> AdmissionInput {
    AdmissionInput {
        nodes,
        now,
        ..Default::default()
    }
}

/// The next reconcile's view: states from the plan, marks as the actions set them.
fn apply(
    prev: &AdmissionInput,
    p: &kroce_admission::lifecycle::AdmissionPlan,
    now: u64,
) -> AdmissionInput {
    let mut nodes = prev.nodes.clone();
    for n in &mut nodes {
        n.admission = p.nodes[&n.name].clone();
        for a in &p.actions {
            if let Action::MarkNode { node, ready, .. } = a
                && *node == n.name
            {
                n.marked_ready = Some(*ready);
            }
        }
    }
    let mut pods: Vec<String> = prev.pod_runs.clone();
    for a in &p.actions {
        match a {
            Action::CreateTestPods { run } => pods.push(run.id.clone()),
            Action::DeleteTestPods { run_id } => pods.retain(|r| r != run_id),
            _ => {}
        }
    }
    AdmissionInput {
        nodes,
        pod_runs: pods,
        outcomes: BTreeMap::new(),
        now,
        testing_elsewhere: prev.testing_elsewhere,
    }
}

fn creates(p: &kroce_admission::lifecycle::AdmissionPlan) -> Vec<TestRun> {
    p.actions
        .iter()
        .filter_map(|a| match a {
            Action::CreateTestPods { run } => Some(run.clone()),
            _ => None,
        })
        .collect()
}

fn deletes(p: &kroce_admission::lifecycle::AdmissionPlan) -> Vec<String> {
    p.actions
        .iter()
        .filter_map(|a| match a {
            Action::DeleteTestPods { run_id } => Some(run_id.clone()),
            _ => None,
        })
        .collect()
}

fn marks(p: &kroce_admission::lifecycle::AdmissionPlan) -> Vec<(String, bool)> {
    p.actions
        .iter()
        .filter_map(|a| match a {
            Action::MarkNode { node, ready, .. } => Some((node.clone(), *ready)),
            _ => None,
        })
        .collect()
}

fn events(p: &kroce_admission::lifecycle::AdmissionPlan, reason: &str) -> Vec<(String, String)> {
    p.actions
        .iter()
        .filter_map(|a| match a {
            Action::Event {
                node,
                reason: r,
                message,
                ..
            } if r == reason => Some((node.clone(), message.clone())),
            _ => None,
        })
        .collect()
}

fn run_of(state: &NodeAdmission) -> &TestRun {
    match &state.phase {
        AdmissionPhase::Testing { run, .. } => run,
        other => panic!("not testing: {other:?}"),
    }
}

fn pass() -> RunOutcome {
    RunOutcome {
        passed: true,
        measurement: Some(Measurement {
            bandwidth_gbps: Some(92.6),
            ..Default::default()
        }),
        message: "bandwidth 92.60 Gb/s >= minimum 80.00 Gb/s".into(),
    }
}

fn fail() -> RunOutcome {
    RunOutcome {
        passed: false,
        measurement: Some(Measurement {
            bandwidth_gbps: Some(41.0),
            ..Default::default()
        }),
        message: "bandwidth 41.00 Gb/s is 39.00 Gb/s (48.8%) below the minimum 80.00 Gb/s".into(),
    }
}

#[test]
fn a_new_node_is_tainted_and_waits_for_its_configuration() {
    let i = input(vec![node("a", AdmissionPhase::Pending, false, None)], 100);
    let p = plan(&i, &policy()).unwrap();
    assert_eq!(marks(&p), vec![("a".to_string(), false)]);
    assert!(creates(&p).is_empty());
    assert!(
        p.nodes["a"]
            .waiting
            .as_deref()
            .unwrap()
            .contains("NIC configuration")
    );
    assert!(matches!(
        p.actions[0],
        Action::MarkNode {
            marking: Marking::Taint,
            ..
        }
    ));
}

#[test]
fn a_lone_node_waits_for_a_peer() {
    let i = input(
        vec![node("a", AdmissionPhase::Pending, true, Some(false))],
        100,
    );
    let p = plan(&i, &policy()).unwrap();
    assert!(p.actions.is_empty(), "{:?}", p.actions);
    assert!(p.nodes["a"].waiting.as_deref().unwrap().contains("peer"));
}

#[test]
fn first_nodes_pair_with_each_other_then_pass_together() {
    let i = input(
        vec![
            node("b", AdmissionPhase::Pending, true, Some(false)),
            node("a", AdmissionPhase::Pending, true, Some(false)),
        ],
        1000,
    );
    let p = plan(&i, &policy()).unwrap();
    let runs = creates(&p);
    assert_eq!(runs.len(), 1);
    let run = &runs[0];
    assert_eq!(
        (run.server_node.as_str(), run.client_node.as_str()),
        ("a", "b")
    );
    assert_eq!(run.subjects, vec!["a", "b"]);
    assert_eq!(run.deadline, 1300);
    assert_eq!(run_of(&p.nodes["a"]).id, run.id);
    assert_eq!(run_of(&p.nodes["b"]).id, run.id);
    assert_eq!(events(&p, "AdmissionTestStarted").len(), 2);
    assert!(marks(&p).is_empty(), "still tainted: no change");

    // Both pass on the one run.
    let mut next = apply(&i, &p, 1100);
    next.outcomes.insert(run.id.clone(), pass());
    let p2 = plan(&next, &policy()).unwrap();
    for n in ["a", "b"] {
        assert!(matches!(
            p2.nodes[n].phase,
            AdmissionPhase::Admitted {
                at: AdmittedAt {
                    at: 1100,
                    generation: 1,
                    without_test: false
                }
            }
        ));
        assert_eq!(
            p2.nodes[n].last_result.as_ref().unwrap().peer,
            if n == "a" { "b" } else { "a" }
        );
    }
    assert_eq!(deletes(&p2), vec![run.id.clone()]);
    assert_eq!(
        marks(&p2),
        vec![("a".to_string(), true), ("b".to_string(), true)]
    );
    let recorded: Vec<&Action> = p2
        .actions
        .iter()
        .filter(|a| matches!(a, Action::RecordResult { .. }))
        .collect();
    assert_eq!(recorded.len(), 2);
    assert_eq!(events(&p2, "Admitted").len(), 2);
}

#[test]
fn a_node_pairs_with_an_admitted_one_and_failure_backs_off_exponentially() {
    let pol = policy();
    let mut i = input(
        vec![
            node("a", admitted(10), true, Some(true)),
            node("x", AdmissionPhase::Pending, true, Some(false)),
        ],
        1000,
    );
    let mut delays = Vec::new();
    for attempt in 1..=6u32 {
        let p = plan(&i, &pol).unwrap();
        let runs = creates(&p);
        assert_eq!(runs.len(), 1, "attempt {attempt}: {:?}", p.actions);
        let run = runs[0].clone();
        assert_eq!(run.server_node, "a");
        assert_eq!(run.client_node, "x");
        assert_eq!(run.subjects, vec!["x"]);
        let now = i.now + 10;
        let mut next = apply(&i, &p, now);
        next.outcomes.insert(run.id.clone(), fail());
        let p2 = plan(&next, &pol).unwrap();
        assert_eq!(deletes(&p2), vec![run.id.clone()]);
        let st = &p2.nodes["x"];
        assert_eq!(st.failures, attempt);
        let AdmissionPhase::Failed {
            retry_at, reason, ..
        } = &st.phase
        else {
            panic!("{:?}", st.phase)
        };
        assert!(reason.contains("below the minimum"), "{reason}");
        delays.push(retry_at - now);
        let failed = events(&p2, "AdmissionFailed");
        assert_eq!(failed.len(), 1);
        assert!(failed[0].1.contains("39.00 Gb/s"), "{}", failed[0].1);
        // Still tainted, and "a" untouched.
        assert!(marks(&p2).is_empty());
        assert_eq!(p2.nodes["a"].phase, i.nodes[0].admission.phase);
        // Nothing happens before the retry time...
        let waiting = apply(&next, &p2, retry_at - 1);
        let p3 = plan(&waiting, &pol).unwrap();
        assert!(creates(&p3).is_empty());
        // ...and at it, the next attempt starts.
        i = apply(&waiting, &p3, *retry_at);
    }
    assert_eq!(delays, vec![60, 120, 240, 480, 600, 600]);
}

#[test]
fn a_pass_after_failures_resets_the_count() {
    let mut x = node("x", AdmissionPhase::Pending, true, Some(false));
    x.admission.failures = 3;
    let i = input(vec![node("a", admitted(10), true, Some(true)), x], 500);
    let p = plan(&i, &policy()).unwrap();
    let run = creates(&p)[0].clone();
    let mut next = apply(&i, &p, 600);
    next.outcomes.insert(run.id, pass());
    let p2 = plan(&next, &policy()).unwrap();
    assert_eq!(p2.nodes["x"].failures, 0);
    assert_eq!(marks(&p2), vec![("x".to_string(), true)]);
}

#[test]
fn timeout_fails_the_run_and_deletes_its_pods() {
    let i = input(
        vec![
            node("a", admitted(10), true, Some(true)),
            node("x", AdmissionPhase::Pending, true, Some(false)),
        ],
        1000,
    );
    let p = plan(&i, &policy()).unwrap();
    let run = creates(&p)[0].clone();
    // One second before the deadline: still waiting.
    let before = apply(&i, &p, run.deadline - 1);
    let pb = plan(&before, &policy()).unwrap();
    assert!(deletes(&pb).is_empty());
    assert_eq!(pb.nodes["x"].phase, before.nodes[1].admission.phase);
    // At the deadline.
    let at = apply(&i, &p, run.deadline);
    let pt = plan(&at, &policy()).unwrap();
    assert_eq!(deletes(&pt), vec![run.id.clone()]);
    let AdmissionPhase::Failed { reason, .. } = &pt.nodes["x"].phase else {
        panic!()
    };
    assert!(reason.contains("timed out after 300s"), "{reason}");
    assert_eq!(events(&pt, "AdmissionTestTimedOut").len(), 1);
    let rec = pt.nodes["x"].last_result.as_ref().unwrap();
    assert!(!rec.passed && rec.measurement.is_none());
    // A late result for the timed-out run changes nothing.
    let mut late = apply(&at, &pt, run.deadline + 5);
    late.outcomes.insert(run.id.clone(), pass());
    let pl = plan(&late, &policy()).unwrap();
    assert!(matches!(pl.nodes["x"].phase, AdmissionPhase::Failed { .. }));
    assert!(
        pl.actions
            .iter()
            .all(|a| !matches!(a, Action::RecordResult { .. }))
    );
}

#[test]
fn orphaned_test_pods_are_deleted() {
    let mut i = input(vec![node("a", admitted(10), true, Some(true))], 100);
    i.pod_runs = vec![
        "kroce-adm-deadbeef0000".into(),
        "kroce-adm-deadbeef0000".into(),
    ];
    let p = plan(&i, &policy()).unwrap();
    assert_eq!(deletes(&p), vec!["kroce-adm-deadbeef0000".to_string()]);
}

#[test]
fn nic_config_change_revokes_admission_and_retests() {
    let mut a = node("a", admitted(10), true, Some(true));
    a.config_generation = 2;
    let i = input(vec![a, node("b", admitted(10), true, Some(true))], 1000);
    let p = plan(&i, &policy()).unwrap();
    assert_eq!(events(&p, "AdmissionRevoked").len(), 1);
    assert!(
        events(&p, "AdmissionRevoked")[0]
            .1
            .contains("generation 1 -> 2")
    );
    let runs = creates(&p);
    assert_eq!(runs.len(), 1);
    assert_eq!(
        (runs[0].server_node.as_str(), runs[0].client_node.as_str()),
        ("b", "a")
    );
    // Not schedulable while re-tested after a config change.
    assert_eq!(marks(&p), vec![("a".to_string(), false)]);
    let AdmissionPhase::Testing {
        previously_admitted,
        ..
    } = &p.nodes["a"].phase
    else {
        panic!()
    };
    assert!(previously_admitted.is_none());
}

#[test]
fn config_change_while_not_in_sync_waits_and_a_running_test_is_aborted() {
    // Admitted, new generation not yet applied: pending, no test.
    let mut a = node("a", admitted(10), false, Some(true));
    a.config_generation = 2;
    let p = plan(
        &input(vec![a, node("b", admitted(10), true, Some(true))], 1000),
        &policy(),
    )
    .unwrap();
    assert!(matches!(p.nodes["a"].phase, AdmissionPhase::Pending));
    assert!(creates(&p).is_empty());
    assert_eq!(marks(&p), vec![("a".to_string(), false)]);

    // A node under test whose NIC config starts changing: abort, pods go.
    let i = input(
        vec![
            node("a", admitted(10), true, Some(true)),
            node("x", AdmissionPhase::Pending, true, Some(false)),
        ],
        1000,
    );
    let p = plan(&i, &policy()).unwrap();
    let run = creates(&p)[0].clone();
    let mut next = apply(&i, &p, 1010);
    next.nodes[1].config_in_sync = false;
    next.nodes[1].config_generation = 2;
    let p2 = plan(&next, &policy()).unwrap();
    assert_eq!(deletes(&p2), vec![run.id]);
    assert!(matches!(p2.nodes["x"].phase, AdmissionPhase::Pending));
    assert_eq!(p2.nodes["x"].failures, 0, "an abort is not a failure");
    assert!(
        events(&p2, "AdmissionTestAborted")[0]
            .1
            .contains("NIC configuration of x")
    );
}

#[test]
fn drift_on_the_same_generation_keeps_admission() {
    let p = plan(
        &input(vec![node("a", admitted(10), false, Some(true))], 1000),
        &policy(),
    )
    .unwrap();
    assert!(matches!(
        p.nodes["a"].phase,
        AdmissionPhase::Admitted { .. }
    ));
    assert!(p.actions.is_empty(), "{:?}", p.actions);
}

#[test]
fn peer_losing_admission_aborts_the_run() {
    let i = input(
        vec![
            node("a", admitted(10), true, Some(true)),
            node("x", AdmissionPhase::Pending, true, Some(false)),
        ],
        1000,
    );
    let p = plan(&i, &policy()).unwrap();
    let run = creates(&p)[0].clone();
    let mut next = apply(&i, &p, 1010);
    next.nodes[0].admission.phase = AdmissionPhase::Pending;
    let p2 = plan(&next, &policy()).unwrap();
    assert!(deletes(&p2).contains(&run.id));
    assert!(
        events(&p2, "AdmissionTestAborted")[0]
            .1
            .contains("peer node a")
    );
    assert_eq!(p2.nodes["x"].failures, 0, "an abort is not a failure");
    // Nobody is admitted any more: the two now bootstrap each other.
    let again = creates(&p2);
    assert_eq!(again.len(), 1);
    assert_ne!(again[0].id, run.id);
    assert_eq!(again[0].subjects, vec!["a", "x"]);
}

#[test]
fn a_node_leaving_a_bootstrap_pair_aborts_it_for_the_other() {
    let i = input(
        vec![
            node("a", AdmissionPhase::Pending, true, Some(false)),
            node("b", AdmissionPhase::Pending, true, Some(false)),
        ],
        1000,
    );
    let p = plan(&i, &policy()).unwrap();
    let run = creates(&p)[0].clone();
    let mut next = apply(&i, &p, 1010);
    next.nodes.retain(|n| n.name == "a"); // b deleted from the cluster
    let p2 = plan(&next, &policy()).unwrap();
    assert_eq!(deletes(&p2), vec![run.id]);
    assert!(matches!(p2.nodes["a"].phase, AdmissionPhase::Pending));
    assert!(!p2.nodes.contains_key("b"));
}

#[test]
fn periodic_retest_keeps_the_node_schedulable_until_it_fails() {
    let pol = AdmissionPolicy {
        retest_interval_seconds: Some(3600),
        ..policy()
    };
    let i = input(
        vec![
            node("a", admitted(0), true, Some(true)),
            node("b", admitted(100), true, Some(true)),
        ],
        3599,
    );
    let p0 = plan(&i, &pol).unwrap();
    assert!(creates(&p0).is_empty());
    // Each admitted node says when its re-test is due (exported by the node
    // agent, so an overdue re-test alerts).
    assert_eq!(p0.nodes["a"].retest_due, Some(3600));
    assert_eq!(p0.nodes["b"].retest_due, Some(3700));
    let no_retest = plan(&i, &policy()).unwrap();
    assert_eq!(no_retest.nodes["a"].retest_due, None);
    let i = AdmissionInput { now: 3600, ..i };
    let p = plan(&i, &pol).unwrap();
    let runs = creates(&p);
    assert_eq!(
        runs.len(),
        1,
        "b serves a; b's own retest waits until b is free"
    );
    assert_eq!(runs[0].client_node, "a");
    assert!(marks(&p).is_empty(), "a stays schedulable while re-tested");
    let AdmissionPhase::Testing {
        previously_admitted,
        ..
    } = &p.nodes["a"].phase
    else {
        panic!()
    };
    assert_eq!(previously_admitted.unwrap().at, 0);
    let mut next = apply(&i, &p, 3700);
    next.outcomes.insert(runs[0].id.clone(), fail());
    let p2 = plan(&next, &pol).unwrap();
    assert_eq!(marks(&p2), vec![("a".to_string(), false)]);
    assert!(matches!(p2.nodes["a"].phase, AdmissionPhase::Failed { .. }));
}

#[test]
fn disabled_admission_admits_on_configuration_alone() {
    let pol = AdmissionPolicy {
        enabled: false,
        marking: Marking::Label,
        ..policy()
    };
    let i = input(
        vec![
            node("a", AdmissionPhase::Pending, true, None),
            node("b", AdmissionPhase::Pending, false, None),
        ],
        50,
    );
    let p = plan(&i, &pol).unwrap();
    assert!(matches!(
        p.nodes["a"].phase,
        AdmissionPhase::Admitted {
            at: AdmittedAt {
                without_test: true,
                ..
            }
        }
    ));
    assert!(matches!(p.nodes["b"].phase, AdmissionPhase::Pending));
    assert!(creates(&p).is_empty());
    assert_eq!(
        p.actions
            .iter()
            .filter_map(|a| match a {
                Action::MarkNode {
                    node,
                    ready,
                    marking,
                } => Some((node.as_str(), *ready, *marking)),
                _ => None,
            })
            .collect::<Vec<_>>(),
        vec![("a", true, Marking::Label), ("b", false, Marking::Label)]
    );
    assert_eq!(events(&p, "AdmittedWithoutTest").len(), 1);
    // Steady state: nothing more to do.
    let again = apply(&i, &p, 60);
    assert!(plan(&again, &pol).unwrap().actions.is_empty());

    // Enabling tests later: the node is tested but stays schedulable meanwhile.
    let mut enabled = apply(&again, &plan(&again, &pol).unwrap(), 70);
    enabled.nodes.push(node("c", admitted(5), true, Some(true)));
    let p3 = plan(&enabled, &policy()).unwrap();
    let runs = creates(&p3);
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].client_node, "a");
    assert!(!marks(&p3).iter().any(|(n, _)| n == "a"));
}

#[test]
fn disabling_admission_aborts_running_tests() {
    let i = input(
        vec![
            node("a", admitted(10), true, Some(true)),
            node("x", AdmissionPhase::Pending, true, Some(false)),
        ],
        1000,
    );
    let p = plan(&i, &policy()).unwrap();
    let run = creates(&p)[0].clone();
    let next = apply(&i, &p, 1010);
    let off = AdmissionPolicy {
        enabled: false,
        ..policy()
    };
    let p2 = plan(&next, &off).unwrap();
    assert_eq!(deletes(&p2), vec![run.id]);
    assert!(matches!(
        p2.nodes["x"].phase,
        AdmissionPhase::Admitted {
            at: AdmittedAt {
                without_test: true,
                ..
            }
        }
    ));
    assert_eq!(marks(&p2), vec![("x".to_string(), true)]);
}

#[test]
fn concurrency_limit_and_peer_spread() {
    let mut nodes: Vec<NodeView> = (0..4)
        .map(|i| node(&format!("adm{i}"), admitted(1), true, Some(true)))
        .collect();
    nodes.extend((0..6).map(|i| {
        node(
            &format!("new{i}"),
            AdmissionPhase::Pending,
            true,
            Some(false),
        )
    }));
    let i = input(nodes, 1000);
    let p = plan(
        &AdmissionInput { ..i.clone() },
        &AdmissionPolicy {
            max_concurrent_nodes: 3,
            ..policy()
        },
    )
    .unwrap();
    let runs = creates(&p);
    assert_eq!(runs.len(), 3);
    let clients: Vec<&str> = runs.iter().map(|r| r.client_node.as_str()).collect();
    assert_eq!(clients, vec!["new0", "new1", "new2"], "name order");
    let mut servers: Vec<&str> = runs.iter().map(|r| r.server_node.as_str()).collect();
    servers.sort_unstable();
    servers.dedup();
    assert_eq!(
        servers.len(),
        3,
        "each admitted peer serves one run at a time"
    );
    for n in ["new3", "new4", "new5"] {
        assert!(
            p.nodes[n].waiting.as_deref().unwrap().contains("slot"),
            "{n}"
        );
    }
    // With a larger limit, peers (4) are the bound.
    let p = plan(
        &i,
        &AdmissionPolicy {
            max_concurrent_nodes: 10,
            ..policy()
        },
    )
    .unwrap();
    assert_eq!(creates(&p).len(), 4);
    assert!(
        p.nodes["new4"]
            .waiting
            .as_deref()
            .unwrap()
            .contains("admitted peer")
    );
}

#[test]
fn runs_of_other_networks_take_slots_from_the_cluster_wide_limit() {
    let mut nodes: Vec<NodeView> = (0..4)
        .map(|i| node(&format!("adm{i}"), admitted(1), true, Some(true)))
        .collect();
    nodes.extend((0..4).map(|i| {
        node(
            &format!("new{i}"),
            AdmissionPhase::Pending,
            true,
            Some(false),
        )
    }));
    let pol = AdmissionPolicy {
        max_concurrent_nodes: 3,
        ..policy()
    };
    let i = AdmissionInput {
        testing_elsewhere: 2,
        ..input(nodes, 1000)
    };
    let p = plan(&i, &pol).unwrap();
    assert_eq!(creates(&p).len(), 1, "3 slots, 2 taken by another network");
    let full = AdmissionInput {
        testing_elsewhere: 3,
        ..i
    };
    let p = plan(&full, &pol).unwrap();
    assert!(creates(&p).is_empty());
    assert!(
        p.nodes["new0"]
            .waiting
            .as_deref()
            .unwrap()
            .contains("3 of 3")
    );
}

#[test]
fn bootstrap_with_a_limit_of_one_still_starts() {
    let i = input(
        vec![
            node("a", AdmissionPhase::Pending, true, Some(false)),
            node("b", AdmissionPhase::Pending, true, Some(false)),
            node("c", AdmissionPhase::Pending, true, Some(false)),
        ],
        1,
    );
    let p = plan(
        &i,
        &AdmissionPolicy {
            max_concurrent_nodes: 1,
            ..policy()
        },
    )
    .unwrap();
    let runs = creates(&p);
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].subjects, vec!["a", "b"]);
    assert!(p.nodes["c"].waiting.is_some());
}

#[test]
fn failed_bootstrap_pairs_prefer_a_new_partner() {
    let failed = |peer: &str| AdmissionPhase::Failed {
        at: 0,
        retry_at: 10,
        generation: 1,
        peer: Some(peer.into()),
        reason: "x".into(),
    };
    let i = input(
        vec![
            node("a", failed("b"), true, Some(false)),
            node("b", failed("a"), true, Some(false)),
            node("c", AdmissionPhase::Pending, true, Some(false)),
        ],
        100,
    );
    let p = plan(
        &i,
        &AdmissionPolicy {
            max_concurrent_nodes: 4,
            ..policy()
        },
    )
    .unwrap();
    let runs = creates(&p);
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].subjects, vec!["a", "c"]);
}

#[test]
fn plan_json_round_trips() {
    let i = input(
        vec![
            node("a", admitted(10), true, Some(true)),
            node("x", AdmissionPhase::Pending, true, Some(false)),
        ],
        1000,
    );
    let p = plan(&i, &policy()).unwrap();
    let json = serde_json::to_string(&p).unwrap();
    assert!(json.contains("\"action\":\"createTestPods\""), "{json}");
    assert!(json.contains("\"phase\":\"testing\""), "{json}");
    let back: kroce_admission::lifecycle::AdmissionPlan = serde_json::from_str(&json).unwrap();
    assert_eq!(back, p);
    let st = serde_json::to_string(&p.nodes["a"]).unwrap();
    assert!(
        st.contains("\"phase\":\"admitted\"") && st.contains("\"generation\":1"),
        "{st}"
    );
    assert!(matches!(
        serde_json::from_str::<EventType>("\"Warning\"").unwrap(),
        EventType::Warning
    ));
}

fn arb_phase(peers: usize) -> impl Strategy<Value = (u8, u64, usize)> {
    (0u8..4, 0u64..2000, 0..peers.max(1))
}

proptest! {
    /// Random clusters run through several reconciles with random outcomes:
    /// never more nodes under test than allowed, every run that ends has its
    /// pods deleted in that same plan, marks follow phases, and plans are
    /// deterministic and independent of input order.
    #[test]
    fn invariants_over_random_reconciles(
        n in 2usize..9,
        limit in 1u32..4,
        seeds in proptest::collection::vec(arb_phase(8), 9),
        sync in proptest::collection::vec(any::<bool>(), 9),
        results in proptest::collection::vec(0u8..3, 12),
        steps in 1usize..12,
    ) {
        let pol = AdmissionPolicy { max_concurrent_nodes: limit, ..policy() };
        let names: Vec<String> = (0..n).map(|i| format!("n{i}")).collect();
        let nodes: Vec<NodeView> = (0..n).map(|i| {
            let (kind, t, _) = seeds[i];
            let phase = match kind {
                0 => AdmissionPhase::Pending,
                1 => admitted(t),
                2 => AdmissionPhase::Failed { at: t, retry_at: t + 60, generation: 1, peer: None, reason: "r".into() },
                _ => AdmissionPhase::Pending,
            };
            node(&names[i], phase, sync[i] || kind == 1, None)
        }).collect();
        let mut cur = input(nodes, 2000);
        for step in 0..steps {
            let p = plan(&cur, &pol).unwrap();
            // Determinism and order independence.
            let mut rev = cur.clone();
            rev.nodes.reverse();
            prop_assert_eq!(&plan(&rev, &pol).unwrap(), &p);
            prop_assert_eq!(&plan(&cur, &pol).unwrap(), &p);
            let testing_before = cur.nodes.iter().filter(|v| matches!(v.admission.phase, AdmissionPhase::Testing{..})).count();
            let testing_after = p.nodes.values().filter(|s| matches!(s.phase, AdmissionPhase::Testing{..})).count();
            let started = testing_after > testing_before;
            if started {
                // A bootstrap pair may use two slots when nothing else ran.
                let cap = if testing_before == 0 { (limit as usize).max(2) } else { limit as usize };
                prop_assert!(testing_after <= cap, "{} under test, limit {}", testing_after, limit);
            }
            // Cleanup: a run left by any node is deleted in this plan.
            let dels = deletes(&p);
            for v in &cur.nodes {
                if let AdmissionPhase::Testing { run, .. } = &v.admission.phase {
                    let still = matches!(&p.nodes[&v.name].phase, AdmissionPhase::Testing { run: r, .. } if r.id == run.id);
                    if !still {
                        prop_assert!(dels.contains(&run.id), "run {} left without cleanup", run.id);
                    }
                }
            }
            // Each created run is in its subjects' states, and its ends are distinct.
            for r in creates(&p) {
                prop_assert_ne!(&r.server_node, &r.client_node);
                for s in &r.subjects {
                    prop_assert_eq!(&run_of(&p.nodes[s]).id, &r.id);
                }
            }
            // After applying marks, every node's mark matches its phase.
            let next_now = cur.now + 100 + (step as u64) * 37;
            let mut next = apply(&cur, &p, next_now);
            for v in &next.nodes {
                let ready = match &v.admission.phase {
                    AdmissionPhase::Admitted { .. } => true,
                    AdmissionPhase::Testing { previously_admitted, .. } => previously_admitted.is_some(),
                    _ => false,
                };
                prop_assert_eq!(v.marked_ready, Some(ready), "{}", v.name);
            }
            // Random outcomes for running runs: pass, fail, or none (may time out).
            let running: Vec<String> = next.nodes.iter().filter_map(|v| match &v.admission.phase {
                AdmissionPhase::Testing { run, .. } => Some(run.id.clone()),
                _ => None,
            }).collect();
            for (k, id) in running.iter().enumerate() {
                match results[(k + step) % results.len()] {
                    0 => { next.outcomes.insert(id.clone(), pass()); }
                    1 => { next.outcomes.insert(id.clone(), fail()); }
                    _ => {}
                }
            }
            cur = next;
        }
        // No pods left behind for runs nobody is in.
        let p = plan(&cur, &pol).unwrap();
        let live: Vec<String> = p.nodes.values().filter_map(|s| match &s.phase {
            AdmissionPhase::Testing { run, .. } => Some(run.id.clone()),
            _ => None,
        }).collect();
        let after = apply(&cur, &p, cur.now + 1);
        for pod in &after.pod_runs {
            prop_assert!(live.contains(pod), "orphan pods of {} survive", pod);
        }
    }
}

#[test]
fn the_client_starts_once_the_server_runs_with_its_address() {
    use kroce_admission::lifecycle::{PodStart, RunPods, pods_to_start};
    use std::collections::BTreeSet;
    let run = |id: &str, server: &str, client: &str| TestRun {
        id: id.into(),
        server_node: server.into(),
        client_node: client.into(),
        subjects: vec![server.into(), client.into()],
        started_at: 0,
        deadline: 300,
    };
    let testing = |r: TestRun| NodeAdmission {
        phase: AdmissionPhase::Testing {
            run: r,
            previously_admitted: None,
        },
        ..Default::default()
    };
    let ip = std::net::Ipv4Addr::new(10, 56, 0, 7);
    let mut nodes = BTreeMap::new();
    // r1: both subjects in one run: one server pod, not two.
    nodes.insert("a".to_string(), testing(run("r1", "a", "b")));
    nodes.insert("b".to_string(), testing(run("r1", "a", "b")));
    nodes.insert("c".to_string(), testing(run("r2", "c", "x")));
    nodes.insert("d".to_string(), testing(run("r3", "d", "x")));
    nodes.insert("e".to_string(), testing(run("r4", "e", "x")));
    nodes.insert("f".to_string(), testing(run("r5", "f", "x")));
    nodes.insert(
        "g".to_string(),
        NodeAdmission {
            phase: admitted(0),
            ..Default::default()
        },
    );
    let seen = BTreeMap::from([
        (
            "r2".to_string(),
            RunPods {
                server: Some(Some(ip)),
                client: false,
            },
        ),
        // Server not running (or no address) yet: wait.
        (
            "r3".to_string(),
            RunPods {
                server: Some(None),
                client: false,
            },
        ),
        (
            "r4".to_string(),
            RunPods {
                server: Some(Some(ip)),
                client: true,
            },
        ),
    ]);
    let just_created = BTreeSet::from(["r5".to_string()]);
    let got: Vec<(String, PodStart)> = pods_to_start(&nodes, &seen, &just_created)
        .into_iter()
        .map(|(r, s)| (r.id.clone(), s))
        .collect();
    assert_eq!(
        got,
        vec![
            ("r1".to_string(), PodStart::Server),
            ("r2".to_string(), PodStart::Client { server_ip: ip }),
        ]
    );
}
