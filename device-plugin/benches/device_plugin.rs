//! Discovery + pool selection on a large fixture (8 PFs x 64 VFs), the cheap
//! probe the rescan tick runs, and Allocate: the pure decision and the full
//! gRPC round trip over a unix socket (device-info files included).

use criterion::{Criterion, criterion_group, criterion_main};
use kroce_device_plugin::allocation;
use kroce_device_plugin::api;
use kroce_device_plugin::config::{Format, parse};
use kroce_device_plugin::host_view::HostView;
use kroce_device_plugin::inventory::{Memory, candidates};
use kroce_device_plugin::plugin::{self, Options};
use kroce_device_plugin::snapshot::Snapshot;
use kroce_device_plugin::testing::{KubeletStandIn, scratch_dir};
use sriov_helpers::fixture::FixtureHost;
use std::time::Duration;

const CONFIG: &str = "pools:
- resourceName: numa0
  selectors: {devices: [\"101e\"], numaNodes: [0], pfNames: [\"ens1f0#0-31\", \"ens3f0\", \"ens5f0\", \"ens7f0\"]}
- resourceName: vf
  memlock: unlimited
  selectors: {vendors: [\"15b3\"], devices: [\"101e\"], isRdma: true}
- resourceName: hca
  mode: shared
  sharedCount: 16
  selectors: {devices: [\"101d\"]}
";

fn fail(what: &str, e: impl std::fmt::Display) -> ! {
    panic!("{what}: {e}")
}

fn discovery(c: &mut Criterion) {
    let host = FixtureHost::many(8, 64).unwrap_or_else(|e| fail("fixture", e));
    let root = host.root();
    let cfg = parse(CONFIG, Format::Yaml).unwrap_or_else(|e| fail("config", e));
    let view = HostView::scan(&root);
    let snap = Snapshot::build(&cfg, candidates(&view, &mut Memory::default()), &|_, _| {
        false
    });
    let total: usize = snap.pools.iter().map(|p| p.devices.len()).sum();
    assert_eq!(total, 512 + 8 * 16, "{:?}", view.host.errors);
    c.bench_function("scan + select 8 PFs x 64 VFs", |b| {
        let mut mem = Memory::default();
        b.iter(|| {
            let view = HostView::scan(&root);
            Snapshot::build(&cfg, candidates(&view, &mut mem), &|_, _| false)
        })
    });
    c.bench_function("probe (the 1 s health tick) 8 PFs x 64 VFs", |b| {
        b.iter(|| kroce_device_plugin::host_view::probe(&root, &[]))
    });
    c.bench_function("select only (pre-scanned) 8 PFs x 64 VFs", |b| {
        let mut mem = Memory::default();
        b.iter(|| Snapshot::build(&cfg, candidates(&view, &mut mem), &|_, _| false))
    });
    let pool = &snap.pools[1];
    let ids: Vec<String> = pool.devices.keys().take(2).cloned().collect();
    c.bench_function("allocate 2 VFs (pure)", |b| {
        b.iter(|| allocation::allocate(pool, &ids, false))
    });
}

fn grpc_allocate(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| fail("runtime", e));
    let host = FixtureHost::many(8, 64).unwrap_or_else(|e| fail("fixture", e));
    // tmpfs, like /var/run on a node, where the device-info files go.
    let work = scratch_dir("kroce-bench-").unwrap_or_else(|e| fail("tempdir", e));
    let kubelet_dir = work.path().join("kubelet");
    std::fs::create_dir_all(&kubelet_dir).unwrap_or_else(|e| fail("mkdir", e));
    let config = work.path().join("config.yaml");
    std::fs::write(&config, CONFIG).unwrap_or_else(|e| fail("config", e));
    let mut opts = Options::new(host.root(), config);
    opts.kubelet_dir = kubelet_dir.clone();
    opts.devinfo_dir = work.path().join("devinfo");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (kubelet, plugin, mut client, ids) = rt.block_on(async {
        let kubelet = KubeletStandIn::start(&kubelet_dir)
            .await
            .unwrap_or_else(|e| fail("stand-in", e));
        let plugin = tokio::spawn(plugin::run(opts, async move {
            let _ = stopped.await;
        }));
        let devices = kubelet
            .wait_devices("rdma/vf", Duration::from_secs(10), "VFs", |d| {
                d.len() == 288
            })
            .await
            .unwrap_or_else(|e| fail("devices", e));
        let client = kubelet
            .client("rdma/vf")
            .unwrap_or_else(|| fail("client", "none"));
        let ids: Vec<String> = devices.iter().take(2).map(|d| d.id.clone()).collect();
        (kubelet, plugin, client, ids)
    });
    c.bench_function("Allocate 2 VFs over gRPC (incl. device-info files)", |b| {
        b.iter(|| {
            rt.block_on(client.allocate(api::AllocateRequest {
                container_requests: vec![api::ContainerAllocateRequest {
                    devices_ids: ids.clone(),
                }],
            }))
            .unwrap_or_else(|e| fail("allocate", e))
        })
    });
    rt.block_on(async {
        let _ = stop.send(());
        let _ = plugin.await;
        kubelet.stop().await;
    });
}

criterion_group!(benches, discovery, grpc_allocate);
criterion_main!(benches);
