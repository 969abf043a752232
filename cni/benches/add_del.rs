#![allow(clippy::unwrap_used, clippy::expect_used)]
//! ADD+DEL latency of kroce-cni next to Debian's host-device (which also
//! moves a netdev into a netns), same veth, same host-local IPAM, same run.
//! Both binaries are executed like a runtime does, from the bed's host
//! netns. Needs root; prints the skip line otherwise.
//!
//! cargo bench -p kroce-cni --bench add_del -- --warm-up-time 1 --measurement-time 3

use criterion::{Criterion, criterion_group, criterion_main};
use kroce_cni::testing::testbed::run_in_netns;
use kroce_cni::testing::{TestBed, skip_without_netns};
use serde_json::json;
use std::path::Path;

fn add_del(c: &mut Criterion) {
    if skip_without_netns("bench add_del") {
        return;
    }
    let bed = TestBed::new(1).unwrap();
    let ours = Path::new(env!("CARGO_BIN_EXE_kroce-cni"));
    let host_device = Path::new("/usr/lib/cni/host-device");
    // Only what both plugins do: move, rename, host-local address, route.
    let kroce_cfg = serde_json::to_vec(&bed.config(json!({"rdma": false}))).unwrap();
    let hd_cfg = serde_json::to_vec(&json!({
        "cniVersion": "1.0.0", "name": bed.network, "type": "host-device", "device": "ens1f0v0",
        "ipam": bed.config(json!({}))["ipam"].clone()
    }))
    .unwrap();
    let cycle = |bin: &Path, cfg: &[u8], cid: &str| {
        for cmd in ["ADD", "DEL"] {
            let out = run_in_netns(&bed.host.path, bin, &bed.env(cmd, cid, "net1"), cfg).unwrap();
            assert_eq!(
                out.code,
                0,
                "{} {cmd}: {} {}",
                bin.display(),
                out.stdout,
                out.stderr
            );
        }
    };
    // Both must leave the host as they found it, or the numbers mean nothing.
    let before = bed.host.links().unwrap();
    cycle(ours, &kroce_cfg, "bench-kroce");
    cycle(host_device, &hd_cfg, "bench-hd");
    assert_eq!(bed.host.links().unwrap().len(), before.len());

    let mut g = c.benchmark_group("add_del_veth_host_local");
    g.sample_size(10);
    g.bench_function("kroce-cni", |b| {
        b.iter(|| cycle(ours, &kroce_cfg, "bench-kroce"))
    });
    g.bench_function("host-device", |b| {
        b.iter(|| cycle(host_device, &hd_cfg, "bench-hd"))
    });
    g.finish();
}

criterion_group!(benches, add_del);
criterion_main!(benches);
