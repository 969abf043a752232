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
//! the median ADD+DEL wall time of each and the ratios, next to the kernel
//! floor: the two netns moves of one link that any VF plugin must make,
//! as two `ip` execs (`ip link set dev X netns POD`, `ip -n POD link set dev
//! X netns NODE`). Each round runs the three in turn, so load from elsewhere
//! on the machine hits them alike; the ratios are medians of the per-round
//! ratios with their interquartile range.
//!
//! `KROCE_CNI_BEFORE=/path/to/kroce-cni` adds another build (e.g. the one
//! before a change) as a fourth command in the same rounds.
//!
//! cargo bench -p kroce-cni --bench add_del -- --warm-up-time 1 --measurement-time 3

use criterion::{Criterion, criterion_group, criterion_main};
use kroce_cni::testing::testbed::run_in_netns;
use kroce_cni::testing::{TestBed, skip_without_netns};
use serde_json::{Value, json};
use std::path::Path;
use std::time::Instant;

const VERSIONS: [&str; 2] = ["1.0.0", "1.1.0"];
/// Interleaved rounds per version for the printed summary.
const SUMMARY_ROUNDS: usize = 40;
/// The target: kroce-cni ADD+DEL at most this multiple of the kernel floor.
const TARGET_FLOOR_RATIO: f64 = 1.10;

/// Median and interquartile range of `v`.
fn quartiles(v: &mut [f64]) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.25), at(0.75))
}

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

    // The floor: the same veth out to the pod netns and back, by `ip`.
    let pod_ns = bed.pod.name.clone();
    let host_ns = bed.host.name.clone();
    let floor = || {
        for args in [
            vec![
                "-n",
                host_ns.as_str(),
                "link",
                "set",
                "dev",
                "ens1f0v0",
                "netns",
                pod_ns.as_str(),
            ],
            vec![
                "-n",
                pod_ns.as_str(),
                "link",
                "set",
                "dev",
                "ens1f0v0",
                "netns",
                host_ns.as_str(),
            ],
        ] {
            let st = std::process::Command::new("ip")
                .args(&args)
                .status()
                .unwrap();
            assert!(st.success(), "ip {args:?}: {st}");
        }
    };
    floor();
    assert_eq!(bed.host.links().unwrap().len(), before.len());
    let before_bin = std::env::var_os("KROCE_CNI_BEFORE").map(std::path::PathBuf::from);

    println!(
        "\nADD+DEL summary ({SUMMARY_ROUNDS} interleaved rounds; median ms, ratios as median [IQR] of per-round ratios):"
    );
    for case in &cases {
        let time = |f: &dyn Fn()| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e3
        };
        let (mut k, mut h, mut fl, mut b) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for _ in 0..SUMMARY_ROUNDS {
            k.push(time(&|| cycle(ours, &case.kroce_cfg, "bench-kroce")));
            h.push(time(&|| cycle(host_device, &case.hd_cfg, "bench-hd")));
            fl.push(time(&floor));
            if let Some(bb) = &before_bin {
                b.push(time(&|| cycle(bb, &case.kroce_cfg, "bench-before")));
            }
        }
        let ratio = |a: &[f64], d: &[f64]| {
            let mut r: Vec<f64> = a.iter().zip(d).map(|(a, d)| a / d).collect();
            quartiles(&mut r)
        };
        let (kf, kf_lo, kf_hi) = ratio(&k, &fl);
        let (hf, hf_lo, hf_hi) = ratio(&h, &fl);
        let (kh, kh_lo, kh_hi) = ratio(&k, &h);
        let med = |v: &[f64]| quartiles(&mut v.to_vec()).0;
        let note = if case.hd_version == case.version {
            String::new()
        } else {
            format!(" (host-device speaks at most {})", case.hd_version)
        };
        println!(
            "cniVersion {}: kroce-cni {:.2} ms, host-device@{} {:.2} ms, floor {:.2} ms{note}\n  kroce/floor {kf:.2}x [{kf_lo:.2}-{kf_hi:.2}] (target <= {TARGET_FLOOR_RATIO}x), host-device/floor {hf:.2}x [{hf_lo:.2}-{hf_hi:.2}], kroce/host-device {kh:.2}x [{kh_lo:.2}-{kh_hi:.2}]",
            case.version,
            med(&k),
            case.hd_version,
            med(&h),
            med(&fl),
        );
        if !b.is_empty() {
            let (bf, bf_lo, bf_hi) = ratio(&b, &fl);
            println!(
                "  KROCE_CNI_BEFORE {:.2} ms, before/floor {bf:.2}x [{bf_lo:.2}-{bf_hi:.2}]",
                med(&b)
            );
        }
    }
}

criterion_group!(benches, add_del);
criterion_main!(benches);
