//! The node agent's Kubernetes loop ([`run_with`], what `node-agent` runs)
//! on a fixture host with the fake edges, against the in-memory API server:
//! the watch of its own `RdmaNodeState`, the resync that repairs drift,
//! status reports by server-side apply only on change, and API errors.
//!
//! Time is paused: it moves only when every task waits on a timer and no
//! apply pass runs on the blocking pool, so a resync interval is exact, a
//! test's host edits never race a pass, and waiting for something that does
//! not come fails at a virtual deadline. A loop that never waits fails at a
//! wall-clock one.

use super::counters::{CounterScope, Counters, EthtoolError, EthtoolSource};
use super::holders::HolderSources;
use super::node_checks::{NodeChecks, NodeChecksConfig};
use super::run::{AGENT_MANAGER, AgentMetrics, AgentRunError, HostEdges, RunConfig, run_with};
use super::run::{PodDevices, PodResourcesListError, PodResourcesSource};
use super::tests::{PF0, PF1, Rig, irq_affinities, pci, pf_config, spec};
use futures::FutureExt;
use kroce_admission::counters::CongestionLimits;
use kroce_operator::crd::conditions::find;
use kroce_operator::crd::{RdmaNodeState, RdmaNodeStateSpec, RdmaNodeStateStatus, SyncState};
use kroce_operator::testing::mock::{ApiServer, Call};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep};

const KROCE: &str = "/apis/kroce.io/v1alpha1";
const CORE: &str = "/api/v1";
const STATES: &str = "rdmanodestates";
const NODE: &str = "n1";
/// So long that only the watch can explain a pass.
const NEVER: Duration = Duration::from_secs(3600);
const RESYNC: Duration = Duration::from_secs(10);
/// Longer than any scenario: only the heartbeat test sees one.
const HEARTBEAT: Duration = Duration::from_secs(86_400);
/// Virtual time any awaited outcome may take before the test fails.
const PATIENCE: Duration = Duration::from_secs(120);
const STEP: Duration = Duration::from_millis(5);
/// Wall time a whole scenario may take (about 2 s alone, mostly the fixture
/// host's file system work).
const REAL_PATIENCE: Duration = Duration::from_secs(60);
const IRQ_RECHECK: Duration = Duration::from_secs(3);
const PROGRESS_AFTER: Duration = Duration::from_secs(2);
/// A driver that takes its time creating VFs (wall time).
const SLOW_WRITE: Duration = Duration::from_millis(2500);

fn node_state(name: &str, spec: &RdmaNodeStateSpec) -> Value {
    json!({
        "apiVersion": "kroce.io/v1alpha1", "kind": "RdmaNodeState",
        "metadata": {"name": name},
        "spec": spec,
    })
}

fn spec_of(node: &str) -> RdmaNodeStateSpec {
    RdmaNodeStateSpec {
        node_name: node.into(),
        ..spec()
    }
}

/// A running pod on `node` whose Multus status names the VF `vf`: what
/// the old agent took for a holder (any pod author can write it).
fn pod_claiming(node: &str, name: &str, vf: &str) -> Value {
    let status = json!([{
        "name": "team-a/fast",
        "device-info": {"type": "pci", "pci": {"pci-address": vf}}
    }]);
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "team-a",
                     "annotations": {"k8s.v1.cni.cncf.io/network-status": status.to_string()}},
        "spec": {"nodeName": node, "containers": []},
        "status": {"phase": "Running"}
    })
}

/// The kubelet's PodResources answer, from memory.
#[derive(Default)]
struct FakePodResources {
    answer: std::sync::Mutex<Vec<PodDevices>>,
    /// The next this many `List`s fail.
    failures: AtomicUsize,
    calls: AtomicUsize,
}

impl PodResourcesSource for FakePodResources {
    fn list(
        &self,
    ) -> futures::future::BoxFuture<'_, Result<Vec<PodDevices>, PodResourcesListError>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let fail = self
            .failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        let answer = self.answer.lock().unwrap().clone();
        Box::pin(async move {
            if fail {
                Err(PodResourcesListError::Timeout {
                    path: "/var/lib/kubelet/pod-resources/kubelet.sock".into(),
                    timeout: Duration::from_secs(5),
                })
            } else {
                Ok(answer)
            }
        })
    }
}

/// Runs a scenario on a current-thread runtime with paused time, on its own
/// thread, and fails it after [`REAL_PATIENCE`] of wall time: a loop that
/// never waits (so virtual time never moves) fails instead of blocking.
fn scenario<F, Fut>(f: F)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = ()>,
{
    let (tx, rx) = std::sync::mpsc::channel();
    let name = std::thread::current()
        .name()
        .unwrap_or("scenario")
        .to_string();
    let runner = std::thread::Builder::new().name(name).spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| rt.block_on(f())));
        let _ = tx.send(r);
    });
    runner.unwrap();
    match rx.recv_timeout(REAL_PATIENCE) {
        Ok(Ok(())) => {}
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        Err(_) => panic!(
            "scenario still running after {REAL_PATIENCE:?} of wall time: \
             something loops without ever waiting"
        ),
    }
}

/// Lets every pending wake-up run its pass; no resync falls in it.
async fn settle() {
    sleep(Duration::from_secs(1)).await;
}

/// The loop for node `n1` on a fresh fixture host (`connectx6dx_pair`:
/// ens1f0 and ens2f0 with 8 VFs each).
struct Harness {
    rig: Rig,
    server: ApiServer,
    metrics: AgentMetrics,
    /// `ethtool -S` of the node checks, when they run.
    ethtool: Arc<FakeEthtool>,
    pod_resources: Arc<FakePodResources>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), AgentRunError>>,
}

/// `ethtool -S` answers for the node checks, counted.
#[derive(Default)]
struct FakeEthtool {
    calls: AtomicUsize,
    rx_prio3_pause: AtomicU64,
}

impl EthtoolSource for FakeEthtool {
    fn stats(&self, _ifname: &str) -> Result<Option<String>, EthtoolError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Ok(Some(format!(
            "NIC statistics:\n     rx_prio3_pause: {}\n     rx_discards_phy: 0\n",
            self.rx_prio3_pause.load(Ordering::SeqCst)
        )))
    }
}

/// How a scenario runs the loop beyond [`Harness::start`]'s defaults.
struct Setup {
    resync: Duration,
    heartbeat: Duration,
    /// With the node checks (NRI, doctor, counters) on the fixture host.
    checks: bool,
    /// `List`s of the kubelet's PodResources that fail first.
    pod_resources_failures: usize,
    /// Each `sriov_numvfs` write takes [`SLOW_WRITE`] of wall time.
    slow_writes: bool,
    /// `--allow-host-reboot`, over this fake host.
    reboot: Option<Arc<crate::reboot::fake::FakeReboot>>,
}

impl Setup {
    /// A resync every [`RESYNC`], no heartbeat in sight, no node checks.
    const PLAIN: Setup = Setup {
        resync: RESYNC,
        heartbeat: HEARTBEAT,
        checks: false,
        pod_resources_failures: 0,
        slow_writes: false,
        reboot: None,
    };
}

/// Seeds n1's node state (the test [`spec`]).
fn seed_state(s: &ApiServer) {
    s.insert(KROCE, STATES, node_state(NODE, &spec()));
}

impl Harness {
    /// `seed` fills the API server before the loop starts.
    fn start(resync: Duration, seed: impl FnOnce(&ApiServer)) -> Harness {
        Harness::start_with(
            Setup {
                resync,
                ..Setup::PLAIN
            },
            seed,
        )
    }

    fn start_with(setup: Setup, seed: impl FnOnce(&ApiServer)) -> Harness {
        let (client, server) = ApiServer::start();
        seed(&server);
        let rig = if setup.slow_writes {
            Rig::with_kernel_hook(|h| {
                std::thread::sleep(SLOW_WRITE);
                super::tests::lay_out_kernel_files(h)
            })
        } else {
            Rig::new()
        };
        let ethtool = Arc::new(FakeEthtool::default());
        let checks = setup.checks.then(|| {
            NodeChecks::new(
                NodeChecksConfig {
                    nri_socket: rig.path.join("var/run/nri/nri.sock"),
                    nri_status: rig.path.join(crate::doctor::DEFAULT_NRI_STATUS),
                    congestion: CongestionLimits {
                        max_pause_frames_per_sec: 100.0,
                        max_discards_per_sec: 10.0,
                    },
                },
                Counters {
                    root: rig.config.root.clone(),
                    node: NODE.into(),
                    scope: CounterScope::Pfs,
                    ethtool: ethtool.clone(),
                },
            )
        });
        let cfg = RunConfig {
            node_name: NODE.into(),
            agent: rig.config.clone(),
            resync: setup.resync,
            vf_write_timeout: Duration::from_secs(5),
            checks,
            checks_timeout: Duration::from_secs(30),
            heartbeat: setup.heartbeat,
            holders: HolderSources {
                cni_state_required: true,
                ..rig.sources()
            },
            irq_recheck: IRQ_RECHECK,
            progress_after: PROGRESS_AFTER,
        };
        // Where the chart's kroce-cni keeps its claims (none yet).
        std::fs::create_dir_all(rig.sources().cni_state_dir).unwrap();
        let pod_resources = Arc::new(FakePodResources::default());
        pod_resources
            .failures
            .store(setup.pod_resources_failures, Ordering::SeqCst);
        let edges = HostEdges {
            vfs: rig.kernel.clone(),
            links: rig.links.clone(),
            dcb: rig.dcb.clone(),
            record: rig.record.clone(),
            netns_mode: rig.netns_mode.clone(),
            reboot: setup.reboot.clone().map(|r| r as _),
            pod_resources: Some(pod_resources.clone()),
        };
        let metrics = AgentMetrics::default();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(run_with(client, cfg, edges, metrics.clone(), async move {
            let _ = stopped.await;
        }));
        Harness {
            rig,
            server,
            metrics,
            ethtool,
            pod_resources,
            stop: Some(stop),
            task,
        }
    }

    fn passes(&self) -> u64 {
        self.metrics.passes.get()
    }

    fn changes(&self) -> u64 {
        self.metrics.changes.get()
    }

    fn calls_to(&self, method: &str, path: &str) -> Vec<Call> {
        self.server
            .calls()
            .into_iter()
            .filter(|c| c.method == method && c.path == path)
            .collect()
    }

    fn status_patches(&self) -> Vec<Call> {
        self.calls_to("PATCH", &format!("{KROCE}/{STATES}/{NODE}/status"))
    }

    fn gets(&self, name: &str) -> usize {
        self.calls_to("GET", &format!("{KROCE}/{STATES}/{name}"))
            .len()
    }

    fn watches(&self) -> Vec<Call> {
        self.calls_to("GET", &format!("{KROCE}/{STATES}"))
            .into_iter()
            .filter(|c| c.param("watch").as_deref() == Some("true"))
            .collect()
    }

    fn object(&self, name: &str) -> Option<Value> {
        self.server.get(KROCE, STATES, "", name)
    }

    fn stored_status(&self) -> Option<RdmaNodeStateStatus> {
        let v = self.object(NODE)?;
        serde_json::from_value::<RdmaNodeState>(v).ok()?.status
    }

    fn status(&self) -> RdmaNodeStateStatus {
        self.stored_status()
            .unwrap_or_else(|| panic!("no status on {NODE}: {:#?}", self.object(NODE)))
    }

    fn in_sync(&self) -> bool {
        self.stored_status()
            .is_some_and(|s| s.sync_state == SyncState::Succeeded)
    }

    fn vfs_on(&self, pf: &str) -> usize {
        self.rig.host().pci[&pci(pf)]
            .sriov
            .as_ref()
            .map_or(0, |s| s.vfs.len())
    }

    /// Waits (virtual time) until `done`; fails if the loop ends first or
    /// it does not come within [`PATIENCE`].
    async fn until(&mut self, what: &str, mut done: impl FnMut(&Harness) -> bool) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if done(self) {
                return;
            }
            if self.task.is_finished() {
                let r = (&mut self.task).now_or_never();
                panic!("the loop ended while waiting for {what}: {r:?}");
            }
            assert!(
                Instant::now() < deadline,
                "no {what} within {PATIENCE:?}; requests: {:#?}\nstate: {:#?}",
                self.server.requests(),
                self.object(NODE)
            );
            sleep(STEP).await;
        }
    }

    /// The loop with the node checks on and n1's state seeded, once its
    /// first complete report is in: congestion is judged from the second
    /// snapshot on, so that is the first resync's report.
    async fn checked_and_reported() -> Harness {
        let mut h = Harness::start_with(
            Setup {
                checks: true,
                ..Setup::PLAIN
            },
            seed_state,
        );
        h.until_reported().await;
        sleep(RESYNC + RESYNC / 2).await;
        h
    }

    /// Waits for the first status report.
    async fn until_reported(&mut self) {
        self.until("first report", |h| !h.status_patches().is_empty())
            .await;
    }

    /// Waits until the status reports spec generation `n`.
    async fn until_generation(&mut self, n: i64) {
        self.until(&format!("generation {n} reported"), |h| {
            h.stored_status()
                .is_some_and(|s| s.observed_generation == Some(n))
        })
        .await;
    }

    /// The controller sets ens1f0's VFs in n1's spec to `n`; whether n1's
    /// node state was there to change.
    fn set_pf0_vfs(&self, n: u32) -> bool {
        self.server.update(KROCE, STATES, "", NODE, |o| {
            o["spec"]["pfs"][0] = serde_json::to_value(pf_config(PF0, "ens1f0", n)).unwrap();
        })
    }

    fn assert_running(&self) {
        assert!(!self.task.is_finished(), "the loop ended");
    }

    /// Stops the loop as SIGTERM would; its result.
    async fn stop(mut self) -> Result<(), AgentRunError> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        tokio::time::timeout(PATIENCE, &mut self.task)
            .await
            .expect("the loop did not stop")
            .expect("the loop panicked")
    }
}

#[test]
fn a_node_state_that_appears_is_applied_and_reported_by_server_side_apply() {
    scenario(|| async {
        let mut h = Harness::start(NEVER, |_| {});
        h.until("watch of the node state", |h| !h.watches().is_empty())
            .await;
        // The API server filters the watch to this node's object.
        assert_eq!(
            h.watches()[0].param("fieldSelector").as_deref(),
            Some("metadata.name=n1")
        );
        settle().await;
        assert!(h.gets(NODE) >= 1, "the agent looked for its node state");
        assert_eq!(h.passes(), 0, "nothing to apply yet");
        assert!(h.rig.kernel.writes().is_empty());

        h.server.insert(KROCE, STATES, node_state(NODE, &spec()));
        h.until_reported().await;
        // Long, but no resync: only events could cause more passes.
        sleep(NEVER / 2).await;

        // Applied: ens1f0 8 -> 4 (through 0), ens2f0 already has 8.
        assert_eq!(h.rig.kernel.writes(), [(pci(PF0), 0), (pci(PF0), 4)]);
        assert_eq!(h.vfs_on(PF0), 4);
        assert_eq!(h.vfs_on(PF1), 8);
        assert!(h.changes() > 2, "VFs, MTUs, IRQs, QoS: {}", h.changes());

        // One report, by server-side apply, with the agent's field manager, of
        // the status only; nothing else written.
        let patches = h.status_patches();
        assert_eq!(patches.len(), 1, "{patches:#?}");
        let p = &patches[0];
        assert!(
            p.content_type.starts_with("application/apply-patch"),
            "{}",
            p.content_type
        );
        assert_eq!(p.param("fieldManager").as_deref(), Some(AGENT_MANAGER));
        assert_eq!(p.param("force").as_deref(), Some("true"));
        let keys: Vec<&str> = p
            .body
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(keys, ["apiVersion", "kind", "status"]);
        assert_eq!(p.body["apiVersion"], "kroce.io/v1alpha1");
        assert_eq!(p.body["kind"], "RdmaNodeState");
        let writes: Vec<String> = h
            .server
            .requests()
            .into_iter()
            .filter(|r| !r.starts_with("GET "))
            .collect();
        assert_eq!(writes, [format!("PATCH {KROCE}/{STATES}/{NODE}/status")]);

        let st = h.status();
        assert_eq!(st.sync_state, SyncState::Succeeded, "{st:#?}");
        assert_eq!(st.observed_generation, Some(1));
        assert!(st.last_sync_time.is_some());
        assert_eq!(st.managed_pfs, [PF0, PF1]);
        let observed: Vec<(&str, u32, usize)> = st
            .pfs
            .iter()
            .map(|p| (p.pci_address.as_str(), p.num_vfs, p.vfs.len()))
            .collect();
        assert_eq!(observed, [(PF0, 4, 4), (PF1, 8, 8)]);
        assert!(
            st.pfs[0]
                .vfs
                .iter()
                .all(|v| v.netdev.is_some() && v.rdma_device.is_some() && v.mtu == Some(9000))
        );
        let ready = find(&st.conditions, "Ready").expect("Ready condition");
        assert!(ready.is_true());
        assert!(ready.last_transition_time.is_some());
        assert!(
            !find(&st.conditions, "Degraded")
                .expect("Degraded")
                .is_true()
        );
        // The API server records the agent as the owner of what it applied.
        let owners = h.object(NODE).unwrap()["metadata"]["managedFields"].clone();
        assert_eq!(owners[0]["manager"], AGENT_MANAGER, "{owners:#}");
        assert_eq!(owners[0]["operation"], "Apply");
        assert_eq!(owners[0]["subresource"], "status");
        assert!(
            owners[0]["fieldsV1"]["f:status"]
                .get("f:syncState")
                .is_some()
        );
        // Its spec is the controller's: untouched.
        assert_eq!(
            h.object(NODE).unwrap()["spec"],
            serde_json::to_value(spec()).unwrap()
        );

        // SIGTERM (here: the shutdown future) ends the loop cleanly, and it
        // stops watching.
        let server = h.server.clone();
        h.stop().await.unwrap();
        let before = server.requests().len();
        server.update(KROCE, STATES, "", NODE, |o| {
            o["spec"]["pfs"][0]["numVfs"] = 2.into();
        });
        sleep(NEVER * 2).await;
        assert_eq!(server.requests().len(), before);
    });
}

#[test]
fn a_spec_change_is_applied_and_reported() {
    scenario(|| async {
        let mut h = Harness::start(NEVER, seed_state);
        h.until("first apply", Harness::in_sync).await;
        settle().await;
        let writes = h.rig.kernel.writes().len();
        let patches = h.status_patches().len();

        // The controller narrows ens1f0 from 4 VFs to 2.
        assert!(h.set_pf0_vfs(2));
        h.until_generation(2).await;
        settle().await;

        assert_eq!(
            h.rig.kernel.writes()[writes..],
            [(pci(PF0), 0), (pci(PF0), 2)],
            "the kernel refuses 4 -> 2: through 0; ens2f0 untouched"
        );
        assert_eq!(h.vfs_on(PF0), 2);
        assert_eq!(h.vfs_on(PF1), 8);
        let st = h.status();
        assert_eq!(st.sync_state, SyncState::Succeeded, "{st:#?}");
        let observed: Vec<(&str, u32, usize)> = st
            .pfs
            .iter()
            .map(|p| (p.pci_address.as_str(), p.num_vfs, p.vfs.len()))
            .collect();
        assert_eq!(observed, [(PF0, 2, 2), (PF1, 8, 8)]);
        assert!(find(&st.conditions, "Ready").unwrap().is_true());
        assert_eq!(h.status_patches().len(), patches + 1, "one report");
        h.stop().await.unwrap();
    });
}

#[test]
fn host_drift_is_put_back_at_the_next_resync_without_a_status_report() {
    scenario(|| async {
        let mut h = Harness::start(RESYNC, seed_state);
        h.until("first apply", Harness::in_sync).await;
        settle().await;
        let (passes, changes, patches) = (h.passes(), h.changes(), h.status_patches().len());
        let writes = h.rig.kernel.writes();
        let reported = h.status();

        // Someone moves an IRQ of ens1f0. The loop is idle (time is paused), so
        // this cannot race a pass.
        let (_, irq, _) = irq_affinities(&h.rig.host(), PF0, &h.rig.path)[0].clone();
        let affinity = format!("proc/irq/{irq}/smp_affinity_list");
        let pinned = h.rig.file(&affinity);
        std::fs::write(h.rig.path.join(&affinity), "0-31\n").unwrap();
        // Nothing watches the host: before the resync it stays moved.
        sleep(RESYNC / 2).await;
        assert_eq!(h.passes(), passes);
        assert_eq!(h.rig.file(&affinity), "0-31");
        // After it (one pass: the next is a whole interval later), it is back.
        sleep(RESYNC / 2 + Duration::from_secs(1)).await;
        assert_eq!(h.passes(), passes + 1);
        assert_eq!(h.rig.file(&affinity), pinned);
        assert_eq!(h.changes(), changes + 1, "only the IRQ was rewritten");
        assert_eq!(h.rig.kernel.writes(), writes, "no VF writes");
        // What the agent reports did not change: no status patch.
        assert_eq!(h.status_patches().len(), patches);

        // VFs removed behind the agent's back come back at the next resync.
        h.rig
            .kernel
            .host
            .lock()
            .unwrap()
            .set_num_vfs(&pci(PF1), 0)
            .unwrap();
        assert_eq!(h.vfs_on(PF1), 0);
        sleep(RESYNC).await;
        assert_eq!(h.rig.kernel.writes()[writes.len()..], [(pci(PF1), 8)]);
        assert_eq!(h.vfs_on(PF1), 8);
        // Recreated VFs are new devices to the kernel (new RDMA device names
        // and IRQ numbers, as on real hardware): that is news, reported once;
        // the report's own event wakes no pass.
        assert_eq!(h.passes(), passes + 2);
        assert_eq!(h.status_patches().len(), patches + 1);
        let now = h.status();
        let devices = |s: &RdmaNodeStateStatus| -> Vec<Option<String>> {
            s.pfs[1].vfs.iter().map(|v| v.rdma_device.clone()).collect()
        };
        assert_eq!(now.pfs[1].vfs.len(), 8);
        assert!(devices(&now).iter().all(Option::is_some));
        assert!(
            devices(&now)
                .iter()
                .all(|d| !devices(&reported).contains(d)),
            "{:?} vs {:?}",
            devices(&now),
            devices(&reported)
        );
        assert_eq!(now.sync_state, SyncState::Succeeded);
        assert_eq!(now.pfs[0], reported.pfs[0], "ens1f0 unchanged");
        let (passes, patches) = (h.passes(), h.status_patches().len());
        // And a pass with nothing to do changes nothing.
        let changes = h.changes();
        sleep(RESYNC).await;
        assert_eq!(h.passes(), passes + 1);
        assert_eq!(h.changes(), changes);
        assert_eq!(h.status_patches().len(), patches);
        h.stop().await.unwrap();
    });
}

#[test]
fn the_node_state_of_another_node_is_ignored() {
    scenario(|| async {
        let mut h = Harness::start(NEVER, |s| {
            // A pod on n2 claiming "the same" VF address as one of n1's.
            s.insert(CORE, "pods", pod_claiming("n2", "other-0", "0000:3b:00.3"));
        });
        h.until("watch of the node state", |h| !h.watches().is_empty())
            .await;
        settle().await;
        let gets = h.gets(NODE);

        h.server
            .insert(KROCE, STATES, node_state("n2", &spec_of("n2")));
        h.server.update(KROCE, STATES, "", "n2", |o| {
            o["spec"]["pfs"][0]["numVfs"] = 2.into();
        });
        sleep(NEVER / 2).await;
        assert_eq!(h.passes(), 0);
        assert_eq!(h.gets(NODE), gets, "n2's events did not wake the agent");
        assert!(h.rig.kernel.writes().is_empty());
        let touched: Vec<String> = h
            .server
            .requests()
            .into_iter()
            .filter(|r| r.contains("/n2"))
            .collect();
        assert!(touched.is_empty(), "{touched:?}");

        // n1's own state still works, and n2's pod holds nothing on n1.
        h.server.insert(KROCE, STATES, node_state(NODE, &spec()));
        h.until("n1 applied", Harness::in_sync).await;
        assert_eq!(h.rig.kernel.writes(), [(pci(PF0), 0), (pci(PF0), 4)]);
        assert!(h.status().held_vfs.is_empty());
        // Issue 24: the agent lists no pods at all (its holders come from
        // the node itself).
        let lists = h.calls_to("GET", &format!("{CORE}/pods"));
        assert!(lists.is_empty(), "{lists:#?}");
        assert!(h.object("n2").unwrap().get("status").is_none());
        h.stop().await.unwrap();
    });
}

#[test]
fn a_failed_status_report_does_not_stop_the_loop_and_the_next_pass_retries() {
    scenario(|| async {
        let mut h = Harness::start(RESYNC, |s| {
            s.fail(500, 1, |c| {
                c.method == "PATCH" && c.path == format!("{KROCE}/{STATES}/{NODE}/status")
            });
        });
        h.until("watch of the node state", |h| !h.watches().is_empty())
            .await;
        settle().await;
        h.server.insert(KROCE, STATES, node_state(NODE, &spec()));
        h.until_reported().await;
        // Refused: nothing stored, and no event wakes the agent; it keeps going.
        sleep(RESYNC / 2).await;
        h.assert_running();
        assert_eq!(h.status_patches().len(), 1);
        assert!(h.stored_status().is_none());
        assert_eq!(h.passes(), 1);
        // The next pass (the resync) finds the report missing and sends it again.
        h.until("report stored", Harness::in_sync).await;
        // Pass 2 reported; the report's own event woke no pass.
        assert_eq!(h.passes(), 2);
        let patches = h.status_patches();
        assert_eq!(patches.len(), 2);
        // The same report, but for its timestamps (the refused one left no
        // conditions to keep transition times from).
        assert_eq!(content(&patches[0]), content(&patches[1]));
        // The host was configured once; the retry is only the report.
        assert_eq!(h.rig.kernel.writes(), [(pci(PF0), 0), (pci(PF0), 4)]);
        h.stop().await.unwrap();
    });
}

#[test]
fn an_error_reading_the_node_state_does_not_stop_the_loop() {
    scenario(|| async {
        let mut h = Harness::start(RESYNC, |s| {
            s.fail(500, 1, |c| {
                c.method == "GET" && c.path == format!("{KROCE}/{STATES}/{NODE}")
            });
            seed_state(s);
        });
        h.until("node state applied", Harness::in_sync).await;
        h.assert_running();
        assert!(h.gets(NODE) >= 2, "read again after the 500");
        assert_eq!(h.rig.kernel.writes(), [(pci(PF0), 0), (pci(PF0), 4)]);
        h.stop().await.unwrap();
    });
}

#[test]
fn a_failing_watch_is_retried_with_backoff_and_the_resync_still_applies() {
    scenario(|| async {
        let mut h = Harness::start(RESYNC, |s| {
            s.fail(500, 1000, |c| c.param("watch").as_deref() == Some("true"));
            seed_state(s);
        });
        h.until("first apply", Harness::in_sync).await;
        sleep(Duration::from_secs(60)).await;
        // Retried, but not in a tight loop against the API server: client-go's
        // backoff, 0.8 s doubling up to 30 s, plus up to as much again in
        // jitter, makes 5 to 7 attempts in 60 s.
        let attempts = h.watches().len();
        assert!(
            (4..=8).contains(&attempts),
            "{attempts} watch attempts in 60 s"
        );
        // Without events, the resync still brings spec changes.
        h.set_pf0_vfs(2);
        h.until_generation(2).await;
        assert_eq!(h.vfs_on(PF0), 2);
        h.stop().await.unwrap();
    });
}

/// Issue 19: holders come from the node's records, not from pods' Multus
/// annotations (any pod author writes those): a pod annotation naming a VF
/// holds nothing; the kubelet's PodResources, kroce-cni's claims and the
/// DRA checkpoint (`attach: false` included) do. An unreadable PodResources
/// holds every VF.
#[test]
fn vfs_held_per_the_nodes_records_and_an_unreadable_kubelet_holds_all() {
    scenario(|| async {
        let mut h = Harness::start_with(
            Setup {
                pod_resources_failures: 1,
                ..Setup::PLAIN
            },
            |s| {
                // A pod author's forged annotation: ignored.
                s.insert(CORE, "pods", pod_claiming(NODE, "forger-0", "0000:3b:00.3"));
                seed_state(s);
            },
        );
        // Pass 1 cannot ask the kubelet: every VF counts as held, ens1f0 is
        // left alone. The resync runs pass 2, which reads an empty answer
        // and applies (the annotation holds nothing).
        h.until("two reports", |h| h.status_patches().len() >= 2)
            .await;
        let first: RdmaNodeStateStatus =
            serde_json::from_value(h.status_patches()[0].body["status"].clone()).unwrap();
        let held = find(&first.conditions, "VfsHeld").expect("VfsHeld");
        assert!(held.is_true());
        assert!(
            held.message
                .contains("cannot read the kubelet's PodResources"),
            "{}",
            held.message
        );
        assert_eq!(first.sync_state, SyncState::InProgress);
        assert_eq!(first.pfs[0].num_vfs, 8, "ens1f0 left alone");
        assert_eq!(first.held_vfs.len(), 8, "{:?}", first.held_vfs);
        assert!(h.in_sync());
        assert_eq!(h.rig.kernel.writes(), [(pci(PF0), 0), (pci(PF0), 4)]);
        let st = h.status();
        assert!(!find(&st.conditions, "VfsHeld").unwrap().is_true());
        assert!(st.held_vfs.is_empty(), "cleared: {:?}", st.held_vfs);
        assert!(h.calls_to("GET", &format!("{CORE}/pods")).is_empty());

        // The kubelet assigned a VF of ens1f0 to a pod; the spec wants 2 VFs.
        *h.pod_resources.answer.lock().unwrap() = vec![PodDevices {
            pod: "team-a/trainer-0".into(),
            resource: "rdma/fast".into(),
            device_ids: vec!["0000:3b:00.3".into()],
        }];
        h.set_pf0_vfs(2);
        h.until_generation(2).await;
        let st = h.status();
        let held = find(&st.conditions, "VfsHeld").unwrap();
        assert!(
            held.message
                .contains("team-a/trainer-0 (kubelet PodResources, rdma/fast)"),
            "{}",
            held.message
        );
        assert_eq!(st.held_vfs.len(), 1, "{:?}", st.held_vfs);
        assert_eq!(st.held_vfs[0].pods, ["team-a/trainer-0"]);
        assert_eq!(h.vfs_on(PF0), 4);

        // The pod ends, but a DRA claim with `attach: false` (no network,
        // so no annotation and no CNI claim) holds another VF.
        h.pod_resources.answer.lock().unwrap().clear();
        super::tests::dra_checkpoint(&h.rig, "0000:3b:00.4", "team-b", "rdma-c", false);
        sleep(RESYNC).await;
        settle().await;
        let st = h.status();
        assert_eq!(h.vfs_on(PF0), 4);
        assert_eq!(st.held_vfs.len(), 1, "{:?}", st.held_vfs);
        assert_eq!(st.held_vfs[0].pci_address, "0000:3b:00.4");
        assert!(
            st.held_vfs[0]
                .reason
                .contains("DRA claim team-b/rdma-c, attach: false"),
            "{}",
            st.held_vfs[0].reason
        );
        // A kroce-cni claim holds too.
        std::fs::remove_file(h.rig.sources().dra_checkpoint).unwrap();
        super::tests::cni_claim(&h.rig, "0000:3b:00.2", "team-c", "infer-0");
        sleep(RESYNC).await;
        settle().await;
        let st = h.status();
        assert_eq!(h.vfs_on(PF0), 4);
        assert_eq!(st.held_vfs[0].pods, ["team-c/infer-0"]);
        // Released: the next resync removes the VFs.
        std::fs::remove_dir_all(h.rig.sources().cni_state_dir.join("vf")).unwrap();
        h.until("ens1f0 at 2 VFs", Harness::in_sync).await;
        assert_eq!(h.vfs_on(PF0), 2);
        assert!(h.status().held_vfs.is_empty());
        assert!(h.pod_resources.calls.load(Ordering::SeqCst) >= 4);
        h.stop().await.unwrap();
    });
}

/// A status without what changes with every write (its time, transition
/// times), to compare reports by content.
fn content(c: &Call) -> RdmaNodeStateStatus {
    let mut s: RdmaNodeStateStatus = serde_json::from_value(c.body["status"].clone()).unwrap();
    s.last_sync_time = None;
    for c in &mut s.conditions {
        c.last_transition_time = None;
    }
    s
}

/// Issue 11: with nothing changing on the host or in the spec, resyncs
/// write nothing. The old loop wrote twice per resync: its condition
/// message carried the interval since the last pass ("within limits over
/// 10s"), and its own write woke a second pass ("over 0s").
#[test]
fn steady_state_resyncs_write_no_status() {
    scenario(|| async {
        let h = Harness::checked_and_reported().await;
        let (passes, patches) = (h.passes(), h.status_patches().len());
        // Counters move, within limits (10 frames in 10 s).
        for _ in 0..6 {
            h.ethtool.rx_prio3_pause.fetch_add(10, Ordering::SeqCst);
            sleep(RESYNC).await;
        }
        let extra = &h.status_patches()[patches..];
        assert!(
            extra.is_empty(),
            "{} status writes in 6 quiet resyncs: {:#?}",
            extra.len(),
            extra
                .iter()
                .map(|c| c.body["status"]["conditions"].clone())
                .collect::<Vec<_>>()
        );
        assert_eq!(h.passes(), passes + 6, "one pass per resync");
        let st = h.status();
        assert!(find(&st.conditions, "NriReachable").is_some(), "{st:#?}");
        let c = find(&st.conditions, "RdmaFabricCongestion").expect("RdmaFabricCongestion");
        assert!(!c.is_true());
        assert_eq!(
            c.message,
            "pause frames (limit 100/s) and discards (limit 10/s) within limits"
        );
        h.stop().await.unwrap();
    });
}

/// Issue 11: only spec changes (a new `metadata.generation`) wake the loop;
/// status updates, its own or another writer's, do not.
#[test]
fn status_only_updates_do_not_wake_the_loop_and_spec_changes_do() {
    scenario(|| async {
        let mut h = Harness::start(NEVER, seed_state);
        h.until_reported().await;
        sleep(NEVER / 4).await;
        // Its own report woke nothing (the old loop ran a second pass).
        assert_eq!(h.passes(), 1);
        // Another writer (the controller) updates the status.
        assert!(h.server.update(KROCE, STATES, "", NODE, |o| {
            o["status"]["admissionPhase"] = "Admitted".into();
        }));
        assert_eq!(
            h.object(NODE).unwrap()["metadata"]["generation"],
            1,
            "a status update leaves the generation"
        );
        sleep(NEVER / 4).await;
        assert_eq!(h.passes(), 1, "a status update woke the loop");
        assert_eq!(h.status_patches().len(), 1);
        // A label (metadata) change is not a spec change either.
        h.server.update(KROCE, STATES, "", NODE, |o| {
            o["metadata"]["labels"] = json!({"team": "a"});
        });
        sleep(NEVER / 4).await;
        assert_eq!(h.passes(), 1, "a label change woke the loop");
        // The spec changes: one pass, one report.
        h.set_pf0_vfs(2);
        h.until_generation(2).await;
        sleep(NEVER / 4).await;
        assert_eq!(h.passes(), 2);
        assert_eq!(h.status_patches().len(), 2);
        assert_eq!(h.vfs_on(PF0), 2);
        h.stop().await.unwrap();
    });
}

/// Issue 11: a changed fact (a VF's netdev leaves the host namespace) is
/// reported with exactly one write, and the loop is quiet again after it.
#[test]
fn a_changed_fact_is_reported_with_one_write() {
    scenario(|| async {
        let h = Harness::checked_and_reported().await;
        let patches = h.status_patches().len();
        let before = h.status();
        let vf = before.pfs[1].vfs[3].netdev.clone().expect("VF netdev");
        h.rig
            .kernel
            .host
            .lock()
            .unwrap()
            .remove_netdev(&vf)
            .unwrap();
        sleep(RESYNC * 5).await;
        let extra = &h.status_patches()[patches..];
        assert_eq!(extra.len(), 1, "{extra:#?}");
        let now = content(&extra[0]);
        assert_ne!(
            now.pfs[1].vfs[3], before.pfs[1].vfs[3],
            "{:#?}",
            now.pfs[1].vfs[3]
        );
        assert_eq!(now.pfs[0], before.pfs[0], "ens1f0 unchanged");
        h.stop().await.unwrap();
    });
}

/// An unchanged report is written again only when the heartbeat is due,
/// with a new `lastSyncTime` and nothing else new.
#[test]
fn an_unchanged_report_is_rewritten_at_the_heartbeat_only() {
    scenario(|| async {
        let heartbeat = RESYNC * 6;
        let mut h = Harness::start_with(
            Setup {
                heartbeat,
                ..Setup::PLAIN
            },
            seed_state,
        );
        h.until_reported().await;
        let first = h.status_patches()[0].clone();
        sleep(heartbeat - RESYNC / 2).await;
        assert_eq!(h.status_patches().len(), 1, "before the heartbeat");
        sleep(RESYNC).await;
        let patches = h.status_patches();
        assert_eq!(patches.len(), 2, "the heartbeat");
        assert_eq!(content(&patches[1]), content(&first));
        assert_ne!(
            patches[1].body["status"]["lastSyncTime"],
            first.body["status"]["lastSyncTime"]
        );
        assert_eq!(
            patches[1].body["status"]["conditions"], first.body["status"]["conditions"],
            "transition times kept"
        );
        sleep(heartbeat - RESYNC).await;
        assert_eq!(h.status_patches().len(), 2);
        sleep(RESYNC).await;
        assert_eq!(h.status_patches().len(), 3);
        h.stop().await.unwrap();
    });
}

/// Log lines, for the warn-level checks.
#[derive(Clone, Default)]
struct LogBuf(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for LogBuf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl LogBuf {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// Issue 24: while a new spec is being applied (VFs take their time), the
/// status says InProgress for the new generation, not Succeeded for the
/// previous one; a failed pass is logged at warn with the PF and the reason.
/// Wall time: the pass really blocks its thread, as a driver does.
#[test]
fn a_slow_pass_reports_in_progress_for_its_generation_and_failures_are_logged() {
    let logs = LogBuf::default();
    let w = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || w.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut h = Harness::start_with(
            Setup {
                resync: NEVER,
                slow_writes: true,
                ..Setup::PLAIN
            },
            seed_state,
        );
        h.until("first apply", Harness::in_sync).await;
        let first: Vec<RdmaNodeStateStatus> = h
            .status_patches()
            .iter()
            .map(|c| serde_json::from_value(c.body["status"].clone()).unwrap())
            .collect();
        let states: Vec<(SyncState, Option<i64>)> = first
            .iter()
            .map(|s| (s.sync_state, s.observed_generation))
            .collect();
        assert_eq!(
            states,
            [
                (SyncState::InProgress, Some(1)),
                (SyncState::Succeeded, Some(1))
            ]
        );

        // Generation 2 asks for 2 VFs; the driver refuses (ENOSPC), slowly.
        h.rig
            .kernel
            .fail
            .lock()
            .unwrap()
            .push((pci(PF0), libc::ENOSPC));
        let patches = h.status_patches().len();
        assert!(h.set_pf0_vfs(2));
        h.until("generation 2 in progress", |h| {
            h.stored_status().is_some_and(|s| {
                s.observed_generation == Some(2) && s.sync_state == SyncState::InProgress
            })
        })
        .await;
        assert_eq!(h.status_patches().len(), patches + 1);
        h.until("generation 2 failed", |h| {
            h.stored_status()
                .is_some_and(|s| s.sync_state == SyncState::Failed)
        })
        .await;
        let text = logs.text();
        let warn = text
            .lines()
            .find(|l| l.contains("WARN") && l.contains("VfResourcesExhausted"))
            .unwrap_or_else(|| panic!("no warn line for the failed pass in:\n{text}"));
        assert!(
            warn.contains("0000:3b:00.0") && warn.contains("ens1f0") && warn.contains("MSI-X"),
            "{warn}"
        );
        h.stop().await.unwrap();
    });
}

/// Issue 25: while VF IRQs wait for their device to open, the loop passes
/// again after `irq_recheck` (doubling while nothing changes), and pins
/// them at the first pass after they appear; then it is quiet again.
#[test]
fn pending_irqs_are_rechecked_and_pinned_once_they_appear() {
    scenario(|| async {
        let mut h = Harness::start(NEVER, seed_state);
        h.until("first apply", Harness::in_sync).await;
        settle().await;
        // ens2f0's VFs go down: their IRQs are not requested any more.
        let host = h.rig.host();
        let vf_irqs: Vec<u32> = irq_affinities(&host, PF1, &h.rig.path)
            .into_iter()
            .filter(|(dev, _, _)| dev != PF1)
            .map(|(_, irq, _)| irq)
            .collect();
        let saved = h.rig.path.join("saved-irqs");
        std::fs::create_dir_all(&saved).unwrap();
        for irq in &vf_irqs {
            std::fs::rename(
                h.rig.path.join(format!("proc/irq/{irq}")),
                saved.join(irq.to_string()),
            )
            .unwrap();
        }
        // A spec change makes a pass, which finds them pending.
        assert!(h.set_pf0_vfs(2));
        h.until("IRQs pending reported", |h| {
            h.stored_status()
                .is_some_and(|s| find(&s.conditions, "IrqsPending").is_some_and(|c| c.is_true()))
        })
        .await;
        let passes = h.passes();
        // Rechecks after 3 s and 6 s more (no resync for an hour).
        sleep(IRQ_RECHECK + STEP * 10).await;
        assert_eq!(h.passes(), passes + 1);
        sleep(IRQ_RECHECK * 2).await;
        assert_eq!(h.passes(), passes + 2);
        // The netdevs open: the kernel adds the IRQs, the next recheck pins them.
        for irq in &vf_irqs {
            let d = h.rig.path.join(format!("proc/irq/{irq}"));
            std::fs::rename(saved.join(irq.to_string()), &d).unwrap();
            std::fs::write(d.join("smp_affinity_list"), "0-31\n").unwrap();
        }
        h.until("IRQs pinned", |h| {
            h.stored_status()
                .is_some_and(|s| find(&s.conditions, "IrqsPending").is_some_and(|c| !c.is_true()))
        })
        .await;
        for (dev, irq, cpus) in irq_affinities(&h.rig.host(), PF1, &h.rig.path) {
            let list: Vec<u32> = cpus.cpus().collect();
            assert!(
                list.len() == 1 && (18..=31).contains(&list[0]),
                "IRQ {irq} of {dev}: {cpus}"
            );
        }
        let passes = h.passes();
        sleep(IRQ_RECHECK * 20).await;
        assert_eq!(h.passes(), passes, "nothing pending: no more rechecks");
        h.stop().await.unwrap();
    });
}

/// Issue 22: the controller's reboot request (an annotation on the node
/// state, naming the boot to leave) reaches the host through the loop: the
/// host is asked once, not again on later passes nor after it came back in
/// a new boot with the request still there; the report says so.
#[test]
fn a_reboot_request_is_acted_on_once_per_boot_and_only_with_the_flag() {
    use crate::netns_mode::{PENDING_CONDITION, REBOOT_REQUIRED};
    use crate::reboot::REBOOT_REQUEST_ANNOTATION;
    use crate::reboot::fake::FakeReboot;
    use kroce_operator::crd::{NetnsModeRequest, RdmaNetnsModeSetting};
    let ask_exclusive = |h: &Harness| {
        // The host is shared and a pod's netns exists: exclusive can only
        // come with a reboot.
        h.rig.netns_mode.state().other_netns = 1;
        let modes = vec![NetnsModeRequest {
            network: "fast".into(),
            mode: RdmaNetnsModeSetting::Exclusive,
        }];
        assert!(h.server.update(KROCE, STATES, "", NODE, |o| {
            o["spec"]["rdmaNetnsModes"] = serde_json::to_value(&modes).unwrap();
            o["metadata"]["annotations"] = json!({REBOOT_REQUEST_ANNOTATION: "boot-1"});
        }));
    };
    let pending = |h: &Harness| {
        h.stored_status()
            .and_then(|s| find(&s.conditions, PENDING_CONDITION).cloned())
            .filter(|c| c.is_true() && c.reason == REBOOT_REQUIRED)
    };
    scenario(move || async move {
        let host = Arc::new(FakeReboot::new("boot-1"));
        let mut h = Harness::start_with(
            Setup {
                reboot: Some(host.clone()),
                ..Setup::PLAIN
            },
            seed_state,
        );
        h.until_reported().await;
        assert!(host.state().reboots.is_empty(), "nothing asked yet");
        ask_exclusive(&h);
        h.until("the host asked to reboot", |_| {
            !host.state().reboots.is_empty()
        })
        .await;
        h.until("the ask reported", |h| {
            pending(h).is_some_and(|c| c.message.contains("reboot asked of the host (boot boot-1)"))
        })
        .await;
        // Later passes in the same boot: not asked again.
        sleep(RESYNC * 3).await;
        assert_eq!(host.state().reboots, ["boot-1"]);
        // Back in a new boot, the mode still pending, the request still
        // naming the old boot: never again.
        host.boot("boot-2");
        sleep(RESYNC * 3).await;
        assert_eq!(host.state().reboots, ["boot-1"]);
        h.stop().await.unwrap();
    });
    // Without --allow-host-reboot: refused, and the report says why.
    scenario(move || async move {
        let mut h = Harness::start(RESYNC, seed_state);
        h.until_reported().await;
        ask_exclusive(&h);
        h.until("the refusal reported", |h| {
            pending(h).is_some_and(|c| c.message.contains("--allow-host-reboot"))
        })
        .await;
        h.stop().await.unwrap();
    });
}
