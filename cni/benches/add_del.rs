#![allow(clippy::unwrap_used, clippy::expect_used)]
//! ADD+DEL latency of kroce-cni next to Debian's host-device (which also
//! moves a netdev into a netns), same veth, same host-local IPAM, same run,
//! in cniVersion 1.0.0 and 1.1.0. Both binaries are executed like a runtime
//! does, from the bed's host netns. Needs root; prints the skip line otherwise.
//!
//! Debian's host-device (plugins 1.1.1) speaks CNI up to 1.0.0: asked with
//! `CNI_COMMAND=VERSION` at start, it is run at its highest version not above
//! the one compared, and the summary says so. The summary at the end is our
//! own interleaved measurement (criterion does not hand its estimates back):
//! the mean ADD+DEL wall time of each and kroce-cni's ratio to host-device.
//!
//! cargo bench -p kroce-cni --bench add_del -- --warm-up-time 1 --measurement-time 3

use criterion::{Criterion, criterion_group, criterion_main};
use kroce_cni::testing::testbed::run_in_netns;
use kroce_cni::testing::{TestBed, skip_without_netns};
use serde_json::{Value, json};
use std::path::Path;
use std::time::{Duration, Instant};

const VERSIONS: [&str; 2] = ["1.0.0", "1.1.0"];
/// ADD+DEL cycles per plugin and version for the printed summary.
const SUMMARY_CYCLES: u32 = 30;
/// The issue's target: kroce-cni at most this fraction of host-device's time.
const TARGET_RATIO: f64 = 0.8;

fn version_key(v: &str) -> Vec<u32> {
    v.split('.').filter_map(|p| p.parse().ok()).collect()
}

/// The versions a plugin says it speaks (`CNI_COMMAND=VERSION`).
fn supported_versions(bin: &Path) -> Vec<String> {
    use std::io::Write;
    let mut child = std::process::Command::new(bin)
        .env_clear()
        .env("CNI_COMMAND", "VERSION")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(br#"{"cniVersion":"0.4.0"}"#)
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["supportedVersions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(String::from))
        .collect()
}

/// `want` if the plugin speaks it, else its highest version below it.
fn highest_up_to(supported: &[String], want: &str) -> String {
    supported
        .iter()
        .filter(|s| version_key(s) <= version_key(want))
        .max_by_key(|s| version_key(s))
        .cloned()
        .unwrap_or_else(|| panic!("plugin speaks nothing up to {want}: {supported:?}"))
}

struct Case {
    version: &'static str,
    hd_version: String,
    kroce_cfg: Vec<u8>,
    hd_cfg: Vec<u8>,
}

fn add_del(c: &mut Criterion) {
    if skip_without_netns("bench add_del") {
        return;
    }
    let bed = TestBed::new(1).unwrap();
    let ours = Path::new(env!("CARGO_BIN_EXE_kroce-cni"));
    let host_device = Path::new("/usr/lib/cni/host-device");
    let hd_supported = supported_versions(host_device);
    // Only what both plugins do: move, rename, host-local address, route.
    let cases: Vec<Case> = VERSIONS
        .iter()
        .map(|&version| {
            let hd_version = highest_up_to(&hd_supported, version);
            let kroce_cfg =
                serde_json::to_vec(&bed.config(json!({"rdma": false, "cniVersion": version})))
                    .unwrap();
            let hd_cfg = serde_json::to_vec(&json!({
                "cniVersion": hd_version, "name": bed.network, "type": "host-device",
                "device": "ens1f0v0", "ipam": bed.config(json!({}))["ipam"].clone()
            }))
            .unwrap();
            Case {
                version,
                hd_version,
                kroce_cfg,
                hd_cfg,
            }
        })
        .collect();
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
    for case in &cases {
        cycle(ours, &case.kroce_cfg, "bench-kroce");
        cycle(host_device, &case.hd_cfg, "bench-hd");
    }
    assert_eq!(bed.host.links().unwrap().len(), before.len());

    for case in &cases {
        let mut g = c.benchmark_group(format!("add_del_veth_host_local/{}", case.version));
        g.sample_size(10);
        g.bench_function("kroce-cni", |b| {
            b.iter(|| cycle(ours, &case.kroce_cfg, "bench-kroce"))
        });
        g.bench_function(format!("host-device@{}", case.hd_version), |b| {
            b.iter(|| cycle(host_device, &case.hd_cfg, "bench-hd"))
        });
        g.finish();
    }

    // Interleaved, so load from elsewhere on the machine hits both alike.
    println!("\nADD+DEL summary ({SUMMARY_CYCLES} interleaved cycles each, mean wall time):");
    for case in &cases {
        let (mut ours_t, mut hd_t) = (Duration::ZERO, Duration::ZERO);
        for _ in 0..SUMMARY_CYCLES {
            let t = Instant::now();
            cycle(ours, &case.kroce_cfg, "bench-kroce");
            ours_t += t.elapsed();
            let t = Instant::now();
            cycle(host_device, &case.hd_cfg, "bench-hd");
            hd_t += t.elapsed();
        }
        let ms = |d: Duration| d.as_secs_f64() * 1e3 / f64::from(SUMMARY_CYCLES);
        let ratio = ours_t.as_secs_f64() / hd_t.as_secs_f64();
        let note = if case.hd_version == case.version {
            String::new()
        } else {
            format!(" (host-device speaks at most {})", case.hd_version)
        };
        println!(
            "cniVersion {}: kroce-cni {:.2} ms, host-device@{} {:.2} ms, ratio {:.2}x (target <= {TARGET_RATIO}x){note}",
            case.version,
            ms(ours_t),
            case.hd_version,
            ms(hd_t),
            ratio
        );
    }
}

criterion_group!(benches, add_del);
criterion_main!(benches);
