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
//!
//! This module is the orchestration; by concern: [`settings`] (flags),
//! [`pools`] (pool gating), [`pods`] (perftest pod templates and calls),
//! [`marks`] (records, taint and label), [`multus`] (pod annotations),
//! `world` (what a pass reads, from the stores), `events`.

mod events;
pub(crate) mod marks;
mod multus;
mod pods;
mod pools;
mod settings;
mod world;

use events::{network_event, node_event};
pub use marks::*;
pub use multus::*;
pub use pods::*;
pub use pools::*;
pub use settings::*;
use world::{World, list_world};

use super::{Context, Error};
use k8s_openapi::api::core::v1::{Node, Pod};
use kroce_admission::lifecycle::{
    self, Action as Step, AdmissionInput, AdmissionPhase, NodeAdmission, NodeView, PodStart,
    RunOutcome, RunPods, TestRun,
};
use kroce_admission::pod_run::{self, Role};
use kroce_operator::crd::admission::rfc3339;
use kroce_operator::crd::{AdmissionGate, AdmissionSpec, RdmaNetwork};
use kroce_operator::names::{ADMISSION_NETWORK_LABEL, ADMISSION_ROLE_LABEL, ADMISSION_RUN_LABEL};
use kroce_operator::plan::ClusterPlan;
use kroce_operator::plan::nad::NetworkAttachmentDefinition;
use kube::api::DeleteParams;
use kube::runtime::events::EventType;
use kube::{Api, Resource, ResourceExt};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// Runs in progress are looked at this often (besides test pod events).
const POLL: Duration = Duration::from_secs(5);
/// Waiting for a slot or a peer: the end of another run frees it.
const WAIT: Duration = Duration::from_secs(30);
const IDLE: Duration = Duration::from_secs(300);

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
/// The outcome of a run from its pods, when it has one: finished, failed,
/// or stuck in a way waiting will not fix ([`broken_pod`]).
async fn outcome(
    api: &Api<Pod>,
    spec: &AdmissionSpec,
    server: Option<&Pod>,
    client: Option<&Pod>,
    (namespace, nad, now): (&str, &str, u64),
) -> Option<RunOutcome> {
    for (pod, role) in [(server, Role::Server), (client, Role::Client)] {
        if let Some(p) = pod
            && let Some(why) = broken_pod(p, role, namespace, nad, now)
        {
            return Some(RunOutcome::error(why));
        }
    }
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

/// What one network's part of a pass came to.
enum Pass {
    /// Look again after this long.
    Wake(Duration),
    /// The admission block is unusable: why.
    Invalid(String),
}

/// Plans and carries out one network's admission; updates `entries`
/// (per node) with the network's new records.
async fn run_network(
    ctx: &Context,
    net: &RdmaNetwork,
    spec: &AdmissionSpec,
    plan: &ClusterPlan,
    world: &World,
    entries: &mut Entries<'_>,
    now: u64,
) -> Result<Pass, Error> {
    let name = net.name_any();
    let settings = &ctx.admission;
    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), &settings.test_namespace);
    // This network's test pods only: another's runs are not orphans here.
    let pods: Vec<&Pod> = world
        .pods
        .iter()
        .map(|p| &**p)
        .filter(|p| label(p, ADMISSION_NETWORK_LABEL) == Some(name.as_str()))
        .collect();
    let by_run = pods_by_run(&pods);
    let views = node_views(&name, spec, plan, world, entries);
    let outcomes = run_outcomes(ctx, &pods_api, spec, &name, &views, &by_run, now).await;
    // The concurrency limit is cluster-wide: runs of other networks count.
    let testing_elsewhere = entries
        .all()
        .filter(|e| e.network != name)
        .filter(|e| matches!(e.state.phase, AdmissionPhase::Testing { .. }))
        .count() as u32;
    let before: BTreeMap<String, NodeAdmission> = views
        .iter()
        .map(|v| (v.name.clone(), v.admission.clone()))
        .collect();
    let input = AdmissionInput {
        testing_elsewhere,
        nodes: views,
        pod_runs: by_run.keys().map(|s| s.to_string()).collect(),
        outcomes,
        now,
    };
    let adm = match lifecycle::plan(&input, &spec.policy()) {
        Ok(p) => p,
        Err(e) => return Ok(Pass::Invalid(format!("spec.{e}"))),
    };
    let created = carry_out(ctx, net, spec, &pods_api, &pods, &adm.actions).await?;
    let nad = test_nad_name(&name);
    let seen: BTreeMap<String, RunPods> = by_run
        .iter()
        .map(|(id, (server, client))| {
            let server = server.map(|s| {
                attachment_ipv4(s, &settings.test_namespace, &nad)
                    .filter(|_| pod_phase(s) == "Running")
            });
            let pods = RunPods {
                server,
                client: client.is_some(),
            };
            (id.to_string(), pods)
        })
        .collect();
    for (run, start) in lifecycle::pods_to_start(&adm.nodes, &seen, &created) {
        start_pod(ctx, net, spec, &pods_api, run, start).await?;
    }
    let stamp = rfc3339(now);
    for (node, adm_state) in &adm.nodes {
        let previous = entries.of(node).iter().find(|e| e.network == name);
        // Unchanged records keep their entry (nothing rebuilt, nothing written).
        if previous.is_some() && before.get(node.as_str()) == Some(adm_state) {
            continue;
        }
        let entry = entry_for(&name, adm_state, previous, &stamp);
        entries.set(node, entry);
    }
    Ok(Pass::Wake(wake_after(&adm.nodes, spec, now)))
}

/// A run's server and client pods, by run id.
type PodsByRun<'a> = BTreeMap<&'a str, (Option<&'a Pod>, Option<&'a Pod>)>;

fn pods_by_run<'a>(pods: &[&'a Pod]) -> PodsByRun<'a> {
    let mut by_run: PodsByRun<'a> = BTreeMap::new();
    for p in pods.iter().copied() {
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
    by_run
}

/// The planner's view of each node the network selects. Nodes in another
/// network's run sit this one out until it ends.
fn node_views(
    name: &str,
    spec: &AdmissionSpec,
    plan: &ClusterPlan,
    world: &World,
    entries: &Entries<'_>,
) -> Vec<NodeView> {
    let nodes: BTreeMap<String, &Node> = world.nodes.iter().map(|n| (n.name_any(), &**n)).collect();
    let mut elsewhere = BTreeSet::new();
    let mut here = BTreeSet::new();
    for e in entries.all() {
        if let AdmissionPhase::Testing { run, .. } = &e.state.phase {
            let set = if e.network == name {
                &mut here
            } else {
                &mut elsewhere
            };
            set.insert(run.server_node.clone());
            set.insert(run.client_node.clone());
        }
    }
    let mut views = Vec::new();
    for np in plan
        .nodes
        .iter()
        .filter(|n| n.selected.iter().any(|s| s == name))
    {
        if elsewhere.contains(&np.node) && !here.contains(&np.node) {
            continue;
        }
        let state = world.states.get(&np.node).map(|s| &**s);
        let (config_generation, config_in_sync) = config_view(np, state, name);
        let marked_ready = nodes.get(&np.node).map(|n| match spec.gate {
            AdmissionGate::Taint => !has_taint(n),
            AdmissionGate::Label => has_label(n),
        });
        views.push(NodeView {
            name: np.node.clone(),
            admission: stored(entries.of(&np.node), name),
            config_generation,
            config_in_sync,
            marked_ready,
        });
    }
    views
}

/// Finished runs, from their pods (or a create failure of an earlier pass).
async fn run_outcomes(
    ctx: &Context,
    pods_api: &Api<Pod>,
    spec: &AdmissionSpec,
    name: &str,
    views: &[NodeView],
    by_run: &PodsByRun<'_>,
    now: u64,
) -> BTreeMap<String, RunOutcome> {
    let settings = &ctx.admission;
    let runs: BTreeSet<&str> = views
        .iter()
        .filter_map(|v| match &v.admission.phase {
            AdmissionPhase::Testing { run, .. } => Some(run.id.as_str()),
            _ => None,
        })
        .collect();
    let nad = test_nad_name(name);
    let mut outcomes = BTreeMap::new();
    for id in runs {
        // Pods that could not be created (an earlier pass): fail at once.
        if let Some(why) = settings.take_create_failure(id) {
            outcomes.insert(id.to_string(), RunOutcome::error(why));
            continue;
        }
        let (server, client) = by_run.get(id).copied().unwrap_or_default();
        let at = (settings.test_namespace.as_str(), nad.as_str(), now);
        if let Some(o) = outcome(pods_api, spec, server, client, at).await {
            outcomes.insert(id.to_string(), o);
        }
    }
    outcomes
}

/// The plan's actions on the API: test pods deleted and created, events.
/// Returns the runs whose server pod was tried this pass.
async fn carry_out(
    ctx: &Context,
    net: &RdmaNetwork,
    spec: &AdmissionSpec,
    pods_api: &Api<Pod>,
    pods: &[&Pod],
    actions: &[Step],
) -> Result<BTreeSet<String>, Error> {
    let name = net.name_any();
    let resource = net.spec.full_resource_name(&name);
    let settings = &ctx.admission;
    let mut created: BTreeSet<String> = BTreeSet::new();
    for step in actions {
        match step {
            Step::DeleteTestPods { run_id } => {
                let names = pods
                    .iter()
                    .filter(|p| label(p, ADMISSION_RUN_LABEL) == Some(run_id.as_str()))
                    .map(|p| p.name_any())
                    .collect::<Vec<_>>();
                for e in delete_pods(pods_api, names.iter().map(String::as_str)).await {
                    tracing::warn!(error = %e, run = %run_id, "cannot delete test pod");
                }
            }
            Step::CreateTestPods { run } => {
                let pod = test_pod(settings, &name, &resource, spec, run, Role::Server, None)?;
                let r = match ensure_test_nad(ctx, net).await {
                    Ok(()) => create_pod(pods_api, &pod)
                        .await
                        .map_err(|e| CreateFailure::pod(&pod.name_any(), &e)),
                    Err(e) => Err(CreateFailure::nad(&settings.test_namespace, &name, &e)),
                };
                // Tried this pass either way: not again below.
                created.insert(run.id.clone());
                if let Err(f) = r {
                    create_failed(ctx, &run.server_node, &run.id, f).await;
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
            // Recorded with the node's state by the caller; marks follow
            // every network at once (apply_marks).
            Step::RecordResult { .. } | Step::MarkNode { .. } => {}
        }
    }
    Ok(created)
}

/// Creates one test pod of a run in progress (the planner's
/// [`lifecycle::pods_to_start`]).
async fn start_pod(
    ctx: &Context,
    net: &RdmaNetwork,
    spec: &AdmissionSpec,
    pods_api: &Api<Pod>,
    run: &TestRun,
    start: PodStart,
) -> Result<(), Error> {
    let name = net.name_any();
    let resource = net.spec.full_resource_name(&name);
    let settings = &ctx.admission;
    let pod = match start {
        PodStart::Server => {
            let pod = test_pod(settings, &name, &resource, spec, run, Role::Server, None)?;
            if let Err(e) = ensure_test_nad(ctx, net).await {
                let f = CreateFailure::nad(&settings.test_namespace, &name, &e);
                create_failed(ctx, &run.server_node, &run.id, f).await;
                return Ok(());
            }
            pod
        }
        PodStart::Client { server_ip } => test_pod(
            settings,
            &name,
            &resource,
            spec,
            run,
            Role::Client,
            Some(server_ip),
        )?,
    };
    if let Err(e) = create_pod(pods_api, &pod).await {
        let f = CreateFailure::pod(&format!("of run {}", run.id), &e);
        create_failed(ctx, &run.client_node, &run.id, f).await;
    }
    Ok(())
}

/// A test pod (or its attachment definition) could not be created: an
/// event on the node, and a refusal fails the run at once.
async fn create_failed(ctx: &Context, node: &str, run_id: &str, f: CreateFailure) {
    node_event(
        ctx,
        node,
        EventType::Warning,
        "AdmissionPodFailed",
        f.message.clone(),
    )
    .await;
    if f.fatal {
        ctx.admission.record_create_failure(run_id, f.message);
    }
}

/// Admission from a network's reconcile: one pass over every network
/// (this one first), so a node's entries are written once per pass, not
/// once per network (at rollout: one write per node instead of ten).
/// Returns when this network should be looked at again; the others are
/// woken by their own entries changing (see `wake`).
pub(crate) async fn reconcile_network(
    ctx: &Context,
    net: &RdmaNetwork,
    plan: &ClusterPlan,
) -> Result<Duration, Error> {
    let settings = ctx.admission.clone();
    let _one_at_a_time = settings.lock.lock().await;
    let now = (settings.clock)();
    let name = net.name_any();
    let world = list_world(ctx).await?;
    let mut entries = Entries::new(&world);
    let others = ctx.stores.networks();
    let order =
        std::iter::once(net).chain(others.iter().map(|n| &**n).filter(|n| n.name_any() != name));
    let mut wake = IDLE;
    let mut first_error = None;
    for n in order {
        let this = n.name_any();
        let own = this == name;
        if plan.invalid.contains_key(&this) || n.meta().deletion_timestamp.is_some() {
            continue;
        }
        let spec = AdmissionSpec::of(n.spec.admission.as_ref());
        let pass = match spec.validate() {
            Ok(()) => run_network(ctx, n, &spec, plan, &world, &mut entries, now).await,
            Err(errors) => Ok(Pass::Invalid(errors.join("; "))),
        };
        match pass {
            Ok(Pass::Wake(w)) if own => wake = w,
            Ok(Pass::Invalid(why)) if own => {
                network_event(ctx, net, "InvalidAdmission", why).await;
            }
            Ok(_) => {}
            // Another network's trouble is its own reconcile's to report.
            Err(e) if own => first_error = Some(e),
            Err(e) => tracing::debug!(network = %this, error = %e, "admission pass"),
        }
    }
    persist_and_mark(ctx, plan, &world, entries).await?;
    match first_error {
        Some(e) => Err(e),
        None => Ok(wake),
    }
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
    let world = list_world(ctx).await?;
    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), &settings.test_namespace);
    let names: Vec<String> = world
        .pods
        .iter()
        .filter(|p| label(p, ADMISSION_NETWORK_LABEL) == Some(name.as_str()))
        .map(|p| p.name_any())
        .collect();
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
    let mut entries = Entries::new(&world);
    entries.remove_network(&name);
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
    use kroce_operator::crd::{RdmaNodeState, RdmaNodeStateSpec};
    use kroce_operator::names::MULTUS_NETWORK_STATUS_ANNOTATION as NETWORK_STATUS_ANNOTATION;
    use kroce_operator::plan::DevicePluginConfig;
    use kroce_operator::plan::Pool;
    use std::net::Ipv4Addr;

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
        let adm =
            |network: &str, schedulable: bool| kroce_operator::crd::admission::NetworkAdmission {
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
