//! The admission state machine as one plain function: the cluster's nodes
//! (their persisted admission state and what the operator observes), the
//! finished test runs and the clock go in; the next states and the actions
//! the operator must carry out come out.
//!
//! ```text
//! Pending ──(config in sync, slot free, peer found)──▶ Testing
//! Testing ──(verdict passed)──▶ Admitted
//! Testing ──(verdict failed | error | timeout)──▶ Failed(retry_at = now + backoff)
//! Failed ──(now >= retry_at, or NIC config changed)──▶ Testing
//! Admitted ──(NIC config generation changed)──▶ Pending
//! Admitted ──(retest interval elapsed)──▶ Testing (stays schedulable meanwhile)
//! any ──(admission disabled)──▶ Admitted on configuration alone (when in sync)
//! Admitted on configuration alone ──(testing enabled)──▶ Testing (stays schedulable)
//! Testing ──(config changing, node or peer gone, testing disabled)──▶ aborted:
//!          back to Admitted (re-test of the same generation) or Pending; not a failure
//! ```
//!
//! Pairing is deterministic: a candidate is tested against an admitted node
//! that is not already in a run (picked by a hash of the candidate's name so
//! the load spreads); when no node is admitted yet, candidates are paired
//! with each other in name order and both are judged by the one run. At most
//! `max_concurrent_nodes` nodes are under test at once; a bootstrap pair may start
//! with a limit of 1 when nothing else runs, or the first node could never be
//! admitted. Test pods are deleted on every way out of `Testing` (result,
//! timeout, abort) and pods of runs no node knows about are deleted too.

use crate::thresholds::{Measurement, Verdict};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// Seconds since the Unix epoch.
pub type UnixSeconds = u64;

/// The taint an unadmitted node carries (when marking by taint).
pub const UNREADY_TAINT_KEY: &str = "kroce.io/rdma-unready";
/// The label an admitted node carries (when marking by label).
pub const READY_LABEL_KEY: &str = "kroce.io/rdma-ready";

/// How a node's admission is made visible to the scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Marking {
    /// `kroce.io/rdma-unready:NoSchedule` while not admitted.
    #[default]
    Taint,
    /// `kroce.io/rdma-ready=true` once admitted.
    Label,
}

/// Cluster-wide admission settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionPolicy {
    /// `false`: admit on configuration alone, run no tests.
    pub enabled: bool,
    pub marking: Marking,
    /// At most this many nodes under test at once (cluster-wide).
    pub max_concurrent_nodes: u32,
    /// A run not finished after this long is failed and cleaned up.
    pub test_timeout_seconds: u64,
    /// First retry delay after a failure; doubles per consecutive failure.
    pub backoff_base_seconds: u64,
    /// The retry delay never exceeds this.
    pub backoff_max_seconds: u64,
    /// Re-test admitted nodes this often (`None`: only on config change).
    pub retest_interval_seconds: Option<u64>,
}

impl Default for AdmissionPolicy {
    fn default() -> Self {
        AdmissionPolicy {
            enabled: true,
            marking: Marking::Taint,
            max_concurrent_nodes: 2,
            test_timeout_seconds: 600,
            backoff_base_seconds: 60,
            backoff_max_seconds: 3_600,
            retest_interval_seconds: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error("admission.{field} = {value}: {reason}")]
    Invalid {
        field: &'static str,
        value: u64,
        reason: &'static str,
    },
}

impl AdmissionPolicy {
    pub fn validate(&self) -> Result<(), PolicyError> {
        let bad = |field, value, reason| {
            Err(PolicyError::Invalid {
                field,
                value,
                reason,
            })
        };
        if self.max_concurrent_nodes == 0 {
            return bad("maxConcurrentNodes", 0, "must be at least 1");
        }
        if self.test_timeout_seconds == 0 {
            return bad("testTimeoutSeconds", 0, "must be at least 1");
        }
        if self.backoff_base_seconds == 0 {
            return bad("backoffBaseSeconds", 0, "must be at least 1");
        }
        if self.backoff_max_seconds < self.backoff_base_seconds {
            return bad(
                "backoffMaxSeconds",
                self.backoff_max_seconds,
                "must not be below backoffBaseSeconds",
            );
        }
        if self.retest_interval_seconds == Some(0) {
            return bad("retestIntervalSeconds", 0, "must be at least 1 when set");
        }
        Ok(())
    }

    /// Delay before retry number `failures` (1 = after the first failure):
    /// base * 2^(failures-1), capped at the maximum.
    pub fn backoff(&self, failures: u32) -> u64 {
        let exp = failures.saturating_sub(1).min(63);
        self.backoff_base_seconds
            .saturating_mul(1u64 << exp)
            .min(self.backoff_max_seconds)
    }
}

/// One test run: a server pod on `server_node`, a client pod on
/// `client_node`; `subjects` are the nodes whose admission it decides.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TestRun {
    /// DNS-label-safe, unique per run: name test pods after it.
    pub id: String,
    pub server_node: String,
    pub client_node: String,
    pub subjects: Vec<String>,
    pub started_at: UnixSeconds,
    pub deadline: UnixSeconds,
}

impl TestRun {
    /// The node at the other end of the run from `node`.
    pub fn peer_of(&self, node: &str) -> &str {
        if self.server_node == node {
            &self.client_node
        } else {
            &self.server_node
        }
    }
}

/// Where a node is in admission. Persisted in `RdmaNodeState.status`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(tag = "phase", rename_all = "camelCase")]
pub enum AdmissionPhase {
    #[default]
    Pending,
    #[serde(rename_all = "camelCase")]
    Testing {
        run: TestRun,
        /// Set when an admitted node is re-tested: it stays schedulable and
        /// goes back to this on abort.
        previously_admitted: Option<AdmittedAt>,
    },
    #[serde(rename_all = "camelCase")]
    Admitted {
        #[serde(flatten)]
        at: AdmittedAt,
    },
    #[serde(rename_all = "camelCase")]
    Failed {
        at: UnixSeconds,
        retry_at: UnixSeconds,
        /// NIC config generation the failed test ran on (a new one retries at once).
        generation: u64,
        /// The other end of the failed run (avoided for bootstrap pairing).
        peer: Option<String>,
        reason: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmittedAt {
    pub at: UnixSeconds,
    /// The NIC config generation the node was admitted with.
    pub generation: u64,
    /// Admitted on configuration alone (admission testing disabled).
    pub without_test: bool,
}

/// The persisted admission state of a node.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeAdmission {
    pub phase: AdmissionPhase,
    /// Consecutive failed runs (reset on pass).
    pub failures: u32,
    pub last_result: Option<Box<AdmissionRecord>>,
    /// Why the node is waiting, for status display (not an event).
    pub waiting: Option<String>,
    /// When an admitted node's periodic re-test is due (admitted at + the
    /// network's retest interval), so the node agent can export it and an
    /// overdue re-test (no free peer, controller down) can alert.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retest_due: Option<UnixSeconds>,
}

/// What is recorded in `RdmaNodeState.status` for a finished run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRecord {
    pub run_id: String,
    pub peer: String,
    pub finished_at: UnixSeconds,
    pub passed: bool,
    pub measurement: Option<Measurement>,
    /// Which number missed and by how much, or why the run failed.
    pub message: String,
}

/// How a run ended, as the operator found it (pods finished, output parsed
/// and judged; or a pod failed).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunOutcome {
    pub passed: bool,
    pub measurement: Option<Measurement>,
    pub message: String,
}

impl RunOutcome {
    pub fn from_verdict(verdict: &Verdict, measurement: Measurement) -> Self {
        RunOutcome {
            passed: verdict.passed,
            measurement: Some(measurement),
            message: verdict.message.clone(),
        }
    }

    /// A run that produced no usable numbers (pod error, unparsable output).
    pub fn error(message: impl Into<String>) -> Self {
        RunOutcome {
            passed: false,
            measurement: None,
            message: message.into(),
        }
    }
}

/// A node as the operator sees it this reconcile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeView {
    pub name: String,
    pub admission: NodeAdmission,
    /// Generation of the node's NIC configuration (`RdmaNodeState` spec).
    pub config_generation: u64,
    /// The node agent reports that generation applied.
    pub config_in_sync: bool,
    /// Observed: `Some(true)` when the node is marked ready (no taint /
    /// label set), `None` when unknown. Marks are re-asserted when they differ.
    pub marked_ready: Option<bool>,
}

/// Everything the plan needs.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionInput {
    /// Nodes selected by an `RdmaNetwork` (others are not admitted here).
    pub nodes: Vec<NodeView>,
    /// Run ids of test pods that exist (from their labels).
    pub pod_runs: Vec<String>,
    /// Finished runs by id.
    pub outcomes: BTreeMap<String, RunOutcome>,
    pub now: UnixSeconds,
    /// Nodes under test for other networks right now: the concurrency limit
    /// is cluster-wide, so they take slots from this plan too.
    #[serde(default)]
    pub testing_elsewhere: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventType {
    Normal,
    Warning,
}

/// What the operator must do, in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "camelCase")]
pub enum Action {
    /// Create the server pod on `run.server_node` and the client pod on
    /// `run.client_node`, labelled with `run.id`.
    CreateTestPods { run: TestRun },
    /// Delete every pod labelled with this run id (absent pods are fine).
    DeleteTestPods { run_id: String },
    /// Remove/add the taint, or set/remove the label, per `marking`.
    MarkNode {
        node: String,
        ready: bool,
        marking: Marking,
    },
    /// Write the record into the node's `RdmaNodeState.status`.
    RecordResult {
        node: String,
        record: AdmissionRecord,
    },
    Event {
        node: String,
        event_type: EventType,
        reason: String,
        message: String,
    },
}

/// The next states (every input node, by name) and the actions.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct AdmissionPlan {
    pub nodes: BTreeMap<String, NodeAdmission>,
    pub actions: Vec<Action>,
}

fn event(node: &str, t: EventType, reason: &str, message: String) -> Action {
    Action::Event {
        node: node.to_string(),
        event_type: t,
        reason: reason.to_string(),
        message,
    }
}

/// FNV-1a: a stable hash for run ids and peer rotation (std's hasher is
/// randomly seeded, and plans must be reproducible).
fn fnv1a(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in p.bytes().chain(std::iter::once(0)) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

fn run_id(server: &str, client: &str, now: UnixSeconds) -> String {
    format!(
        "kroce-adm-{:012x}",
        fnv1a(&[server, client, &now.to_string()]) & 0xffff_ffff_ffff
    )
}

/// Whether a node in `phase` may take RDMA pods (admitted, or re-tested
/// while still admitted): what the taint/label follows.
pub fn is_ready(phase: &AdmissionPhase) -> bool {
    match phase {
        AdmissionPhase::Admitted { .. } => true,
        AdmissionPhase::Testing {
            previously_admitted,
            ..
        } => previously_admitted.is_some(),
        _ => false,
    }
}

fn is_admitted(phase: &AdmissionPhase) -> bool {
    matches!(phase, AdmissionPhase::Admitted { .. })
}

/// Plans one reconcile. Invalid policy is an error and plans nothing.
///
/// In order: runs in progress (from the nodes' Testing phases); test pods of
/// runs nobody is in deleted; each run finished, timed out or aborted; each
/// node's own step (disabled admission, config change, due retry/retest);
/// new runs within the concurrency limit; marks that follow the phase.
pub fn plan(
    input: &AdmissionInput,
    policy: &AdmissionPolicy,
) -> Result<AdmissionPlan, PolicyError> {
    policy.validate()?;
    let now = input.now;
    let mut views: Vec<&NodeView> = input.nodes.iter().collect();
    views.sort_by(|a, b| a.name.cmp(&b.name));
    let by_name: BTreeMap<&str, &NodeView> = views.iter().map(|v| (v.name.as_str(), *v)).collect();
    let mut next: BTreeMap<String, NodeAdmission> = views
        .iter()
        .map(|v| (v.name.clone(), v.admission.clone()))
        .collect();
    let mut actions = Vec::new();

    let runs = runs_in_progress(&views);
    let mut deleted = BTreeSet::new();
    for id in &input.pod_runs {
        // Left over from a crash or a removed node.
        if !runs.contains_key(id) && deleted.insert(id.clone()) {
            actions.push(Action::DeleteTestPods { run_id: id.clone() });
        }
    }
    let ended = Ended { now, policy };
    for (id, run) in &runs {
        ended.settle(
            run,
            input.outcomes.get(id),
            &by_name,
            &mut next,
            &mut deleted,
            &mut actions,
        );
    }
    let mut candidates: Vec<&str> = Vec::new();
    for v in &views {
        if let Some(state) = next.get_mut(&v.name)
            && node_step(v, state, policy, now, &mut actions)
        {
            candidates.push(&v.name);
        }
    }
    if policy.enabled {
        start_runs(
            &views,
            &mut next,
            &candidates,
            policy,
            (now, input.testing_elsewhere),
            &mut actions,
        );
    }
    actions.extend(mark_actions(&views, &next, policy));
    Ok(AdmissionPlan {
        nodes: next,
        actions,
    })
}

/// Runs in progress, by id, from the nodes' Testing phases.
fn runs_in_progress(views: &[&NodeView]) -> BTreeMap<String, TestRun> {
    let mut runs: BTreeMap<String, TestRun> = BTreeMap::new();
    for v in views {
        if let AdmissionPhase::Testing { run, .. } = &v.admission.phase {
            runs.entry(run.id.clone()).or_insert_with(|| run.clone());
        }
    }
    runs
}

/// Why a run in progress must stop before its result, if it must.
fn abort_reason(
    run: &TestRun,
    subjects_testing: &[&str],
    by_name: &BTreeMap<&str, &NodeView>,
    policy: &AdmissionPolicy,
) -> Option<String> {
    if !policy.enabled {
        return Some("admission testing was disabled".to_string());
    }
    if subjects_testing.len() != run.subjects.len() {
        return Some("a node of the run left admission".to_string());
    }
    if let Some(s) = run
        .subjects
        .iter()
        .find(|s| by_name.get(s.as_str()).is_some_and(|v| !v.config_in_sync))
    {
        return Some(format!("the NIC configuration of {s} is changing"));
    }
    let peer_ok = |n: &str| {
        run.subjects.iter().any(|s| s == n)
            || by_name
                .get(n)
                .is_some_and(|v| is_admitted(&v.admission.phase))
    };
    if !peer_ok(&run.server_node) || !peer_ok(&run.client_node) {
        return Some(format!(
            "peer node {} is no longer admitted",
            run.peer_of(&run.subjects[0])
        ));
    }
    None
}

/// Step 3: what ends a run (result, timeout, abort) and what it does to
/// each of its subjects.
struct Ended<'a> {
    now: UnixSeconds,
    policy: &'a AdmissionPolicy,
}

impl Ended<'_> {
    fn settle(
        &self,
        run: &TestRun,
        outcome: Option<&RunOutcome>,
        by_name: &BTreeMap<&str, &NodeView>,
        next: &mut BTreeMap<String, NodeAdmission>,
        deleted: &mut BTreeSet<String>,
        actions: &mut Vec<Action>,
    ) {
        let id = &run.id;
        let subjects_testing: Vec<&str> = run
            .subjects
            .iter()
            .filter(|s| {
                by_name.get(s.as_str()).is_some_and(|v| {
                    matches!(&v.admission.phase, AdmissionPhase::Testing { run: r, .. } if r.id == *id)
                })
            })
            .map(String::as_str)
            .collect();
        let abort = abort_reason(run, &subjects_testing, by_name, self.policy);
        let timed_out = outcome.is_none() && self.now >= run.deadline;
        if abort.is_none() && outcome.is_none() && !timed_out {
            return;
        }
        if deleted.insert(id.clone()) {
            actions.push(Action::DeleteTestPods { run_id: id.clone() });
        }
        for s in &subjects_testing {
            let (Some(v), Some(state)) = (by_name.get(s), next.get_mut(*s)) else {
                continue;
            };
            match &abort {
                Some(reason) => actions.push(self.abort(run, v, state, reason)),
                None => actions.extend(self.record(run, v, state, outcome, timed_out)),
            }
        }
    }

    /// Back to admitted (a re-test of the same configuration) or pending.
    fn abort(
        &self,
        run: &TestRun,
        v: &NodeView,
        state: &mut NodeAdmission,
        reason: &str,
    ) -> Action {
        let previously = match &v.admission.phase {
            AdmissionPhase::Testing {
                previously_admitted,
                ..
            } => *previously_admitted,
            _ => None,
        };
        state.phase = match previously {
            Some(at) if at.generation == v.config_generation => AdmissionPhase::Admitted { at },
            _ => AdmissionPhase::Pending,
        };
        event(
            &v.name,
            EventType::Warning,
            "AdmissionTestAborted",
            format!(
                "test run {} with {} aborted: {reason}",
                run.id,
                run.peer_of(&v.name)
            ),
        )
    }

    /// The run's result (or its timeout) recorded: admitted, or failed
    /// with a backoff.
    fn record(
        &self,
        run: &TestRun,
        v: &NodeView,
        state: &mut NodeAdmission,
        outcome: Option<&RunOutcome>,
        timed_out: bool,
    ) -> Vec<Action> {
        let (now, s) = (self.now, v.name.as_str());
        let peer = run.peer_of(s).to_string();
        let (passed, measurement, message) = match outcome {
            Some(o) => (o.passed, o.measurement.clone(), o.message.clone()),
            None => (
                false,
                None,
                format!(
                    "test run timed out after {}s without a result",
                    run.deadline.saturating_sub(run.started_at)
                ),
            ),
        };
        let record = AdmissionRecord {
            run_id: run.id.clone(),
            peer: peer.clone(),
            finished_at: now,
            passed,
            measurement,
            message: message.clone(),
        };
        let mut actions = vec![Action::RecordResult {
            node: s.to_string(),
            record: record.clone(),
        }];
        state.last_result = Some(Box::new(record));
        if passed {
            state.failures = 0;
            state.phase = AdmissionPhase::Admitted {
                at: AdmittedAt {
                    at: now,
                    generation: v.config_generation,
                    without_test: false,
                },
            };
            actions.push(event(
                s,
                EventType::Normal,
                "Admitted",
                format!("passed perftests against {peer}: {message}"),
            ));
            return actions;
        }
        state.failures = state.failures.saturating_add(1);
        let retry_at = now.saturating_add(self.policy.backoff(state.failures));
        let reason = if timed_out {
            "AdmissionTestTimedOut"
        } else {
            "AdmissionFailed"
        };
        actions.push(event(
            s,
            EventType::Warning,
            reason,
            format!(
                "perftests against {peer} failed: {message}; retry in {}s",
                retry_at - now
            ),
        ));
        state.phase = AdmissionPhase::Failed {
            at: now,
            retry_at,
            generation: v.config_generation,
            peer: Some(peer),
            reason: message,
        };
        actions
    }
}

const WAITING_FOR_AGENT: &str = "waiting for the node agent to apply the NIC configuration";

/// Step 4, one node: disabled admission, config changes, due retries and
/// retests. True when the node should start a run.
fn node_step(
    v: &NodeView,
    state: &mut NodeAdmission,
    policy: &AdmissionPolicy,
    now: UnixSeconds,
    actions: &mut Vec<Action>,
) -> bool {
    state.waiting = None;
    state.retest_due = None;
    if matches!(state.phase, AdmissionPhase::Testing { .. }) {
        return false;
    }
    if !policy.enabled {
        actions.extend(untested_step(v, state, now));
        return false;
    }
    match state.phase.clone() {
        AdmissionPhase::Admitted { at } => admitted_step(v, state, at, policy, now, actions),
        AdmissionPhase::Failed {
            retry_at,
            generation,
            ..
        } => {
            if !v.config_in_sync {
                state.waiting = Some(WAITING_FOR_AGENT.into());
                false
            } else {
                now >= retry_at || generation != v.config_generation
            }
        }
        AdmissionPhase::Pending => {
            if !v.config_in_sync {
                state.waiting = Some(WAITING_FOR_AGENT.into());
            }
            v.config_in_sync
        }
        AdmissionPhase::Testing { .. } => false,
    }
}

/// Admission testing disabled: admitted on configuration alone once the
/// agent applied it; pending while it has not.
fn untested_step(v: &NodeView, state: &mut NodeAdmission, now: UnixSeconds) -> Option<Action> {
    if v.config_in_sync {
        let already = matches!(
            &state.phase,
            AdmissionPhase::Admitted { at, .. } if at.generation == v.config_generation
        );
        if already {
            return None;
        }
        state.phase = AdmissionPhase::Admitted {
            at: AdmittedAt {
                at: now,
                generation: v.config_generation,
                without_test: true,
            },
        };
        return Some(event(
            &v.name,
            EventType::Normal,
            "AdmittedWithoutTest",
            "admission testing is disabled: admitted on configuration alone".into(),
        ));
    }
    if !is_admitted(&state.phase)
        || matches!(&state.phase, AdmissionPhase::Admitted { at, .. } if at.generation != v.config_generation)
    {
        state.phase = AdmissionPhase::Pending;
        state.waiting = Some(WAITING_FOR_AGENT.into());
    }
    None
}

/// An admitted node: revoked by a new NIC configuration, re-tested when it
/// was admitted untested or its retest interval passed.
fn admitted_step(
    v: &NodeView,
    state: &mut NodeAdmission,
    at: AdmittedAt,
    policy: &AdmissionPolicy,
    now: UnixSeconds,
    actions: &mut Vec<Action>,
) -> bool {
    if at.generation != v.config_generation {
        state.phase = AdmissionPhase::Pending;
        actions.push(event(
            &v.name,
            EventType::Normal,
            "AdmissionRevoked",
            format!(
                "NIC configuration changed (generation {} -> {}): the node must pass perftests again",
                at.generation, v.config_generation
            ),
        ));
        return v.config_in_sync;
    }
    if !v.config_in_sync {
        // Drift being put back on the same generation: stay admitted.
        return false;
    }
    if at.without_test {
        // Testing was enabled after admitting on configuration alone: test,
        // staying schedulable meanwhile.
        return true;
    }
    let Some(every) = policy.retest_interval_seconds else {
        return false;
    };
    let due = at.at.saturating_add(every);
    state.retest_due = Some(due);
    now >= due
}

/// Step 6: marks follow the phase; re-asserted when the observed mark
/// differs.
fn mark_actions(
    views: &[&NodeView],
    next: &BTreeMap<String, NodeAdmission>,
    policy: &AdmissionPolicy,
) -> Vec<Action> {
    views
        .iter()
        .filter_map(|v| {
            let ready = is_ready(&next.get(&v.name)?.phase);
            (v.marked_ready != Some(ready)).then(|| Action::MarkNode {
                node: v.name.clone(),
                ready,
                marking: policy.marking,
            })
        })
        .collect()
}

/// What the operator sees of one run's test pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RunPods {
    /// The server pod exists; `Some(ip)` once it runs and has its address
    /// on the network under test.
    pub server: Option<Option<std::net::Ipv4Addr>>,
    pub client: bool,
}

/// A test pod to create for a run in progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodStart {
    Server,
    /// The client, told the server's address.
    Client {
        server_ip: std::net::Ipv4Addr,
    },
}

/// After [`plan`]: which pods of the runs in progress to create. The server
/// first; the client once the server runs with its address (it connects to
/// it). Runs whose pods `plan` itself just asked for (`just_created`) are
/// left to the next pass.
pub fn pods_to_start<'a>(
    nodes: &'a BTreeMap<String, NodeAdmission>,
    seen: &BTreeMap<String, RunPods>,
    just_created: &BTreeSet<String>,
) -> Vec<(&'a TestRun, PodStart)> {
    let mut done = BTreeSet::new();
    let mut out = Vec::new();
    for st in nodes.values() {
        let AdmissionPhase::Testing { run, .. } = &st.phase else {
            continue;
        };
        if just_created.contains(&run.id) || !done.insert(run.id.as_str()) {
            continue;
        }
        let pods = seen.get(&run.id).copied().unwrap_or_default();
        match pods.server {
            None => out.push((run, PodStart::Server)),
            Some(Some(server_ip)) if !pods.client => {
                out.push((run, PodStart::Client { server_ip }));
            }
            Some(_) => {}
        }
    }
    out
}

fn start_runs(
    views: &[&NodeView],
    next: &mut BTreeMap<String, NodeAdmission>,
    candidates: &[&str],
    policy: &AdmissionPolicy,
    (now, testing_elsewhere): (UnixSeconds, u32),
    actions: &mut Vec<Action>,
) {
    // Nodes already in a run, as subject or as the other end.
    let mut busy: BTreeSet<String> = BTreeSet::new();
    let mut testing = testing_elsewhere;
    for st in next.values() {
        if let AdmissionPhase::Testing { run, .. } = &st.phase {
            busy.insert(run.server_node.clone());
            busy.insert(run.client_node.clone());
        }
    }
    for st in next.values() {
        if matches!(st.phase, AdmissionPhase::Testing { .. }) {
            testing += 1;
        }
    }
    let admitted: Vec<&str> = views
        .iter()
        .filter(|v| v.config_in_sync)
        .filter(|v| next.get(&v.name).is_some_and(|s| is_admitted(&s.phase)))
        .map(|v| v.name.as_str())
        .collect();
    let in_sync: BTreeSet<&str> = views
        .iter()
        .filter(|v| v.config_in_sync)
        .map(|v| v.name.as_str())
        .collect();
    let mut waiting: Vec<(String, String)> = Vec::new();

    for (i, &c) in candidates.iter().enumerate() {
        if busy.contains(c) || !in_sync.contains(c) {
            continue;
        }
        if testing >= policy.max_concurrent_nodes {
            waiting.push((
                c.to_string(),
                format!(
                    "waiting for a test slot: {testing} of {} nodes under test",
                    policy.max_concurrent_nodes
                ),
            ));
            continue;
        }
        // An admitted node due for a re-test can serve as a peer for others,
        // but not for itself.
        let free_peers: Vec<&str> = admitted
            .iter()
            .copied()
            .filter(|p| *p != c && !busy.contains(*p))
            .collect();
        let any_admitted_elsewhere = admitted.iter().any(|p| *p != c);
        if !free_peers.is_empty() {
            let peer = free_peers[(fnv1a(&[c]) % free_peers.len() as u64) as usize];
            let run = TestRun {
                id: run_id(peer, c, now),
                server_node: peer.to_string(),
                client_node: c.to_string(),
                subjects: vec![c.to_string()],
                started_at: now,
                deadline: now.saturating_add(policy.test_timeout_seconds),
            };
            begin(next, &run, c, actions);
            busy.insert(peer.to_string());
            busy.insert(c.to_string());
            testing += 1;
        } else if any_admitted_elsewhere {
            waiting.push((
                c.to_string(),
                "waiting for an admitted peer node to be free".into(),
            ));
        } else {
            // Bootstrap: nobody is admitted; pair with another candidate,
            // avoiding the partner of a failed run when another exists.
            let last_peer = next.get(c).and_then(|s| match &s.phase {
                AdmissionPhase::Failed { peer, .. } => peer.clone(),
                _ => None,
            });
            let others: Vec<&str> = candidates[i + 1..]
                .iter()
                .copied()
                .filter(|o| !busy.contains(*o) && in_sync.contains(o))
                .collect();
            let partner = others
                .iter()
                .copied()
                .find(|o| Some(*o) != last_peer.as_deref())
                .or_else(|| others.first().copied());
            let Some(partner) = partner else {
                waiting.push((c.to_string(), "waiting for a peer: no node is admitted and no other node is ready to pair with".into()));
                continue;
            };
            let room = policy.max_concurrent_nodes - testing;
            if room < 2 && testing > 0 {
                waiting.push((
                    c.to_string(),
                    format!("waiting for two test slots to pair with {partner}"),
                ));
                continue;
            }
            let run = TestRun {
                id: run_id(c, partner, now),
                server_node: c.to_string(),
                client_node: partner.to_string(),
                subjects: vec![c.to_string(), partner.to_string()],
                started_at: now,
                deadline: now.saturating_add(policy.test_timeout_seconds),
            };
            begin(next, &run, c, actions);
            begin(next, &run, partner, actions);
            busy.insert(c.to_string());
            busy.insert(partner.to_string());
            testing += 2;
        }
    }
    for (node, why) in waiting {
        if let Some(s) = next.get_mut(&node)
            && !matches!(s.phase, AdmissionPhase::Testing { .. })
        {
            s.waiting = Some(why);
        }
    }
}

fn begin(
    next: &mut BTreeMap<String, NodeAdmission>,
    run: &TestRun,
    node: &str,
    actions: &mut Vec<Action>,
) {
    let Some(state) = next.get_mut(node) else {
        return;
    };
    let previously_admitted = match &state.phase {
        AdmissionPhase::Admitted { at } => Some(*at),
        _ => None,
    };
    state.phase = AdmissionPhase::Testing {
        run: run.clone(),
        previously_admitted,
    };
    state.waiting = None;
    // One create per run, emitted with its first subject.
    if run.subjects.first().map(String::as_str) == Some(node) {
        actions.push(Action::CreateTestPods { run: run.clone() });
    }
    actions.push(event(
        node,
        EventType::Normal,
        "AdmissionTestStarted",
        format!(
            "perftests against {} started (run {}, deadline in {}s)",
            run.peer_of(node),
            run.id,
            run.deadline.saturating_sub(run.started_at)
        ),
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_caps() {
        let p = AdmissionPolicy {
            backoff_base_seconds: 30,
            backoff_max_seconds: 300,
            ..Default::default()
        };
        let got: Vec<u64> = (1..=7).map(|f| p.backoff(f)).collect();
        assert_eq!(got, vec![30, 60, 120, 240, 300, 300, 300]);
        assert_eq!(p.backoff(u32::MAX), 300);
    }

    #[test]
    fn run_ids_are_dns_labels_and_stable() {
        let a = run_id("node-a", "node-b", 1000);
        assert_eq!(a, run_id("node-a", "node-b", 1000));
        assert_ne!(a, run_id("node-a", "node-b", 1001));
        assert!(a.len() <= 63);
        assert!(
            a.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        );
    }

    #[test]
    fn invalid_policy_is_refused_with_the_field() {
        let p = AdmissionPolicy {
            max_concurrent_nodes: 0,
            ..Default::default()
        };
        let e = plan(&AdmissionInput::default(), &p)
            .unwrap_err()
            .to_string();
        assert!(e.contains("maxConcurrent"), "{e}");
    }
}
