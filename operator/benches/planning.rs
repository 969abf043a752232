//! Reconcile planning for 1,000 nodes x 4 networks, as plain functions:
//! merge + conflict checks + VF ranges + device plugin YAML per node; the
//! DeviceClass of a `frontend: dra` network over 1,000 and 5,000 nodes. Also
//! prints allocations and peak heap of one planning pass (counting
//! allocator) and the process's peak RSS.

use criterion::{Criterion, criterion_group, criterion_main};
use kroce_operator::crd::{ObservedPf, RdmaNetworkSpec};
use kroce_operator::plan::{NetworkInput, NodeInput, plan_cluster};
use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Counts allocations and live bytes on top of the system allocator.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static COUNT: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded unchanged to `System`, which upholds the
// GlobalAlloc contract; the counters are plain atomics with no aliasing.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK.fetch_max(live, Ordering::Relaxed);
        COUNT.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same layout the caller gave us.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn pf(addr: &str, ifname: &str, numa: u32) -> ObservedPf {
    ObservedPf {
        pci_address: addr.into(),
        if_name: Some(ifname.into()),
        vendor: "15b3".into(),
        device_id: "101d".into(),
        total_vfs: 127,
        numa_node: Some(numa),
        ..Default::default()
    }
}

fn nodes(n: usize) -> Vec<NodeInput> {
    (0..n)
        .map(|i| NodeInput {
            name: format!("node-{i:04}"),
            labels: BTreeMap::from([
                ("kroce.io/rdma".to_string(), "true".to_string()),
                (
                    "zone".to_string(),
                    if i % 2 == 0 { "a" } else { "b" }.to_string(),
                ),
            ]),
            inventory: Some(vec![
                pf("0000:3b:00.0", "ens1f0", 0),
                pf("0000:86:00.0", "ens2f0", 1),
            ]),
        })
        .collect()
}

fn network(name: &str, spec: serde_json::Value) -> NetworkInput {
    let spec: RdmaNetworkSpec =
        serde_json::from_value(spec).unwrap_or_else(|e| panic!("{name}: {e}"));
    NetworkInput {
        name: name.into(),
        spec,
    }
}

fn networks() -> Vec<NetworkInput> {
    vec![
        network(
            "train-a",
            serde_json::json!({"nodeSelector": {"kroce.io/rdma": "true"},
            "nicSelector": {"pfNames": ["ens1f0#0-3"]}, "numVfs": 8, "mtu": 9000,
            "networkNamespaces": ["ml"], "qos": {"roceTos": 106}}),
        ),
        network(
            "train-b",
            serde_json::json!({"nodeSelector": {"kroce.io/rdma": "true"},
            "nicSelector": {"pfNames": ["ens1f0#4-7"]}, "numVfs": 8, "mtu": 9000,
            "networkNamespaces": ["ml"], "qos": {"roceTos": 106}}),
        ),
        network(
            "storage",
            serde_json::json!({"nodeSelector": {"zone": "a"},
            "nicSelector": {"vendor": "15b3", "pfNames": ["ens2f0#0-7"]}, "numVfs": 16,
            "networkNamespaces": ["storage"], "irqAffinity": {"reservedCpus": "16-17"}}),
        ),
        network(
            "infer",
            serde_json::json!({"nodeSelector": {"kroce.io/rdma": "true"},
            "nicSelector": {"pfNames": ["ens2f0#8-15"]}, "numVfs": 16, "memlock": "unlimited",
            "irqAffinity": {"reservedCpus": "16-17"}}),
        ),
    ]
}

/// One controller pass: plan and render every node's device plugin config.
fn pass(nodes: &[NodeInput], nets: &[NetworkInput]) -> usize {
    let plan = plan_cluster(nodes, nets);
    let mut bytes = 0;
    for n in &plan.nodes {
        if let Some(cfg) = &n.device_plugin {
            bytes += cfg.to_yaml().map(|y| y.len()).unwrap_or(0);
        }
    }
    assert!(plan.nodes.iter().all(|n| n.conflicts.is_empty()));
    bytes
}

fn peak_rss_kib() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    s.lines()
        .find(|l| l.starts_with("VmHWM:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn bench(c: &mut Criterion) {
    let nodes = nodes(1000);
    let nets = networks();
    // Memory of one pass, measured before criterion's own allocations.
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let count0 = COUNT.load(Ordering::Relaxed);
    let yaml = pass(&nodes, &nets);
    let peak = PEAK.load(Ordering::Relaxed) - base;
    let count = COUNT.load(Ordering::Relaxed) - count0;
    println!(
        "planning 1000 nodes x 4 networks: {count} allocations, peak heap {:.1} MiB above inputs, {yaml} bytes of device plugin YAML; process peak RSS {} KiB",
        peak as f64 / (1024.0 * 1024.0),
        peak_rss_kib().unwrap_or(0)
    );
    c.bench_function("plan_cluster 1000 nodes x 4 networks", |b| {
        b.iter(|| black_box(plan_cluster(black_box(&nodes), black_box(&nets))))
    });
    c.bench_function("plan + device plugin YAML, 1000 nodes x 4 networks", |b| {
        b.iter(|| black_box(pass(black_box(&nodes), black_box(&nets))))
    });
}

/// What a `frontend: dra` network's reconcile computes for its DeviceClass
/// on top of the plan: its VFs over every node's spec, the foreign-VF check
/// and the class itself.
fn device_class_pass(
    specs: &[&kroce_operator::crd::RdmaNodeStateSpec],
    net: &NetworkInput,
) -> usize {
    use kroce_operator::plan::device_class::{device_class, foreign_vfs, network_devices};
    let devices = network_devices(&net.name, specs.iter().copied());
    assert!(foreign_vfs(&net.name, &devices, specs.iter().copied(), |_| false).is_empty());
    let dc = device_class(&net.name, &net.spec, &devices).unwrap_or_else(|e| panic!("{e}"));
    dc.spec.and_then(|s| s.selectors).map_or(0, |s| s.len())
}

fn bench_device_class(c: &mut Criterion) {
    use kroce_operator::crd::Frontend;
    use kroce_operator::plan::merge::Desired;
    for n in [1000, 5000] {
        let nodes = nodes(n);
        let mut nets = networks();
        for net in nets.iter_mut().filter(|x| x.name == "infer") {
            net.spec.frontend = Frontend::Dra;
        }
        let plan = plan_cluster(&nodes, &nets);
        let specs: Vec<_> = plan
            .nodes
            .iter()
            .filter_map(|p| match &p.desired {
                Desired::Spec(s) => Some(s),
                _ => None,
            })
            .collect();
        let infer = nets
            .iter()
            .find(|x| x.name == "infer")
            .unwrap_or_else(|| panic!("no infer network"));
        c.bench_function(&format!("DeviceClass of one dra network, {n} nodes"), |b| {
            b.iter(|| black_box(device_class_pass(black_box(&specs), black_box(infer))))
        });
    }
}

criterion_group!(benches, bench, bench_device_class);
criterion_main!(benches);
