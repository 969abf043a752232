//! Parsing the published all-sizes `ib_write_bw` output (23 rows).

use criterion::{Criterion, criterion_group, criterion_main};
use kroce_admission::perftest;
use std::hint::black_box;
use std::path::PathBuf;

fn fixture() -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/fixtures/perftest/ib_write_bw-all-sizes-gbits-azure-aks.txt");
    match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) => panic!("perftest fixture {} is required: {e}", path.display()),
    }
}

fn parse_all_sizes(c: &mut Criterion) {
    let text = fixture();
    let report = match perftest::parse(&text) {
        Ok(r) => r,
        Err(e) => panic!("fixture does not parse: {e}"),
    };
    assert_eq!(report.bandwidth_rows().len(), 23);
    c.bench_function("parse ib_write_bw -a (23 rows)", |b| {
        b.iter(|| perftest::parse(black_box(&text)))
    });
}

criterion_group!(benches, parse_all_sizes);
criterion_main!(benches);
