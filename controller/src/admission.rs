//! Perftest admission, cluster side: no node serves a network's RDMA pods
//! until it has passed perftests against another node (or, with
//! `admission.enabled: false` or no `admission` block, until its NIC
//! configuration is applied).
//!
//! Each reconcile of a network builds `kroce_admission::lifecycle`'s input
//! from the nodes it selects (their node states, the test pods, the
//! results in those pods' logs), calls `plan`, and carries out the
//! actions: test pods created and deleted, results and conditions
//! recorded in `RdmaNodeState.status.admission` (field manager
//! `kroce-admission`, not the node agent's), events on the Node. The taint
//! `kroce.io/rdma-unready:NoSchedule` / label `kroce.io/rdma-ready=true`
//! follow every network selecting the node: ready only when all admit it.
//!
//! One admission pass runs at a time (a lock in the settings), so two
//! networks never test the same node at once: a node in another
//! network's run is left out of this network's plan until that run ends.

use super::{Context, Error};
use k8s_openapi::api::core::v1::{Node, Pod};
use kroce_admission::lifecycle::{
    self, Action as Step, AdmissionInput, AdmissionPhase, NodeAdmission, NodeView, READY_LABEL_KEY,
    RunOutcome, TestRun, UNREADY_TAINT_KEY,
};
use kroce_admission::pod_run::{self, RUNNER_BINARY, Role};
use kroce_operator::crd::admission::{AdmissionResult, NetworkAdmission, rfc3339};
use kroce_operator::crd::conditions::stamp_transitions;
use kroce_operator::crd::{
    AdmissionGate, AdmissionSpec, Condition, RdmaNetwork, RdmaNodeState, RdmaNodeStateSpec,
};
use kroce_operator::names::{
    ADMISSION_MANAGER, ADMISSION_NETWORK_LABEL, ADMISSION_ROLE_LABEL, ADMISSION_RUN_LABEL,
};
use kroce_operator::names::{MANAGED_BY_LABEL, MANAGER};
use kroce_operator::plan::merge::{Desired, NodePlan};
use kroce_operator::plan::nad::{NetworkAttachmentDefinition, attachment_definition};
use kroce_operator::plan::{ClusterPlan, DevicePluginConfig};
use kube::api::{DeleteParams, LogParams, Patch, PatchParams, PostParams};
use kube::runtime::events::EventType;
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

/// Field manager of everything admission writes.
/// Test pod labels.
/// Multus: which attachments a pod wants, and what it got.
const NETWORKS_ANNOTATION: &str = "k8s.v1.cni.cncf.io/networks";
const NETWORK_STATUS_ANNOTATION: &str = "k8s.v1.cni.cncf.io/network-status";
/// The condition in each `status.admission[]` entry.
pub const ADMITTED_CONDITION: &str = "Admitted";
/// Runs in progress are looked at this often (test pods are not watched).
const POLL: Duration = Duration::from_secs(5);
/// Waiting for a slot or a peer: the end of another run frees it.
const WAIT: Duration = Duration::from_secs(30);
const IDLE: Duration = Duration::from_secs(300);

/// Seconds since the Unix epoch; a value so tests can move time.
pub type Clock = Arc<dyn Fn() -> u64 + Send + Sync>;

pub fn system_clock() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The controller's admission flags.
#[derive(Clone)]
pub struct AdmissionSettings {
    /// Where test pods run (a test attachment definition is kept there).
    pub test_namespace: String,
    /// Default image with perftest and `kroce-perftest-run`.
    pub perftest_image: String,
    /// Whole CPUs per test pod (requests = limits: Guaranteed QoS, so the
    /// static CPU manager gives it exclusive cores).
    pub cpus: u32,
    /// Memory per test pod (requests = limits).
    pub memory: String,
    pub clock: Clock,
    lock: Arc<tokio::sync::Mutex<()>>,
}

impl AdmissionSettings {
    pub fn new(test_namespace: &str, perftest_image: &str) -> Self {
        AdmissionSettings {
            test_namespace: test_namespace.to_string(),
            perftest_image: perftest_image.to_string(),
            cpus: 2,
            memory: "1Gi".into(),
            clock: Arc::new(system_clock),
            lock: Arc::default(),
        }
    }
}

/// The controller's admission flags.
#[derive(Debug, Clone, clap::Args)]
pub struct AdmissionArgs {
    /// Namespace of the admission test pods (and their attachment definitions).
    /// Their own: not the namespace of the privileged node daemon (the
    /// controller may create pods here; the Helm chart creates it).
    #[arg(long, env = "KROCE_TEST_NAMESPACE", default_value = "kroce-perftest")]
    pub test_namespace: String,
    /// Image with perftest and kroce-perftest-run (a network's admission.image overrides it).
    #[arg(
        long,
        env = "KROCE_PERFTEST_IMAGE",
        default_value = "kroce-perftest:latest"
    )]
    pub perftest_image: String,
    /// Whole CPUs per test pod (requests = limits: Guaranteed QoS).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
    pub perftest_cpus: u32,
    /// Memory per test pod (requests = limits).
    #[arg(long, default_value = "1Gi")]
    pub perftest_memory: String,
}

impl AdmissionArgs {
    pub fn settings(&self) -> AdmissionSettings {
        let mut s = AdmissionSettings::new(&self.test_namespace, &self.perftest_image);
        s.cpus = self.perftest_cpus;
        s.memory = self.perftest_memory.clone();
        s
    }
}

impl Context {
    /// Replaces the admission settings (flags, or a test clock).
    pub fn with_admission(mut self, settings: AdmissionSettings) -> Self {
        self.admission = settings;
        self
    }
}

impl Default for AdmissionSettings {
    fn default() -> Self {
        AdmissionSettings::new("kroce-system", "kroce-perftest:latest")
    }
}

impl std::fmt::Debug for AdmissionSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdmissionSettings")
            .field("test_namespace", &self.test_namespace)
            .field("perftest_image", &self.perftest_image)
            .field("cpus", &self.cpus)
            .field("memory", &self.memory)
            .finish()
    }
}

// ---------------------------------------------------------------------------
// Pure parts.

/// The device plugin's pools a node may advertise: the desired ones once
/// the node state carrying them is applied; until then the pools it
/// advertised before, for resources still desired (a network never
/// appears before its VFs are configured, and disappears at once when it
/// goes). `None`: nothing to advertise (the key is left out).
pub fn advertised_pools(
    desired: &DevicePluginConfig,
    desired_spec: Option<&RdmaNodeStateSpec>,
    state: Option<&RdmaNodeState>,
    previous_yaml: Option<&str>,
) -> Option<DevicePluginConfig> {
    let configured =
        state.is_some_and(|s| s.in_sync() && desired_spec.is_none_or(|d| *d == s.spec));
    let cfg = if configured {
        desired.clone()
    } else {
        let previous: DevicePluginConfig = previous_yaml
            .and_then(|y| serde_saphyr::from_str(y).ok())
            .unwrap_or_default();
        DevicePluginConfig {
            pools: previous
                .pools
                .into_iter()
                .filter(|p| {
                    desired
                        .pools
                        .iter()
                        .any(|d| d.resource_name == p.resource_name)
                })
                .collect(),
        }
    };
    (!cfg.pools.is_empty()).then_some(cfg)
}

/// FNV-1a, 48 bits: a stable fingerprint (std's hasher is seeded per process).
fn fingerprint(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h & 0xffff_ffff_ffff
}

/// The part of a node's spec that concerns `network`: the PFs carrying its
/// VF groups (whole, since sharing networks change them too) and its soft
/// devices. `None` when the spec does not carry the network.
pub fn config_generation(spec: &RdmaNodeStateSpec, network: &str) -> Option<u64> {
    let pfs: Vec<_> = spec
        .pfs
        .iter()
        .filter(|p| p.vf_groups.iter().any(|g| g.network == network))
        .collect();
    let soft: Vec<_> = spec
        .soft_devices
        .iter()
        .filter(|g| g.network == network)
        .collect();
    if pfs.is_empty() && soft.is_empty() {
        return None;
    }
    let text = serde_json::to_string(&(pfs, soft)).ok()?;
    Some(fingerprint(text.as_bytes()))
}

/// (config generation, in sync) of `network` on a node.
fn config_view(np: &NodePlan, state: Option<&RdmaNodeState>, network: &str) -> (u64, bool) {
    let Some(st) = state else {
        return (0, false);
    };
    let generation = config_generation(&st.spec, network);
    let applied = match &np.desired {
        Desired::Spec(s) => *s == st.spec,
        // A conflict keeps the last good spec: that is what runs.
        Desired::KeepLastGood => true,
        Desired::AwaitInventory => false,
    };
    (
        generation.unwrap_or(0),
        generation.is_some() && applied && st.in_sync(),
    )
}

fn entries_of(state: &RdmaNodeState) -> &[NetworkAdmission] {
    state
        .status
        .as_ref()
        .map_or(&[], |s| s.admission.as_slice())
}

/// The state machine's record of a node for a network (Pending when none
/// or unreadable).
fn stored(entries: &[NetworkAdmission], network: &str) -> NodeAdmission {
    entries
        .iter()
        .find(|e| e.network == network)
        .map(record)
        .unwrap_or_default()
}

fn record(e: &NetworkAdmission) -> NodeAdmission {
    serde_json::from_value(e.state.clone()).unwrap_or_default()
}

fn phase_name(p: &AdmissionPhase) -> &'static str {
    match p {
        AdmissionPhase::Pending => "Pending",
        AdmissionPhase::Testing { .. } => "Testing",
        AdmissionPhase::Admitted { .. } => "Admitted",
        AdmissionPhase::Failed { .. } => "Failed",
    }
}

/// The status entry for one network from the state machine's record.
pub fn entry_for(
    network: &str,
    adm: &NodeAdmission,
    previous: Option<&NetworkAdmission>,
    now: &str,
) -> NetworkAdmission {
    let last = adm.last_result.as_ref().map(AdmissionResult::from_record);
    let (status, reason, message) = match &adm.phase {
        AdmissionPhase::Admitted { at } if at.without_test => (
            true,
            "AdmittedWithoutTest",
            "admission testing is disabled: admitted on configuration alone".to_string(),
        ),
        AdmissionPhase::Admitted { .. } => (
            true,
            "PerftestsPassed",
            last.as_ref().map(|l| l.message.clone()).unwrap_or_default(),
        ),
        AdmissionPhase::Testing {
            run,
            previously_admitted,
        } => (
            previously_admitted.is_some(),
            if previously_admitted.is_some() {
                "Retesting"
            } else {
                "Testing"
            },
            format!(
                "perftests against {} (run {}, deadline {})",
                run.peer_of(run.subjects.first().map_or("", String::as_str)),
                run.id,
                rfc3339(run.deadline)
            ),
        ),
        AdmissionPhase::Failed {
            reason, retry_at, ..
        } => (
            false,
            "PerftestsFailed",
            format!("{reason} (retry at {})", rfc3339(*retry_at)),
        ),
        AdmissionPhase::Pending => (
            false,
            "Pending",
            adm.waiting
                .clone()
                .unwrap_or_else(|| "waiting for a test run".into()),
        ),
    };
    let mut conditions = vec![Condition::new(ADMITTED_CONDITION, status, reason, message)];
    stamp_transitions(
        previous.map_or(&[], |p| p.conditions.as_slice()),
        &mut conditions,
        now,
    );
    let message = adm.waiting.clone().or_else(|| match &adm.phase {
        AdmissionPhase::Failed { reason, .. } => Some(reason.clone()),
        _ => None,
    });
    NetworkAdmission {
        network: network.to_string(),
        phase: phase_name(&adm.phase).into(),
        schedulable: lifecycle::is_ready(&adm.phase),
        message,
        last_result: last,
        conditions,
        state: serde_json::to_value(adm).unwrap_or_default(),
    }
}

/// `Admitted` when every network admits the node; otherwise the phase
/// that needs attention first.
pub fn summary_phase(entries: &[NetworkAdmission]) -> String {
    for p in ["Failed", "Testing", "Pending"] {
        if entries.iter().any(|e| e.phase == p) {
            return p.into();
        }
    }
    if entries.is_empty() {
        "NotSelected".into()
    } else {
        "Admitted".into()
    }
}

/// (taint wanted, label wanted) for a node: ready when every selecting
/// network admits it; the taint while not ready if any of them gates by
/// taint, the label once ready if any gates by label.
pub fn desired_marks(
    selected: &[String],
    gates: &BTreeMap<String, AdmissionGate>,
    entries: &[NetworkAdmission],
) -> (bool, bool) {
    if selected.is_empty() {
        return (false, false);
    }
    let ready = selected
        .iter()
        .all(|n| entries.iter().any(|e| e.network == *n && e.schedulable));
    let uses = |g: AdmissionGate| {
        selected
            .iter()
            .any(|n| gates.get(n).copied().unwrap_or_default() == g)
    };
    (
        uses(AdmissionGate::Taint) && !ready,
        uses(AdmissionGate::Label) && ready,
    )
}

fn has_taint(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == UNREADY_TAINT_KEY))
}

fn has_label(node: &Node) -> bool {
    node.labels().get(READY_LABEL_KEY).map(String::as_str) == Some("true")
}

/// The attachment definition test pods name, in the test namespace (its
/// own name and label, so the network's own NADs are never touched).
pub fn test_nad_name(network: &str) -> String {
    format!("kroce-admission-{network}")
}

pub fn pod_name(run: &TestRun, role: Role) -> String {
    format!("{}-{}", run.id, role.as_str())
}

/// A test pod: on its node, requesting one `rdma/<name>` device and whole
/// CPUs (Guaranteed QoS), tolerating the unready taint, running
/// `kroce-perftest-run` (which pins to the device's NUMA-local CPUs inside
/// the pod's cpuset and resolves the GID index there).
pub fn test_pod(
    settings: &AdmissionSettings,
    network: &str,
    resource: &str,
    spec: &AdmissionSpec,
    run: &TestRun,
    role: Role,
    server_ip: Option<Ipv4Addr>,
) -> Result<Pod, Error> {
    let node = match role {
        Role::Server => &run.server_node,
        Role::Client => &run.client_node,
    };
    let mut args = spec.runner_args(role);
    args.server_ip = server_ip;
    let command: Vec<String> = std::iter::once(RUNNER_BINARY.to_string())
        .chain(args.to_args())
        .collect();
    let image = spec
        .image
        .clone()
        .unwrap_or_else(|| settings.perftest_image.clone());
    let mut amounts = serde_json::Map::new();
    amounts.insert("cpu".into(), settings.cpus.max(1).to_string().into());
    amounts.insert("memory".into(), settings.memory.clone().into());
    amounts.insert(resource.into(), "1".into());
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(run, role),
            "namespace": settings.test_namespace,
            "labels": {
                ADMISSION_RUN_LABEL: run.id,
                ADMISSION_NETWORK_LABEL: network,
                ADMISSION_ROLE_LABEL: role.as_str(),
                MANAGED_BY_LABEL: MANAGER,
            },
            "annotations": { NETWORKS_ANNOTATION: test_nad_name(network) },
        },
        "spec": {
            "restartPolicy": "Never",
            "activeDeadlineSeconds": spec.test_timeout_seconds,
            "terminationGracePeriodSeconds": 5,
            "automountServiceAccountToken": false,
            "enableServiceLinks": false,
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [node]}
                ]}]
            }}},
            "tolerations": [
                {"key": UNREADY_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}
            ],
            "containers": [{
                "name": "perftest",
                "image": image,
                "command": command,
                "resources": {"requests": amounts.clone(), "limits": amounts},
                "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}},
            }],
        },
    });
    serde_json::from_value(pod).map_err(|source| Error::Json {
        what: "test pod",
        source,
    })
}

/// The IPv4 address Multus reports for the pod's test attachment.
pub fn attachment_ipv4(pod: &Pod, namespace: &str, nad: &str) -> Option<Ipv4Addr> {
    let text = pod.annotations().get(NETWORK_STATUS_ANNOTATION)?;
    let entries: Vec<serde_json::Value> = serde_json::from_str(text).ok()?;
    let full = format!("{namespace}/{nad}");
    entries
        .iter()
        .filter(|e| {
            e.get("name")
                .and_then(|n| n.as_str())
                .is_some_and(|n| n == full || n == nad)
        })
        .flat_map(|e| {
            e.get("ips")
                .and_then(|i| i.as_array())
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|ip| {
            let s = ip.as_str()?;
            s.split('/').next()?.parse().ok()
        })
        .next()
}

fn pod_phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending")
}

fn label<'a>(p: &'a Pod, key: &str) -> Option<&'a str> {
    p.labels().get(key).map(String::as_str)
}

/// When the next look is due.
fn wake_after(nodes: &BTreeMap<String, NodeAdmission>, spec: &AdmissionSpec, now: u64) -> Duration {
    let mut wake = IDLE;
    for n in nodes.values() {
        let due = match &n.phase {
            AdmissionPhase::Testing { .. } => POLL,
            AdmissionPhase::Failed { retry_at, .. } => {
                Duration::from_secs(retry_at.saturating_sub(now).max(1))
            }
            AdmissionPhase::Admitted { at } if !at.without_test => {
                match spec.retest_interval_seconds {
                    Some(every) => {
                        Duration::from_secs(at.at.saturating_add(every).saturating_sub(now).max(1))
                    }
                    None => IDLE,
                }
            }
            AdmissionPhase::Pending if n.waiting.is_some() => WAIT,
            _ => IDLE,
        };
        wake = wake.min(due);
    }
    wake
}

// ---------------------------------------------------------------------------
// API edges.

/// What one admission pass lists, inside the lock.
struct World {
    nodes: Vec<Node>,
    states: BTreeMap<String, RdmaNodeState>,
    gates: BTreeMap<String, AdmissionGate>,
    pods: Vec<Pod>,
}

async fn list_world(ctx: &Context, pod_selector: &str) -> Result<World, Error> {
    let st = &ctx.stores;
    let gates = st
        .networks
        .state()
        .iter()
        .map(|n| {
            (
                n.name_any(),
                AdmissionSpec::of(n.spec.admission.as_ref()).gate,
            )
        })
        .collect();
    Ok(World {
        nodes: st.nodes(),
        states: st.states_by_name(),
        gates,
        pods: st.test_pods(pod_selector),
    })
}

async fn node_event(ctx: &Context, node: &str, type_: EventType, reason: &str, note: String) {
    let reference = k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(node.to_string()),
        ..Default::default()
    };
    ctx.event(&reference, type_, reason, "Admission", note)
        .await;
}

async fn network_event(ctx: &Context, net: &RdmaNetwork, reason: &str, note: String) {
    ctx.event(
        &net.object_ref(&()),
        EventType::Warning,
        reason,
        "Admission",
        note,
    )
    .await;
}

async fn pod_log(api: &Api<Pod>, name: &str) -> Result<String, kube::Error> {
    api.logs(name, &LogParams::default()).await
}

/// Deletes pods; absent ones are fine. Errors are collected, not fatal to the others.
async fn delete_pods<'a>(api: &Api<Pod>, names: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut errors = Vec::new();
    for n in names {
        match api
            .delete(n, &DeleteParams::default().grace_period(0))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => errors.push(format!("pod {n}: {}", super::api_error_text(&e))),
        }
    }
    errors
}

async fn ensure_test_nad(ctx: &Context, net: &RdmaNetwork) -> Result<(), Error> {
    let name = net.name_any();
    let ns = &ctx.admission.test_namespace;
    let mut nad = attachment_definition(&name, &net.spec, ns);
    nad.metadata.name = Some(test_nad_name(&name));
    nad.metadata.labels = Some(BTreeMap::from([
        (ADMISSION_NETWORK_LABEL.to_string(), name.clone()),
        (MANAGED_BY_LABEL.to_string(), MANAGER.to_string()),
    ]));
    let api: Api<NetworkAttachmentDefinition> = Api::namespaced(ctx.client.clone(), ns);
    api.patch(
        &test_nad_name(&name),
        &PatchParams::apply(ADMISSION_MANAGER).force(),
        &Patch::Apply(&nad),
    )
    .await?;
    Ok(())
}

async fn create_pod(api: &Api<Pod>, pod: &Pod) -> Result<(), kube::Error> {
    match api.create(&PostParams::default(), pod).await {
        Ok(_) => Ok(()),
        // Created by an earlier pass.
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

/// The outcome of a run from its pods, when it has one.
async fn outcome(
    api: &Api<Pod>,
    spec: &AdmissionSpec,
    server: Option<&Pod>,
    client: Option<&Pod>,
) -> Option<RunOutcome> {
    let failed = |p: &Pod| pod_phase(p) == "Failed";
    let why_failed = |p: &Pod, role: Role, log: &str| {
        if log.trim().is_empty() {
            let st = p.status.as_ref();
            let reason = st.and_then(|s| s.reason.clone()).unwrap_or_default();
            let msg = st.and_then(|s| s.message.clone()).unwrap_or_default();
            format!("{} pod failed: {reason} {msg}", role.as_str())
                .trim()
                .to_string()
        } else {
            pod_run::failure_message(role, log)
        }
    };
    if let Some(c) = client {
        if pod_phase(c) == "Succeeded" {
            let server_log = match server {
                Some(s) if pod_phase(s) != "Pending" => pod_log(api, &s.name_any()).await.ok(),
                _ => None,
            };
            return Some(match pod_log(api, &c.name_any()).await {
                Ok(log) => pod_run::judge(
                    &log,
                    server_log.as_deref(),
                    spec.bandwidth_spec().tool,
                    spec.latency_spec().tool,
                    &spec.thresholds(),
                ),
                Err(e) => RunOutcome::error(format!(
                    "cannot read the client pod's log: {}",
                    super::api_error_text(&e)
                )),
            });
        }
        if failed(c) {
            let log = pod_log(api, &c.name_any()).await.unwrap_or_default();
            return Some(RunOutcome::error(why_failed(c, Role::Client, &log)));
        }
    }
    if let Some(s) = server
        && failed(s)
    {
        let log = pod_log(api, &s.name_any()).await.unwrap_or_default();
        return Some(RunOutcome::error(why_failed(s, Role::Server, &log)));
    }
    None
}

/// Plans and carries out one network's admission; updates `entries`
/// (per node) with the network's new records. Returns when to look again.
async fn run_network(
    ctx: &Context,
    net: &RdmaNetwork,
    spec: &AdmissionSpec,
    plan: &ClusterPlan,
    world: &World,
    entries: &mut BTreeMap<String, Vec<NetworkAdmission>>,
    now: u64,
) -> Result<Duration, Error> {
    let name = net.name_any();
    let resource = net.spec.full_resource_name(&name);
    let settings = &ctx.admission;
    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), &settings.test_namespace);
    let empty: &[NetworkAdmission] = &[];

    // Nodes in another network's run sit this one out until it ends.
    let mut elsewhere = BTreeSet::new();
    let mut here = BTreeSet::new();
    for e in entries.values().flatten() {
        if let AdmissionPhase::Testing { run, .. } = record(e).phase {
            let set = if e.network == name {
                &mut here
            } else {
                &mut elsewhere
            };
            set.insert(run.server_node);
            set.insert(run.client_node);
        }
    }
    let mut views = Vec::new();
    for np in plan.nodes.iter().filter(|n| n.selected.contains(&name)) {
        if elsewhere.contains(&np.node) && !here.contains(&np.node) {
            continue;
        }
        let state = world.states.get(&np.node);
        let (config_generation, config_in_sync) = config_view(np, state, &name);
        let marked_ready = world
            .nodes
            .iter()
            .find(|n| n.name_any() == np.node)
            .map(|n| match spec.gate {
                AdmissionGate::Taint => !has_taint(n),
                AdmissionGate::Label => has_label(n),
            });
        views.push(NodeView {
            name: np.node.clone(),
            admission: stored(entries.get(&np.node).map_or(empty, Vec::as_slice), &name),
            config_generation,
            config_in_sync,
            marked_ready,
        });
    }

    // Finished runs, from their pods.
    let mut by_run: BTreeMap<&str, (Option<&Pod>, Option<&Pod>)> = BTreeMap::new();
    for p in &world.pods {
        let Some(run) = label(p, ADMISSION_RUN_LABEL) else {
            continue;
        };
        let slot = by_run.entry(run).or_default();
        match label(p, ADMISSION_ROLE_LABEL) {
            Some("server") => slot.0 = Some(p),
            Some("client") => slot.1 = Some(p),
            _ => {}
        }
    }
    let mut runs: BTreeMap<String, TestRun> = BTreeMap::new();
    for v in &views {
        if let AdmissionPhase::Testing { run, .. } = &v.admission.phase {
            runs.insert(run.id.clone(), run.clone());
        }
    }
    let mut outcomes = BTreeMap::new();
    for id in runs.keys() {
        let (server, client) = by_run.get(id.as_str()).copied().unwrap_or_default();
        if let Some(o) = outcome(&pods_api, spec, server, client).await {
            outcomes.insert(id.clone(), o);
        }
    }
    // The concurrency limit is cluster-wide: runs of other networks count.
    let testing_elsewhere = entries
        .values()
        .flatten()
        .filter(|e| e.network != name)
        .filter(|e| matches!(record(e).phase, AdmissionPhase::Testing { .. }))
        .count() as u32;
    let input = AdmissionInput {
        testing_elsewhere,
        nodes: views,
        pod_runs: by_run.keys().map(|s| s.to_string()).collect(),
        outcomes,
        now,
    };
    let adm = match lifecycle::plan(&input, &spec.policy()) {
        Ok(p) => p,
        Err(e) => {
            network_event(ctx, net, "InvalidAdmission", format!("spec.{e}")).await;
            return Ok(IDLE);
        }
    };

    let mut created: BTreeSet<String> = BTreeSet::new();
    for step in &adm.actions {
        match step {
            Step::DeleteTestPods { run_id } => {
                let names = world
                    .pods
                    .iter()
                    .filter(|p| label(p, ADMISSION_RUN_LABEL) == Some(run_id.as_str()))
                    .map(|p| p.name_any())
                    .collect::<Vec<_>>();
                for e in delete_pods(&pods_api, names.iter().map(String::as_str)).await {
                    tracing::warn!(error = %e, run = %run_id, "cannot delete test pod");
                }
            }
            Step::CreateTestPods { run } => {
                let pod = test_pod(settings, &name, &resource, spec, run, Role::Server, None)?;
                let r = match ensure_test_nad(ctx, net).await {
                    Ok(()) => create_pod(&pods_api, &pod).await.map_err(Error::from),
                    Err(e) => Err(e),
                };
                match r {
                    Ok(()) => {
                        created.insert(run.id.clone());
                    }
                    Err(e) => {
                        node_event(
                            ctx,
                            &run.server_node,
                            EventType::Warning,
                            "AdmissionPodFailed",
                            format!("cannot create test pod {}: {e}", pod.name_any()),
                        )
                        .await;
                    }
                }
            }
            Step::Event {
                node,
                event_type,
                reason,
                message,
            } => {
                let t = match event_type {
                    lifecycle::EventType::Normal => EventType::Normal,
                    lifecycle::EventType::Warning => EventType::Warning,
                };
                node_event(ctx, node, t, reason, format!("network {name}: {message}")).await;
            }
            // Recorded with the node's state below; marks follow every
            // network at once (apply_marks).
            Step::RecordResult { .. } | Step::MarkNode { .. } => {}
        }
    }

    // Runs in progress: the client starts once the server has its address.
    let mut advanced = BTreeSet::new();
    for st in adm.nodes.values() {
        let AdmissionPhase::Testing { run, .. } = &st.phase else {
            continue;
        };
        if created.contains(&run.id) || !advanced.insert(run.id.clone()) {
            continue;
        }
        let (server, client) = by_run.get(run.id.as_str()).copied().unwrap_or_default();
        let result = match (server, client) {
            (None, _) => {
                let pod = test_pod(settings, &name, &resource, spec, run, Role::Server, None)?;
                create_pod(&pods_api, &pod).await
            }
            (Some(s), None) => {
                match attachment_ipv4(s, &settings.test_namespace, &test_nad_name(&name)) {
                    Some(ip) if pod_phase(s) == "Running" => {
                        let pod = test_pod(
                            settings,
                            &name,
                            &resource,
                            spec,
                            run,
                            Role::Client,
                            Some(ip),
                        )?;
                        create_pod(&pods_api, &pod).await
                    }
                    _ => Ok(()),
                }
            }
            (Some(_), Some(_)) => Ok(()),
        };
        if let Err(e) = result {
            node_event(
                ctx,
                &run.client_node,
                EventType::Warning,
                "AdmissionPodFailed",
                format!(
                    "cannot create a test pod of run {}: {}",
                    run.id,
                    super::api_error_text(&e)
                ),
            )
            .await;
        }
    }

    let stamp = rfc3339(now);
    for (node, adm_state) in &adm.nodes {
        let list = entries.entry(node.clone()).or_default();
        let previous = list.iter().find(|e| e.network == name);
        let entry = entry_for(&name, adm_state, previous, &stamp);
        list.retain(|e| e.network != name);
        list.push(entry);
        list.sort_by(|a, b| a.network.cmp(&b.network));
    }
    Ok(wake_after(&adm.nodes, spec, now))
}

/// Writes each node's `status.admission` that changed (entries of
/// networks no longer selecting the node dropped), then the marks.
async fn persist_and_mark(
    ctx: &Context,
    plan: &ClusterPlan,
    world: &World,
    mut entries: BTreeMap<String, Vec<NetworkAdmission>>,
) -> Result<(), Error> {
    let selected: BTreeMap<&str, &[String]> = plan
        .nodes
        .iter()
        .map(|n| (n.node.as_str(), n.selected.as_slice()))
        .collect();
    let api: Api<RdmaNodeState> = Api::all(ctx.client.clone());
    for (node, list) in entries.iter_mut() {
        let sel = selected.get(node.as_str()).copied().unwrap_or(&[]);
        list.retain(|e| sel.contains(&e.network));
        let Some(state) = world.states.get(node) else {
            continue;
        };
        let before = entries_of(state);
        let phase = summary_phase(list);
        let had_phase = state
            .status
            .as_ref()
            .and_then(|s| s.admission_phase.clone());
        if before == list.as_slice()
            && (had_phase.as_deref() == Some(phase.as_str())
                || (before.is_empty() && had_phase.is_none()))
        {
            continue;
        }
        let body = json!({
            "apiVersion": "kroce.io/v1alpha1",
            "kind": "RdmaNodeState",
            "status": {"admission": list, "admissionPhase": phase},
        });
        api.patch_status(
            node,
            &PatchParams::apply(ADMISSION_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await?;
    }
    let empty: Vec<NetworkAdmission> = Vec::new();
    let nodes_api: Api<Node> = Api::all(ctx.client.clone());
    for node in &world.nodes {
        let name = node.name_any();
        let sel = selected.get(name.as_str()).copied().unwrap_or(&[]);
        let list = entries.get(&name).unwrap_or(&empty);
        let (want_taint, want_label) = desired_marks(sel, &world.gates, list);
        if want_taint != has_taint(node) {
            let mut taints: Vec<serde_json::Value> = node
                .spec
                .as_ref()
                .and_then(|s| s.taints.clone())
                .unwrap_or_default()
                .into_iter()
                .filter(|t| t.key != UNREADY_TAINT_KEY)
                .map(|t| serde_json::to_value(t).unwrap_or_default())
                .collect();
            if want_taint {
                taints.push(json!({"key": UNREADY_TAINT_KEY, "effect": "NoSchedule"}));
            }
            // resourceVersion: a concurrent taint change fails (409) instead of being lost.
            let patch = json!({
                "metadata": {"resourceVersion": node.resource_version()},
                "spec": {"taints": taints},
            });
            nodes_api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            let (reason, note) = if want_taint {
                (
                    "RdmaUnready",
                    format!(
                        "tainted {UNREADY_TAINT_KEY}:NoSchedule: not every RDMA network has admitted the node"
                    ),
                )
            } else {
                (
                    "RdmaReady",
                    format!(
                        "removed taint {UNREADY_TAINT_KEY}: admitted by every RDMA network selecting it"
                    ),
                )
            };
            node_event(ctx, &name, EventType::Normal, reason, note).await;
        }
        if want_label != has_label(node) {
            let value = if want_label {
                json!("true")
            } else {
                json!(null)
            };
            let patch = json!({"metadata": {"labels": {READY_LABEL_KEY: value}}});
            nodes_api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            let (reason, note) = if want_label {
                (
                    "RdmaReady",
                    format!(
                        "labelled {READY_LABEL_KEY}=true: admitted by every RDMA network selecting it"
                    ),
                )
            } else {
                (
                    "RdmaUnready",
                    format!(
                        "removed label {READY_LABEL_KEY}: not every RDMA network has admitted the node"
                    ),
                )
            };
            node_event(ctx, &name, EventType::Normal, reason, note).await;
        }
    }
    Ok(())
}

fn current_entries(world: &World) -> BTreeMap<String, Vec<NetworkAdmission>> {
    world
        .states
        .iter()
        .map(|(n, s)| (n.clone(), entries_of(s).to_vec()))
        .collect()
}

/// Admission for one network, from its reconcile. Returns when the
/// network should be looked at again.
pub(crate) async fn reconcile_network(
    ctx: &Context,
    net: &RdmaNetwork,
    plan: &ClusterPlan,
) -> Result<Duration, Error> {
    let settings = ctx.admission.clone();
    let _one_at_a_time = settings.lock.lock().await;
    let now = (settings.clock)();
    let name = net.name_any();
    let world = list_world(ctx, &format!("{ADMISSION_NETWORK_LABEL}={name}")).await?;
    let mut entries = current_entries(&world);
    let spec = AdmissionSpec::of(net.spec.admission.as_ref());
    let mut wake = IDLE;
    if !plan.invalid.contains_key(&name) && net.meta().deletion_timestamp.is_none() {
        match spec.validate() {
            Ok(()) => {
                wake = run_network(ctx, net, &spec, plan, &world, &mut entries, now).await?;
            }
            Err(errors) => {
                network_event(ctx, net, "InvalidAdmission", errors.join("; ")).await;
            }
        }
    }
    persist_and_mark(ctx, plan, &world, entries).await?;
    Ok(wake)
}

/// A network is going: its test pods and test attachment definition, its
/// entries in every node state; marks recomputed without it (`plan` is
/// already planned without it). Absent objects are fine; other errors are
/// collected and the first returned after everything was tried.
pub(crate) async fn cleanup_network(
    ctx: &Context,
    net: &RdmaNetwork,
    plan: &ClusterPlan,
) -> Result<(), Error> {
    let settings = ctx.admission.clone();
    let _one_at_a_time = settings.lock.lock().await;
    let name = net.name_any();
    let world = list_world(ctx, &format!("{ADMISSION_NETWORK_LABEL}={name}")).await?;
    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), &settings.test_namespace);
    let names: Vec<String> = world.pods.iter().map(|p| p.name_any()).collect();
    let mut errors = delete_pods(&pods_api, names.iter().map(String::as_str)).await;
    let nads: Api<NetworkAttachmentDefinition> =
        Api::namespaced(ctx.client.clone(), &settings.test_namespace);
    match nads
        .delete(&test_nad_name(&name), &DeleteParams::default())
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => errors.push(format!(
            "attachment definition {}: {}",
            test_nad_name(&name),
            super::api_error_text(&e)
        )),
    }
    let mut entries = current_entries(&world);
    for list in entries.values_mut() {
        list.retain(|e| e.network != name);
    }
    if let Err(e) = persist_and_mark(ctx, plan, &world, entries).await {
        errors.push(e.to_string());
    }
    match errors.first() {
        None => Ok(()),
        Some(_) => {
            for e in &errors {
                tracing::warn!(error = %e, network = %name, "admission cleanup");
            }
            // Surface one as the reconcile error; the requeue retries the rest.
            Err(Error::Admission(errors.join("; ")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kroce_operator::crd::{PfConfig, VfGroup};
    use kroce_operator::plan::Pool;

    fn pf(network: &str, range: &str) -> PfConfig {
        PfConfig {
            pci_address: "0000:3b:00.0".into(),
            if_name: "ens1f0".into(),
            num_vfs: 8,
            mtu: None,
            vf_groups: vec![VfGroup {
                network: network.into(),
                resource_name: format!("rdma/{network}"),
                vf_range: range.into(),
                mtu: None,
            }],
            irq_affinity: Default::default(),
            qos: None,
        }
    }

    #[test]
    fn generation_follows_only_the_networks_pfs() {
        let mut spec = RdmaNodeStateSpec {
            node_name: "n1".into(),
            pfs: vec![pf("a", "0-3")],
            ..Default::default()
        };
        let g = config_generation(&spec, "a").unwrap();
        assert_eq!(config_generation(&spec, "b"), None);
        let mut other = pf("b", "0-7");
        other.pci_address = "0000:86:00.0".into();
        spec.pfs.push(other);
        assert_eq!(config_generation(&spec, "a"), Some(g), "another PF changed");
        spec.pfs[0].mtu = Some(9000);
        assert_ne!(config_generation(&spec, "a"), Some(g), "its own PF changed");
    }

    #[test]
    fn marks_need_every_selecting_network() {
        let adm = |network: &str, schedulable: bool| NetworkAdmission {
            network: network.into(),
            schedulable,
            ..Default::default()
        };
        let gates = BTreeMap::from([
            ("a".to_string(), AdmissionGate::Taint),
            ("b".to_string(), AdmissionGate::Label),
        ]);
        let sel = vec!["a".to_string(), "b".to_string()];
        assert_eq!(
            desired_marks(&sel, &gates, &[adm("a", true)]),
            (true, false)
        );
        assert_eq!(
            desired_marks(&sel, &gates, &[adm("a", true), adm("b", true)]),
            (false, true)
        );
        assert_eq!(
            desired_marks(&[], &gates, &[adm("a", false)]),
            (false, false)
        );
        assert_eq!(summary_phase(&[]), "NotSelected");
    }

    #[test]
    fn pools_wait_for_the_applied_node_state() {
        let pool = |r: &str, pf: &str| Pool {
            resource_name: r.into(),
            mode: "exclusive".into(),
            memlock: None,
            selectors: kroce_operator::plan::Selectors {
                pf_names: vec![pf.into()],
                ..Default::default()
            },
        };
        let desired = DevicePluginConfig {
            pools: vec![pool("rdma/a", "ens1f0#0-3"), pool("rdma/b", "ens1f0#4-7")],
        };
        let spec = RdmaNodeStateSpec {
            node_name: "n1".into(),
            pfs: vec![pf("a", "0-3")],
            ..Default::default()
        };
        let mut state = RdmaNodeState::new("n1", spec.clone());
        state.metadata.generation = Some(2);
        // Not applied yet, nothing advertised before: nothing.
        assert_eq!(
            advertised_pools(&desired, Some(&spec), Some(&state), None),
            None
        );
        // Applied: the desired pools.
        state.status = Some(kroce_operator::crd::RdmaNodeStateStatus {
            observed_generation: Some(2),
            sync_state: kroce_operator::crd::SyncState::Succeeded,
            ..Default::default()
        });
        assert_eq!(
            advertised_pools(&desired, Some(&spec), Some(&state), None),
            Some(desired.clone())
        );
        // A new spec not yet applied: the previous pools of resources still wanted.
        let previous = DevicePluginConfig {
            pools: vec![pool("rdma/a", "ens1f0#0-1"), pool("rdma/gone", "ens2f0")],
        }
        .to_yaml()
        .unwrap();
        let mut newer = spec.clone();
        newer.pfs[0].num_vfs = 16;
        let got = advertised_pools(&desired, Some(&newer), Some(&state), Some(&previous)).unwrap();
        assert_eq!(got.pools, vec![pool("rdma/a", "ens1f0#0-1")]);
    }

    #[test]
    fn server_address_comes_from_the_test_attachment() {
        let mut pod = Pod::default();
        pod.metadata.annotations = Some(BTreeMap::from([(
            NETWORK_STATUS_ANNOTATION.to_string(),
            r#"[{"name":"cbr0","ips":["10.244.1.5"],"default":true},
                {"name":"kroce-system/kroce-admission-fast","interface":"net1","ips":["10.56.0.7"]}]"#
                .to_string(),
        )]));
        assert_eq!(
            attachment_ipv4(&pod, "kroce-system", "kroce-admission-fast"),
            Some(Ipv4Addr::new(10, 56, 0, 7))
        );
        assert_eq!(
            attachment_ipv4(&pod, "kroce-system", "kroce-admission-other"),
            None
        );
    }
}
