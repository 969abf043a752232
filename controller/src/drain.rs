//! Draining nodes whose VFs must go but are held by pods
//! (`--drain-held-vfs`, off by default), within a disruption budget.
//!
//! The agent never pulls a VF from under a pod: it reports the holders in
//! `status.heldVfs` (and the `VfsHeld` condition). With draining on, the
//! controller takes such nodes in name order, as many as the budget
//! allows: it marks each with the [`DRAIN_ANNOTATION`] (and the time in
//! [`DRAIN_STARTED_ANNOTATION`]), cordons it (unless it was already
//! unschedulable), and evicts (policy/v1 Eviction, so PodDisruptionBudgets
//! hold) only the pods the agent named. Once the agent reports no held VFs
//! at the current spec, the mark goes and the node is uncordoned, but only
//! if kroce cordoned it. Turning the flag off releases a node mid-drain the
//! same way.
//!
//! The budget: at most `--drain-max-unavailable` (a count or a percentage,
//! default 1) of the nodes that have an `RdmaNodeState` unschedulable at
//! once, counting every node unschedulable for any reason (cordoned by
//! anyone, or tainted not-ready/unreachable), not only kroce's. An
//! `RdmaNetwork`'s `spec.maxUnavailable` replaces it for the nodes that
//! network needs drained (a held VF on a PF that carries the network),
//! counted over the nodes carrying that network; a node several such
//! networks need must fit in each. A node already unschedulable takes no
//! room: draining it makes nothing less available.
//!
//! A drain not done within `--drain-timeout-seconds` is given up: the node
//! is released (uncordoned if kroce cordoned it), gets
//! [`DRAIN_TIMED_OUT_ANNOTATION`] (the spec generation), a `DrainTimedOut`
//! event and a place in its networks' `status.drain`, and is skipped until
//! its spec changes, so one stuck PodDisruptionBudget does not hold the
//! rollout.
//!
//! [`plan_drain`] is the pure decision over plain data; [`step`] lists,
//! plans and acts; [`run`] repeats it; [`simulate_rollout`] (feature
//! `testing`) runs the planner against simulated agents on a simulated
//! clock.

use super::{Context, Error};
use k8s_openapi::api::core::v1::{Node, Pod};
use kroce_contracts::max_unavailable::MaxUnavailable;
use kroce_operator::crd::network::DRAIN_STATUS_MAX_NAMES;
use kroce_operator::crd::{DrainStatus, RdmaNetwork, RdmaNodeState};
use kroce_operator::names::DRAIN_MANAGER;
use kube::api::{EvictParams, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Api, Resource, ResourceExt};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// On a node kroce is draining; the value says whether kroce cordoned it.
pub use kroce_operator::names::DRAIN_ANNOTATION;
pub use kroce_operator::names::{DRAIN_STARTED_ANNOTATION, DRAIN_TIMED_OUT_ANNOTATION};
/// kroce set `spec.unschedulable`: it clears it when done.
pub const CORDONED_BY_KROCE: &str = "cordoned";
/// The node was unschedulable already: left so when done.
pub const ALREADY_CORDONED: &str = "already-cordoned";
/// How often the drain looks at the node states.
pub const DRAIN_INTERVAL: Duration = Duration::from_secs(15);
/// `--drain-timeout-seconds` by default: half an hour per node.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(1800);
/// Taints the node lifecycle controller puts on a node pods cannot reach:
/// such a node is unavailable already, as a cordoned one is.
pub const UNAVAILABLE_TAINTS: &[&str] = &[
    "node.kubernetes.io/unschedulable",
    "node.kubernetes.io/not-ready",
    "node.kubernetes.io/unreachable",
];

/// How the drain runs (the controller's flags and the networks' overrides).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrainPolicy {
    /// `--drain-held-vfs`.
    pub enabled: bool,
    /// `--drain-max-unavailable`: over every node with an `RdmaNodeState`.
    pub max_unavailable: MaxUnavailable,
    /// `spec.maxUnavailable` by network: over the nodes carrying it.
    pub overrides: BTreeMap<String, MaxUnavailable>,
    /// `--drain-timeout-seconds`.
    pub timeout: Duration,
}

impl Default for DrainPolicy {
    fn default() -> Self {
        DrainPolicy {
            enabled: false,
            max_unavailable: MaxUnavailable::default(),
            overrides: BTreeMap::new(),
            timeout: DEFAULT_DRAIN_TIMEOUT,
        }
    }
}

/// A node as the drain sees it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DrainNode {
    pub name: String,
    /// `spec.unschedulable` (cordoned, by anyone).
    pub unschedulable: bool,
    /// Tainted not-ready, unreachable or unschedulable ([`UNAVAILABLE_TAINTS`]).
    pub not_ready: bool,
    /// Value of [`DRAIN_ANNOTATION`], if set.
    pub mark: Option<String>,
    /// [`DRAIN_STARTED_ANNOTATION`] in Unix seconds, if set and readable.
    pub started: Option<i64>,
    /// [`DRAIN_TIMED_OUT_ANNOTATION`]: the generation a drain timed out at.
    pub timed_out: Option<i64>,
    /// Networks the node carries (its `RdmaNodeState` spec): the budgets it
    /// counts in besides the global one.
    pub networks: Vec<String>,
    /// From its `RdmaNodeState`; `None` when it has none.
    pub state: Option<HeldReport>,
}

impl DrainNode {
    /// Out of service now, for whatever reason.
    pub(crate) fn unavailable(&self) -> bool {
        self.unschedulable || self.not_ready || self.mark.is_some()
    }
}

/// What the agent last reported about held VFs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HeldReport {
    /// The report is about the current spec (`observedGeneration ==
    /// generation`); an older one says nothing about what must go now.
    pub current: bool,
    /// The `RdmaNodeState`'s `metadata.generation`.
    pub generation: Option<i64>,
    /// `namespace/name` of the pods holding VFs that must go, sorted, once each.
    pub pods: Vec<String>,
    /// Held VFs without a pod kroce can name (netdev moved away, other
    /// driver, pods not listable): eviction cannot free them.
    pub unnamed: Vec<String>,
    /// Networks on the PFs of the held VFs (sorted): who needs the drain,
    /// and so whose `spec.maxUnavailable` applies.
    pub needed_by: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DrainAction {
    /// Mark the node (cordoning it if `cordon`) and evict `pods`.
    Start {
        node: String,
        cordon: bool,
        pods: Vec<String>,
    },
    /// Drain under way: evict the pods still named; `stamp`: the node has
    /// no readable start time (a mark from before timeouts), set it now.
    Evict {
        node: String,
        pods: Vec<String>,
        stamp: bool,
    },
    /// Done (or abandoned): drop the mark; clear `spec.unschedulable` if `uncordon`.
    Finish {
        node: String,
        uncordon: bool,
        why: String,
    },
    /// Not drained within the timeout: drop the mark (uncordon if
    /// `uncordon`), record `generation` in [`DRAIN_TIMED_OUT_ANNOTATION`].
    TimedOut {
        node: String,
        uncordon: bool,
        generation: Option<i64>,
        pods: Vec<String>,
        waited: Duration,
    },
    /// Drop a [`DRAIN_TIMED_OUT_ANNOTATION`] that no longer applies (the
    /// node needs no drain any more).
    Forget { node: String },
    /// Needs a drain kroce will not start now; `why` says so.
    Wait { node: String, why: String },
}

impl DrainAction {
    pub fn node(&self) -> &str {
        match self {
            DrainAction::Start { node, .. }
            | DrainAction::Evict { node, .. }
            | DrainAction::Finish { node, .. }
            | DrainAction::TimedOut { node, .. }
            | DrainAction::Forget { node }
            | DrainAction::Wait { node, .. } => node,
        }
    }
}

/// One round's decisions, and what each network's `status.drain` should say.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DrainPlan {
    pub actions: Vec<DrainAction>,
    /// Networks some drain concerns (draining, waiting or timed out); every
    /// other network has no `status.drain`.
    pub status: BTreeMap<String, DrainStatus>,
    /// Nodes unschedulable after this round over the global scope.
    pub unavailable: usize,
    /// The global budget resolved against the nodes with a state.
    pub limit: usize,
    /// The reboots of this round (`--reboot-for-rdma-mode`, [`crate::reboot`]),
    /// planned after the drains within the same budget.
    pub reboots: Vec<crate::reboot::RebootAction>,
}

/// A `namespace/name` a Eviction can be addressed to (DNS-1123 names).
pub fn parse_pod_ref(s: &str) -> Option<(&str, &str)> {
    let (ns, name) = s.split_once('/')?;
    let ok = |p: &str| {
        !p.is_empty()
            && p.len() <= 253
            && p.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
    };
    (ok(ns) && ok(name)).then_some((ns, name))
}

impl HeldReport {
    /// From a node state's status, spec and generation.
    pub fn from_state(s: &RdmaNodeState) -> HeldReport {
        let Some(st) = &s.status else {
            return HeldReport {
                generation: s.metadata.generation,
                ..Default::default()
            };
        };
        let mut pods = BTreeSet::new();
        let mut unnamed = Vec::new();
        let mut needed_by = BTreeSet::new();
        for h in &st.held_vfs {
            let named: Vec<&String> = h
                .pods
                .iter()
                .filter(|p| parse_pod_ref(p).is_some())
                .collect();
            if named.is_empty() {
                unnamed.push(h.reason.clone());
            }
            pods.extend(named.into_iter().cloned());
            for pf in s.spec.pfs.iter().filter(|p| p.pci_address == h.pf) {
                needed_by.extend(pf.vf_groups.iter().map(|g| g.network.clone()));
            }
        }
        HeldReport {
            current: st.observed_generation.is_some()
                && st.observed_generation == s.metadata.generation,
            generation: s.metadata.generation,
            pods: pods.into_iter().collect(),
            unnamed,
            needed_by: needed_by.into_iter().collect(),
        }
    }
}

/// The networks an `RdmaNodeState` spec carries, sorted, once each.
pub fn networks_of(s: &RdmaNodeState) -> Vec<String> {
    let set: BTreeSet<&String> = s
        .spec
        .pfs
        .iter()
        .flat_map(|p| p.vf_groups.iter().map(|g| &g.network))
        .chain(s.spec.soft_devices.iter().map(|g| &g.network))
        .collect();
    set.into_iter().cloned().collect()
}

/// A budget's scope: every node with a state, or the nodes carrying a network.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Scope {
    Global,
    Network(String),
}

/// Each scope's room: its resolved limit and how many of its nodes are
/// unavailable, kept current as the round's decisions land.
pub(crate) struct Budgets {
    limit: BTreeMap<Scope, usize>,
    used: BTreeMap<Scope, usize>,
}

impl Budgets {
    pub(crate) fn new(nodes: &[&DrainNode], policy: &DrainPolicy) -> Budgets {
        let mut members: BTreeMap<Scope, usize> = BTreeMap::new();
        let mut used: BTreeMap<Scope, usize> = BTreeMap::new();
        for n in nodes.iter().filter(|n| n.state.is_some()) {
            for s in scopes_of(n, policy) {
                *members.entry(s.clone()).or_default() += 1;
                if n.unavailable() {
                    *used.entry(s).or_default() += 1;
                }
            }
        }
        let mut limit = BTreeMap::new();
        limit.insert(
            Scope::Global,
            policy
                .max_unavailable
                .resolve(members.get(&Scope::Global).copied().unwrap_or(0)),
        );
        for (net, budget) in &policy.overrides {
            let scope = Scope::Network(net.clone());
            let count = members.get(&scope).copied().unwrap_or(0);
            limit.insert(scope, budget.resolve(count));
        }
        Budgets { limit, used }
    }

    pub(crate) fn used(&self, s: &Scope) -> usize {
        self.used.get(s).copied().unwrap_or(0)
    }

    pub(crate) fn limit(&self, s: &Scope) -> usize {
        self.limit.get(s).copied().unwrap_or(usize::MAX)
    }

    /// The first scope in `governing` with no room for one more node.
    pub(crate) fn full<'a>(&self, governing: &'a [Scope]) -> Option<&'a Scope> {
        governing.iter().find(|s| self.used(s) >= self.limit(s))
    }

    pub(crate) fn add(&mut self, n: &DrainNode, policy: &DrainPolicy, delta: isize) {
        // Only nodes with a state are in any scope (see `new`).
        if n.state.is_none() {
            return;
        }
        for s in scopes_of(n, policy) {
            let u = self.used.entry(s).or_default();
            *u = u.saturating_add_signed(delta);
        }
    }
}

/// The scopes a node counts in: the global one and each overriding
/// network it carries.
fn scopes_of(n: &DrainNode, policy: &DrainPolicy) -> Vec<Scope> {
    std::iter::once(Scope::Global)
        .chain(
            n.networks
                .iter()
                .filter(|net| policy.overrides.contains_key(*net))
                .map(|net| Scope::Network(net.clone())),
        )
        .collect()
}

/// The budgets a node needing a drain must fit in: the overrides of the
/// networks that need it, else the global one.
pub(crate) fn governing(n: &DrainNode, policy: &DrainPolicy) -> Vec<Scope> {
    let own: Vec<Scope> = n
        .state
        .iter()
        .flat_map(|s| s.needed_by.iter())
        .filter(|net| policy.overrides.contains_key(*net))
        .map(|net| Scope::Network(net.clone()))
        .collect();
    if own.is_empty() {
        vec![Scope::Global]
    } else {
        own
    }
}

pub(crate) fn scope_text(s: &Scope, policy: &DrainPolicy) -> String {
    match s {
        Scope::Global => format!("--drain-max-unavailable={}", policy.max_unavailable),
        Scope::Network(n) => format!(
            "RdmaNetwork {n} maxUnavailable={}",
            policy
                .overrides
                .get(n)
                .map_or_else(String::new, ToString::to_string)
        ),
    }
}

/// Per-network tallies for `status.drain`.
#[derive(Default)]
struct Tally {
    draining: BTreeSet<String>,
    waiting: usize,
    timed_out: BTreeSet<String>,
}

/// Decides, for every node, what the drain does this round, at `now`
/// (Unix seconds). Nodes are taken by name; a node starts only while each
/// budget governing it has room, and every node out of service for any
/// reason counts against the budgets it is in. The budgets are never
/// exceeded by kroce: a scope over its limit (admins cordoning) only stops
/// new drains.
pub fn plan_drain(nodes: &[DrainNode], policy: &DrainPolicy, now: i64) -> DrainPlan {
    let mut sorted: Vec<&DrainNode> = nodes.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    let mut budgets = Budgets::new(&sorted, policy);
    let mut actions = Vec::new();
    let mut tally: BTreeMap<String, Tally> = BTreeMap::new();
    let needed_by = |n: &DrainNode| -> Vec<String> {
        n.state
            .as_ref()
            .map(|s| s.needed_by.clone())
            .unwrap_or_default()
    };
    let timeout = i64::try_from(policy.timeout.as_secs()).unwrap_or(i64::MAX);
    for n in sorted.iter().filter(|n| n.mark.is_some()) {
        let uncordon = n.mark.as_deref() == Some(CORDONED_BY_KROCE);
        let released = |why: &str, actions: &mut Vec<DrainAction>| {
            actions.push(DrainAction::Finish {
                node: n.name.clone(),
                uncordon,
                why: why.to_string(),
            });
        };
        match &n.state {
            _ if !policy.enabled => {
                released("draining is off (--drain-held-vfs=false)", &mut actions);
            }
            None => released("the node has no RdmaNodeState any more", &mut actions),
            Some(s) if s.current && s.pods.is_empty() => {
                released("no pod holds a VF that must go", &mut actions);
            }
            Some(s) => {
                if let Some(started) = n.started
                    && now.saturating_sub(started) >= timeout
                {
                    actions.push(DrainAction::TimedOut {
                        node: n.name.clone(),
                        uncordon,
                        generation: s.generation,
                        pods: s.pods.clone(),
                        waited: Duration::from_secs(
                            u64::try_from(now.saturating_sub(started)).unwrap_or(0),
                        ),
                    });
                    for net in needed_by(n) {
                        tally
                            .entry(net)
                            .or_default()
                            .timed_out
                            .insert(n.name.clone());
                    }
                } else {
                    if !s.pods.is_empty() || n.started.is_none() {
                        actions.push(DrainAction::Evict {
                            node: n.name.clone(),
                            pods: s.pods.clone(),
                            stamp: n.started.is_none(),
                        });
                    }
                    // A stale report: wait for the agent, still draining.
                    for net in needed_by(n) {
                        tally
                            .entry(net)
                            .or_default()
                            .draining
                            .insert(n.name.clone());
                    }
                    continue;
                }
            }
        }
        // Released: it frees room unless it stays unschedulable.
        let after = DrainNode {
            mark: None,
            unschedulable: n.unschedulable && !uncordon,
            ..(*n).clone()
        };
        if !after.unavailable() {
            budgets.add(n, policy, -1);
        }
    }
    for n in sorted.iter().filter(|n| n.mark.is_none()) {
        let Some(s) = &n.state else { continue };
        if !s.current {
            continue;
        }
        if s.pods.is_empty() {
            if n.timed_out.is_some() {
                actions.push(DrainAction::Forget {
                    node: n.name.clone(),
                });
            }
            if !s.unnamed.is_empty() {
                actions.push(DrainAction::Wait {
                    node: n.name.clone(),
                    why: format!("held VFs without a pod to evict: {}", s.unnamed.join("; ")),
                });
            }
            continue;
        }
        if !policy.enabled {
            continue;
        }
        if n.timed_out.is_some() && n.timed_out == s.generation {
            for net in &s.needed_by {
                tally
                    .entry(net.clone())
                    .or_default()
                    .timed_out
                    .insert(n.name.clone());
            }
            actions.push(DrainAction::Wait {
                node: n.name.clone(),
                why: format!(
                    "its drain timed out at generation {}: skipped until the spec changes \
                     (or {DRAIN_TIMED_OUT_ANNOTATION} is removed)",
                    s.generation.unwrap_or_default()
                ),
            });
            continue;
        }
        let gov = governing(n, policy);
        // Out of service already: draining it makes nothing less available.
        let full = if n.unavailable() {
            None
        } else {
            budgets.full(&gov)
        };
        match full {
            Some(scope) => {
                for net in &s.needed_by {
                    tally.entry(net.clone()).or_default().waiting += 1;
                }
                actions.push(DrainAction::Wait {
                    node: n.name.clone(),
                    why: format!(
                        "disruption budget full: {} of {} nodes unavailable ({})",
                        budgets.used(scope),
                        budgets.limit(scope),
                        scope_text(scope, policy)
                    ),
                });
            }
            None => {
                if !n.unavailable() {
                    budgets.add(n, policy, 1);
                }
                for net in &s.needed_by {
                    tally
                        .entry(net.clone())
                        .or_default()
                        .draining
                        .insert(n.name.clone());
                }
                actions.push(DrainAction::Start {
                    node: n.name.clone(),
                    cordon: !n.unschedulable,
                    pods: s.pods.clone(),
                });
            }
        }
    }
    let status = tally
        .into_iter()
        .map(|(net, t)| {
            let scope = if policy.overrides.contains_key(&net) {
                Scope::Network(net.clone())
            } else {
                Scope::Global
            };
            let names =
                |set: &BTreeSet<String>| set.iter().take(DRAIN_STATUS_MAX_NAMES).cloned().collect();
            let st = DrainStatus {
                max_unavailable: budgets.limit(&scope).try_into().unwrap_or(u32::MAX),
                unavailable_nodes: budgets.used(&scope).try_into().unwrap_or(u32::MAX),
                draining_nodes: t.draining.len().try_into().unwrap_or(u32::MAX),
                waiting_nodes: t.waiting.try_into().unwrap_or(u32::MAX),
                timed_out_nodes: t.timed_out.len().try_into().unwrap_or(u32::MAX),
                draining: names(&t.draining),
                timed_out: names(&t.timed_out),
            };
            (net, st)
        })
        .collect();
    DrainPlan {
        actions,
        status,
        unavailable: budgets.used(&Scope::Global),
        limit: budgets.limit(&Scope::Global),
        reboots: Vec::new(),
    }
}

/// A Node and its state as the drain sees them.
pub fn drain_node(n: &Node, state: Option<&RdmaNodeState>) -> DrainNode {
    let spec = n.spec.as_ref();
    let annotation = |k: &str| n.annotations().get(k).cloned();
    DrainNode {
        name: n.name_any(),
        unschedulable: spec.and_then(|s| s.unschedulable).unwrap_or(false),
        not_ready: spec.and_then(|s| s.taints.as_ref()).is_some_and(|t| {
            t.iter()
                .any(|t| UNAVAILABLE_TAINTS.contains(&t.key.as_str()))
        }),
        mark: annotation(DRAIN_ANNOTATION),
        started: annotation(DRAIN_STARTED_ANNOTATION)
            .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
            .map(|t| t.as_second()),
        timed_out: annotation(DRAIN_TIMED_OUT_ANNOTATION).and_then(|g| g.parse().ok()),
        networks: state.map(networks_of).unwrap_or_default(),
        state: state.map(HeldReport::from_state),
    }
}

/// The policy from the flags and the networks' `spec.maxUnavailable`; a
/// value the CRD's rule should have refused is logged and ignored.
pub fn policy_of(
    settings: &DrainSettings,
    networks: &[std::sync::Arc<RdmaNetwork>],
) -> DrainPolicy {
    let mut overrides = BTreeMap::new();
    for net in networks {
        let Some(text) = &net.spec.max_unavailable else {
            continue;
        };
        match text.parse::<MaxUnavailable>() {
            Ok(m) => {
                overrides.insert(net.name_any(), m);
            }
            Err(e) => tracing::warn!(
                network = %net.name_any(),
                "spec.maxUnavailable: {e}; --drain-max-unavailable applies"
            ),
        }
    }
    DrainPolicy {
        enabled: settings.enabled,
        max_unavailable: settings.max_unavailable,
        overrides,
        timeout: settings.timeout,
    }
}

/// The controller's drain flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrainSettings {
    /// `--drain-held-vfs`.
    pub enabled: bool,
    /// `--drain-max-unavailable`.
    pub max_unavailable: MaxUnavailable,
    /// `--drain-timeout-seconds`.
    pub timeout: Duration,
    /// `--reboot-for-rdma-mode`: drain and reboot nodes whose RDMA netns
    /// mode only a reboot applies, within the same budget and timeout.
    pub reboot: bool,
}

impl Default for DrainSettings {
    fn default() -> Self {
        DrainSettings {
            enabled: false,
            max_unavailable: MaxUnavailable::default(),
            timeout: DEFAULT_DRAIN_TIMEOUT,
            reboot: false,
        }
    }
}

impl DrainSettings {
    /// Draining on, with the default budget and timeout.
    pub fn on() -> DrainSettings {
        DrainSettings {
            enabled: true,
            ..Default::default()
        }
    }
}

pub(crate) async fn node_event(
    ctx: &Context,
    node: &Node,
    type_: EventType,
    reason: &str,
    note: String,
) {
    // One-offs: the recorder would hold every one of a fleet rollout's
    // events for minutes to count repeats that never come.
    ctx.event_once(&node.object_ref(&()), type_, reason, reason, note)
        .await;
}

/// Evicts each pod; gone already is fine, a PodDisruptionBudget refusal
/// (429) waits for the next round. Returns one line per pod.
pub(crate) async fn evict(
    ctx: &Context,
    pods: &[String],
    errors: &mut Vec<kube::Error>,
) -> Vec<String> {
    let mut out = Vec::new();
    for p in pods {
        let Some((ns, name)) = parse_pod_ref(p) else {
            continue;
        };
        let api: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
        match api.evict(name, &EvictParams::default()).await {
            Ok(_) => out.push(format!("evicted {p}")),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(kube::Error::Api(s)) if s.code == 429 => {
                out.push(format!("eviction of {p} refused for now: {}", s.message));
            }
            Err(e) => errors.push(e),
        }
    }
    out
}

pub(crate) fn rfc3339(unix: i64) -> String {
    k8s_openapi::jiff::Timestamp::from_second(unix)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// Writes each network's `status.drain` where it differs from the store
/// (server-side apply, field manager [`DRAIN_MANAGER`]): set, changed, or
/// dropped when no drain concerns the network any more.
async fn write_status(
    ctx: &Context,
    networks: &[std::sync::Arc<RdmaNetwork>],
    want: &BTreeMap<String, DrainStatus>,
    errors: &mut Vec<kube::Error>,
) -> usize {
    let api: Api<RdmaNetwork> = Api::all(ctx.client.clone());
    let pp = PatchParams::apply(DRAIN_MANAGER).force();
    let mut written = 0;
    for net in networks {
        let name = net.name_any();
        let have = net.status.as_ref().and_then(|s| s.drain.as_ref());
        let want = want.get(&name);
        if have == want {
            continue;
        }
        // Without `drain`, the apply drops the field this manager owned.
        let status = match want {
            Some(d) => serde_json::json!({"drain": d}),
            None => serde_json::json!({}),
        };
        let body = serde_json::json!({
            "apiVersion": "kroce.io/v1alpha1",
            "kind": "RdmaNetwork",
            "status": status,
        });
        match api.patch_status(&name, &pp, &Patch::Apply(&body)).await {
            Ok(_) => written += 1,
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => errors.push(e),
        }
    }
    written
}

/// One round: nodes, node states and networks from the stores, plan, act
/// at `now` (Unix seconds). Every action is tried; the first error is
/// returned after the rest ran.
pub async fn step_at(
    ctx: &Context,
    settings: &DrainSettings,
    now: i64,
) -> Result<DrainPlan, Error> {
    let nodes = ctx.stores.nodes();
    let states = ctx.stores.states_by_name();
    let networks = ctx.stores.networks();
    let views: Vec<DrainNode> = nodes
        .iter()
        .map(|n| drain_node(n, states.get(&n.name_any()).map(|s| s.as_ref())))
        .collect();
    let policy = policy_of(settings, &networks);
    let mut plan = plan_drain(&views, &policy, now);
    // Reboots after drains, in the same budget: the drain's starts of this
    // round count, and a node kroce drains for held VFs is not rebooted.
    let drain_started: BTreeSet<String> = plan
        .actions
        .iter()
        .filter(|a| matches!(a, DrainAction::Start { .. }))
        .map(|a| a.node().to_string())
        .collect();
    let reboot_views: Vec<crate::reboot::RebootNode> = nodes
        .iter()
        .map(|n| crate::reboot::RebootNode::of(n, states.get(&n.name_any()).map(|s| s.as_ref())))
        .collect();
    let reboot_plan =
        crate::reboot::plan_reboot(&reboot_views, settings.reboot, &policy, &drain_started, now);
    crate::reboot::merge_status(&mut plan.status, reboot_plan.status.clone());
    let by_name: BTreeMap<String, &std::sync::Arc<Node>> =
        nodes.iter().map(|n| (n.name_any(), n)).collect();
    let api: Api<Node> = Api::all(ctx.client.clone());
    let pp = PatchParams::default();
    let mut errors = Vec::new();
    for a in &plan.actions {
        let node_name = a.node();
        let Some(node) = by_name.get(node_name) else {
            continue;
        };
        match a {
            DrainAction::Start { cordon, pods, .. } => {
                let mark = if *cordon {
                    CORDONED_BY_KROCE
                } else {
                    ALREADY_CORDONED
                };
                let mut patch = serde_json::json!({
                    "metadata": {"annotations": {
                        DRAIN_ANNOTATION: mark,
                        DRAIN_STARTED_ANNOTATION: rfc3339(now),
                        DRAIN_TIMED_OUT_ANNOTATION: null,
                    }}
                });
                if *cordon {
                    patch["spec"] = serde_json::json!({"unschedulable": true});
                }
                if let Err(e) = api.patch(node_name, &pp, &Patch::Merge(&patch)).await {
                    errors.push(e);
                    continue;
                }
                let evicted = evict(ctx, pods, &mut errors).await;
                node_event(
                    ctx,
                    node,
                    EventType::Warning,
                    "DrainingHeldVfs",
                    format!(
                        "{}; pods hold VFs that must go: {}",
                        if *cordon {
                            "cordoned"
                        } else {
                            "already unschedulable"
                        },
                        if evicted.is_empty() {
                            pods.join(", ")
                        } else {
                            evicted.join(", ")
                        }
                    ),
                )
                .await;
            }
            DrainAction::Evict { pods, stamp, .. } => {
                if *stamp {
                    let patch = serde_json::json!({
                        "metadata": {"annotations": {DRAIN_STARTED_ANNOTATION: rfc3339(now)}}
                    });
                    if let Err(e) = api.patch(node_name, &pp, &Patch::Merge(&patch)).await {
                        errors.push(e);
                    }
                }
                let evicted = evict(ctx, pods, &mut errors).await;
                if !evicted.is_empty() {
                    node_event(
                        ctx,
                        node,
                        EventType::Normal,
                        "EvictingHeldVfs",
                        evicted.join(", "),
                    )
                    .await;
                }
            }
            DrainAction::Finish { uncordon, why, .. } => {
                let mut patch = serde_json::json!({
                    "metadata": {"annotations": {
                        DRAIN_ANNOTATION: null,
                        DRAIN_STARTED_ANNOTATION: null,
                    }}
                });
                if *uncordon {
                    patch["spec"] = serde_json::json!({"unschedulable": null});
                }
                if let Err(e) = api.patch(node_name, &pp, &Patch::Merge(&patch)).await {
                    errors.push(e);
                    continue;
                }
                node_event(
                    ctx,
                    node,
                    EventType::Normal,
                    "DrainFinished",
                    format!(
                        "{why}; {}",
                        if *uncordon {
                            "uncordoned"
                        } else {
                            "left unschedulable as it was before"
                        }
                    ),
                )
                .await;
            }
            DrainAction::TimedOut {
                uncordon,
                generation,
                pods,
                waited,
                ..
            } => {
                let mut patch = serde_json::json!({
                    "metadata": {"annotations": {
                        DRAIN_ANNOTATION: null,
                        DRAIN_STARTED_ANNOTATION: null,
                        DRAIN_TIMED_OUT_ANNOTATION: generation.unwrap_or_default().to_string(),
                    }}
                });
                if *uncordon {
                    patch["spec"] = serde_json::json!({"unschedulable": null});
                }
                if let Err(e) = api.patch(node_name, &pp, &Patch::Merge(&patch)).await {
                    errors.push(e);
                    continue;
                }
                node_event(
                    ctx,
                    node,
                    EventType::Warning,
                    "DrainTimedOut",
                    format!(
                        "not drained after {} s (--drain-timeout-seconds={}); still holding VFs \
                         that must go: {}; {} and skipped until its spec changes (or \
                         {DRAIN_TIMED_OUT_ANNOTATION} is removed)",
                        waited.as_secs(),
                        settings.timeout.as_secs(),
                        if pods.is_empty() {
                            "pods not yet re-reported".to_string()
                        } else {
                            pods.join(", ")
                        },
                        if *uncordon {
                            "uncordoned"
                        } else {
                            "left unschedulable as it was before"
                        }
                    ),
                )
                .await;
            }
            DrainAction::Forget { .. } => {
                let patch = serde_json::json!({
                    "metadata": {"annotations": {DRAIN_TIMED_OUT_ANNOTATION: null}}
                });
                if let Err(e) = api.patch(node_name, &pp, &Patch::Merge(&patch)).await {
                    errors.push(e);
                }
            }
            DrainAction::Wait { why, .. } => {
                tracing::debug!(node = %node_name, %why, "not draining");
            }
        }
    }
    crate::reboot::act(
        ctx,
        &reboot_plan,
        &by_name,
        settings.timeout,
        now,
        &mut errors,
    )
    .await;
    plan.reboots = reboot_plan.actions;
    write_status(ctx, &networks, &plan.status, &mut errors).await;
    match errors.into_iter().next() {
        Some(e) => Err(e.into()),
        None => Ok(plan),
    }
}

/// [`step_at`] now.
pub async fn step(ctx: &Context, settings: &DrainSettings) -> Result<DrainPlan, Error> {
    step_at(
        ctx,
        settings,
        k8s_openapi::jiff::Timestamp::now().as_second(),
    )
    .await
}

/// Repeats [`step`] every [`DRAIN_INTERVAL`]. Off, it runs once (releasing
/// any node an earlier run left marked) and then idles. It never returns: a
/// failed round is logged and counted, and the next one tries again.
pub async fn run(ctx: Context, settings: DrainSettings) -> std::convert::Infallible {
    loop {
        match step(&ctx, &settings).await {
            Ok(plan) => {
                let mut waiting = 0;
                for a in &plan.actions {
                    if matches!(a, DrainAction::Wait { .. }) {
                        waiting += 1;
                    } else {
                        tracing::info!(action = ?a, "drain");
                    }
                }
                for a in &plan.reboots {
                    match a {
                        crate::reboot::RebootAction::Wait { node, why } => {
                            tracing::debug!(%node, %why, "not rebooting");
                        }
                        a => tracing::info!(action = ?a, "reboot for the RDMA netns mode"),
                    }
                }
                if waiting > 0 {
                    tracing::info!(
                        waiting,
                        unavailable = plan.unavailable,
                        budget = plan.limit,
                        "nodes waiting to be drained"
                    );
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "drain round failed");
                ctx.metrics.failed("Drain");
            }
        }
        if !settings.enabled && !settings.reboot {
            std::future::pending::<()>().await;
        }
        tokio::time::sleep(DRAIN_INTERVAL).await;
    }
}

/// A fleet rollout to simulate: `nodes` nodes, each holding VFs a spec
/// change removes (one pod each), the agent answering "nothing held"
/// `drain_secs(i)` seconds after node `i`'s drain started; `stuck` nodes
/// never answer (a PodDisruptionBudget that never allows the eviction);
/// `cordoned` nodes are unschedulable for other reasons all along.
#[cfg(any(test, feature = "testing"))]
#[derive(Debug, Clone)]
pub struct Rollout {
    pub nodes: usize,
    pub budget: MaxUnavailable,
    pub timeout: Duration,
    pub drain_secs: fn(usize) -> i64,
    pub stuck: BTreeSet<usize>,
    pub cordoned: BTreeSet<usize>,
}

/// What a simulated rollout took.
#[cfg(any(test, feature = "testing"))]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RolloutResult {
    /// Simulated seconds from the spec change until no node needs a drain
    /// and none is marked.
    pub seconds: i64,
    /// The global budget, resolved.
    pub limit: usize,
    /// Most nodes unschedulable at once (any reason), after any round.
    pub peak_unavailable: usize,
    /// Most nodes kroce had cordoned at once.
    pub peak_cordoned: usize,
    /// Drain rounds that changed something.
    pub rounds: usize,
    pub drained: usize,
    pub timed_out: Vec<String>,
}

/// Runs [`plan_drain`] against simulated agents on a simulated clock in
/// [`DRAIN_INTERVAL`] steps (jumping over rounds in which nothing can
/// change), applying each decision as [`step`] would.
#[cfg(any(test, feature = "testing"))]
pub fn simulate_rollout(r: &Rollout) -> RolloutResult {
    let interval = i64::try_from(DRAIN_INTERVAL.as_secs()).unwrap_or(15);
    let timeout = i64::try_from(r.timeout.as_secs()).unwrap_or(i64::MAX);
    let generation = Some(2);
    let mut nodes: Vec<DrainNode> = (0..r.nodes)
        .map(|i| DrainNode {
            name: format!("node-{i:05}"),
            unschedulable: r.cordoned.contains(&i),
            networks: vec!["net0".into()],
            state: Some(HeldReport {
                current: true,
                generation,
                pods: vec![format!("team-a/job-{i}")],
                unnamed: vec![],
                needed_by: vec!["net0".into()],
            }),
            ..Default::default()
        })
        .collect();
    let index: BTreeMap<String, usize> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.name.clone(), i))
        .collect();
    let policy = DrainPolicy {
        enabled: true,
        max_unavailable: r.budget,
        overrides: BTreeMap::new(),
        timeout: r.timeout,
    };
    // When each drained node's agent reports nothing held.
    let mut answers: BTreeMap<i64, Vec<usize>> = BTreeMap::new();
    let (mut now, mut rounds, mut drained) = (0i64, 0usize, 0usize);
    let (mut peak_unavailable, mut peak_cordoned) = (0, 0);
    let mut limit;
    let mut timed_out = Vec::new();
    loop {
        // The agents that answered by now.
        let due: Vec<i64> = answers.range(..=now).map(|(t, _)| *t).collect();
        for t in due {
            for i in answers.remove(&t).unwrap_or_default() {
                if let Some(s) = nodes[i].state.as_mut() {
                    s.pods.clear();
                }
            }
        }
        let plan = plan_drain(&nodes, &policy, now);
        limit = plan.limit;
        let mut changed = false;
        for a in &plan.actions {
            let Some(&i) = index.get(a.node()) else {
                continue;
            };
            let n = &mut nodes[i];
            match a {
                DrainAction::Start { cordon, .. } => {
                    changed = true;
                    n.mark = Some(
                        if *cordon {
                            CORDONED_BY_KROCE
                        } else {
                            ALREADY_CORDONED
                        }
                        .into(),
                    );
                    n.unschedulable = true;
                    n.started = Some(now);
                    n.timed_out = None;
                    if !r.stuck.contains(&i) {
                        answers.entry(now + (r.drain_secs)(i)).or_default().push(i);
                    }
                }
                DrainAction::Finish { uncordon, .. } => {
                    changed = true;
                    drained += 1;
                    n.mark = None;
                    n.started = None;
                    n.unschedulable &= !uncordon;
                }
                DrainAction::TimedOut {
                    uncordon,
                    generation,
                    ..
                } => {
                    changed = true;
                    timed_out.push(n.name.clone());
                    n.mark = None;
                    n.started = None;
                    n.unschedulable &= !uncordon;
                    n.timed_out = *generation;
                }
                DrainAction::Forget { .. } => n.timed_out = None,
                DrainAction::Evict { .. } | DrainAction::Wait { .. } => {}
            }
        }
        let unavailable = nodes.iter().filter(|n| n.unavailable()).count();
        let cordoned = nodes
            .iter()
            .filter(|n| n.mark.as_deref() == Some(CORDONED_BY_KROCE))
            .count();
        peak_unavailable = peak_unavailable.max(unavailable);
        peak_cordoned = peak_cordoned.max(cordoned);
        rounds += usize::from(changed);
        let busy = nodes.iter().any(|n| n.mark.is_some());
        if !busy && answers.is_empty() {
            break;
        }
        // The next round anything can change in: an agent answering or a
        // drain timing out, on the drain's 15 s tick.
        let next_answer = answers.keys().next().copied();
        let next_timeout = nodes
            .iter()
            .filter_map(|n| n.started.map(|s| s + timeout))
            .min();
        let next = [next_answer, next_timeout]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(now + interval)
            .max(now + 1);
        now = (next + interval - 1) / interval * interval;
    }
    RolloutResult {
        seconds: now,
        limit,
        peak_unavailable,
        peak_cordoned,
        rounds,
        drained,
        timed_out,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, pods: &[&str]) -> DrainNode {
        DrainNode {
            name: name.into(),
            state: Some(HeldReport {
                current: true,
                generation: Some(2),
                pods: pods.iter().map(|p| p.to_string()).collect(),
                unnamed: vec![],
                needed_by: vec!["net-a".into()],
            }),
            networks: vec!["net-a".into()],
            ..Default::default()
        }
    }

    fn on() -> DrainPolicy {
        DrainPolicy {
            enabled: true,
            ..Default::default()
        }
    }

    fn off() -> DrainPolicy {
        DrainPolicy::default()
    }

    /// The actions of one round at t = 0 (no start time: no timeout).
    fn plan(nodes: &[DrainNode], enabled: bool) -> Vec<DrainAction> {
        plan_drain(nodes, &if enabled { on() } else { off() }, 0).actions
    }

    const FULL: &str =
        "disruption budget full: 1 of 1 nodes unavailable (--drain-max-unavailable=1)";

    #[test]
    fn one_node_at_a_time_and_only_the_named_pods() {
        let nodes = [
            node("n2", &["team-a/b-0"]),
            node("n1", &["team-a/a-0", "team-b/a-1"]),
            node("n3", &[]),
        ];
        let a = plan(&nodes, true);
        assert_eq!(
            a,
            [
                DrainAction::Start {
                    node: "n1".into(),
                    cordon: true,
                    pods: vec!["team-a/a-0".into(), "team-b/a-1".into()],
                },
                DrainAction::Wait {
                    node: "n2".into(),
                    why: FULL.into()
                },
            ]
        );
        // Off: nothing starts.
        assert!(plan(&nodes, false).is_empty());
    }

    #[test]
    fn a_drain_continues_then_finishes_and_uncordons_only_what_kroce_cordoned() {
        let mut n1 = node("n1", &["team-a/a-0"]);
        n1.mark = Some(CORDONED_BY_KROCE.into());
        n1.started = Some(0);
        n1.unschedulable = true;
        let n2 = node("n2", &["team-a/b-0"]);
        assert_eq!(
            plan(&[n1.clone(), n2.clone()], true),
            [
                DrainAction::Evict {
                    node: "n1".into(),
                    pods: vec!["team-a/a-0".into()],
                    stamp: false,
                },
                DrainAction::Wait {
                    node: "n2".into(),
                    why: FULL.into()
                },
            ]
        );
        // The agent has not re-reported since the spec changed: keep waiting.
        let mut stale = n1.clone();
        stale.state = Some(HeldReport {
            current: false,
            ..Default::default()
        });
        assert!(matches!(
            plan(&[stale, n2.clone()], true)[..],
            [DrainAction::Wait { .. }]
        ));
        // Nothing held at the current spec: done, and n2's turn comes in
        // the same round (n1 is released first).
        n1.state = Some(HeldReport {
            current: true,
            ..Default::default()
        });
        let a = plan(&[n2.clone(), n1.clone()], true);
        assert!(
            matches!(
                &a[..],
                [
                    DrainAction::Finish { node: f, uncordon: true, .. },
                    DrainAction::Start { node: s, .. },
                ] if f == "n1" && s == "n2"
            ),
            "{a:?}"
        );
        // A node that was cordoned before kroce came stays cordoned.
        n1.mark = Some(ALREADY_CORDONED.into());
        assert!(matches!(
            &plan(&[n1.clone()], true)[..],
            [DrainAction::Finish {
                uncordon: false,
                ..
            }]
        ));
        // Turning draining off releases a node mid-drain.
        let mut mid = node("n1", &["team-a/a-0"]);
        mid.mark = Some(CORDONED_BY_KROCE.into());
        mid.started = Some(0);
        assert!(matches!(
            &plan(&[mid.clone()], false)[..],
            [DrainAction::Finish { uncordon: true, .. }]
        ));
        // And so does a node state that went away.
        mid.state = None;
        assert!(matches!(
            &plan(&[mid], true)[..],
            [DrainAction::Finish { .. }]
        ));
    }

    #[test]
    fn an_unschedulable_node_is_not_cordoned_again_and_unnamed_holders_wait() {
        let mut n = node("n1", &["team-a/a-0"]);
        n.unschedulable = true;
        assert!(matches!(
            &plan(&[n], true)[..],
            [DrainAction::Start { cordon: false, .. }]
        ));
        let mut u = node("n1", &[]);
        if let Some(s) = u.state.as_mut() {
            s.unnamed = vec!["VF 5 (0000:3b:00.7) has no netdev in the host namespace".into()];
        }
        let a = plan(&[u], true);
        assert!(
            matches!(&a[..], [DrainAction::Wait { why, .. }] if why.contains("VF 5")),
            "{a:?}"
        );
    }

    #[test]
    fn held_report_names_only_addressable_pods() {
        let mut s = RdmaNodeState::new("n1", Default::default());
        s.metadata.generation = Some(3);
        s.status = Some(kroce_operator::crd::RdmaNodeStateStatus {
            observed_generation: Some(3),
            held_vfs: vec![
                kroce_operator::crd::HeldVf {
                    pods: vec!["team-a/a-0".into(), "team-a/a-0".into()],
                    reason: "VF 1 held".into(),
                    ..Default::default()
                },
                kroce_operator::crd::HeldVf {
                    pods: vec!["unknown pods (cannot list pods on this node: 403)".into()],
                    reason: "VF 2 held by unknown pods".into(),
                    ..Default::default()
                },
            ],
            ..Default::default()
        });
        let r = HeldReport::from_state(&s);
        assert!(r.current);
        assert_eq!(r.pods, ["team-a/a-0"]);
        assert_eq!(r.unnamed, ["VF 2 held by unknown pods"]);
        s.metadata.generation = Some(4);
        assert!(!HeldReport::from_state(&s).current);
        // Who needs the drain: the networks on the PF of a held VF.
        s.spec.pfs = vec![
            serde_json::from_value(serde_json::json!({
                "pciAddress": "0000:3b:00.0", "ifName": "ens1f0", "numVfs": 4,
                "vfGroups": [{"network": "net-b", "resourceName": "rdma/b", "vfRange": "2-3"},
                             {"network": "net-a", "resourceName": "rdma/a", "vfRange": "0-1"}]
            }))
            .unwrap(),
        ];
        if let Some(st) = s.status.as_mut() {
            st.held_vfs[0].pf = "0000:3b:00.0".into();
        }
        assert_eq!(HeldReport::from_state(&s).needed_by, ["net-a", "net-b"]);
        assert_eq!(networks_of(&s), ["net-a", "net-b"]);
        assert_eq!(parse_pod_ref("a/b"), Some(("a", "b")));
        assert_eq!(parse_pod_ref("a/"), None);
        assert_eq!(parse_pod_ref("A/b"), None);
    }

    /// A node of network `net` holding one pod's VFs (or none: `pods` empty).
    fn on_net(name: &str, net: &str, holding: bool) -> DrainNode {
        let mut n = node(name, if holding { &["team-a/p-0"] } else { &[] });
        n.networks = vec![net.into()];
        if let Some(s) = n.state.as_mut() {
            s.needed_by = if holding { vec![net.into()] } else { vec![] };
        }
        n
    }

    fn policy(global: &str, overrides: &[(&str, &str)]) -> DrainPolicy {
        DrainPolicy {
            enabled: true,
            max_unavailable: global.parse().unwrap(),
            overrides: overrides
                .iter()
                .map(|(n, m)| (n.to_string(), m.parse().unwrap()))
                .collect(),
            timeout: Duration::from_secs(1800),
        }
    }

    /// (started, waiting) node names of a plan, in order.
    fn starts_and_waits(p: &DrainPlan) -> (Vec<&str>, Vec<&str>) {
        let pick = |f: fn(&DrainAction) -> bool| {
            p.actions
                .iter()
                .filter(|a| f(a))
                .map(|a| a.node())
                .collect()
        };
        (
            pick(|a| matches!(a, DrainAction::Start { .. })),
            pick(|a| matches!(a, DrainAction::Wait { .. })),
        )
    }

    #[test]
    fn the_budget_table() {
        let held = |name: &str| on_net(name, "net-a", true);
        let idle = |name: &str| on_net(name, "net-a", false);
        let cordoned = |mut n: DrainNode| {
            n.unschedulable = true;
            n
        };
        let not_ready = |mut n: DrainNode| {
            n.not_ready = true;
            n
        };
        let draining = |mut n: DrainNode| {
            n.mark = Some(CORDONED_BY_KROCE.into());
            n.unschedulable = true;
            n.started = Some(0);
            n
        };
        let with = |mut n: DrainNode, nets: &[&str]| {
            n.networks = nets.iter().map(|s| s.to_string()).collect();
            if let Some(s) = n.state.as_mut() {
                s.needed_by = n.networks.clone();
            }
            n
        };
        type Case<'a> = (
            &'a str,
            Vec<DrainNode>,
            DrainPolicy,
            &'a [&'a str],
            &'a [&'a str],
        );
        let cases: Vec<Case> = vec![
            (
                "budget 1: one node, by name",
                vec![held("n3"), held("n1"), held("n2")],
                policy("1", &[]),
                &["n1"],
                &["n2", "n3"],
            ),
            (
                "budget 2",
                vec![held("n3"), held("n1"), held("n2")],
                policy("2", &[]),
                &["n1", "n2"],
                &["n3"],
            ),
            (
                "50% of the 4 nodes with a state, idle ones included",
                vec![held("n1"), held("n2"), held("n3"), idle("n4")],
                policy("50%", &[]),
                &["n1", "n2"],
                &["n3"],
            ),
            (
                "10% of 4 rounds down to 0, but at least 1",
                vec![held("n1"), held("n2"), held("n3"), idle("n4")],
                policy("10%", &[]),
                &["n1"],
                &["n2", "n3"],
            ),
            (
                "a node cordoned by an admin counts",
                vec![held("n1"), held("n2"), held("n3"), cordoned(idle("n9"))],
                policy("2", &[]),
                &["n1"],
                &["n2", "n3"],
            ),
            (
                "so does a not-ready node",
                vec![held("n1"), held("n2"), not_ready(idle("n9"))],
                policy("2", &[]),
                &["n1"],
                &["n2"],
            ),
            (
                "an unschedulable node needing a drain is drained without taking room",
                vec![held("n1"), cordoned(held("n2"))],
                policy("1", &[]),
                &["n2"],
                &["n1"],
            ),
            (
                "a drain under way takes its room",
                vec![draining(held("n1")), held("n2"), held("n3")],
                policy("2", &[]),
                &["n2"],
                &["n3"],
            ),
            (
                "over the budget already (admins): nothing starts",
                vec![
                    held("n1"),
                    cordoned(idle("n7")),
                    cordoned(idle("n8")),
                    cordoned(idle("n9")),
                ],
                policy("2", &[]),
                &[],
                &["n1"],
            ),
            (
                "a node released for losing its state gave no room it did not take",
                vec![
                    {
                        let mut m = draining(idle("m0"));
                        m.state = None;
                        m
                    },
                    held("n1"),
                    held("n2"),
                    cordoned(idle("n9")),
                ],
                policy("2", &[]),
                &["n1"],
                &["n2"],
            ),
            (
                "a network's maxUnavailable replaces the global budget for its nodes",
                vec![
                    held("a1"),
                    held("a2"),
                    with(held("b1"), &["net-b"]),
                    with(held("b2"), &["net-b"]),
                    with(held("b3"), &["net-b"]),
                ],
                policy("1", &[("net-b", "2")]),
                &["a1", "b1", "b2"],
                &["a2", "b3"],
            ),
            (
                "a percentage override counts the nodes carrying the network",
                vec![
                    with(held("b1"), &["net-b"]),
                    with(held("b2"), &["net-b"]),
                    with(held("b3"), &["net-b"]),
                    with(idle("b4"), &["net-b"]),
                    held("a1"),
                    held("a2"),
                ],
                policy("100%", &[("net-b", "50%")]),
                &["a1", "a2", "b1", "b2"],
                &["b3"],
            ),
            (
                "a node two overriding networks need fits in both",
                vec![
                    with(held("x1"), &["net-b", "net-c"]),
                    with(cordoned(idle("c9")), &["net-c"]),
                    with(held("b1"), &["net-b"]),
                ],
                policy("1", &[("net-b", "2"), ("net-c", "1")]),
                &["b1"],
                &["x1"],
            ),
        ];
        for (case, nodes, pol, starts, waits) in cases {
            let plan = plan_drain(&nodes, &pol, 60);
            let (s, w) = starts_and_waits(&plan);
            assert_eq!((&s[..], &w[..]), (starts, waits), "{case}: {plan:#?}");
            // Never above the budget by kroce's doing: the nodes with a
            // state unavailable after the round's actions stay within the
            // limit, or within what admins had made them before.
            let in_scope = |v: &[DrainNode]| {
                v.iter()
                    .filter(|n| n.state.is_some() && n.unavailable())
                    .count()
            };
            let before = in_scope(&nodes);
            let mut after = nodes.clone();
            for a in &plan.actions {
                let Some(n) = after.iter_mut().find(|n| n.name == a.node()) else {
                    continue;
                };
                match a {
                    DrainAction::Start { .. } => n.mark = Some(CORDONED_BY_KROCE.into()),
                    DrainAction::Finish { uncordon, .. }
                    | DrainAction::TimedOut { uncordon, .. } => {
                        n.mark = None;
                        n.unschedulable &= !uncordon;
                    }
                    _ => {}
                }
            }
            if pol.overrides.is_empty() {
                let after = in_scope(&after);
                assert!(
                    after <= plan.limit.max(before),
                    "{case}: {before} -> {after} above {}",
                    plan.limit
                );
                assert_eq!(plan.unavailable, after, "{case}");
            }
        }
    }

    #[test]
    fn wait_reasons_name_the_budget() {
        let nodes = [
            with_net(on_net("x1", "net-c", true), &["net-b", "net-c"]),
            {
                let mut c = on_net("c9", "net-c", false);
                c.unschedulable = true;
                c
            },
        ];
        let plan = plan_drain(&nodes, &policy("1", &[("net-b", "2"), ("net-c", "1")]), 0);
        assert_eq!(
            plan.actions,
            [DrainAction::Wait {
                node: "x1".into(),
                why: "disruption budget full: 1 of 1 nodes unavailable (RdmaNetwork net-c maxUnavailable=1)".into()
            }]
        );
        let st = &plan.status["net-c"];
        assert_eq!(
            (
                st.max_unavailable,
                st.unavailable_nodes,
                st.waiting_nodes,
                st.draining_nodes
            ),
            (1, 1, 1, 0)
        );
        assert_eq!(plan.status["net-b"].max_unavailable, 2);
    }

    fn with_net(mut n: DrainNode, nets: &[&str]) -> DrainNode {
        n.networks = nets.iter().map(|s| s.to_string()).collect();
        if let Some(s) = n.state.as_mut() {
            s.needed_by = n.networks.clone();
        }
        n
    }

    #[test]
    fn a_drain_that_times_out_is_released_skipped_and_retried_on_a_new_spec() {
        let pol = policy("1", &[]);
        let mut n1 = on_net("n1", "net-a", true);
        n1.mark = Some(CORDONED_BY_KROCE.into());
        n1.unschedulable = true;
        n1.started = Some(1_000);
        let n2 = on_net("n2", "net-a", true);
        // Within the timeout: still evicting, n2 waits.
        let p = plan_drain(&[n1.clone(), n2.clone()], &pol, 1_000 + 1_799);
        assert_eq!(starts_and_waits(&p), (vec![], vec!["n2"]));
        assert!(matches!(
            &p.actions[0],
            DrainAction::Evict { stamp: false, .. }
        ));
        assert_eq!(p.status["net-a"].draining, ["n1"]);
        // At the timeout: released (uncordoned), and n2 takes the room in
        // the same round.
        let p = plan_drain(&[n1.clone(), n2.clone()], &pol, 1_000 + 1_800);
        assert_eq!(
            p.actions[0],
            DrainAction::TimedOut {
                node: "n1".into(),
                uncordon: true,
                generation: Some(2),
                pods: vec!["team-a/p-0".into()],
                waited: Duration::from_secs(1_800),
            }
        );
        assert_eq!(starts_and_waits(&p), (vec!["n2"], vec![]));
        let st = &p.status["net-a"];
        assert_eq!((st.timed_out_nodes, st.draining_nodes), (1, 1));
        assert_eq!(st.timed_out, ["n1"]);
        // Afterwards: skipped at that generation, not holding the budget.
        let mut skipped = n1.clone();
        skipped.mark = None;
        skipped.started = None;
        skipped.unschedulable = false;
        skipped.timed_out = Some(2);
        let n3 = on_net("n3", "net-a", true);
        let p = plan_drain(&[skipped.clone(), n3.clone()], &pol, 5_000);
        assert_eq!(starts_and_waits(&p), (vec!["n3"], vec!["n1"]));
        assert_eq!(p.status["net-a"].timed_out, ["n1"]);
        // A new spec (generation 3): its turn again, first by name.
        if let Some(s) = skipped.state.as_mut() {
            s.generation = Some(3);
        }
        let p = plan_drain(&[skipped.clone(), n3.clone()], &pol, 5_000);
        assert_eq!(starts_and_waits(&p), (vec!["n1"], vec!["n3"]));
        // Nothing held any more: the timed-out record goes.
        if let Some(s) = skipped.state.as_mut() {
            s.pods.clear();
        }
        assert_eq!(
            plan_drain(&[skipped], &pol, 5_000).actions,
            [DrainAction::Forget { node: "n1".into() }]
        );
        // A mark from before timeouts (no start time) gets one, never times out unstamped.
        let mut old = on_net("n1", "net-a", true);
        old.mark = Some(CORDONED_BY_KROCE.into());
        assert!(matches!(
            &plan_drain(&[old], &pol, i64::MAX / 2).actions[..],
            [DrainAction::Evict { stamp: true, .. }]
        ));
    }

    #[test]
    fn simulated_rollouts_stay_within_the_budget() {
        for (budget, limit, admin) in [("1", 1, None), ("10%", 4, Some(3)), ("25%", 10, Some(3))] {
            let r = simulate_rollout(&Rollout {
                nodes: 40,
                budget: budget.parse().unwrap(),
                timeout: Duration::from_secs(1800),
                drain_secs: |i| 120 + (i as i64 % 4) * 30,
                stuck: [7].into(),
                cordoned: admin.into_iter().collect(),
            });
            assert_eq!(r.limit, limit, "{budget}");
            assert!(r.peak_unavailable <= limit, "{budget}: {r:?}");
            assert_eq!(r.timed_out, ["node-00007"], "{budget}");
            assert_eq!(r.drained, 39, "{budget}");
            // The admin's node counts: kroce never has the whole budget.
            let room = limit - usize::from(admin.is_some());
            assert_eq!(r.peak_cordoned, room, "{budget}: {r:?}");
        }
        // Budget 1 and a node an admin keeps cordoned: only that node is
        // drained (it takes no room); the rest waits for the admin.
        let r = simulate_rollout(&Rollout {
            nodes: 40,
            budget: MaxUnavailable::Count(1),
            timeout: Duration::from_secs(1800),
            drain_secs: |_| 180,
            stuck: BTreeSet::new(),
            cordoned: [3].into(),
        });
        assert_eq!(
            (r.drained, r.peak_cordoned, r.peak_unavailable),
            (1, 0, 1),
            "{r:?}"
        );
        // More room, faster: the 25% rollout is several times the 1-node one.
        let time = |b: &str| {
            simulate_rollout(&Rollout {
                nodes: 40,
                budget: b.parse().unwrap(),
                timeout: Duration::from_secs(1800),
                drain_secs: |_| 180,
                stuck: BTreeSet::new(),
                cordoned: BTreeSet::new(),
            })
            .seconds
        };
        let (one, quarter) = (time("1"), time("25%"));
        assert_eq!(one, 40 * 180);
        assert!(quarter * 8 < one, "{quarter} vs {one}");
    }

    use crate::metrics::Metrics;
    use kroce_operator::testing::mock::ApiServer;
    use serde_json::{Value, json};
    use std::sync::Arc;

    /// A fixed "now" for the API tests (Unix seconds).
    const NOW: i64 = 1_800_000_000;
    const CORE: &str = "/api/v1";
    const KROCE: &str = "/apis/kroce.io/v1alpha1";

    fn held_state(node: &str, pods: &[&str]) -> Value {
        json!({
            "apiVersion": "kroce.io/v1alpha1", "kind": "RdmaNodeState",
            "metadata": {"name": node, "generation": 2},
            "spec": {"nodeName": node, "pfs": []},
            "status": {
                "observedGeneration": 2, "syncState": "InProgress",
                "heldVfs": [{"pf": "0000:3b:00.0", "index": 1, "pciAddress": "0000:3b:00.3",
                             "pods": pods, "reason": "VF 1 (0000:3b:00.3) held"}]
            }
        })
    }

    fn pod(ns: &str, name: &str, node: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": ns}, "spec": {"nodeName": node}})
    }

    fn node_obj(server: &ApiServer, name: &str) -> Value {
        server.get(CORE, "nodes", "", name).unwrap()
    }

    fn is_cordoned(n: &Value) -> bool {
        n["spec"]["unschedulable"] == json!(true)
    }

    fn fresh(ctx: &Context, server: &ApiServer) -> Arc<Context> {
        crate::test_world::fresh(ctx, server)
    }

    fn annotation(n: &Value, key: &str) -> Value {
        n["metadata"]["annotations"]
            .get(key)
            .cloned()
            .unwrap_or(Value::Null)
    }

    fn test_ctx() -> (Context, ApiServer) {
        let (client, server) = ApiServer::start();
        let ctx = Context::new(
            client,
            "kroce-system",
            "kroce-device-plugin",
            Arc::new(Metrics::default()),
            crate::test_world::snapshot(&ApiServer::default()),
        );
        (ctx, server)
    }

    #[tokio::test]
    async fn drains_within_the_budget_against_the_api() {
        let (ctx, server) = test_ctx();
        server.insert(
            CORE,
            "nodes",
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}),
        );
        // n2 was cordoned by an admin before: it fills the budget of 1.
        server.insert(
            CORE,
            "nodes",
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n2"},
                                             "spec": {"unschedulable": true}}),
        );
        server.insert(KROCE, "rdmanodestates", held_state("n1", &["team-a/a-0"]));
        server.insert(KROCE, "rdmanodestates", held_state("n2", &["team-a/b-0"]));
        for (ns, name, node) in [
            ("team-a", "a-0", "n1"),
            ("team-a", "web", "n1"),
            ("team-a", "b-0", "n2"),
        ] {
            server.insert(CORE, "pods", pod(ns, name, node));
        }

        // Off: nothing happens to anyone.
        step_at(&ctx, &DrainSettings::default(), NOW).await.unwrap();
        assert!(!is_cordoned(&node_obj(&server, "n1")));
        assert!(server.get(CORE, "pods", "team-a", "a-0").is_some());

        // On: n2, unschedulable already, is drained without taking room
        // (a PodDisruptionBudget refuses its eviction for now); n1 waits:
        // the admin's cordon of n2 fills the budget.
        if let Ok(mut r) = server.refuse_eviction.lock() {
            r.push("team-a/b-0".into());
        }
        let plan = step_at(&fresh(&ctx, &server), &DrainSettings::on(), NOW)
            .await
            .unwrap();
        assert!(
            plan.actions.iter().any(|a| matches!(a,
                DrainAction::Wait { node, why } if node == "n1" && why.contains("1 of 1"))),
            "{plan:?}"
        );
        let n2 = node_obj(&server, "n2");
        assert_eq!(annotation(&n2, DRAIN_ANNOTATION), ALREADY_CORDONED);
        assert!(
            annotation(&n2, DRAIN_STARTED_ANNOTATION).is_string(),
            "{n2}"
        );
        assert!(
            server.get(CORE, "pods", "team-a", "b-0").is_some(),
            "PDB holds it"
        );
        assert!(!is_cordoned(&node_obj(&server, "n1")));
        assert!(server.get(CORE, "pods", "team-a", "a-0").is_some());

        // The budget allows it later; the agent reports clean; n2 stays
        // unschedulable as the admin left it, and so n1 still waits.
        if let Ok(mut r) = server.refuse_eviction.lock() {
            r.clear();
        }
        step_at(&fresh(&ctx, &server), &DrainSettings::on(), NOW)
            .await
            .unwrap();
        assert!(server.get(CORE, "pods", "team-a", "b-0").is_none());
        server.edit(KROCE, "rdmanodestates", "", "n2", |o| {
            o["status"]["heldVfs"] = json!([]);
        });
        step_at(&fresh(&ctx, &server), &DrainSettings::on(), NOW)
            .await
            .unwrap();
        let n2 = node_obj(&server, "n2");
        assert!(is_cordoned(&n2), "admin's cordon kept: {n2}");
        assert!(annotation(&n2, DRAIN_ANNOTATION).is_null(), "{n2}");
        assert!(annotation(&n2, DRAIN_STARTED_ANNOTATION).is_null(), "{n2}");
        assert!(!is_cordoned(&node_obj(&server, "n1")));

        // The admin uncordons n2: n1's turn. Only its holding pod goes.
        server.edit(CORE, "nodes", "", "n2", |o| {
            o["spec"]["unschedulable"] = Value::Null;
        });
        step_at(&fresh(&ctx, &server), &DrainSettings::on(), NOW)
            .await
            .unwrap();
        let n1 = node_obj(&server, "n1");
        assert!(is_cordoned(&n1), "{n1}");
        assert_eq!(annotation(&n1, DRAIN_ANNOTATION), CORDONED_BY_KROCE);
        assert!(
            server.get(CORE, "pods", "team-a", "a-0").is_none(),
            "holder evicted"
        );
        assert!(
            server.get(CORE, "pods", "team-a", "web").is_some(),
            "bystander kept"
        );
        assert!(
            server
                .requests()
                .iter()
                .any(|r| r == "POST /api/v1/namespaces/team-a/pods/a-0/eviction"),
            "{:?}",
            server.requests()
        );
        // The agent has not re-reported: n1 stays cordoned.
        step_at(&fresh(&ctx, &server), &DrainSettings::on(), NOW)
            .await
            .unwrap();
        assert!(is_cordoned(&node_obj(&server, "n1")));
        // Now it reports nothing held: uncordoned and unmarked.
        server.edit(KROCE, "rdmanodestates", "", "n1", |o| {
            o["status"]["heldVfs"] = json!([]);
            o["status"]["syncState"] = "Succeeded".into();
        });
        let actions = step_at(&fresh(&ctx, &server), &DrainSettings::on(), NOW)
            .await
            .unwrap()
            .actions;
        assert!(
            matches!(&actions[..], [DrainAction::Finish { node, uncordon: true, .. }] if node == "n1"),
            "{actions:?}"
        );
        let n1 = node_obj(&server, "n1");
        assert!(!is_cordoned(&n1), "{n1}");
        assert!(annotation(&n1, DRAIN_ANNOTATION).is_null(), "{n1}");
        assert!(
            server
                .requests()
                .iter()
                .any(|r| r.starts_with("POST /apis/events.k8s.io/v1/namespaces/default/events")),
            "drain changes are published as events"
        );
    }

    fn net_state(node: &str, pod: &str) -> Value {
        json!({
            "apiVersion": "kroce.io/v1alpha1", "kind": "RdmaNodeState",
            "metadata": {"name": node, "generation": 2},
            "spec": {"nodeName": node, "pfs": [{
                "pciAddress": "0000:3b:00.0", "ifName": "ens1f0", "numVfs": 2,
                "vfGroups": [{"network": "net-a", "resourceName": "rdma/net-a", "vfRange": "0-1"}]
            }]},
            "status": {
                "observedGeneration": 2, "syncState": "InProgress",
                "heldVfs": [{"pf": "0000:3b:00.0", "index": 3, "pciAddress": "0000:3b:00.5",
                             "pods": [pod], "reason": "VF 3 (0000:3b:00.5) held"}]
            }
        })
    }

    fn drain_of(server: &ApiServer) -> Value {
        server.get(KROCE, "rdmanetworks", "", "net-a").unwrap()["status"]["drain"].clone()
    }

    fn drain_status_writes(server: &ApiServer) -> usize {
        server
            .calls()
            .iter()
            .filter(|c| {
                c.method == "PATCH"
                    && c.path.ends_with("/rdmanetworks/net-a/status")
                    && c.query.contains("fieldManager=kroce-drain")
            })
            .count()
    }

    async fn network_reconcile(ctx: &Context, server: &ApiServer) {
        let net: RdmaNetwork =
            serde_json::from_value(server.get(KROCE, "rdmanetworks", "", "net-a").unwrap())
                .unwrap();
        crate::reconcile(Arc::new(net), fresh(ctx, server))
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn a_network_budget_a_timeout_and_status_drain_against_the_api() {
        let (ctx, server) = test_ctx();
        server.insert(
            KROCE,
            "rdmanetworks",
            json!({"apiVersion": "kroce.io/v1alpha1", "kind": "RdmaNetwork",
                   "metadata": {"name": "net-a", "generation": 1},
                   "spec": {"nicSelector": {"pfNames": ["ens1f0"]}, "numVfs": 2,
                            "maxUnavailable": "2"}}),
        );
        for i in 1..=3 {
            let (n, p) = (format!("n{i}"), format!("p-{i}"));
            server.insert(
                CORE,
                "nodes",
                json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n}}),
            );
            server.insert(
                KROCE,
                "rdmanodestates",
                net_state(&n, &format!("team-a/{p}")),
            );
            server.insert(CORE, "pods", pod("team-a", &p, &n));
        }
        // n2's pod has a PodDisruptionBudget that never allows it.
        if let Ok(mut r) = server.refuse_eviction.lock() {
            r.push("team-a/p-2".into());
        }
        let on = DrainSettings::on();
        // The network's budget (2) replaces the flag's (1): n1 and n2 go.
        step_at(&fresh(&ctx, &server), &on, NOW).await.unwrap();
        assert!(is_cordoned(&node_obj(&server, "n1")));
        assert!(is_cordoned(&node_obj(&server, "n2")));
        assert!(!is_cordoned(&node_obj(&server, "n3")));
        assert_eq!(
            drain_of(&server),
            json!({"maxUnavailable": 2, "unavailableNodes": 2, "drainingNodes": 2,
                   "waitingNodes": 1, "timedOutNodes": 0, "draining": ["n1", "n2"]})
        );
        assert_eq!(drain_status_writes(&server), 1);
        // Same facts: no write.
        step_at(&fresh(&ctx, &server), &on, NOW + 15).await.unwrap();
        assert_eq!(drain_status_writes(&server), 1);
        // The network loop's own status writes leave status.drain alone,
        // and do not rewrite for it.
        network_reconcile(&ctx, &server).await; // adds the finalizer
        network_reconcile(&ctx, &server).await;
        let net = server.get(KROCE, "rdmanetworks", "", "net-a").unwrap();
        assert!(net["status"]["conditions"].is_array(), "{net}");
        assert_eq!(drain_of(&server)["drainingNodes"], 2, "{net}");
        let before = server.calls().len();
        network_reconcile(&ctx, &server).await;
        assert!(
            !server.calls()[before..]
                .iter()
                .any(|c| c.method == "PATCH" && c.path.ends_with("/status")),
            "a status write for nothing"
        );

        // n1 done: n3 takes its room.
        server.edit(KROCE, "rdmanodestates", "", "n1", |o| {
            o["status"]["heldVfs"] = json!([]);
        });
        step_at(&fresh(&ctx, &server), &on, NOW + 60).await.unwrap();
        assert!(!is_cordoned(&node_obj(&server, "n1")));
        assert!(is_cordoned(&node_obj(&server, "n3")));
        assert_eq!(drain_of(&server)["draining"], json!(["n2", "n3"]));

        // n2 reaches the timeout: released, reported, skipped.
        step_at(&fresh(&ctx, &server), &on, NOW + 1800)
            .await
            .unwrap();
        let n2 = node_obj(&server, "n2");
        assert!(!is_cordoned(&n2), "{n2}");
        assert!(annotation(&n2, DRAIN_ANNOTATION).is_null(), "{n2}");
        assert!(annotation(&n2, DRAIN_STARTED_ANNOTATION).is_null(), "{n2}");
        assert_eq!(annotation(&n2, DRAIN_TIMED_OUT_ANNOTATION), "2");
        assert!(is_cordoned(&node_obj(&server, "n3")), "n3 has time left");
        assert_eq!(
            drain_of(&server),
            json!({"maxUnavailable": 2, "unavailableNodes": 1, "drainingNodes": 1,
                   "waitingNodes": 0, "timedOutNodes": 1, "draining": ["n3"],
                   "timedOut": ["n2"]})
        );
        let events = server.list("/apis/events.k8s.io/v1", "events");
        let timed_out: Vec<&Value> = events
            .iter()
            .filter(|e| e["reason"] == "DrainTimedOut")
            .collect();
        assert_eq!(timed_out.len(), 1, "{events:?}");
        assert_eq!(timed_out[0]["regarding"]["name"], "n2");
        assert!(
            timed_out[0]["note"]
                .as_str()
                .unwrap()
                .contains("team-a/p-2"),
            "{}",
            timed_out[0]["note"]
        );
        // Skipped: not cordoned again while its spec stays.
        step_at(&fresh(&ctx, &server), &on, NOW + 1815)
            .await
            .unwrap();
        assert!(!is_cordoned(&node_obj(&server, "n2")));

        // n3 done and n2 freed by hand: nothing concerns net-a any more,
        // status.drain goes and so does the timed-out record.
        for n in ["n2", "n3"] {
            server.edit(KROCE, "rdmanodestates", "", n, |o| {
                o["status"]["heldVfs"] = json!([]);
            });
        }
        step_at(&fresh(&ctx, &server), &on, NOW + 1830)
            .await
            .unwrap();
        assert!(!is_cordoned(&node_obj(&server, "n3")));
        assert!(annotation(&node_obj(&server, "n2"), DRAIN_TIMED_OUT_ANNOTATION).is_null());
        let net = server.get(KROCE, "rdmanetworks", "", "net-a").unwrap();
        assert!(net["status"].get("drain").is_none(), "{net}");
        assert!(
            net["status"]["conditions"].is_array(),
            "other managers' fields kept: {net}"
        );
    }
}
