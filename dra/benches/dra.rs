//! ResourceSlice publication for 8 PFs x 64 VFs (scan → devices → slices),
//! and the latency of NodePrepareResources + NodeUnprepareResources for one
//! VF claim over the unix socket, through the kubelet stand-in.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use criterion::{Criterion, criterion_group, criterion_main};
use kroce_dra::claims::ClaimRef;
use kroce_dra::driver::DRIVER_NAME;
use kroce_dra::facts::HostFacts;
use kroce_dra::plugin::{Options, Plugin};
use kroce_dra::prepare::Paths;
use kroce_dra::slice::{self, Pool};
use kroce_dra::testing::{
    InMemoryClaims, KubeletDraStandIn, RecordingPublisher, allocated_claim, many_at, scratch_dir,
};
use kroce_inventory::inventory::Memory;
use sriov_helpers::fixture::FixtureHost;
use std::collections::BTreeSet;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

fn slices(c: &mut Criterion) {
    let dir = scratch_dir("kroce-dra-bench-").expect("scratch dir");
    let fx = many_at(dir.path(), 8, 64).expect("fixture host");
    let root = fx.root();
    let mut g = c.benchmark_group("resource_slices_8pf_x_64vf");
    g.sample_size(10);
    // The whole publication path of one rescan: host read included.
    g.bench_function("scan_and_build", |b| {
        b.iter(|| {
            let mut mem = Memory::default();
            let facts = HostFacts::scan(&root, &mut mem);
            let devs: Vec<_> = slice::devices(&facts, &BTreeSet::new())
                .into_iter()
                .map(|p| p.device)
                .collect();
            let mut pool = Pool::new("node-a");
            black_box(pool.update(devs))
        })
    });
    // The pure part alone: facts → slices.
    let facts = HostFacts::scan(&root, &mut Memory::default());
    g.bench_function("build_only", |b| {
        b.iter(|| {
            let devs: Vec<_> = slice::devices(&facts, &BTreeSet::new())
                .into_iter()
                .map(|p| p.device)
                .collect();
            black_box(slice::slices("node-a", 1, &devs))
        })
    });
    g.finish();
}

fn prepare(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = scratch_dir("kroce-dra-bench-").expect("scratch dir");
    let root = dir.path().to_path_buf();
    let mut fx = FixtureHost::at(&root.join("host")).expect("fixture");
    fx.populate_connectx6dx_pair().expect("fixture host");
    let opts = Options {
        node: "node-a".into(),
        kubelet_dir: root.join("kubelet"),
        host_root: fx.root(),
        paths: Paths {
            cdi_dir: root.join("cdi"),
            devinfo_dir: root.join("devinfo"),
            memlock_dir: Some(root.join("memlock")),
            network_dir: None,
            dev_infiniband: None,
        },
        state_dir: root.join("state"),
        rescan: Duration::from_secs(60),
    };
    let claims = Arc::new(InMemoryClaims::default());
    let claim = ClaimRef {
        namespace: "default".into(),
        name: "bench".into(),
        uid: "6c1d3e0a-0000-4000-8000-0000000000be".into(),
    };
    claims.insert(allocated_claim(
        &claim,
        DRIVER_NAME,
        "node-a",
        &[("vf", "vf-0000-3b-00-2")],
        &[],
    ));
    let (kubelet, plugin) = rt.block_on(async {
        let kubelet = KubeletDraStandIn::start(&opts.kubelet_dir).expect("stand-in");
        let plugin = Plugin::start(
            opts.clone(),
            claims.clone(),
            Arc::new(RecordingPublisher::default()),
        )
        .await
        .expect("plugin");
        kubelet
            .wait_registered(DRIVER_NAME, 1)
            .await
            .expect("registered");
        (kubelet, plugin)
    });
    let mut g = c.benchmark_group("one_vf_claim");
    // Prepare alone: the unprepare that makes the next prepare real is
    // outside the measured time.
    g.bench_function("prepare", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                total += rt.block_on(async {
                    let t = std::time::Instant::now();
                    let p = kubelet
                        .prepare(DRIVER_NAME, std::slice::from_ref(&claim))
                        .await
                        .unwrap();
                    let took = t.elapsed();
                    assert_eq!(p.claims[&claim.uid].error, "");
                    kubelet
                        .unprepare(DRIVER_NAME, std::slice::from_ref(&claim))
                        .await
                        .unwrap();
                    took
                });
            }
            total
        })
    });
    g.bench_function("prepare_then_unprepare", |b| {
        b.iter(|| {
            rt.block_on(async {
                let p = kubelet
                    .prepare(DRIVER_NAME, std::slice::from_ref(&claim))
                    .await
                    .unwrap();
                assert_eq!(p.claims[&claim.uid].error, "");
                let u = kubelet
                    .unprepare(DRIVER_NAME, std::slice::from_ref(&claim))
                    .await
                    .unwrap();
                black_box(u)
            })
        })
    });
    g.finish();
    rt.block_on(plugin.stop());
}

criterion_group!(benches, slices, prepare);
criterion_main!(benches);
