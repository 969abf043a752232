//! 16 concurrent NodePrepareResources, one VF claim each, over the unix
//! socket through the kubelet stand-in: the burst a node sees when a gang
//! of RDMA pods lands on it at once. Time until the last of the 16 answers.
//!
//! The checkpoint and the prepared files go to a disk-backed temp dir
//! (`TMPDIR`, not tmpfs) so the fsyncs cost what they cost on a node; the
//! fixture host (sysfs) stays on tmpfs. `KROCE_BENCH_DIR` overrides where.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use criterion::{Criterion, criterion_group, criterion_main};
use futures::future::join_all;
use kroce_dra::claims::ClaimRef;
use kroce_dra::driver::DRIVER_NAME;
use kroce_dra::facts::HostFacts;
use kroce_dra::plugin::{Options, Plugin};
use kroce_dra::prepare::Paths;
use kroce_dra::slice;
use kroce_dra::testing::{
    InMemoryClaims, KubeletDraStandIn, RecordingPublisher, allocated_claim, scratch_dir,
};
use kroce_inventory::inventory::{DeviceKind, Memory};
use sriov_helpers::fixture::FixtureHost;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

const CLAIMS: usize = 16;

fn concurrent(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let host_dir = scratch_dir("kroce-dra-bench-").expect("scratch dir");
    let mut fx = FixtureHost::at(&host_dir.path().join("host")).expect("fixture");
    fx.populate_connectx6dx_pair().expect("fixture host");
    let disk = match std::env::var_os("KROCE_BENCH_DIR") {
        Some(d) => tempfile::Builder::new()
            .prefix("kroce-dra-bench-")
            .tempdir_in(d),
        None => tempfile::Builder::new()
            .prefix("kroce-dra-bench-")
            .tempdir(),
    }
    .expect("disk dir");
    let root = disk.path().to_path_buf();
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
    // 16 VFs of the host, one claim each.
    let facts = HostFacts::scan(&fx.root(), &mut Memory::default());
    let vfs: Vec<String> = slice::devices(&facts, &BTreeSet::new())
        .into_iter()
        .filter(|p| p.candidate.kind == DeviceKind::Vf && p.shared_slot.is_none())
        .map(|p| p.device.name)
        .take(CLAIMS)
        .collect();
    assert_eq!(vfs.len(), CLAIMS, "the fixture host has {CLAIMS} VFs");
    let store = Arc::new(InMemoryClaims::default());
    let claims: Vec<ClaimRef> = vfs
        .iter()
        .enumerate()
        .map(|(i, vf)| {
            let c = ClaimRef {
                namespace: "default".into(),
                name: format!("bench-{i}"),
                uid: format!("6c1d3e0a-0000-4000-8000-0000000001{i:02x}"),
            };
            store.insert(allocated_claim(
                &c,
                DRIVER_NAME,
                "node-a",
                &[("vf", vf)],
                &[],
            ));
            c
        })
        .collect();
    let (kubelet, plugin) = rt.block_on(async {
        let kubelet = KubeletDraStandIn::start(&opts.kubelet_dir).expect("stand-in");
        let plugin = Plugin::start(
            opts.clone(),
            store.clone(),
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
    let mut g = c.benchmark_group("sixteen_vf_claims");
    g.sample_size(20);
    // One NodePrepareResources per claim (the kubelet prepares each pod's
    // claims in its own call), all at once; the unprepare that makes the
    // next round real is outside the measured time.
    g.bench_function("prepare_concurrent", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                total += rt.block_on(async {
                    let t = Instant::now();
                    let answers = join_all(claims.iter().map(|c| kubelet.prepare_claim(c))).await;
                    let took = t.elapsed();
                    for (c, a) in claims.iter().zip(answers) {
                        assert_eq!(a.unwrap().claims[&c.uid].error, "");
                    }
                    for a in join_all(claims.iter().map(|c| kubelet.unprepare_claim(c))).await {
                        assert!(a.unwrap().claims.values().all(|r| r.error.is_empty()));
                    }
                    took
                });
            }
            total
        })
    });
    g.finish();
    rt.block_on(plugin.stop());
}

criterion_group!(benches, concurrent);
criterion_main!(benches);
