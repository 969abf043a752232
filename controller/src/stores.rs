//! Edge: one watch per kind, its reflector store shared by every loop (the
//! network controller, the node controller, the drain). Reconciles read
//! these stores; they never LIST.

use futures::{FutureExt, Stream, StreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use k8s_openapi::api::resource::v1::DeviceClass;
use kroce_operator::crd::{RdmaNetwork, RdmaNodeState};
use kroce_operator::names::NETWORK_LABEL;
use kroce_operator::plan::nad::NetworkAttachmentDefinition;
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::{self, ReflectHandle, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex};

/// Events a slow subscriber may fall behind before the watch waits for it.
const SUBSCRIBE_BUFFER: usize = 1024;

/// Readers of the shared stores.
#[derive(Clone)]
pub struct Stores {
    pub nodes: Store<Node>,
    pub networks: Store<RdmaNetwork>,
    pub states: Store<RdmaNodeState>,
    /// Only the device plugin ConfigMap (a field selector on its name).
    pub configmaps: Store<ConfigMap>,
    /// Only admission perftest pods, in the test namespace.
    pub test_pods: Store<Pod>,
    /// Only kroce's attachment definitions (labelled with their network).
    /// Never ready where the kind is not served (no Multus): readers then
    /// ask the API, which says so.
    pub nads: Store<NetworkAttachmentDefinition>,
    /// Only kroce's DeviceClasses (labelled with their network). Never
    /// ready where resource.k8s.io/v1 is not served (before 1.34).
    pub device_classes: Store<DeviceClass>,
    /// Kinds whose watch has failed at least once (see [`Stores::ready`]).
    failed: Arc<Mutex<BTreeSet<String>>>,
}

impl std::fmt::Debug for Stores {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stores")
            .field("nodes", &self.nodes.len())
            .field("networks", &self.networks.len())
            .field("states", &self.states.len())
            .finish()
    }
}

impl Stores {
    /// Until every store has had its first full list: a reconcile before
    /// that would plan from part of the cluster (and write again as the
    /// rest arrives). A kind whose watch fails (not served, or RBAC
    /// missing) does not hold reconciles back for ever: they go on with
    /// what that store has while its watch retries (the warning names it).
    pub async fn ready(&self) -> Result<(), StoreError> {
        loop {
            let mut pending = false;
            for (kind, ready) in [
                ("RdmaNetwork", Self::ready_now(&self.networks)),
                ("Node", Self::ready_now(&self.nodes)),
                ("RdmaNodeState", Self::ready_now(&self.states)),
                ("ConfigMap", Self::ready_now(&self.configmaps)),
                ("Pod", Self::ready_now(&self.test_pods)),
                ("NetworkAttachmentDefinition", Self::ready_now(&self.nads)),
                ("DeviceClass", Self::ready_now(&self.device_classes)),
            ] {
                match ready {
                    Some(Ok(())) => {}
                    Some(Err(_)) => return Err(StoreError { what: "watch" }),
                    None => {
                        let failed = self.failed.lock().map(|f| f.contains(kind)).unwrap_or(true);
                        pending |= !failed;
                    }
                }
            }
            if !pending {
                return Ok(());
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }

    fn ready_now<K>(
        store: &Store<K>,
    ) -> Option<Result<(), kube::runtime::reflector::store::WriterDropped>>
    where
        K: Resource + Clone + 'static,
        K::DynamicType: Eq + Hash + Clone,
    {
        store.wait_until_ready().now_or_never()
    }

    /// Every RdmaNodeState, by name (= node name). Shared with the store,
    /// not copied: at thousands of nodes a copy per pass was most of the
    /// controller's peak memory.
    pub fn states_by_name(&self) -> BTreeMap<String, Arc<RdmaNodeState>> {
        self.states
            .state()
            .into_iter()
            .map(|s| (s.name_any(), s))
            .collect()
    }

    pub fn state(&self, node: &str) -> Option<Arc<RdmaNodeState>> {
        self.states
            .get(&reflector::ObjectRef::<RdmaNodeState>::new(node))
    }

    pub fn node(&self, node: &str) -> Option<Arc<Node>> {
        self.nodes.get(&reflector::ObjectRef::<Node>::new(node))
    }

    pub fn nodes(&self) -> Vec<Arc<Node>> {
        self.nodes.state()
    }

    pub fn networks(&self) -> Vec<Arc<RdmaNetwork>> {
        self.networks.state()
    }

    /// The device plugin ConfigMap, if it exists.
    pub fn configmap(&self, namespace: &str, name: &str) -> Option<Arc<ConfigMap>> {
        self.configmaps
            .get(&reflector::ObjectRef::<ConfigMap>::new(name).within(namespace))
    }

    /// The attachment definitions of `network`, once the watch has listed
    /// them (None before, or where the kind is not served).
    pub fn nads_of(&self, network: &str) -> Option<Vec<Arc<NetworkAttachmentDefinition>>> {
        match Self::ready_now(&self.nads) {
            Some(Ok(())) => Some(
                self.nads
                    .state()
                    .into_iter()
                    .filter(|n| n.labels().get(NETWORK_LABEL).map(String::as_str) == Some(network))
                    .collect(),
            ),
            _ => None,
        }
    }

    /// The DeviceClass named `name` if it is kroce's, once the watch has
    /// listed (outer None before, or where the kind is not served). A
    /// class of that name that is not kroce's is not in the store.
    pub fn device_class(&self, name: &str) -> Option<Option<Arc<DeviceClass>>> {
        match Self::ready_now(&self.device_classes) {
            Some(Ok(())) => Some(
                self.device_classes
                    .get(&reflector::ObjectRef::<DeviceClass>::new(name)),
            ),
            _ => None,
        }
    }

    /// Test pods whose labels include every `key=value` of `selector`.
    pub fn test_pods(&self, selector: &str) -> Vec<Arc<Pod>> {
        let wanted: Vec<(&str, &str)> = selector
            .split(',')
            .filter_map(|t| t.split_once('='))
            .collect();
        self.test_pods
            .state()
            .into_iter()
            .filter(|p| {
                wanted
                    .iter()
                    .all(|(k, v)| p.labels().get(*k).map(String::as_str) == Some(*v))
            })
            .collect()
    }
}

/// The shared watches, started by [`start`]: their stores, a subscription
/// per consumer, and the future that drives them (poll it for as long as
/// the controllers run).
pub struct Shared {
    pub stores: Stores,
    pub nodes: ReflectHandle<Node>,
    /// Two consumers each: the network controller and the node controller.
    pub networks: [ReflectHandle<RdmaNetwork>; 2],
    pub states: [ReflectHandle<RdmaNodeState>; 2],
    pub test_pods: ReflectHandle<Pod>,
    pub driver: futures::future::BoxFuture<'static, ()>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("stores", &self.stores)
            .finish()
    }
}

fn drive<K>(
    api: Api<K>,
    config: watcher::Config,
    writer: Writer<K>,
    strip: fn(&mut K),
    failed: Arc<Mutex<BTreeSet<String>>>,
) -> impl std::future::Future<Output = ()> + Send
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Default,
{
    let kind = K::kind(&Default::default()).to_string();
    watcher(api, config)
        .default_backoff()
        .modify(strip)
        .reflect_shared(writer)
        .for_each(move |ev| {
            if let Err(e) = ev {
                // Once per kind: a kind that is not served (no Multus in a
                // DRA-only cluster) would otherwise warn every retry.
                let first = failed.lock().map(|mut f| f.insert(kind.clone())).unwrap_or(true);
                if first {
                    tracing::warn!(kind = %kind, error = %e, "watch failed; retrying with backoff (repeats are logged at debug)");
                } else {
                    tracing::debug!(kind = %kind, error = %e, "watch failed again; retrying");
                }
            }
            std::future::ready(())
        })
}

/// What the stores keep of a Node: name, uid and labels are all planning
/// reads (the kubelet's status, images and managed fields would make a
/// 5,000-node store hundreds of MiB). Of the status only the boot id stays:
/// the reboot for the RDMA netns mode tells a reboot happened by it.
fn strip_node(n: &mut Node) {
    let boot_id = n
        .status
        .take()
        .and_then(|s| s.node_info)
        .map(|i| i.boot_id)
        .filter(|b| !b.is_empty());
    n.status = boot_id.map(|boot_id| k8s_openapi::api::core::v1::NodeStatus {
        node_info: Some(k8s_openapi::api::core::v1::NodeSystemInfo {
            boot_id,
            ..Default::default()
        }),
        ..Default::default()
    });
    n.metadata.managed_fields = None;
    n.metadata.annotations = n.metadata.annotations.take().map(|mut a| {
        a.retain(|k, _| k.starts_with("kroce.io/"));
        a
    });
}

fn strip_managed<K: Resource>(k: &mut K) {
    k.meta_mut().managed_fields = None;
}

/// Starts one watch per kind. `namespace`/`configmap`: the device plugin
/// ConfigMap; `test_namespace`: where perftest pods run.
pub fn start(
    client: &Client,
    namespace: &str,
    configmap: &str,
    test_namespace: &str,
) -> Result<Shared, StoreError> {
    let (nodes, nodes_w) = reflector::store_shared::<Node>(SUBSCRIBE_BUFFER);
    let (networks, networks_w) = reflector::store_shared::<RdmaNetwork>(SUBSCRIBE_BUFFER);
    let (states, states_w) = reflector::store_shared::<RdmaNodeState>(SUBSCRIBE_BUFFER);
    let (configmaps, configmaps_w) = reflector::store_shared::<ConfigMap>(SUBSCRIBE_BUFFER);
    let (test_pods, pods_w) = reflector::store_shared::<Pod>(SUBSCRIBE_BUFFER);
    let (nads, nads_w) = reflector::store_shared::<NetworkAttachmentDefinition>(SUBSCRIBE_BUFFER);
    let (device_classes, classes_w) = reflector::store::<DeviceClass>();
    let sub = |what: &'static str| StoreError { what };
    let nodes_sub = nodes_w.subscribe().ok_or_else(|| sub("nodes"))?;
    let networks_sub = [
        networks_w.subscribe().ok_or_else(|| sub("rdmanetworks"))?,
        networks_w.subscribe().ok_or_else(|| sub("rdmanetworks"))?,
    ];
    let states_sub = [
        states_w.subscribe().ok_or_else(|| sub("rdmanodestates"))?,
        states_w.subscribe().ok_or_else(|| sub("rdmanodestates"))?,
    ];
    let pods_sub = pods_w.subscribe().ok_or_else(|| sub("pods"))?;
    let any = || watcher::Config::default().any_semantic();
    let failed: Arc<Mutex<BTreeSet<String>>> = Arc::default();
    let nads_driver = drive(
        Api::<NetworkAttachmentDefinition>::all(client.clone()),
        any().labels(NETWORK_LABEL),
        nads_w,
        strip_managed,
        failed.clone(),
    );
    let classes_driver = drive(
        Api::<DeviceClass>::all(client.clone()),
        any().labels(NETWORK_LABEL),
        classes_w,
        strip_managed,
        failed.clone(),
    );
    let driver = futures::future::join3(
        nads_driver,
        classes_driver,
        futures::future::join5(
            drive(
                Api::<Node>::all(client.clone()),
                any(),
                nodes_w,
                strip_node,
                failed.clone(),
            ),
            drive(
                Api::<RdmaNetwork>::all(client.clone()),
                any(),
                networks_w,
                strip_managed,
                failed.clone(),
            ),
            drive(
                Api::<RdmaNodeState>::all(client.clone()),
                any(),
                states_w,
                strip_managed,
                failed.clone(),
            ),
            drive(
                Api::<ConfigMap>::namespaced(client.clone(), namespace),
                any().fields(&format!("metadata.name={configmap}")),
                configmaps_w,
                strip_managed,
                failed.clone(),
            ),
            drive(
                Api::<Pod>::namespaced(client.clone(), test_namespace),
                any().labels(kroce_operator::names::ADMISSION_RUN_LABEL),
                pods_w,
                strip_managed,
                failed.clone(),
            ),
        ),
    )
    .map(|_| ())
    .boxed();
    Ok(Shared {
        stores: Stores {
            nodes,
            networks,
            states,
            configmaps,
            test_pods,
            nads,
            device_classes,
            failed,
        },
        nodes: nodes_sub,
        networks: networks_sub,
        states: states_sub,
        test_pods: pods_sub,
        driver,
    })
}

#[derive(Debug, thiserror::Error)]
#[error("the shared {what} watch is not available")]
pub struct StoreError {
    what: &'static str,
}

/// Passes an object on only when `fingerprint` of it differs from the last
/// one seen under its name: status-only churn (and our own writes of parts
/// a loop does not plan from) wakes nothing.
pub fn changed_only<K, S>(
    stream: S,
    fingerprint: fn(&K) -> u64,
) -> impl Stream<Item = Arc<K>> + Send + 'static
where
    K: Resource + Send + Sync + 'static,
    S: Stream<Item = Arc<K>> + Send + 'static,
{
    let seen: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
    stream.filter(move |obj| {
        let key = format!(
            "{}/{}",
            obj.meta().namespace.as_deref().unwrap_or(""),
            obj.meta().name.as_deref().unwrap_or("")
        );
        let fp = fingerprint(obj);
        let new = seen
            .lock()
            .map(|mut s| s.insert(key, fp) != Some(fp))
            .unwrap_or(true);
        std::future::ready(new)
    })
}

/// A stable hash of anything hashable (per process: fingerprints never
/// leave it).
pub fn hash_of(v: &impl Hash) -> u64 {
    let mut h = DefaultHasher::new();
    v.hash(&mut h);
    h.finish()
}

/// Stores filled from a list of objects, as the watches would fill them:
/// for tests and the benchmark.
#[cfg(any(test, feature = "testing"))]
pub fn from_objects(
    nodes: Vec<Node>,
    networks: Vec<RdmaNetwork>,
    states: Vec<RdmaNodeState>,
    configmaps: Vec<ConfigMap>,
    test_pods: Vec<Pod>,
    nads: Option<Vec<NetworkAttachmentDefinition>>,
    device_classes: Option<Vec<DeviceClass>>,
) -> Stores {
    // None: the kind is not served, as a watch that fails and never lists.
    let failed = [
        nads.is_none().then_some("NetworkAttachmentDefinition"),
        device_classes.is_none().then_some("DeviceClass"),
    ];
    fn never_listed<K>() -> Store<K>
    where
        K: Resource + Clone + 'static,
        K::DynamicType: Eq + Hash + Clone + Default,
    {
        let w = Writer::<K>::default();
        let r = w.as_reader();
        // A dropped writer reads as an ended watch; this one never lists.
        std::mem::forget(w);
        r
    }
    fn fill<K>(items: Vec<K>, strip: fn(&mut K)) -> Store<K>
    where
        K: Resource + Clone + 'static,
        K::DynamicType: Eq + Hash + Clone + Default,
    {
        let mut w = Writer::<K>::default();
        w.apply_watcher_event(&watcher::Event::Init);
        for mut i in items {
            strip(&mut i);
            w.apply_watcher_event(&watcher::Event::InitApply(i));
        }
        w.apply_watcher_event(&watcher::Event::InitDone);
        w.as_reader()
    }
    Stores {
        nodes: fill(nodes, strip_node),
        networks: fill(networks, strip_managed),
        states: fill(states, strip_managed),
        configmaps: fill(configmaps, strip_managed),
        test_pods: fill(test_pods, strip_managed),
        nads: match nads {
            Some(n) => fill(n, strip_managed),
            None => never_listed(),
        },
        device_classes: match device_classes {
            Some(d) => fill(d, strip_managed),
            None => never_listed(),
        },
        failed: Arc::new(Mutex::new(
            failed.into_iter().flatten().map(str::to_string).collect(),
        )),
    }
}
