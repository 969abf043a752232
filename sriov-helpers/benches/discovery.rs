//! Host discovery on a large fixture: 8 PFs x 64 VFs, every function with an
//! RDMA device and char devices (2,568 sysfs entries walked per scan).

use criterion::{Criterion, criterion_group, criterion_main};
use sriov_helpers::Host;
use sriov_helpers::fixture::FixtureHost;

fn discovery(c: &mut Criterion) {
    let host = match FixtureHost::many(8, 64) {
        Ok(h) => h,
        Err(e) => panic!("fixture: {e}"),
    };
    let root = host.root();
    let scanned = Host::scan(&root);
    assert_eq!(scanned.vfs().count(), 512, "{:?}", scanned.errors);
    c.bench_function("scan 8 PFs x 64 VFs", |b| b.iter(|| Host::scan(&root)));
}

criterion_group!(benches, discovery);
criterion_main!(benches);
